//! Special-token handling on small synthetic vocabularies: which tokens are matched in raw text
//! with and without `parse_special`, the longest-first priority, `RSTRIP` (Phi-3 names), the
//! end-of-generation set, BOS / EOS rules and load errors. Expected values follow llama.cpp
//! `src/llama-vocab.cpp`.

use ir::gguf::{Array, Metadata, Value};
use runtime::tokenizer::{TokenAttr, TokenizerError, Vocab};

/// A byte-level BPE vocabulary: the 256 GGUF-2 alphabet characters (ids 0..256) followed by
/// `extra` tokens with the given types, no merges.
fn bpe_vocab(extra: &[(&str, i32)], keys: &[(&str, Value)]) -> Result<Vocab, TokenizerError> {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| runtime::tokenizer::unicode::byte_to_char(b).to_string())
        .collect();
    let mut types = vec![1i32; 256];
    for (t, ty) in extra {
        tokens.push(t.to_string());
        types.push(*ty);
    }
    let mut md = Metadata::default();
    md.push("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    md.push("tokenizer.ggml.pre".into(), Value::String("gpt-2".into()));
    md.push(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(tokens)),
    );
    md.push(
        "tokenizer.ggml.token_type".into(),
        Value::Array(Array::I32(types)),
    );
    md.push(
        "tokenizer.ggml.merges".into(),
        Value::Array(Array::String(vec![])),
    );
    for (k, v) in keys {
        md.push(k.to_string(), v.clone());
    }
    Vocab::from_metadata(&md)
}

fn id_of(v: &Vocab, text: &str) -> u32 {
    v.text_to_token(text)
        .unwrap_or_else(|| panic!("no token {text}"))
}

#[test]
fn control_tokens_only_with_parse_special_user_defined_always() {
    let v = bpe_vocab(&[("<ctl>", 3), ("<usr>", 4)], &[]).unwrap();
    let (ctl, usr) = (id_of(&v, "<ctl>"), id_of(&v, "<usr>"));
    let plain = v.tokenize("a<ctl>b<usr>c", false, false);
    assert!(
        !plain.contains(&ctl),
        "control text must stay text without parse_special"
    );
    assert!(
        plain.contains(&usr),
        "user-defined tokens are always matched"
    );
    let special = v.tokenize("a<ctl>b<usr>c", false, true);
    assert_eq!(
        special,
        vec![id_of(&v, "a"), ctl, id_of(&v, "b"), usr, id_of(&v, "c")]
    );
}

#[test]
fn longer_special_tokens_win_over_shorter_ones() {
    // "<a><b>" is tried before "<a>" even though "<a>" occurs first.
    let v = bpe_vocab(&[("<a>", 3), ("<a><b>", 3), ("<b>", 3)], &[]).unwrap();
    let got = v.tokenize("<a><a><b>", false, true);
    assert_eq!(got, vec![id_of(&v, "<a>"), id_of(&v, "<a><b>")]);
}

#[test]
fn phi3_names_make_special_tokens_strip_white_space_to_their_right() {
    let extra = [
        ("<unk>", 2),
        ("<s>", 3),
        ("</s>", 3),
        ("<|endoftext|>", 3),
        ("<|end|>", 3),
    ];
    let v = bpe_vocab(
        &extra,
        &[("general.name", Value::String("Phi3 mini".into()))],
    )
    .unwrap();
    assert!(v
        .token_attr(id_of(&v, "<|end|>"))
        .contains(TokenAttr::RSTRIP));
    assert!(!v
        .token_attr(id_of(&v, "<|endoftext|>"))
        .contains(TokenAttr::RSTRIP));
    let got = v.tokenize("<|end|>  \n x", false, true);
    assert_eq!(got, vec![id_of(&v, "<|end|>"), id_of(&v, "x")]);
    // without the name, the white space stays
    let plain = bpe_vocab(&extra, &[]).unwrap();
    assert!(plain.tokenize("<|end|>  \n x", false, true).len() > 2);
    // and a Phi-3 name without "<|endoftext|>" is refused, as llama.cpp refuses it
    let err = bpe_vocab(
        &[("<unk>", 2), ("<s>", 3), ("</s>", 3)],
        &[("general.name", Value::String("phi-3".into()))],
    );
    assert!(matches!(err, Err(TokenizerError::Invalid(_))));
}

#[test]
fn end_of_generation_set_is_built_from_ids_and_known_texts() {
    let extra = [
        ("<|im_end|>", 4),
        ("<|endoftext|>", 3),
        ("<|im_start|>", 3),
        ("<end_of_turn>", 1),
    ];
    let v = bpe_vocab(&extra, &[("tokenizer.ggml.eos_token_id", Value::U32(257))]).unwrap();
    for t in ["<|im_end|>", "<|endoftext|>", "<end_of_turn>"] {
        assert!(v.is_eog(id_of(&v, t)), "{t} must end generation");
    }
    assert!(!v.is_eog(id_of(&v, "<|im_start|>")));
    // end texts become control tokens, so they render only with `special`
    let end = id_of(&v, "<end_of_turn>");
    assert!(v.token_attr(end).contains(TokenAttr::CONTROL));
    assert_eq!(v.token_to_piece(end, false), b"");
    assert_eq!(v.token_to_piece(end, true), b"<end_of_turn>");
    assert_eq!(v.eos(), Some(257));
    assert_eq!(
        v.eot(),
        Some(id_of(&v, "<|im_end|>")),
        "lowest-id end-of-turn text"
    );
}

#[test]
fn harmony_vocabularies_keep_end_out_of_the_set() {
    let extra = [("<|return|>", 3), ("<|call|>", 3), ("<|end|>", 3)];
    let v = bpe_vocab(&extra, &[]).unwrap();
    assert!(v.is_eog(id_of(&v, "<|return|>")));
    assert!(!v.is_eog(id_of(&v, "<|end|>")));
}

#[test]
fn bos_and_eos_follow_the_metadata() {
    let keys = [
        ("tokenizer.ggml.bos_token_id", Value::U32(256)),
        ("tokenizer.ggml.eos_token_id", Value::U32(257)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
    ];
    let v = bpe_vocab(&[("<s>", 3), ("</s>", 3)], &keys).unwrap();
    assert_eq!(v.tokenize("a", true, false), vec![256, id_of(&v, "a"), 257]);
    assert_eq!(v.tokenize("a", false, false), vec![id_of(&v, "a")]);
    assert_eq!(v.tokenize("", true, false), vec![256, 257]);
    // asking for a BOS the vocabulary does not name is an error at load
    let mut md_keys = keys.to_vec();
    md_keys[0] = ("tokenizer.ggml.bos_token_id", Value::U32(1_000_000));
    let v = bpe_vocab(&[], &[("tokenizer.ggml.add_bos_token", Value::Bool(true))]);
    assert!(v.is_ok(), "gpt2 default BOS id 11 exists here");
    let v = bpe_vocab(&[], &md_keys[..1]).unwrap();
    assert!(v.warnings().iter().any(|w| w.contains("bad special token")));
}

#[test]
fn unknown_pre_tokenizer_falls_back_with_one_warning() {
    let v = bpe_vocab(&[], &[]).unwrap();
    assert!(!v.warnings().iter().any(|w| w.contains("pre-tokenizer")));
    let mut md = Metadata::default();
    md.push("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    md.push(
        "tokenizer.ggml.pre".into(),
        Value::String("no-such-pre".into()),
    );
    let tokens: Vec<String> = (0..=255u8)
        .map(|b| runtime::tokenizer::unicode::byte_to_char(b).to_string())
        .collect();
    md.push(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(tokens)),
    );
    md.push(
        "tokenizer.ggml.merges".into(),
        Value::Array(Array::String(vec![])),
    );
    let v = Vocab::from_metadata(&md).unwrap();
    assert_eq!(
        v.warnings()
            .iter()
            .filter(|w| w.contains("no-such-pre"))
            .count(),
        1
    );
    assert_eq!(v.tokenize("hi", false, false).len(), 2);
}

#[test]
fn load_errors_name_what_is_wrong() {
    let mut md = Metadata::default();
    md.push("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    let e = Vocab::from_metadata(&md).unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    md.push(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(vec!["a".into(), "a".into()])),
    );
    let e = Vocab::from_metadata(&md).unwrap_err().to_string();
    assert!(e.contains("duplicate token"), "{e}");
    let mut md = Metadata::default();
    md.push("tokenizer.ggml.model".into(), Value::String("t5".into()));
    assert!(matches!(
        Vocab::from_metadata(&md),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let mut md = Metadata::default();
    md.push("tokenizer.ggml.model".into(), Value::U32(3));
    assert!(Vocab::from_metadata(&md)
        .unwrap_err()
        .to_string()
        .contains("tokenizer.ggml.model"));
}
