//! The compiled CPU engine against llama.cpp on every real model with a reference in
//! `shared/reference/`: SmolLM2 135M in each weight type of `variants.json` (the files
//! `scripts/make-variants` makes with `modelc quantize`, byte-identical to llama-quantize's) and
//! Gemma 3 270M Q4_K_M.
//!
//! modelc claims llama.cpp's x86 (AVX2) logits bit for bit with `--kernels exact`, so that is
//! what is asserted, per model, on every prompt (the ~770-token one included):
//! - teacher-forced: each prompt decoded in the calls llama.cpp made
//!   (`server_prompt_decode_calls`), then llama.cpp's greedy tokens fed back one at a time; at
//!   every generated position our log-probabilities (softmax of the logits in double
//!   precision, as the reference computed them) of llama.cpp's top 5 equal its figures to the
//!   precision they were printed with (half a unit of the last printed digit, at least
//!   [`SLOP`] for the double-precision sum's own rounding), and no other token enters our top 5;
//! - free-running greedy text (our own argmax fed back) equal to llama.cpp's completion (read
//!   off the teacher-forced pass: while our argmax is llama.cpp's token, the tokens fed are
//!   our own greedy ones).
//!
//! `MODELC_VARIANTS_PROMPTS=english,code` compares only those prompts (the emulated aarch64
//! run of `scripts/test-aarch64`, where the whole set takes too long).
//!
//! One f32 ulp of difference in a logit moves a log-probability by about 1e-7 or more, far
//! above [`SLOP`], so a kernel that leaves llama.cpp's order fails here.

use std::path::Path;

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;

/// What two double-precision log-softmaxes of the same f32 logits may differ by when their
/// sums run in other orders (nat): far below one f32 ulp of a logit's effect.
const SLOP: f64 = 1e-10;

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
    /// Positions whose log-probabilities are not llama.cpp's: (prompt id, position, excess
    /// over the printed precision in nat).
    differ: Vec<(String, usize, f64)>,
    worst: f64,
    /// (prompt id, tokens equal before the first difference, llama.cpp's token count).
    greedy: Vec<(String, usize, usize)>,
}

/// Half a unit of the last significant digit `v` was printed with: the shortest decimal
/// that reads back as `v` has as many digits as the reference wrote (9 for files written as
/// float32 text, up to 17 for double).
fn printed_precision(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return 0.0;
    }
    let digits = (1..=17usize)
        .find(|&d| format!("{:.*e}", d - 1, v).parse::<f64>() == Ok(v))
        .unwrap_or(17);
    let exp = v.abs().log10().floor() as i32;
    0.5 * 10f64.powi(exp - digits as i32 + 1)
}

/// How far our log-probabilities at one position exceed llama.cpp's top 5 `want` beyond the
/// precision it printed them with (0 when they are its figures): each of its five tokens
/// compared, and any other token of our top 5 by how far it rises above its fifth.
fn excess(logits: &[f32], want: &serde_json::Value) -> f64 {
    let want: Vec<(usize, f64)> = want
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e[0].as_u64()? as usize, e[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        want.len(),
        5,
        "the reference lists a top 5 at every position"
    );
    let lp = log_softmax(logits);
    let mut excess = 0f64;
    for &(t, r) in &want {
        let tol = printed_precision(r).max(SLOP);
        excess = excess.max((lp[t] - r).abs() - tol);
    }
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    let fifth = want[4].1;
    for &t in &order[..5] {
        if !want.iter().any(|w| w.0 == t) {
            excess = excess.max(lp[t] - fifth - printed_precision(fifth).max(SLOP));
        }
    }
    excess.max(0.0)
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
    let mut r = Report::default();
    // A subset of the prompts by id (`english,code`), for emulated runs (scripts/test-aarch64).
    let only = std::env::var("MODELC_VARIANTS_PROMPTS").ok();
    for p in v["prompts"].as_array().expect("prompts") {
        let id = p["id"].as_str().unwrap_or("?").to_string();
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|x| x == id))
        {
            continue;
        }
        let tokens = ids(&p["tokens_add_special_true"]);
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
        let top5 = p["teacher_forced"]["top5"].as_array().expect("top5");
        // Teacher-forced: llama.cpp's greedy tokens fed back. While our argmax is that token
        // the fed sequence is our own greedy one, so the same pass gives the free-running
        // greedy text's agreement (`same`: the first position where they part).
        let mut logits = prefill(&mut s, &tokens, &calls);
        let mut same = None;
        for i in 0..top5.len().max(completion.len()) {
            if let Some(want) = top5.get(i) {
                let e = excess(&logits, want);
                r.positions += 1;
                r.worst = r.worst.max(e);
                if e > 0.0 {
                    r.differ.push((id.clone(), i, e));
                }
            }
            if same.is_none() && completion.get(i) != Some(&argmax(&logits)) {
                same = Some(i.min(completion.len()));
            }
            if i + 1 < top5.len().max(completion.len()) && i < completion.len() {
                logits = s
                    .decode(&[completion[i]], tokens.len() + i, false)
                    .expect("decode")
                    .to_vec();
            } else {
                break;
            }
        }
        let same = same.unwrap_or(completion.len());
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
    eprintln!(
        "{file}: teacher-forced {}/{} positions equal to llama.cpp's printed log-probabilities \
         (worst excess {:.3e} nat)",
        r.positions - r.differ.len(),
        r.positions,
        r.worst
    );
    for (id, same, n) in &r.greedy {
        eprintln!("  greedy {id:9}: {same}/{n} tokens equal");
    }
    assert!(r.positions > 0, "no positions compared");
    assert!(
        r.differ.is_empty(),
        "{file}: log-probabilities differ from llama.cpp's at {} of {} positions \
         (prompt, position, nat beyond the printed precision; first 8): {:?}",
        r.differ.len(),
        r.positions,
        &r.differ[..r.differ.len().min(8)]
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

/// The criterion itself: a reference printed from our own log-probabilities (9 significant
/// digits, as the Q4_1 and Gemma files; 17, as the others) is met, and one f32 ulp more in
/// the logit of any of the five tokens compared is not. (A logit outside the top 5 shows only
/// through the softmax's sum, which one ulp of a small probability does not move.)
#[test]
fn one_ulp_in_a_logit_is_a_difference() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 / 97.0 - 3.0)
        .collect();
    let lp = log_softmax(&logits);
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    for digits in [9usize, 17] {
        let printed = |v: f64| -> f64 {
            format!("{:.*e}", digits - 1, v)
                .parse()
                .expect("a formatted float parses")
        };
        let want = serde_json::json!(order[..5]
            .iter()
            .map(|&t| serde_json::json!([t, printed(lp[t])]))
            .collect::<Vec<_>>());
        assert_eq!(
            excess(&logits, &want),
            0.0,
            "{digits} digits: our own figures"
        );
        for &t in &order[..5] {
            let mut moved = logits.clone();
            moved[t] = f32::from_bits(moved[t].to_bits() + 1);
            assert!(
                excess(&moved, &want) > 0.0,
                "{digits} digits: one ulp more in logit {t} went unnoticed"
            );
        }
    }
}
