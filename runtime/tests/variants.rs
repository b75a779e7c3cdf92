//! The compiled CPU engine against llama.cpp on every real model with a reference in
//! `shared/reference/`: SmolLM2 135M in each weight type of `variants.json` (the files
//! `scripts/make-variants` makes with `modelc quantize`, byte-identical to llama-quantize's) and Gemma 3 270M Q4_K_M.
//!
//! Per model (issue 11's criteria), with `--kernels exact`:
//! - teacher-forced: each prompt decoded in the calls llama.cpp made
//!   (`server_prompt_decode_calls`), then llama.cpp's greedy tokens fed back one at a time;
//!   at every generated position the log-probabilities of llama.cpp's top 5 against its
//!   figures (an id of our top 5 that llama.cpp does not list counts by how far it rises
//!   above llama.cpp's fifth): at least 95% of positions within 0.1 nat, none beyond 0.4;
//! - free-running greedy text (our own argmax fed back) equal to llama.cpp's completion.
//!
//! The ~770-token prompt runs when `MODELC_FULL_TESTS` is set.

use std::path::Path;

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;

/// Log-probability tolerance most positions must meet (nat).
const CLOSE: f64 = 0.1;
/// Share of positions that must be within [`CLOSE`].
const CLOSE_SHARE: f64 = 0.95;
/// No position may deviate more (nat).
const WORST: f64 = 0.4;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

use modelc_tests::log_softmax;

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// How one model compares with its reference.
#[derive(Default)]
struct Report {
    positions: usize,
    close: usize,
    worst: f64,
    /// (prompt id, tokens equal before the first difference, llama.cpp's token count).
    greedy: Vec<(String, usize, usize)>,
}

/// Deviation of our log-probabilities from llama.cpp's top 5 `want` at one position.
fn deviation(logits: &[f32], want: &serde_json::Value) -> f64 {
    let want: Vec<(usize, f64)> = want
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e[0].as_u64()? as usize, e[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let lp = log_softmax(logits);
    let mut dev = 0f64;
    for &(t, r) in &want {
        dev = dev.max((lp[t] - r).abs());
    }
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    let fifth = want.last().map_or(f64::NEG_INFINITY, |w| w.1);
    for &t in &order[..5] {
        if !want.iter().any(|w| w.0 == t) {
            dev = dev.max(lp[t] - fifth);
        }
    }
    dev
}

/// Decodes `tokens` from position 0 in llama.cpp's calls `calls` (token counts); the last
/// row's logits.
fn prefill(s: &mut Session<'_>, tokens: &[u32], calls: &[usize]) -> Vec<f32> {
    s.clear();
    let mut logits = Vec::new();
    let mut pos = 0;
    for &n in calls {
        logits = s
            .decode(&tokens[pos..pos + n], pos, false)
            .expect("prompt decode")
            .to_vec();
        pos += n;
    }
    logits
}

fn check(model: &Path, reference: &Path) -> Report {
    let gguf = GgufFile::open(model).expect("model opens");
    let m = compiler::load_model(&gguf).expect("model lowers");
    let s = std::fs::read_to_string(reference).expect("reference json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("reference parses");
    let plan = build_plan(&m, &[1, 512], 1024, KvTypes::F16, LogitRows::Last).expect("plan");
    let mut s = if std::env::var_os("MODELC_VARIANTS_INTERP").is_some() {
        // The reference interpreter instead (a diagnostic: where both differ from llama.cpp
        // the same way, the cause is shared).
        let opts = ir::interp::InterpOptions {
            n_threads: 2,
            ..ir::interp::InterpOptions::llama_cpp()
        };
        Session::single(runtime::interp_engine::InterpEngine::new(
            &gguf,
            &m,
            1024,
            512,
            KvTypes::F16,
            opts,
        ))
    } else {
        Session::single(CpuEngine::new(&gguf, plan, 2).expect("compiles"))
    }
    .expect("session");
    let full = std::env::var_os("MODELC_FULL_TESTS").is_some();
    let mut r = Report::default();
    for p in v["prompts"].as_array().expect("prompts") {
        let id = p["id"].as_str().unwrap_or("?").to_string();
        let tokens = ids(&p["tokens_add_special_true"]);
        if tokens.len() > 100 && !full {
            continue;
        }
        let mut calls: Vec<usize> = p["server_prompt_decode_calls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as usize)
                    .collect()
            })
            .unwrap_or_default();
        if calls.iter().sum::<usize>() != tokens.len() {
            calls = vec![tokens.len()];
        }
        // llama_decode splits a call into ubatches of at most n_ubatch (512) tokens.
        let calls: Vec<usize> = calls
            .iter()
            .flat_map(|&n| (0..n).step_by(512).map(move |i| (n - i).min(512)))
            .collect();
        let completion = ids(&p["completion"]["tokens"]);
        // Teacher-forced.
        let mut logits = prefill(&mut s, &tokens, &calls);
        for (i, want) in p["teacher_forced"]["top5"]
            .as_array()
            .expect("top5")
            .iter()
            .enumerate()
        {
            let dev = deviation(&logits, want);
            r.positions += 1;
            r.close += (dev <= CLOSE) as usize;
            r.worst = r.worst.max(dev);
            if i < completion.len() {
                logits = s
                    .decode(&[completion[i]], tokens.len() + i, false)
                    .expect("decode")
                    .to_vec();
            }
        }
        // Free-running greedy.
        let mut logits = prefill(&mut s, &tokens, &calls);
        let mut same = 0;
        for (i, &want) in completion.iter().enumerate() {
            let t = argmax(&logits);
            if t != want {
                break;
            }
            same += 1;
            if i + 1 < completion.len() {
                logits = s
                    .decode(&[t], tokens.len() + i, false)
                    .expect("decode")
                    .to_vec();
            }
        }
        r.greedy.push((id, same, completion.len()));
    }
    r
}

/// Runs [`check`] for the SmolLM2 variant `ty` (or the Gemma file) and asserts the criteria.
fn run(file: &str, reference: &str) {
    let how = "scripts/make-variants makes the SmolLM2 variants; scripts/fetch-model --gemma fetches Gemma";
    let (Some(model), Some(reference)) = (
        modelc_tests::require(modelc_tests::models_dir().join(file), how),
        modelc_tests::shared(&format!("reference/{reference}")),
    ) else {
        return;
    };
    let r = check(&model, &reference);
    let share = r.close as f64 / r.positions.max(1) as f64;
    eprintln!(
        "{file}: teacher-forced {}/{} positions within {CLOSE} nat ({:.1}%), worst {:.4} nat",
        r.close,
        r.positions,
        100.0 * share,
        r.worst
    );
    for (id, same, n) in &r.greedy {
        eprintln!("  greedy {id:9}: {same}/{n} tokens equal");
    }
    assert!(r.positions > 0, "no positions compared");
    assert!(
        share >= CLOSE_SHARE && r.worst <= WORST,
        "{file}: {:.1}% of positions within {CLOSE} nat (need {}%), worst {:.4} (limit {WORST})",
        100.0 * share,
        100.0 * CLOSE_SHARE,
        r.worst
    );
    let differ: Vec<_> = r.greedy.iter().filter(|g| g.1 != g.2).collect();
    assert!(
        differ.is_empty(),
        "{file}: greedy text differs from llama.cpp's: {differ:?}"
    );
}

macro_rules! variant {
    ($name:ident, $ty:literal) => {
        #[test]
        fn $name() {
            run(
                concat!("SmolLM2-135M-Instruct.", $ty, ".gguf"),
                concat!("ref-SmolLM2-135M-Instruct.", $ty, ".json"),
            );
        }
    };
}

variant!(smollm2_q4_0, "Q4_0");
variant!(smollm2_q4_1, "Q4_1");
variant!(smollm2_q5_0, "Q5_0");
variant!(smollm2_q5_1, "Q5_1");
variant!(smollm2_q2_k, "Q2_K");
variant!(smollm2_q3_k_m, "Q3_K_M");
variant!(smollm2_q5_k_m, "Q5_K_M");
variant!(smollm2_q6_k, "Q6_K");
variant!(smollm2_iq4_nl, "IQ4_NL");
variant!(smollm2_iq4_xs, "IQ4_XS");
variant!(smollm2_f16, "F16");
variant!(smollm2_bf16, "BF16");

#[test]
fn gemma3_270m_q4_k_m() {
    run(modelc_tests::GEMMA3, "ref-gemma-3-270m-q4_k_m.json");
}
