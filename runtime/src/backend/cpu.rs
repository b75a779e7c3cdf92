//! The CPU backend: the plan is the program, run by [`CpuEngine`]. Building it runs the
//! backend's `select-kernels` pass ([`codegen_cpu::select`]): every matrix product's kernel
//! is chosen for the CPU `--cpu` names (the host by default) and `--kernels`, and written
//! into the plan; the Cranelift kernels are generated when it is loaded.

use super::{Backend, LoadOptions, LogitRows, Payload, Support, Target};
use crate::cpu_engine::CpuEngine;
use crate::engine::Engine;
use anyhow::Context;
use codegen_cpu::exec::ExecOptions;
use codegen_cpu::target::CpuTarget;
use codegen_cpu::SumOrder;
use ir::interp::WeightSource;
use ir::plan::Plan;

/// Which quantized matmul kernels a CPU engine runs (`--kernels`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// llama.cpp's x86 (AVX2) summation order: its logits bit for bit.
    #[default]
    Exact,
    /// One fused multiply-add per weight block (ggml's scalar order): faster (measured here:
    /// decode +13%, prompts about 1.5×), but the logits differ from llama.cpp's in the last
    /// bits, which 8-bit activation rounding amplifies (up to ~0.6 nat on SmolLM2).
    Fast,
}

impl Kernels {
    /// The name `--kernels` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Exact => "exact",
            Kernels::Fast => "fast",
        }
    }

    /// The kernels named `name` (as [`Kernels::name`] writes it).
    pub fn from_name(name: &str) -> Option<Kernels> {
        [Kernels::Exact, Kernels::Fast]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// The kernels' [`SumOrder`].
    pub fn sum_order(self) -> SumOrder {
        match self {
            Kernels::Exact => SumOrder::Ggml,
            Kernels::Fast => SumOrder::Block,
        }
    }
}

/// The CPU backend's flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CpuArgs {
    /// CPU backend: quantized matmul kernels `exact` (llama.cpp's logits bit for bit) or
    /// `fast` (faster; logits differ from llama.cpp's in the last bits). Default: exact.
    // `None` when not given, so that other targets can refuse it.
    #[arg(long = "kernels", value_enum)]
    pub kernels: Option<Kernels>,
    /// CPU backend: the CPU to choose kernels for, as `-march` names CPUs (`native`, the
    /// default; `x86-64-v3`, `znver4`, `sapphirerapids`, `armv8-a`, ...; `x86_64+avx2`).
    /// A program compiled for a CPU runs on CPUs that have its features.
    #[arg(long = "cpu", value_name = "NAME")]
    pub cpu: Option<String>,
}

impl CpuArgs {
    /// The kernels asked for (`exact` unless `--kernels` said otherwise).
    pub fn kernels(&self) -> Kernels {
        self.kernels.unwrap_or(Kernels::Exact)
    }
}

/// The CPU backend (module doc).
#[derive(Clone, Debug)]
pub struct CpuBackend {
    kernels: Kernels,
    cpu: CpuTarget,
}

impl CpuBackend {
    /// The backend with its flags.
    ///
    /// # Errors
    /// A `--cpu` name that names no CPU (listing the known ones).
    pub fn new(args: &CpuArgs) -> anyhow::Result<CpuBackend> {
        let cpu = CpuTarget::named(args.cpu.as_deref().unwrap_or("native"))
            .map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
        Ok(CpuBackend {
            kernels: args.kernels(),
            cpu,
        })
    }

    /// The kernels it runs.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }
}

/// The steps of `plan` that give `logits` (a plan may hold both kinds: see
/// [`crate::cpu_engine::build_plan`]).
///
/// # Errors
/// A plan without such steps.
pub fn select_steps(mut plan: Plan, logits: LogitRows) -> anyhow::Result<Plan> {
    plan.steps.retain(|s| match logits {
        LogitRows::Both => true,
        LogitRows::Last => s.n_outputs == 1,
        LogitRows::All => s.n_outputs == s.n_tokens,
    });
    anyhow::ensure!(
        !plan.steps.is_empty(),
        "the program has no steps that give {}",
        if logits == LogitRows::All {
            "a logit row per token (recompile it)"
        } else {
            "one logit row per ubatch (recompile it)"
        }
    );
    Ok(plan)
}

impl Backend for CpuBackend {
    fn target(&self) -> Target {
        Target::Cpu
    }

    fn supports(&self) -> Support {
        Support {
            weight_types: ir::ggml::GgmlType::ALL
                .iter()
                .copied()
                .filter(|&t| codegen_cpu::matmul_supports(t))
                .collect(),
            kv_pairs: Support::kv_pairs_from(codegen_cpu::exec::kv_pair_supported),
        }
    }

    fn build(&self, mut plan: Plan) -> anyhow::Result<Payload> {
        self.check(&plan)?;
        codegen_cpu::select::select_kernels(&mut plan, &self.cpu, self.kernels.sum_order())
            .map_err(anyhow::Error::msg)?;
        Ok(Payload::Plan {
            plan: Box::new(plan),
        })
    }

    fn kv_layout(&self, plan: &Plan, opts: &LoadOptions) -> anyhow::Result<ir::plan::KvLayout> {
        let n = opts.n_ctx as u64;
        if opts.swa_full {
            plan.kv_layout(n)
        } else {
            plan.kv_layout_ring(n, super::ring_ubatch(plan))
        }
        .map_err(anyhow::Error::msg)
    }

    fn load<'w>(
        &self,
        payload: &Payload,
        weights: &'w dyn WeightSource,
        opts: &LoadOptions,
    ) -> anyhow::Result<Box<dyn Engine + 'w>> {
        let plan = payload.plan();
        anyhow::ensure!(
            opts.n_ctx >= 1 && opts.n_ctx <= plan.n_ctx as usize,
            "-c {}: this program was compiled for a context of at most {} (recompile with modelc compile -c {})",
            opts.n_ctx,
            plan.n_ctx,
            opts.n_ctx
        );
        let plan = select_steps(plan.clone(), opts.logits)?;
        let ring = (!opts.swa_full).then(|| super::ring_ubatch(&plan));
        let mut e = CpuEngine::load(
            weights,
            plan,
            &ExecOptions {
                n_threads: opts.n_threads.max(1),
                order: self.kernels.sum_order(),
                n_cells: Some(opts.n_ctx as u64),
                kv_ring_ubatch: ring,
            },
        )
        .context("loading the CPU program")?;
        e.set_flash_attn(opts.flash_attn)?;
        Ok(Box::new(e))
    }
}
