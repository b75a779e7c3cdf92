//! `codegen-metal`: Metal Shading Language for the kernels of a plan: the kernels of
//! `codegen-cuda`'s printer (one printer, two dialects) under the Metal prelude
//! (`prelude.metal`), every step in one source (a Metal library per model) with its
//! dispatch table.
//!
//! Nothing here needs a Mac: the source is generated anywhere. Running it needs the macOS
//! runtime (`runtime`'s Metal backend); on Linux the tests run the same source through a
//! C++ shim on CPU threads.
//!
//! - [`generate`]: the program of a plan.
//! - [`lint()`]: what the CPU shim (`codegen_cuda::shim`) would compile but Metal would not.

pub mod lint;

pub use lint::lint;

use codegen_cuda::kernels::{assemble, layout, print_step, CodegenError, Target};
use codegen_cuda::{Launch, WeightTable};
use ir::plan::Plan;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The Metal prelude: the kernel vocabulary of `codegen_cuda` in MSL terms.
pub const METAL_PRELUDE: &str = include_str!("prelude.metal");

/// The Metal target of the shared printer: [`METAL_PRELUDE`], no tensor-core words (the
/// prompt products keep the f32 threadgroup tiles; `simdgroup_matrix` is not used yet).
pub const METAL: Target = Target {
    prelude: METAL_PRELUDE,
    tensor_cores: false,
};

/// The dispatch table of one step: its threadgroups, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDispatch {
    /// Tokens of the step.
    pub n_tokens: u32,
    /// Logit rows of the step.
    pub n_outputs: u32,
    /// The dispatches (`grid` threadgroups of `block` threads), in execution order.
    pub launches: Vec<Launch>,
}

/// A plan's Metal program: one source for every step, the steps' dispatch tables, and
/// the layout of the three buffers (codegen-cuda's kernel ABI: `[[buffer(0)]]` arena,
/// `[[buffer(1)]]` KV memory, `[[buffer(2)]]` weights).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetalProgram {
    /// The library's source (MSL).
    pub source: String,
    /// One table per step of the plan, in the plan's order.
    pub steps: Vec<StepDispatch>,
    /// Where the weights lie in buffer 2.
    pub weights: WeightTable,
    /// Cells per KV cache the kernels were generated for.
    pub kv_cells: u64,
    /// The ubatch the sliding-window caches' rings were sized for
    /// ([`ir::plan::Plan::kv_layout_ring`]); `None`: full-size caches (`--swa-full`).
    #[serde(default)]
    pub kv_ring_ubatch: Option<u32>,
    /// Bytes of the KV memory.
    pub kv_bytes: u64,
    /// Bytes of the arena.
    pub arena_bytes: u64,
}

/// The name prefix of a step's kernels in the shared source (`s8x1_`).
pub fn step_prefix(n_tokens: u32, n_outputs: u32) -> String {
    format!("s{n_tokens}x{n_outputs}_")
}

/// Generates the Metal program of `plan`, its sliding-window caches rings as llama.cpp
/// sizes its SWA cache ([`generate_with`] at [`Plan::ring_ubatch`]).
///
/// # Errors
/// What the kernel printer reports ([`CodegenError`]).
pub fn generate(plan: &Plan) -> Result<MetalProgram, CodegenError> {
    generate_with(plan, Some(plan.ring_ubatch()))
}

/// Generates the Metal program of `plan` with the KV layout of
/// `codegen_cuda::kernels::layout(plan, ring_ubatch)` (`None`: full-size caches).
///
/// # Errors
/// What the kernel printer reports ([`CodegenError`]).
pub fn generate_with(plan: &Plan, ring_ubatch: Option<u32>) -> Result<MetalProgram, CodegenError> {
    let (weights, kv) = layout(plan, ring_ubatch)?;
    let mut needs = BTreeSet::new();
    let mut texts = Vec::new();
    let mut steps = Vec::new();
    for s in &plan.steps {
        let p = print_step(
            &METAL,
            plan,
            s,
            &weights,
            &kv,
            &step_prefix(s.n_tokens, s.n_outputs),
        )?;
        needs.extend(p.needs);
        texts.extend(p.kernels);
        steps.push(StepDispatch {
            n_tokens: s.n_tokens,
            n_outputs: s.n_outputs,
            launches: p.launches,
        });
    }
    let title = format!("{} steps, one Metal library", plan.steps.len());
    Ok(MetalProgram {
        source: assemble(&title, METAL.prelude, &needs, &texts)?,
        steps,
        weights,
        kv_cells: u64::from(plan.n_ctx),
        kv_ring_ubatch: ring_ubatch,
        kv_bytes: kv.stream_bytes,
        arena_bytes: plan.arena_bytes(),
    })
}
