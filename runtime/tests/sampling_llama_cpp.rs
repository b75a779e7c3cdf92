//! Seeded sampling against llama.cpp: with the same `-s`, the default sampler chain (top-k,
//! top-p, min-p, temperature, the draw) and variations of it (top-k off, top-p off, repetition,
//! presence and frequency penalties, a Q8_0 KV cache), `modelc run` writes the text
//! llama-completion wrote. The logits are llama.cpp's bit for bit, the chain follows
//! llama.cpp's arithmetic and the draws come from `std::mt19937` as libstdc++ turns them into
//! doubles (`runtime/src/mt19937.rs`). Expected texts and the command that made them:
//! `tests/data/sampling_llama_cpp.json`.
//!
//! Needs SmolLM2-135M-Instruct Q4_1 (`modelc_tests::smollm2`).

mod common;

use common::{model, modelc};
use serde_json::Value;
use std::path::Path;

#[test]
fn seeded_samples_equal_llama_cpp() {
    let Some(m) = model() else { return };
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sampling_llama_cpp.json");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(p).expect("reference data")).expect("json");
    let mut bad = Vec::new();
    for c in r["cases"].as_array().expect("cases") {
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg"))
            .collect();
        let out = modelc()
            .arg("run")
            .arg(&m)
            .args([
                "-p",
                c["prompt"].as_str().expect("prompt"),
                "-t",
                "2",
                "-c",
                "2048",
            ])
            .args(&args)
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = String::from_utf8_lossy(&out.stdout);
        let want = c["content"].as_str().expect("content");
        if got.trim_end() != want.trim_end() {
            bad.push(format!("{args:?}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "sampled text differs from llama.cpp's:\n{}",
        bad.join("\n")
    );
}
