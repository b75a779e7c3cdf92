//! Text generation over a [`Session`] as a state machine ([`Generation`]): the prompt is
//! evaluated as the continuation of what the sequence already holds (the longest common
//! prefix is kept, as llama.cpp's prompt cache does), then each [`Generation::step`] samples
//! one token, checks the stop conditions (end-of-generation tokens, `-n`, stop strings, a
//! full context, a cancel flag set from another thread) and returns the text that became
//! final. Teacher forcing and log-probabilities are part of it; results use llama-server's
//! field names (`tools/server/server.cpp`: `content`, `tokens`, `stop_type`, `timings`,
//! `probs`).
//!
//! The per-request state lives in [`Decoding`], which does not borrow the session: it is fed
//! each position's logits and answers with the next token to evaluate or a stop. A
//! [`Generation`] drives one over a session it borrows (`modelc run`, the runner, the REPL);
//! the server ([`crate::server::slots`]) drives one per slot, evaluating all slots' tokens in
//! one batch.

use crate::grammar::Constraint;
use crate::kv_cache::SeqId;
use crate::sampler::{Sampler, SamplerParams};
use crate::session::Session;
use crate::tokenizer::{StreamDecoder, TokenId, Vocab};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    /// Report the probabilities after the sampler chain instead of the softmax of the raw
    /// logits (llama-server's `post_sampling_probs`; the `logprob` fields then hold their
    /// logarithms).
    pub post_sampling_probs: bool,
    /// Emit these ids instead of sampling (`--forced-tokens`), still reporting probabilities.
    pub forced: Option<Vec<TokenId>>,
    /// Keep generating past end-of-generation tokens (`--ignore-eos`).
    pub ignore_eos: bool,
    /// Added to these tokens' logits before sampling (llama.cpp's `logit_bias`; `-inf`
    /// bans a token).
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Most prompt tokens per decode call (`-b`; also bounded by the engine's ubatch).
    pub n_batch: usize,
    /// Stop when the text contains one of these (llama-server's `stop`); the text is cut
    /// before it, and text that may begin one is held back until it is decided.
    pub stop: Vec<String>,
    /// Keep the part of the prompt the sequence already holds instead of evaluating it
    /// again (llama-server's `cache_prompt`).
    pub cache_prompt: bool,
    /// Set from another thread (Ctrl-C, a client that went away) to stop between tokens.
    pub cancel: Option<Arc<AtomicBool>>,
    /// When the context is full, keep the first `n` positions and drop the oldest half of
    /// the rest instead of stopping (llama.cpp's context shift: `--context-shift`, `--keep`);
    /// `None` stops with `context`.
    pub context_shift: Option<usize>,
    /// Constrain the generated text to this grammar (`--grammar`, `--json-schema`,
    /// llama-server's `grammar` / `json_schema` / `response_format`; [`crate::grammar`]).
    pub grammar: Option<Arc<crate::grammar::Rules>>,
    /// Makes [`GenerateOptions::grammar`] lazy: it holds only from where one of these
    /// triggers appears in the output (llama.cpp's `grammar_lazy` / `grammar_triggers`;
    /// [`crate::grammar::lazy`]). `None`: the grammar holds from the first token.
    pub grammar_triggers: Option<Arc<crate::grammar::Triggers>>,
    /// Close the model's thought after this many tokens (`--reasoning-budget`;
    /// [`crate::reasoning_budget`]); `None`: unlimited.
    pub reasoning_budget: Option<crate::reasoning_budget::ReasoningBudget>,
    /// DRY's sequence breakers processed against the vocabulary (needed when
    /// `sampler.dry_on()`; without them DRY is off).
    pub dry_breakers: Option<Arc<crate::sampler::dry::DryBreakers>>,
    /// Draftless speculation (`--spec-type ngram-simple`): drafts from the sequence's own
    /// tokens verified in one step ([`crate::speculative`]); `None` decodes one token per
    /// step. The session's engine needs steps with a logit row per token. The output is
    /// the same either way.
    pub speculative: Option<crate::speculative::NgramParams>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            n_predict: -1,
            sampler: SamplerParams::default(),
            n_probs: 0,
            post_sampling_probs: false,
            forced: None,
            logit_bias: Vec::new(),
            ignore_eos: false,
            n_batch: 2048,
            stop: Vec::new(),
            cache_prompt: true,
            cancel: None,
            context_shift: None,
            grammar: None,
            grammar_triggers: None,
            reasoning_budget: None,
            dry_breakers: None,
            speculative: None,
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
    /// Prompt tokens reused from the sequence's cache (not evaluated).
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_second: f64,
    /// Draft tokens proposed for verification (llama-server's `draft_n`; absent when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub draft_n: usize,
    /// Draft tokens the target accepted (llama-server's `draft_n_accepted`; absent when
    /// no draft was proposed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<usize>,
}

impl Timings {
    /// llama-server's end-of-request line for speculation: `draft acceptance = R (A
    /// accepted / N generated)`, or `None` when nothing was drafted.
    pub fn draft_line(&self) -> Option<String> {
        let accepted = self.draft_n_accepted?;
        (self.draft_n > 0).then(|| {
            format!(
                "draft acceptance = {:.5} ({accepted:5} accepted / {:5} generated)",
                accepted as f64 / self.draft_n as f64,
                self.draft_n
            )
        })
    }
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
    /// Why generation stopped: `eos`, `limit` (n_predict or forced tokens exhausted),
    /// `word` (a stop string), `context` (the KV cache is full) or `cancelled`.
    pub stop_type: &'static str,
    /// The stop string that ended it (`word`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopping_word: Option<String>,
    /// Positions dropped by context shifts while generating.
    #[serde(skip_serializing_if = "is_zero")]
    pub n_discarded: usize,
    /// Timings.
    pub timings: Timings,
    /// Per-position probabilities when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probs: Option<Vec<PositionProbs>>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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
    top_logprobs_with(vocab, logits, n, log_sum_exp(logits))
}

/// [`top_logprobs`] with the log of the softmax's normalizer already computed.
fn top_logprobs_with(vocab: &Vocab, logits: &[f32], n: usize, log_z: f64) -> Vec<TokenLogprob> {
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

/// What happened to one token fed to a [`Decoding`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Generation goes on: this token must be evaluated next (its logits feed the next call).
    Continue(TokenId),
    /// Generation stopped ([`Decoding::stop_type`] says why); the token, if one was chosen,
    /// is in [`Decoding::tokens`] and is not evaluated.
    Stopped,
}

/// The per-request state of a generation, apart from the session: sampler, streaming
/// detokenizer, stop strings, probabilities, limits, cancel flag and timings. It is fed the
/// logits of each position ([`Decoding::feed`]) and answers with the next token to evaluate
/// or a stop; whoever owns the session evaluates the tokens. [`Generation`] drives one over
/// a session it borrows; the server drives one per slot, all slots' tokens in one batch.
pub struct Decoding {
    opts: GenerateOptions,
    sampler: Sampler,
    /// The grammar's state, when generation is constrained.
    grammar: Option<Constraint>,
    /// The reasoning budget's state, when there is one.
    budget: Option<crate::reasoning_budget::BudgetState>,
    decoder: StreamDecoder,
    tokens: Vec<TokenId>,
    prompt: Vec<TokenId>,
    /// The generated text so far (cut before a stop string once one is found).
    content: String,
    /// Bytes of `content` already returned.
    emitted: usize,
    /// An unfinished UTF-8 sequence the generated tokens ended in: its length as U+FFFD at
    /// the end of `content`, and its bytes (what plain output writes, as llama.cpp does).
    raw_tail: Option<(usize, Vec<u8>)>,
    probs: Option<Vec<PositionProbs>>,
    limit: usize,
    stop_type: Option<&'static str>,
    stopping_word: Option<String>,
    n_discarded: usize,
    timings: Timings,
    t_gen: Instant,
}

impl Decoding {
    /// The state for generating after `prompt` (non-empty) in a context of `n_ctx`
    /// positions: the sampler has seen the prompt's tokens (its penalties count them).
    pub fn new(prompt: &[TokenId], n_ctx: usize, opts: &GenerateOptions) -> Decoding {
        let mut sampler = Sampler::new(opts.sampler.clone(), n_ctx, opts.dry_breakers.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        Decoding {
            sampler,
            grammar: opts
                .grammar
                .clone()
                .map(|g| Constraint::new(g, opts.grammar_triggers.clone())),
            budget: opts
                .reasoning_budget
                .clone()
                .map(crate::reasoning_budget::BudgetState::new),
            decoder: StreamDecoder::new(false),
            tokens: Vec::new(),
            prompt: prompt.to_vec(),
            content: String::new(),
            emitted: 0,
            raw_tail: None,
            probs: (opts.n_probs > 0 || opts.forced.is_some()).then(Vec::new),
            limit: if opts.n_predict < 0 {
                usize::MAX
            } else {
                opts.n_predict as usize
            },
            stop_type: (opts.n_predict == 0).then_some("limit"),
            stopping_word: None,
            n_discarded: 0,
            timings: Timings::default(),
            t_gen: Instant::now(),
            opts: opts.clone(),
        }
    }

    /// Records that the prompt is evaluated: `cache_n` of its tokens were reused from the
    /// cache, the rest took `prompt_ms` milliseconds; generation time counts from now.
    pub fn prompt_done(&mut self, cache_n: usize, prompt_ms: f64) {
        let evaluated = self.prompt.len().saturating_sub(cache_n);
        self.timings = Timings {
            cache_n,
            prompt_n: evaluated,
            prompt_ms,
            prompt_per_second: per_second(evaluated, prompt_ms),
            ..Timings::default()
        };
        self.t_gen = Instant::now();
    }

    /// The options it runs with.
    pub fn options(&self) -> &GenerateOptions {
        &self.opts
    }

    /// The prompt's tokens.
    pub fn prompt(&self) -> &[TokenId] {
        &self.prompt
    }

    /// Whether generation has stopped.
    pub fn is_done(&self) -> bool {
        self.stop_type.is_some()
    }

    /// Why generation stopped (`eos`, `limit`, `word`, `context`, `cancelled`), once it has.
    pub fn stop_type(&self) -> Option<&'static str> {
        self.stop_type
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// The probabilities of the positions generated so far, when asked for.
    pub fn probs(&self) -> &[PositionProbs] {
        self.probs.as_deref().unwrap_or(&[])
    }

    /// Stops generation for `why` (`context`, `cancelled`, ...) unless it has stopped.
    pub fn stop(&mut self, why: &'static str) {
        self.stop_type.get_or_insert(why);
    }

    /// Whether the cancel flag is set.
    pub fn is_cancelled(&self) -> bool {
        is_cancelled(&self.opts.cancel)
    }

    /// Chooses the token after the position whose `logits` are given (sampled, or the next
    /// forced one), records it and its probabilities, and checks the stop conditions
    /// (cancel flag, end of generation, stop strings, `n_predict`, forced tokens exhausted).
    /// The caller checks the context before evaluating the token.
    ///
    /// # Errors
    /// A forced token outside the vocabulary.
    pub fn feed(&mut self, vocab: &Vocab, logits: &[f32]) -> anyhow::Result<Fed> {
        if self.stop_type.is_some() {
            return Ok(Fed::Stopped);
        }
        if self.is_cancelled() {
            self.stop_type = Some("cancelled");
            return Ok(Fed::Stopped);
        }
        // The probabilities reported without `post_sampling_probs` are the model's, before
        // the bias (llama-server's `get_token_probabilities` reads the raw logits).
        let raw = logits;
        let biased;
        let logits = if self.opts.logit_bias.is_empty() {
            logits
        } else {
            let mut b = logits.to_vec();
            for &(id, bias) in &self.opts.logit_bias {
                if let Some(l) = b.get_mut(id as usize) {
                    *l += bias;
                }
            }
            biased = b;
            &biased[..]
        };
        let n_vocab = logits.len();
        let token = match &self.opts.forced {
            Some(forced) => match forced.get(self.tokens.len()) {
                Some(&t) => {
                    anyhow::ensure!(
                        (t as usize) < n_vocab,
                        "forced token {t} is outside the vocabulary (n_vocab = {n_vocab})"
                    );
                    t
                }
                None => {
                    self.stop_type = Some("limit");
                    return Ok(Fed::Stopped);
                }
            },
            None => match self.budget.as_ref().and_then(|b| b.forced()) {
                Some(t) if (t as usize) < n_vocab => t,
                _ => self.sample(logits),
            },
        };
        if let Some(b) = self.budget.as_mut() {
            b.accept(&String::from_utf8_lossy(vocab.token_to_piece(token, true)));
        }
        if let Some(p) = self.probs.as_mut() {
            let entry = if self.opts.post_sampling_probs && self.opts.forced.is_none() {
                let post = self.sampler.post_sampling_probs(usize::MAX);
                let prob = post.iter().find(|c| c.0 == token).map_or(0.0, |c| c.1);
                PositionProbs {
                    id: token,
                    token: piece_text(vocab, token),
                    logprob: prob.ln(),
                    top_logprobs: post
                        .into_iter()
                        .take(self.opts.n_probs)
                        .filter(|c| c.1 > 0.0)
                        .map(|(id, q)| TokenLogprob {
                            id,
                            token: piece_text(vocab, id),
                            logprob: q.ln(),
                        })
                        .collect(),
                }
            } else {
                // One pass over the vocabulary for the normalizer, shared by both.
                let log_z = log_sum_exp(raw);
                PositionProbs {
                    id: token,
                    token: piece_text(vocab, token),
                    logprob: (f64::from(raw[token as usize]) - log_z) as f32,
                    top_logprobs: top_logprobs_with(vocab, raw, self.opts.n_probs, log_z),
                }
            };
            p.push(entry);
        }
        if self.opts.forced.is_none() {
            if let Some(g) = self.grammar.as_mut() {
                if let Err(e) = g.accept(token, vocab.token_to_piece(token, true)) {
                    anyhow::bail!("grammar: {e}");
                }
            }
        }
        self.sampler.accept(token);
        self.tokens.push(token);
        // An end-of-generation token's text is kept, as llama-server's `process_token` and
        // llama-cli keep it (empty for a control token; a user-defined one, e.g. a FIM file
        // separator, has text).
        let text = self.decoder.push(vocab, token);
        self.content.push_str(&text);
        if self.find_stop(text.len()) {
            return Ok(Fed::Stopped);
        }
        if vocab.is_eog(token) && !self.opts.ignore_eos {
            self.stop_type = Some("eos");
            return Ok(Fed::Stopped);
        }
        let forced_done = self
            .opts
            .forced
            .as_ref()
            .is_some_and(|f| self.tokens.len() >= f.len());
        if self.tokens.len() >= self.limit || forced_done {
            self.stop_type = Some("limit");
            return Ok(Fed::Stopped);
        }
        Ok(Fed::Continue(token))
    }

    /// llama.cpp's `common_sampler_sample` (`common/sampling.cpp`, `grammar_first = false`):
    /// the chain samples from the logits as they are; when a grammar rejects that token, the
    /// chain samples again (a second draw) from the logits with every rejected token at
    /// `-inf`.
    fn sample(&mut self, logits: &[f32]) -> TokenId {
        let token = self.sampler.sample(logits);
        let Some(g) = self.grammar.as_mut() else {
            return token;
        };
        if g.allows(token) {
            return token;
        }
        let mut masked = logits.to_vec();
        g.apply(&mut masked);
        self.sampler.sample(&masked)
    }

    /// The text that became final since the last call: while generating, what can no longer
    /// become part of a stop string (possibly empty); once stopped, the rest of the text
    /// (an incomplete UTF-8 tail as U+FFFD unless a stop string cut the text) once, then
    /// `None`.
    pub fn take_text(&mut self) -> Option<String> {
        if self.stop_type.is_some() {
            self.flush()
        } else {
            Some(self.take_final())
        }
    }

    /// After the last piece of text: the raw bytes of an unfinished UTF-8 sequence at its
    /// end, with the length of the U+FFFD that stands for them in the text (once).
    pub fn take_raw_tail(&mut self) -> Option<(usize, Vec<u8>)> {
        self.raw_tail.take()
    }

    /// Records a verified draft of `n` tokens of which the first `accepted` were kept.
    pub fn add_draft(&mut self, n: usize, accepted: usize) {
        self.timings.draft_n += n;
        *self.timings.draft_n_accepted.get_or_insert(0) += accepted;
    }

    /// Records `n` positions dropped by a context shift.
    pub fn add_discarded(&mut self, n: usize) {
        self.n_discarded += n;
    }

    /// Looks for a stop string in the text, where it could end in the last `added` bytes;
    /// cuts the content before it and stops.
    fn find_stop(&mut self, added: usize) -> bool {
        let longest = self.opts.stop.iter().map(String::len).max().unwrap_or(0);
        if longest == 0 {
            return false;
        }
        let from = self.content.len().saturating_sub(added + longest);
        let from = (0..=from)
            .rev()
            .find(|&i| self.content.is_char_boundary(i))
            .unwrap_or(0);
        let hit = self
            .opts
            .stop
            .iter()
            .filter(|w| !w.is_empty())
            .filter_map(|w| self.content[from..].find(w.as_str()).map(|i| (from + i, w)))
            .min_by_key(|&(i, _)| i);
        match hit {
            Some((i, w)) => {
                self.content.truncate(i.max(self.emitted));
                self.stopping_word = Some(w.clone());
                self.stop_type = Some("word");
                true
            }
            None => false,
        }
    }

    /// The text after what was returned that can no longer become part of a stop string.
    fn take_final(&mut self) -> String {
        let mut end = self.content.len();
        for w in &self.opts.stop {
            // The longest suffix of the content that begins `w`.
            let max = w.len().saturating_sub(1).min(end - self.emitted);
            for n in (1..=max).rev() {
                let start = self.content.len() - n;
                if self.content.is_char_boundary(start) && w.starts_with(&self.content[start..]) {
                    end = end.min(start);
                    break;
                }
            }
        }
        let out = self.content[self.emitted..end].to_string();
        self.emitted = end;
        out
    }

    /// After a stop: the rest of the text (an incomplete UTF-8 tail as U+FFFD unless the
    /// stop cut the text), once; then `None`.
    fn flush(&mut self) -> Option<String> {
        if self.stop_type != Some("word") {
            let raw = self.decoder.take_held();
            let rest = String::from_utf8_lossy(&raw);
            self.content.push_str(&rest);
            if !raw.is_empty() {
                self.raw_tail = Some((rest.len(), raw));
            }
        }
        if self.emitted >= self.content.len() {
            return None;
        }
        let out = self.content[self.emitted..].to_string();
        self.emitted = self.content.len();
        Some(out)
    }

    /// The timings so far: the prompt's, and the tokens generated until now with the
    /// milliseconds since the prompt was done (llama-server's `timings_per_token`).
    pub fn timings_now(&self) -> Timings {
        let predicted_ms = ms(self.t_gen);
        let n = self.tokens.len();
        Timings {
            predicted_n: n,
            predicted_ms,
            predicted_per_second: per_second(n, predicted_ms),
            ..self.timings
        }
    }

    /// The result (once stopped, or when stopped early by the caller: `stop_type` `none`).
    pub fn finish(self) -> Completion {
        let timings = self.timings_now();
        Completion {
            content: self.content,
            prompt_tokens: self.prompt,
            stop_type: self.stop_type.unwrap_or("none"),
            stopping_word: self.stopping_word,
            n_discarded: self.n_discarded,
            timings,
            tokens: self.tokens,
            probs: self.probs,
        }
    }
}

/// Most tokens of one verifying step (the chosen token and its draft): with a draft of
/// `--spec-ngram-simple-size-m` 48 at most, a step of 64 holds any.
const VERIFY_MAX: usize = 64;

/// A generation in progress over a session it borrows (module doc): a [`Decoding`] and
/// the session that evaluates its tokens.
pub struct Generation<'s, 'w, 'd> {
    session: &'s mut Session<'w>,
    vocab: &'s Vocab,
    seq: SeqId,
    state: Decoding,
    /// The logits the next token is chosen from (when `pending` is `None`).
    logits: Vec<f32>,
    /// A token already chosen but not evaluated: the one that replaced a rejected draft
    /// token (its logits were the verifying step's).
    pending: Option<TokenId>,
    /// Logit rows of the last verifying step, kept between steps.
    rows: Vec<f32>,
    /// A draft model ([`Generation::with_drafter`]), asked when the n-gram lookup of
    /// [`GenerateOptions::speculative`] has no draft (llama.cpp tries its n-gram kinds
    /// before a draft model).
    drafter: Option<&'s mut (dyn crate::speculative::Drafter + 'd)>,
}

impl<'s, 'w, 'd> Generation<'s, 'w, 'd> {
    /// Evaluates `prompt` as the new content of sequence `seq` (keeping the longest prefix
    /// it already holds when `opts.cache_prompt`) and gets ready to generate.
    ///
    /// # Errors
    /// An empty prompt, a prompt that does not fit the context, or an engine error.
    pub fn start(
        session: &'s mut Session<'w>,
        vocab: &'s Vocab,
        seq: SeqId,
        prompt: &[TokenId],
        opts: &GenerateOptions,
    ) -> anyhow::Result<Generation<'s, 'w, 'd>> {
        anyhow::ensure!(
            !prompt.is_empty(),
            "the prompt is empty (no tokens to evaluate)"
        );
        let n_ctx = session.n_ctx();
        anyhow::ensure!(
            prompt.len() < n_ctx,
            "the prompt has {} tokens but the context holds {n_ctx} (use -c to enlarge it)",
            prompt.len()
        );
        let mut state = Decoding::new(prompt, n_ctx, opts);
        let t_prompt = Instant::now();
        let mut logits = Vec::new();
        let keep = prefill(session, seq, prompt, opts, &mut logits)?;
        state.prompt_done(keep, ms(t_prompt));
        Ok(Generation {
            session,
            vocab,
            seq,
            state,
            logits,
            pending: None,
            rows: Vec::new(),
            drafter: None,
        })
    }

    /// Drafts from `drafter` (a draft model: [`crate::speculative::draft::DraftModel`])
    /// verified as the n-gram ones are; the session's engine needs steps with a logit row per
    /// token. The output is the same as without.
    pub fn with_drafter(
        mut self,
        drafter: Option<&'s mut (dyn crate::speculative::Drafter + 'd)>,
    ) -> Self {
        self.drafter = drafter;
        self
    }

    /// Whether generation has stopped.
    pub fn is_done(&self) -> bool {
        self.state.is_done()
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[TokenId] {
        self.state.tokens()
    }

    /// Generates one token and returns the text that became final with it (possibly
    /// empty: an incomplete UTF-8 sequence, text that may begin a stop string); `None` once
    /// generation has stopped and all text was returned.
    ///
    /// # Errors
    /// A forced token outside the vocabulary, or an engine error.
    pub fn step(&mut self) -> anyhow::Result<Option<String>> {
        let token = match self.pending.take() {
            Some(t) => t,
            None => match self.state.feed(self.vocab, &self.logits)? {
                Fed::Continue(t) => t,
                Fed::Stopped => return Ok(self.state.take_text()),
            },
        };
        // llama-completion shifts, or without a shift stops, before the decode that would
        // fill the context's last cell (`n_past + 1 >= n_ctx`; the token is emitted, not
        // evaluated).
        let n_past = self.session.n_past(self.seq);
        let shift = self.state.options().context_shift;
        if n_past + 1 >= self.session.n_ctx() {
            match shift {
                Some(n_keep) if self.shift(n_keep)? => {}
                _ => {
                    self.state.stop("context");
                    return Ok(self.state.take_text());
                }
            }
        }
        let draft = self.draft(token)?;
        if !draft.is_empty() {
            self.verify(token, &draft)?;
            return Ok(self.state.take_text());
        }
        let out = self.session.eval(self.seq, &[token], false)?;
        self.logits.clear();
        self.logits.extend_from_slice(out);
        Ok(self.state.take_text())
    }

    /// The draft to verify after `token` (chosen, not evaluated), as llama-server bounds it
    /// (`get_n_draft_max`): room for it and one more position in the context, at most one
    /// fewer than the tokens left to generate, and (modelc) one engine call. The n-gram
    /// lookup is asked first, then the draft model.
    ///
    /// # Errors
    /// The draft model's engine error.
    fn draft(&mut self, token: TokenId) -> anyhow::Result<Vec<TokenId>> {
        use crate::speculative::Drafter;
        if self.state.options().speculative.is_none() && self.drafter.is_none() {
            return Ok(Vec::new());
        }
        let n_past = self.session.n_past(self.seq);
        let mut n_max = self
            .session
            .n_ctx()
            .saturating_sub(n_past + 2)
            .min(self.session.max_ubatch().min(VERIFY_MAX).saturating_sub(1));
        if self.state.limit != usize::MAX {
            let left = self.state.limit.saturating_sub(self.state.tokens.len());
            n_max = n_max.min(left.saturating_sub(1));
        }
        if n_max == 0 {
            return Ok(Vec::new());
        }
        let history = self.session.tokens(self.seq);
        if let Some(mut p) = self.state.options().speculative {
            let d = p.draft(history, token, n_max)?;
            if !d.is_empty() {
                return Ok(d);
            }
        }
        match self.drafter.as_deref_mut() {
            Some(d) => d.draft(history, token, n_max),
            None => Ok(Vec::new()),
        }
    }

    /// Evaluates `token` and `draft` in one call with every row's logits (each row as that
    /// token decoded alone: [`Session::eval_as_singles`]), then feeds the
    /// rows in order while the chosen token is the drafted one (llama.cpp's
    /// `common_sampler_sample_and_accept_n`): the drafted tokens kept stay in the cache,
    /// the rest are truncated away, and the token chosen in place of the first rejected
    /// one is evaluated by the next step.
    fn verify(&mut self, token: TokenId, draft: &[TokenId]) -> anyhow::Result<()> {
        let n_past = self.session.n_past(self.seq);
        let mut batch = Vec::with_capacity(draft.len() + 1);
        batch.push(token);
        batch.extend_from_slice(draft);
        let out = self.session.eval_as_singles(self.seq, &batch)?;
        self.rows.clear();
        self.rows.extend_from_slice(out);
        let n_vocab = self.session.n_vocab();
        let mut accepted = 0;
        let mut next = None;
        let mut stopped = false;
        for (i, &d) in draft.iter().enumerate() {
            let row = &self.rows[i * n_vocab..(i + 1) * n_vocab];
            match self.state.feed(self.vocab, row)? {
                Fed::Continue(t) if t == d => accepted += 1,
                Fed::Continue(t) => {
                    next = Some(t);
                    break;
                }
                Fed::Stopped => {
                    stopped = true;
                    break;
                }
            }
        }
        self.state.add_draft(draft.len(), accepted);
        // The cache keeps `token` and the accepted drafted tokens.
        self.session.truncate(self.seq, n_past + 1 + accepted);
        if accepted == draft.len() && !stopped {
            let row = &self.rows[accepted * n_vocab..(accepted + 1) * n_vocab];
            self.logits.clear();
            self.logits.extend_from_slice(row);
        } else {
            self.pending = next;
        }
        Ok(())
    }

    /// The context is full: keeps the first `n_keep` positions, drops the oldest half of the
    /// rest, and moves what remains down, its keys re-roped by the shift as llama-completion
    /// does ([`Session::shift`]). Returns whether anything was dropped.
    ///
    /// # Errors
    /// An engine error.
    fn shift(&mut self, n_keep: usize) -> anyhow::Result<bool> {
        let n_past = self.session.n_past(self.seq);
        let n_keep = n_keep.min(n_past);
        let n_discard = (n_past - n_keep) / 2;
        if n_discard == 0 {
            return Ok(false);
        }
        self.session.shift(self.seq, n_keep, n_discard)?;
        self.state.add_discarded(n_discard);
        Ok(true)
    }

    /// Runs to the end, calling `on_text` with the bytes of each piece of final text: UTF-8,
    /// except that an unfinished UTF-8 sequence at the very end comes as its raw bytes, as
    /// llama.cpp prints them (the completion's `content` has U+FFFD there).
    ///
    /// # Errors
    /// As [`Generation::step`].
    pub fn run(&mut self, on_text: &mut dyn FnMut(&[u8])) -> anyhow::Result<()> {
        while let Some(text) = self.step()? {
            let (text, raw) = match self.state.take_raw_tail() {
                Some((n, raw)) if n <= text.len() => (&text[..text.len() - n], raw),
                _ => (text.as_str(), Vec::new()),
            };
            for piece in [text.as_bytes(), &raw] {
                if !piece.is_empty() {
                    on_text(piece);
                }
            }
        }
        Ok(())
    }

    /// The result (after [`Generation::run`], or when stopped early by the caller).
    pub fn finish(self) -> Completion {
        self.state.finish()
    }
}

/// Makes sequence `seq` hold `prompt` (non-empty): keeps the longest prefix it holds when
/// `opts.cache_prompt` (at least the last token is evaluated again: its logits are needed),
/// evaluates the rest in calls of `opts.n_batch` tokens (at most the engine's ubatch), and
/// leaves the last token's logits in `logits`. Returns the number of tokens kept. What a
/// generation does with its prompt, and what replaying a saved conversation does with each
/// turn's.
///
/// # Errors
/// The cancel flag set between calls, or an engine error.
pub fn prefill(
    session: &mut Session<'_>,
    seq: SeqId,
    prompt: &[TokenId],
    opts: &GenerateOptions,
    logits: &mut Vec<f32>,
) -> anyhow::Result<usize> {
    let keep = if opts.cache_prompt {
        common_prefix(session.tokens(seq), prompt).min(prompt.len().saturating_sub(1))
    } else {
        0
    };
    session.truncate(seq, keep);
    let chunk = opts.n_batch.min(session.max_ubatch()).max(1);
    for part in prompt[keep..].chunks(chunk) {
        anyhow::ensure!(!is_cancelled(&opts.cancel), "cancelled");
        let out = session.eval(seq, part, false)?;
        logits.clear();
        logits.extend_from_slice(out);
    }
    Ok(keep)
}

fn is_cancelled(flag: &Option<Arc<AtomicBool>>) -> bool {
    flag.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Evaluates `prompt` as sequence 0 of `session` and generates a continuation, calling
/// `on_text` with each complete piece of text as soon as it is final ([`Generation`]).
///
/// # Errors
/// An empty prompt, a prompt that does not fit the context, or an engine error.
pub fn generate(
    session: &mut Session<'_>,
    vocab: &Vocab,
    prompt: &[TokenId],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&[u8]),
) -> anyhow::Result<Completion> {
    generate_with_drafter(session, vocab, prompt, opts, None, on_text)
}

/// [`generate`] with drafts from a draft model too ([`Generation::with_drafter`]).
///
/// # Errors
/// As [`generate`].
pub fn generate_with_drafter(
    session: &mut Session<'_>,
    vocab: &Vocab,
    prompt: &[TokenId],
    opts: &GenerateOptions,
    drafter: Option<&mut (dyn crate::speculative::Drafter + '_)>,
    on_text: &mut dyn FnMut(&[u8]),
) -> anyhow::Result<Completion> {
    let mut g = Generation::start(session, vocab, 0, prompt, opts)?.with_drafter(drafter);
    g.run(on_text)?;
    Ok(g.finish())
}
