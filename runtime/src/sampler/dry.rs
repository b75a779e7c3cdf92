//! llama.cpp's DRY ("Don't Repeat Yourself") sampler (`src/llama-sampler.cpp`, commit
//! 0c1e570: `llama_sampler_init_dry`, `llama_sampler_dry_accept`, `llama_sampler_dry_apply`;
//! the algorithm is pi6am's, from Koboldcpp).
//!
//! DRY lowers the logit of every token that would extend a repetition of the recent text:
//! if the last `m` tokens also occur earlier, followed there by token `t`, emitting `t`
//! repeats `m + 1` tokens, and `t` loses `multiplier * base^(m - allowed_length)` when
//! `m >= allowed_length` (`m` the longest such repetition for `t`).
//!
//! - **Window.** Only the last `penalty_last_n` accepted tokens count (llama.cpp's
//!   `last_tokens` ring of that capacity).
//! - **Sequence breakers.** Texts (default `\n`, `:`, `"`, `*`) that end a repetition: a
//!   repetition may not reach back past the most recent breaker, and a token that is a whole
//!   breaker by itself is never penalized. [`DryBreakers`] turns the texts into token
//!   sequences once per vocabulary.
//! - **Apply**, in llama.cpp's four steps: (1) the distance back to the most recent
//!   breaker bounds every repetition length (`rep_limit`); (2) a Z-algorithm over the
//!   window read backwards gives, for each earlier position, how many tokens ending there
//!   equal the tokens ending the window; (3) the token after each such position takes the
//!   largest of those lengths; (4) the penalty, with the exponent clamped so that
//!   `base^exp` stays finite.
//!
//! The arithmetic is llama.cpp's: the clamp is `(int)(88.7228391f / logf(base))` in f32, and
//! the penalty `(float)(multiplier * pow((double)base, (double)exp))` — C++'s
//! `std::pow(float, int)` computes in double.

use super::Cand;
use crate::tokenizer::{TokenId, Vocab};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

/// llama.cpp's `MAX_CHAR_LEN`: a breaker keeps its first 40 bytes.
const MAX_BREAKER_BYTES: usize = 40;

/// llama.cpp's `MAX_SEQ_LEN`: a breaker's tail keeps its first 20 tokens.
const MAX_TAIL_TOKENS: usize = 20;

/// llama.cpp's `FLOAT_MAX_LOG` (`88.7228391f`, the same f32): about `ln(f32::MAX)`, the
/// largest exponent of `e` an f32 holds.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// The processed sequence breakers (llama.cpp's `dry_processed_breakers`): for a head
/// token, the token sequences that, following it, complete a breaker. An empty tail means
/// the head token holds a whole breaker by itself.
///
/// Stored as a table indexed by the head token: token `t` heads the tails
/// `tails[starts[t]..starts[t + 1]]`, each a range of `tail_tokens`. Tokens past the table
/// head nothing. `DryBreakers::default()` holds no breakers (llama.cpp's "none").
#[derive(Debug, Default)]
pub struct DryBreakers {
    starts: Vec<u32>,
    tails: Vec<Range<u32>>,
    tail_tokens: Vec<TokenId>,
}

impl DryBreakers {
    /// The breakers of the texts `breakers` in `vocab`, as `llama_sampler_init_dry` builds
    /// them (`get_overlapping_token_sequences`):
    ///
    /// - a text is cut at its first NUL byte (llama.cpp receives C strings), then skipped if
    ///   empty, and cut to its first 40 bytes (`MAX_CHAR_LEN`, even inside a UTF-8
    ///   character); there is no limit on how many texts there are;
    /// - every token whose text (`detokenize({id}, special = true)`: its leading space
    ///   removed where the vocabulary adds a space prefix, spaces cleaned up where it cleans
    ///   them) contains the breaker heads it with an empty tail;
    /// - every other token whose text ends with a proper prefix of the breaker heads the
    ///   tokenization (no special tokens added or parsed) of the rest of the breaker, cut to
    ///   20 tokens (`MAX_SEQ_LEN`), once per distinct tail.
    ///
    /// It runs over the whole vocabulary once (detokenizing each token once for all the
    /// texts); callers keep the result for the vocabulary and breaker list.
    pub fn new(vocab: &Vocab, breakers: &[String]) -> DryBreakers {
        let mut texts: Vec<BreakerText> = breakers
            .iter()
            .filter_map(|b| BreakerText::new(b.as_bytes()))
            .collect();
        let mut entries: Vec<(TokenId, Vec<TokenId>)> = Vec::new();
        if texts.is_empty() {
            return DryBreakers::from_entries(entries);
        }
        for id in 0..vocab.n_vocab() as TokenId {
            let word = vocab.detokenize(&[id], true);
            let first_of_id = entries.len();
            for text in &mut texts {
                text.heads(vocab, id, &word, first_of_id, &mut entries);
            }
        }
        DryBreakers::from_entries(entries)
    }

    /// The breakers given as token sequences (llama.cpp's `llama_sampler_init_dry_testing`):
    /// each non-empty sequence's first token heads the rest, unshortened.
    #[cfg(test)]
    pub(crate) fn from_token_sequences(seqs: &[Vec<TokenId>]) -> DryBreakers {
        let entries = seqs
            .iter()
            .filter_map(|s| s.split_first().map(|(&h, t)| (h, t.to_vec())))
            .collect();
        DryBreakers::from_entries(entries)
    }

    /// Builds the table from `(head, tail)` pairs in any order.
    fn from_entries(mut entries: Vec<(TokenId, Vec<TokenId>)>) -> DryBreakers {
        entries.sort_by_key(|e| e.0);
        let n_heads = entries.last().map_or(0, |e| e.0 as usize + 1);
        let mut b = DryBreakers {
            starts: Vec::with_capacity(n_heads + 1),
            tails: Vec::with_capacity(entries.len()),
            tail_tokens: Vec::new(),
        };
        let mut next = entries.iter().peekable();
        for head in 0..n_heads as TokenId {
            b.starts.push(b.tails.len() as u32);
            while let Some((_, tail)) = next.next_if(|e| e.0 == head) {
                let at = b.tail_tokens.len() as u32;
                b.tail_tokens.extend_from_slice(tail);
                b.tails.push(at..b.tail_tokens.len() as u32);
            }
        }
        b.starts.push(b.tails.len() as u32);
        b
    }

    /// The tails that complete a breaker after `head` (none if it heads no breaker).
    fn tails(&self, head: TokenId) -> impl Iterator<Item = &[TokenId]> + '_ {
        let h = head as usize;
        let range = match (self.starts.get(h), self.starts.get(h + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        };
        self.tails[range]
            .iter()
            .map(|r| &self.tail_tokens[r.start as usize..r.end as usize])
    }

    /// Whether `token` is a whole breaker by itself (one of its tails is empty).
    fn is_single_token(&self, token: TokenId) -> bool {
        self.tails(token).any(|t| t.is_empty())
    }
}

/// One breaker text while [`DryBreakers::new`] scans the vocabulary, with the tokenizations
/// of its suffixes as they are needed (`suffix_tokens[i]`: of `bytes[i..]`).
struct BreakerText {
    bytes: Vec<u8>,
    suffix_tokens: Vec<Option<Vec<TokenId>>>,
}

impl BreakerText {
    /// The breaker as llama.cpp sees it (cut at a NUL, then to 40 bytes); `None` if empty.
    fn new(text: &[u8]) -> Option<BreakerText> {
        let c_len = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        let bytes = text[..c_len.min(MAX_BREAKER_BYTES)].to_vec();
        if bytes.is_empty() {
            return None;
        }
        let suffix_tokens = vec![None; bytes.len()];
        Some(BreakerText {
            bytes,
            suffix_tokens,
        })
    }

    /// Adds the breakers token `id` (text `word`) heads for this text to `entries`, whose
    /// entries for `id` start at `first_of_id` (`get_overlapping_token_sequences`).
    fn heads(
        &mut self,
        vocab: &Vocab,
        id: TokenId,
        word: &[u8],
        first_of_id: usize,
        entries: &mut Vec<(TokenId, Vec<TokenId>)>,
    ) {
        let s = &self.bytes;
        if memchr::memmem::find(word, s).is_some() {
            entries.push((id, Vec::new()));
            return;
        }
        // `word` does not contain `s`: a start of `s` can only run off the end of `word`.
        for pos in memchr::memchr_iter(s[0], word) {
            let overlap = word.len() - pos;
            if overlap >= s.len() || word[pos..] != s[..overlap] {
                continue;
            }
            let tail = self.suffix_tokens[overlap].get_or_insert_with(|| {
                let mut t = vocab.tokenize_bytes(&s[overlap..], false, false);
                t.truncate(MAX_TAIL_TOKENS);
                t
            });
            if !entries[first_of_id..].iter().any(|e| e.1 == *tail) {
                entries.push((id, tail.clone()));
            }
        }
    }
}

/// llama.cpp's DRY sampler state for one sequence: the parameters, the window of accepted
/// tokens, and scratch space `apply` reuses.
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: i32,
    /// The window size (`dry_penalty_last_n` resolved); 0 turns DRY off.
    last_n: usize,
    breakers: Arc<DryBreakers>,
    /// The last `last_n` accepted tokens, oldest first (llama.cpp's `last_tokens`).
    last: VecDeque<TokenId>,
    /// `rev[i]`: the token `i` places from the end of the window (llama.cpp's
    /// `last_tokens.rat(i)`).
    rev: Vec<TokenId>,
    /// `repeat[k]`: how many tokens ending `k` places from the end equal the tokens ending
    /// the window, at most `rep_limit` (llama.cpp's `dry_repeat_count[last - k]`).
    repeat: Vec<usize>,
    /// `(token, longest repetition it would extend)`, sorted by token, one per token
    /// (llama.cpp's `dry_max_token_repeat`).
    max_repeat: Vec<(TokenId, usize)>,
}

impl Dry {
    /// A DRY sampler as `llama_sampler_init_dry(vocab, multiplier, base, allowed_length,
    /// penalty_last_n, …)` makes it, with `breakers` already processed.
    ///
    /// `penalty_last_n` is the window in tokens; 0 or less than -1 turns DRY off (llama.cpp
    /// clamps negatives to 0). -1 is the window `n_ctx`: at 0c1e570 llama.cpp never gets
    /// there (`--dry-penalty-last-n` and llama-server reject negative values, and
    /// `llama_sampler_init_dry` has no context size); its earlier versions took one and
    /// mapped -1 to it, and `common/sampling.cpp` passed the model's training context
    /// (`llama_model_n_ctx_train`). The window grows as tokens come, so a large one costs
    /// nothing up front.
    pub fn new(
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        penalty_last_n: i32,
        n_ctx: usize,
        breakers: Arc<DryBreakers>,
    ) -> Dry {
        let last_n = match penalty_last_n {
            -1 => n_ctx,
            n => n.max(0) as usize,
        };
        Dry {
            multiplier,
            base,
            allowed_length,
            last_n,
            breakers,
            last: VecDeque::with_capacity(last_n.min(4096)),
            rev: Vec::new(),
            repeat: Vec::new(),
            max_repeat: Vec::new(),
        }
    }

    /// Whether it changes anything at all: llama.cpp makes an empty sampler unless
    /// `multiplier != 0`, `base >= 1` (so not NaN) and the window is not 0.
    pub fn active(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.last_n != 0
    }

    /// `llama_sampler_dry_accept`: `token` was emitted (prompt or generated); it enters the
    /// window, pushing out the oldest token once the window is full.
    pub fn accept(&mut self, token: TokenId) {
        if !self.active() {
            return;
        }
        if self.last.len() == self.last_n {
            self.last.pop_front();
        }
        self.last.push_back(token);
    }

    /// `llama_sampler_dry_apply`: lowers the logits of the candidates that would extend a
    /// repetition (see the module documentation). `cands` may be in any order and any subset
    /// of the vocabulary; their order and `p` are kept (llama.cpp then marks them unsorted).
    pub fn apply(&mut self, cands: &mut [Cand]) {
        if !self.active() {
            return;
        }
        let n = self.last.len();
        if n as i64 <= self.allowed_length as i64 {
            return;
        }
        self.rev.clear();
        self.rev.extend(self.last.iter().rev());
        let Some(rep_limit) = self.rep_limit() else {
            return;
        };
        self.repeat_counts(rep_limit);
        self.collect_max_repeat();
        if !self.max_repeat.is_empty() {
            self.penalize(cands);
        }
    }

    /// Step 1: the longest repetition the most recent breaker allows. Going back from the
    /// newest token, the first token that heads a breaker whose tail follows it in the
    /// window (the longest such tail) ends the scan: repetitions may reach back to just
    /// after the breaker. `None` when that is under `allowed_length` (nothing to penalize).
    fn rep_limit(&self) -> Option<usize> {
        let rev = &self.rev;
        let mut limit = rev.len();
        for (i, &tok) in rev.iter().enumerate() {
            let longest = self
                .breakers
                .tails(tok)
                .filter(|t| t.len() <= i && t.iter().enumerate().all(|(o, &x)| rev[i - 1 - o] == x))
                .map(|t| t.len())
                .max();
            if let Some(len) = longest {
                limit = i - len;
                break;
            }
        }
        (limit as i64 >= self.allowed_length as i64).then_some(limit)
    }

    /// Step 2: `repeat[k]` for `k` in `1..n`: the length of the longest common prefix of
    /// `rev` and `rev[k..]` (the Z-array of `rev`), capped at `rep_limit`, by the
    /// Z-algorithm as llama.cpp runs it. It reuses capped values inside a Z-box; that gives
    /// the same capped lengths, since a value capped below the box's remainder is capped in
    /// the mirrored position too.
    fn repeat_counts(&mut self, rep_limit: usize) {
        let (rev, z) = (&self.rev, &mut self.repeat);
        let n = rev.len();
        z.clear();
        z.resize(n, 0);
        // The Z-box: rev[lt..=rt] equals rev[..=rt - lt].
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..n {
            if k > rt {
                let mut len = 0;
                while k + len < n && rev[len] == rev[k + len] {
                    len += 1;
                }
                z[k] = len.min(rep_limit);
                if len > 0 {
                    (lt, rt) = (k, k + len - 1);
                }
            } else {
                let mirrored = z[k - lt];
                let box_rest = rt - k + 1;
                if mirrored < box_rest {
                    z[k] = mirrored.min(rep_limit);
                } else {
                    let mut end = rt + 1;
                    while end < n && rev[end] == rev[end - k] {
                        end += 1;
                    }
                    z[k] = (end - k).min(rep_limit);
                    (lt, rt) = (k, end - 1);
                }
            }
        }
    }

    /// Step 3: for each repetition at least `allowed_length` long ending `k` places from
    /// the end, the token after it (`rev[k - 1]`) would extend it; each such token keeps
    /// its longest.
    fn collect_max_repeat(&mut self) {
        let allowed = self.allowed_length as i64;
        self.max_repeat.clear();
        for k in 1..self.rev.len() {
            let len = self.repeat[k];
            if len as i64 >= allowed {
                self.max_repeat.push((self.rev[k - 1], len));
            }
        }
        // Longest first within a token, then keep the first of each token.
        self.max_repeat
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        self.max_repeat.dedup_by_key(|e| e.0);
    }

    /// Step 4: each candidate with a repetition to extend, unless it is a whole breaker by
    /// itself, loses `multiplier * base^(len - allowed_length)`, the exponent clamped to
    /// `(int)(FLOAT_MAX_LOG / logf(base))` when `base > 1.000001`.
    fn penalize(&self, cands: &mut [Cand]) {
        let max_exponent = if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as i32
        } else {
            0
        };
        for c in cands.iter_mut() {
            let Ok(at) = self.max_repeat.binary_search_by_key(&c.id, |e| e.0) else {
                continue;
            };
            if self.breakers.is_single_token(c.id) {
                continue;
            }
            // The window holds at most `i32::MAX` tokens (llama.cpp's is an int too).
            let len = self.max_repeat[at].1.min(i32::MAX as usize) as i32;
            // Wrapping, as llama.cpp's int subtraction does on its targets (a huge negative
            // `allowed_length`).
            let mut exp = len.wrapping_sub(self.allowed_length);
            if max_exponent > 0 && exp > max_exponent {
                exp = max_exponent;
            }
            let penalty = (self.multiplier as f64 * (self.base as f64).powf(exp as f64)) as f32;
            c.logit -= penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candidates `0..probs.len()` with `logit = logf(p)`, as test-sampling.cpp's
    /// `sampler_tester` makes them.
    fn cands_of(probs: &[f32]) -> Vec<Cand> {
        let ids = 0..probs.len() as u32;
        ids.zip(probs)
            .map(|(id, &p)| Cand {
                id,
                logit: p.ln(),
                p,
            })
            .collect()
    }

    /// The probabilities of `cands` in their order (the softmax of the `dist` sampler that
    /// test-sampling.cpp applies after DRY).
    fn softmax(cands: &[Cand]) -> Vec<f32> {
        let max = cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let e: Vec<f32> = cands.iter().map(|c| (c.logit - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }

    fn dry(mult: f32, base: f32, allowed: i32, last_n: i32, breakers: &[Vec<u32>]) -> Dry {
        let b = Arc::new(DryBreakers::from_token_sequences(breakers));
        Dry::new(mult, base, allowed, last_n, 4096, b)
    }

    /// The logits of candidates `0..n_cands` (all 0) after `tokens` and DRY.
    fn logits_after(d: &mut Dry, tokens: &[u32], n_cands: u32) -> Vec<f32> {
        for &t in tokens {
            d.accept(t);
        }
        let mut c: Vec<Cand> = (0..n_cands)
            .map(|id| Cand {
                id,
                logit: 0.0,
                p: 0.0,
            })
            .collect();
        d.apply(&mut c);
        c.iter().map(|c| c.logit).collect()
    }

    /// test-sampling.cpp's `test_dry` cases, with their expected probabilities.
    #[test]
    fn llama_cpp_test_sampling_cases() {
        type Case = (
            &'static [f32],
            &'static [u32],
            &'static [f32],
            f32,
            f32,
            i32,
            i32,
            &'static [&'static [u32]],
        );
        let cases: [Case; 5] = [
            (&[0.25; 4], &[0, 1], &[0.25; 4], 1.0, 1.1, 2, 4, &[]),
            (
                &[0.25; 4],
                &[0, 1, 2, 0, 1],
                &[0.296923, 0.296923, 0.109232, 0.296923],
                1.0,
                1.1,
                2,
                5,
                &[],
            ),
            (
                &[0.2; 5],
                &[0, 1, 3, 4, 0, 1],
                &[0.2; 5],
                1.0,
                1.1,
                2,
                6,
                &[&[3]],
            ),
            (
                &[0.2; 5],
                &[0, 1, 2, 0, 1],
                &[0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
                2.0,
                1.1,
                2,
                5,
                &[],
            ),
            (
                &[0.2; 5],
                &[0, 1, 2, 3, 4, 0, 1],
                &[0.2; 5],
                1.0,
                1.1,
                4,
                7,
                &[],
            ),
        ];
        for (i, (probs, last, want, mult, base, allowed, last_n, brk)) in cases.iter().enumerate() {
            let brk: Vec<Vec<u32>> = brk.iter().map(|b| b.to_vec()).collect();
            let mut d = dry(*mult, *base, *allowed, *last_n, &brk);
            for &t in last.iter() {
                d.accept(t);
            }
            let mut c = cands_of(probs);
            d.apply(&mut c);
            let got = softmax(&c);
            for (g, w) in got.iter().zip(want.iter()) {
                assert!((g - w).abs() < 1e-5, "case {i}: {got:?}, want {want:?}");
            }
        }
    }

    /// A breaker of several tokens counts only where its tail follows its head, and bounds
    /// repetitions to what comes after it; a token that is a breaker by itself is never
    /// penalized.
    #[test]
    fn breakers_bound_repetitions() {
        // "5 6 7 8" repeats and would continue with 2: length 4.
        let tokens = [5, 6, 7, 8, 2, 5, 6, 7, 8];
        let penalty_of_2 = |allowed: i32, brk: &[Vec<u32>]| {
            -logits_after(&mut dry(1.0, 2.0, allowed, 100, brk), &tokens, 10)[2]
        };
        assert_eq!(penalty_of_2(2, &[]), 4.0);
        // "5 6" ends 2 tokens before the end: repetitions are at most 2 long.
        assert_eq!(penalty_of_2(2, &[vec![5, 6]]), 1.0);
        // "5 9" never occurs.
        assert_eq!(penalty_of_2(2, &[vec![5, 9]]), 4.0);
        // Of the tails of one head that match, the longest counts: "6 7 8" leaves nothing.
        assert_eq!(penalty_of_2(0, &[vec![6, 7]]), 2.0);
        assert_eq!(penalty_of_2(0, &[vec![6, 7], vec![6, 7, 8]]), 1.0);
        assert_eq!(penalty_of_2(0, &[vec![6, 7, 8], vec![6, 7]]), 1.0);
        // The most recent head that matches counts: "8 2" cannot match at the very end,
        // and "7 8" stops every repetition.
        assert_eq!(penalty_of_2(2, &[vec![8, 2], vec![5, 6]]), 1.0);
        assert_eq!(penalty_of_2(2, &[vec![7, 8], vec![5, 6]]), 0.0);
        // 2 is a breaker by itself: never penalized...
        assert_eq!(penalty_of_2(2, &[vec![2]]), 0.0);
        assert_eq!(penalty_of_2(2, &[vec![2, 5], vec![2]]), 0.0);
        // ... but heading only longer breakers does not exempt it ("2 5" bounds the
        // repetition to 3 tokens; "2 9" does not occur).
        assert_eq!(penalty_of_2(2, &[vec![2, 5]]), 2.0);
        assert_eq!(penalty_of_2(2, &[vec![2, 9]]), 4.0);
    }

    /// Only the last `penalty_last_n` tokens count; -1 is `n_ctx`.
    #[test]
    fn window_is_the_last_n_tokens() {
        let tokens = [0, 1, 2, 0, 1];
        assert_eq!(
            logits_after(&mut dry(1.0, 2.0, 2, 5, &[]), &tokens, 3)[2],
            -1.0
        );
        assert_eq!(
            logits_after(&mut dry(1.0, 2.0, 2, 4, &[]), &tokens, 3),
            [0.0; 3]
        );
        let b = Arc::new(DryBreakers::default());
        let mut ctx5 = Dry::new(1.0, 2.0, 2, -1, 5, b.clone());
        assert_eq!(logits_after(&mut ctx5, &tokens, 3)[2], -1.0);
        let mut ctx4 = Dry::new(1.0, 2.0, 2, -1, 4, b);
        assert_eq!(logits_after(&mut ctx4, &tokens, 3), [0.0; 3]);
    }

    /// llama.cpp's `llama_sampler_init_dry` makes an empty sampler for these.
    #[test]
    fn inactive_settings_change_nothing() {
        let b = Arc::new(DryBreakers::default());
        for (mult, base, last_n, n_ctx) in [
            (0.0, 1.75, 64, 64),
            (0.8, 0.99, 64, 64),
            (0.8, f32::NAN, 64, 64),
            (0.8, 1.75, 0, 64),
            (0.8, 1.75, -2, 64),
            (0.8, 1.75, -1, 0),
        ] {
            let mut d = Dry::new(mult, base, 2, last_n, n_ctx, b.clone());
            assert!(!d.active(), "{mult} {base} {last_n} {n_ctx}");
            assert_eq!(logits_after(&mut d, &[0, 1, 2, 0, 1], 3), [0.0; 3]);
        }
        assert!(Dry::new(0.8, 1.0, 2, -1, 1, b).active());
    }

    /// The exponent stops at `(int)(88.7228391f / logf(base))`, so that the penalty stays
    /// finite.
    #[test]
    fn exponent_is_clamped() {
        // Token 0 would extend "0 1 2" (length 3); with base 1e30 the clamp is 1.
        let l = logits_after(&mut dry(1.0, 1e30, 0, 100, &[]), &[0, 1, 2, 0, 1, 2], 3);
        assert_eq!(l[0], -1e30);
        // At or below base 1.000001 there is no clamp (and base^exp is at most ~1).
        let l = logits_after(&mut dry(1.0, 1.0, 0, 100, &[]), &[0, 1, 2, 0, 1, 2], 3);
        assert_eq!(l, [-1.0; 3]);
    }

    /// A small deterministic generator for the comparison with the naive reference.
    struct XorShift(u64);
    impl XorShift {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// DRY's penalties computed the slow, obvious way, in forward order: `None` for
    /// candidates it leaves alone.
    fn naive_penalties(
        history: &[u32],
        (mult, base, allowed, last_n): (f32, f32, i32, usize),
        breakers: &[Vec<u32>],
        n_cands: u32,
    ) -> Vec<Option<f32>> {
        let w = &history[history.len().saturating_sub(last_n)..];
        let n = w.len();
        let mut out = vec![None; n_cands as usize];
        if n as i64 <= allowed as i64 {
            return out;
        }
        // The breaker occurrence with the latest start (then the longest) bounds repeats to
        // the tokens after it.
        let mut limit = n;
        'found: for start in (0..n).rev() {
            let mut best: Option<usize> = None;
            for b in breakers {
                if w[start..].starts_with(b) {
                    best = best.max(Some(b.len()));
                }
            }
            if let Some(len) = best {
                limit = n - start - len;
                break 'found;
            }
        }
        if (limit as i64) < allowed as i64 {
            return out;
        }
        let mut longest = std::collections::HashMap::new();
        for j in 0..n - 1 {
            // Common suffix of w[..=j] and w.
            let mut len = 0;
            while len <= j && w[j - len] == w[n - 1 - len] {
                len += 1;
            }
            let len = len.min(limit);
            if len as i64 >= allowed as i64 {
                let e = longest.entry(w[j + 1]).or_insert(len);
                *e = (*e).max(len);
            }
        }
        let max_exp = if base > 1.000_001 {
            (88.722_84f32 / base.ln()) as i32
        } else {
            0
        };
        for (&tok, &len) in &longest {
            if tok >= n_cands || breakers.iter().any(|b| b == &[tok]) {
                continue;
            }
            let mut e = len as i32 - allowed;
            if max_exp > 0 && e > max_exp {
                e = max_exp;
            }
            out[tok as usize] = Some((mult as f64 * (base as f64).powf(e as f64)) as f32);
        }
        out
    }

    /// After every token of random histories over a small alphabet, with random breakers and
    /// settings, DRY penalizes exactly what the naive reference does, bit for bit.
    #[test]
    fn matches_naive_reference() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut penalized = 0;
        for _ in 0..400 {
            let alphabet = 2 + rng.below(5) as u32;
            let len = rng.below(60) as usize;
            let history: Vec<u32> = (0..len)
                .map(|_| rng.below(alphabet as u64) as u32)
                .collect();
            let breakers: Vec<Vec<u32>> = (0..rng.below(4))
                .map(|_| {
                    (0..1 + rng.below(3))
                        .map(|_| rng.below(alphabet as u64) as u32)
                        .collect()
                })
                .collect();
            let mult = [0.5f32, 0.8, 1.3, 2.0][rng.below(4) as usize];
            let base = [1.0f32, 1.0137, 1.75, 3.0, 1e20][rng.below(5) as usize];
            let allowed = rng.below(6) as i32 - 1;
            let last_n = 1 + rng.below(50) as usize;
            let mut d = dry(mult, base, allowed, last_n as i32, &breakers);
            for (i, &t) in history.iter().enumerate() {
                d.accept(t);
                let mut c: Vec<Cand> = (0..alphabet)
                    .rev()
                    .map(|id| Cand {
                        id,
                        logit: 0.5,
                        p: 0.0,
                    })
                    .collect();
                d.apply(&mut c);
                let want = naive_penalties(
                    &history[..=i],
                    (mult, base, allowed, last_n),
                    &breakers,
                    alphabet,
                );
                for c in &c {
                    let w = want[c.id as usize].map_or(0.5, |p| 0.5 - p);
                    assert_eq!(
                        c.logit.to_bits(),
                        w.to_bits(),
                        "token {} after {:?} (breakers {breakers:?}, mult {mult}, base {base}, \
                         allowed {allowed}, last_n {last_n}): {} want {w}",
                        c.id,
                        &history[..=i],
                        c.logit
                    );
                    penalized += (w != 0.5) as usize;
                }
            }
        }
        assert!(
            penalized > 1000,
            "the cases penalize too little: {penalized}"
        );
    }

    /// A breaker text is a C string cut to 40 bytes.
    #[test]
    fn breaker_texts_are_cut_like_llama_cpp() {
        assert!(BreakerText::new(b"").is_none());
        assert!(BreakerText::new(b"\0abc").is_none());
        assert_eq!(
            BreakerText::new(b"ab\0cd").map(|b| b.bytes),
            Some(b"ab".to_vec())
        );
        let long = [b'x'; 50];
        assert_eq!(BreakerText::new(&long).map(|b| b.bytes.len()), Some(40));
    }

    fn smollm2_vocab() -> Option<Vocab> {
        let path = modelc_tests::smollm2()?;
        let file = ir::gguf::GgufFile::open(&path).expect("SmolLM2 opens");
        Some(Vocab::from_gguf(&file).expect("SmolLM2's vocabulary loads"))
    }

    fn default_breakers() -> Vec<String> {
        ["\n", ":", "\"", "*"].map(String::from).to_vec()
    }

    /// On SmolLM2, the newline token (198) is a breaker by itself, as are the tokens that
    /// contain one of the default breakers; plain words are not.
    #[test]
    fn smollm2_default_breakers() {
        let Some(vocab) = smollm2_vocab() else {
            return;
        };
        let t = std::time::Instant::now();
        let b = DryBreakers::new(&vocab, &default_breakers());
        eprintln!(
            "DryBreakers::new (SmolLM2, default breakers): {:?}",
            t.elapsed()
        );
        let nl = vocab.tokenize("\n", false, false);
        assert_eq!(nl, [198]);
        assert!(b.is_single_token(198));
        for text in [":", "\"", "*", "\n\n"] {
            let ids = vocab.tokenize(text, false, false);
            assert_eq!(ids.len(), 1, "{text:?}");
            assert!(b.is_single_token(ids[0]), "{text:?}");
        }
        let word = vocab.tokenize(" cat", false, false);
        assert_eq!(word.len(), 1);
        assert_eq!(b.tails(word[0]).count(), 0);
    }

    /// On SmolLM2, DRY lowers exactly the logits llama.cpp 0c1e570 lowers, bit for bit:
    /// llama.cpp's `llama_sampler_init_dry` on the model's vocabulary, the tokens accepted,
    /// then applied to every token at logit 0 (the texts tokenized by llama.cpp).
    #[test]
    fn smollm2_matches_llama_cpp() {
        let Some(vocab) = smollm2_vocab() else {
            return;
        };
        struct Case {
            // What the tokens say (documentation only).
            _text: &'static str,
            breakers: &'static [&'static str],
            settings: (f32, f32, i32, i32),
            tokens: &'static [u32],
            /// `(token, logit bits)` of every lowered logit.
            lowered: &'static [(u32, u32)],
        }
        const DEFAULT: &[&str] = &["\n", ":", "\"", "*"];
        const DIGITS: &[u32] = &[
            96, 7329, 412, 262, 216, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 33, 34, 35, 36,
            37, 38, 39, 40, 41, 32, 33, 34, 273, 7329, 412, 262, 216, 32, 33, 34, 35, 36, 37, 38,
            39, 40, 41, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 33, 34, 273, 7329, 412, 262,
        ];
        let cases = [
            Case {
                _text: "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
                breakers: DEFAULT,
                settings: (0.8, 1.75, 2, 64),
                tokens: &[
                    504, 2644, 2643, 335, 260, 1171, 30, 378, 2644, 2643, 335, 260, 1171, 30, 378,
                    2644, 2643, 335, 260,
                ],
                lowered: &[(1171, 0xc2f64c83)],
            },
            Case {
                _text: "one two three four five\none two three four five\none two three",
                breakers: DEFAULT,
                settings: (0.8, 1.75, 2, 64),
                tokens: &[
                    537, 827, 1296, 1876, 2531, 198, 537, 827, 1296, 1876, 2531, 198, 537, 827,
                    1296,
                ],
                lowered: &[(1876, 0xbfb33333)],
            },
            Case {
                // " Answer" ends with a start of "Answer:": it heads the tail ":".
                _text: "red green blue Answer: red green blue Answer: red green blue",
                breakers: &["Answer:"],
                settings: (0.8, 1.75, 2, 64),
                tokens: &[
                    455, 2654, 4461, 19842, 42, 2382, 2654, 4461, 19842, 42, 2382, 2654, 4461,
                ],
                lowered: &[(19842, 0xbfb33333)],
            },
            Case {
                _text: "red green blue Answer: red green blue Answer: red green blue",
                breakers: &[],
                settings: (0.8, 1.75, 2, 64),
                tokens: &[
                    455, 2654, 4461, 19842, 42, 2382, 2654, 4461, 19842, 42, 2382, 2654, 4461,
                ],
                lowered: &[(19842, 0xc1521667)],
            },
            Case {
                _text: "alpha beta gamma delta alpha beta gamma delta epsilon zeta eta alpha beta \
                        gamma",
                breakers: DEFAULT,
                settings: (1.3, 1.1, 1, 12),
                tokens: &[
                    13433, 11345, 16439, 15184, 11189, 11345, 16439, 15184, 35592, 1892, 8810,
                    1482, 81, 11189, 11345, 16439,
                ],
                lowered: &[(15184, 0xbfc95810)],
            },
            Case {
                // The first breaker is cut to 40 bytes; "…" splits into byte tokens.
                _text:
                    "x … = 1; The quick brown fox jumps over the lazy dog again and again… (twice \
                        more, the last cut after \"lazy\")",
                breakers: &[
                    "The quick brown fox jumps over the lazy dog again and again…",
                    "fox ju",
                    "…",
                ],
                settings: (2.0, 3.0, 3, 200),
                tokens: &[
                    104, 5548, 446, 216, 33, 43, 378, 2365, 6354, 16438, 27003, 690, 260, 23790,
                    2767, 1163, 284, 1163, 2829, 378, 2365, 6354, 16438, 27003, 690, 260, 23790,
                    2767, 1163, 284, 1163, 2829, 378, 2365, 6354, 16438, 27003, 690, 260, 23790,
                ],
                lowered: &[(2767, 0xc3f30000)],
            },
            Case {
                // Base 100: the exponent 25 is clamped to 19.
                _text: "a b c … z a b c … y",
                breakers: &["zz"],
                settings: (1.5, 100.0, 0, 1000),
                tokens: &[
                    81, 278, 265, 287, 297, 275, 310, 294, 2056, 544, 501, 303, 283, 304, 263, 273,
                    7329, 412, 262, 252, 326, 386, 267, 1792, 329, 1892, 253, 278, 265, 287, 297,
                    275, 310, 294, 2056, 544, 501, 303, 283, 304, 263, 273, 7329, 412, 262, 252,
                    326, 386, 267, 1792, 329,
                ],
                lowered: &[
                    (252, 0xbfc00000),
                    (253, 0xbfc00000),
                    (262, 0xbfc00000),
                    (263, 0xbfc00000),
                    (265, 0xbfc00000),
                    (267, 0xbfc00000),
                    (273, 0xbfc00000),
                    (275, 0xbfc00000),
                    (278, 0xbfc00000),
                    (283, 0xbfc00000),
                    (287, 0xbfc00000),
                    (294, 0xbfc00000),
                    (297, 0xbfc00000),
                    (303, 0xbfc00000),
                    (304, 0xbfc00000),
                    (310, 0xbfc00000),
                    (326, 0xbfc00000),
                    (329, 0xbfc00000),
                    (386, 0xbfc00000),
                    (412, 0xbfc00000),
                    (501, 0xbfc00000),
                    (544, 0xbfc00000),
                    (1792, 0xbfc00000),
                    (1892, 0xfee1b1e6),
                    (2056, 0xbfc00000),
                    (7329, 0xbfc00000),
                ],
            },
            Case {
                // 0.8 * 1.0137^4 in double is 0xbf58417c negated; powf in f32 gives ...7b.
                _text: "x red green blue yellow purple red green blue yellow",
                breakers: &["zz"],
                settings: (0.8, 1.0137, 0, 64),
                tokens: &[104, 2382, 2654, 4461, 5724, 14230, 2382, 2654, 4461, 5724],
                lowered: &[
                    (2382, 0xbf4ccccd),
                    (2654, 0xbf4ccccd),
                    (4461, 0xbf4ccccd),
                    (5724, 0xbf4ccccd),
                    (14230, 0xbf58417c),
                ],
            },
            Case {
                // Token "0" heads the next 20 digits (the tail is cut to 20 tokens), which
                // occur in the text; the whole 39-digit tail would not.
                _text: "p q r s 01234567890123456789012 p q r s 01234567890123456789012 p q r s",
                breakers: &["0123456789012345678901234567890123456789"],
                settings: (0.8, 1.75, 2, 64),
                tokens: DIGITS,
                lowered: &[(216, 0xc0f0199a)],
            },
            Case {
                _text: "p q r s 01234567890123456789012 p q r s 01234567890123456789012 p q r s",
                breakers: &[],
                settings: (0.8, 1.75, 2, 64),
                tokens: DIGITS,
                lowered: &[(216, 0xcb085e4a)],
            },
            Case {
                _text:
                    "He said: \"Stop it.\" She said: \"Stop it now.\" *He said:* \"Stop it now.\" \
                        She said: \"Stop it",
                breakers: DEFAULT,
                settings: (0.8, 1.75, 2, 64),
                tokens: &[
                    3681, 1137, 42, 476, 25725, 357, 1270, 2306, 1137, 42, 476, 25725, 357, 1209,
                    1270, 1672, 3681, 1137, 15709, 476, 25725, 357, 1209, 1270, 2306, 1137, 42,
                    476, 25725, 357,
                ],
                lowered: &[(1209, 0xbf4ccccd)],
            },
        ];
        let n_vocab = vocab.n_vocab() as u32;
        for case in &cases {
            let texts: Vec<String> = case.breakers.iter().map(|s| s.to_string()).collect();
            let breakers = Arc::new(DryBreakers::new(&vocab, &texts));
            let (mult, base, allowed, last_n) = case.settings;
            let mut d = Dry::new(mult, base, allowed, last_n, 4096, breakers);
            let logits = logits_after(&mut d, case.tokens, n_vocab);
            let lowered: Vec<(u32, u32)> = (0..n_vocab)
                .zip(&logits)
                .filter(|(_, &l)| l != 0.0)
                .map(|(id, l)| (id, l.to_bits()))
                .collect();
            assert_eq!(lowered, case.lowered, "{:?}", case._text);
        }
    }
}
