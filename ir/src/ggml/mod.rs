//! GGML block formats as data (DESIGN.md principle 1): the type table, one description per
//! block format, and the reference dequantizer, activation quantizers and dot products
//! derived from it.
//!
//! - [`GgmlType`]: every type id GGML defines, with block size and bytes per block;
//! - [`BlockFormat`] / [`block_format`]: field layout and decoding of each described format
//!   (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K … Q8_K, IQ4_NL, IQ4_XS, and
//!   of issue 11's second list TQ1_0, TQ2_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
//!   IQ1_M, and MXFP4; the grids and the MXFP4 values in [`grids`]);
//! - [`dequantize`]: blocks to f32, bit-exact with ggml's `dequantize_row_*`;
//! - [`quantize_weights`]: f32 to the weight formats `llama-quantize` writes (Q4_0 … Q8_0,
//!   Q2_K … Q6_K, IQ4_NL, IQ4_XS, MXFP4, F16, BF16), bit-exact with ggml's reference
//!   quantizers;
//! - [`quantize`] and the `quantize_*` functions: f32 to the activation formats of llama.cpp's
//!   CPU matrix products (Q8_0, Q8_1, Q8_K, F16, BF16), bit-exact with ggml;
//! - [`vec_dot_type`] / [`quantize_activations`] / [`vec_dot`]: the companion activation
//!   format of each weight type, the conversion to it, and the dot product ggml's scalar code
//!   computes for a weight row and an activation row;
//! - [`vec_dot_avx2`] / [`vec_dot_avx2_mul_mat`]: the same dot products in the operation
//!   order of llama.cpp's x86 AVX2 build (its `vec_dot` kernels, and llamafile's tinyBLAS
//!   from two activation columns on), bit for bit;
//! - [`repacked_by_llama_cpp`] / [`RepackedRow`] / [`repack_mul_mat_8`]: the interleaved
//!   x86 kernels llama.cpp runs for the Q4_0, Q4_K, IQ4_NL and MXFP4 weights it repacks at
//!   load time, and their activation quantizers;
//! - [`cpu_math`]: the few pieces of ggml-cpu arithmetic (its vectorized `expf`, the rope
//!   angle table) that the interpreter and the backends' kernels share by definition.

pub mod cpu_math;
mod dequant;
mod dot;
mod dot_x86;
mod error;
mod format;
mod fp;
pub mod grids;
mod hadamard;
mod layouts;
mod quant;
mod quantize;
mod repack_x86;
mod types;

pub use dequant::{dequantize, scale_min_k4};
pub use dot::{
    quantize_activations, tinyblas_same_as_vec_dot, vec_dot, vec_dot_avx2, vec_dot_avx2_mul_mat,
    vec_dot_f32, vec_dot_type, x86_mul_mat_kernel, X86MulMatKernel,
};
pub use error::{BlockDataError, DequantError};
pub use format::{
    block_format, block_formats, BitPiece, BlockFormat, Decode, Field, FieldKind, Index, IntCode,
    IntMap, MinTerm, Recipe, ScalarKind, SubScalePacking, Term, KVALUES_IQ4NL,
};
pub use fp::{bf16_to_f32, e8m0_to_f32_half, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use hadamard::{fwht, k_rot_size, v_rot_size};
pub use quant::{
    quantize, quantize_bf16, quantize_f16, quantize_q8_0, quantize_q8_0_with, quantize_q8_1,
    quantize_q8_1_with, quantize_q8_k, Q8Flavor,
};
pub use quantize::{quantize_weights, WEIGHT_QUANT_TYPES};
pub use repack_x86::{
    quantize_q8_k_4x8, repack_mul_mat_8, repack_quantize_activations, repacked_by_llama_cpp,
    RepackKernel, RepackedRow,
};
pub use types::{GgmlType, QK_K};
