//! WordPiece, the BERT tokenizer (`tokenizer.ggml.model = bert`; llama.cpp
//! `llm_tokenizer_wpm_session`), used by embedding models.
//!
//! Text is first cut into words as BERT's basic tokenizer does ([`words`]): whitespace ends a
//! word; NUL, U+FFFD and control characters are dropped; with `strip_accents` each code point
//! becomes the first code point of its canonical decomposition (`é` → `e`, [`NFD_FIRST`]) and
//! combining marks are dropped; with `lowercase` each code point is lowercased; punctuation,
//! ASCII symbols and CJK ideographs are words of their own.
//!
//! Each word, with `▁` put in front, is then covered greedily from the left by the longest
//! token that matches at each byte position ([`encode_word`]); a word that cannot be covered
//! entirely becomes the unknown token.

use super::nfd_first::NFD_FIRST;
use super::unicode;
use super::TokenId;
use rustc_hash::FxHashMap;

/// The BERT normalizer's switches (llama.cpp `normalizer_options`; GGUF
/// `tokenizer.ggml.normalizer.lowercase` and `.strip_accents`).
#[derive(Clone, Copy, Debug)]
pub struct Normalizer {
    /// Lowercase every code point (default `true`).
    pub lowercase: bool,
    /// Reduce to base letters and drop combining marks (default: as `lowercase`).
    pub strip_accents: bool,
}

/// The first code point of `c`'s canonical decomposition (`c` itself when it has none).
fn nfd_first(c: char) -> char {
    let cpt = c as u32;
    let i = NFD_FIRST.partition_point(|&(first, _, _)| first <= cpt);
    match i.checked_sub(1).map(|i| NFD_FIRST[i]) {
        Some((first, last, base)) if first <= cpt && cpt <= last => {
            char::from_u32(base).unwrap_or(c)
        }
        _ => c,
    }
}

/// `c` lowercased to one code point (Unicode's simple lowercase mapping, which the first
/// code point of the full mapping is).
fn lower(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// CJK ideographs, which BERT makes words of their own (the ranges of Hugging Face's
/// `_is_chinese_char`, with the upper block starting at U+2B920 as in its Rust code and in
/// llama.cpp).
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// The words of `text` (module doc).
pub fn words(text: &str, norm: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if norm.strip_accents { nfd_first(c) } else { c };
        let f = unicode::flags(c);
        if f.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || f.is_control() {
            continue;
        }
        if norm.strip_accents && f.is_mark() {
            continue;
        }
        let out = if norm.lowercase { lower(c) } else { c };
        if f.is_punctuation() || (c < '\u{7F}' && f.is_symbol()) || is_cjk(c) {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            if let Some(w) = words.last_mut() {
                w.push(out);
            }
            words.push(String::new());
        } else if let Some(w) = words.last_mut() {
            w.push(out);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// Appends the tokens of one word to `out`: `▁word` covered from the left by the longest
/// matching token at each position (tokens at most `max_token_len` bytes); `unk` (if any)
/// when some position has no match.
pub fn encode_word(
    word: &str,
    token_to_id: &FxHashMap<Box<str>, TokenId>,
    max_token_len: usize,
    unk: Option<TokenId>,
    out: &mut Vec<TokenId>,
) {
    if word.is_empty() {
        return;
    }
    let mut w = String::with_capacity(word.len() + 3);
    w.push('\u{2581}');
    w.push_str(word);
    let bytes = w.as_bytes();
    let n = bytes.len();
    let start = out.len();
    let mut i = 0;
    while i < n {
        let longest = (i + 1..=n.min(i + max_token_len + 1)).rev().find_map(|j| {
            let id = std::str::from_utf8(&bytes[i..j])
                .ok()
                .and_then(|s| token_to_id.get(s))?;
            Some((j, *id))
        });
        match longest {
            Some((j, id)) => {
                out.push(id);
                i = j;
            }
            None => {
                out.truncate(start);
                break;
            }
        }
    }
    if out.len() == start {
        out.extend(unk);
    }
}
