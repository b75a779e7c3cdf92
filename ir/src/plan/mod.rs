//! The plan: what a model compiles to before any target sees it (DESIGN.md, `ir::Plan`).
//!
//! A [`Plan`] holds, for each ubatch size, a [`Step`]: the ordered list of [`Kernel`]s that
//! computes one ubatch, every shape a number except the KV length. Each kernel is a fused op
//! ([`KernelOp`]: one IR op, `rms_norm × weight`, a matrix product with its norm prologue and
//! add / GLU epilogue, rope into the KV store) over typed, strided [`Value`]s. Every value
//! lives in one of three places ([`Base`]): an arena [`Buffer`] at a byte offset fixed by the
//! memory planner, a weight referenced by its GGUF tensor name, or a layer's KV cache. The
//! arena size of each step is known before anything runs; one arena of
//! [`Plan::arena_bytes`] serves every step.
//!
//! Targets read the plan and generate code for it; they may attach an opaque annotation to a
//! kernel ([`Kernel::target`]), never change its meaning. The plan is stored as JSON (the
//! compiled runner regenerates its code from it at start-up).
//!
//! - [`Plan::verify`]: ids, types (each kernel's expansion typed by the graph's rules), order,
//!   in-place aliasing, and, once planned, that no two buffers alive at once share a byte.
//! - [`liveness`]: the live range of each arena buffer over the kernel list.
//! - `Display` prints the text form: the tables, then per step its buffers, values and one
//!   line per kernel; [`parse_plan`] (also `str::parse`) reads it back into an equal plan.
//!   [`Summary`] prints the totals.
//! - [`schedule`]: how a prompt is cut into steps ([`TailPolicy::Pad`]).
//! - [`exec`]: a plain reference executor of a plan, built on the interpreter.

pub mod exec;
mod kernel;
mod kv_layout;
pub mod liveness;
mod parse;
mod print;
pub mod schedule;
mod types;
mod verify;

pub use kernel::{Epilogue, Expansion, KernelOp, MicroOp, MulMatSpec, RopeKvStoreSpec, Slot};
pub use kv_layout::{swa_cells, KvLayout, KvSlot, KV_ALIGN, LLAMA_N_UBATCH};
pub use parse::parse_plan;
pub use print::{StepSummary, Summary};
pub use types::{
    dense_bytes, Base, Buffer, BufferId, Kernel, KernelId, KvBuf, KvId, Plan, Step, StepInput,
    TailPolicy, Value, ValueId, WeightBuf, WeightId, DEFAULT_ALIGN, PLAN_FORMAT,
};

/// What is wrong with a plan, or with running one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A plan that does not hold together; names the step, and the kernel, value or buffer.
    #[error("plan step n_tokens={n_tokens}: {msg}")]
    Invalid {
        /// The step's ubatch size (0 for the plan's shared tables).
        n_tokens: u32,
        /// What is wrong.
        msg: String,
    },
    /// Malformed or foreign serialized plan.
    #[error("plan JSON: {0}")]
    Serde(String),
    /// A prompt that cannot be cut into the compiled ubatch sizes.
    #[error("schedule: {0}")]
    Schedule(String),
    /// The reference executor failed.
    #[error("plan execution: {0}")]
    Exec(String),
}
