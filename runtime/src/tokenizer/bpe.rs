//! Byte-pair encoding of one pre-tokenized word (llama.cpp `llm_tokenizer_bpe_session`).
//!
//! The word starts as one symbol per character of its encoded form (one per byte for GPT-2
//! byte-level vocabularies, one per UTF-8 character otherwise). Adjacent pairs that appear in
//! `tokenizer.ggml.merges` are merged lowest rank first (ties: leftmost first), with a priority
//! queue, until no listed pair is left. Each final symbol that is a vocabulary token becomes
//! that token; any other symbol falls back to one token per byte where such a token exists
//! (llama.cpp drops bytes that have none).
//!
//! Strings are interned once at load: every vocabulary token keeps its id as symbol id, and
//! merge parts or results that are not tokens get ids past `n_vocab`. Merging then works on
//! pairs of integers.

use super::unicode::byte_to_char;
use super::TokenId;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Symbol id of a character that appears in no merge and no token.
const NO_SYM: u32 = u32::MAX;

/// The merge table of a BPE vocabulary.
#[derive(Debug)]
pub struct BpeMerges {
    /// (left symbol, right symbol) → (rank, merged symbol)
    pairs: FxHashMap<(u32, u32), (u32, u32)>,
    /// Interned strings that are not tokens (ids from `n_vocab` up).
    extra: FxHashMap<Box<str>, u32>,
    n_vocab: u32,
    /// Symbol of each byte's GPT-2 alphabet character.
    byte_sym: [u32; 256],
    n_merges: usize,
}

impl BpeMerges {
    /// Builds the table from `tokenizer.ggml.merges` ("left right" per entry, split at the
    /// first space after the first character; the first occurrence of a pair sets its rank).
    pub fn new(
        merges: &[String],
        token_to_id: &FxHashMap<Box<str>, TokenId>,
        n_vocab: u32,
    ) -> BpeMerges {
        let mut m = BpeMerges {
            pairs: FxHashMap::default(),
            extra: FxHashMap::default(),
            n_vocab,
            byte_sym: [NO_SYM; 256],
            n_merges: merges.len(),
        };
        m.pairs.reserve(merges.len());
        let mut buf = String::new();
        for (rank, word) in merges.iter().enumerate() {
            let Some(first_len) = word.chars().next().map(char::len_utf8) else {
                continue;
            };
            let Some(rel) = word[first_len..].find(' ') else {
                continue;
            };
            let pos = first_len + rel;
            let (left, right) = (&word[..pos], &word[pos + 1..]);
            let l = m.intern(left, token_to_id);
            let r = m.intern(right, token_to_id);
            buf.clear();
            buf.push_str(left);
            buf.push_str(right);
            let merged = m.intern(&buf, token_to_id);
            m.pairs.entry((l, r)).or_insert((rank as u32, merged));
        }
        for b in 0..=255u8 {
            let mut tmp = [0u8; 4];
            let s = byte_to_char(b).encode_utf8(&mut tmp);
            m.byte_sym[b as usize] = m.lookup(s, token_to_id);
        }
        m
    }

    /// Number of merge entries in the file.
    pub fn n_merges(&self) -> usize {
        self.n_merges
    }

    fn intern(&mut self, s: &str, token_to_id: &FxHashMap<Box<str>, TokenId>) -> u32 {
        if let Some(&id) = token_to_id.get(s) {
            return id;
        }
        let next = self.n_vocab + self.extra.len() as u32;
        *self.extra.entry(s.into()).or_insert(next)
    }

    fn lookup(&self, s: &str, token_to_id: &FxHashMap<Box<str>, TokenId>) -> u32 {
        token_to_id
            .get(s)
            .or_else(|| self.extra.get(s))
            .copied()
            .unwrap_or(NO_SYM)
    }
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    sym: u32,
    /// byte range in the encoded word
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// Reusable buffers for encoding words one after another.
#[derive(Default)]
pub struct BpeSession {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, i32, u32, u32)>>,
    encoded: String,
}

/// How the characters of a word are turned into initial symbols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alphabet {
    /// GPT-2 byte level: each byte of the UTF-8 text becomes its alphabet character; bytes
    /// without a token fall back to nothing.
    ByteLevel,
    /// The text as it is, one symbol per character; bytes without a token fall back to
    /// `<0xNN>` tokens (SPM-style BPE such as Gemma 4).
    Raw,
}

/// What the BPE step needs from the vocabulary.
pub struct BpeContext<'a> {
    /// Merge table.
    pub merges: &'a BpeMerges,
    /// Token text → id.
    pub token_to_id: &'a FxHashMap<Box<str>, TokenId>,
    /// Token of each single-byte text (ASCII only, since token texts are UTF-8).
    pub single_byte: &'a [Option<TokenId>; 256],
    /// Token `<0xNN>` of each byte.
    pub hex_byte: &'a [Option<TokenId>; 256],
    /// Initial symbol alphabet.
    pub alphabet: Alphabet,
    /// Emit a word that is itself a token without merging (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// Gemma 4: a word made only of newlines that is a token is emitted whole.
    pub newline_words_whole: bool,
}

impl BpeSession {
    /// Appends the tokens of one word to `out`.
    pub fn encode_word(&mut self, cx: &BpeContext<'_>, word: &str, out: &mut Vec<TokenId>) {
        self.encode_word_bytes(cx, word, word.as_bytes(), out);
    }

    /// [`BpeSession::encode_word`] for a word whose bytes, as llama.cpp writes them back
    /// from its code points, are `bytes` rather than `word`'s own (a word holding
    /// [`super::unicode::STAND_IN`]s). A byte-level vocabulary encodes `bytes`; a raw one
    /// `word`.
    pub fn encode_word_bytes(
        &mut self,
        cx: &BpeContext<'_>,
        word: &str,
        bytes: &[u8],
        out: &mut Vec<TokenId>,
    ) {
        self.encoded.clear();
        match cx.alphabet {
            Alphabet::ByteLevel => self.encoded.extend(bytes.iter().copied().map(byte_to_char)),
            Alphabet::Raw => self.encoded.push_str(word),
        }
        if self.encoded.is_empty() {
            return;
        }
        if cx.ignore_merges || (cx.newline_words_whole && bytes.iter().all(|&b| b == b'\n')) {
            if let Some(&id) = cx.token_to_id.get(self.encoded.as_str()) {
                out.push(id);
                return;
            }
        }
        self.symbols.clear();
        self.queue.clear();
        match cx.alphabet {
            Alphabet::ByteLevel => {
                let mut start = 0u32;
                for &b in bytes {
                    let len = byte_to_char(b).len_utf8() as u32;
                    self.push_symbol(cx.merges.byte_sym[b as usize], start, len);
                    start += len;
                }
            }
            Alphabet::Raw => {
                let encoded = std::mem::take(&mut self.encoded);
                for (i, c) in encoded.char_indices() {
                    let mut tmp = [0u8; 4];
                    let sym = cx.merges.lookup(c.encode_utf8(&mut tmp), cx.token_to_id);
                    self.push_symbol(sym, i as u32, c.len_utf8() as u32);
                }
                self.encoded = encoded;
            }
        }
        if let Some(last) = self.symbols.last_mut() {
            last.next = -1;
        }
        for i in 1..self.symbols.len() {
            self.add_bigram(cx.merges, i as i32 - 1, i as i32);
        }
        while let Some(Reverse((_rank, left, left_sym, right_sym))) = self.queue.pop() {
            let l = self.symbols[left as usize];
            if l.len == 0 || l.sym != left_sym || l.next < 0 {
                continue;
            }
            let right = l.next;
            let r = self.symbols[right as usize];
            if r.len == 0 || r.sym != right_sym {
                continue;
            }
            let Some(&(_, merged)) = cx.merges.pairs.get(&(left_sym, right_sym)) else {
                continue;
            };
            let ls = &mut self.symbols[left as usize];
            ls.len += r.len;
            ls.sym = merged;
            ls.next = r.next;
            self.symbols[right as usize].len = 0;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = left;
            }
            let (prev, next) = (
                self.symbols[left as usize].prev,
                self.symbols[left as usize].next,
            );
            if prev >= 0 {
                self.add_bigram(cx.merges, prev, left);
            }
            if next >= 0 {
                self.add_bigram(cx.merges, left, next);
            }
        }
        let n_vocab = cx.merges.n_vocab;
        let mut i = if self.symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = self.symbols[i as usize];
            i = s.next;
            if s.len == 0 {
                continue;
            }
            if s.sym < n_vocab {
                out.push(s.sym);
                continue;
            }
            let text = &self.encoded.as_bytes()[s.start as usize..(s.start + s.len) as usize];
            let table = match cx.alphabet {
                Alphabet::ByteLevel => cx.single_byte,
                Alphabet::Raw => cx.hex_byte,
            };
            out.extend(text.iter().filter_map(|&b| table[b as usize]));
        }
    }

    fn push_symbol(&mut self, sym: u32, start: u32, len: u32) {
        let idx = self.symbols.len() as i32;
        self.symbols.push(Symbol {
            sym,
            start,
            len,
            prev: idx - 1,
            next: idx + 1,
        });
    }

    fn add_bigram(&mut self, merges: &BpeMerges, left: i32, right: i32) {
        let (l, r) = (
            self.symbols[left as usize].sym,
            self.symbols[right as usize].sym,
        );
        if l == NO_SYM || r == NO_SYM {
            return;
        }
        if let Some(&(rank, _)) = merges.pairs.get(&(l, r)) {
            self.queue.push(Reverse((rank, left, l, r)));
        }
    }
}
