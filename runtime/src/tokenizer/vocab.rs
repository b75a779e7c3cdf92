//! The vocabulary: tokens, special tokens and tokenizer settings read from `tokenizer.ggml.*`,
//! and text → token ids.
//!
//! Source of the semantics: llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::load`,
//! `tokenize`, `tokenizer_st_partition`). Where llama.cpp iterates a hash map (auto-detection of
//! EOT / EOM / FIM tokens by text), this code walks ids in ascending order, so when a
//! vocabulary holds several candidates the lowest id wins (llama.cpp's pick is unspecified).

use super::bpe::{Alphabet, BpeContext, BpeMerges, BpeSession};
use super::error::TokenizerError;
use super::pre::{self, PreType};
use super::special::{self, Fragment, SpecialMatcher};
use super::split::Splitter;
use super::spm::{PairSet, SpmContext, SpmSession};
use super::unicode;
use super::wpm;
use super::{TokenAttr, TokenId, TokenType, VocabType};
use ir::gguf::{Array, GgufFile, Metadata, Value};
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

/// One vocabulary entry.
#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: TokenAttr,
}

/// Special token ids (`None`: the vocabulary has none).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    pub eot: Option<TokenId>,
    pub eom: Option<TokenId>,
    pub unk: Option<TokenId>,
    pub sep: Option<TokenId>,
    pub pad: Option<TokenId>,
    pub mask: Option<TokenId>,
    pub fim_pre: Option<TokenId>,
    pub fim_suf: Option<TokenId>,
    pub fim_mid: Option<TokenId>,
    pub fim_pad: Option<TokenId>,
    pub fim_rep: Option<TokenId>,
    pub fim_sep: Option<TokenId>,
}

/// A tokenizer vocabulary loaded from GGUF metadata: converts text to token ids and ids to
/// text exactly as llama.cpp does for the same file.
///
/// Supported `tokenizer.ggml.model` values: `llama` (SentencePiece BPE), `gpt2` (byte-level
/// BPE with every pre-tokenizer llama.cpp knows), `gemma4` (BPE over raw UTF-8),
/// `whitespace` and `bert` (WordPiece). `t5` (Unigram), `rwkv` and `plamo2` are refused with
/// [`TokenizerError::UnsupportedModel`].
#[derive(Debug)]
pub struct Vocab {
    pub(crate) vocab_type: VocabType,
    pub(crate) model: String,
    pub(crate) pre: String,
    pub(crate) pre_type: Option<PreType>,
    pub(crate) tokens: Vec<TokenData>,
    pub(crate) token_to_id: FxHashMap<Box<str>, TokenId>,
    pub(crate) ids: SpecialIds,
    pub(crate) linefeed: Option<TokenId>,
    pub(crate) add_space_prefix: bool,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_sep: bool,
    pub(crate) ignore_merges: bool,
    pub(crate) clean_spaces: bool,
    pub(crate) remove_extra_whitespaces: bool,
    pub(crate) escape_whitespaces: bool,
    pub(crate) eog: BTreeSet<TokenId>,
    pub(crate) special: SpecialMatcher,
    pub(crate) pieces: Vec<Box<[u8]>>,
    pub(crate) max_token_len: usize,
    /// The BERT normalizer (WordPiece only).
    wpm_norm: wpm::Normalizer,
    bpe: Option<BpeParts>,
    spm_byte_token: [Option<TokenId>; 256],
    spm_pairs: PairSet,
    scores: Vec<f32>,
    warnings: Vec<String>,
    notes: Vec<String>,
}

#[derive(Debug)]
struct BpeParts {
    merges: BpeMerges,
    splitter: Splitter,
    alphabet: Alphabet,
    single_byte: [Option<TokenId>; 256],
    hex_byte: [Option<TokenId>; 256],
    drop_whitespace_words: bool,
}

const K_MODEL: &str = "tokenizer.ggml.model";
const K_PRE: &str = "tokenizer.ggml.pre";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_SCORES: &str = "tokenizer.ggml.scores";
const K_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const K_MERGES: &str = "tokenizer.ggml.merges";
const K_NORM_LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
const K_NORM_STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";
const K_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const K_REMOVE_EXTRA_WS: &str = "tokenizer.ggml.remove_extra_whitespaces";
const K_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const K_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const K_ADD_SEP: &str = "tokenizer.ggml.add_sep_token";
const K_BOS: &str = "tokenizer.ggml.bos_token_id";
const K_EOS: &str = "tokenizer.ggml.eos_token_id";
const K_SEP: &str = "tokenizer.ggml.seperator_token_id";

/// Words longer than this (bytes) are not cached during a call.
const WORD_CACHE_MAX_LEN: usize = 64;

/// Texts that make a token the EOT token when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that always end generation (llama.cpp's end-of-generation list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn bad(key: &'static str, msg: impl Into<String>) -> TokenizerError {
    TokenizerError::BadKey {
        key,
        msg: msg.into(),
    }
}

fn get_bool(md: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    Ok(md.get_bool(key)?)
}

impl Vocab {
    /// Builds the vocabulary of a GGUF file from its `tokenizer.ggml.*` metadata.
    ///
    /// Errors: a missing or mistyped key (named), an unsupported tokenizer model, duplicate
    /// token texts, a special token the settings require but the file lacks. Oddities that
    /// llama.cpp only warns about (an empty token text, an out-of-range special id, an unknown
    /// pre-tokenizer) are warned about on stderr.
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        Self::from_metadata(file.metadata())
    }

    /// [`Vocab::from_gguf`] on a metadata table.
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, TokenizerError> {
        let model = md
            .get_str(K_MODEL)?
            .ok_or(TokenizerError::MissingKey(K_MODEL))?
            .to_string();
        let mut pre = md.get_str(K_PRE)?.unwrap_or("").to_string();

        let mut warnings: Vec<String> = Vec::new();
        let mut warn = |m: String| warnings.push(m);
        let mut ids = SpecialIds::default();
        let mut add_space_prefix = false;
        let (mut add_bos, mut add_eos, mut add_sep) = (false, false, false);
        let mut ignore_merges = false;
        let clean_spaces;
        let mut escape_whitespaces = true;
        let mut pre_type = None;
        let vocab_type = match model.as_str() {
            "llama" => {
                ids.bos = Some(1);
                ids.eos = Some(2);
                ids.unk = Some(0);
                VocabType::Spm
            }
            "gpt2" | "whitespace" => {
                ids.bos = Some(11);
                ids.eos = Some(11);
                VocabType::Bpe
            }
            "gemma4" => {
                pre = "gemma4".into();
                VocabType::Bpe
            }
            "bert" => {
                ids.bos = Some(101);
                ids.unk = Some(100);
                ids.sep = Some(102);
                ids.pad = Some(0);
                ids.mask = Some(103);
                VocabType::Wpm
            }
            "no_vocab" | "none" | "t5" | "rwkv" | "plamo2" | "hybriddna" => {
                return Err(TokenizerError::UnsupportedModel(model))
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        match vocab_type {
            VocabType::Bpe => {
                escape_whitespaces = false;
                let settings = if pre.is_empty() {
                    warn("missing pre-tokenizer type (tokenizer.ggml.pre), using 'default'; generation quality will be degraded".into());
                    pre::settings_for("default")
                } else {
                    match pre::settings_for(&pre) {
                        Some(s) => Some(s),
                        None => {
                            warn(format!(
                                "unknown pre-tokenizer type '{pre}' (llama.cpp refuses this file); using 'default'"
                            ));
                            pre::settings_for("default")
                        }
                    }
                };
                let s = settings
                    .ok_or_else(|| TokenizerError::Invalid("pre-tokenizer table".into()))?;
                pre_type = Some(s.pre_type);
                clean_spaces = s.clean_spaces;
                ignore_merges = s.ignore_merges;
                add_bos |= s.add_bos;
                add_sep |= s.add_sep;
                escape_whitespaces |= s.escape_whitespaces;
                if s.no_default_bos {
                    ids.bos = None;
                }
            }
            VocabType::Spm => {
                add_space_prefix = true;
                clean_spaces = false;
                add_bos = true;
                add_eos = false;
            }
            VocabType::Wpm => {
                clean_spaces = true;
                add_bos = true;
                add_sep = true;
            }
        }
        let lowercase = get_bool(md, K_NORM_LOWERCASE)?.unwrap_or(true);
        let wpm_norm = wpm::Normalizer {
            lowercase,
            strip_accents: get_bool(md, K_NORM_STRIP_ACCENTS)?.unwrap_or(lowercase),
        };
        if let Some(v) = get_bool(md, K_ADD_PREFIX)? {
            add_space_prefix = v;
        }
        let remove_extra_whitespaces = get_bool(md, K_REMOVE_EXTRA_WS)?.unwrap_or(false);

        // tokens, scores, types
        let texts = md
            .get_array(K_TOKENS)?
            .ok_or(TokenizerError::MissingKey(K_TOKENS))?
            .as_strs()
            .ok_or_else(|| bad(K_TOKENS, "expected an array of strings"))?;
        let n_tokens = texts.len();
        if n_tokens == 0 {
            return Err(bad(K_TOKENS, "the vocabulary is empty"));
        }
        if n_tokens > i32::MAX as usize {
            return Err(bad(
                K_TOKENS,
                format!("{n_tokens} tokens is more than a token id can hold"),
            ));
        }
        let scores: Option<Vec<f32>> = match md.get_array(K_SCORES)? {
            None => None,
            Some(a) => {
                let v = match a {
                    Array::F32(v) => v.clone(),
                    Array::I32(v) => v.iter().map(|&x| x as f32).collect(),
                    _ => return Err(bad(K_SCORES, "expected an array of f32 or i32")),
                };
                if v.len() < n_tokens {
                    return Err(bad(
                        K_SCORES,
                        format!("{} scores for {n_tokens} tokens", v.len()),
                    ));
                }
                Some(v)
            }
        };
        let types: Option<&Vec<i32>> = match md.get_array(K_TOKEN_TYPE)? {
            None => None,
            Some(Array::I32(v)) => {
                if v.len() < n_tokens {
                    return Err(bad(
                        K_TOKEN_TYPE,
                        format!("{} types for {n_tokens} tokens", v.len()),
                    ));
                }
                Some(v)
            }
            Some(_) => return Err(bad(K_TOKEN_TYPE, "expected an array of i32")),
        };

        let mut tokens = Vec::with_capacity(n_tokens);
        let mut token_to_id: FxHashMap<Box<str>, TokenId> = FxHashMap::default();
        token_to_id.reserve(n_tokens);
        let mut max_token_len = 0;
        for (i, t) in texts.iter().enumerate() {
            let text = if t.is_empty() {
                warn(format!("empty token at index {i}"));
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            if let Some(&prev) = token_to_id.get(text.as_str()) {
                return Err(TokenizerError::Invalid(format!(
                    "duplicate token in vocabulary: '{text}' has ids {prev} and {i}"
                )));
            }
            token_to_id.insert(text.as_str().into(), i as TokenId);
            max_token_len = max_token_len.max(text.len());
            let attr = match types.map(|t| t[i]) {
                None => TokenAttr::NORMAL,
                Some(t) => TokenType::from_i32(t).attr(),
            };
            let score = scores.as_ref().map_or(0.0, |s| s[i]);
            tokens.push(TokenData { text, score, attr });
        }

        let mut v = Vocab {
            vocab_type,
            model,
            pre,
            pre_type,
            tokens,
            token_to_id,
            ids,
            linefeed: None,
            add_space_prefix,
            add_bos,
            add_eos,
            add_sep,
            ignore_merges,
            clean_spaces,
            remove_extra_whitespaces,
            escape_whitespaces,
            eog: BTreeSet::new(),
            special: SpecialMatcher::default(),
            pieces: Vec::new(),
            max_token_len,
            wpm_norm,
            bpe: None,
            spm_byte_token: [None; 256],
            spm_pairs: PairSet::default(),
            scores: Vec::new(),
            warnings,
            notes: Vec::new(),
        };
        v.scores = v.tokens.iter().map(|t| t.score).collect();
        v.init_tokenizer(md)?;
        v.linefeed = v.find_linefeed();
        v.load_special_ids(md)?;
        v.detect_special_tokens();
        v.special = SpecialMatcher::new(&v.tokens);
        v.pieces = (0..v.tokens.len() as TokenId)
            .map(|id| v.piece_uncached(id).into_boxed_slice())
            .collect();
        v.apply_name_attributes(md)?;
        Ok(v)
    }

    fn init_tokenizer(&mut self, md: &Metadata) -> Result<(), TokenizerError> {
        for b in 0..=255u8 {
            let hex = format!("<0x{b:02X}>");
            let hex_id = self.token_to_id.get(hex.as_str()).copied();
            self.spm_byte_token[b as usize] = hex_id.or_else(|| {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| self.token_to_id.get(s).copied())
            });
        }
        if self.vocab_type == VocabType::Spm {
            self.spm_pairs = PairSet::new(self.tokens.iter().map(|t| t.text.as_str()));
        }
        if self.vocab_type != VocabType::Bpe {
            return Ok(());
        }
        let merges = match md.get_array(K_MERGES)? {
            None if self.pre == "kimi-k2" => Vec::new(),
            None => return Err(TokenizerError::MissingKey(K_MERGES)),
            Some(a) => a
                .as_strs()
                .ok_or_else(|| bad(K_MERGES, "expected an array of strings"))?
                .to_vec(),
        };
        let merges = BpeMerges::new(&merges, &self.token_to_id, self.tokens.len() as u32);
        let pre_type = self.pre_type.unwrap_or(PreType::Default);
        let (exprs, byte_encode) = pre::regex_exprs(pre_type);
        let splitter = Splitter::new(&exprs, true).map_err(TokenizerError::Invalid)?;
        let mut single_byte = [None; 256];
        let mut hex_byte = [None; 256];
        for b in 0..=255u8 {
            if let Ok(s) = std::str::from_utf8(&[b]) {
                single_byte[b as usize] = self.token_to_id.get(s).copied();
            }
            hex_byte[b as usize] = self
                .token_to_id
                .get(format!("<0x{b:02X}>").as_str())
                .copied();
        }
        self.bpe = Some(BpeParts {
            merges,
            splitter,
            alphabet: if byte_encode {
                Alphabet::ByteLevel
            } else {
                Alphabet::Raw
            },
            single_byte,
            hex_byte,
            drop_whitespace_words: self.model == "whitespace",
        });
        Ok(())
    }

    fn find_linefeed(&self) -> Option<TokenId> {
        match self.vocab_type {
            VocabType::Spm => self.spm_byte_token[b'\n' as usize].or(self.ids.pad),
            VocabType::Bpe => {
                let mut out = Vec::new();
                self.encode_text("\n", &[], &mut out, true);
                out.first().copied().or(self.ids.pad)
            }
            VocabType::Wpm => self.ids.pad,
        }
    }

    fn load_special_ids(&mut self, md: &Metadata) -> Result<(), TokenizerError> {
        let n = self.tokens.len() as u64;
        type Slot = fn(&mut SpecialIds) -> &mut Option<TokenId>;
        let keys: [(&str, Slot); 17] = [
            (K_BOS, |s| &mut s.bos),
            (K_EOS, |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
            (K_SEP, |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, field) in keys {
            let slot = field(&mut self.ids);
            if let Some(id) = *slot {
                if u64::from(id) >= n {
                    self.warnings.push(format!(
                        "default special token '{key}' = {id} out of vocab range, disabling"
                    ));
                    *slot = None;
                }
            }
            let Some(value) = md.get(key) else { continue };
            let Some(new_id) = value.as_int() else {
                return Err(TokenizerError::BadKey {
                    key: "special token id",
                    msg: format!("'{key}' is not an integer"),
                });
            };
            if new_id < 0 || new_id as u64 >= n {
                let msg =
                    format!("bad special token: '{key}' = {new_id}, using default id {slot:?}");
                self.warnings.push(msg);
            } else {
                *slot = Some(new_id as TokenId);
            }
        }
        if let Some(b) = get_bool(md, K_ADD_BOS)? {
            self.add_bos = b;
        }
        if let Some(b) = get_bool(md, K_ADD_EOS)? {
            self.add_eos = b;
        }
        if let Some(b) = get_bool(md, K_ADD_SEP)? {
            self.add_sep = b;
        }
        if self.pre_type == Some(PreType::Gemma4) && !self.add_bos {
            self.warnings
                .push("override 'tokenizer.ggml.add_bos_token' to 'true' for Gemma4".into());
            self.add_bos = true;
        }
        for (add, id, add_key, id_key) in [
            (self.add_bos, self.ids.bos, K_ADD_BOS, K_BOS),
            (self.add_eos, self.ids.eos, K_ADD_EOS, K_EOS),
            (self.add_sep, self.ids.sep, K_ADD_SEP, K_SEP),
        ] {
            if add && id.is_none() {
                return Err(TokenizerError::Invalid(format!(
                    "{add_key} is true, but {id_key} is not set"
                )));
            }
        }
        Ok(())
    }

    /// Auto-detects EOT / EOM / FIM tokens by text, marks unused control tokens, builds the
    /// end-of-generation set (llama.cpp `load`, "auto-detect special tokens by text" onwards).
    fn detect_special_tokens(&mut self) {
        let notes = &mut self.notes;
        let mut find = |tokens: &mut Vec<TokenData>, texts: &[&str]| -> Option<TokenId> {
            let id = tokens
                .iter()
                .position(|t| texts.contains(&t.text.as_str()))?;
            notes.extend(force_control(tokens, id));
            Some(id as TokenId)
        };
        let t = &mut self.tokens;
        if self.ids.eot.is_none() {
            self.ids.eot = find(t, EOT_TEXTS);
        }
        if self.ids.eom.is_none() {
            self.ids.eom = find(t, EOM_TEXTS);
        }
        if self.ids.fim_pre.is_none() {
            self.ids.fim_pre = find(t, FIM_PRE_TEXTS);
        }
        if self.ids.fim_suf.is_none() {
            self.ids.fim_suf = find(t, FIM_SUF_TEXTS);
        }
        if self.ids.fim_mid.is_none() {
            self.ids.fim_mid = find(t, FIM_MID_TEXTS);
        }
        if self.ids.fim_pad.is_none() {
            self.ids.fim_pad = find(t, FIM_PAD_TEXTS);
        }
        if self.ids.fim_rep.is_none() {
            self.ids.fim_rep = find(t, FIM_REP_TEXTS);
        }
        if self.ids.fim_sep.is_none() {
            self.ids.fim_sep = find(t, FIM_SEP_TEXTS);
        }
        for tok in t.iter_mut() {
            if tok.attr.contains(TokenAttr::CONTROL) && tok.text.contains("unused") {
                tok.attr = tok.attr | TokenAttr::UNUSED;
            }
        }
        let mut eog = BTreeSet::new();
        for id in [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        for id in 0..t.len() {
            if EOG_TEXTS.contains(&t[id].text.as_str()) {
                eog.insert(id as TokenId);
                self.notes.extend(force_control(t, id));
            }
        }
        for tok in t.iter_mut() {
            if matches!(
                tok.text.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                tok.attr = TokenAttr::USER_DEFINED;
            }
        }
        for id in [self.ids.eos, self.ids.eot, self.ids.eom]
            .into_iter()
            .flatten()
        {
            if eog.insert(id) {
                self.warnings.push(format!(
                    "special token {id} ('{}') was not in the end-of-generation set; added",
                    t[id as usize].text
                ));
            }
        }
        // o200k_harmony / solar-open: "<|end|>" does not end generation there.
        let find_eog = |eog: &BTreeSet<TokenId>, t: &[TokenData], s: &str| {
            eog.iter().copied().find(|&id| t[id as usize].text == s)
        };
        let has = |eog: &BTreeSet<TokenId>, t: &[TokenData], s: &str| find_eog(eog, t, s).is_some();
        let has_call = has(&eog, t, "<|call|>") || has(&eog, t, "<|calls|>");
        let has_end = has(&eog, t, "<|end|>");
        let has_return_or_flush = has(&eog, t, "<|return|>") || has(&eog, t, "<|flush|>");
        if has_call && has_end && has_return_or_flush {
            if let Some(end) = find_eog(&eog, t, "<|end|>") {
                eog.remove(&end);
                t[end as usize].attr = TokenAttr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is ordinary text there, not an end of generation.
        if has(&eog, t, "<|tool_response>") || has(&eog, t, "<|plamo:eos|>") {
            if let Some(s) = find_eog(&eog, t, "</s>") {
                eog.remove(&s);
                t[s as usize].attr = TokenAttr::NORMAL;
            }
        }
        self.eog = eog;
    }

    /// Per-model attribute fixes keyed on names (llama.cpp "Handle per token attributes").
    fn apply_name_attributes(&mut self, md: &Metadata) -> Result<(), TokenizerError> {
        let name = md
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_lowercase();
        let arch = md
            .get("general.architecture")
            .and_then(Value::as_str)
            .unwrap_or("");
        let require = |v: &Vocab, text: &str| -> Result<usize, TokenizerError> {
            v.token_to_id
                .get(text)
                .map(|&id| id as usize)
                .ok_or_else(|| {
                    TokenizerError::Invalid(format!(
                        "model '{name}' needs a token '{text}', which the vocabulary lacks"
                    ))
                })
        };
        let pre = self.pre.clone();
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            match self.token_to_id.get("<mask>") {
                Some(&id) => {
                    self.tokens[id as usize].attr =
                        self.tokens[id as usize].attr | TokenAttr::LSTRIP
                }
                None => self
                    .warnings
                    .push("mask token is missing in vocab, please reconvert model".into()),
            }
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &id in self.special.ids() {
                let a = &mut self.tokens[id as usize].attr;
                *a = *a | TokenAttr::RSTRIP;
            }
            let id = require(self, "</s>")?;
            self.tokens[id].attr = self.tokens[id].attr | TokenAttr::RSTRIP;
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                let id = require(self, text)?;
                self.tokens[id].attr = self.tokens[id].attr.without(TokenAttr::RSTRIP);
            }
        } else if name.contains("modern-bert") {
            match self.token_to_id.get("[MASK]") {
                Some(&id) => {
                    self.tokens[id as usize].attr =
                        self.tokens[id as usize].attr | TokenAttr::LSTRIP
                }
                None => self.warnings.push("mask token missing in vocab".into()),
            }
        }
        self.special.refresh_attrs(&self.tokens);
        Ok(())
    }

    /// Tokenizes `text` (llama.cpp `llama_tokenize`).
    ///
    /// - `add_special`: add BOS / EOS where the vocabulary asks for them (`add_bos_token`,
    ///   `add_eos_token`; the family defaults otherwise).
    /// - `parse_special`: text equal to a control or unknown token's text becomes that token.
    ///   User-defined tokens are always matched, as in llama.cpp (and Hugging Face).
    ///
    /// For bytes that are not UTF-8, see [`Vocab::tokenize_bytes`].
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        self.tokenize_impl(text.as_bytes(), add_special, parse_special, true)
    }

    /// [`Vocab::tokenize`] of bytes that need not be UTF-8, as llama.cpp tokenizes them
    /// (its `llama_tokenize` takes bytes): SPM cuts them into symbols by their lead bytes
    /// and gives an invalid symbol its byte tokens (`\xe6\xad` after `▁`: `29871 233 176`
    /// on llama-spm); BPE decodes them as `unicode_cpts_from_utf8` does
    /// ([`super::unicode::decode_lenient`]: overlong forms and surrogates are code points,
    /// other bad bytes U+FFFD each).
    pub fn tokenize_bytes(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
    ) -> Vec<TokenId> {
        self.tokenize_impl(text, add_special, parse_special, true)
    }

    /// [`Vocab::tokenize`] without the speed-ups that must not change results (SPM splitting
    /// at pairs no token holds, per-call caches of repeated words): the plain llama.cpp
    /// algorithms, kept so tests can check that the fast path gives the same ids.
    #[doc(hidden)]
    pub fn tokenize_plain(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Vec<TokenId> {
        self.tokenize_impl(text.as_bytes(), add_special, parse_special, false)
    }

    fn tokenize_impl(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
        fast: bool,
    ) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            special::partition(self, text, parse_special)
        };
        // WordPiece adds BOS ([CLS]) and SEP whatever add_bos / add_sep say, as llama.cpp.
        if add_special && (self.add_bos || self.vocab_type == VocabType::Wpm) {
            out.extend(self.ids.bos);
        }
        match self.vocab_type {
            VocabType::Spm => {
                // escaped texts first: the session's cache borrows from them
                let mut is_prev_special = true;
                let texts: Vec<Option<Vec<u8>>> = fragments
                    .iter()
                    .map(|frag| match frag {
                        Fragment::Text(r) => {
                            let mut buf = Vec::with_capacity(r.len() + 3);
                            if self.add_space_prefix && is_prev_special {
                                buf.extend_from_slice("\u{2581}".as_bytes());
                            }
                            for &b in &text[r.clone()] {
                                match b {
                                    b' ' => buf.extend_from_slice("\u{2581}".as_bytes()),
                                    b => buf.push(b),
                                }
                            }
                            is_prev_special = false;
                            Some(buf)
                        }
                        Fragment::Token(_) => {
                            is_prev_special = true;
                            None
                        }
                    })
                    .collect();
                let mut cx = self.spm_context();
                if !fast {
                    cx.pairs = None;
                }
                let mut session = SpmSession::default();
                for (frag, t) in fragments.iter().zip(&texts) {
                    match (frag, t) {
                        (_, Some(s)) => session.encode_bytes(&cx, s, &mut out),
                        (Fragment::Token(id), None) => out.push(*id),
                        (Fragment::Text(_), None) => {}
                    }
                }
            }
            VocabType::Wpm => {
                for frag in &fragments {
                    match *frag {
                        Fragment::Text(ref r) => {
                            // Code points as llama.cpp decodes them; what is not a character
                            // of its own (a surrogate) is a control character and dropped.
                            let (t, _) = unicode::decode_lenient(&text[r.clone()]);
                            for word in wpm::words(&t, self.wpm_norm) {
                                wpm::encode_word(
                                    &word,
                                    &self.token_to_id,
                                    self.max_token_len,
                                    self.ids.unk,
                                    &mut out,
                                );
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            VocabType::Bpe => {
                for frag in &fragments {
                    match *frag {
                        Fragment::Text(ref r) => match std::str::from_utf8(&text[r.clone()]) {
                            Ok(t) => self.encode_text(t, &[], &mut out, fast),
                            Err(_) => {
                                let (t, stand_ins) = unicode::decode_lenient(&text[r.clone()]);
                                self.encode_text(&t, &stand_ins, &mut out, fast);
                            }
                        },
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.ids.eos);
        }
        if add_special && self.vocab_type == VocabType::Wpm {
            out.extend(self.ids.sep);
        }
        out
    }

    /// The warnings llama.cpp's `llama_tokenize` logs for `ids` tokenized with
    /// `add_special`: BOS added while the text also began with BOS (the ids start with two),
    /// or EOS added while the text also ended with EOS. Empty when neither.
    pub fn double_bos_eos(&self, ids: &[TokenId]) -> Vec<&'static str> {
        let mut w = Vec::new();
        if self.vocab_type == VocabType::Wpm {
            return w; // llama.cpp's WordPiece path does not check
        }
        if self.add_bos && ids.len() >= 2 && self.ids.bos.is_some_and(|b| ids[1] == b) {
            w.push("a BOS token was added to the prompt as the model asks, and the prompt also starts with one: it now starts with 2 BOS tokens");
        }
        if self.add_eos && ids.len() >= 2 && self.ids.eos.is_some_and(|e| ids[ids.len() - 2] == e) {
            w.push("an EOS token was added to the prompt as the model asks, and the prompt also ends with one: it now ends with 2 EOS tokens");
        }
        w
    }

    fn spm_context(&self) -> SpmContext<'_> {
        SpmContext {
            token_to_id: &self.token_to_id,
            scores: &self.scores,
            byte_token: &self.spm_byte_token,
            unk: self.ids.unk,
            pairs: Some(&self.spm_pairs),
        }
    }

    /// BPE: pre-tokenizes one raw-text fragment and encodes each word. `stand_ins`: the
    /// bytes each [`unicode::STAND_IN`] in `text` stands for, in order
    /// ([`unicode::decode_lenient`]); empty for text that was valid UTF-8.
    fn encode_text(
        &self,
        text: &str,
        stand_ins: &[Vec<u8>],
        out: &mut Vec<TokenId>,
        use_cache: bool,
    ) {
        let Some(bpe) = &self.bpe else { return };
        let escaped;
        let text = if self.escape_whitespaces {
            let mut s = String::with_capacity(text.len() + 8);
            escape_spaces_into(text, &mut s);
            escaped = s;
            escaped.as_str()
        } else {
            text
        };
        let cx = BpeContext {
            merges: &bpe.merges,
            token_to_id: &self.token_to_id,
            single_byte: &bpe.single_byte,
            hex_byte: &bpe.hex_byte,
            alphabet: bpe.alphabet,
            ignore_merges: self.ignore_merges,
            newline_words_whole: self.pre_type == Some(PreType::Gemma4),
        };
        let mut session = BpeSession::default();
        // words repeat: each distinct short word is encoded once per call (same result)
        let mut cache: FxHashMap<&str, (u32, u32)> = FxHashMap::default();
        let mut arena: Vec<TokenId> = Vec::new();
        let mut stand_ins = stand_ins.iter();
        let mut word_bytes = Vec::new();
        for r in bpe.splitter.split(text) {
            let word = &text[r];
            if bpe.drop_whitespace_words && word.chars().all(|c| unicode::flags(c).is_whitespace())
            {
                continue;
            }
            if !stand_ins.as_slice().is_empty() && word.contains(unicode::STAND_IN) {
                word_bytes.clear();
                for c in word.chars() {
                    let stood_for = if c == unicode::STAND_IN {
                        stand_ins.next()
                    } else {
                        None
                    };
                    match stood_for {
                        Some(b) => word_bytes.extend_from_slice(b),
                        None => word_bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                session.encode_word_bytes(&cx, word, &word_bytes, out);
                continue;
            }
            if !use_cache || word.len() > WORD_CACHE_MAX_LEN {
                session.encode_word(&cx, word, out);
                continue;
            }
            if let Some(&(s, e)) = cache.get(word) {
                out.extend_from_slice(&arena[s as usize..e as usize]);
                continue;
            }
            let before = out.len();
            session.encode_word(&cx, word, out);
            let s = arena.len() as u32;
            arena.extend_from_slice(&out[before..]);
            cache.insert(word, (s, arena.len() as u32));
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    /// Tokenizer family.
    pub fn vocab_type(&self) -> VocabType {
        self.vocab_type
    }
    /// `tokenizer.ggml.model`.
    pub fn model_name(&self) -> &str {
        &self.model
    }
    /// `tokenizer.ggml.pre` as used (`gemma4` for the gemma4 model; empty when absent).
    pub fn pre_name(&self) -> &str {
        &self.pre
    }
    /// Pre-tokenizer type (BPE only).
    pub fn pre_type(&self) -> Option<PreType> {
        self.pre_type
    }
    /// Number of BPE merges (0 for other families).
    pub fn n_merges(&self) -> usize {
        self.bpe.as_ref().map_or(0, |b| b.merges.n_merges())
    }
    /// The text of token `id` as stored in the file (`None` if out of range).
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| t.text.as_str())
    }
    /// The score of token `id` (0 if out of range).
    pub fn token_score(&self, id: TokenId) -> f32 {
        self.tokens.get(id as usize).map_or(0.0, |t| t.score)
    }
    /// The attributes of token `id` after llama.cpp's adjustments (`UNDEFINED` if out of
    /// range).
    pub fn token_attr(&self, id: TokenId) -> TokenAttr {
        self.tokens
            .get(id as usize)
            .map_or(TokenAttr::UNDEFINED, |t| t.attr)
    }
    /// The type of token `id` derived from its attributes (`Undefined` if out of range).
    pub fn token_type(&self, id: TokenId) -> TokenType {
        TokenType::from_attr(self.token_attr(id))
    }
    /// The id of the token whose text is exactly `text`.
    pub fn text_to_token(&self, text: &str) -> Option<TokenId> {
        self.token_to_id.get(text).copied()
    }
    /// BOS token.
    pub fn bos(&self) -> Option<TokenId> {
        self.ids.bos
    }
    /// EOS token.
    pub fn eos(&self) -> Option<TokenId> {
        self.ids.eos
    }
    /// EOT token (end of turn).
    pub fn eot(&self) -> Option<TokenId> {
        self.ids.eot
    }
    /// EOM token (end of message).
    pub fn eom(&self) -> Option<TokenId> {
        self.ids.eom
    }
    /// Unknown token.
    pub fn unk(&self) -> Option<TokenId> {
        self.ids.unk
    }
    /// Separator token.
    pub fn sep(&self) -> Option<TokenId> {
        self.ids.sep
    }
    /// Padding token.
    pub fn pad(&self) -> Option<TokenId> {
        self.ids.pad
    }
    /// Mask token.
    pub fn mask(&self) -> Option<TokenId> {
        self.ids.mask
    }
    /// Newline token (llama.cpp `token_nl`).
    pub fn nl(&self) -> Option<TokenId> {
        self.linefeed
    }
    /// Fill-in-the-middle tokens: prefix, suffix, middle, pad, repo, file separator.
    pub fn fim(&self) -> [Option<TokenId>; 6] {
        let i = &self.ids;
        [
            i.fim_pre, i.fim_suf, i.fim_mid, i.fim_pad, i.fim_rep, i.fim_sep,
        ]
    }
    /// Whether tokenizing with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether tokenizing with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// `add_sep_token` (used by embedding models; `tokenize` does not add SEP, as llama.cpp).
    pub fn add_sep(&self) -> bool {
        self.add_sep
    }
    /// Whether SPM text gets a leading space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// Whether detokenization cleans spaces before punctuation (`clean_up_tokenization_spaces`).
    pub fn clean_spaces(&self) -> bool {
        self.clean_spaces
    }
    /// `remove_extra_whitespaces` as read (only Unigram vocabularies use it).
    pub fn remove_extra_whitespaces(&self) -> bool {
        self.remove_extra_whitespaces
    }
    /// Whether `id` ends generation: EOS, EOT, EOM, FIM pad/repo/sep, and every token whose text
    /// is one of llama.cpp's end texts (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }
    /// The end-of-generation set, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.eog.iter().copied()
    }
    /// The tokens that can be matched in raw text (control, user-defined, unknown), longest
    /// text first.
    pub fn special_tokens(&self) -> &[TokenId] {
        self.special.ids()
    }
    /// Problems found while loading that llama.cpp also only warns about (missing or unknown
    /// pre-tokenizer, empty token texts, out-of-range special ids, ...). The library prints
    /// nothing; callers decide.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
    /// Adjustments made while loading that are expected for many models (tokens whose text
    /// marks them as control tokens but whose type did not).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    /// Longest token text in bytes.
    pub fn max_token_len(&self) -> usize {
        self.max_token_len
    }
}

/// Marks token `id` as a control token; returns a note when that changes its type.
fn force_control(tokens: &mut [TokenData], id: usize) -> Option<String> {
    let a = &mut tokens[id].attr;
    if a.contains(TokenAttr::CONTROL) {
        return None;
    }
    *a = *a | TokenAttr::CONTROL;
    Some(format!(
        "control-looking token {id} '{}' was not control-type; treated as control",
        tokens[id].text
    ))
}

/// Appends `text` with every space replaced by U+2581 (llama.cpp `llama_escape_whitespace`).
fn escape_spaces_into(text: &str, out: &mut String) {
    let mut rest = text;
    while let Some(i) = rest.find(' ') {
        out.push_str(&rest[..i]);
        out.push('\u{2581}');
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}
