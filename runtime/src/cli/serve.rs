//! `modelc serve MODEL.gguf [flags]` and the runner's `./NAME serve [flags]`: llama-server's
//! API over HTTP ([`crate::server`]), the model compiled in memory (or the runner's
//! program), `-np N` slots of `-c / N` positions each as llama-server splits its context.

use super::gen_args::{GenArgs, SEED_RANDOM};
use super::run::{open_model, open_session_seqs, resolve_n_ctx, ModelArgs};
use crate::generate::GenerateOptions;
use crate::server::{Config, Loaded, Loader, Ready, ServerArgs};
use crate::session::Session;
use crate::tokenizer::Vocab;
use ir::gguf::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// Arguments of `modelc serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampler defaults (`--temp`, `-n`, `--stop`, ...) and the chat template.
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The server's settings from the generation and server flags: requests' fields override
/// the generation flags.
///
/// # Errors
/// A bad flag value ([`GenArgs::validate`], [`ServerArgs::validate`]).
pub fn config(gen: &GenArgs, server: &ServerArgs) -> anyhow::Result<Config> {
    gen.validate()?;
    anyhow::ensure!(
        gen.speculative()?.is_none(),
        "--spec-type: the server does not speculate yet (modelc run, the runner and the REPL do)"
    );
    anyhow::ensure!(
        gen.model_draft.is_none(),
        "-md: the server does not use a draft model yet (modelc run and the runner do)"
    );
    server.validate()?;
    server.notes();
    let defaults = GenerateOptions {
        n_predict: gen.n_predict.max(-1),
        sampler: gen.sampler(),
        n_probs: gen.n_probs,
        ignore_eos: gen.ignore_eos,
        n_batch: gen.n_batch,
        stop: gen.stops(),
        cache_prompt: server.compat.cache_prompt(),
        ..GenerateOptions::default()
    };
    let seed = gen.seed.filter(|&s| s != SEED_RANDOM);
    let mut cfg = Config::new(server, defaults, seed);
    cfg.grammar = gen.grammar_text()?.filter(|g| !g.is_empty());
    Ok(cfg)
}

/// The context of each of `n_parallel` slots in a total context of `n_ctx`, as llama-server
/// splits it (`n_ctx / n_parallel`; all of it with a unified cache, `--kv-unified`).
///
/// # Errors
/// A split below 8 positions a slot.
pub fn slot_ctx(n_ctx: usize, n_parallel: usize, unified: bool) -> anyhow::Result<usize> {
    if unified {
        return Ok(n_ctx);
    }
    let per = n_ctx / n_parallel.max(1);
    anyhow::ensure!(
        per >= super::run::MIN_CTX,
        "-c {n_ctx} split over -np {n_parallel} slots leaves {per} positions each; give at least {} per slot",
        super::run::MIN_CTX
    );
    Ok(per)
}

/// What the HTTP side needs of a loaded model.
///
/// # Errors
/// A chat template that cannot be read (the model's own failing to compile only leaves
/// the chat endpoints answering 501).
pub fn ready_info(
    gguf: &GgufFile,
    vocab: Arc<Vocab>,
    gen: &GenArgs,
    server: &ServerArgs,
    path: &Path,
    n_ctx_slot: usize,
) -> anyhow::Result<Ready> {
    let template = match gen.template(gguf) {
        Ok(t) => Some(t),
        Err(e) if gen.chat_template.is_some() || gen.chat_template_file.is_some() => return Err(e),
        Err(e) => {
            eprintln!(
                "{}: warning: no chat template ({e:#}); chat requests will get 501",
                crate::cli::prog()
            );
            None
        }
    };
    let template_source = match &gen.chat_template_file {
        Some(p) => std::fs::read_to_string(p).unwrap_or_default(),
        None => gguf
            .metadata()
            .get_str("tokenizer.chat_template")
            .ok()
            .flatten()
            .unwrap_or_default()
            .to_string(),
    };
    let hp = compiler::HParams::from_gguf(gguf)?;
    let list = |s: &Option<String>| -> Vec<String> {
        s.as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut aliases = list(&server.alias);
    if aliases.is_empty() {
        aliases.push(path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ));
    }
    let model_name = aliases.iter().min().cloned().unwrap_or_default();
    Ok(Ready {
        vocab,
        template,
        template_source,
        model_name,
        aliases,
        tags: list(&server.tags),
        template_kwargs: server.compat.template_kwargs()?,
        model_path: path.display().to_string(),
        model_ftype: gguf
            .metadata()
            .get_u32("general.file_type")?
            .map_or("unknown, may not work", super::inspect::file_type_name)
            .to_string(),
        n_ctx_slot,
        n_ctx_train: hp.n_ctx_train as usize,
        n_embd: hp.n_embd as usize,
        n_params: gguf.tensors().iter().map(|t| t.n_elements()).sum(),
        size: gguf.tensor_data_bytes(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        // llama-server's build info is `b<build>-<commit>`; clients read it as opaque.
        fingerprint: format!("b0-modelc-{}", env!("CARGO_PKG_VERSION")),
    })
}

/// Hands a loaded session to the server; with `--kv-unified` its slots share one pool of
/// `n_ctx` cells.
pub fn hand_over(
    run: &mut dyn FnMut(Loaded<'_>),
    mut session: Session<'_>,
    ready: Ready,
    server: &ServerArgs,
) -> anyhow::Result<()> {
    if server.kv_unified {
        session.set_kv_pool(Some(session.n_ctx()));
    }
    run(Loaded { session, ready });
    Ok(())
}

/// Runs `modelc serve`.
pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    args.model.validate()?;
    if args.server.embed.reranking {
        // llama-server's `--reranking`: embeddings with rank pooling.
        anyhow::ensure!(
            matches!(
                args.server.embed.pooling,
                None | Some(crate::embed::Pooling::Rank)
            ),
            "--reranking: the pooling is rank"
        );
        args.server.embed.embedding = true;
        args.server.embed.pooling = Some(crate::embed::Pooling::Rank);
    }
    anyhow::ensure!(
        !args.server.embed.embedding || args.model.backend == super::run::Backend::Cpu,
        "--embedding: embeddings run on the CPU backend only"
    );
    if let Some(p) = args.server.embed.pooling {
        anyhow::ensure!(
            args.server.embed.embedding,
            "--pooling {}: embeddings are served with --embedding",
            p.name()
        );
    }
    let cfg = config(&args.gen, &args.server)?;
    let n_parallel = cfg.args.parallel;
    let embed = args.server.embed.embedding.then(|| embed_loader(&args));
    let load: Loader = Box::new(move |run| {
        let (gguf, model, vocab) = open_model(&args.model.model, &args.model.engine)?;
        let n_ctx = resolve_n_ctx(args.model.n_ctx, model.hparams.n_ctx_train as usize);
        let per_slot = slot_ctx(n_ctx, n_parallel, args.server.kv_unified)?;
        let mut margs = args.model.clone();
        margs.n_ctx = per_slot;
        let session = open_session_seqs(&margs, &gguf, &model, false, n_parallel)?;
        let ready = ready_info(
            &gguf,
            Arc::new(vocab),
            &args.gen,
            &args.server,
            &args.model.model,
            per_slot,
        )?;
        hand_over(run, session, ready, &args.server)
    });
    crate::server::serve_with_embeddings(cfg, load, embed)
}

/// `--embedding`: the model compiled a second time, to output its hidden state, for the
/// embeddings thread (one sequence of a slot's context, evaluated alone per input; inputs
/// longer than `-ub` only with `last` pooling, as llama-server).
fn embed_loader(args: &ServeArgs) -> crate::server::api::embeddings::EmbedLoader {
    let mut margs = args.model.clone();
    let pooling = args.server.embed.pooling;
    let (parallel, unified) = (args.server.parallel, args.server.kv_unified);
    Box::new(move |run| {
        let (gguf, model, _) = open_model(&margs.model, &margs.engine)?;
        // A slot's context, as llama-server gives each input.
        let n_ctx = resolve_n_ctx(margs.n_ctx, model.hparams.n_ctx_train as usize);
        margs.n_ctx = slot_ctx(n_ctx, parallel, unified)?;
        let pooling = crate::embed::Pooling::resolve(pooling, &gguf)?;
        let model = model.with_output(compiler::GraphOutput::Embeddings);
        let session = super::run::open_session_rows(
            &margs,
            &gguf,
            &model,
            crate::cpu_engine::LogitRows::All,
            1,
        )?;
        let mut embedder = crate::embed::Embedder::open(session, pooling, &gguf)?;
        // modelc's `-ub` sizes the compiled steps (64 by default); llama.cpp's physical
        // batch is 512 unless larger.
        embedder.set_n_ubatch(margs.n_ubatch.max(crate::cpu_engine::LLAMA_N_UBATCH));
        run(embedder);
        Ok(())
    })
}
