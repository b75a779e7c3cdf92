//! SentencePiece-style BPE over a whole text fragment (llama.cpp `llm_tokenizer_spm_session`).
//!
//! The (already escaped) text starts as one symbol per UTF-8 character. Every adjacent pair
//! whose concatenation is a vocabulary token is a candidate; the candidate whose token has the
//! highest score is merged first (ties: leftmost first), with a priority queue, until no
//! candidate is left. A final symbol that is a token becomes it; a single character that is
//! not falls back to one byte token per UTF-8 byte (`<0xNN>`, or the one-byte text itself).
//!
//! Bytes that are not UTF-8 are cut as llama.cpp cuts them: a symbol is as long as its first
//! byte announces ([`super::unicode::llama_utf8_len`], at most the bytes left); a symbol that
//! is not one valid character is in no token, so it never merges and falls back to its bytes
//! (`▁` then `E6 AD`: `29871 233 176` on llama-spm). Valid runs between such symbols merge
//! as usual ([`SpmSession::encode_bytes`]).
//!
//! Speed without changing the result: a merged symbol is always a token, so two adjacent
//! characters that appear next to each other in no token can never end up in one symbol.
//! The text is cut at every such pair ([`PairSet`]) and the pieces are merged independently
//! (the order of merges inside a piece is the same as in the whole text); repeated pieces
//! (words) are encoded once per call.

use super::TokenId;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

#[derive(Clone, Copy, PartialEq)]
struct Bigram {
    score: f32,
    left: i32,
    right: i32,
    size: u32,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Max-heap order: higher score first, then smaller `left` first (llama.cpp
    /// `llm_bigram_spm::comparator`).
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The adjacent character pairs that occur inside some token.
#[derive(Debug, Default)]
pub struct PairSet {
    /// bit `b` of `ascii[a]`: the pair (a, b) of ASCII characters occurs
    ascii: Vec<u128>,
    other: FxHashSet<(char, char)>,
}

impl PairSet {
    /// Collects the pairs of every token text.
    pub fn new<'a>(texts: impl Iterator<Item = &'a str>) -> PairSet {
        let mut s = PairSet {
            ascii: vec![0; 128],
            other: FxHashSet::default(),
        };
        for t in texts {
            let mut prev = None;
            for c in t.chars() {
                if let Some(p) = prev {
                    s.insert(p, c);
                }
                prev = Some(c);
            }
        }
        s
    }

    fn insert(&mut self, a: char, b: char) {
        if a.is_ascii() && b.is_ascii() {
            self.ascii[a as usize] |= 1u128 << (b as u32);
        } else {
            self.other.insert((a, b));
        }
    }

    /// Whether some token holds `a` directly followed by `b`.
    #[inline]
    pub fn contains(&self, a: char, b: char) -> bool {
        if a.is_ascii() && b.is_ascii() {
            self.ascii[a as usize] & (1u128 << (b as u32)) != 0
        } else {
            self.other.contains(&(a, b))
        }
    }
}

/// What SPM needs from the vocabulary.
pub struct SpmContext<'a> {
    /// Token text → id.
    pub token_to_id: &'a FxHashMap<Box<str>, TokenId>,
    /// Score of each token.
    pub scores: &'a [f32],
    /// Byte fallback token of each byte (`<0xNN>` or the one-byte text), if any.
    pub byte_token: &'a [Option<TokenId>; 256],
    /// Emitted for a byte that has no byte token (llama.cpp would throw there).
    pub unk: Option<TokenId>,
    /// Character pairs found inside tokens; `None` merges each text whole (the plain
    /// algorithm, for checking the shortcut).
    pub pairs: Option<&'a PairSet>,
}

/// Reusable buffers and the per-call cache of encoded pieces.
#[derive(Default)]
pub struct SpmSession<'t> {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    cache: FxHashMap<&'t str, (u32, u32)>,
    arena: Vec<TokenId>,
}

/// Pieces longer than this are not cached.
const CACHE_MAX_LEN: usize = 64;

impl<'t> SpmSession<'t> {
    /// Appends the tokens of `text` (spaces already escaped to U+2581) to `out`.
    pub fn encode(&mut self, cx: &SpmContext<'_>, text: &'t str, out: &mut Vec<TokenId>) {
        let Some(pairs) = cx.pairs else {
            self.merge(cx, text, out);
            return;
        };
        let mut start = 0;
        let mut prev: Option<char> = None;
        for (i, c) in text.char_indices() {
            if let Some(p) = prev {
                if !pairs.contains(p, c) {
                    self.encode_piece(cx, &text[start..i], out);
                    start = i;
                }
            }
            prev = Some(c);
        }
        if start < text.len() {
            self.encode_piece(cx, &text[start..], out);
        }
    }

    /// Appends the tokens of `text` (spaces already escaped to U+2581), which may hold bytes
    /// that are not UTF-8 (module doc), to `out`.
    pub fn encode_bytes(&mut self, cx: &SpmContext<'_>, text: &'t [u8], out: &mut Vec<TokenId>) {
        let mut run = 0; // start of the current run of valid characters
        let mut i = 0;
        while i < text.len() {
            let len = super::unicode::llama_utf8_len(text[i]).min(text.len() - i);
            if std::str::from_utf8(&text[i..i + len]).is_ok() {
                i += len;
                continue;
            }
            if let Ok(valid) = std::str::from_utf8(&text[run..i]) {
                self.encode(cx, valid, out);
            }
            for &b in &text[i..i + len] {
                out.extend(cx.byte_token[usize::from(b)].or(cx.unk));
            }
            i += len;
            run = i;
        }
        if let Ok(valid) = std::str::from_utf8(&text[run..]) {
            self.encode(cx, valid, out);
        }
    }

    fn encode_piece(&mut self, cx: &SpmContext<'_>, piece: &'t str, out: &mut Vec<TokenId>) {
        if piece.len() > CACHE_MAX_LEN {
            self.merge(cx, piece, out);
            return;
        }
        if let Some(&(s, e)) = self.cache.get(piece) {
            out.extend_from_slice(&self.arena[s as usize..e as usize]);
            return;
        }
        let before = out.len();
        self.merge(cx, piece, out);
        let s = self.arena.len() as u32;
        self.arena.extend_from_slice(&out[before..]);
        self.cache.insert(piece, (s, self.arena.len() as u32));
    }

    /// The merge loop over one piece.
    fn merge(&mut self, cx: &SpmContext<'_>, text: &str, out: &mut Vec<TokenId>) {
        self.symbols.clear();
        self.queue.clear();
        let n = text.chars().count();
        self.symbols.reserve(n);
        for (i, (off, c)) in text.char_indices().enumerate() {
            let idx = i as i32;
            let next = if i + 1 == n { -1 } else { idx + 1 };
            self.symbols.push(Symbol {
                start: off as u32,
                len: c.len_utf8() as u32,
                prev: idx - 1,
                next,
            });
        }
        for i in 1..self.symbols.len() {
            self.try_add_bigram(cx, text, i as i32 - 1, i as i32);
        }
        while let Some(b) = self.queue.pop() {
            let (l, r) = (
                self.symbols[b.left as usize],
                self.symbols[b.right as usize],
            );
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            let ls = &mut self.symbols[b.left as usize];
            ls.len += r.len;
            ls.next = r.next;
            self.symbols[b.right as usize].len = 0;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = b.left;
            }
            let (prev, next) = (
                self.symbols[b.left as usize].prev,
                self.symbols[b.left as usize].next,
            );
            self.try_add_bigram(cx, text, prev, b.left);
            self.try_add_bigram(cx, text, b.left, next);
        }
        let mut i = if self.symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = self.symbols[i as usize];
            i = s.next;
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            if let Some(&id) = cx.token_to_id.get(piece) {
                out.push(id);
                continue;
            }
            for b in piece.bytes() {
                if let Some(id) = cx.byte_token[b as usize].or(cx.unk) {
                    out.push(id);
                }
            }
        }
    }

    fn try_add_bigram(&mut self, cx: &SpmContext<'_>, text: &str, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let piece = &text[l.start as usize..(l.start + l.len + r.len) as usize];
        let Some(&id) = cx.token_to_id.get(piece) else {
            return;
        };
        let Some(&score) = cx.scores.get(id as usize) else {
            return;
        };
        self.queue.push(Bigram {
            score,
            left,
            right,
            size: l.len + r.len,
        });
    }
}
