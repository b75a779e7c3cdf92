//! Splitting raw text around special-token texts before tokenization (llama.cpp
//! `tokenizer_st_partition`).
//!
//! The candidate tokens are every control, user-defined and unknown token, longest text first
//! (equal lengths: lower id first). With `parse_special` off, control and unknown tokens are
//! skipped, so only user-defined tokens are matched (as Hugging Face does). Tokens are applied
//! one after another: each splits every remaining text fragment at all its non-overlapping
//! occurrences, left to right. A token with the `LSTRIP` / `RSTRIP` attribute also removes
//! ASCII white space (`isspace`) to its left / right.
//!
//! An Aho-Corasick pass first finds which candidate texts occur at all, so a vocabulary with
//! thousands of special tokens costs one scan of the text, not one per token.

use super::vocab::{TokenData, Vocab};
use super::{TokenAttr, TokenId};
use aho_corasick::AhoCorasick;
use std::ops::Range;

/// A piece of the text after partitioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text, a byte range of the input.
    Text(Range<usize>),
    /// A special token matched in the text.
    Token(TokenId),
}

/// The special-token candidates of a vocabulary and a matcher over their texts.
#[derive(Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// Candidate ids, longest text first.
    ids: Vec<TokenId>,
    /// Attributes of each candidate (same order).
    attrs: Vec<TokenAttr>,
    /// Texts of each candidate (same order).
    texts: Vec<Box<str>>,
    ac: Option<AhoCorasick>,
}

impl SpecialMatcher {
    pub(crate) fn new(tokens: &[TokenData]) -> SpecialMatcher {
        let mask = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut ids: Vec<TokenId> = (0..tokens.len() as TokenId)
            .filter(|&id| tokens[id as usize].attr.contains(mask))
            .collect();
        ids.sort_by(|&a, &b| {
            tokens[b as usize]
                .text
                .len()
                .cmp(&tokens[a as usize].text.len())
        });
        let texts: Vec<Box<str>> = ids
            .iter()
            .map(|&id| tokens[id as usize].text.as_str().into())
            .collect();
        let ac = AhoCorasick::new(texts.iter().map(|t| t.as_bytes())).ok();
        let attrs = ids.iter().map(|&id| tokens[id as usize].attr).collect();
        SpecialMatcher {
            ids,
            attrs,
            texts,
            ac,
        }
    }

    /// Re-reads the attributes after later adjustments (LSTRIP / RSTRIP).
    pub(crate) fn refresh_attrs(&mut self, tokens: &[TokenData]) {
        self.attrs = self
            .ids
            .iter()
            .map(|&id| tokens[id as usize].attr)
            .collect();
    }

    pub(crate) fn ids(&self) -> &[TokenId] {
        &self.ids
    }
}

/// `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits `text` (non-empty) into raw-text fragments and special tokens.
pub(crate) fn partition(vocab: &Vocab, text: &[u8], parse_special: bool) -> Vec<Fragment> {
    let sm = &vocab.special;
    let mut frags = vec![Fragment::Text(0..text.len())];
    let Some(ac) = &sm.ac else { return frags };
    let skip = TokenAttr::CONTROL | TokenAttr::UNKNOWN;
    let mut present = vec![false; sm.ids.len()];
    let mut any = false;
    for m in ac.find_overlapping_iter(text) {
        let i = m.pattern().as_usize();
        if parse_special || !sm.attrs[i].contains(skip) {
            present[i] = true;
            any = true;
        }
    }
    if !any {
        return frags;
    }
    let bytes = text;
    for (i, &id) in sm.ids.iter().enumerate() {
        if !present[i] {
            continue;
        }
        let needle = sm.texts[i].as_bytes();
        let finder = memchr::memmem::Finder::new(needle);
        let lstrip = sm.attrs[i].contains(TokenAttr::LSTRIP);
        let rstrip = sm.attrs[i].contains(TokenAttr::RSTRIP);
        let mut next = Vec::with_capacity(frags.len() + 2);
        for frag in frags {
            let Fragment::Text(r) = frag else {
                next.push(frag);
                continue;
            };
            let (mut base, end) = (r.start, r.end);
            loop {
                let Some(off) = finder.find(&bytes[base..end]) else {
                    if end > base {
                        next.push(Fragment::Text(base..end));
                    }
                    break;
                };
                let m = base + off;
                let mut left_end = m;
                if lstrip {
                    while left_end > base && is_c_space(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > base {
                    next.push(Fragment::Text(base..left_end));
                }
                next.push(Fragment::Token(id));
                let mut right = m + needle.len();
                if right >= end {
                    break;
                }
                if rstrip {
                    while right < end && is_c_space(bytes[right]) {
                        right += 1;
                    }
                }
                base = right;
            }
        }
        frags = next;
    }
    frags
}
