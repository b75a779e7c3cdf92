//! Grammar-constrained generation against llama.cpp: with `--grammar` or `-j` (greedy and
//! seeded), `modelc run` writes the text llama-completion wrote — the constraint is applied
//! where llama.cpp applies it (sample, and only when the grammar rejects that token sample
//! again from the masked logits), so even the draws line up. Expected texts and the command
//! that made them: `tests/data/grammar_llama_cpp.json`. Also: masking SmolLM2's whole
//! vocabulary stays cheap.
//!
//! Needs SmolLM2-135M-Instruct Q4_1 (`modelc_tests::smollm2`).

mod common;

use common::{model, modelc};
use ir::gguf::GgufFile;
use runtime::grammar::{compile, json_schema, Matcher, TokenTable};
use runtime::tokenizer::Vocab;
use serde_json::Value;
use std::time::Instant;

#[test]
fn constrained_samples_equal_llama_cpp() {
    let Some(m) = model() else { return };
    let bad = common::cases_differing_from_llama_cpp(&m, "grammar_llama_cpp.json");
    assert!(
        bad.is_empty(),
        "constrained text differs from llama.cpp's:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_bad_grammar_is_one_line_and_no_generation() {
    let Some(m) = model() else { return };
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args(["-p", "x", "-n", "4", "--grammar", "root ::= \"a\" b"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 1, column 14: undefined rule 'b'"),
        "{err}"
    );
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args(["-p", "x", "-n", "4", "-j", "{\"type\": \"hiccup\"}"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized type hiccup"), "{err}");
}

/// Masking the 49k-token vocabulary at typical JSON positions: well under the time of a
/// decode step (a generous bound, for a loaded machine; the time is printed).
#[test]
fn masking_the_vocabulary_is_fast() {
    let Some(m) = model() else { return };
    let vocab = Vocab::from_gguf(&GgufFile::open(&m).expect("gguf")).expect("vocab");
    let t0 = Instant::now();
    let table = TokenTable::shared(&vocab);
    let t_table = t0.elapsed();
    let schema: Value = serde_json::from_str(
        r#"{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["name","n"]}"#,
    )
    .expect("json");
    let g = json_schema::to_grammar(&schema).expect("schema");
    let rules = compile(&g, &vocab, table).expect("grammar");
    let mut logits = vec![0.0f32; vocab.n_vocab()];
    let mut worst = std::time::Duration::ZERO;
    let mut m = Matcher::new(rules);
    for prefix in [
        "", "{", "\"name\"", ": \"Fel", "ix\", ", "\"n\": 1", "\n  ", "}",
    ] {
        assert!(m.accept_str(prefix), "{prefix:?}");
        let t = Instant::now();
        for _ in 0..10 {
            logits.fill(0.0);
            m.apply(&mut logits);
        }
        let each = t.elapsed() / 10;
        worst = worst.max(each);
        eprintln!("{prefix:?}: {each:?}");
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        // The grouped mask decides as llama.cpp's token-by-token check does.
        for id in 0..vocab.n_vocab() as u32 {
            assert_eq!(
                m.allows(id),
                logits[id as usize].is_finite(),
                "{prefix:?}: token {id}"
            );
        }
        assert!(
            allowed > 0 && allowed < vocab.n_vocab(),
            "{prefix:?}: {allowed} allowed"
        );
    }
    eprintln!("token table {t_table:?}; slowest full mask {worst:?}");
    assert!(worst.as_millis() < 50, "a full mask took {worst:?}");
}
