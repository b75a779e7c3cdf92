//! `codegen-cpu`: the CPU backend. It generates the matmul kernels of a plan as machine code
//! with Cranelift (one function per kernel, shapes as constants, 128-bit SIMD), runs every
//! other kernel as hand-written Rust (AVX2 micro-kernels through `std::arch` where the host
//! has them, plain Rust computing the same values elsewhere), and executes whole plans on a
//! thread pool ([`exec`]).
//!
//! The heart is the matmul ([`matmul`]): weights are [`layout::repack`]ed once into groups of
//! 4 interleaved rows (one 32-bit lane per row), activations are quantized to the weight
//! type's 8-bit companion format ([`actq`] describes the layout), and a kernel generated for
//! the exact shape ([`generated`]) computes ggml's per-block integer dot products with
//! `pmaddubsw`/`pmaddwd`. [`pool::ThreadPool`] splits the rows over threads. [`formats`]
//! holds the one description per block format that drives all of it. Every other block
//! type is multiplied in ggml's own layout, read in place from the model file, by the
//! row-dot kernels of [`rows`] (activations in the type's `vec_dot_type`, from `ir::ggml`).
//!
//! ```
//! use codegen_cpu::{compile_matmul, repack, MatmulSpec, ThreadPool};
//! use ir::ggml::GgmlType;
//!
//! // W: {K = 64, M = 8} in Q8_0 (8 rows of 2 blocks: f16 d = 1.0, quants = 1)
//! let block: Vec<u8> = [0x00, 0x3c].into_iter().chain([1u8; 32]).collect();
//! let w_data: Vec<u8> = block.repeat(2 * 8);
//! let w = repack(GgmlType::Q8_0, 64, 8, &w_data)?;
//! let kernel = compile_matmul(&MatmulSpec { wtype: GgmlType::Q8_0, k: 64, m: 8, n: 1 })?;
//! let x = vec![0.5f32; 64]; // {K, N = 1}
//! let mut act = vec![0u8; kernel.act_bytes()];
//! kernel.prepare(&x, &mut act)?;
//! let mut out = vec![0f32; 8]; // {M, N}
//! kernel.run(&ThreadPool::new(2)?, &w, &act, &mut out)?;
//! assert!(out.iter().all(|&v| (v - 32.0).abs() < 0.05));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Where each kernel comes from
//!
//! Three sources, in separate modules:
//!
//! - **Cranelift-generated** ([`generated`]): emitted as Cranelift IR for one fixed shape and
//!   JIT-compiled for the host ([`jit`]), x86-64 or aarch64.
//! - **Hand-written** ([`handwritten`]): Rust with AVX2 / AVX-512 / AMX paths through
//!   `std::arch` and a plain Rust path computing the same values (every other host).
//!
//! Which of them multiplies each weight is chosen at compile time by the `select-kernels`
//! pass ([`select`]) for a named CPU and its level of routines ([`target`]), and written into
//! the plan; the executor ([`exec`]) runs what the plan says.
//! - **Plain Rust from `ir::ggml`**: the format descriptions' own reference routines
//!   (dequantizer, Q8_0 quantizer, Hadamard rotation), bit-exact with ggml by construction.
//!
//! | kernel (plan op) | source | module | matches in llama.cpp (ggml-cpu) |
//! |---|---|---|---|
//! | matmul, Q4_0 / Q4_1 / Q8_0 weights ([`SumOrder::Ggml`], the default) | Cranelift | `generated::quant` | `ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1`, `_q8_0_q8_0` (arch/x86/quants.c, AVX2), bit for bit |
//! | matmul, quantized weights, [`SumOrder::Block`] | Cranelift | `generated::quant_block` | the same dot products in ggml's scalar order (not bit-exact with llama.cpp's x86 build) |
//! | matmul, every other block type (Q5_0, Q5_1, Q2_K … Q6_K, IQ4_NL, IQ4_XS), and in the exact mode Q4_0 / IQ4_NL / Q4_K weights llama.cpp repacks | hand-written AVX2; plain: `ir::ggml`'s lane-faithful routines | [`rows`] (`handwritten::qdot`, `qdot_tiled`, `qdot_repack`) | `ggml_vec_dot_*` (one column), ggml-cpu's tiled K-quant kernel and tinyBLAS (prompts), the repacked `ggml_gemv/gemm_*_8x8_*` (arch/x86/quants.c, tiled/, arch/x86/repack.cpp), bit for bit |
//! | matmul, F32 / F16 / BF16 weights (read in place, both sum orders) | hand-written AVX2 + F16C (4 × 8 tiles with AVX-512F); plain: `ir::ggml`'s | [`rows`] (`handwritten::fdot`) | `ggml_vec_dot_f32` / `_f16` / `_bf16` (one column), tinyBLAS `<8, __m256>` (two or more; llamafile/sgemm.cpp), bit for bit |
//! | matmul, F32 / F16 / BF16 weights in [`MatmulKernel`] (benchmarks, tests) | Cranelift | `generated::float` | the same, within rounding (own summation order) |
//! | matmul rows of a padded last group ([`MatmulKernel`] only) | plain Rust | [`matmul`] | as the generated kernel of the same weight type |
//! | activation quantizer (Q8_0 / Q8_1) | hand-written AVX2; fallback: the scalar reference [`actq::quantize_act`] | `handwritten::actq` | `quantize_row_q8_0`, `quantize_row_q8_1` (arch/x86/quants.c, AVX2) |
//! | activation rounding for F16 / BF16 weights | plain Rust (`ir::ggml::quantize`) | [`rows`], [`matmul`] | `from_float` of the `vec_dot_type` (`GGML_FP32_TO_FP16`, `ggml_compute_fp32_to_bf16`) |
//! | `rms_norm` (× weight), `norm` | hand-written AVX2 (the scaling) / plain | `handwritten::norm` | `ggml_compute_forward_rms_norm_f32` then `ggml_mul`; `ggml_compute_forward_norm_f32` |
//! | `rope` | hand-written (scalar `mul_add`, FMA instructions on x86-64) | `handwritten::rope` | `ggml_compute_forward_rope`; angles by `ggml_rope_cache_init` (shared: `ir::ggml::cpu_math::rope_cache`) |
//! | KV cache store (F16 / F32 / Q8_0) | hand-written F16C / plain; Q8_0 by `ir::ggml` | `handwritten::rope`, `exec` | `ggml_set_rows` (`GGML_FP32_TO_FP16`, `quantize_row_q8_0`) |
//! | flash attention (the default) | hand-written AVX2 / plain | `handwritten::flash` | `ggml_compute_forward_flash_attn_ext_f16` (`_one_chunk`, `_tiled`, the split-KV reduction) |
//! | attention with `-fa off` | hand-written AVX2 / plain | `handwritten::soft_max_attn` | `mul_mat` (`ggml_vec_dot_f16`, tinyBLAS, `ggml_vec_dot_q8_0_q8_0`), `ggml_soft_max_ext` (`ggml_vec_soft_max_f32`), `mul_mat` |
//! | K / V tiles to f32 (tiled flash attention) | hand-written AVX2 / plain | `handwritten::attention` | the f32 conversion in ggml's `_tiled` flash kernel |
//! | SiLU, SwiGLU | hand-written AVX2 / plain | `handwritten::elementwise` | `ggml_vec_silu_f32`, `ggml_vec_swiglu_f32` (`ggml_v_expf`; one lane: `ir::ggml::cpu_math::v_expf`) |
//! | GELU, GeGLU | plain Rust (f16 table) | `handwritten::elementwise` | `ggml_vec_gelu_f32`, `ggml_vec_geglu_f32` with `GGML_GELU_FP16` |
//! | tanh, soft-cap, scale, copy | plain Rust | `handwritten::elementwise` | `ggml_tanh`; llama.cpp's soft-capping (`ggml_scale`, `ggml_tanh`, `ggml_scale`); `ggml_scale`; `ggml_cont` |
//! | add, mul (broadcast rows) | hand-written AVX2 / plain | `handwritten::elementwise` | `ggml_compute_forward_add` / `_mul` (`ggml_vec_add_f32`, `ggml_vec_mul_f32`) |
//! | `soft_max` (a plan's standalone op) | plain Rust | `handwritten::elementwise` | `ggml_soft_max_ext` without mask, as the interpreter computes it |
//! | Hadamard rotation | plain Rust (`ir::ggml::fwht`) | `handwritten::elementwise` | `ggml_compute_forward_fwht` |
//! | `get_rows` (token embedding, output rows) | plain Rust (`ir::ggml::dequantize`) | `handwritten::embed`, `exec` | `ggml_compute_forward_get_rows` (`dequantize_row_*`) |
//!
//! Every kernel is tested against the reference interpreter (`ir::interp`), the oracle, which
//! no production kernel calls: the few numeric definitions both must share (ggml's vectorized
//! `expf`, its softmax sum, the rope angles) are in `ir::ggml::cpu_math`.
//!
//! ## Portability
//!
//! The crate builds on every host Rust and Cranelift support (aarch64 included: Apple Silicon
//! is where the Metal backend runs). x86 intrinsics appear only in
//! `#[cfg(target_arch = "x86_64")]` code, each with a plain fallback; generated functions are
//! called through `extern "C"` pointers, the host's C calling convention, which [`Jit::new`]
//! checks is the one Cranelift generates ([`jit::c_call_conv`]). Running the generated
//! kernels needs an x86-64 host with SSSE3 and SSE4.1, or an aarch64 host with NEON.

#![deny(missing_docs)]

pub mod actq;
pub mod exec;
pub mod formats;
pub mod generated;
pub mod handwritten;
pub mod jit;
pub mod layout;
pub mod matmul;
pub mod pool;
pub mod rows;
pub mod select;
pub mod stream;
pub mod target;

pub use generated::{SumOrder, Tiling};
pub use jit::{CodegenError, Jit, JitCode, Result};
pub use layout::{repack, RepackedWeight};
pub use matmul::{
    compile_matmul, compile_matmul_portable, compile_matmul_with, MatmulKernel, MatmulSpec,
};
pub use pool::ThreadPool;

/// Whether the CPU backend multiplies weights of type `wtype`: by a generated kernel over
/// repacked weights ([`layout::supports`]) or by a row-dot kernel over ggml's own layout
/// ([`rows::supports`]).
pub fn matmul_supports(wtype: ir::ggml::GgmlType) -> bool {
    layout::supports(wtype) || rows::supports(wtype)
}
