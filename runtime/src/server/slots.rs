//! The inference thread: it owns the [`Session`] (one sequence per slot, as llama-server's
//! `-np`) and runs llama-server's loop (`tools/server/server-context.cpp` `update_slots`):
//! take waiting requests into idle slots, then, each step, put the pending tokens of every
//! busy slot — a prompt chunk for a slot still reading its prompt, the last sampled token
//! for a generating one — into one [`Session::decode_batch`] call, and sample each slot's
//! next token from its logits row. Each slot's tokens are what it would get alone (the
//! session's contract), so parallel requests do not change one another's output.
//!
//! A slot keeps its tokens after a request: the next request that shares a prefix with
//! them evaluates only the rest (`cache_prompt`), and a new request goes to the idle slot
//! holding the longest common prefix with its prompt, else the least recently used.
//!
//! Requests come over a channel (the queue, bounded by the permits the HTTP side hands
//! out: slots + `--queue-size`); results go back over a channel per request. A request whose receiver is gone (the client disconnected) is cancelled at the
//! next step and its slot freed.

use super::error::ApiError;
use super::metrics::Metrics;
use crate::generate::{common_prefix, Completion, Decoding, Fed, GenerateOptions, PositionProbs};
use crate::session::{BatchToken, Session};
use crate::tokenizer::{TokenId, Vocab};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::mpsc;

/// One request for a completion.
pub struct Job {
    /// The prompt's tokens (non-empty, shorter than a slot's context: checked before).
    pub prompt: Vec<TokenId>,
    /// How to generate; `cache_prompt` says whether a slot's tokens are reused.
    pub opts: GenerateOptions,
    /// The slot asked for (`id_slot`), if idle; else the best idle slot.
    pub id_slot: Option<usize>,
    /// Where the results go.
    pub events: mpsc::UnboundedSender<Event>,
    /// Whether prompt progress events are sent (a streamed request with
    /// `return_progress`).
    pub progress: bool,
    /// Its place among the requests the server holds (slots + queue): given back when the
    /// request ends.
    pub permit: tokio::sync::OwnedSemaphorePermit,
}

/// What the inference thread sends back for a request.
pub enum Event {
    /// One generated token and the text that became final with it (possibly empty).
    Token {
        /// Final text.
        content: String,
        /// The token.
        token: TokenId,
        /// Its probabilities, when asked for.
        probs: Option<PositionProbs>,
        /// The request's timings so far.
        timings: crate::generate::Timings,
    },
    /// How far the prompt has been read (llama-server's `prompt_progress`): sent when the
    /// request starts and after each step that read some of its prompt, when asked for.
    Progress(Progress),
    /// The request is done.
    Done(Box<Finished>),
    /// The request failed.
    Error(ApiError),
}

/// llama-server's `prompt_progress` (`result_prompt_progress`), with the prompt timings so
/// far.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Prompt tokens.
    pub total: usize,
    /// Of them, reused from the slot's cache.
    pub cache: usize,
    /// Of them, in the cache now (cached ones included).
    pub processed: usize,
    /// Milliseconds since the request started.
    pub time_ms: u64,
    /// Timings so far: the prompt tokens evaluated and their milliseconds.
    pub timings: crate::generate::Timings,
}

/// A finished request.
pub struct Finished {
    /// The result.
    pub completion: Completion,
    /// The slot that ran it.
    pub id_slot: usize,
    /// Generation stopped because the slot's context was full (llama-server's `truncated`;
    /// its `stop_type` is then `limit`).
    pub truncated: bool,
}

/// What `/slots` shows of a slot.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SlotView {
    /// Slot id.
    pub id: usize,
    /// Its request's number (-1 when idle).
    pub id_task: i64,
    /// Its context.
    pub n_ctx: usize,
    /// Always false (no speculative decoding).
    pub speculative: bool,
    /// Whether a request runs in it.
    pub is_processing: bool,
    /// Tokens its sequence holds (its prompt cache).
    pub n_past: usize,
    /// Tokens generated for the running request.
    pub n_decoded: usize,
}

/// What the inference thread shares with the HTTP side.
#[derive(Default)]
pub struct Shared {
    /// The slots.
    pub slots: Mutex<Vec<SlotView>>,
    /// Counters for `/metrics`.
    pub metrics: Mutex<Metrics>,
    /// Set on SIGTERM / SIGINT: running requests are cancelled.
    pub shutdown: AtomicBool,
}

/// A request running in a slot.
struct Active {
    events: mpsc::UnboundedSender<Event>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    state: Decoding,
    /// Next prompt token to evaluate.
    pos: usize,
    /// The sampled token to evaluate next (generating).
    pending: Option<TokenId>,
    cache_n: usize,
    chunk: usize,
    t_start: Instant,
    id_task: i64,
    truncated: bool,
    progress: bool,
}

impl Active {
    /// Sends a progress event when the request asked for them.
    fn send_progress(&self) {
        if !self.progress {
            return;
        }
        let ms = self.t_start.elapsed().as_secs_f64() * 1e3;
        let processed = self.pos.min(self.state.prompt().len());
        let prompt_n = processed - self.cache_n;
        let timings = crate::generate::Timings {
            cache_n: self.cache_n,
            prompt_n,
            prompt_ms: if prompt_n > 0 { ms } else { 0.0 },
            ..Default::default()
        };
        let _ = self.events.send(Event::Progress(Progress {
            total: self.state.prompt().len(),
            cache: self.cache_n,
            processed,
            time_ms: ms as u64,
            timings,
        }));
    }
}

struct Slot {
    active: Option<Active>,
    last_used: u64,
}

/// Runs the loop until the request channel closes (module doc).
pub fn run(
    session: &mut Session<'_>,
    vocab: &Vocab,
    jobs: &mut mpsc::UnboundedReceiver<Job>,
    shared: &Shared,
) {
    let n_slots = session.n_seq_max();
    let n_vocab = session.n_vocab();
    let n_ctx = session.n_ctx();
    let mut slots: Vec<Slot> = (0..n_slots)
        .map(|_| Slot {
            active: None,
            last_used: 0,
        })
        .collect();
    let mut clock = 0u64;
    let mut next_task = 0i64;
    // Each step's logit rows, written where the last step's were.
    let mut rows: Vec<f32> = Vec::new();
    loop {
        // Take waiting requests into idle slots; block when there is nothing to do.
        while slots.iter().any(|s| s.active.is_none()) {
            let idle = slots.iter().all(|s| s.active.is_none());
            let job = if idle {
                publish(session, &slots, shared);
                match jobs.blocking_recv() {
                    Some(j) => j,
                    None => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            if job.events.is_closed() {
                continue;
            }
            let i = choose_slot(session, &slots, &job);
            let keep = if job.opts.cache_prompt {
                common_prefix(session.tokens(i as u32), &job.prompt).min(job.prompt.len() - 1)
            } else {
                0
            };
            session.truncate(i as u32, keep);
            let chunk = job.opts.n_batch.min(session.max_ubatch()).max(1);
            clock += 1;
            slots[i].last_used = clock;
            slots[i].active = Some(Active {
                state: Decoding::new(&job.prompt, n_ctx, &job.opts),
                events: job.events,
                _permit: job.permit,
                pos: keep,
                pending: None,
                cache_n: keep,
                chunk,
                t_start: Instant::now(),
                id_task: next_task,
                truncated: false,
                progress: job.progress,
            });
            if let Some(a) = &slots[i].active {
                a.send_progress();
            }
            next_task += 1;
        }
        // Cancel what nobody waits for, then gather every busy slot's pending tokens.
        let stopping = shared.shutdown.load(Ordering::Relaxed);
        // Results of finished requests, sent once the slots' state is published (a client
        // that reads /slots after its answer sees its slot idle).
        let mut outbox: Outbox = Vec::new();
        let mut batch: Vec<BatchToken> = Vec::new();
        let mut takers: Vec<(usize, bool)> = Vec::new();
        // Slots that read part of their prompt in this step.
        let mut reading: Vec<usize> = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if stopping || a.events.is_closed() || a.state.is_cancelled() {
                a.state.stop("cancelled");
                outbox.extend(finish(slot, i, shared));
                continue;
            }
        }
        // With a shared KV pool (`--kv-unified`) a step takes only the tokens that fit.
        let mut room = match session.kv_room() {
            Some(free) => pool_room(session, &mut slots, free),
            None => usize::MAX,
        };
        if room == 0 {
            // llama-server: a batch of one token that finds no cell fails every running
            // request.
            fail_all(
                session,
                &mut slots,
                shared,
                outbox,
                "Context size has been exceeded.",
            );
            continue;
        }
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            let seq = i as u32;
            let prompt = a.state.prompt();
            if room == 0 {
                break;
            }
            if a.pos < prompt.len() {
                let end = (a.pos + a.chunk)
                    .min(prompt.len())
                    .min(a.pos.saturating_add(room));
                room -= end - a.pos;
                reading.push(i);
                batch.extend(prompt[a.pos..end].iter().map(|&token| BatchToken {
                    token,
                    seq,
                    logits: false,
                }));
                a.pos = end;
                if end == prompt.len() {
                    if let Some(last) = batch.last_mut() {
                        last.logits = true;
                    }
                    takers.push((i, true));
                }
            } else if let Some(token) = a.pending.take() {
                room -= 1;
                batch.push(BatchToken {
                    token,
                    seq,
                    logits: true,
                });
                takers.push((i, false));
            }
        }
        if batch.is_empty() {
            publish(session, &slots, shared);
            for (tx, ev) in outbox {
                let _ = tx.send(ev);
            }
            continue;
        }
        let busy = slots.iter().filter(|s| s.active.is_some()).count();
        if let Err(e) = session.decode_batch_into(&batch, &mut rows) {
            // Which slot failed is not known: every slot of the batch gets the error and
            // starts over from an empty cache.
            fail_all(
                session,
                &mut slots,
                shared,
                outbox,
                &format!("decode: {e:#}"),
            );
            continue;
        }
        if let Ok(mut m) = shared.metrics.lock() {
            m.n_decode += 1;
            m.n_busy_slots += busy as u64;
        }
        for &i in &reading {
            if let Some(a) = &slots[i].active {
                a.send_progress();
            }
        }
        for (k, &(i, prompt_done)) in takers.iter().enumerate() {
            let n_past = session.n_past(i as u32);
            let slot = &mut slots[i];
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            let Some(row) = rows.get(k * n_vocab..(k + 1) * n_vocab) else {
                let e = ApiError::server("decode: fewer logits rows than asked for");
                let _ = a.events.send(Event::Error(e));
                slot.active = None;
                session.clear_seq(i as u32);
                continue;
            };
            if prompt_done {
                let prompt_ms = a.t_start.elapsed().as_secs_f64() * 1e3;
                a.state.prompt_done(a.cache_n, prompt_ms);
                if let Ok(mut m) = shared.metrics.lock() {
                    m.prompt_tokens += (a.state.prompt().len() - a.cache_n) as u64;
                    m.prompt_cached += a.cache_n as u64;
                    m.prompt_seconds += prompt_ms / 1e3;
                }
            }
            let before = a.state.tokens().len();
            match a.state.feed(vocab, row) {
                Ok(Fed::Continue(t)) => {
                    // llama-server stops a slot whose context is full (no context shift)
                    // before the decode that would fill its last cell
                    // (`prompt.n_tokens() + 1 >= n_ctx`): `stop_type` limit, `truncated`.
                    if n_past + 1 >= n_ctx {
                        a.state.stop("context");
                        a.truncated = true;
                    } else {
                        a.pending = Some(t);
                    }
                }
                Ok(Fed::Stopped) => {}
                Err(e) => {
                    let _ = a
                        .events
                        .send(Event::Error(ApiError::invalid(format!("{e:#}"))));
                    slot.active = None;
                    continue;
                }
            }
            if a.state.tokens().len() > before {
                let token = a.state.tokens()[before];
                let content = a.state.take_text().unwrap_or_default();
                let probs = a.state.probs().last().cloned();
                let _ = a.events.send(Event::Token {
                    content,
                    token,
                    probs,
                    timings: a.state.timings_now(),
                });
            }
            if a.state.is_done() {
                outbox.extend(finish(slot, i, shared));
            }
        }
        publish(session, &slots, shared);
        for (tx, ev) in outbox {
            let _ = tx.send(ev);
        }
    }
}

/// Results on their way to requests: sent once the slots' state is published.
type Outbox = Vec<(mpsc::UnboundedSender<Event>, Event)>;

/// Fails every running request with a 500 `message`; their slots start over from an empty
/// cache. The errors go out (with `outbox`) once `/slots` shows the slots free.
fn fail_all(
    session: &mut Session<'_>,
    slots: &mut [Slot],
    shared: &Shared,
    mut outbox: Outbox,
    message: &str,
) {
    for (i, slot) in slots.iter_mut().enumerate() {
        if let Some(a) = slot.active.take() {
            outbox.push((a.events, Event::Error(ApiError::server(message))));
            session.clear_seq(i as u32);
        }
    }
    publish(session, slots, shared);
    for (tx, ev) in outbox {
        let _ = tx.send(ev);
    }
}

/// The cells of the shared KV pool this step may fill, `free` of them free: when the
/// running requests want more, the idle slots' caches are dropped first (llama-server's
/// `try_clear_idle_slots`), then what is free is what the step gets (llama-server halves its
/// batch until it fits). 0 only when some request wants a cell and none is left.
fn pool_room(session: &mut Session<'_>, slots: &mut [Slot], free: usize) -> usize {
    let wanted: usize = slots
        .iter()
        .filter_map(|s| s.active.as_ref())
        .map(|a| {
            let left = a.state.prompt().len().saturating_sub(a.pos);
            if left > 0 {
                left.min(a.chunk)
            } else {
                usize::from(a.pending.is_some())
            }
        })
        .sum();
    if wanted <= free {
        return wanted.max(1);
    }
    for (i, s) in slots.iter().enumerate() {
        if s.active.is_none() && session.n_past(i as u32) > 0 {
            session.clear_seq(i as u32);
        }
    }
    session.kv_room().unwrap_or(free).min(wanted)
}

/// The slot for `job`: the one it asks for if idle, else the idle slot whose cache shares
/// the longest prefix with its prompt (ties: the least recently used).
fn choose_slot(session: &Session<'_>, slots: &[Slot], job: &Job) -> usize {
    if let Some(i) = job.id_slot {
        if slots.get(i).is_some_and(|s| s.active.is_none()) {
            return i;
        }
    }
    let mut best: Option<(usize, usize, u64)> = None;
    for (i, s) in slots.iter().enumerate() {
        if s.active.is_some() {
            continue;
        }
        let shared = common_prefix(session.tokens(i as u32), &job.prompt);
        let better = match best {
            None => true,
            Some((_, b_shared, b_used)) => {
                shared > b_shared || (shared == b_shared && s.last_used < b_used)
            }
        };
        if better {
            best = Some((i, shared, s.last_used));
        }
    }
    best.map_or(0, |(i, _, _)| i)
}

/// Ends the request of `slot` (number `i`) and returns its result with where it goes; the
/// slot keeps its tokens for the next request.
fn finish(
    slot: &mut Slot,
    i: usize,
    shared: &Shared,
) -> Option<(mpsc::UnboundedSender<Event>, Event)> {
    let mut a = slot.active.take()?;
    // Text still held back (an incomplete UTF-8 tail of a cancelled request) joins the
    // result's content.
    let _ = a.state.take_text();
    let completion = a.state.finish();
    if let Ok(mut m) = shared.metrics.lock() {
        m.predicted_tokens += completion.tokens.len() as u64;
        m.predicted_seconds += completion.timings.predicted_ms / 1e3;
        let n = (completion.prompt_tokens.len() + completion.tokens.len()) as u64;
        m.n_tokens_max = m.n_tokens_max.max(n);
    }
    let ev = Event::Done(Box::new(Finished {
        completion,
        id_slot: i,
        truncated: a.truncated,
    }));
    Some((a.events, ev))
}

/// Publishes the slots' state for `/slots` and `/metrics`.
fn publish(session: &Session<'_>, slots: &[Slot], shared: &Shared) {
    let views: Vec<SlotView> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| SlotView {
            id: i,
            id_task: s.active.as_ref().map_or(-1, |a| a.id_task),
            n_ctx: session.n_ctx(),
            speculative: false,
            is_processing: s.active.is_some(),
            n_past: session.n_past(i as u32),
            n_decoded: s.active.as_ref().map_or(0, |a| a.state.tokens().len()),
        })
        .collect();
    if let Ok(mut m) = shared.metrics.lock() {
        m.requests_processing = views.iter().filter(|v| v.is_processing).count();
    }
    if let Ok(mut v) = shared.slots.lock() {
        *v = views;
    }
}
