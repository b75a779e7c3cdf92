//! Draftless speculative decoding (`--spec-type ngram-simple`, [`runtime::speculative`]):
//! greedy output with speculation is the output without it, token for token, on SmolLM2 and
//! on the fixtures (the sliding-window gemma3 and fused phi3 included); a draft verified in
//! one multi-token step gives each position the logits one-token steps give, bit for bit
//! (the exact kernels); a rejected draft, truncated away, leaves the session as if it had
//! never been tried (the next logits bit-identical). A plain multi-token step is not always
//! bit-identical to one-token steps (llama.cpp's own kernel choice by ubatch size: F16 / F32
//! weights take tinyBLAS from two tokens, K-quants a tiled kernel from four, flash attention
//! the split-KV path for one token at a padded KV length of 512 or more and the tiled kernel
//! for 64 tokens), so verification computes each row as its token alone
//! ([`Session::eval_as_singles`]).
//!
//! With a draft model (`-md`, [`DraftModel`]): the same, the draft being a second file of
//! the same fixture in another weight type (high acceptance) or another fixture (low).

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::generate::{generate, Completion, GenerateOptions};
use runtime::sampler::SamplerParams;
use runtime::session::Session;
use runtime::speculative::draft::{check_compatible, DraftModel, DraftParams};
use runtime::speculative::NgramParams;
use runtime::tokenizer::Vocab;

/// The step sizes `modelc run --spec-type` compiles (both kinds of logits).
const UBATCHES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

fn engine<'a>(gguf: &'a GgufFile, n_ctx: u32) -> CpuEngine<'a> {
    let model = compiler::load_model(gguf).expect("model lowers");
    let plan = build_plan(&model, &UBATCHES, n_ctx, KvTypes::F16, LogitRows::Both).expect("plan");
    CpuEngine::new(gguf, plan, 2).expect("compiles")
}

fn greedy(n: i64, spec: Option<NgramParams>) -> GenerateOptions {
    GenerateOptions {
        n_predict: n,
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        ignore_eos: true,
        speculative: spec,
        ..GenerateOptions::default()
    }
}

/// Greedy without, then with speculation, each on a fresh sequence.
fn both(
    e: &mut CpuEngine<'_>,
    vocab: &Vocab,
    prompt: &[u32],
    n: i64,
    spec: NgramParams,
) -> (Completion, Completion) {
    let mut s = Session::single(e).expect("session");
    let plain = generate(&mut s, vocab, prompt, &greedy(n, None), &mut |_| {}).expect("plain");
    s.clear();
    let fast = generate(&mut s, vocab, prompt, &greedy(n, Some(spec)), &mut |_| {}).expect("spec");
    (plain, fast)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len())
        .max_by(|&i, &j| v[i].total_cmp(&v[j]).then(j.cmp(&i)))
        .expect("logits") as u32
}

/// A source file and a request to repeat it with a rename: the answer copies the context.
const CODE_PROMPT: &str = r#"fn count_words(text: &str) -> usize {
    let mut count = 0;
    for word in text.split_whitespace() {
        if !word.is_empty() {
            count += 1;
        }
    }
    count
}

fn longest_word(text: &str) -> Option<&str> {
    let mut best: Option<&str> = None;
    for word in text.split_whitespace() {
        match best {
            Some(b) if b.len() >= word.len() => {}
            _ => best = Some(word),
        }
    }
    best
}

fn main() {
    let text = "the quick brown fox jumps over the lazy dog";
    let count = count_words(text);
    println!("{} words", count);
    if let Some(w) = longest_word(text) {
        println!("longest: {}", w);
    }
}

Rewrite the program above with the variable `count` renamed to `total`. Answer with the code only.

The same program with the variable `count` renamed to `total`:

fn count_words(text: &str) -> usize {
"#;

#[test]
fn smollm2_greedy_equals_plain_with_llama_cpp_defaults() {
    let Some(path) = modelc_tests::smollm2() else {
        return;
    };
    let gguf = GgufFile::open(path).expect("SmolLM2 opens");
    let vocab = Vocab::from_gguf(&gguf).expect("vocab");
    // Past 256 positions the one-token steps take flash attention's split-KV path (a
    // padded KV length of 512): a draft verified as one plain multi-token ubatch parted
    // from the plain output at token 118 here.
    let mut e = engine(&gguf, 1024);
    let prompt = vocab.tokenize(CODE_PROMPT, true, true);
    let (plain, fast) = both(&mut e, &vocab, &prompt, 160, NgramParams::default());
    assert_eq!(
        fast.tokens, plain.tokens,
        "speculation changed the greedy output"
    );
    assert_eq!(fast.content, plain.content);
    let t = &fast.timings;
    assert!(t.draft_n > 0, "nothing was drafted: {:?}", fast.content);
    let accepted = t.draft_n_accepted.expect("accepted count with drafts");
    assert!(
        accepted > 0 && accepted <= t.draft_n,
        "{accepted} of {} drafted tokens accepted",
        t.draft_n
    );
    assert_eq!(plain.timings.draft_n, 0);
    assert_eq!(plain.timings.draft_n_accepted, None);
}

#[test]
fn fixtures_greedy_equals_plain() {
    // One-token n-grams, so that random weights get drafts, most of them rejected, on a
    // short context.
    let spec = NgramParams {
        size_n: 1,
        size_m: 6,
    };
    let prompt: Vec<u32> = (0..3).flat_map(|_| 40u32..58).collect();
    let (mut checked, mut drafted) = (0, 0);
    for name in [
        "llama-sep-Q4_1",
        "llama-tied-Q4_K",
        "qwen2-Q8_0",
        "qwen3-Q4_K",
        "gemma3-Q4_K",
        "phi3-Q8_0",
    ] {
        let Some(path) = modelc_tests::shared(&format!("fixtures/models/{name}.gguf")) else {
            continue;
        };
        let gguf = GgufFile::open(path).expect("fixture opens");
        let vocab = Vocab::from_gguf(&gguf).expect("vocab");
        let mut e = engine(&gguf, 160);
        let (plain, fast) = both(&mut e, &vocab, &prompt, 64, spec);
        assert_eq!(
            fast.tokens, plain.tokens,
            "{name}: speculation changed the output"
        );
        drafted += fast.timings.draft_n;
        eprintln!(
            "{name}: {} drafted, {:?} accepted",
            fast.timings.draft_n, fast.timings.draft_n_accepted
        );
        checked += 1;
    }
    assert!(checked == 0 || drafted > 0, "nothing was drafted");
    assert!(checked > 0 || !modelc_tests::required());
}

/// The verification step on `gguf`: a rejected draft, truncated away, leaves the next logits
/// bit for bit as if it had never been evaluated; the rows of a multi-token step equal the
/// one-token steps' bit for bit where `batch_exact` (weights whose kernels sum in one order
/// for every step size), else within 0.01 (llama.cpp's own split: F16 / F32 weights take
/// tinyBLAS from two tokens on, K-quants the tiled kernel from four, `ggml_vec_dot_*` for
/// one).
fn rejected_draft_leaves_no_trace(gguf: &GgufFile, prompt: &[u32], batch_exact: bool) {
    let mut e = engine(gguf, 256);
    let n_vocab;
    // Reference: the prompt, then the greedy tokens one step at a time.
    let (t, singles) = {
        let mut s = Session::single(&mut e).expect("session");
        n_vocab = s.n_vocab();
        let mut next = argmax(s.eval(0, prompt, false).expect("prompt"));
        let t = next;
        let mut rows = Vec::new();
        for _ in 0..4 {
            let row = s.eval(0, &[next], false).expect("token").to_vec();
            next = argmax(&row);
            rows.push(row);
        }
        (t, rows)
    };
    let greedy: Vec<u32> = singles.iter().map(|r| argmax(r)).collect();

    let mut s = Session::single(&mut e).expect("session");
    s.eval(0, prompt, false).expect("prompt");
    let n0 = s.n_past(0);
    // A draft rejected at its first token: evaluated, truncated back, then the right token.
    s.eval(0, &[t], false).expect("token");
    let wrong = (greedy[0] + 1) % n_vocab as u32;
    s.eval(0, &[wrong, wrong, greedy[1]], true)
        .expect("bad draft");
    s.truncate(0, n0 + 1);
    assert_eq!(s.tokens(0)[n0..], [t]);
    let after = s.eval(0, &[greedy[0]], false).expect("token").to_vec();
    assert!(
        bits(&after) == bits(&singles[1]),
        "the logits after a rejected draft differ from a session that never tried it"
    );
    // A draft the model agrees with, verified in one step: every row as the one-token
    // steps give it.
    s.truncate(0, n0);
    let good = [t, greedy[0], greedy[1], greedy[2]];
    let rows = s.eval(0, &good, true).expect("verify").to_vec();
    for (i, single) in singles.iter().enumerate() {
        let row = &rows[i * n_vocab..(i + 1) * n_vocab];
        if batch_exact {
            assert!(
                bits(row) == bits(single),
                "row {i} of a {}-token step differs from the one-token step",
                good.len()
            );
        } else {
            let worst = row
                .iter()
                .zip(single)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-2, "row {i}: {worst} from the one-token step");
        }
    }
    // The same draft as verification evaluates it (each row as that token alone): bit for
    // bit the one-token steps, whatever the weights.
    s.truncate(0, n0);
    let rows = s.eval_as_singles(0, &good).expect("verify").to_vec();
    for (i, single) in singles.iter().enumerate() {
        assert!(
            bits(&rows[i * n_vocab..(i + 1) * n_vocab]) == bits(single),
            "row {i} of the verifying step differs from the one-token step"
        );
    }
    // And a rejected one, through the verifying step.
    s.truncate(0, n0 + 1);
    s.eval_as_singles(0, &[wrong, greedy[1], wrong])
        .expect("bad draft");
    s.truncate(0, n0 + 1);
    let after = s.eval(0, &[greedy[0]], false).expect("token").to_vec();
    assert!(
        bits(&after) == bits(&singles[1]),
        "the logits after a rejected verified draft differ from a session that never tried it"
    );
}
#[test]
fn smollm2_rejected_draft_leaves_no_trace() {
    let Some(path) = modelc_tests::smollm2() else {
        return;
    };
    let gguf = GgufFile::open(path).expect("SmolLM2 opens");
    let vocab = Vocab::from_gguf(&gguf).expect("vocab");
    let prompt = vocab.tokenize("The capital of France is Paris. The capital of", true, true);
    rejected_draft_leaves_no_trace(&gguf, &prompt, true);
}

#[test]
fn fixtures_rejected_draft_leaves_no_trace() {
    for (name, batch_exact) in [
        ("llama-sep-Q4_1", true),
        ("llama-sep-Q4_0", true),
        ("phi3-Q8_0", true),
        ("qwen2-Q8_0", true),
        ("gemma3-Q4_K", false),
        ("llama-sep-F16", false),
    ] {
        let Some(path) = modelc_tests::shared(&format!("fixtures/models/{name}.gguf")) else {
            continue;
        };
        let gguf = GgufFile::open(path).expect("fixture opens");
        // Past gemma3's sliding window of 8, so that its ring wraps.
        let prompt: Vec<u32> = (1u32..20).map(|i| i * 37 % 1000).collect();
        rejected_draft_leaves_no_trace(&gguf, &prompt, batch_exact);
    }
}

/// The draft model's engine: one-token and prompt steps, the last row's logits.
fn draft_engine<'a>(gguf: &'a GgufFile, n_ctx: u32) -> CpuEngine<'a> {
    let model = compiler::load_model(gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 64], n_ctx, KvTypes::F16, LogitRows::Last).expect("plan");
    CpuEngine::new(gguf, plan, 2).expect("compiles")
}

#[test]
fn fixtures_draft_model_greedy_equals_plain() {
    let prompt: Vec<u32> = (1u32..24).map(|i| i * 53 % 1000).collect();
    let mut checked = 0;
    for (target, draft, n_max) in [
        ("llama-sep-Q4_1", "llama-sep-Q8_0", 3),
        ("llama-sep-F16", "llama-sep-Q4_0", 5),
        ("qwen3-Q8_0", "qwen3-Q4_K", 4),
        ("gemma3-Q8_0", "gemma3-Q4_K", 3),
        ("phi3-Q8_0", "phi3-Q4_K", 2),
    ] {
        let (Some(tp), Some(dp)) = (
            modelc_tests::shared(&format!("fixtures/models/{target}.gguf")),
            modelc_tests::shared(&format!("fixtures/models/{draft}.gguf")),
        ) else {
            continue;
        };
        let (tg, dg) = (
            GgufFile::open(tp).expect("opens"),
            GgufFile::open(dp).expect("opens"),
        );
        let (tv, dv) = (
            Vocab::from_gguf(&tg).expect("vocab"),
            Vocab::from_gguf(&dg).expect("vocab"),
        );
        check_compatible(&tv, &dv).expect("the same fixture's vocabulary");
        let mut te = engine(&tg, 160);
        let mut de = draft_engine(&dg, 160);
        let mut s = Session::single(&mut te).expect("session");
        let plain = generate(&mut s, &tv, &prompt, &greedy(48, None), &mut |_| {}).expect("plain");
        s.clear();
        let params = DraftParams {
            n_max,
            ..DraftParams::default()
        };
        let mut d = DraftModel::new(
            Session::single(&mut de).expect("draft session"),
            params,
            tv.n_vocab(),
        );
        let fast = runtime::generate::generate_with_drafter(
            &mut s,
            &tv,
            &prompt,
            &greedy(48, None),
            Some(&mut d),
            &mut |_| {},
        )
        .expect("speculative");
        assert_eq!(fast.tokens, plain.tokens, "{target} drafted by {draft}");
        let t = &fast.timings;
        let accepted = t.draft_n_accepted.unwrap_or(0);
        eprintln!("{target} by {draft}: {accepted} of {} accepted", t.draft_n);
        assert!(t.draft_n > 0 && accepted > 0, "{target} by {draft}: {t:?}");
        // The draft session followed the target past the prompt.
        let held = d.session().tokens(0);
        let n = runtime::generate::common_prefix(held, s.tokens(0));
        assert!(
            n > prompt.len(),
            "the draft's session holds {n} of the target's tokens"
        );
        checked += 1;
    }
    assert!(checked > 0 || !modelc_tests::required());
}

/// llama.cpp's vocabulary check: a model's own vocabulary is compatible; Gemma 3's is not
/// SmolLM2's, and the reason is one line.
#[test]
fn draft_vocabularies_checked_as_llama_cpp() {
    let (Some(a), Some(b)) = (modelc_tests::smollm2(), modelc_tests::gemma3()) else {
        return;
    };
    let va = Vocab::from_gguf(&GgufFile::open(a).expect("opens")).expect("vocab");
    let vb = Vocab::from_gguf(&GgufFile::open(b).expect("opens")).expect("vocab");
    assert!(check_compatible(&va, &va).is_ok());
    let why = check_compatible(&va, &vb).expect_err("another vocabulary");
    assert!(!why.is_empty() && !why.contains('\n'), "{why}");
}
