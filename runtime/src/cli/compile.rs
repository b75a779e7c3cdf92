//! `modelc compile MODEL.gguf [--target cpu|cuda|metal] [-o NAME] [--ubatch 1,64] [-c CTX]
//! [-ctk T -ctv T] [--emit-source DIR]`: lowers the model, runs the pass pipeline, lets the target's backend turn
//! the plan into its program, prints the plan summary and writes a standalone runner (see
//! [`crate::artifact`] for how the runner carries the program).

use crate::artifact::{fingerprint, write_runner, Artifact, ARTIFACT_VERSION};
use crate::backend::{backend, cache_type_name, BackendArgs, LogitRows, Target, LLAMA_CACHE_TYPES};
use anyhow::Context;
use compiler::passes::CompileOptions;
use ir::gguf::GgufFile;
use ir::graph::{DType, KvTypes};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `modelc compile`.
#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// What to generate code for.
    #[arg(long, value_enum, default_value_t = Target::Cpu)]
    pub target: Target,
    /// The target backend's flags.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// The runner to write (default: the model file's name without `.gguf`).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Ubatch sizes to specialise for, comma-separated (1 for decode, larger for prompts).
    /// The sizes between 1 and 64 let short prompts and prompt tails run as one padded step
    /// instead of token by token (a 28-token prompt: one 32-token step); with a logit row per
    /// token they also serve as the steps that decode one token of each of 2, 4, 8, ...
    /// server slots at once (`serve -np N`: continuous batching).
    #[arg(
        long = "ubatch",
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64"
    )]
    pub ubatch: Vec<u32>,
    /// Largest context of the runner, its default (0: the training context, at most 4096);
    /// the runner's `-c` may ask for less.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_ctx: usize,
    /// The runner's KV cache types (they change the kernels: a runner runs the ones it was
    /// compiled with).
    #[command(flatten)]
    pub kv: KvArgs,
    /// Print the plan after this pass (see `modelc compile --list-passes`).
    #[arg(long = "dump-after")]
    pub dump_after: Option<String>,
    /// Print the passes and exit.
    #[arg(long = "list-passes")]
    pub list_passes: bool,
    /// Also write the generated source into this folder (for CUDA each step's,
    /// `step-<n_tokens>x<n_outputs>.cu`; for Metal one library, `model.metal`), before it is
    /// compiled or checked (so it is there when that fails). GPU targets only.
    #[arg(long = "emit-source", value_name = "DIR")]
    pub emit_source: Option<PathBuf>,
    /// GPU targets: generate the kernels for full-size sliding-window caches (llama.cpp's
    /// `--swa-full`); by default they are rings of the cells llama.cpp's SWA cache has. The
    /// runner then runs with `--swa-full` only (the CPU runner chooses when it runs).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
}

/// Parses llama.cpp's `-fa` / `--flash-attn` value: `on` (also `1`, `true`, `enabled`),
/// `off` (`0`, `false`, `disabled`) or `auto` (`-1`; flash attention on the CPU, as
/// llama.cpp's auto decides there), as the canonical `on` / `off` / `auto`.
///
/// # Errors
/// Anything else, naming the accepted values.
pub fn parse_flash_attn(s: &str) -> Result<String, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "1" | "true" | "enabled" => Ok("on".into()),
        "off" | "0" | "false" | "disabled" => Ok("off".into()),
        "auto" | "-1" => Ok("auto".into()),
        _ => Err("expected on, off or auto".into()),
    }
}

/// How the model file is loaded: llama.cpp's `-lm` / `--load-mode` modes (`common/arg.cpp`),
/// but `dio`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// `auto`: mapped, as llama.cpp's CPU default.
    Auto,
    /// `none`: read into memory ([`ir::gguf::GgufFile::read_into_memory`]).
    None,
    /// `mmap`: mapped.
    Mmap,
    /// `mlock`: read into memory and locked in RAM.
    Mlock,
    /// `mmap+mlock`: mapped and locked in RAM.
    MmapMlock,
}

impl LoadMode {
    /// Opens the model at `path` in this mode. A lock that fails is a warning, as in
    /// llama.cpp.
    ///
    /// Errors: as [`ir::gguf::GgufFile::open`] and [`ir::gguf::GgufFile::read_into_memory`].
    pub fn open(self, path: &std::path::Path) -> anyhow::Result<ir::gguf::GgufFile> {
        let mut gguf = ir::gguf::GgufFile::open(path)?;
        if matches!(self, LoadMode::None | LoadMode::Mlock) {
            gguf.read_into_memory()?;
        }
        if matches!(self, LoadMode::Mlock | LoadMode::MmapMlock) {
            if let Err(e) = gguf.lock_in_memory() {
                eprintln!(
                    "{}: warning: failed to lock the model in RAM ({e}); raise `ulimit -l`",
                    crate::cli::prog()
                );
            }
        }
        Ok(gguf)
    }
}

/// `-lm MODE` as llama.cpp names its modes: `auto`, `none`, `mmap`, `mlock`, `mmap+mlock`.
/// `dio` (direct I/O) is refused with what to use instead, at parse time, before anything is
/// opened or bound.
pub fn parse_load_mode(s: &str) -> Result<LoadMode, String> {
    match s {
        "auto" => Ok(LoadMode::Auto),
        "none" => Ok(LoadMode::None),
        "mmap" => Ok(LoadMode::Mmap),
        "mlock" => Ok(LoadMode::Mlock),
        "mmap+mlock" => Ok(LoadMode::MmapMlock),
        "dio" => {
            Err("direct I/O (dio) is not supported; use none (read into memory) or mmap".into())
        }
        _ => Err("expected auto, none, mmap, mlock or mmap+mlock".into()),
    }
}

/// The settings of the engine every generating command takes (`modelc run`, `modelc
/// perplexity`, a runner and its `bench` / `perplexity`), whatever the backend: KV cache
/// types, flash attention. A backend's own flags live with it ([`BackendArgs`]).
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// KV cache types (`-ctk`, `-ctv`).
    #[command(flatten)]
    pub kv: KvArgs,
    /// Attention as llama.cpp's flash-attention kernels (`on`, or `auto`: llama.cpp's CPU
    /// default) or as its plain soft_max path (`off`), as llama.cpp's `-fa` (also `1`/`0`).
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "on", value_parser = parse_flash_attn, allow_negative_numbers = true)]
    pub flash_attn: String,
    /// Full-size caches for the sliding-window layers too (llama.cpp's `--swa-full`). By
    /// default they hold only the cells llama.cpp's SWA cache has (1024 for Gemma 3 at any
    /// `-c` from 1024), written as a ring: less memory, and llama.cpp's numbers past them.
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// `-lm`: how the model file is loaded (llama.cpp's `--load-mode`): `auto` and `mmap`
    /// map it (nothing read at start, pages shared with other processes); `none` reads it into
    /// memory (huge pages on Linux): a longer start, then decode that does not depend on how
    /// the page cache holds the file (on a 2-core VM, a file the page cache took in from disk
    /// decoded a 1B Q4_K_M at 18 tokens/s mapped, 29 read; pass it to `serve`); `mlock` reads
    /// it and locks it in RAM, `mmap+mlock` maps and locks it (a lock that fails is a warning,
    /// as in llama.cpp). llama.cpp's `dio` is not supported.
    #[arg(long = "load-mode", value_name = "MODE", default_value = "auto", value_parser = parse_load_mode)]
    pub load_mode: LoadMode,
    /// `-lm none` (older llama.cpp's flag).
    #[arg(long = "no-mmap", conflicts_with = "load_mode")]
    pub no_mmap: bool,
    /// llama.cpp's common flags (`-ngl`, `--mlock`, `--no-warmup`, ...): taken, done where
    /// they mean something, noted where they do not.
    #[command(flatten)]
    pub compat: super::llama_flags::EngineCompat,
}

impl EngineArgs {
    /// The load mode `-lm` (or `--no-mmap`, `--mlock`, `--mmap`) asks for.
    pub fn load_mode(&self) -> LoadMode {
        match self.compat.load_mode() {
            Some(mode) => mode,
            None if self.no_mmap => LoadMode::None,
            None => self.load_mode,
        }
    }

    /// Whether attention is llama.cpp's flash attention (`-fa` not `off`).
    pub fn flash(&self) -> bool {
        self.flash_attn != "off"
    }
}

/// llama.cpp's KV cache type flags: `-ctk TYPE` / `--cache-type-k TYPE` and `-ctv TYPE` /
/// `--cache-type-v TYPE` (`common/arg.cpp`), with llama.cpp's type names; which pairs a
/// target reads is the backend's to say ([`crate::backend::Support::kv_pairs`]). A quantized
/// V cache needs flash attention (on by default).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvArgs {
    /// KV cache type for K (`-ctk`): f16 (default), f32, q8_0 (the CPU target; llama.cpp's
    /// other names are refused with the list of what the target reads).
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<String>,
    /// KV cache type for V (`-ctv`), as `-ctk`; a quantized V needs flash attention.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<String>,
}

impl KvArgs {
    /// The cache types given, each side defaulting to `default`'s, checked against what
    /// `target` reads (its backend's [`crate::backend::Support::kv_pairs`]).
    ///
    /// # Errors
    /// A name llama.cpp does not know ([`parse_cache_type`]), or a pair the backend does
    /// not read, listing those it does; a target without a backend.
    pub fn resolve(&self, default: KvTypes, target: Target) -> anyhow::Result<KvTypes> {
        let side = |flag: &str, s: &Option<String>, d: DType| match s {
            Some(s) => parse_cache_type(s).with_context(|| flag.to_string()),
            None => Ok(d),
        };
        let kv = KvTypes {
            k: side("-ctk", &self.cache_type_k, default.k)?,
            v: side("-ctv", &self.cache_type_v, default.v)?,
        };
        let b = backend(target, &BackendArgs::default())?;
        crate::backend::check_kv_pair(&b.supports(), target, kv.k, kv.v)?;
        Ok(kv)
    }
}

/// Parses one KV cache type as llama.cpp spells it (`f16`, `q8_0`, ...; any case): one of
/// [`LLAMA_CACHE_TYPES`].
///
/// # Errors
/// A name llama.cpp does not take, listing those it does.
pub fn parse_cache_type(s: &str) -> anyhow::Result<DType> {
    let lower = s.to_ascii_lowercase();
    LLAMA_CACHE_TYPES
        .iter()
        .copied()
        .find(|&t| cache_type_name(t) == lower)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "unknown KV cache type '{lower}' (llama.cpp's types: {})",
                LLAMA_CACHE_TYPES
                    .iter()
                    .map(|&t| cache_type_name(t))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// The `--ubatch` sizes a user gave, each larger than the context `n_ctx` lowered to it
/// with a warning (llama.cpp clamps `n_ubatch` to `n_ctx` the same way).
///
/// # Errors
/// A size of 0.
fn clamp_ubatch(ubatch: &[u32], n_ctx: usize) -> anyhow::Result<Vec<u32>> {
    anyhow::ensure!(
        ubatch.iter().all(|&u| u > 0),
        "--ubatch sizes must be at least 1"
    );
    let ctx = u32::try_from(n_ctx).unwrap_or(u32::MAX);
    for &u in ubatch.iter().filter(|&&u| u > ctx) {
        eprintln!(
            "{}: warning: --ubatch {u} is larger than the context ({ctx}): using {ctx}",
            crate::cli::prog()
        );
    }
    Ok(ubatch.iter().map(|&u| u.min(ctx)).collect())
}

/// Compile options for a model: sorted, deduplicated ubatch sizes; `n_ctx` resolved.
pub fn compile_options(
    ubatch: &[u32],
    n_ctx: usize,
    kv_types: KvTypes,
    all_logits: bool,
) -> anyhow::Result<CompileOptions> {
    // A ubatch larger than the context can never be filled: compile only those that fit.
    let mut ub: Vec<u32> = ubatch
        .iter()
        .copied()
        .filter(|&u| u as usize <= n_ctx)
        .collect();
    ub.sort_unstable();
    ub.dedup();
    anyhow::ensure!(
        !ub.is_empty() && ub[0] > 0,
        "--ubatch needs sizes of at least 1"
    );
    anyhow::ensure!(ub[0] == 1, "--ubatch must include 1 (the decode step)");
    anyhow::ensure!(
        n_ctx > 0 && n_ctx <= u32::MAX as usize,
        "bad context size {n_ctx}"
    );
    Ok(CompileOptions {
        ubatches: ub,
        all_logits,
        n_ctx: n_ctx as u32,
        kv_types,
        ..CompileOptions::default()
    })
}

fn default_output(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    PathBuf::from(stem)
}

/// Runs `modelc compile`.
pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    if args.list_passes {
        for p in compiler::passes::pipeline() {
            println!("{:<20} {}", p.name, p.about);
        }
        println!(
            "{:<20} CPU target: each matrix product's kernel for --cpu and --kernels",
            codegen_cpu::select::PASS_NAME
        );
        return Ok(());
    }
    let t0 = Instant::now();
    // A target without a backend is refused before anything is read.
    let be = crate::backend::backend_kv(args.target, &args.backend, args.swa_full)?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.model));
    if super::same_file(&args.model, &out) {
        anyhow::bail!(
            "the output {} is the model file itself: choose another -o",
            out.display()
        );
    }
    if let Some(dir) = &args.emit_source {
        anyhow::ensure!(
            !dir.exists() || dir.is_dir(),
            "--emit-source {}: not a folder (it names the folder the source files go into)",
            dir.display()
        );
    }
    // Code generation can take a while (NVRTC): an output folder the runner cannot be
    // written to is refused before it.
    let (probe, tmp, _) = ir::gguf::create_beside(&out)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    drop(probe);
    let _ = std::fs::remove_file(&tmp);
    let gguf = GgufFile::open(&args.model)?;
    let model_path =
        std::fs::canonicalize(&args.model).with_context(|| format!("{}", args.model.display()))?;
    let n_ctx_train = compiler::HParams::from_gguf(&gguf)?.n_ctx_train as usize;
    let n_ctx = super::run::resolve_n_ctx(args.n_ctx, n_ctx_train);
    let kv_types = args.kv.resolve(KvTypes::F16, args.target)?;
    let opts = compile_options(&clamp_ubatch(&args.ubatch, n_ctx)?, n_ctx, kv_types, false)?;
    // The target's own passes run when its backend builds the program.
    let backend_passes: &[&str] = match args.target {
        crate::backend::Target::Cpu => &[codegen_cpu::select::PASS_NAME],
        _ => &[],
    };
    if let Some(p) = &args.dump_after {
        anyhow::ensure!(
            compiler::passes::pass_names().contains(&p.as_str())
                || backend_passes.contains(&p.as_str()),
            "--dump-after: no pass named '{p}' (passes: {})",
            compiler::passes::pass_names()
                .into_iter()
                .chain(backend_passes.iter().copied())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let dump = args.dump_after.clone();
    let model = compiler::load_model(&gguf)?;
    // Steps for both kinds of logits: the runner generates and computes perplexity with
    // the same program.
    let plan =
        crate::cpu_engine::build_plan_with(&model, &opts, LogitRows::Both, &mut |pass, m| {
            if dump.as_deref() == Some(pass.name) {
                println!("; after {}\n{m}", pass.name);
            }
        })?;
    let summary = plan.summary();
    // A context whose KV cache this machine cannot hold compiles (the runner may run
    // elsewhere), but says so: here the runner would refuse it.
    let needs = crate::memory::Needs {
        resident: plan.kv_bytes().saturating_add(plan.arena_bytes()),
        mapped: gguf.file_size(),
    };
    if let Err(e) = crate::memory::check_fits(n_ctx, needs) {
        eprintln!(
            "{}: warning: {e:#} (this machine could not run the runner)",
            crate::cli::prog()
        );
    }
    if let Some(dir) = &args.emit_source {
        let files = be.sources(&plan)?;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--emit-source: creating {}", dir.display()))?;
        for (name, text) in &files {
            let p = dir.join(name);
            std::fs::write(&p, text)
                .with_context(|| format!("--emit-source: writing {}", p.display()))?;
        }
        eprintln!(
            "compile: wrote {} source files into {}",
            files.len(),
            dir.display()
        );
    }
    let payload = be.build(plan)?;
    if let (Some(p), crate::backend::Payload::Plan { plan }) = (&args.dump_after, &payload) {
        if backend_passes.contains(&p.as_str()) {
            println!("; after {p}\n{plan}");
        }
    }
    let artifact = Artifact {
        version: ARTIFACT_VERSION,
        modelc_version: env!("CARGO_PKG_VERSION").to_string(),
        model_path,
        fingerprint: fingerprint(&gguf),
        model_name: gguf
            .metadata()
            .get_str("general.name")
            .ok()
            .flatten()
            .map(str::to_string),
        target: args.target,
        n_ctx,
        ubatch: opts.ubatches.iter().map(|&u| u as usize).collect(),
        cache_type_k: cache_type_name(kv_types.k),
        cache_type_v: cache_type_name(kv_types.v),
        kernels: args.backend.cpu.kernels.map(|k| k.name().to_string()),
        payload_kind: payload.kind().to_string(),
        payload,
    };
    write_runner(&artifact, &out)?;
    eprint!("{summary}");
    eprintln!(
        "compile: wrote {} ({:.0} ms) for {}",
        out.display(),
        t0.elapsed().as_secs_f64() * 1e3,
        args.model.display()
    );
    Ok(())
}
