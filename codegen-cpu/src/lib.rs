//! `codegen-cpu`: generates the CPU kernels of a plan as machine code with Cranelift
//! (one function per kernel, shapes as constants, 128-bit SIMD), and the thread pool that runs
//! them.
//!
//! The heart is the matmul ([`matmul`]): weights are [`layout::repack`]ed once into groups of
//! 4 interleaved rows (one 32-bit lane per row), activations are quantized to the weight
//! type's 8-bit companion format ([`actq`]), and a kernel generated for the exact shape
//! ([`kernels`]) computes ggml's per-block integer dot products with `pmaddubsw`/`pmaddwd`.
//! [`pool::ThreadPool`] splits the rows over threads.

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
pub use kernels::Tiling;
pub use layout::{repack, RepackedWeight};
pub use matmul::{compile_matmul, compile_matmul_with, MatmulKernel, MatmulSpec};
pub use pool::ThreadPool;
