//! Gemma 3 270M Q4_K_M with the interpreter in llama.cpp's arithmetic
//! ([`InterpOptions::llama_cpp`]) against llama.cpp's reference
//! (`shared/reference/ref-gemma-3-270m-q4_k_m.json`): its Q4_K weights run the order of the
//! interleaved gemm / gemv kernels llama.cpp repacks them for (`ir::ggml::repacked_by_llama_cpp`),
//! its Q5_0 / Q6_K / Q8_0 weights `ir::ggml::vec_dot_avx2_mul_mat` (vec_dot, tinyBLAS, the
//! tiled K-quant kernel), its GELU llama.cpp's table. (The SmolLM2 variants are in
//! `smollm2_fidelity.rs`; the compiled runner's check of all of them is
//! `runtime/tests/variants.rs`.)
//!
//! Each prompt (`tokens_add_special_true`) is decoded in the calls llama.cpp made
//! (`server_prompt_decode_calls`: before the last 4 prompt tokens, then those 4), then
//! llama.cpp's greedy tokens are fed back one at a time. At each generated position the
//! deviation is the largest difference between our log-probability and llama.cpp's over
//! llama.cpp's top 5 (an id of our top 5 that llama.cpp does not list counts by how far it
//! rises above llama.cpp's fifth). Asserted: llama.cpp's logits (every deviation below
//! 1e-4) and its greedy continuation token for token. `MODELC_FULL_TESTS=1` adds the
//! ~760-token prompt.

use ir::gguf::GgufFile;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};

/// The tolerance of "close" (nat).
const CLOSE: f64 = 0.1;

mod reference;
use modelc_tests::log_softmax;
use reference::{load_prompts, Prompt};

/// How one model compares with its reference.
#[derive(Default)]
struct Report {
    positions: usize,
    close: usize,
    worst: f64,
    /// Prompts whose argmax equals llama.cpp's greedy token at every position.
    greedy_same: usize,
    prompts: usize,
}

/// Teacher-forces `p`; adds its positions to `r` and prints one line.
fn run_prompt(gguf: &GgufFile, model: &compiler::Model, p: &Prompt, label: &str, r: &mut Report) {
    let so = SessionOptions {
        n_ctx: 2048,
        n_ubatch: 512,
        interp: InterpOptions::llama_cpp(),
        ..SessionOptions::default()
    };
    let mut s = Session::new(gguf, model, so);
    let mut pos = 0usize;
    let mut logits = Vec::new();
    for &n in &p.calls {
        logits = s
            .eval(&p.tokens[pos..pos + n], pos as u32, &Outputs::Last)
            .expect("prompt eval")
            .values;
        pos += n;
    }
    assert_eq!(
        pos,
        p.tokens.len(),
        "{}: decode calls cover the prompt",
        p.id
    );
    let mut max_dev = 0f64;
    let mut first_split = None;
    for (i, want) in p.top5.iter().enumerate() {
        let lp = log_softmax(&logits);
        let mut dev = 0f64;
        for &(id, ref_lp) in want {
            dev = dev.max((lp[id as usize] - ref_lp).abs());
        }
        let mut order: Vec<usize> = (0..lp.len()).collect();
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
        let fifth = want.last().map_or(f64::NEG_INFINITY, |w| w.1);
        for &id in &order[..5] {
            if !want.iter().any(|w| w.0 as usize == id) {
                dev = dev.max(lp[id] - fifth);
            }
        }
        r.positions += 1;
        r.close += (dev <= CLOSE) as usize;
        max_dev = max_dev.max(dev);
        let top = want.first().map_or(u32::MAX, |w| w.0);
        if first_split.is_none() && order[0] as u32 != top {
            first_split = Some((i, top, order[0]));
        }
        if i + 1 < p.top5.len() {
            let tok = p.completion[i];
            logits = s
                .eval(&[tok], (p.tokens.len() + i) as u32, &Outputs::Last)
                .expect("decode")
                .values;
        }
    }
    r.worst = r.worst.max(max_dev);
    r.prompts += 1;
    r.greedy_same += first_split.is_none() as usize;
    let split = match first_split {
        None => format!("argmax = llama.cpp's at all {} positions", p.top5.len()),
        Some((i, a, b)) => format!("argmax first differs at position {i}: llama.cpp {a}, ours {b}"),
    };
    eprintln!(
        "{label}: {:9} ({} tokens) max deviation {max_dev:.2e}; {split}",
        p.id,
        p.tokens.len()
    );
}

/// What a model must reach.
struct Expect {
    /// Least share of positions within [`CLOSE`].
    close_share: f64,
    /// Largest deviation at any position (nat).
    worst: f64,
    /// Every prompt's greedy continuation reproduced.
    greedy: bool,
}

/// Runs every prompt of `reference` on `model_path` and checks `expect`.
fn check(model_path: Option<std::path::PathBuf>, reference: &str, label: &str, expect: Expect) {
    let (Some(reference), Some(path)) = (modelc_tests::shared(reference), model_path) else {
        return;
    };
    let gguf = GgufFile::open(&path).expect("open the model");
    let model = compiler::load_model(&gguf).expect("the model lowers");
    let full = std::env::var_os("MODELC_FULL_TESTS").is_some();
    let mut r = Report::default();
    for p in &load_prompts(&reference) {
        if p.tokens.len() > 100 && !full {
            eprintln!(
                "{label}: {} ({} tokens) skipped; set MODELC_FULL_TESTS=1 to run it",
                p.id,
                p.tokens.len()
            );
            continue;
        }
        run_prompt(&gguf, &model, p, label, &mut r);
    }
    let share = r.close as f64 / r.positions.max(1) as f64;
    eprintln!(
        "{label}: {}/{} positions within {CLOSE} nat ({:.1}%), worst {:.2e} nat, greedy \
         reproduced in {}/{} prompts",
        r.close,
        r.positions,
        100.0 * share,
        r.worst,
        r.greedy_same,
        r.prompts
    );
    assert!(r.positions > 0, "{label}: no position compared");
    assert!(
        share >= expect.close_share,
        "{label}: {:.1}% of positions within {CLOSE} nat, expected {:.1}%",
        100.0 * share,
        100.0 * expect.close_share
    );
    assert!(
        r.worst <= expect.worst,
        "{label}: worst deviation {} nat exceeds {}",
        r.worst,
        expect.worst
    );
    if expect.greedy {
        assert_eq!(
            r.greedy_same, r.prompts,
            "{label}: greedy continuation differs"
        );
    }
}

/// Gemma 3 Q4_K_M: its Q4_K weights (all repacked), Q5_0 and Q6_K weights, and its GELU
/// (llama.cpp's f16 table, whose entries GCC computes with a fused multiply-add:
/// `ir::ggml::cpu_math::gelu_table_value`) give llama.cpp's logits on the reference prompts,
/// decoded in llama.cpp's split (all but the last 4 prompt tokens, then the last 4). The
/// SmolLM2 variants, repacked ones included, are in `smollm2_fidelity.rs`.
#[test]
#[ignore = "about 3 minutes of interpreter on 2 cores; CI checks the compiled runner on Gemma 3 (runtime/tests/variants.rs): cargo test --release -p compiler --test gemma3_fidelity -- --ignored"]
fn gemma3_q4_k_m_matches_llama_cpp() {
    check(
        modelc_tests::gemma3(),
        "reference/ref-gemma-3-270m-q4_k_m.json",
        "Gemma 3 Q4_K_M",
        Expect {
            close_share: 1.0,
            worst: 1e-4,
            greedy: true,
        },
    );
}
