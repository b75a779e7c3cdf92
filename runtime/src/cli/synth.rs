//! `modelc synth OUT.gguf [--preset 1b] [--type Q4_1] [--seed N] [shape flags]`: writes a
//! random-weight llama ([`crate::synth`]) with SmolLM2's tokenizer, for speed measurements on
//! shapes no downloaded model has. A terminal gets a progress bar on stderr; Ctrl-C leaves no
//! partial file.

use super::quantize::{cancel_on_ctrl_c, progress_bar, show_progress};
use crate::quantize::{self, FileType};
use crate::synth::{Shape, Synth, SynthArch};
use anyhow::{bail, Context};
use ir::gguf::GgufFile;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// Arguments of `modelc synth`.
#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// The GGUF file to write.
    pub output: PathBuf,
    /// The base shape: `1b` (TinyLlama 1.1B's: n_embd 2048, 22 layers, n_ff 5632, 32/4
    /// heads), `8b` (Llama-3.1-8B's: 4096, 32 layers, 14336, 32/8 heads, llama3 rope
    /// scaling, its 128256-token vocabulary) or `smollm2-135m`; the flags below change
    /// single sizes. `bert-fixture` and `bert-reranker-fixture`: the small bert test model
    /// of `runtime::synth_bert` (`--type` F32, F16 or Q8_0 and `--seed` only).
    #[arg(long, default_value = "1b")]
    pub preset: String,
    /// Width of the residual stream.
    #[arg(long)]
    pub n_embd: Option<u64>,
    /// Number of layers.
    #[arg(long)]
    pub n_layer: Option<u64>,
    /// Feed-forward width.
    #[arg(long)]
    pub n_ff: Option<u64>,
    /// Query heads.
    #[arg(long)]
    pub n_head: Option<u64>,
    /// Key/value heads.
    #[arg(long)]
    pub n_head_kv: Option<u64>,
    /// The architecture: llama (the default; with --n-expert, Mixtral-style), qwen3moe
    /// (the default with --n-expert) or olmoe; the MoE ones need --n-expert.
    #[arg(long)]
    pub arch: Option<String>,
    /// Experts per layer, each `--n-ff` wide (0: a dense FFN).
    #[arg(long)]
    pub n_expert: Option<u64>,
    /// Experts each token is routed to (default 2 with `--n-expert`).
    #[arg(long)]
    pub n_expert_used: Option<u64>,
    /// The quantization (a llama-quantize name: Q4_1, Q8_0, Q4_K_M, F16, F32, ...).
    #[arg(long = "type", default_value = "Q4_1")]
    pub ftype: String,
    /// Seed of the random weights (one seed, one file, byte for byte).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The GGUF whose tokenizer the model gets (default: the cached SmolLM2-135M-Instruct
    /// Q4_1; for `8b`, Llama 3's: llama.cpp's models/ggml-vocab-llama-bpe.gguf in the source
    /// scripts/build-llama-bench unpacks to ~/.cache/modelc/llama.cpp/src).
    #[arg(long)]
    pub vocab_from: Option<PathBuf>,
    /// Threads quantizing (default: all).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// The default vocabulary file: `~/.cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf`,
/// or for a shape with Llama 3's 128256 tokens, llama.cpp's Llama 3 vocabulary in
/// `~/.cache/modelc/llama.cpp/src/models/ggml-vocab-llama-bpe.gguf`.
fn default_vocab(shape: &Shape) -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("no HOME; pass --vocab-from FILE")?;
    let cache = PathBuf::from(home).join(".cache/modelc");
    Ok(match shape.n_vocab {
        Some(128256) => cache.join("llama.cpp/src/models/ggml-vocab-llama-bpe.gguf"),
        _ => cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    })
}

/// Runs `modelc synth`.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    if let Some(rerank) = match args.preset.as_str() {
        "bert-fixture" => Some(false),
        "bert-reranker-fixture" => Some(true),
        _ => None,
    } {
        return write_bert_fixture(&args, rerank);
    }
    let base = Shape::preset(&args.preset)?;
    let shape = Shape {
        n_embd: args.n_embd.unwrap_or(base.n_embd),
        n_layer: args.n_layer.unwrap_or(base.n_layer),
        n_ff: args.n_ff.unwrap_or(base.n_ff),
        n_head: args.n_head.unwrap_or(base.n_head),
        n_head_kv: args.n_head_kv.unwrap_or(base.n_head_kv),
        n_expert: args.n_expert.unwrap_or(base.n_expert),
        arch: match (&args.arch, args.n_expert) {
            (Some(a), _) => SynthArch::parse(a)?,
            (None, Some(e)) if e > 0 => SynthArch::Qwen3Moe,
            (None, _) => base.arch,
        },
        n_expert_used: match (args.n_expert, args.n_expert_used) {
            (_, Some(n)) => n,
            (Some(e), None) if e > 0 => 2.min(e),
            _ => base.n_expert_used,
        },
        ..base
    };
    let ftype = FileType::parse(&args.ftype)?;
    let vocab_path = match args.vocab_from {
        Some(p) => p,
        None => default_vocab(&shape)?,
    };
    let vocab = GgufFile::open(&vocab_path).with_context(|| {
        format!(
            "cannot read the vocabulary file '{}' (fetch SmolLM2 with scripts/fetch-model, unpack llama.cpp's source with scripts/build-llama-bench, or pass --vocab-from FILE)",
            vocab_path.display()
        )
    })?;
    let synth = Synth::new(&shape, vocab.metadata(), ftype, args.seed)
        .with_context(|| format!("vocabulary from '{}'", vocab_path.display()))?;
    drop(vocab);
    let threads = args
        .threads
        .filter(|&t| t > 0)
        .unwrap_or_else(quantize::default_threads);
    let cancel = cancel_on_ctrl_c();
    let bar = progress_bar(synth.plan(), &format!("writing {}", ftype.name));
    let start = std::time::Instant::now();
    let result = synth.write(&args.output, threads, &cancel, |p| show_progress(&bar, &p));
    bar.finish_and_clear();
    if cancel.load(Ordering::SeqCst) {
        bail!("interrupted; no output written");
    }
    result.context("cannot write the synthetic model")?;
    if std::io::stderr().is_terminal() {
        let bytes: u64 = synth.plan().tensors.iter().map(|t| t.to_bytes).sum();
        eprintln!(
            "wrote '{}' ({}, {:.2} MiB of weights) in {:.2} s with {threads} threads",
            args.output.display(),
            ftype.name,
            bytes as f64 / (1 << 20) as f64,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `--preset bert-fixture` / `bert-reranker-fixture`: [`crate::synth_bert::BertFixture`].
fn write_bert_fixture(args: &SynthArgs, rerank: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.n_embd.is_none()
            && args.n_layer.is_none()
            && args.n_ff.is_none()
            && args.n_head.is_none()
            && args.n_head_kv.is_none()
            && args.vocab_from.is_none(),
        "--preset {}: a fixed shape and vocabulary; only --type and --seed apply",
        args.preset
    );
    let weight_type = match args.ftype.to_ascii_uppercase().as_str() {
        "F32" => ir::ggml::GgmlType::F32,
        "F16" => ir::ggml::GgmlType::F16,
        "Q8_0" => ir::ggml::GgmlType::Q8_0,
        other => anyhow::bail!("--type {other}: the bert fixture has F32, F16 or Q8_0 weights"),
    };
    crate::synth_bert::BertFixture {
        weight_type,
        rerank,
        seed: args.seed,
    }
    .write(&args.output)
}
