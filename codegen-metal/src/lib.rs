//! `codegen-metal`: Metal Shading Language source for the kernels of a plan: the kernels of
//! `codegen-cuda`'s printer under the Metal prelude (`prelude.metal`).

/// The Metal prelude: the kernel vocabulary of `codegen_cuda` in MSL terms.
pub const METAL_PRELUDE: &str = include_str!("prelude.metal");
