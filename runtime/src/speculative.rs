//! Speculative decoding: draft tokens proposed cheaply and verified by the target model in
//! one multi-token step ([`crate::generate::Generation`]). Drafts come from the conversation's
//! own tokens (llama.cpp's `--spec-type ngram-simple`, `common/ngram-map.cpp`: this module) or
//! from a smaller draft model (`-md`, `draft-simple`: [`draft`]); both are [`Drafter`]s.
//!
//! The n-gram draft: the last `size_n` tokens (the history's last `size_n - 1` and the token just
//! sampled) are looked for earlier in the history, latest match first; the up to `size_m`
//! tokens that followed the match are the draft. Verification feeds each drafted position's
//! logits to the sampler in order and keeps a drafted token while the sampler picks it, so
//! the output is the one decoding without speculation gives (greedy: token for token); the
//! KV cache is truncated past the first rejected position.

use crate::tokenizer::TokenId;

pub mod draft;

/// What proposes drafts for a generation to verify.
pub trait Drafter {
    /// Up to `n_max` tokens likely to follow `history` (the tokens the target's sequence
    /// holds) and `sampled` (the token chosen after them, not yet evaluated); empty for no
    /// draft.
    ///
    /// # Errors
    /// An engine error of a draft model.
    fn draft(
        &mut self,
        history: &[TokenId],
        sampled: TokenId,
        n_max: usize,
    ) -> anyhow::Result<Vec<TokenId>>;
}

/// llama.cpp's `--spec-type` names that modelc implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecType {
    /// No speculation (llama.cpp's default `none`).
    None,
    /// `ngram-simple`: prompt lookup from the history ([`ngram_simple_draft`]).
    NgramSimple,
    /// `draft-simple`: a draft model (`-md`, [`draft::DraftModel`]).
    DraftSimple,
}

impl SpecType {
    /// The type named `name` as llama.cpp spells it.
    ///
    /// # Errors
    /// A name modelc does not implement (the draft-model and other n-gram kinds of
    /// llama.cpp) or does not know, as one line listing what it takes.
    pub fn from_name(name: &str) -> Result<SpecType, String> {
        match name.trim() {
            "none" => Ok(SpecType::None),
            "ngram-simple" => Ok(SpecType::NgramSimple),
            "draft-simple" => Ok(SpecType::DraftSimple),
            n @ ("draft-eagle3" | "draft-mtp" | "draft-dflash"
            | "draft-dspark" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod"
            | "ngram-cache") => Err(format!(
                "--spec-type {n}: not supported by modelc (it has none, ngram-simple and draft-simple)"
            )),
            n => Err(format!(
                "--spec-type {n}: unknown type (modelc has none, ngram-simple and draft-simple)"
            )),
        }
    }
}

/// Settings of n-gram speculation, with llama.cpp's defaults
/// (`common_params_speculative_ngram_map`: `size_n` 12, `size_m` 48).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramParams {
    /// Length of the n-gram looked up (`--spec-ngram-simple-size-n`), at least 1.
    pub size_n: usize,
    /// Most tokens drafted (`--spec-ngram-simple-size-m`), at least 1.
    pub size_m: usize,
}

impl Drafter for NgramParams {
    fn draft(
        &mut self,
        history: &[TokenId],
        sampled: TokenId,
        n_max: usize,
    ) -> anyhow::Result<Vec<TokenId>> {
        let mut d = ngram_simple_draft(self, history, sampled);
        d.truncate(n_max);
        Ok(d)
    }
}

impl Default for NgramParams {
    fn default() -> Self {
        NgramParams {
            size_n: 12,
            size_m: 48,
        }
    }
}

/// The draft after `history` (the tokens evaluated so far) and `sampled` (the token chosen
/// after them, not yet evaluated), as llama.cpp's `common_ngram_simple_draft`: empty when the
/// history is not longer than `size_n + size_m + 1` tokens, when the pattern (the last
/// `size_n - 1` tokens of the history and `sampled`) occurs nowhere in it after position 0,
/// or when fewer than `size_n` tokens follow the latest occurrence; else the tokens after the
/// latest occurrence, at most `size_m` of them.
pub fn ngram_simple_draft(p: &NgramParams, history: &[TokenId], sampled: TokenId) -> Vec<TokenId> {
    let (n, m) = (p.size_n.max(1), p.size_m.max(1));
    let len = history.len();
    if len <= n + m + 1 {
        return Vec::new();
    }
    let mut pattern = history[len - n + 1..].to_vec();
    pattern.push(sampled);
    // Latest first, skipping where the pattern stands now; position 0 never matches (as
    // llama.cpp, which uses 0 for "no match").
    let Some(at) = (1..len - n)
        .rev()
        .find(|&j| history[j..j + n] == pattern[..])
    else {
        return Vec::new();
    };
    let copy = m.min(len - (at + n));
    if copy < n {
        return Vec::new();
    }
    history[at + n..at + n + copy].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: NgramParams = NgramParams {
        size_n: 2,
        size_m: 3,
    };

    /// The latest earlier occurrence of the pattern gives the draft; what follows it is cut
    /// at `size_m`.
    #[test]
    fn drafts_what_followed_the_latest_match() {
        // pattern [9, 5]: at 1 (followed by 6 7 8 1) and at 6 (followed by 2 3 4).
        let h = [0, 9, 5, 6, 7, 8, 9, 5, 2, 3, 4, 0, 9];
        assert_eq!(ngram_simple_draft(&P, &h, 5), vec![2, 3, 4]);
    }

    /// No draft: history too short, no match, a match at position 0 only, or fewer than
    /// `size_n` tokens after the match.
    #[test]
    fn no_draft_where_llama_cpp_has_none() {
        assert!(ngram_simple_draft(&P, &[1, 2, 3, 4, 5, 1], 2).is_empty());
        let h = [0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(ngram_simple_draft(&P, &h, 42).is_empty());
        let h = [8, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(ngram_simple_draft(&P, &h, 1).is_empty(), "match at 0");
        // [7, 8] at 7 is followed by one token only.
        let h = [0, 1, 2, 3, 4, 5, 6, 7, 8, 7];
        assert!(ngram_simple_draft(&P, &h, 8).is_empty());
        let h = [0, 1, 2, 3, 7, 8, 9, 4, 5, 7];
        assert_eq!(ngram_simple_draft(&P, &h, 8), vec![9, 4, 5]);
    }

    #[test]
    fn names_as_llama_cpp() {
        assert_eq!(
            SpecType::from_name("ngram-simple"),
            Ok(SpecType::NgramSimple)
        );
        assert_eq!(SpecType::from_name("none"), Ok(SpecType::None));
        assert!(SpecType::from_name("ngram-mod")
            .unwrap_err()
            .contains("not supported"));
        assert!(SpecType::from_name("bogus")
            .unwrap_err()
            .contains("unknown"));
    }
}
