//! Token ids → text: pieces, whole-sequence detokenization and a streaming decoder.
//!
//! Source: llama.cpp `llama_vocab::impl::token_to_piece` and `detokenize`.
//! - Control and unknown tokens render only with `special = true`; user-defined tokens always
//!   render as their text.
//! - Byte tokens (`<0xNN>`) render as that byte.
//! - Normal SPM tokens render with U+2581 turned into a space; normal byte-level BPE tokens are
//!   mapped back through the GPT-2 alphabet (a character outside it renders as
//!   `[UNK_BYTE_0x..<token text>]`, as llama.cpp does).
//! - Unused and undefined tokens render as nothing.

use super::unicode::char_to_byte;
use super::vocab::Vocab;
use super::{TokenAttr, TokenId, VocabType};

impl Vocab {
    /// The piece of `id` with `special = true`, computed once at load.
    pub(crate) fn piece_uncached(&self, id: TokenId) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let attr = t.attr;
        if attr.contains(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
            return t.text.as_bytes().to_vec();
        }
        if attr.contains(TokenAttr::NORMAL) {
            return match self.vocab_type {
                VocabType::Spm | VocabType::Wpm => t.text.replace('\u{2581}', " ").into_bytes(),
                VocabType::Bpe if self.escape_whitespaces => {
                    t.text.replace('\u{2581}', " ").into_bytes()
                }
                VocabType::Bpe => decode_byte_level(&t.text),
            };
        }
        if attr.contains(TokenAttr::BYTE) {
            return vec![hex_byte_of(&t.text)];
        }
        Vec::new()
    }

    /// The bytes token `id` stands for (llama.cpp `llama_token_to_piece` with `lstrip = 0`).
    /// With `special = false`, control and unknown tokens give nothing. An id outside the
    /// vocabulary gives nothing (use [`Vocab::check_id`] to reject it first).
    pub fn token_to_piece(&self, id: TokenId, special: bool) -> &[u8] {
        let Some(t) = self.tokens.get(id as usize) else {
            return &[];
        };
        if !special && t.attr.contains(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return &[];
        }
        &self.pieces[id as usize]
    }

    /// `Ok(id as TokenId)` if `id` is a token of this vocabulary, else
    /// [`super::TokenizerError::BadTokenId`].
    pub fn check_id(&self, id: i64) -> Result<TokenId, super::TokenizerError> {
        if id >= 0 && (id as u64) < self.tokens.len() as u64 {
            Ok(id as TokenId)
        } else {
            Err(super::TokenizerError::BadTokenId {
                id,
                n_vocab: self.tokens.len(),
            })
        }
    }

    /// The text of a whole token sequence as bytes (llama.cpp `llama_detokenize` with
    /// `remove_special = false`, `unparse_special = special`): the pieces concatenated, the
    /// first piece losing one leading space when the vocabulary adds a space prefix (SPM), and
    /// for vocabularies with `clean_up_tokenization_spaces` the spaces before `? ! . ,`, around
    /// a lone `'` and before `'s 'm 're 've` removed. The result may be invalid UTF-8 (a
    /// sequence cut inside a character); see [`Vocab::detokenize_lossy`].
    pub fn detokenize(&self, ids: &[TokenId], special: bool) -> Vec<u8> {
        let mut text = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let mut piece = self.token_to_piece(id, special);
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// [`Vocab::detokenize`] as a string; invalid UTF-8 becomes U+FFFD
    /// (`String::from_utf8_lossy`).
    pub fn detokenize_lossy(&self, ids: &[TokenId], special: bool) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, special)).into_owned()
    }
}

/// llama.cpp `llama_decode_text`: GPT-2 alphabet characters back to bytes.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut tmp = [0u8; 4];
                for b in c.encode_utf8(&mut tmp).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xNN>` token: the hex digits at text offsets 3..5, parsed like `strtol`
/// (leading hex digits only; none gives 0).
fn hex_byte_of(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..5.min(text.len())).unwrap_or(&[]);
    let mut v: u32 = 0;
    for &d in digits {
        match (d as char).to_digit(16) {
            Some(x) => v = v * 16 + x,
            None => break,
        }
    }
    v as u8
}

/// llama.cpp's three clean-up passes of `detokenize`, in place.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // 1: " ?", " !", " .", " ,"  -> drop the space
    let src = std::mem::take(text);
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // 2: " ' " -> "'"
    // (llama.cpp zeroes the skipped space in place; a following check sees that zero)
    let mut src = out;
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            out.push(x);
            src[i + 1] = 0;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // 3: " 's", " 'm", " 're", " 've" -> drop the space
    let src = out;
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            if x1 == b's' || x1 == b'm' {
                out.pop();
            } else if x1 != b't' && x1 != b'd' && i + 2 < src.len() {
                let x2 = src[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    out.pop();
                }
            }
        }
        out.push(x);
    }
    *text = out;
}

/// Turns generated tokens into text one token at a time without ever emitting part of a
/// UTF-8 character.
///
/// Each [`StreamDecoder::push`] appends the token's piece (as [`Vocab::token_to_piece`]) to a
/// byte buffer and returns the longest prefix that is complete: valid characters, with any
/// byte sequence that can no longer become valid replaced by U+FFFD. At most 3 bytes (an
/// unfinished character) are held back. [`StreamDecoder::flush`] returns what is held, with
/// U+FFFD for an unfinished character. Nothing is lost: the concatenation of everything
/// returned equals `String::from_utf8_lossy` of all the pieces concatenated. No clean-up of
/// spaces is applied (llama.cpp streams raw pieces too).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    held: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// A decoder; `special` renders control tokens (as `token_to_piece`'s `special`).
    pub fn new(special: bool) -> StreamDecoder {
        StreamDecoder {
            held: Vec::new(),
            special,
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, vocab: &Vocab, id: TokenId) -> String {
        let piece = vocab.token_to_piece(id, self.special);
        self.push_bytes(piece)
    }

    /// Adds raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.held[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.held.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(
                        std::str::from_utf8(&self.held[start..start + valid]).unwrap_or_default(),
                    );
                    start += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start += n;
                        }
                        None => break, // unfinished character at the end: hold it
                    }
                }
            }
        }
        self.held.drain(..start);
        out
    }

    /// Returns whatever is held (an unfinished character becomes U+FFFD) and empties the
    /// decoder.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        s
    }

    /// Returns the bytes held (an unfinished character, as they are) and empties the decoder.
    pub fn take_held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// Number of bytes held back (0-3).
    pub fn pending(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up_matches_llama_cpp_rules() {
        let mut t = b"Hello , world ! It ' s you 're he 's I 'm not 't ok .".to_vec();
        clean_up_spaces(&mut t);
        assert_eq!(
            String::from_utf8(t).unwrap(),
            "Hello, world! It's you're he's I'm not 't ok."
        );
    }

    #[test]
    fn hex_bytes_parse_like_strtol() {
        assert_eq!(hex_byte_of("<0x0A>"), 10);
        assert_eq!(hex_byte_of("<0xFF>"), 255);
        assert_eq!(hex_byte_of("<0x"), 0);
        assert_eq!(hex_byte_of("<0xG1>"), 0);
    }

    #[test]
    fn stream_decoder_equals_lossy_decoding_for_any_split() {
        let mut seed = 7u64;
        for _ in 0..2000 {
            let mut all = Vec::new();
            let mut dec = StreamDecoder::new(false);
            let mut got = String::new();
            for _ in 0..8 {
                let mut next = || {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) as usize
                };
                let n = next() % 6;
                let pool: &[u8] = b"a \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xff\x80\xc3";
                let piece: Vec<u8> = (0..n).map(|_| pool[next() % pool.len()]).collect();
                all.extend_from_slice(&piece);
                let s = dec.push_bytes(&piece);
                assert!(dec.pending() <= 3);
                got.push_str(&s);
            }
            got.push_str(&dec.flush());
            assert_eq!(got, String::from_utf8_lossy(&all));
        }
    }
}
