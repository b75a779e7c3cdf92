//! UTF-8 decoding that carries an unfinished character from one token to the next, as
//! llama.cpp's grammar decodes token pieces (`src/llama-grammar.cpp`, `decode_utf8` with a
//! `llama_partial_utf8`): a piece may end inside a character, and the next piece finishes it.
//! A NUL byte ends a piece (llama.cpp reads pieces as C strings).

/// An unfinished UTF-8 character: the bits read so far and how many continuation bytes are
/// still expected (`0`: none; `-1`: the bytes were invalid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    /// The code point's bits read so far.
    pub value: u32,
    /// Continuation bytes still expected; `-1` after an invalid sequence.
    pub n_remain: i8,
}

impl Partial {
    /// Whether a character is unfinished.
    pub fn is_pending(self) -> bool {
        self.n_remain > 0
    }
}

/// Sequence length by the first byte's high nibble; 0 marks a continuation byte.
const LEN: [i8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];

/// Appends the code points of `bytes` to `out`, continuing `start`, and returns the state
/// after the last byte. An invalid sequence removes what this call appended and returns
/// `n_remain = -1` (llama.cpp rejects such a token wherever it stands).
pub fn decode(bytes: &[u8], start: Partial, out: &mut Vec<u32>) -> Partial {
    let base = out.len();
    let mut value = start.value;
    let mut n_remain = start.n_remain;
    let mut pos = 0;
    let byte = |p: usize| bytes.get(p).copied().unwrap_or(0);
    while byte(pos) != 0 && n_remain > 0 {
        let b = byte(pos);
        if b >> 6 != 2 {
            out.truncate(base);
            return Partial {
                value: 0,
                n_remain: -1,
            };
        }
        value = (value << 6) + u32::from(b & 0x3F);
        pos += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        out.push(value);
    }
    while byte(pos) != 0 {
        let first = byte(pos);
        n_remain = LEN[usize::from(first >> 4)] - 1;
        if n_remain < 0 {
            out.truncate(base);
            return Partial {
                value: 0,
                n_remain: -1,
            };
        }
        let mask = (1u32 << (7 - n_remain)) - 1;
        value = u32::from(first) & mask;
        pos += 1;
        while byte(pos) != 0 && n_remain > 0 {
            value = (value << 6) + u32::from(byte(pos) & 0x3F);
            pos += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            out.push(value);
        }
    }
    Partial { value, n_remain }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_pieces_is_finished_by_the_next() {
        let e = "é".as_bytes();
        let mut out = Vec::new();
        let p = decode(&[b'a', e[0]], Partial::default(), &mut out);
        assert_eq!(out, vec![u32::from('a')]);
        assert_eq!(p.n_remain, 1);
        out.clear();
        let p = decode(&[e[1], b'b'], p, &mut out);
        assert_eq!(out, vec![u32::from('é'), u32::from('b')]);
        assert_eq!(p.n_remain, 0);
        out.clear();
        assert_eq!(decode(&[0x80], Partial::default(), &mut out).n_remain, -1);
        assert!(out.is_empty());
    }
}
