//! Continuous batching: one token of each of several sequences evaluated in one step of the
//! compiled CPU plan ([`Session::decode_batch`] → `Engine::decode_seqs`), and prompt chunks
//! mixed with other sequences' generated tokens in one step (`Engine::decode_runs`), give
//! every sequence the logits it gets alone, bit for bit — on weight types that take each kernel
//! family (generated Q4_1 kernels, repacked Q4_0 / Q4_K, row-dot Q8_0 / Q6_K), both
//! attention paths, and Gemma 3's sliding-window layers. The fast kernels
//! (`SumOrder::Block`) add a one-token product in another order than a many-token one (two
//! blocks per iteration at decode), and over 30 layers that moves logits by tenths (a
//! prompt of 8 against 8 one-token steps: 0.28): there a batched row is only close to the
//! row alone, with the same most likely token.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::{BatchToken, Session};

/// Nine prompts of different lengths (the sequences sit at different positions; nine, so
/// that a batched step has more than eight real rows and takes the 16-column tiles, which
/// must then compute one-column products).
const PROMPTS: [&[u32]; 9] = [
    &[
        504, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 284,
    ],
    &[1, 4093, 15, 2354, 314, 469, 1161, 30, 216],
    &[2, 17, 4],
    &[504, 1573, 33059, 9318, 418, 260, 5595],
    &[
        7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
    ],
    &[1, 2355, 314],
    &[12, 99, 1001, 4004, 505],
    &[33, 8081],
    &[2, 470, 260, 1573, 28, 5595, 19, 44],
];
/// Tokens each sequence is then fed, one per step.
const NEXT: [u32; 3] = [897, 3163, 28];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `PROMPTS[i]` alone, then `NEXT` one at a time: the logit rows of the `NEXT` tokens.
fn alone(e: &mut CpuEngine<'_>, prompt: &[u32]) -> Vec<Vec<u32>> {
    let mut s = Session::single(e).expect("session");
    s.eval(0, prompt, false).expect("prompt");
    NEXT.iter()
        .map(|&t| bits(s.eval(0, &[t], false).expect("token")))
        .collect()
}

/// Every sequence's `NEXT` tokens batched together (after the prompts, also in one batch)
/// equal each sequence alone.
fn check(path: Option<std::path::PathBuf>, flash: bool, order: codegen_cpu::SumOrder) {
    check_kv(path, flash, order, KvTypes::F16)
}

fn check_kv(
    path: Option<std::path::PathBuf>,
    flash: bool,
    order: codegen_cpu::SumOrder,
    kv: KvTypes,
) {
    let Some(path) = path else { return };
    let gguf = GgufFile::open(&path).expect("model opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 2, 4, 8, 16], 64, kv, LogitRows::Both).expect("plan");
    let mut e = CpuEngine::with_sum_order(&gguf, plan, 2, order).expect("compiles");
    e.set_flash_attn(flash).expect("attention path");
    let want: Vec<_> = PROMPTS.iter().map(|p| alone(&mut e, p)).collect();

    let mut s = Session::new(Box::new(&mut e), PROMPTS.len()).expect("session");
    let n_vocab = s.n_vocab();
    let prompts: Vec<BatchToken> = PROMPTS
        .iter()
        .enumerate()
        .flat_map(|(q, p)| {
            p.iter().enumerate().map(move |(i, &token)| BatchToken {
                token,
                seq: 10 + q as u32,
                logits: i + 1 == p.len(),
            })
        })
        .collect();
    s.decode_batch(&prompts).expect("prompts");
    for (k, &t) in NEXT.iter().enumerate() {
        // Every sequence one token; sequence 2 asks for no logits.
        let batch: Vec<BatchToken> = (0..PROMPTS.len())
            .rev()
            .map(|q| BatchToken {
                token: t,
                seq: 10 + q as u32,
                logits: q != 2,
            })
            .collect();
        let out = s.decode_batch(&batch).expect("batched step");
        assert_eq!(out.len(), (PROMPTS.len() - 1) * n_vocab);
        let mut row = 0;
        for q in (0..PROMPTS.len()).rev().filter(|&q| q != 2) {
            let got = bits(&out[row * n_vocab..(row + 1) * n_vocab]);
            if order == codegen_cpu::SumOrder::Ggml {
                assert!(
                    got == want[q][k],
                    "{}: sequence {q}, token {k}: the batched logits differ from the sequence alone",
                    path.display()
                );
            } else {
                let worst = got
                    .iter()
                    .zip(&want[q][k])
                    .map(|(&a, &b)| (f32::from_bits(a) - f32::from_bits(b)).abs())
                    .fold(0f32, f32::max);
                let argmax = |v: &[u32]| {
                    (0..v.len())
                        .max_by(|&i, &j| f32::from_bits(v[i]).total_cmp(&f32::from_bits(v[j])))
                };
                // Observed: up to 1.04 with nine sequences (the 16-column block tiles), 0.28
                // with five.
                assert!(
                    worst < 1.5,
                    "sequence {q}, token {k}: logits differ by {worst}"
                );
                // The most likely token is the same, or one the row alone puts within the
                // two rows' largest difference of it twice over (a near tie, which the
                // other order may break the other way).
                let value = |v: &[u32], i: Option<usize>| i.map(|i| f32::from_bits(v[i]));
                let (top, alone_top) = (argmax(&got), argmax(&want[q][k]));
                let (Some(at_top), Some(best)) =
                    (value(&want[q][k], top), value(&want[q][k], alone_top))
                else {
                    panic!("sequence {q}, token {k}: no logits");
                };
                assert!(
                    top == alone_top || best - at_top <= 2.0 * worst,
                    "sequence {q}, token {k}: most likely token {top:?} (alone {alone_top:?}, {at_top} vs {best})"
                );
            }
            row += 1;
        }
    }
    // The sequence without logits continued too.
    assert_eq!(s.n_past(12), PROMPTS[2].len() + NEXT.len());
}

/// Sequences `0..5` read their prompts (one batch), then one batch gives each of them its
/// first `NEXT` token while sequences `5..9` read their whole prompts (mixed steps: the
/// runs are packed in order into steps of at most 16 tokens), then one batch gives all
/// nine a token. Every logit row, prompts' included, equals the sequence's alone.
fn check_mixed(path: Option<std::path::PathBuf>, flash: bool, kv: KvTypes) {
    let Some(path) = path else { return };
    let gguf = GgufFile::open(&path).expect("model opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 2, 4, 8, 16], 64, kv, LogitRows::Both).expect("plan");
    let mut e = CpuEngine::new(&gguf, plan, 2).expect("compiles");
    e.set_flash_attn(flash).expect("attention path");
    let prompt_alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            let mut s = Session::single(&mut e).expect("session");
            bits(s.eval(0, p, false).expect("prompt"))
        })
        .collect();
    let want: Vec<_> = PROMPTS.iter().map(|p| alone(&mut e, p)).collect();
    let mut s = Session::new(Box::new(&mut e), PROMPTS.len()).expect("session");
    let n_vocab = s.n_vocab();
    let prompt = |q: usize| -> Vec<BatchToken> {
        PROMPTS[q]
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                token,
                seq: q as u32,
                logits: i + 1 == PROMPTS[q].len(),
            })
            .collect()
    };
    let one = |q: usize, token: u32| BatchToken {
        token,
        seq: q as u32,
        logits: true,
    };
    let first: Vec<BatchToken> = (0..5).flat_map(prompt).collect();
    s.decode_batch(&first).expect("first prompts");
    let mixed: Vec<BatchToken> = (0..5)
        .map(|q| one(q, NEXT[0]))
        .chain((5..PROMPTS.len()).flat_map(prompt))
        .collect();
    let out = s.decode_batch(&mixed).expect("mixed step");
    assert_eq!(out.len(), PROMPTS.len() * n_vocab);
    for q in 0..PROMPTS.len() {
        let (got, want) = (
            bits(&out[q * n_vocab..(q + 1) * n_vocab]),
            if q < 5 { &want[q][0] } else { &prompt_alone[q] },
        );
        assert!(
            &got == want,
            "{}: sequence {q} in the mixed step: logits differ from the sequence alone",
            path.display()
        );
    }
    let next: Vec<BatchToken> = (0..PROMPTS.len())
        .map(|q| one(q, if q < 5 { NEXT[1] } else { NEXT[0] }))
        .collect();
    let out = s.decode_batch(&next).expect("next step");
    for q in 0..PROMPTS.len() {
        let got = bits(&out[q * n_vocab..(q + 1) * n_vocab]);
        assert!(
            got == want[q][if q < 5 { 1 } else { 0 }],
            "{}: sequence {q} after the mixed step: logits differ from the sequence alone",
            path.display()
        );
    }
}

fn variant(name: &str) -> Option<std::path::PathBuf> {
    modelc_tests::require(
        modelc_tests::models_dir().join(format!("SmolLM2-135M-Instruct.{name}.gguf")),
        "scripts/make-variants",
    )
}

#[test]
fn q4_1_exact() {
    check(modelc_tests::smollm2(), true, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn q4_1_soft_max_path() {
    check(modelc_tests::smollm2(), false, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn q4_1_fast_order() {
    check(modelc_tests::smollm2(), true, codegen_cpu::SumOrder::Block);
}

#[test]
fn q4_1_quantized_kv_cache() {
    let q8 = ir::graph::DType::Block(ir::ggml::GgmlType::Q8_0);
    check_kv(
        modelc_tests::smollm2(),
        true,
        codegen_cpu::SumOrder::Ggml,
        KvTypes::same(q8),
    );
}

#[test]
fn q8_0_row_dot() {
    check(variant("Q8_0"), true, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn q4_0_repacked() {
    check(variant("Q4_0"), true, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn q4_k_m_mix() {
    check(variant("Q4_K_M"), true, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn gemma3() {
    check(modelc_tests::gemma3(), true, codegen_cpu::SumOrder::Ggml);
}

#[test]
fn mixed_q4_1() {
    check_mixed(modelc_tests::smollm2(), true, KvTypes::F16);
}

#[test]
fn mixed_q4_1_soft_max_path() {
    check_mixed(modelc_tests::smollm2(), false, KvTypes::F16);
}

#[test]
fn mixed_q4_1_quantized_kv_cache() {
    let q8 = ir::graph::DType::Block(ir::ggml::GgmlType::Q8_0);
    check_mixed(modelc_tests::smollm2(), true, KvTypes::same(q8));
}

#[test]
fn mixed_q8_0_row_dot() {
    check_mixed(variant("Q8_0"), true, KvTypes::F16);
}

#[test]
fn mixed_q4_0_repacked() {
    check_mixed(variant("Q4_0"), true, KvTypes::F16);
}

#[test]
fn mixed_q4_k_m_mix() {
    check_mixed(variant("Q4_K_M"), true, KvTypes::F16);
}

/// Gemma 3's ring caches keep prompt chunks out of mixed steps (decoded alone).
#[test]
fn mixed_gemma3() {
    check_mixed(modelc_tests::gemma3(), true, KvTypes::F16);
}
