//! Prompt tokenizations recorded from llama.cpp: the two real models in
//! `../shared/reference/` (ids with and without BOS, per-token pieces, the prompt's special
//! texts parsed as special) and the fixture vocabulary's `tokenize.json`.

use ir::gguf::GgufFile;
use runtime::tokenizer::Vocab;
use serde_json::Value;
use std::path::PathBuf;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// A recorded piece: a string when the bytes are valid UTF-8, else an array of bytes.
fn piece_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(a) => a.iter().map(|b| b.as_u64().expect("byte") as u8).collect(),
        other => panic!("unexpected piece {other}"),
    }
}

/// `reference` (in `shared/reference/`) against `model` (a path, or `None` after a recorded
/// skip).
fn check_real_model(reference: &str, model: Option<PathBuf>) {
    let (Some(path), Some(model)) = (
        modelc_tests::shared(&format!("reference/{reference}")),
        model,
    ) else {
        return;
    };
    let text = std::fs::read_to_string(path).expect("reference json");
    let json: Value = serde_json::from_str(&text).expect("valid json");
    let file = GgufFile::open(&model).unwrap_or_else(|e| panic!("{e}"));
    let vocab = Vocab::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let mut bad = 0;
    let prompts = json["prompts"].as_array().expect("prompts");
    for p in prompts {
        let id = p["id"].as_str().unwrap_or("?");
        let prompt = p["prompt"].as_str().expect("prompt");
        let want_false = ids(&p["tokens_add_special_false"]);
        let want_true = ids(&p["tokens_add_special_true"]);
        let got_false = vocab.tokenize(prompt, false, true);
        let got_true = vocab.tokenize(prompt, true, true);
        if got_false != want_false {
            bad += 1;
            println!(
                "{reference} {id}: add_special=false\n  want {want_false:?}\n  got  {got_false:?}"
            );
        }
        if got_true != want_true {
            bad += 1;
            println!(
                "{reference} {id}: add_special=true\n  want {want_true:?}\n  got  {got_true:?}"
            );
        }
        let pieces = p["pieces_add_special_false"].as_array().expect("pieces");
        assert_eq!(pieces.len(), want_false.len());
        for (&tok, piece) in want_false.iter().zip(pieces) {
            let got = vocab.token_to_piece(tok, true);
            if got != piece_bytes(piece).as_slice() {
                bad += 1;
                println!(
                    "{reference} {id}: piece of {tok}: want {piece} got {:?}",
                    String::from_utf8_lossy(got)
                );
            }
        }
        // the pieces concatenated give the prompt back
        let text = vocab.detokenize(&want_false, true);
        if text != prompt.as_bytes() {
            bad += 1;
            println!(
                "{reference} {id}: detokenize gives {:?}",
                String::from_utf8_lossy(&text)
            );
        }
    }
    println!("{reference}: {} prompts, {bad} mismatches", prompts.len());
    assert_eq!(bad, 0);
}

#[test]
fn smollm2_prompts_match_llama_cpp() {
    check_real_model(
        "ref-SmolLM2-135M-Instruct.Q4_1.json",
        modelc_tests::smollm2(),
    );
}

#[test]
fn gemma3_prompts_match_llama_cpp() {
    check_real_model("ref-gemma-3-270m-q4_k_m.json", modelc_tests::gemma3());
}

#[test]
fn fixture_vocabulary_matches_llama_tokenize() {
    let Some(dir) = modelc_tests::shared("fixtures") else {
        return;
    };
    let text = std::fs::read_to_string(dir.join("reference/tokenize.json")).expect("tokenize.json");
    let json: Value = serde_json::from_str(&text).expect("valid json");
    let model = dir.join(json["model"].as_str().expect("model"));
    let add_bos = json["add_bos"].as_bool().expect("add_bos");
    let file = GgufFile::open(&model).unwrap_or_else(|e| panic!("{e}"));
    let vocab = Vocab::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(vocab.n_vocab(), 1024);
    assert_eq!(vocab.nl(), Some(13));
    let cases = json["cases"].as_array().expect("cases");
    let mut bad = 0;
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let want = ids(&c["ids"]);
        let got = vocab.tokenize(text, add_bos, false);
        if got != want {
            bad += 1;
            println!("{text:?}\n  want {want:?}\n  got  {got:?}");
        }
    }
    println!("fixture: {} cases, {bad} mismatching", cases.len());
    assert_eq!(bad, 0);
}
