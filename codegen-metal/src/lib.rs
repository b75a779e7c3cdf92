//! `codegen-metal`: Metal Shading Language source for the kernels of a plan: the kernels of
//! `codegen-cuda`'s printer under the Metal prelude (`prelude.metal`).
//!
//! - [`lint()`]: what the CPU shim (`codegen_cuda::shim`) would compile but Metal would not.

pub mod lint;

pub use lint::lint;

/// The Metal prelude: the kernel vocabulary of `codegen_cuda` in MSL terms.
pub const METAL_PRELUDE: &str = include_str!("prelude.metal");
