//! The Metal backend: the plan's steps as one Metal Shading Language library
//! (`codegen_metal::generate`), checked by `codegen_metal::lint` at `modelc compile` time and
//! stored as source in the runner ([`Payload::Metal`]); the runner compiles it with the
//! Metal framework when it loads it, on macOS, and runs it with the shared GPU host side
//! ([`super::gpu::GpuEngine`]) over the macOS device (`metal_macos`).
//!
//! Everything but that last part builds and is tested anywhere; elsewhere than macOS,
//! loading is refused in one line.

use super::gpu::{check_program, Checked, ProgramView, StepView};
use super::{Backend, LoadOptions, Payload, Support, Target};
use crate::engine::Engine;
use codegen_metal::MetalProgram;
use ir::interp::WeightSource;
use ir::plan::Plan;

/// The file name of the source `modelc compile --target metal --emit-source DIR` writes.
pub const SOURCE_FILE: &str = "model.metal";

/// The Metal backend (module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct MetalBackend {
    /// Generate for full-size sliding-window caches (llama.cpp's `--swa-full`); by default
    /// they are rings of the cells llama.cpp's SWA cache has ([`ir::plan::Plan::kv_layout_ring`]).
    /// The kernels are generated for one layout: a program runs with the `--swa-full` it was
    /// compiled with.
    pub swa_full: bool,
}

impl MetalBackend {
    /// The ubatch the program's KV rings are sized for (`None`: full-size caches).
    fn ring_ubatch(&self, plan: &Plan) -> Option<u32> {
        (!self.swa_full).then(|| plan.ring_ubatch())
    }

    /// The generated program of `plan`, without checking its source.
    ///
    /// # Errors
    /// What the kernel printer reports.
    pub fn generate(&self, plan: &Plan) -> anyhow::Result<MetalProgram> {
        codegen_metal::generate_with(plan, self.ring_ubatch(plan))
            .map_err(|e| anyhow::anyhow!("--target metal: {e}"))
    }
}

/// Refuses a source that `codegen_metal::lint` finds problems in, naming their lines.
///
/// # Errors
/// As said, in one line (the first problems, and how many more).
pub fn check_source(source: &str) -> anyhow::Result<()> {
    const SHOWN: usize = 5;
    let problems = codegen_metal::lint(source);
    if problems.is_empty() {
        return Ok(());
    }
    let more = problems.len().saturating_sub(SHOWN);
    anyhow::bail!(
        "--target metal: the generated source would not compile with Metal: {}{} (`--emit-source DIR` writes it)",
        problems
            .iter()
            .take(SHOWN)
            .map(|p| p.replace('\n', " "))
            .collect::<Vec<_>>()
            .join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}

/// Checks `program` (built from `plan`) and `weights` before a device is touched
/// ([`check_program`]); what the macOS engine loads, and what tests check anywhere.
///
/// # Errors
/// What [`check_program`] reports.
pub fn check<'w>(
    plan: &Plan,
    program: &MetalProgram,
    weights: &'w dyn WeightSource,
    opts: &LoadOptions,
) -> anyhow::Result<Checked<'w>> {
    let steps: Vec<StepView<'_>> = program.steps.iter().map(StepView::from).collect();
    check_program(
        plan,
        &ProgramView {
            target: Target::Metal,
            steps: &steps,
            weights: &program.weights,
            kv_cells: program.kv_cells,
            kv_ring_ubatch: program.kv_ring_ubatch,
            kv_bytes: program.kv_bytes,
            arena_bytes: program.arena_bytes,
        },
        weights,
        opts,
    )
}

/// The one line loading a Metal program elsewhere than macOS gives.
pub fn not_macos() -> String {
    format!(
        "--target metal: Metal programs run on macOS only (this is {}); compile a CPU runner instead (modelc compile MODEL --target cpu), or write the source with modelc compile MODEL --target metal --emit-source DIR",
        std::env::consts::OS
    )
}

impl<'a> From<&'a codegen_metal::StepDispatch> for StepView<'a> {
    fn from(s: &'a codegen_metal::StepDispatch) -> StepView<'a> {
        StepView {
            n_tokens: s.n_tokens,
            n_outputs: s.n_outputs,
            launches: &s.launches,
        }
    }
}

impl Backend for MetalBackend {
    fn target(&self) -> Target {
        Target::Metal
    }

    fn supports(&self) -> Support {
        super::gpu::support()
    }

    fn kv_layout(&self, plan: &Plan, opts: &LoadOptions) -> anyhow::Result<ir::plan::KvLayout> {
        super::gpu::kv_layout(plan, opts)
    }

    fn build(&self, plan: Plan) -> anyhow::Result<Payload> {
        self.check(&plan)?;
        let program = self.generate(&plan)?;
        anyhow::ensure!(
            program.steps.len() == plan.steps.len(),
            "--target metal: the kernel printer made {} dispatch tables for {} steps",
            program.steps.len(),
            plan.steps.len()
        );
        check_source(&program.source)?;
        Ok(Payload::Metal {
            plan: Box::new(plan),
            program: Box::new(program),
        })
    }

    fn sources(&self, plan: &Plan) -> anyhow::Result<Vec<(String, String)>> {
        let program = self.generate(plan)?;
        Ok(vec![(SOURCE_FILE.to_string(), program.source)])
    }

    fn load<'w>(
        &self,
        payload: &Payload,
        weights: &'w dyn WeightSource,
        opts: &LoadOptions,
    ) -> anyhow::Result<Box<dyn Engine + 'w>> {
        let Payload::Metal { plan, program } = payload else {
            anyhow::bail!(
                "--target metal: this program was built for another target ({})",
                payload.kind()
            );
        };
        #[cfg(target_os = "macos")]
        {
            Ok(Box::new(super::metal_macos::load(
                plan, program, weights, opts,
            )?))
        }
        #[cfg(not(target_os = "macos"))]
        {
            let _ = (plan, program, weights, opts);
            anyhow::bail!(not_macos())
        }
    }
}
