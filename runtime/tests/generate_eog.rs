//! An end-of-generation token whose text is not empty (a user-defined token in the EOG set,
//! like a FIM file separator) ends the generation with its text kept, as llama-server's
//! `process_token` keeps it (`stop_type` eos, the text in `content`). The vocabulary is
//! deepseek-coder's with `tokenizer.ggml.fim_sep_token_id` pointing at one of its
//! user-defined tokens (llama.cpp puts the FIM separators in the EOG set).

use ir::gguf::{GgufFile, Value};
use runtime::generate::{Decoding, Fed, GenerateOptions};
use runtime::tokenizer::Vocab;

#[test]
fn an_eog_token_keeps_its_text() {
    let Some(path) = modelc_tests::require(
        modelc_tests::shared_root().join("vocab/ggml-vocab-deepseek-coder.gguf"),
        "the shared vocabularies",
    ) else {
        return;
    };
    let mut md = GgufFile::open(&path).expect("opens").metadata().clone();
    // `[PAD32023]`: a user-defined token, whose text is kept without `special`.
    md.push("tokenizer.ggml.fim_sep_token_id".into(), Value::U32(32023));
    let vocab = Vocab::from_metadata(&md).expect("loads");
    let eog = 32023;
    assert!(vocab.is_eog(eog));
    let text = String::from_utf8(vocab.token_to_piece(eog, false).to_vec()).expect("UTF-8");
    assert!(!text.is_empty(), "{eog} has text");
    let mut logits = vec![0f32; vocab.n_vocab()];
    logits[eog as usize] = 10.0;
    let mut d = Decoding::new(&[1], 64, &GenerateOptions::default());
    assert!(matches!(
        d.feed(&vocab, &logits).expect("feeds"),
        Fed::Stopped
    ));
    assert_eq!(d.stop_type(), Some("eos"));
    assert_eq!(d.take_text().as_deref(), Some(text.as_str()));
}
