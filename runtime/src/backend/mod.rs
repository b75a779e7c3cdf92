//! Backends: what turns a plan into a program for one target and loads that program with
//! the weights into an [`Engine`]. Every command that runs a model (the runner, `modelc run`,
//! `perplexity`, `bench`) gets its engine through [`backend`], the one place that maps a
//! target to its implementation.
//!
//! Adding a backend is its crate plus one line in [`backend`]; its supported types and its
//! flags ([`BackendArgs`]) live with it.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "metal"))]
pub mod gpu;
#[cfg(feature = "metal")]
pub mod metal;
#[cfg(all(feature = "metal", target_os = "macos"))]
mod metal_macos;

use crate::engine::Engine;
use ir::ggml::GgmlType;
use ir::graph::DType;
use ir::interp::WeightSource;
use ir::plan::Plan;
use serde::{Deserialize, Serialize};

/// A compile target (`modelc compile --target`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// Native CPU code generated with Cranelift.
    Cpu,
    /// NVIDIA GPUs: generated CUDA C.
    Cuda,
    /// Apple GPUs: generated Metal Shading Language.
    Metal,
}

impl Target {
    /// The name as `--target` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Metal => "metal",
        }
    }
}

/// A GPU target whose device this machine lacks (no driver, no GPU, not macOS). Its
/// message is the runner's and `modelc compile`'s (compile a CPU runner instead);
/// `modelc run` says `--backend cpu` instead ([`NoDevice::for_run`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoDevice {
    /// The target asked for.
    pub target: Target,
    /// What is missing and why, e.g. "no NVIDIA driver/GPU found (the driver sees no
    /// device)".
    pub what: String,
}

impl std::fmt::Display for NoDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--target {}: {}; compile a CPU runner instead: modelc compile MODEL --target cpu",
            self.target.name(),
            self.what
        )
    }
}

impl std::error::Error for NoDevice {}

impl NoDevice {
    /// The message for `modelc run --backend TARGET`: run on the CPU instead.
    pub fn for_run(&self) -> String {
        format!(
            "--backend {}: {}; run on the CPU instead: --backend cpu",
            self.target.name(),
            self.what
        )
    }
}

/// What a backend runs, derived from the backend itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// Weight types its matrix products and lookups read.
    pub weight_types: Vec<GgmlType>,
    /// KV cache types it reads, each with the types it takes for the other side
    /// (`(k, v)` pairs).
    pub kv_pairs: Vec<(DType, DType)>,
}

/// llama.cpp's KV cache types (`-ctk`/`-ctv`, `common/arg.cpp` `kv_cache_types`): the
/// candidates a backend's [`Support::kv_pairs`] is drawn from.
pub const LLAMA_CACHE_TYPES: [DType; 9] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Block(GgmlType::Q8_0),
    DType::Block(GgmlType::Q4_0),
    DType::Block(GgmlType::Q4_1),
    DType::Block(GgmlType::IQ4_NL),
    DType::Block(GgmlType::Q5_0),
    DType::Block(GgmlType::Q5_1),
];

impl Support {
    /// The pairs of [`LLAMA_CACHE_TYPES`] that `ok` accepts.
    pub fn kv_pairs_from(ok: impl Fn(DType, DType) -> bool) -> Vec<(DType, DType)> {
        let mut v = Vec::new();
        for k in LLAMA_CACHE_TYPES {
            for vt in LLAMA_CACHE_TYPES {
                if ok(k, vt) {
                    v.push((k, vt));
                }
            }
        }
        v
    }

    /// The supported pairs as `-ctk K -ctv V` text, for messages (`f16/f16, q8_0/f16, ...`).
    pub fn kv_pairs_text(&self) -> String {
        self.kv_pairs
            .iter()
            .map(|&(k, v)| format!("{}/{}", cache_type_name(k), cache_type_name(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A cache type as llama.cpp's flags spell it (`f16`, `q8_0`).
pub fn cache_type_name(t: DType) -> String {
    t.name().to_ascii_lowercase()
}

/// What a backend made of a plan: the artifact's payload. The CPU backend keeps the plan
/// (its kernels are generated at load time, for the CPU the runner starts on); CUDA and
/// Metal carry generated source next to it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Payload {
    /// The plan itself.
    Plan {
        /// The plan.
        plan: Box<Plan>,
    },
    /// The CUDA backend's program: the plan, the CUDA C generated from it and that source
    /// compiled with NVRTC ([`cuda::CudaBinaries`]).
    #[cfg(feature = "cuda")]
    Cuda {
        /// The plan the program was generated from.
        plan: Box<Plan>,
        /// The generated sources, launches and buffer sizes.
        program: Box<codegen_cuda::GpuProgram>,
        /// Each step's CUBINs and PTX.
        binaries: cuda::CudaBinaries,
    },
    /// The Metal backend's program: the plan and the Metal Shading Language generated from
    /// it (one library for every step, compiled when the runner loads it, on macOS).
    #[cfg(feature = "metal")]
    Metal {
        /// The plan the program was generated from.
        plan: Box<Plan>,
        /// The generated source and each step's dispatch table.
        program: Box<codegen_metal::MetalProgram>,
    },
}

impl Payload {
    /// The payload's kind as the artifact records it (`plan`, `cuda`, `metal`).
    pub fn kind(&self) -> &'static str {
        match self {
            Payload::Plan { .. } => "plan",
            #[cfg(feature = "cuda")]
            Payload::Cuda { .. } => "cuda",
            #[cfg(feature = "metal")]
            Payload::Metal { .. } => "metal",
        }
    }

    /// Whether the payload's kernels were generated for full-size sliding-window caches
    /// (a GPU program compiled with `--swa-full`); a plan chooses when it loads (`None`).
    pub fn swa_full(&self) -> Option<bool> {
        match self {
            Payload::Plan { .. } => None,
            #[cfg(feature = "cuda")]
            Payload::Cuda { program, .. } => Some(program.kv_ring_ubatch.is_none()),
            #[cfg(feature = "metal")]
            Payload::Metal { program, .. } => Some(program.kv_ring_ubatch.is_none()),
        }
    }

    /// The plan the payload was built from.
    pub fn plan(&self) -> &Plan {
        match self {
            Payload::Plan { plan } => plan,
            #[cfg(feature = "cuda")]
            Payload::Cuda { plan, .. } => plan,
            #[cfg(feature = "metal")]
            Payload::Metal { plan, .. } => plan,
        }
    }
}

/// Which logit rows the steps of a loaded program give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// One row per ubatch (generation).
    Last,
    /// One row per token (perplexity, teacher forcing).
    All,
    /// Both kinds of steps.
    Both,
}

/// Settings of a loaded program that change no kernel.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Threads (the CPU's; a GPU backend's host threads).
    pub n_threads: usize,
    /// Context of each sequence: 1 up to the `n_ctx` the plan was compiled for.
    pub n_ctx: usize,
    /// llama.cpp's flash attention (else its soft_max path).
    pub flash_attn: bool,
    /// The logit rows the caller needs (the program's other steps are not loaded).
    pub logits: LogitRows,
    /// Every cache holds the whole context (llama.cpp's `--swa-full`); else a backend that
    /// can gives sliding-window caches a ring of the cells llama.cpp's SWA cache has
    /// ([`ir::plan::Plan::kv_layout_ring`], [`ring_ubatch`]).
    pub swa_full: bool,
}

/// The ubatch a backend sizes its KV rings for ([`LoadOptions::swa_full`] off): llama.cpp's
/// default `n_ubatch` (512, whose SWA cache modelc reproduces cell for cell) or the plan's
/// largest step if larger (a ring must hold the window and a whole step).
pub fn ring_ubatch(plan: &Plan) -> u32 {
    plan.ring_ubatch()
}

/// A compile target's implementation (module doc).
pub trait Backend {
    /// Its target.
    fn target(&self) -> Target;

    /// What it runs.
    fn supports(&self) -> Support;

    /// Refuses a plan this backend cannot run, naming the weight types (with one tensor of
    /// each) or KV cache types it lacks and listing what it supports.
    ///
    /// # Errors
    /// As said.
    fn check(&self, plan: &Plan) -> anyhow::Result<()> {
        let s = self.supports();
        let mut missing: std::collections::BTreeMap<&str, &str> = Default::default();
        for w in &plan.weights {
            let t = w.dtype.ggml_type();
            if !s.weight_types.contains(&t) {
                missing.entry(t.name()).or_insert(&w.name);
            }
        }
        let names = |ts: &[GgmlType]| ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ");
        anyhow::ensure!(
            missing.is_empty(),
            "the {} target has no kernels yet for {} (supported: {}); try `modelc run --backend interp`",
            self.target().name(),
            missing
                .iter()
                .map(|(t, n)| format!("{t} (e.g. {n})"))
                .collect::<Vec<_>>()
                .join(", "),
            names(&s.weight_types)
        );
        let kind = |k: ir::graph::KvKind| plan.kv.iter().find(|c| c.kind == k).map(|c| c.dtype);
        if let (Some(k), Some(v)) = (kind(ir::graph::KvKind::K), kind(ir::graph::KvKind::V)) {
            check_kv_pair(&s, self.target(), k, v)?;
        }
        Ok(())
    }

    /// Turns a plan that [`Backend::check`] accepts into the program the artifact stores.
    ///
    /// # Errors
    /// What the backend's code generation reports.
    fn build(&self, plan: Plan) -> anyhow::Result<Payload>;

    /// The generated source files of `plan`, as `(file name, text)` (`step-1x1.cu`), for
    /// `modelc compile --emit-source`; made without compiling them, so that they can be
    /// looked at when compiling fails.
    ///
    /// # Errors
    /// A target that generates no source (the CPU's), or what its code generation reports.
    fn sources(&self, plan: &Plan) -> anyhow::Result<Vec<(String, String)>> {
        let _ = plan;
        anyhow::bail!(
            "--emit-source: the {} target generates no source (it generates machine code when the runner starts)",
            self.target().name()
        )
    }

    /// The KV layout of one sequence this backend gives `plan` under `opts` (the session
    /// allocates it). Every cache holds the whole context unless the backend overrides this
    /// (the CPU backend's rings).
    ///
    /// # Errors
    /// A context the plan cannot hold.
    fn kv_layout(&self, plan: &Plan, opts: &LoadOptions) -> anyhow::Result<ir::plan::KvLayout> {
        plan.kv_layout(opts.n_ctx as u64)
            .map_err(anyhow::Error::msg)
    }

    /// Loads a program this backend built, with the weights, into an engine.
    ///
    /// # Errors
    /// A payload of another backend, a context past the compiled one, a weight the file
    /// lacks, or what the backend reports.
    fn load<'w>(
        &self,
        payload: &Payload,
        weights: &'w dyn WeightSource,
        opts: &LoadOptions,
    ) -> anyhow::Result<Box<dyn Engine + 'w>>;
}

/// How often the model file's pages are given back while a program's weights are copied
/// ([`crate::engine_weights::ReleasingGguf::while_loading`]).
const RELEASE_PERIOD: std::time::Duration = std::time::Duration::from_millis(2);

/// Loads `payload` with the weights of `gguf` through `be` into a one-sequence session of
/// `opts.n_ctx`: first refuses a context whose KV memory and work buffers do not fit in the
/// memory this process may use, then loads while the file's pages are given back (the
/// process holds the engine's copies of the weights, not the file's pages too).
///
/// # Errors
/// A context that does not fit, or what [`Backend::load`] and [`Session::new`] report.
pub fn open_session<'w>(
    be: &dyn Backend,
    payload: &Payload,
    gguf: &'w ir::gguf::GgufFile,
    opts: &LoadOptions,
) -> anyhow::Result<crate::session::Session<'w>> {
    open_session_seqs(be, payload, gguf, opts, 1)
}

/// [`open_session`] with room for `n_seq` sequences of `opts.n_ctx` each (the server's
/// `-np` slots); the memory check counts the KV memory of all of them.
///
/// # Errors
/// As [`open_session`].
pub fn open_session_seqs<'w>(
    be: &dyn Backend,
    payload: &Payload,
    gguf: &'w ir::gguf::GgufFile,
    opts: &LoadOptions,
    n_seq: usize,
) -> anyhow::Result<crate::session::Session<'w>> {
    let plan = payload.plan();
    let kv = be.kv_layout(plan, opts)?;
    crate::memory::check_fits(
        opts.n_ctx,
        crate::memory::Needs {
            resident: plan.weight_bytes()
                + kv.stream_bytes.saturating_mul(n_seq as u64)
                + plan.arena_bytes(),
            mapped: gguf.file_size(),
        },
    )?;
    let engine = crate::engine_weights::ReleasingGguf::new(gguf)
        .while_loading(RELEASE_PERIOD, || be.load(payload, gguf, opts))?;
    crate::session::Session::new(engine, n_seq)
}

/// Refuses a `(k, v)` cache type pair `s` lacks, listing those it has.
///
/// # Errors
/// As said.
pub fn check_kv_pair(s: &Support, target: Target, k: DType, v: DType) -> anyhow::Result<()> {
    anyhow::ensure!(
        s.kv_pairs.contains(&(k, v)),
        "-ctk {} -ctv {}: the {} target does not read this KV cache (it reads -ctk/-ctv {})",
        cache_type_name(k),
        cache_type_name(v),
        target.name(),
        s.kv_pairs_text()
    );
    Ok(())
}

/// Every backend's flags, each group defined by its backend.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// The CPU backend's flags.
    #[command(flatten)]
    pub cpu: cpu::CpuArgs,
}

/// The backend of `target`, set up with its flags from `args`: the one place a target is
/// dispatched (module doc).
///
/// # Errors
/// A target whose backend this modelc was built without (its feature off), in one line.
pub fn backend(target: Target, args: &BackendArgs) -> anyhow::Result<Box<dyn Backend>> {
    backend_kv(target, args, false)
}

/// [`backend`], the GPU targets generating for full-size sliding-window caches with
/// `swa_full` (llama.cpp's `--swa-full`; their kernels are generated for one KV layout, the
/// CPU backend chooses it when it loads: [`LoadOptions::swa_full`]).
///
/// # Errors
/// As [`backend`].
pub fn backend_kv(
    target: Target,
    args: &BackendArgs,
    swa_full: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    let _ = swa_full;
    anyhow::ensure!(
        target == Target::Cpu || args.cpu.kernels.is_none(),
        "--kernels chooses the CPU backend's kernels: it does nothing with --target {}",
        target.name()
    );
    anyhow::ensure!(
        target == Target::Cpu || args.cpu.cpu.is_none(),
        "--cpu chooses the CPU backend's kernels: it does nothing with --target {}",
        target.name()
    );
    match target {
        Target::Cpu => Ok(Box::new(cpu::CpuBackend::new(&args.cpu)?)),
        #[cfg(feature = "cuda")]
        Target::Cuda => Ok(Box::new(cuda::CudaBackend { swa_full })),
        #[cfg(feature = "metal")]
        Target::Metal => Ok(Box::new(metal::MetalBackend { swa_full })),
        #[allow(unreachable_patterns)]
        other => anyhow::bail!(
            "--target {}: this modelc was built without the `{}` feature",
            other.name(),
            other.name()
        ),
    }
}
