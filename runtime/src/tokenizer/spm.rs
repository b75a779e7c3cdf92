//! SentencePiece-style BPE over a whole text fragment (llama.cpp `llm_tokenizer_spm_session`).
//!
//! The (already escaped) text starts as one symbol per UTF-8 character. Every adjacent pair
//! whose concatenation is a vocabulary token is a candidate; the candidate whose token has the
//! highest score is merged first (ties: leftmost first), with a priority queue, until no
//! candidate is left. A final symbol that is a token becomes it; a single character that is
//! not falls back to one byte token per UTF-8 byte (`<0xNN>`, or the one-byte text itself).

use super::TokenId;
use rustc_hash::FxHashMap;
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
}

/// Reusable buffers.
#[derive(Default)]
pub struct SpmSession {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl SpmSession {
    /// Appends the tokens of `text` (spaces already escaped to U+2581) to `out`.
    pub fn encode(&mut self, cx: &SpmContext<'_>, text: &str, out: &mut Vec<TokenId>) {
        self.symbols.clear();
        self.queue.clear();
        let n = text.chars().count();
        self.symbols.reserve(n);
        for (i, (off, c)) in text.char_indices().enumerate() {
            let idx = i as i32;
            let next = if i + 1 == n { -1 } else { idx + 1 };
            self.symbols.push(Symbol { start: off as u32, len: c.len_utf8() as u32, prev: idx - 1, next });
        }
        for i in 1..self.symbols.len() {
            self.try_add_bigram(cx, text, i as i32 - 1, i as i32);
        }
        while let Some(b) = self.queue.pop() {
            let (l, r) = (self.symbols[b.left as usize], self.symbols[b.right as usize]);
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
            let (prev, next) = (self.symbols[b.left as usize].prev, self.symbols[b.left as usize].next);
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
        let Some(&id) = cx.token_to_id.get(piece) else { return };
        let Some(&score) = cx.scores.get(id as usize) else { return };
        self.queue.push(Bigram { score, left, right, size: l.len + r.len });
    }
}
