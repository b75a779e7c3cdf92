//! Speculative decoding with a draft model (llama.cpp's `--spec-type draft-simple`, `-md`,
//! `common/speculative.cpp` `common_speculative_impl_draft_simple`): a smaller model with the
//! target's vocabulary proposes the next few tokens greedily, and the target verifies them in
//! one step ([`crate::generate::Generation`]).
//!
//! The draft model keeps its own session whose one sequence mirrors the target's: before each
//! draft it is cut back to the longest prefix it shares with the target's tokens and fed the
//! rest, so rejected drafted tokens (and a context shift) never leave stale positions in it.
//! Each drafted token is the draft's most likely one; as llama.cpp's draft sampler (top-k 10,
//! then the distribution over those ten), drafting stops when that token's probability among
//! the ten most likely is below `p_min`, and a draft shorter than `n_min` is dropped.

use super::Drafter;
use crate::session::Session;
use crate::tokenizer::{TokenId, Vocab};

/// llama.cpp's draft-model settings (`common_params_speculative_draft`), with its defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftParams {
    /// Most tokens drafted per step (`--spec-draft-n-max`, default 3).
    pub n_max: usize,
    /// Drafts shorter than this are dropped (`--spec-draft-n-min`, default 0).
    pub n_min: usize,
    /// Drafting stops at a token whose probability among the draft's ten most likely is
    /// below this (`--spec-draft-p-min`, default 0: never).
    pub p_min: f32,
}

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams {
            n_max: 3,
            n_min: 0,
            p_min: 0.0,
        }
    }
}

/// How many of the draft's most likely tokens its probabilities are taken over (llama.cpp's
/// draft sampler is top-k 10).
const DRAFT_TOP_K: usize = 10;

/// llama.cpp checks token texts from this id on (`SPEC_VOCAB_CHECK_START_TOKEN_ID`).
const CHECK_START_TOKEN_ID: usize = 5;

/// The largest difference in vocabulary size llama.cpp allows between target and draft
/// (`SPEC_VOCAB_MAX_SIZE_DIFFERENCE`).
const MAX_VOCAB_SIZE_DIFFERENCE: usize = 128;

/// Whether a draft model's vocabulary can propose tokens for the target, as llama.cpp's
/// `common_speculative_are_compatible`: the same tokenizer type, the same BOS and EOS
/// handling, vocabulary sizes within 128 of each other, and the same text for every token
/// from id 5 up to the smaller size.
///
/// # Errors
/// The first difference found, as one line.
pub fn check_compatible(target: &Vocab, draft: &Vocab) -> Result<(), String> {
    if target.vocab_type() != draft.vocab_type() {
        return Err(format!(
            "the draft model's tokenizer ({:?}) is not the target's ({:?})",
            draft.vocab_type(),
            target.vocab_type()
        ));
    }
    if target.add_bos() != draft.add_bos() || (target.add_bos() && target.bos() != draft.bos()) {
        return Err(format!(
            "the draft model's BOS token must match the target's (add: {} - {}, id: {:?} - {:?})",
            target.add_bos(),
            draft.add_bos(),
            target.bos(),
            draft.bos()
        ));
    }
    if target.add_eos() != draft.add_eos() || (target.add_eos() && target.eos() != draft.eos()) {
        return Err(format!(
            "the draft model's EOS token must match the target's (add: {} - {}, id: {:?} - {:?})",
            target.add_eos(),
            draft.add_eos(),
            target.eos(),
            draft.eos()
        ));
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > MAX_VOCAB_SIZE_DIFFERENCE {
        return Err(format!(
            "the target's vocabulary has {nt} tokens and the draft's {nd}: more than {MAX_VOCAB_SIZE_DIFFERENCE} apart"
        ));
    }
    for id in CHECK_START_TOKEN_ID..nt.min(nd) {
        let id = id as TokenId;
        let (a, b) = (target.token_text(id), draft.token_text(id));
        if a != b {
            return Err(format!(
                "token {id} differs: the target's is {:?}, the draft's {:?}",
                a.unwrap_or(""),
                b.unwrap_or("")
            ));
        }
    }
    Ok(())
}

/// A draft model and its session (one sequence), proposing drafts for a target model.
pub struct DraftModel<'d> {
    session: Session<'d>,
    params: DraftParams,
    /// Tokens at or past this id are not the target's: drafting stops at one.
    n_vocab_target: usize,
    logits: Vec<f32>,
}

impl<'d> DraftModel<'d> {
    /// A drafter over `session` (the draft model's, one sequence, logits of the last row)
    /// for a target whose vocabulary has `n_vocab_target` tokens; check the vocabularies
    /// with [`check_compatible`] first.
    pub fn new(session: Session<'d>, params: DraftParams, n_vocab_target: usize) -> Self {
        DraftModel {
            session,
            params,
            n_vocab_target,
            logits: Vec::new(),
        }
    }

    /// The draft model's session.
    pub fn session(&self) -> &Session<'d> {
        &self.session
    }
}

impl Drafter for DraftModel<'_> {
    fn draft(
        &mut self,
        history: &[TokenId],
        sampled: TokenId,
        n_max: usize,
    ) -> anyhow::Result<Vec<TokenId>> {
        let n_max = n_max.min(self.params.n_max);
        // The drafted positions must fit the draft's context as the target's.
        if n_max == 0 || history.len() + n_max >= self.session.n_ctx() {
            return Ok(Vec::new());
        }
        let keep = crate::generate::common_prefix(self.session.tokens(0), history);
        self.session.truncate(0, keep);
        let mut feed = history[keep..].to_vec();
        feed.push(sampled);
        let out = self.session.eval(0, &feed, false)?;
        self.logits.clear();
        self.logits.extend_from_slice(out);
        let mut draft = Vec::with_capacity(n_max);
        loop {
            let (id, p) = most_likely(&self.logits);
            if p < self.params.p_min || id as usize >= self.n_vocab_target {
                break;
            }
            draft.push(id);
            if draft.len() >= n_max {
                break;
            }
            let out = self.session.eval(0, &[id], false)?;
            self.logits.clear();
            self.logits.extend_from_slice(out);
        }
        if draft.len() < self.params.n_min {
            draft.clear();
        }
        Ok(draft)
    }
}

/// The most likely token of `logits` (the lowest id among equals) and its probability
/// within the [`DRAFT_TOP_K`] most likely (llama.cpp's draft sampler: top-k, then a softmax
/// over what is left).
fn most_likely(logits: &[f32]) -> (TokenId, f32) {
    // The top logits, largest first (earlier ids first among equals); no allocation per
    // drafted token.
    let mut top = [f32::NEG_INFINITY; DRAFT_TOP_K];
    let mut id = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l <= top[DRAFT_TOP_K - 1] {
            continue;
        }
        let at = top.partition_point(|&t| t >= l);
        if at == 0 {
            id = i;
        }
        top.copy_within(at..DRAFT_TOP_K - 1, at + 1);
        top[at] = l;
    }
    let max = top[0];
    if max == f32::NEG_INFINITY {
        return (0, 0.0);
    }
    let sum: f32 = top.iter().map(|&l| (l - max).exp()).sum();
    (id as TokenId, 1.0 / sum)
}

#[cfg(test)]
mod tests {
    use super::most_likely;

    /// The top token wins, the lowest id among equals, and its probability is taken over
    /// the ten most likely only.
    #[test]
    fn most_likely_over_the_top_ten() {
        let mut l = vec![-100.0f32; 50];
        l[7] = 2.0;
        l[3] = 2.0;
        let (id, p) = most_likely(&l);
        assert_eq!(id, 3);
        // Two equal tops and eight at -100 (whose weight vanishes): one half each.
        assert!((p - 0.5).abs() < 1e-6, "{p}");
        let l: Vec<f32> = (0..20).map(|i| if i < 10 { 1.0 } else { 0.5 }).collect();
        let (id, p) = most_likely(&l);
        assert_eq!(id, 0);
        assert!((p - 0.1).abs() < 1e-6, "ten equal: {p}");
    }
}
