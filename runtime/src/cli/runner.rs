//! The compiled runner's command line: what a runner written by `modelc compile` does when
//! started. Flags follow llama.cpp (`llama-completion`, `llama-bench`, `llama-perplexity`):
//!
//! ```text
//! NAME [-m FILE] -p PROMPT [-n N] [-t T] [-c CTX] [sampler flags] [--chat] [--json]
//! NAME bench [-m FILE] [-p 64,512] [-n 64] [-d 0,4096] [-r 3] [-t 1,2] [--json]
//! NAME perplexity [-m FILE] -f FILE [-c N] [-t T] [--kl-divergence-base FILE [--kl-divergence]]
//! NAME info
//! ```

use super::compile::{parse_cache_type, EngineArgs, KvArgs, LoadMode};
use super::gen_args::{check_n_batch, resolve_threads, run_generation, GenArgs};
use super::run::warn_ctx_train;
use crate::artifact::{fingerprint, Artifact};
use crate::backend::{backend, cache_type_name, BackendArgs, LoadOptions, LogitRows};
use crate::bench;
use crate::session::Session;
use crate::tokenizer::Vocab;
use anyhow::Context;
use clap::{Parser, Subcommand};
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use std::path::PathBuf;

/// A runner compiled by modelc for one model.
#[derive(Parser, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    version,
    allow_negative_numbers = true
)]
struct RunnerCli {
    #[command(subcommand)]
    command: Option<RunnerCommand>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    gen: GenArgs,
    #[command(flatten)]
    jinja: super::llama_flags::JinjaArgs,
}

#[derive(clap::Args, Debug, Clone)]
struct CommonArgs {
    /// The GGUF model (default: the path recorded at compile time).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Threads (default, or <= 0: the hardware's threads; more is capped there).
    #[arg(short = 't', long = "threads", allow_negative_numbers = true)]
    threads: Option<i64>,
    /// Context size (default, or 0: the one compiled in, which is also the largest).
    #[arg(short = 'c', long = "ctx-size", value_parser = super::gen_args::count, allow_negative_numbers = true)]
    n_ctx: Option<usize>,
    /// llama.cpp's `-ub`: refused with an explanation (the runner's ubatch sizes are fixed
    /// when it is compiled: `modelc compile --ubatch`).
    #[arg(long = "ubatch-size", hide = true)]
    ubatch_size: Option<String>,
    /// KV cache types (the ones compiled in), flash attention.
    #[command(flatten)]
    engine: EngineArgs,
    /// The backend's own flags.
    #[command(flatten)]
    backend: BackendArgs,
}

#[derive(Subcommand, Debug)]
enum RunnerCommand {
    /// Measure speed and print llama-bench's table.
    Bench(BenchArgs),
    /// Perplexity of a text, as llama-perplexity computes it.
    Perplexity(RunnerPerplexityArgs),
    /// Serve the model over HTTP with llama-server's API (OpenAI-compatible), `-np` slots.
    #[command(allow_negative_numbers = true)]
    Serve(Box<RunnerServeArgs>),
    /// Print what this runner was compiled from and the memory it will use.
    Info {
        /// The GGUF model (default: the path recorded at compile time).
        #[arg(short = 'm', long = "model")]
        model: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct RunnerServeArgs {
    /// Model, threads, total context (`-c`, split over the slots), engine flags.
    #[command(flatten)]
    common: CommonArgs,
    /// Sampler defaults (`--temp`, `-n`, `--stop`, ...) and the chat template.
    #[command(flatten)]
    gen: GenArgs,
    #[command(flatten)]
    server: crate::server::ServerArgs,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// The GGUF model (default: the path recorded at compile time).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// The benchmark's flags.
    #[command(flatten)]
    flags: super::bench::BenchFlags,
}

#[derive(clap::Args, Debug)]
struct RunnerPerplexityArgs {
    /// The GGUF model (default: the path recorded at compile time).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Chunk size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    n_ctx: usize,
    /// The text to score, its chunks and the KL-divergence files.
    #[command(flatten)]
    text: super::run::PerplexityText,
    /// Threads (default, or <= 0: the hardware's threads; more is capped there).
    #[arg(short = 't', long = "threads", allow_negative_numbers = true)]
    threads: Option<i64>,
    /// KV cache types (the ones compiled in), flash attention.
    #[command(flatten)]
    engine: EngineArgs,
    /// The backend's own flags.
    #[command(flatten)]
    backend: BackendArgs,
}

/// Opens the model a runner was compiled for, refusing any file with another tensor table.
fn open_checked(
    artifact: &Artifact,
    model: Option<&PathBuf>,
    load: LoadMode,
) -> anyhow::Result<GgufFile> {
    let path = model.unwrap_or(&artifact.model_path);
    let gguf = load.open(path).with_context(|| {
        if model.is_none() {
            "the model recorded at compile time could not be opened; pass its path with -m"
                .to_string()
        } else {
            "opening the model".to_string()
        }
    })?;
    let fp = fingerprint(&gguf);
    anyhow::ensure!(
        fp == artifact.fingerprint,
        "{} is not the model this runner was compiled for ({}): its tensors or hyperparameters differ (fingerprint {fp}, expected {}); compile a runner for it with `modelc compile`",
        path.display(),
        artifact.model_name.as_deref().unwrap_or("unnamed"),
        artifact.fingerprint
    );
    Ok(gguf)
}

/// The KV cache types of the runner's program. They change the kernels, so a runner runs
/// the ones it was compiled with: `-ctk`/`-ctv` asking for others are refused with the
/// command that compiles a runner for them.
fn compiled_kv(artifact: &Artifact, kv: &KvArgs) -> anyhow::Result<KvTypes> {
    let compiled = KvTypes {
        k: parse_cache_type(&artifact.cache_type_k)?,
        v: parse_cache_type(&artifact.cache_type_v)?,
    };
    let asked = kv.resolve(compiled, artifact.target)?;
    anyhow::ensure!(
        asked == compiled,
        "-ctk {} -ctv {}: this runner was compiled for -ctk {} -ctv {} (the cache types change the kernels); compile a runner for them with `modelc compile MODEL -ctk {} -ctv {}`",
        cache_type_name(asked.k),
        cache_type_name(asked.v),
        artifact.cache_type_k,
        artifact.cache_type_v,
        cache_type_name(asked.k),
        cache_type_name(asked.v)
    );
    Ok(compiled)
}

/// Loads the runner's program through its target's backend into a one-sequence session of
/// `n_ctx` (at most the compiled context: no re-planning), giving the file's pages back while
/// the weights are copied ([`crate::backend::open_session`]).
///
/// # Errors
/// A context past the compiled one, cache types other than the compiled ones, a context
/// that does not fit in memory, or what the backend reports.
fn load_session<'a>(
    artifact: &Artifact,
    gguf: &'a GgufFile,
    n_ctx: usize,
    logits: LogitRows,
    engine: &EngineArgs,
    backend_args: &BackendArgs,
    threads: usize,
) -> anyhow::Result<Session<'a>> {
    let shape = SessionShape { n_ctx, n_seq: 1 };
    load_session_seqs(artifact, gguf, shape, logits, engine, backend_args, threads)
}

/// The sequences of a session and the context of each.
#[derive(Clone, Copy, Debug)]
struct SessionShape {
    /// Context of each sequence.
    n_ctx: usize,
    /// Sequences (the server's slots).
    n_seq: usize,
}

/// [`load_session`] with `shape.n_seq` sequences of `shape.n_ctx` each.
///
/// # Errors
/// As [`load_session`].
fn load_session_seqs<'a>(
    artifact: &Artifact,
    gguf: &'a GgufFile,
    shape: SessionShape,
    logits: LogitRows,
    engine: &EngineArgs,
    backend_args: &BackendArgs,
    threads: usize,
) -> anyhow::Result<Session<'a>> {
    let n_ctx = shape.n_ctx;
    compiled_kv(artifact, &engine.kv)?;
    check_ctx(artifact, n_ctx)?;
    let be = backend(artifact.target, backend_args)?;
    let opts = LoadOptions {
        n_threads: threads.max(1),
        n_ctx,
        flash_attn: engine.flash(),
        logits,
        swa_full: engine.swa_full,
    };
    crate::backend::open_session_seqs(be.as_ref(), &artifact.payload, gguf, &opts, shape.n_seq)
}

/// Refuses a context of `n_ctx` positions (per sequence) that this runner cannot hold.
///
/// # Errors
/// Zero, or more than the context it was compiled for.
fn check_ctx(artifact: &Artifact, n_ctx: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        n_ctx >= 1 && n_ctx <= artifact.n_ctx,
        "-c {n_ctx}: this runner was compiled for a context of at most {}; compile one with `modelc compile MODEL -c {n_ctx}`",
        artifact.n_ctx
    );
    Ok(())
}

/// The model's training context, for [`warn_ctx_train`].
fn n_ctx_train(gguf: &GgufFile) -> anyhow::Result<usize> {
    Ok(compiler::HParams::from_gguf(gguf)?.n_ctx_train as usize)
}

/// Runs as the runner for `artifact` with the process's arguments.
pub fn main(artifact: Artifact) -> std::process::ExitCode {
    let typed: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match super::parse_last_wins::<RunnerCli>(super::normalize_args(typed.iter().cloned())) {
        Ok(cli) => super::report(run(artifact, cli)),
        Err(e) => super::usage_error(e, &typed),
    }
}

/// The runner's `--kernels` default: what `modelc compile --kernels` recorded. Its CPU is
/// the one it was compiled for (`modelc compile --cpu`): `--cpu` is refused.
fn compiled_kernels(artifact: &Artifact, backend: &mut BackendArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        backend.cpu.cpu.is_none(),
        "--cpu: this runner's kernels were chosen for {} when it was compiled; compile another with modelc compile --cpu",
        compiled_cpu(artifact)
    );
    if backend.cpu.kernels.is_none() {
        backend.cpu.kernels = artifact
            .kernels
            .as_deref()
            .and_then(crate::backend::cpu::Kernels::from_name);
    }
    Ok(())
}

/// The CPU the runner's kernels were chosen for (`native` in runners that predate the
/// choice: the CPU they start on).
fn compiled_cpu(artifact: &Artifact) -> String {
    codegen_cpu::select::selection(artifact.payload.plan())
        .ok()
        .flatten()
        .map_or_else(
            || "the CPU it starts on".to_string(),
            |s| {
                format!(
                    "{} ({}, kernels up to {})",
                    s.cpu.name,
                    s.cpu.arch.name(),
                    s.cpu.tier.name()
                )
            },
        )
}

fn run(artifact: Artifact, mut cli: RunnerCli) -> anyhow::Result<()> {
    cli.jinja.notes();
    let notes = |e: &EngineArgs| e.compat.notes(artifact.target);
    match &cli.command {
        None => notes(&cli.common.engine),
        Some(RunnerCommand::Bench(b)) => notes(&b.flags.engine),
        Some(RunnerCommand::Perplexity(p)) => notes(&p.engine),
        Some(RunnerCommand::Serve(a)) => notes(&a.common.engine),
        Some(RunnerCommand::Info { .. }) => {}
    }
    match &mut cli.command {
        None => compiled_kernels(&artifact, &mut cli.common.backend)?,
        Some(RunnerCommand::Bench(b)) => compiled_kernels(&artifact, &mut b.flags.backend)?,
        Some(RunnerCommand::Perplexity(p)) => compiled_kernels(&artifact, &mut p.backend)?,
        Some(RunnerCommand::Serve(a)) => compiled_kernels(&artifact, &mut a.common.backend)?,
        Some(RunnerCommand::Info { .. }) => {}
    }
    match cli.command {
        None => {
            anyhow::ensure!(
                cli.common.ubatch_size.is_none(),
                "-ub: this runner's ubatch sizes are fixed when it is compiled (modelc compile --ubatch)"
            );
            cli.gen.validate()?;
            let mut gen = cli.gen.clone();
            // As llama-cli: on a terminal without a prompt, chat.
            if gen.prompt.is_none() && gen.file.is_none() && !gen.no_conversation {
                use std::io::IsTerminal;
                gen.conversation |= std::io::stdin().is_terminal();
            }
            let gguf = open_checked(
                &artifact,
                cli.common.model.as_ref(),
                cli.common.engine.load_mode(),
            )?;
            let vocab = Vocab::from_gguf(&gguf)?;
            let n_ctx = match cli.common.n_ctx {
                None | Some(0) => artifact.n_ctx,
                Some(c) => super::run::at_least_min_ctx(c),
            };
            warn_ctx_train(n_ctx, n_ctx_train(&gguf)?);
            let threads = resolve_threads(cli.common.threads);
            // Speculation verifies drafts in the compiled steps with a logit row per token
            // (`modelc compile --ubatch 1,2,4,8,16,32,64` gives it small ones).
            let logits = if gen.speculates()? {
                LogitRows::Both
            } else {
                LogitRows::Last
            };
            let mut session = load_session(
                &artifact,
                &gguf,
                n_ctx,
                logits,
                &cli.common.engine,
                &cli.common.backend,
                threads,
            )?;
            // A draft model (-md) is compiled for the CPU at start, with the runner's
            // threads, cache types and context.
            let draft_files = super::run::DraftFiles::open(&gen, &cli.common.engine, &vocab)?;
            let mut draft = match &draft_files {
                Some(f) => {
                    let target = super::run::ModelArgs {
                        model: PathBuf::new(),
                        backend: super::run::Backend::Cpu,
                        n_ctx,
                        threads: cli.common.threads,
                        n_ubatch: 64,
                        no_rounding: false,
                        engine: cli.common.engine.clone(),
                        backend_args: cli.common.backend.clone(),
                    };
                    Some(f.drafter(&target, session.n_ctx(), vocab.n_vocab())?)
                }
                None => None,
            };
            run_generation(
                &gen,
                &gguf,
                &vocab,
                &mut session,
                draft
                    .as_mut()
                    .map(|d| d as &mut dyn crate::speculative::Drafter),
            )
        }
        Some(RunnerCommand::Bench(b)) => {
            let f = &b.flags;
            let threads = f.thread_counts()?;
            let gguf = open_checked(&artifact, b.model.as_ref(), b.flags.engine.load_mode())?;
            let n_ctx = f.n_ctx(artifact.n_ctx);
            let kv = compiled_kv(&artifact, &f.engine.kv)?;
            let rows = bench::run(
                &mut |t| {
                    load_session(
                        &artifact,
                        &gguf,
                        n_ctx,
                        LogitRows::Last,
                        &f.engine,
                        &f.backend,
                        t,
                    )
                },
                &threads,
                &f.depths(),
                &f.tests(),
                f.reps,
            )?;
            let step_tokens = artifact.ubatch.iter().copied().max().unwrap_or(1);
            f.report(&gguf, kv, step_tokens, &rows)
        }
        Some(RunnerCommand::Perplexity(mut p)) => {
            check_n_batch(p.text.n_batch)?;
            anyhow::ensure!(
                p.n_ctx > 0,
                "perplexity needs a context: -c must be above 0"
            );
            p.n_ctx = super::run::at_least_min_ctx(p.n_ctx);
            p.text
                .check_output(p.model.as_ref().unwrap_or(&artifact.model_path))?;
            let n_ctx = p.text.n_ctx(p.n_ctx)?;
            let gguf = open_checked(&artifact, p.model.as_ref(), p.engine.load_mode())?;
            let vocab = Vocab::from_gguf(&gguf)?;
            warn_ctx_train(n_ctx, n_ctx_train(&gguf)?);
            let threads = resolve_threads(p.threads);
            let mut session = load_session(
                &artifact,
                &gguf,
                n_ctx,
                LogitRows::All,
                &p.engine,
                &p.backend,
                threads,
            )?;
            super::run::print_perplexity(&mut session, &vocab, &p.text, n_ctx)
        }
        Some(RunnerCommand::Serve(a)) => serve(artifact, a),
        Some(RunnerCommand::Info { model }) => {
            println!(
                "compiled by modelc {} for {}",
                artifact.modelc_version,
                artifact.model_path.display()
            );
            println!(
                "model name      = {}",
                artifact.model_name.as_deref().unwrap_or("-")
            );
            println!(
                "target          = {} ({} payload)",
                artifact.target.name(),
                artifact.payload_kind
            );
            // The GPU a CUDA runner would run on and its memory bandwidth (what the decode's
            // weight bandwidth is a share of: `scripts/gpu-check run` reads this line).
            #[cfg(feature = "cuda")]
            if artifact.target == crate::backend::Target::Cuda {
                match crate::backend::cuda::memory_bandwidth() {
                    Ok(bw) => println!("device          = {bw}"),
                    Err(e) => println!("device          = none ({e})"),
                }
            }
            println!(
                "kernels         = {} (the default of --kernels)",
                artifact.kernels.as_deref().unwrap_or("exact")
            );
            if artifact.target == crate::backend::Target::Cpu {
                println!("cpu             = {}", compiled_cpu(&artifact));
            }
            println!("fingerprint     = {}", artifact.fingerprint);
            println!("ubatch sizes    = {:?}", artifact.ubatch);
            println!(
                "n_ctx           = {} (KV cache k {}, v {})",
                artifact.n_ctx, artifact.cache_type_k, artifact.cache_type_v
            );
            let plan = artifact.payload.plan();
            let n = u64::from(plan.n_ctx);
            let full = plan.kv_layout(n).map_err(anyhow::Error::msg)?;
            let ring = plan
                .kv_layout_ring(n, crate::backend::ring_ubatch(plan))
                .map_err(anyhow::Error::msg)?;
            let rings: Vec<u64> = ring
                .caches
                .iter()
                .filter(|c| c.is_ring(n))
                .map(|c| c.n_cells)
                .collect();
            if rings.is_empty() || artifact.payload.swa_full() == Some(true) {
                println!(
                    "KV memory       = {} per sequence at n_ctx",
                    crate::memory::human(full.stream_bytes)
                );
            } else {
                // A GPU program's kernels are generated for one layout.
                let full_how = if artifact.payload.swa_full().is_some() {
                    "compiled with --swa-full"
                } else {
                    "--swa-full"
                };
                println!(
                    "KV memory       = {} per sequence at n_ctx ({} sliding-window caches of {} cells, as llama.cpp's SWA cache; {full_how}: {})",
                    crate::memory::human(ring.stream_bytes),
                    rings.len(),
                    rings[0],
                    crate::memory::human(full.stream_bytes)
                );
            }
            print!("{}", plan.summary());
            if let Some(m) = model {
                open_checked(&artifact, Some(&m), LoadMode::Auto)?;
                println!("{}: matches", m.display());
            }
            Ok(())
        }
    }
}

/// `./NAME serve`: the runner's program with `-np` slots of `-c / N` positions each
/// ([`super::serve`]).
fn serve(artifact: Artifact, a: Box<RunnerServeArgs>) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.server.embed.embedding,
        "--embedding: a runner serves text generation; serve embeddings with modelc serve --embedding"
    );
    anyhow::ensure!(
        a.common.ubatch_size.is_none(),
        "-ub: this runner's ubatch sizes are fixed when it is compiled (modelc compile --ubatch)"
    );
    let cfg = super::serve::config(&a.gen, &a.server)?;
    let n_parallel = cfg.args.parallel;
    // The context is checked before the server listens: a bad `-c` is an error at once.
    let n_ctx = match a.common.n_ctx {
        None | Some(0) => artifact.n_ctx,
        Some(c) => super::run::at_least_min_ctx(c),
    };
    let per_slot = super::serve::slot_ctx(n_ctx, n_parallel, a.server.kv_unified)?;
    check_ctx(&artifact, per_slot)?;
    compiled_kv(&artifact, &a.common.engine.kv)?;
    let load: crate::server::Loader = Box::new(move |run| {
        let gguf = open_checked(
            &artifact,
            a.common.model.as_ref(),
            a.common.engine.load_mode(),
        )?;
        let vocab = Vocab::from_gguf(&gguf)?;
        warn_ctx_train(n_ctx, n_ctx_train(&gguf)?);
        let shape = SessionShape {
            n_ctx: per_slot,
            n_seq: n_parallel,
        };
        // Several slots decode together through the steps with a logit row per token.
        let logits = if n_parallel > 1 {
            LogitRows::Both
        } else {
            LogitRows::Last
        };
        let session = load_session_seqs(
            &artifact,
            &gguf,
            shape,
            logits,
            &a.common.engine,
            &a.common.backend,
            resolve_threads(a.common.threads),
        )?;
        let path = a
            .common
            .model
            .clone()
            .unwrap_or(artifact.model_path.clone());
        let ready = super::serve::ready_info(
            &gguf,
            std::sync::Arc::new(vocab),
            &a.gen,
            &a.server,
            &path,
            per_slot,
        )?;
        super::serve::hand_over(run, session, ready, &a.server)
    });
    crate::server::serve(cfg, load)
}

#[cfg(test)]
mod tests {
    /// The runner's command line and its subcommands' are well formed (clap's checks: no
    /// flag defined twice, as a flattened struct can bring).
    #[test]
    fn command_line_is_well_formed() {
        use clap::CommandFactory;
        super::RunnerCli::command().debug_assert();
    }
}
