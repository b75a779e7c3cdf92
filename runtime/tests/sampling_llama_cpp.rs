//! Seeded sampling against llama.cpp: with the same `-s`, the default sampler chain (top-k,
//! top-p, min-p, temperature, the draw) and variations of it (top-k off, top-p off, repetition,
//! presence and frequency penalties, a Q8_0 KV cache), `modelc run` writes the text
//! llama-completion wrote. The logits are llama.cpp's bit for bit, the chain follows
//! llama.cpp's arithmetic and the draws come from `std::mt19937` as libstdc++ turns them into
//! doubles (`runtime/src/mt19937.rs`). Expected texts and the command that made them:
//! `tests/data/sampling_llama_cpp.json`; for the other samplers (typical, top-n-σ, XTC,
//! dynamic temperature, Mirostat 1 and 2, DRY, a reordered chain)
//! `tests/data/sampling_llama_cpp_chain.json`.
//!
//! Needs SmolLM2-135M-Instruct Q4_1 (`modelc_tests::smollm2`).

mod common;

use common::model;

#[test]
fn seeded_samples_equal_llama_cpp() {
    let Some(m) = model() else { return };
    let bad = common::cases_differing_from_llama_cpp(&m, "sampling_llama_cpp.json");
    assert!(
        bad.is_empty(),
        "sampled text differs from llama.cpp's:\n{}",
        bad.join("\n")
    );
}

#[test]
fn other_samplers_equal_llama_cpp() {
    let Some(m) = model() else { return };
    let bad = common::cases_differing_from_llama_cpp(&m, "sampling_llama_cpp_chain.json");
    assert!(
        bad.is_empty(),
        "sampled text differs from llama.cpp's:\n{}",
        bad.join("\n")
    );
}
