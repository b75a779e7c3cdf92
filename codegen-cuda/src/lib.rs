//! `codegen-cuda`: CUDA C source generated from a plan (DESIGN.md, "Data flow"), and the
//! dialect-neutral kernel printer the Metal backend shares.
//!
//! - [`program`]: what a plan becomes: per step one self-contained source and its launches,
//!   and the kernel ABI (three buffers: arena, KV memory, weights; every offset a constant).
//! - [`nvrtc`]: a step's source compiled with NVRTC to CUBINs and PTX, with ptxas's
//!   resource report per kernel.
//! - [`kernels`]: the kernel printer. It writes kernel bodies in a small vocabulary of macros
//!   that each dialect's prelude defines (`prelude.cuh` here, `prelude.metal` in
//!   codegen-metal), so the CUDA and Metal sources differ only in their prelude.
//! - [`shim`]: runs a step's CUDA or Metal source, unchanged, on the CPU (host g++), for
//!   tests without a GPU; `codegen_metal::lint` catches what it accepts and Metal would not.
//!
//! The vocabulary:
//!
//! | word | meaning |
//! |---|---|
//! | `KERNEL(name, nt)` | a kernel of `nt` threads per block taking `arena`, `kv`, `wts` and `ops` |
//! | `ops.at[i]` | the byte offset of operand `i` in its buffer (`Operands`) |
//! | `FN` | a helper function |
//! | `GMEM` | address space of a pointer into the three buffers |
//! | `SHARED` | an array shared by the threads of one block (declared in a kernel) |
//! | `CONSTANT` | a read-only table at file scope (ggml's lookup tables: IQ4_NL's values, the IQ grids; `__constant__` in CUDA, `constant` in Metal) |
//! | `TX`, `BX`, `BY`, `BZ` | thread index in the block; block index in the grid (`i32`) |
//! | `SYNC()` | barrier of the block's threads (and its shared memory) |
//! | `SHFL_XOR(v, m)` | the `float` of lane `lane ^ m` of the 32-lane SIMD group |
//! | `F16_TO_F32(u)`, `F32_TO_F16(f)`, `BF16_TO_F32(u)` | conversions of `u16` bit patterns (round to nearest even) |
//! | `AS_FLOAT(u)`, `AS_UINT(f)` | bit casts between `u32` and `float` |
//! | `UNROLL` | unroll the next loop |
//! | `u8 i8 u16 i16 u32 i32 u64 i64` | integer types |
//! | `expf logf tanhf sqrtf fabsf fmaxf fminf roundf floorf cosf sinf powf` | `float` math |
//!
//! A target with [`Target::tensor_cores`] (CUDA) also has two words for one warp's TF32
//! matrix product, `TO_TF32(f)` and `MMA_TF32(d, a, b)` (prelude.cuh gives their fragment
//! layout); the printer uses them only for such a target.
//!
//! Nothing else of either language appears in a kernel body: no `std::`, no `double`, no
//! recursion, every pointer qualified with `GMEM`, no pointer into `SHARED` memory
//! (Metal would want an address space for it that CUDA lacks; shared arrays are indexed in
//! the kernel that declares them).

pub mod kernels;
pub mod nvrtc;
pub mod program;
pub mod shim;

pub use kernels::{generate, generate_with, CodegenError, Target};
pub use program::{
    GpuProgram, Launch, StepProgram, WeightTable, MAX_OPERANDS, SIMD_WIDTH, WEIGHT_ALIGN,
};

/// The CUDA prelude of every generated source: includes, integer types and the kernel
/// vocabulary of the module doc in CUDA terms, and the tensor-core words `TO_TF32` /
/// `MMA_TF32` (sm_80 on).
pub const CUDA_PRELUDE: &str = include_str!("prelude.cuh");

/// The CUDA target: [`CUDA_PRELUDE`], prompt products on the tensor cores.
pub const CUDA: Target = Target {
    prelude: CUDA_PRELUDE,
    tensor_cores: true,
};
