//! `modelc run MODEL.gguf -p PROMPT [-n N] [--backend interp|cpu] ...`: generate text from a
//! model without writing a runner; `modelc perplexity` and `modelc graph` live here too, as
//! they load a model the same way.

use super::gen_args::{check_n_batch, resolve_threads, run_generation, GenArgs};
use crate::backend::{backend, BackendArgs, LoadOptions, LogitRows, Target};
use crate::interp_engine::InterpEngine;
use crate::session::Session;
use crate::tokenizer::Vocab;
use anyhow::Context;
use ir::gguf::GgufFile;
use ir::interp::InterpOptions;
use std::path::PathBuf;

/// Which engine evaluates the model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Compiled in memory to native CPU code (what `modelc compile` writes into a runner).
    Cpu,
    /// Compiled in memory for an NVIDIA GPU (not built yet).
    Cuda,
    /// Compiled in memory for an Apple GPU (runs on macOS only).
    Metal,
    /// The reference interpreter (slow, exact; the oracle).
    Interp,
}

impl Backend {
    /// The compile target, for the compiled backends.
    pub fn target(self) -> Option<Target> {
        match self {
            Backend::Cpu => Some(Target::Cpu),
            Backend::Cuda => Some(Target::Cuda),
            Backend::Metal => Some(Target::Metal),
            Backend::Interp => None,
        }
    }
}

/// Model-loading flags shared by `run` and `perplexity`.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// Which engine evaluates the model.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Context size in tokens (0: the model's training context, at most 4096 by default).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_ctx: usize,
    /// Threads (default, or <= 0: the hardware's threads; more is capped there).
    #[arg(short = 't', long = "threads", allow_negative_numbers = true)]
    pub threads: Option<i64>,
    /// Largest number of tokens evaluated at once (`-ub`); the CPU backend compiles the sizes
    /// 1 and this one.
    #[arg(long = "ubatch-size", default_value_t = 64, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_ubatch: usize,
    /// Interpreter only: compute in plain f32, without llama.cpp's 8-bit activation and f16
    /// attention rounding.
    #[arg(long = "no-rounding")]
    pub no_rounding: bool,
    /// KV cache types, flash attention.
    #[command(flatten)]
    pub engine: super::compile::EngineArgs,
    /// The compiled backends' own flags.
    #[command(flatten)]
    pub backend_args: BackendArgs,
}

/// Arguments of `modelc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    /// llama.cpp's `--jinja` / `--no-jinja`.
    #[command(flatten)]
    pub jinja: super::llama_flags::JinjaArgs,
}

/// Opens the model (mapped or read, as `-lm` says: [`super::compile::LoadMode::open`]) and
/// its tokenizer.
pub fn open_model(
    path: &std::path::Path,
    engine: &super::compile::EngineArgs,
) -> anyhow::Result<(GgufFile, compiler::Model, Vocab)> {
    let gguf = engine.load_mode().open(path)?;
    let model = compiler::load_model(&gguf).with_context(|| format!("{}", path.display()))?;
    let vocab =
        Vocab::from_gguf(&gguf).with_context(|| format!("{}: tokenizer", path.display()))?;
    Ok((gguf, model, vocab))
}

/// The context size `-c` asks for: 0 means the model's training context, capped at 4096;
/// below [`MIN_CTX`] is raised to it with a warning ([`at_least_min_ctx`]).
pub fn resolve_n_ctx(requested: usize, n_ctx_train: usize) -> usize {
    if requested == 0 {
        n_ctx_train.clamp(1, 4096)
    } else {
        at_least_min_ctx(requested)
    }
}

/// The smallest context llama-completion runs with (`-c 1` to `-c 7` become 8).
pub const MIN_CTX: usize = 8;

/// `-c n` as llama-completion takes it: from 1 to 7 it warns "minimum context size is 8"
/// on stderr and uses [`MIN_CTX`].
pub fn at_least_min_ctx(n_ctx: usize) -> usize {
    if n_ctx < MIN_CTX {
        eprintln!("{}: warning: the minimum context size is {MIN_CTX}; using {MIN_CTX} instead of -c {n_ctx}", crate::cli::prog());
        MIN_CTX
    } else {
        n_ctx
    }
}

impl ModelArgs {
    /// Refuses settings that cannot work (a zero ubatch, an unsupported KV cache type or
    /// pair, a quantized cache without flash attention) before the model is opened; returns
    /// the KV cache types.
    pub fn validate(&self) -> anyhow::Result<ir::graph::KvTypes> {
        anyhow::ensure!(self.n_ubatch > 0, "the ubatch size must be at least 1");
        // The interpreter runs on the CPU.
        self.engine
            .compat
            .notes(self.backend.target().unwrap_or(Target::Cpu));
        if let Some(t) = self.backend.target() {
            backend(t, &self.backend_args)?;
        }
        // The interpreter reads what the CPU target reads.
        let target = self.backend.target().unwrap_or(Target::Cpu);
        let kv_types = self.engine.kv.resolve(ir::graph::KvTypes::F16, target)?;
        anyhow::ensure!(
            !(matches!(kv_types.v, ir::graph::DType::Block(_)) && !self.engine.flash()),
            "a quantized V cache (-ctv q8_0) needs flash attention, as in llama.cpp: drop -fa off"
        );
        Ok(kv_types)
    }
}

fn interp_options(args: &ModelArgs, threads: usize) -> InterpOptions {
    let mut o = if args.no_rounding {
        InterpOptions::exact()
    } else {
        InterpOptions::llama_cpp()
    };
    o.n_threads = threads.max(1);
    o.flash_attn = args.engine.flash() && !args.no_rounding;
    // Sliding-window caches as rings, as the CPU backend and llama.cpp have them.
    o.kv_ring_ubatch = (!args.engine.swa_full).then_some(crate::cpu_engine::LLAMA_N_UBATCH as u32);
    o
}

/// Builds the session `args` asks for (one sequence): the model compiled in memory by the
/// target's backend, or the interpreter.
///
/// # Errors
/// Bad settings ([`ModelArgs::validate`]), a context that does not fit in memory, or what
/// the backend reports.
pub fn open_session<'a>(
    args: &ModelArgs,
    gguf: &'a GgufFile,
    model: &'a compiler::Model,
    all_logits: bool,
) -> anyhow::Result<Session<'a>> {
    open_session_seqs(args, gguf, model, all_logits, 1)
}

/// `e`, or for a GPU backend this machine lacks, its message for `--backend`
/// ([`crate::backend::NoDevice::for_run`]).
fn backend_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<crate::backend::NoDevice>() {
        Some(none) => anyhow::anyhow!(none.for_run()),
        None => e,
    }
}

/// [`open_session`] with `n_seq` sequences of the context `args` asks for each (the
/// server's slots).
///
/// # Errors
/// As [`open_session`].
pub fn open_session_seqs<'a>(
    args: &ModelArgs,
    gguf: &'a GgufFile,
    model: &'a compiler::Model,
    all_logits: bool,
    n_seq: usize,
) -> anyhow::Result<Session<'a>> {
    let logits = match (all_logits, n_seq) {
        (true, _) => LogitRows::All,
        (false, 1) => LogitRows::Last,
        // Several sequences (server slots) decode together through the steps with
        // a logit row per token (`Engine::decode_seqs`, `Engine::decode_runs`).
        (false, _) => LogitRows::Both,
    };
    open_session_rows(args, gguf, model, logits, n_seq)
}

/// The step sizes of a model without causal attention, whose input must be one step
/// (llama.cpp sets `n_ubatch = n_batch` for them): the powers of two up to the largest
/// input, `max(-ub, 512)` tokens within the context, and that size, so that any input up to
/// it pads to one step of at most twice its length.
pub fn non_causal_ubatches(n_ctx: usize, n_ubatch: usize) -> Vec<u32> {
    let top = n_ubatch
        .max(crate::cpu_engine::LLAMA_N_UBATCH)
        .min(n_ctx)
        .max(1) as u32;
    let mut ub: Vec<u32> = (0..).map(|i| 1u32 << i).take_while(|&s| s < top).collect();
    ub.push(top);
    ub
}

/// [`open_session_seqs`] with the steps `logits` names. With [`LogitRows::Both`] the
/// steps with a logit row per token come in sizes 2, 4, ... up to the slots and at least to
/// 64 (within `-ub`), besides the prompt's: short prompt chunks share steps with other
/// slots' tokens, and a speculative draft is verified in one step padded at most twofold.
///
/// # Errors
/// As [`open_session`].
pub fn open_session_rows<'a>(
    args: &ModelArgs,
    gguf: &'a GgufFile,
    model: &'a compiler::Model,
    logits: LogitRows,
    n_seq: usize,
) -> anyhow::Result<Session<'a>> {
    let all_logits = logits == LogitRows::All;
    let n_ctx_train = model.hparams.n_ctx_train as usize;
    let n_ctx = resolve_n_ctx(args.n_ctx, n_ctx_train);
    let kv_types = args.validate()?;
    let threads = resolve_threads(args.threads);
    match args.backend.target() {
        Some(target) => {
            let be = crate::backend::backend_kv(target, &args.backend_args, args.engine.swa_full)?;
            let mut ub = vec![1, args.n_ubatch as u32];
            if !model.hparams.causal_attn {
                ub = non_causal_ubatches(n_ctx, args.n_ubatch);
            }
            if logits == LogitRows::Both {
                let top = n_seq.next_power_of_two().max(64).min(args.n_ubatch.max(2)) as u32;
                ub.extend((1..).map(|i| 1u32 << i).take_while(|&s| s <= top));
            }
            let opts = super::compile::compile_options(&ub, n_ctx, kv_types, all_logits)?;
            let plan = crate::cpu_engine::build_plan_with(model, &opts, logits, &mut |_, _| {})?;
            let payload = be.build(plan).map_err(backend_hint)?;
            let opts = LoadOptions {
                n_threads: threads,
                n_ctx,
                flash_attn: args.engine.flash(),
                logits,
                swa_full: args.engine.swa_full,
            };
            let session =
                crate::backend::open_session_seqs(be.as_ref(), &payload, gguf, &opts, n_seq)
                    .map_err(backend_hint)?;
            warn_ctx_train(n_ctx, n_ctx_train);
            Ok(session)
        }
        None => {
            // The interpreter's KV cache: at least K and V in f16 for every layer.
            let h = &model.hparams;
            let kv_bytes = [
                n_ctx as u64,
                u64::from(h.n_head_kv),
                u64::from(h.n_embd_head_k) + u64::from(h.n_embd_head_v),
                2,
            ]
            .iter()
            .fold(u64::from(h.n_layer), |a, &b| a.saturating_mul(b));
            // The interpreter reads the weights from the mapped file.
            crate::memory::check_fits(
                n_ctx,
                crate::memory::Needs {
                    resident: kv_bytes.saturating_mul(n_seq as u64),
                    mapped: gguf.file_size(),
                },
            )?;
            warn_ctx_train(n_ctx, n_ctx_train);
            Session::new(
                Box::new(InterpEngine::new(
                    gguf,
                    model,
                    n_ctx,
                    // llama.cpp's ubatch, as the CPU engine's calls take it (`-ub` sizes
                    // the compiled steps there, not llama.cpp's kernel choices).
                    args.n_ubatch.max(crate::cpu_engine::LLAMA_N_UBATCH),
                    kv_types,
                    interp_options(args, threads),
                )),
                n_seq,
            )
        }
    }
}

/// Warns, as llama.cpp's context creation does, when the context is longer than the one the
/// model was trained with: it runs, but the output past `n_ctx_train` may degrade.
pub fn warn_ctx_train(n_ctx: usize, n_ctx_train: usize) {
    if n_ctx_train > 0 && n_ctx > n_ctx_train {
        eprintln!(
            "{}: warning: the context ({n_ctx}) is longer than the model's training context ({n_ctx_train}); output past it may degrade", crate::cli::prog()
        );
    }
}

/// Runs `modelc run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    args.gen.validate()?;
    args.jinja.notes();
    args.model.validate()?;
    let t0 = std::time::Instant::now();
    // A conversation shows what it is doing while the model compiles (on a terminal only:
    // indicatif draws nothing when stderr is not one).
    let spinner = args.gen.conversation.then(|| {
        let p = indicatif::ProgressBar::new_spinner();
        p.set_message(format!(
            "compiling {} (lowering, passes, kernels, weights)",
            args.model.model.display()
        ));
        p.enable_steady_tick(std::time::Duration::from_millis(80));
        p
    });
    let (gguf, model, vocab) = open_model(&args.model.model, &args.model.engine)?;
    // Speculation verifies drafts in steps with a logit row per token.
    let logits = if args.gen.speculates()? {
        LogitRows::Both
    } else {
        LogitRows::Last
    };
    let mut session = open_session_rows(&args.model, &gguf, &model, logits, 1)?;
    let draft_files = DraftFiles::open(&args.gen, &args.model.engine, &vocab)?;
    let mut draft = match &draft_files {
        Some(f) => Some(f.drafter(&args.model, session.n_ctx(), vocab.n_vocab())?),
        None => None,
    };
    if let Some(p) = spinner {
        p.finish_and_clear();
        let m = session.memory();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        // `-lm none` / `mlock`: the file itself is in the process's memory too.
        let read = match gguf.bytes_in_memory() {
            0 => String::new(),
            b => format!(", model file read into memory {:.1} MiB", mib(b)),
        };
        eprintln!(
            "{}: ready in {:.0} ms: n_ctx {}, weights {:.1} MiB (copies){read}, KV cache {:.1} MiB, work buffers {:.1} MiB", crate::cli::prog(),
            t0.elapsed().as_secs_f64() * 1e3,
            session.n_ctx(),
            mib(m.engine.weights),
            mib(m.kv),
            mib(m.engine.work)
        );
    }
    run_generation(
        &args.gen,
        &gguf,
        &vocab,
        &mut session,
        draft
            .as_mut()
            .map(|d| d as &mut dyn crate::speculative::Drafter),
    )
}

/// The draft model `-md` names, opened and checked against the target's vocabulary; its
/// session ([`DraftFiles::drafter`]) borrows it.
pub struct DraftFiles {
    path: PathBuf,
    gguf: GgufFile,
    model: compiler::Model,
    params: crate::speculative::draft::DraftParams,
}

impl DraftFiles {
    /// The draft model of `gen`'s `-md` (`None` without one), loaded as `engine` says (`-lm`).
    ///
    /// # Errors
    /// A file that cannot be read or lowered, or whose vocabulary cannot draft for `target`
    /// ([`crate::speculative::draft::check_compatible`]): one line naming the file.
    pub fn open(
        gen: &GenArgs,
        engine: &super::compile::EngineArgs,
        target: &Vocab,
    ) -> anyhow::Result<Option<DraftFiles>> {
        let Some((path, params)) = gen.draft_model()? else {
            return Ok(None);
        };
        let (gguf, model, vocab) =
            open_model(path, engine).with_context(|| format!("-md {}", path.display()))?;
        crate::speculative::draft::check_compatible(target, &vocab).map_err(|why| {
            anyhow::anyhow!(
                "-md {}: the draft model cannot draft for this model: {why}",
                path.display()
            )
        })?;
        Ok(Some(DraftFiles {
            path: path.to_path_buf(),
            gguf,
            model,
            params,
        }))
    }

    /// The drafter: the draft model compiled for the CPU with `target`'s flags (threads,
    /// `-ub`, cache types, flash attention) and a context of `n_ctx`, the target's.
    ///
    /// # Errors
    /// A compile or load error of the draft model.
    pub fn drafter(
        &self,
        target: &ModelArgs,
        n_ctx: usize,
        n_vocab_target: usize,
    ) -> anyhow::Result<crate::speculative::draft::DraftModel<'_>> {
        let args = ModelArgs {
            model: self.path.clone(),
            n_ctx,
            backend: match target.backend {
                Backend::Interp => Backend::Interp,
                _ => Backend::Cpu,
            },
            ..target.clone()
        };
        let session = open_session_rows(&args, &self.gguf, &self.model, LogitRows::Last, 1)
            .with_context(|| format!("-md {}", self.path.display()))?;
        Ok(crate::speculative::draft::DraftModel::new(
            session,
            self.params,
            n_vocab_target,
        ))
    }
}

/// Arguments of `modelc perplexity`.
#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score, its chunks and the KL-divergence files.
    #[command(flatten)]
    pub text: PerplexityText,
}

/// What `perplexity` scores and compares (shared by `modelc perplexity` and the runner's).
#[derive(clap::Args, Debug, Clone)]
pub struct PerplexityText {
    /// The text to score (not needed with --kl-divergence: the base file holds the tokens).
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Tokens per decode call.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_batch: usize,
    /// Chunks to score at most (llama-perplexity's `--chunks`; -1: all).
    #[arg(long = "chunks", default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
    /// Save the log-probabilities of every scored token to FILE (llama-perplexity's
    /// format); with --kl-divergence, read them from FILE instead.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare with the --kl-divergence-base file: KL divergence, top-token agreement and
    /// Δp statistics, on the file's tokens and context size.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

impl PerplexityText {
    /// Refuses a `--kl-divergence-base` file to write (without `--kl-divergence`) that is the
    /// model, the `-f` text or this program itself (llama-perplexity would overwrite it).
    ///
    /// # Errors
    /// One line naming the file and what it is.
    pub fn check_output(&self, model: &std::path::Path) -> anyhow::Result<()> {
        let Some(base) = self
            .kl_divergence_base
            .as_ref()
            .filter(|_| !self.kl_divergence)
        else {
            return Ok(());
        };
        let exe = std::env::current_exe().ok();
        let taken = [
            (Some(model), "the model file"),
            (self.file.as_deref(), "the text being scored (-f)"),
            (exe.as_deref(), "this program"),
        ];
        for (path, what) in taken {
            if let Some(p) = path.filter(|p| super::same_file(base, p)) {
                anyhow::bail!(
                    "--kl-divergence-base {}: that is {what} ({}); choose another file",
                    base.display(),
                    p.display()
                );
            }
        }
        Ok(())
    }

    /// The context the session needs: the base file's with --kl-divergence, else `n_ctx`.
    ///
    /// # Errors
    /// A base file that cannot be read.
    pub fn n_ctx(&self, n_ctx: usize) -> anyhow::Result<usize> {
        match (&self.kl_divergence_base, self.kl_divergence) {
            (Some(base), true) => Ok(crate::kl_divergence::BaseReader::open(base)?.header.n_ctx),
            _ => Ok(n_ctx),
        }
    }
}

/// Runs perplexity (or, with --kl-divergence, the comparison with a base) on `engine` and
/// prints llama-perplexity's lines.
pub fn print_perplexity(
    engine: &mut Session<'_>,
    vocab: &Vocab,
    text: &PerplexityText,
    n_ctx: usize,
) -> anyhow::Result<()> {
    use std::io::Write;
    let chunks = text.chunks;
    anyhow::ensure!(chunks != 0, "--chunks must be at least 1 (-1: all)");
    let bos = if vocab.add_bos() { vocab.bos() } else { None };
    if let (Some(base), true) = (&text.kl_divergence_base, text.kl_divergence) {
        let mut reader = crate::kl_divergence::BaseReader::open(base)?;
        let h = &reader.header;
        eprintln!(
            "kl_divergence: computing over {} chunks, n_ctx={}, batch_size={}",
            h.n_chunk, h.n_ctx, text.n_batch
        );
        println!("{}", crate::kl_divergence::Kld::CHUNK_HEADER);
        let kld =
            crate::kl_divergence::kl_divergence(engine, &mut reader, text.n_batch, bos, |i, k| {
                println!("{}", k.chunk_line(i + 1));
                let _ = std::io::stdout().flush();
            })?;
        println!();
        if let Some(s) = kld.summary() {
            print!("{s}");
        }
        return Ok(());
    }
    let max_chunks = usize::try_from(chunks).ok();
    let Some(text_path) = &text.file else {
        anyhow::bail!("no text to score: pass -f FILE");
    };
    // Bytes, not text: llama-perplexity tokenizes the file's bytes whatever they are.
    let text_bytes =
        std::fs::read(text_path).with_context(|| format!("reading {}", text_path.display()))?;
    let tokens = vocab.tokenize_bytes(&text_bytes, true, false);
    let n_chunks = (tokens.len() / n_ctx.max(1)).min(max_chunks.unwrap_or(usize::MAX));
    eprintln!(
        "perplexity: tokenizing the input: {} tokens, {n_chunks} chunks of {n_ctx}",
        tokens.len(),
    );
    let mut writer = match &text.kl_divergence_base {
        Some(path) if n_ctx >= 8 && tokens.len() >= 2 * n_ctx => {
            eprintln!("perplexity: saving all logits to {}", path.display());
            let header = crate::kl_divergence::BaseHeader {
                n_ctx,
                n_vocab: engine.n_vocab(),
                n_chunk: n_chunks,
                tokens: tokens[..n_chunks * n_ctx].to_vec(),
            };
            Some(crate::kl_divergence::BaseWriter::create(path, &header)?)
        }
        _ => None,
    };
    let r = crate::perplexity::perplexity_with(
        engine,
        &tokens,
        n_ctx,
        text.n_batch,
        max_chunks,
        bos,
        |i, _, est| {
            print!("[{i}]{est:.4},");
            let _ = std::io::stdout().flush();
        },
        |logits, tok| match writer.as_mut() {
            Some(w) => w.push(logits, tok).map(|_| ()),
            None => Ok(()),
        },
    )?;
    println!();
    if let Some(w) = writer {
        w.finish()?;
    }
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_err);
    Ok(())
}

/// Runs `modelc perplexity`: the context is `-c` (default 512, as llama-perplexity; 0: the
/// model's training context; from 1 to 7: 8, with llama-completion's warning), or the base
/// file's with --kl-divergence.
pub fn perplexity(mut args: PerplexityArgs) -> anyhow::Result<()> {
    check_n_batch(args.text.n_batch)?;
    args.model.validate()?;
    anyhow::ensure!(
        args.text.chunks != 0,
        "--chunks must be at least 1 (-1: all)"
    );
    args.text.check_output(&args.model.model)?;
    if args.model.n_ctx != 0 {
        args.model.n_ctx = at_least_min_ctx(args.model.n_ctx);
    }
    let (gguf, model, vocab) = open_model(&args.model.model, &args.model.engine)?;
    if args.model.n_ctx == 0 {
        args.model.n_ctx = (model.hparams.n_ctx_train as usize).max(MIN_CTX);
    }
    args.model.n_ctx = args.text.n_ctx(args.model.n_ctx)?;
    let mut session = open_session(&args.model, &gguf, &model, true)?;
    print_perplexity(&mut session, &vocab, &args.text, args.model.n_ctx)
}

/// Arguments of `modelc graph`.
#[derive(clap::Args, Debug)]
pub struct GraphArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// Tokens in the ubatch the graph is built for.
    #[arg(long = "ubatch", default_value_t = 1)]
    pub n_tokens: u32,
    /// KV cache size the graph is built for.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub n_ctx: u32,
}

/// Runs `modelc graph`: prints the lowered graph, one line per tensor.
pub fn graph(args: GraphArgs) -> anyhow::Result<()> {
    let gguf = GgufFile::open(&args.model)?;
    let model = compiler::load_model(&gguf).with_context(|| format!("{}", args.model.display()))?;
    anyhow::ensure!(args.n_tokens > 0, "--ubatch must be at least 1");
    let g = model.build_graph(&ir::interp::GraphRequest {
        n_tokens: args.n_tokens,
        n_outputs: args.n_tokens,
        n_ctx: args.n_ctx,
        kv_types: ir::graph::KvTypes::F16,
    })?;
    print!("{g}");
    Ok(())
}
