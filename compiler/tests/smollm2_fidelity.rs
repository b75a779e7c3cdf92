//! SmolLM2-135M-Instruct against llama.cpp: teacher-forced top-5 log-probabilities
//! (`shared/reference/ref-SmolLM2-135M-Instruct.TYPE.json`, field `teacher_forced.top5`),
//! for the Q4_1 file and for every requantized variant whose model file is present
//! (`scripts/make-variants` makes them in the models folder).
//!
//! Each prompt (`tokens_add_special_true`) is decoded in the calls llama.cpp made
//! (`server_prompt_decode_calls`), then llama.cpp's greedy tokens (`completion.tokens`) are
//! fed back one at a time. At every generated position the log-probability of each of
//! llama.cpp's top-5 ids must be within 0.1 nat of llama.cpp's, and any id of our top 5
//! missing from llama.cpp's must rank below llama.cpp's fifth within that tolerance (ids may
//! swap only where their log-probabilities are that close). The README of
//! `shared/reference/` gives the scale: llama.cpp itself moves by about 0.05 nat on this
//! model when the prompt is batched differently, and by up to 0.35 nat when the 8-bit
//! activation rounding is dropped (an F32 copy of the weights).
//!
//! With llama.cpp's arithmetic ([`InterpOptions::llama_cpp`]: 8-bit activation rounding,
//! flash attention, x86 operation order) the interpreter reproduces llama.cpp's logits bit for
//! bit, so the deviation printed is 0; the test asserts the tolerance above and the aim
//! of 0.02. `MODELC_FULL_TESTS=1` adds the 774-token prompt (tiled flash attention, split-KV
//! decode) and a report with exact f32 activations (about 3 minutes in a release build). The
//! model comes from `scripts/fetch-model` (`modelc_tests::smollm2`).
//!
//! The variants (one test each, `variant_*`) print, per type, the share of teacher-forced
//! positions where all five log-probabilities are within 0.1 nat, the largest deviation, and
//! whether our argmax is llama.cpp's greedy token everywhere; they are held to the same
//! tolerance and aim as Q4_1. SmolLM2's `n_embd` (576) is not a multiple of 256, so the
//! K-quant mixes keep K types only for `ffn_down` and fall back to Q4_0 / Q5_0 / Q5_1 /
//! IQ4_NL elsewhere (the kernels each file exercises are listed at [`variants!`]). Prompts
//! are decoded in one call, so every product with a weight runs llama.cpp's kernel for many
//! columns (tinyBLAS, the tiled K-quant kernel, the repacked kernels) and then, token by
//! token, its `vec_dot`.

use ir::gguf::GgufFile;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};

const TOLERANCE: f64 = 0.1;

mod reference;
use modelc_tests::log_softmax;
use reference::{load_prompts, Prompt};

/// Outcome of one prompt: largest deviation, the position where ours and llama.cpp's argmax
/// first differ (if any) with both candidates' log-probabilities.
struct Outcome {
    max_dev: f64,
    first_split: Option<(usize, u32, f64, u32, f64)>,
    /// Teacher-forced positions.
    positions: usize,
    /// Positions where all of llama.cpp's top 5 are within [`TOLERANCE`].
    within: usize,
    /// Positions where our argmax is llama.cpp's.
    argmax_agrees: usize,
}

/// Teacher-forces prompt `p`; with `strict`, asserts the tolerances at every position.
fn run_prompt(
    gguf: &GgufFile,
    model: &compiler::Model,
    p: &Prompt,
    opts: InterpOptions,
    strict: bool,
) -> Outcome {
    let so = SessionOptions {
        n_ctx: 2048,
        n_ubatch: 512,
        interp: opts,
        ..SessionOptions::default()
    };
    let mut s = Session::new(gguf, model, so);
    let mut pos = 0usize;
    let mut last = None;
    for &n in &p.calls {
        let l = s
            .eval(&p.tokens[pos..pos + n], pos as u32, &Outputs::Last)
            .expect("prompt eval");
        pos += n;
        last = Some(l.values);
    }
    assert_eq!(
        pos,
        p.tokens.len(),
        "{}: decode calls cover the prompt",
        p.id
    );
    let mut logits = last.expect("at least one decode call");
    let mut out = Outcome {
        max_dev: 0.0,
        first_split: None,
        positions: 0,
        within: 0,
        argmax_agrees: 0,
    };
    for (i, want) in p.top5.iter().enumerate() {
        let lp = log_softmax(&logits);
        let mut pos_dev: f64 = 0.0;
        for &(id, ref_lp) in want {
            let d = (lp[id as usize] - ref_lp).abs();
            pos_dev = pos_dev.max(d);
            out.max_dev = out.max_dev.max(d);
            assert!(
                !strict || d <= TOLERANCE,
                "{} position {i}: id {id} logprob {} vs llama.cpp {ref_lp}",
                p.id,
                lp[id as usize]
            );
        }
        // Our top 5: an id llama.cpp does not list must rank below its fifth (within tolerance).
        let mut order: Vec<usize> = (0..lp.len()).collect();
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
        let fifth = want.last().map_or(f64::NEG_INFINITY, |w| w.1);
        for &id in &order[..5] {
            if !want.iter().any(|w| w.0 as usize == id) {
                assert!(
                    !strict || lp[id] <= fifth + TOLERANCE,
                    "{} position {i}: id {id} ({}) is in our top 5, llama.cpp's fifth is {fifth}",
                    p.id,
                    lp[id]
                );
            }
        }
        out.positions += 1;
        out.within += (pos_dev <= TOLERANCE) as usize;
        out.argmax_agrees += (order[0] as u32 == want[0].0) as usize;
        if out.first_split.is_none() && order[0] as u32 != want[0].0 {
            out.first_split = Some((
                i,
                want[0].0,
                lp[want[0].0 as usize],
                order[0] as u32,
                lp[order[0]],
            ));
        }
        if i + 1 < p.top5.len() {
            let tok = p.completion[i];
            logits = s
                .eval(&[tok], (p.tokens.len() + i) as u32, &Outputs::Last)
                .expect("decode")
                .values;
        }
    }
    out
}

/// Largest deviation the 8-bit rounding mode may show (the aim; it reaches 0).
const AIM: f64 = 0.02;
/// Sanity bound for exact f32 activations: llama.cpp's own rounding moves SmolLM2's
/// log-probabilities by up to 0.35 nat at the first position (reference README) and more
/// later in a sequence; beyond 1 nat something is broken.
const EXACT_SANITY: f64 = 1.0;

#[test]
fn smollm2_teacher_forced_top5_matches_llama_cpp() {
    let (Some(reference), Some(path)) = (
        modelc_tests::shared("reference/ref-SmolLM2-135M-Instruct.Q4_1.json"),
        modelc_tests::smollm2(),
    ) else {
        return;
    };
    let gguf = GgufFile::open(&path).expect("open SmolLM2");
    let model = compiler::load_model(&gguf).expect("SmolLM2 lowers");
    let full = std::env::var_os("MODELC_FULL_TESTS").is_some();
    let prompts = load_prompts(&reference);
    let mut modes = vec![("8-bit rounding", InterpOptions::llama_cpp(), true)];
    if full {
        modes.push(("exact", InterpOptions::exact(), false));
    } else {
        eprintln!("exact f32 activations skipped; set MODELC_FULL_TESTS=1 to report them");
    }
    for (label, opts, strict) in modes {
        let mut worst: f64 = 0.0;
        for p in &prompts {
            if p.tokens.len() > 100 && !full {
                eprintln!(
                    "{label}: {} ({} tokens) skipped; set MODELC_FULL_TESTS=1 to run it",
                    p.id,
                    p.tokens.len()
                );
                continue;
            }
            let o = run_prompt(&gguf, &model, p, opts, strict);
            worst = worst.max(o.max_dev);
            let split = match o.first_split {
                None => format!("argmax = llama.cpp's at all {} positions", p.top5.len()),
                Some((i, a, la, b, lb)) => format!("argmax first differs at position {i}: llama.cpp {a} ({la:.4}) vs ours {b} ({lb:.4})"),
            };
            eprintln!(
                "{label}: {:9} max |Δ logprob| {:.5}; {split}",
                p.id, o.max_dev
            );
        }
        eprintln!("{label}: max deviation over all positions {worst:.5} nat");
        if strict {
            assert!(worst <= AIM, "{label}: {worst} nat exceeds {AIM}");
        } else {
            assert!(
                worst <= EXACT_SANITY,
                "{label}: {worst} nat exceeds {EXACT_SANITY}"
            );
        }
    }
}

/// Runs the short prompts (all with `MODELC_FULL_TESTS`) of variant `ty` of SmolLM2 in
/// llama.cpp mode, prints per prompt and in total the deviation from llama.cpp's
/// teacher-forced top 5, and asserts the tolerance at every position and the aim overall.
fn check_variant(ty: &str) {
    let (Some(reference), Some(path)) = (
        modelc_tests::shared(&format!("reference/ref-SmolLM2-135M-Instruct.{ty}.json")),
        modelc_tests::require(
            modelc_tests::models_dir().join(format!("SmolLM2-135M-Instruct.{ty}.gguf")),
            "scripts/make-variants makes it from the Q4_1 file",
        ),
    ) else {
        return;
    };
    let gguf = GgufFile::open(&path).expect("open the SmolLM2 variant");
    let model = compiler::load_model(&gguf).expect("SmolLM2 variant lowers");
    let full = std::env::var_os("MODELC_FULL_TESTS").is_some();
    let (mut worst, mut positions, mut within, mut agrees): (f64, usize, usize, usize) =
        (0.0, 0, 0, 0);
    for p in &load_prompts(&reference) {
        if p.tokens.len() > 100 && !full {
            eprintln!(
                "{ty}: {} ({} tokens) skipped; set MODELC_FULL_TESTS=1 to run it",
                p.id,
                p.tokens.len()
            );
            continue;
        }
        let o = run_prompt(&gguf, &model, p, InterpOptions::llama_cpp(), true);
        worst = worst.max(o.max_dev);
        positions += o.positions;
        within += o.within;
        agrees += o.argmax_agrees;
        let split = match o.first_split {
            None => format!("argmax = llama.cpp's at all {} positions", o.positions),
            Some((i, a, la, b, lb)) => format!(
                "argmax first differs at position {i}: llama.cpp {a} ({la:.4}) vs ours {b} ({lb:.4})"
            ),
        };
        eprintln!(
            "{ty}: {:9} max |Δ logprob| {:.5}; {}/{} positions within {TOLERANCE}; {split}",
            p.id, o.max_dev, o.within, o.positions
        );
    }
    eprintln!(
        "{ty}: {within}/{positions} positions ({:.1}%) within {TOLERANCE} nat; \
         worst {worst:.5} nat; greedy {} ({agrees}/{positions} argmax agree)",
        100.0 * within as f64 / positions.max(1) as f64,
        if agrees == positions {
            "agrees"
        } else {
            "differs"
        },
    );
    assert!(worst <= AIM, "{ty}: {worst} nat exceeds {AIM}");
}

/// One test per variant with a reference in `shared/reference/`; the comment after each
/// says which weight types the file holds and which of llama.cpp's x86 kernels they run
/// (repacked: ggml-cpu/repack.cpp, for weights with a multiple of 8 rows).
macro_rules! variants {
    ($($name:ident: $ty:literal;)*) => {$(
        #[doc = concat!("SmolLM2 ", $ty, " against llama.cpp ([`check_variant`]).")]
        #[test]
        #[ignore = "the interpreter takes about a minute per variant on 2 cores; CI checks the compiled runner on every variant (runtime/tests/variants.rs): cargo test --release -p compiler --test smollm2_fidelity -- --ignored"]
        fn $name() {
            check_variant($ty);
        }
    )*};
}

variants! {
    variant_q5_0: "Q5_0"; // Q5_0 (vec_dot, tinyBLAS), Q8_0 output
    variant_q5_1: "Q5_1"; // Q5_1 (vec_dot), Q8_0 output
    variant_q6_k: "Q6_K"; // Q8_0, Q6_K ffn_down (vec_dot, tiled)
    variant_q5_k_m: "Q5_K_M"; // Q5_1, Q8_0, Q6_K and Q5_K ffn_down (vec_dot, tiled)
    variant_q4_0: "Q4_0"; // Q4_0 repacked, Q8_0 output
    variant_q2_k: "Q2_K"; // Q4_0 repacked, Q3_K ffn_down (vec_dot, tiled)
    variant_q3_k_m: "Q3_K_M"; // Q4_0 repacked, Q5_0, Q5_1, Q4_K repacked, Q5_K
    variant_iq4_nl: "IQ4_NL"; // IQ4_NL repacked, Q5_K ffn_down (3 layers)
    variant_iq4_xs: "IQ4_XS"; // IQ4_NL repacked, IQ4_XS and Q5_K ffn_down
    variant_f16: "F16"; // F16 (vec_dot, tinyBLAS)
    variant_bf16: "BF16"; // BF16 (vec_dot, tinyBLAS)
}
