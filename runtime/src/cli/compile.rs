//! `modelc compile MODEL.gguf [--target cpu] [-o NAME] [--ubatch 1,64] [-c CTX]`: lowers the
//! model, runs the pass pipeline, prints the plan summary and writes a standalone runner
//! (see [`crate::artifact`] for how the runner carries its plan).

use crate::artifact::{fingerprint, write_runner, Artifact, ARTIFACT_VERSION};
use anyhow::Context;
use compiler::passes::CompileOptions;
use ir::gguf::GgufFile;
use ir::graph::{DType, KvTypes};
use ir::plan::Plan;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Compile targets.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Native CPU code generated with Cranelift.
    Cpu,
}

/// Arguments of `modelc compile`.
#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// What to generate code for.
    #[arg(long, value_enum, default_value_t = Target::Cpu)]
    pub target: Target,
    /// The runner to write (default: the model file's name without `.gguf`).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Ubatch sizes to specialise for, comma-separated (1 for decode, larger for prompts).
    /// The sizes between 1 and 64 let short prompts and prompt tails run as one padded step
    /// instead of token by token (a 28-token prompt: one 32-token step).
    #[arg(long = "ubatch", value_delimiter = ',', default_value = "1,8,16,32,64")]
    pub ubatch: Vec<u32>,
    /// Default context size of the runner (0: the training context, at most 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub n_ctx: usize,
    /// The runner's default KV cache types (its own `-ctk`/`-ctv` override them).
    #[command(flatten)]
    pub kv: KvArgs,
    /// Print the plan after this pass (see `modelc compile --list-passes`).
    #[arg(long = "dump-after")]
    pub dump_after: Option<String>,
    /// Print the passes and exit.
    #[arg(long = "list-passes")]
    pub list_passes: bool,
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

/// The settings of the engine every generating command takes (`modelc run`, `modelc
/// perplexity`, a runner and its `bench` / `perplexity`): KV cache types, quantized kernels,
/// flash attention.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// KV cache types (`-ctk`, `-ctv`).
    #[command(flatten)]
    pub kv: KvArgs,
    /// Quantized matmul kernels: `exact` (llama.cpp's logits bit for bit) or `fast` (faster;
    /// logits differ from llama.cpp's in the last bits).
    #[arg(long = "kernels", value_enum, default_value_t = Kernels::Exact)]
    pub kernels: Kernels,
    /// Attention as llama.cpp's flash-attention kernels (`on`, or `auto`: llama.cpp's CPU
    /// default) or as its plain soft_max path (`off`), as llama.cpp's `-fa` (also `1`/`0`).
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "on", value_parser = parse_flash_attn, allow_negative_numbers = true)]
    pub flash_attn: String,
}

impl EngineArgs {
    /// Whether attention is llama.cpp's flash attention (`-fa` not `off`).
    pub fn flash(&self) -> bool {
        self.flash_attn != "off"
    }
}

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
    /// The kernels' [`codegen_cpu::SumOrder`].
    pub fn sum_order(self) -> codegen_cpu::SumOrder {
        match self {
            Kernels::Exact => codegen_cpu::SumOrder::Ggml,
            Kernels::Fast => codegen_cpu::SumOrder::Block,
        }
    }
}

/// llama.cpp's KV cache type flags: `-ctk TYPE` / `--cache-type-k TYPE` and `-ctv TYPE` /
/// `--cache-type-v TYPE` (`common/arg.cpp`), with the types the CPU target reads: `f16`
/// (llama.cpp's default), `f32` and `q8_0`. A quantized cache needs flash attention (on by
/// default).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvArgs {
    /// KV cache type for K: f16 (default), f32 or q8_0 (`-ctk`); K and V take one type, or
    /// q8_0 with f16.
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<String>,
    /// KV cache type for V: f16 (default), f32 or q8_0 (`-ctv`); q8_0 needs flash attention.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<String>,
}

impl KvArgs {
    /// The cache types given, each side defaulting to `default`'s.
    ///
    /// # Errors
    /// A type the CPU target does not read, or a pair it does not take (see
    /// [`parse_cache_type`]).
    pub fn resolve(&self, default: KvTypes) -> anyhow::Result<KvTypes> {
        let side = |flag: &str, s: &Option<String>, d: DType| match s {
            Some(s) => parse_cache_type(s).with_context(|| flag.to_string()),
            None => Ok(d),
        };
        let kv = KvTypes {
            k: side("-ctk", &self.cache_type_k, default.k)?,
            v: side("-ctv", &self.cache_type_v, default.v)?,
        };
        let q8 = DType::Block(ir::ggml::GgmlType::Q8_0);
        anyhow::ensure!(
            kv.k == kv.v
                || (kv.k == q8 && kv.v == DType::F16)
                || (kv.k == DType::F16 && kv.v == q8),
            "-ctk {} -ctv {}: the CPU target takes one type for both, or q8_0 with f16",
            cache_type_name(kv.k),
            cache_type_name(kv.v)
        );
        Ok(kv)
    }
}

/// Parses one KV cache type as llama.cpp spells it (`f16`, `f32`, `q8_0`; any case).
///
/// # Errors
/// Other types, naming the supported ones (llama.cpp also takes bf16, q4_0, q4_1, iq4_nl,
/// q5_0 and q5_1; this target does not read those yet).
pub fn parse_cache_type(s: &str) -> anyhow::Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f16" => Ok(DType::F16),
        "f32" => Ok(DType::F32),
        "q8_0" => Ok(DType::Block(ir::ggml::GgmlType::Q8_0)),
        other => anyhow::bail!("unsupported KV cache type '{other}' (supported: f16, f32, q8_0)"),
    }
}

/// A cache type as llama.cpp's flags spell it (`f16`, `q8_0`).
pub fn cache_type_name(t: DType) -> String {
    t.name().to_ascii_lowercase()
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

/// Lowers and compiles `gguf` to a plan with `opts`, calling `after` after every pass.
pub fn build_plan(
    gguf: &GgufFile,
    opts: &CompileOptions,
    after: &mut dyn FnMut(&compiler::passes::Pass, &compiler::passes::Module),
) -> anyhow::Result<Plan> {
    let model = compiler::load_model(gguf)?;
    Ok(compiler::passes::compile(&model, opts, after)?)
}

/// Refuses a plan whose weights the CPU kernels cannot read yet, naming the types and one
/// tensor of each, before a runner is written.
fn check_target_supports(plan: &Plan) -> anyhow::Result<()> {
    let mut missing: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for w in &plan.weights {
        let t = w.dtype.ggml_type();
        if !codegen_cpu::layout::supports(t) {
            missing.entry(t.name()).or_insert(&w.name);
        }
    }
    anyhow::ensure!(
        missing.is_empty(),
        "the CPU target has no kernels yet for {} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1); try `modelc run --backend interp`",
        missing.iter().map(|(t, n)| format!("{t} (e.g. {n})")).collect::<Vec<_>>().join(", ")
    );
    Ok(())
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
        return Ok(());
    }
    let t0 = Instant::now();
    let gguf = GgufFile::open(&args.model)?;
    let model_path =
        std::fs::canonicalize(&args.model).with_context(|| format!("{}", args.model.display()))?;
    let n_ctx_train = compiler::HParams::from_gguf(&gguf)?.n_ctx_train as usize;
    let n_ctx = super::run::resolve_n_ctx(args.n_ctx, n_ctx_train);
    let kv_types = args.kv.resolve(KvTypes::F16)?;
    let opts = compile_options(&args.ubatch, n_ctx, kv_types, false)?;
    if let Some(p) = &args.dump_after {
        anyhow::ensure!(
            compiler::passes::pass_names().contains(&p.as_str()),
            "--dump-after: no pass named '{p}' (passes: {})",
            compiler::passes::pass_names().join(", ")
        );
    }
    let dump = args.dump_after.clone();
    let plan = build_plan(&gguf, &opts, &mut |pass, m| {
        if dump.as_deref() == Some(pass.name) {
            println!("; after {}\n{m}", pass.name);
        }
    })?;
    check_target_supports(&plan)?;
    let summary = plan.summary();
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.model));
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
        target: "cpu".into(),
        n_ctx,
        ubatch: opts.ubatches.iter().map(|&u| u as usize).collect(),
        cache_type_k: cache_type_name(kv_types.k),
        cache_type_v: cache_type_name(kv_types.v),
        plan: serde_json::to_value(&plan)?,
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
