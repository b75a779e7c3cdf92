//! The kernel printer: a plan's steps as sources in the dialect-neutral vocabulary of the
//! crate doc, under a dialect's prelude.

use crate::program::GpuProgram;
use ir::plan::Plan;

/// A plan the printer cannot generate code for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// A kernel it has no code for; names the step, the plan kernel and what is missing.
    #[error("step n_tokens={n_tokens}: kernel k{kernel} ({name}): {msg}")]
    Unsupported {
        /// The step's ubatch size.
        n_tokens: u32,
        /// Index of the plan kernel.
        kernel: usize,
        /// Its op's name.
        name: String,
        /// What is missing.
        msg: String,
    },
    /// A plan that does not hold together (no memory plan, sizes that overflow).
    #[error("{0}")]
    Plan(String),
}

/// Generates the program of every step of `plan` under `prelude` (the CUDA or Metal one).
///
/// # Errors
/// [`CodegenError`].
pub fn generate(plan: &Plan, prelude: &str) -> Result<GpuProgram, CodegenError> {
    let _ = (plan, prelude);
    Err(CodegenError::Plan("the kernel printer is not written yet".into()))
}
