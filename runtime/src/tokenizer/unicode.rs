//! Code point classes and the GPT-2 byte ↔ unicode mapping, as llama.cpp's `src/unicode.cpp`
//! uses them.
//!
//! llama.cpp classifies every code point by its Unicode general category (one of
//! letter / number / punctuation / symbol / mark / separator / control / undefined) plus a
//! separate `White_Space` flag, from Unicode 15 tables. The pre-tokenizers (`\p{L}`, `\p{N}`,
//! `\s`, ...) and the custom splitters read only these flags, so this module is the single
//! source of truth for them here (the `unicode-general-category` crate, Unicode 15.0).

use std::sync::OnceLock;
use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// The general-category group of a code point (llama.cpp `unicode_cpt_flags` category bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Category {
    /// `Cn`: not assigned in Unicode 15.
    Undefined = 0,
    /// `\p{N}`: Nd, Nl, No.
    Number = 1,
    /// `\p{L}`: Lu, Ll, Lt, Lm, Lo.
    Letter = 2,
    /// `\p{Z}`: Zs, Zl, Zp.
    Separator = 3,
    /// `\p{M}`: Mn, Mc, Me.
    Mark = 4,
    /// `\p{P}`: Pc, Pd, Ps, Pe, Pi, Pf, Po.
    Punctuation = 5,
    /// `\p{S}`: Sm, Sc, Sk, So.
    Symbol = 6,
    /// `\p{C}` except Cn: Cc, Cf, Cs, Co.
    Control = 7,
}

/// Category plus the `White_Space` flag of one code point, packed in a byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags(u8);

const WS_BIT: u8 = 0x10;

impl Flags {
    /// Flags of a position outside the text (llama.cpp's default-constructed flags): no
    /// category, not whitespace. The custom splitters use it as "end of segment".
    pub const NONE: Flags = Flags(0x80);

    /// The category group.
    #[inline]
    pub fn category(self) -> Category {
        match self.0 & 0x0f {
            1 => Category::Number,
            2 => Category::Letter,
            3 => Category::Separator,
            4 => Category::Mark,
            5 => Category::Punctuation,
            6 => Category::Symbol,
            7 => Category::Control,
            _ => Category::Undefined,
        }
    }
    /// `\p{L}`.
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & 0x8f == Category::Letter as u8
    }
    /// `\p{N}`.
    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & 0x8f == Category::Number as u8
    }
    /// `\s` (Unicode `White_Space`).
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & WS_BIT != 0
    }
    /// `\p{P}`.
    #[inline]
    pub fn is_punctuation(self) -> bool {
        self.0 & 0x8f == Category::Punctuation as u8
    }
    /// `\p{S}`.
    #[inline]
    pub fn is_symbol(self) -> bool {
        self.0 & 0x8f == Category::Symbol as u8
    }
    /// `\p{M}`.
    #[inline]
    pub fn is_mark(self) -> bool {
        self.0 & 0x8f == Category::Mark as u8
    }
    /// `\p{C}` except unassigned.
    #[inline]
    pub fn is_control(self) -> bool {
        self.0 & 0x8f == Category::Control as u8
    }
    /// Whether this is a real code point (llama.cpp `flags.as_uint() != 0`), i.e. not
    /// [`Flags::NONE`].
    #[inline]
    pub fn is_some(self) -> bool {
        self.0 & 0x80 == 0
    }
}

/// The Unicode `White_Space` code points (the set llama.cpp's `unicode_set_whitespace` holds).
pub fn is_white_space(cpt: u32) -> bool {
    matches!(
        cpt,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

fn compute_flags(c: char) -> Flags {
    let cat = match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => Category::Letter,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark => Category::Mark,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Category::Number,
        Gc::ConnectorPunctuation
        | Gc::DashPunctuation
        | Gc::OpenPunctuation
        | Gc::ClosePunctuation
        | Gc::InitialPunctuation
        | Gc::FinalPunctuation
        | Gc::OtherPunctuation => Category::Punctuation,
        Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol => {
            Category::Symbol
        }
        Gc::SpaceSeparator | Gc::LineSeparator | Gc::ParagraphSeparator => Category::Separator,
        Gc::Control | Gc::Format | Gc::Surrogate | Gc::PrivateUse => Category::Control,
        Gc::Unassigned => Category::Undefined,
    };
    let ws = if is_white_space(c as u32) { WS_BIT } else { 0 };
    Flags(cat as u8 | ws)
}

/// Flags of every code point in the Basic Multilingual Plane, built on first use (64 KiB).
fn bmp_table() -> &'static [Flags] {
    static TABLE: OnceLock<Vec<Flags>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0u32..0x10000)
            .map(|cpt| char::from_u32(cpt).map_or(Flags(Category::Control as u8), compute_flags))
            .collect()
    })
}

/// The flags of code point `c`.
#[inline]
pub fn flags(c: char) -> Flags {
    let cpt = c as u32;
    if cpt < 0x10000 {
        bmp_table()[cpt as usize]
    } else {
        compute_flags(c)
    }
}

/// The GPT-2 byte-level alphabet: byte `b` → the code point that stands for it in byte-level
/// BPE vocabularies (printable Latin-1 bytes map to themselves, the other 68 bytes to
/// U+0100.., in byte order). Source: llama.cpp `unicode_byte_to_utf8_map`, itself GPT-2's
/// `bytes_to_unicode`.
pub fn byte_to_char(b: u8) -> char {
    byte_tables().0[b as usize]
}

/// The inverse of [`byte_to_char`]: `None` for a code point outside the 256-char alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cpt = c as u32;
    if cpt < 0x200 {
        let b = byte_tables().1[cpt as usize];
        if b >= 0 {
            return Some(b as u8);
        }
    }
    None
}

fn byte_tables() -> &'static ([char; 256], [i16; 0x200]) {
    static T: OnceLock<([char; 256], [i16; 0x200])> = OnceLock::new();
    T.get_or_init(|| {
        let mut fwd = ['\0'; 256];
        let mut inv = [-1i16; 0x200];
        let direct = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut n = 0u32;
        for b in 0u32..256 {
            let cpt = if direct(b) {
                b
            } else {
                n += 1;
                255 + n
            };
            // cpt < 0x200 always: at most 68 bytes are remapped.
            fwd[b as usize] = char::from_u32(cpt).unwrap_or('\u{FFFD}');
            inv[cpt as usize] = b as i16;
        }
        (fwd, inv)
    })
}

/// Stands, in text decoded by [`decode_lenient`], for a code point that a Rust `char` cannot
/// hold (a UTF-16 surrogate written in UTF-8, `ED A0 80`) and for itself: U+10FFFD, a private
/// use character, whose flags (control, as llama.cpp classifies private use and surrogates
/// alike) are those of the code points it stands for.
pub const STAND_IN: char = '\u{10FFFD}';

/// Decodes bytes as llama.cpp's `unicode_cpts_from_utf8` does, for the BPE pre-tokenizers:
/// a lead byte takes as many continuation bytes as it announces, without checking for
/// overlong forms (`C0 AF` is `/`) or surrogates (`ED A0 80` is U+D800); a byte that starts
/// no such sequence is U+FFFD and decoding goes on at the next byte (`E6 AD` is two U+FFFD).
///
/// Returns the text and, for each [`STAND_IN`] in it in order, the bytes llama.cpp writes
/// back for that code point (`unicode_cpt_to_utf8`: a surrogate's three bytes; the stand-in's
/// own four when the input held it). A four-byte form above U+10FFFF, on which llama.cpp's
/// tokenizer throws, is taken as invalid bytes (U+FFFD each) instead.
pub fn decode_lenient(bytes: &[u8]) -> (String, Vec<Vec<u8>>) {
    let mut text = String::with_capacity(bytes.len() + 8);
    let mut stand_ins = Vec::new();
    let cont = |i: usize| bytes.get(i).is_some_and(|&b| b & 0xC0 == 0x80);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        // (code point, bytes taken); 0 bytes: invalid, U+FFFD for this one byte.
        let (cpt, len) = if b < 0x80 {
            (u32::from(b), 1)
        } else if b & 0x40 == 0 {
            (0xFFFD, 0) // a continuation byte alone
        } else if b & 0x20 == 0 {
            if cont(i + 1) {
                (
                    (u32::from(b & 0x1F) << 6) | u32::from(bytes[i + 1] & 0x3F),
                    2,
                )
            } else {
                (0xFFFD, 0)
            }
        } else if b & 0x10 == 0 {
            if cont(i + 1) && cont(i + 2) {
                let c = (u32::from(b & 0x0F) << 12)
                    | (u32::from(bytes[i + 1] & 0x3F) << 6)
                    | u32::from(bytes[i + 2] & 0x3F);
                (c, 3)
            } else {
                (0xFFFD, 0)
            }
        } else if b & 0x08 == 0 && cont(i + 1) && cont(i + 2) && cont(i + 3) {
            let c = (u32::from(b & 0x07) << 18)
                | (u32::from(bytes[i + 1] & 0x3F) << 12)
                | (u32::from(bytes[i + 2] & 0x3F) << 6)
                | u32::from(bytes[i + 3] & 0x3F);
            if c > 0x10FFFF {
                (0xFFFD, 0)
            } else {
                (c, 4)
            }
        } else {
            (0xFFFD, 0)
        };
        match char::from_u32(cpt) {
            Some(STAND_IN) => {
                text.push(STAND_IN);
                stand_ins.push(STAND_IN.to_string().into_bytes());
            }
            Some(c) => text.push(c),
            None => {
                // A surrogate (from a three-byte form, possibly overlong in four).
                text.push(STAND_IN);
                stand_ins.push(vec![
                    0xE0 | (cpt >> 12) as u8,
                    0x80 | ((cpt >> 6) & 0x3F) as u8,
                    0x80 | (cpt & 0x3F) as u8,
                ]);
            }
        }
        i += len.max(1);
    }
    (text, stand_ins)
}

/// The byte length llama.cpp's `unicode_len_utf8` gives a character starting with `b`:
/// 1 for ASCII and continuation bytes, else what the lead byte announces (not checked).
pub fn llama_utf8_len(b: u8) -> usize {
    const LEN: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[usize::from(b >> 4)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_llama_cpp_examples() {
        assert_eq!(flags(' ').category(), Category::Separator);
        assert!(flags(' ').is_whitespace());
        assert!(flags('\n').is_whitespace() && flags('\n').is_control());
        assert!(flags('a').is_letter() && flags('Z').is_letter());
        assert!(flags('7').is_number() && flags('½').is_number());
        assert!(flags('$').is_symbol() && flags('~').is_symbol() && flags('^').is_symbol());
        assert!(flags('!').is_punctuation() && flags('_').is_punctuation());
        assert!(flags('\u{301}').is_mark());
        assert!(flags('\u{AD}').is_control());
        assert_eq!(flags('\u{378}').category(), Category::Undefined);
        assert!(flags('\u{378}').is_some());
        assert!(flags('\u{3000}').is_whitespace());
        assert!(!Flags::NONE.is_some() && !Flags::NONE.is_letter() && !Flags::NONE.is_whitespace());
        assert!(flags('😀').is_symbol());
    }

    #[test]
    fn byte_alphabet_is_a_bijection() {
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
