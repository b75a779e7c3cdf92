//! Tokenizer and detokenizer built from a GGUF file's `tokenizer.ggml.*` metadata, matching
//! llama.cpp (`src/llama-vocab.cpp`, `src/unicode.cpp`) token for token.
//!
//! - [`Vocab::from_gguf`] loads the vocabulary, special tokens and settings.
//! - [`Vocab::tokenize`] turns text into ids: special-token partition ([`special`]), then SPM
//!   ([`spm`]) or pre-tokenizer ([`split`], [`pre`]) + byte-pair merges ([`bpe`]).
//! - [`Vocab::token_to_piece`], [`Vocab::detokenize`] and [`StreamDecoder`] turn ids back into
//!   bytes / text ([`piece`]).
//!
//! Families: `llama` (SentencePiece-style BPE), `gpt2` (byte-level BPE with every
//! pre-tokenizer llama.cpp knows), `gemma4`, `whitespace` and `bert` (WordPiece, [`wpm`]);
//! Unigram (`t5`) is not implemented yet and is refused at load.

mod bpe;
mod error;
mod nfd_first;
mod piece;
pub mod pre;
mod special;
mod split;
mod spm;
pub mod unicode;
mod vocab;
pub mod wpm;

pub use error::TokenizerError;
pub use piece::StreamDecoder;
pub use pre::PreType;
pub use vocab::Vocab;

/// A token id: an index into the vocabulary (`0..n_vocab`).
pub type TokenId = u32;

/// Tokenizer family (llama.cpp `llama_vocab_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// SentencePiece-style BPE with byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
    /// Merge-rank BPE (`gpt2`, `gemma4`, `whitespace`).
    Bpe,
    /// WordPiece (`bert`), [`wpm`].
    Wpm,
}

/// Token attributes, a bit set (llama.cpp `llama_token_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u16);

impl TokenAttr {
    /// No attribute.
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token.
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// Reserved, never produced.
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// Ordinary text token.
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// Control token (BOS, EOS, chat markers): matched in text only with `parse_special`,
    /// rendered only with `special`.
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// Added token always matched in text and always rendered.
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// Byte token `<0xNN>`.
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Normalized.
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    /// Matching it removes white space to its left.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Matching it removes white space to its right.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    /// Single word.
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    /// Whether any bit of `other` is set.
    pub fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    /// `self` without the bits of `other`.
    pub fn without(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 & !other.0)
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, o: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | o.0)
    }
}

/// Token type as stored in `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// 0, or any value not listed.
    Undefined = 0,
    /// 1.
    Normal = 1,
    /// 2.
    Unknown = 2,
    /// 3.
    Control = 3,
    /// 4.
    UserDefined = 4,
    /// 5.
    Unused = 5,
    /// 6.
    Byte = 6,
}

impl TokenType {
    /// The type of a stored value (unknown values are `Undefined`, as in llama.cpp).
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// The attribute a type gives a token at load.
    pub fn attr(self) -> TokenAttr {
        match self {
            TokenType::Undefined => TokenAttr::UNDEFINED,
            TokenType::Normal => TokenAttr::NORMAL,
            TokenType::Unknown => TokenAttr::UNKNOWN,
            TokenType::Control => TokenAttr::CONTROL,
            TokenType::UserDefined => TokenAttr::USER_DEFINED,
            TokenType::Unused => TokenAttr::UNUSED,
            TokenType::Byte => TokenAttr::BYTE,
        }
    }

    /// The type that best describes a set of attributes (first of unknown, unused, control,
    /// user-defined, byte, normal).
    pub fn from_attr(a: TokenAttr) -> TokenType {
        if a.contains(TokenAttr::UNKNOWN) {
            TokenType::Unknown
        } else if a.contains(TokenAttr::UNUSED) {
            TokenType::Unused
        } else if a.contains(TokenAttr::CONTROL) {
            TokenType::Control
        } else if a.contains(TokenAttr::USER_DEFINED) {
            TokenType::UserDefined
        } else if a.contains(TokenAttr::BYTE) {
            TokenType::Byte
        } else if a.contains(TokenAttr::NORMAL) {
            TokenType::Normal
        } else {
            TokenType::Undefined
        }
    }
}
