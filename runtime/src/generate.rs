//! Text generation over any [`Engine`]: prompt processing in ubatches, the sampler chain,
//! end-of-generation handling, streaming text, teacher forcing and log-probabilities, with
//! llama-server's result fields (`tools/server/server.cpp`: `content`, `tokens`,
//! `stop_type`, `timings`, `probs`).

use crate::engine::Engine;
use crate::sampler::{Sampler, SamplerParams};
use crate::tokenizer::{StreamDecoder, TokenId, Vocab};
use serde::Serialize;
use std::time::Instant;

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Tokens to generate at most (`-n`); negative means until end of generation or a full context.
    pub n_predict: i64,
    /// The sampler chain's settings.
    pub sampler: SamplerParams,
    /// Report the top `n_probs` log-probabilities at every generated position (`--n-probs`).
    pub n_probs: usize,
    /// Emit these ids instead of sampling (`--forced-tokens`), still reporting probabilities.
    pub forced: Option<Vec<TokenId>>,
    /// Keep generating past end-of-generation tokens (`--ignore-eos`).
    pub ignore_eos: bool,
    /// Most prompt tokens per decode call (`-b`; also bounded by the engine's ubatch).
    pub n_batch: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            n_predict: -1,
            sampler: SamplerParams::default(),
            n_probs: 0,
            forced: None,
            ignore_eos: false,
            n_batch: 2048,
        }
    }
}

/// One candidate token with its log-probability.
#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprob {
    /// Token id.
    pub id: TokenId,
    /// Its text (lossy UTF-8 of the piece).
    pub token: String,
    /// Natural-log probability under the softmax of the raw logits.
    pub logprob: f32,
}

/// The probabilities at one generated position (llama-server's `probs` entry).
#[derive(Clone, Debug, Serialize)]
pub struct PositionProbs {
    /// The emitted token.
    pub id: TokenId,
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The `n_probs` most likely tokens, most likely first (ties by lower id).
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Timings in llama-server's field names; milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_second: f64,
}

/// A finished generation.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    /// Generated text (end-of-generation tokens are not rendered).
    pub content: String,
    /// Generated ids, including a final end-of-generation token.
    pub tokens: Vec<TokenId>,
    /// The ids evaluated as the prompt.
    pub prompt_tokens: Vec<TokenId>,
    /// Why generation stopped: `eos`, `limit` (n_predict or forced tokens exhausted) or
    /// `context` (the KV cache is full).
    pub stop_type: &'static str,
    /// Timings.
    pub timings: Timings,
    /// Per-position probabilities when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probs: Option<Vec<PositionProbs>>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// The top `n` log-probabilities of `logits` (softmax over the raw logits, accumulated in f64).
pub fn top_logprobs(vocab: &Vocab, logits: &[f32], n: usize) -> Vec<TokenLogprob> {
    let log_z = log_sum_exp(logits);
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let n = n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by);
    }
    idx.truncate(n);
    idx.sort_by(by);
    idx.into_iter()
        .map(|id| TokenLogprob {
            id,
            token: piece_text(vocab, id),
            logprob: (f64::from(logits[id as usize]) - log_z) as f32,
        })
        .collect()
}

fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(max) + sum.ln()
}

fn piece_text(vocab: &Vocab, id: TokenId) -> String {
    String::from_utf8_lossy(vocab.token_to_piece(id, false)).into_owned()
}

/// Evaluates `prompt` and generates a continuation, calling `on_text` with each complete
/// piece of text as soon as it is known.
///
/// Errors: an empty prompt, a prompt that does not fit the context, or an engine error.
pub fn generate(
    engine: &mut dyn Engine,
    vocab: &Vocab,
    prompt: &[TokenId],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str),
) -> anyhow::Result<Completion> {
    anyhow::ensure!(
        !prompt.is_empty(),
        "the prompt is empty (no tokens to evaluate)"
    );
    let n_ctx = engine.n_ctx();
    anyhow::ensure!(
        prompt.len() < n_ctx,
        "the prompt has {} tokens but the context holds {n_ctx} (use -c to enlarge it)",
        prompt.len()
    );
    let mut sampler = Sampler::new(opts.sampler.clone(), n_ctx);
    for &t in prompt {
        sampler.accept(t);
    }
    engine.clear();
    let t_prompt = Instant::now();
    let chunk = opts.n_batch.min(engine.max_ubatch()).max(1);
    let mut logits = Vec::new();
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let out = engine.decode(part, i * chunk, false)?;
        logits.clear();
        logits.extend_from_slice(out);
    }
    let prompt_ms = ms(t_prompt);

    let t_gen = Instant::now();
    let mut decoder = StreamDecoder::new(false);
    let mut content = String::new();
    let mut tokens = Vec::new();
    let mut probs = (opts.n_probs > 0 || opts.forced.is_some()).then(Vec::new);
    let mut pos = prompt.len();
    let limit = if opts.n_predict < 0 {
        usize::MAX
    } else {
        opts.n_predict as usize
    };
    let mut stop_type = "limit";
    while tokens.len() < limit {
        let token = match &opts.forced {
            Some(forced) => match forced.get(tokens.len()) {
                Some(&t) => {
                    anyhow::ensure!(
                        (t as usize) < engine.n_vocab(),
                        "forced token {t} is outside the vocabulary (n_vocab = {})",
                        engine.n_vocab()
                    );
                    t
                }
                None => break,
            },
            None => sampler.sample(&logits),
        };
        if let Some(p) = probs.as_mut() {
            let top = top_logprobs(vocab, &logits, opts.n_probs);
            p.push(PositionProbs {
                id: token,
                token: piece_text(vocab, token),
                logprob: (f64::from(logits[token as usize]) - log_sum_exp(&logits)) as f32,
                top_logprobs: top,
            });
        }
        sampler.accept(token);
        tokens.push(token);
        if vocab.is_eog(token) && !opts.ignore_eos {
            stop_type = "eos";
            break;
        }
        let text = decoder.push(vocab, token);
        if !text.is_empty() {
            on_text(&text);
            content.push_str(&text);
        }
        if tokens.len() >= limit
            || opts
                .forced
                .as_ref()
                .is_some_and(|f| tokens.len() >= f.len())
        {
            break;
        }
        if pos + 1 > n_ctx {
            stop_type = "context";
            break;
        }
        let out = engine.decode(&[token], pos, false)?;
        logits.clear();
        logits.extend_from_slice(out);
        pos += 1;
    }
    let rest = decoder.flush();
    if !rest.is_empty() {
        on_text(&rest);
        content.push_str(&rest);
    }
    let predicted_ms = ms(t_gen);
    Ok(Completion {
        content,
        prompt_tokens: prompt.to_vec(),
        stop_type,
        timings: Timings {
            prompt_n: prompt.len(),
            prompt_ms,
            prompt_per_second: per_second(prompt.len(), prompt_ms),
            predicted_n: tokens.len(),
            predicted_ms,
            predicted_per_second: per_second(tokens.len(), predicted_ms),
        },
        tokens,
        probs,
    })
}
