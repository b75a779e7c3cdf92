//! Helpers shared by the compiler's integration tests: locating `shared/`, reading the
//! llama.cpp reference files, running a model through the interpreter.

#![allow(dead_code)]

use ir::gguf::GgufFile;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};
use std::path::PathBuf;

/// `shared/` next to the repository (`../shared` in CI) when its `fixtures/` is there, or
/// `None` after a recorded skip ([`modelc_tests::require`]).
pub fn shared_dir() -> Option<PathBuf> {
    modelc_tests::shared("fixtures")?;
    Some(modelc_tests::shared_root())
}

/// Raw little-endian f32 values of a reference file.
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The 32-token fixture prompt.
pub fn fixture_prompt(shared: &std::path::Path) -> Vec<u32> {
    let s = std::fs::read_to_string(shared.join("fixtures/reference/prompt.json"))
        .expect("prompt.json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("prompt.json parses");
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits of `prompt` for a fixture: all 32 tokens in one ubatch (`step == false`) or one
/// token per call (`step == true`), with llama.cpp's settings (n_ctx 256, F16 KV cache).
pub fn fixture_logits(
    gguf: &GgufFile,
    prompt: &[u32],
    step: bool,
    opts: InterpOptions,
) -> Vec<f32> {
    let model = compiler::load_model(gguf).expect("model lowers");
    let so = SessionOptions {
        n_ctx: 256,
        interp: opts,
        ..SessionOptions::default()
    };
    let mut s = Session::new(gguf, &model, so);
    if step {
        let mut out = Vec::new();
        for (i, &t) in prompt.iter().enumerate() {
            out.extend(s.eval(&[t], i as u32, &Outputs::Last).expect("eval").values);
        }
        out
    } else {
        s.eval(prompt, 0, &Outputs::All).expect("eval").values
    }
}
