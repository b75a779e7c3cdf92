//! `codegen-cpu`: generates the CPU kernels of a plan as machine code with Cranelift
//! (one function per kernel, shapes as constants, 128-bit SIMD), and the thread pool that runs
//! them.
//!
//! The heart is the matmul ([`matmul`]): weights are [`layout::repack`]ed once into groups of
//! 4 interleaved rows (one 32-bit lane per row), activations are quantized to the weight
//! type's 8-bit companion format by a generated quantizer ([`actq`] describes the layout),
//! and a kernel generated for the exact shape ([`kernels`]) computes ggml's per-block integer
//! dot products with `pmaddubsw`/`pmaddwd`. [`pool::ThreadPool`] splits the rows over
//! threads. [`formats`] holds the one description per block format that drives all of it.
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

#![deny(missing_docs)]

pub mod actq;
mod emit;
pub mod exec;
pub mod formats;
pub mod jit;
pub mod kernels;
pub mod layout;
pub mod matmul;
pub mod pool;

pub use jit::{CodegenError, Jit, JitCode, Result};
pub use kernels::{SumOrder, Tiling};
pub use layout::{repack, RepackedWeight};
pub use matmul::{compile_matmul, compile_matmul_with, MatmulKernel, MatmulSpec};
pub use pool::ThreadPool;
