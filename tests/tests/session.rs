//! Sessions on SmolLM2 with the compiled CPU engine: several sequences in one session
//! compute what each computes alone, and a sequence truncated to an earlier position and fed
//! again computes what a fresh evaluation computes — bit for bit.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::{BatchToken, Session};

const PROMPT_A: [u32; 12] = [
    504, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 284,
];
const PROMPT_B: [u32; 9] = [1, 4093, 15, 2354, 314, 469, 1161, 30, 216];
const NEXT_A: [u32; 4] = [897, 3163, 28, 260];
const NEXT_B: [u32; 4] = [1232, 24, 253, 2891];

fn smollm2() -> Option<GgufFile> {
    modelc_tests::smollm2().map(|p| GgufFile::open(p).expect("SmolLM2 opens"))
}

fn engine<'a>(gguf: &'a GgufFile, model: &compiler::Model) -> CpuEngine<'a> {
    let plan = build_plan(model, &[1, 16], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    CpuEngine::new(gguf, plan, 2).expect("compiles")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One sequence alone: its prompt, then its next tokens one at a time; every logit row.
fn alone(e: &mut CpuEngine<'_>, prompt: &[u32], next: &[u32]) -> Vec<Vec<u32>> {
    let mut s = Session::single(e).expect("session");
    let mut rows = vec![bits(s.eval(0, prompt, false).expect("prompt"))];
    for &t in next {
        rows.push(bits(s.eval(0, &[t], false).expect("token")));
    }
    rows
}

#[test]
fn interleaved_sequences_equal_each_alone() {
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let mut e = engine(&gguf, &model);
    let want_a = alone(&mut e, &PROMPT_A, &NEXT_A);
    let want_b = alone(&mut e, &PROMPT_B, &NEXT_B);
    let n_vocab = want_a[0].len();

    // Both sequences in one session (ids 7 and 3, as a server would number them): the
    // prompts in one batch, then one token of each per batch, alternating.
    let mut s = Session::new(Box::new(&mut e), 2).expect("session of two");
    let batch: Vec<BatchToken> = PROMPT_A
        .iter()
        .enumerate()
        .map(|(i, &token)| BatchToken {
            token,
            seq: 7,
            logits: i + 1 == PROMPT_A.len(),
        })
        .chain(PROMPT_B.iter().enumerate().map(|(i, &token)| BatchToken {
            token,
            seq: 3,
            logits: i + 1 == PROMPT_B.len(),
        }))
        .collect();
    let out = s.decode_batch(&batch).expect("prompts");
    assert_eq!(out.len(), 2 * n_vocab);
    let (mut got_a, mut got_b) = (vec![bits(&out[..n_vocab])], vec![bits(&out[n_vocab..])]);
    // The steps write into one vector, as the server's do; at the last, B asks for no
    // logits, so the engine's rows are picked from, not taken whole.
    let mut out = out;
    for (k, (&a, &b)) in NEXT_A.iter().zip(&NEXT_B).enumerate() {
        let b_logits = k + 1 < NEXT_B.len();
        s.decode_batch_into(
            &[
                BatchToken {
                    token: b,
                    seq: 3,
                    logits: b_logits,
                },
                BatchToken {
                    token: a,
                    seq: 7,
                    logits: true,
                },
            ],
            &mut out,
        )
        .expect("one token of each");
        if b_logits {
            assert_eq!(out.len(), 2 * n_vocab);
            got_b.push(bits(&out[..n_vocab]));
            got_a.push(bits(&out[n_vocab..]));
        } else {
            assert_eq!(out.len(), n_vocab, "only A's row");
            got_a.push(bits(&out));
        }
    }
    let want_b = &want_b[..want_b.len() - 1];
    assert_eq!(s.n_past(7), PROMPT_A.len() + NEXT_A.len());
    assert_eq!(s.n_past(3), PROMPT_B.len() + NEXT_B.len());
    assert!(
        got_a == want_a,
        "sequence A interleaved differs from A alone"
    );
    assert!(
        got_b == want_b,
        "sequence B interleaved differs from B alone"
    );

    // A third sequence does not fit; freeing one makes room.
    let third = BatchToken {
        token: 1,
        seq: 9,
        logits: true,
    };
    let err = s.decode_batch(&[third]).expect_err("no free slot");
    assert!(
        format!("{err:#}").contains("no free sequence slot"),
        "{err:#}"
    );
    s.clear_seq(3);
    assert_eq!(s.n_past(3), 0);
    s.decode_batch(&[third]).expect("a freed slot");
    assert_eq!(s.n_past(7), PROMPT_A.len() + NEXT_A.len(), "A is untouched");
}

#[test]
fn truncate_and_refeed_equals_fresh_evaluation() {
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let mut e = engine(&gguf, &model);
    let mut s = Session::single(&mut e).expect("session");
    let n_vocab = s.n_vocab();

    // Fresh: the prompt's first 7 tokens, the other 5 in one call, then two tokens.
    let fresh = |s: &mut Session<'_>| {
        s.clear();
        s.eval(0, &PROMPT_A[..7], false).expect("head");
        let mut rows = vec![bits(s.eval(0, &PROMPT_A[7..], false).expect("tail"))];
        for &t in &NEXT_A[..2] {
            rows.push(bits(s.eval(0, &[t], false).expect("token")));
        }
        rows
    };
    let want = fresh(&mut s);

    // The whole prompt and four more tokens, then back to 7 positions (mid-prompt: cells
    // written by a padded 16-token step among those dropped), and the same calls again.
    s.clear();
    s.eval(0, &PROMPT_A, false).expect("prompt");
    for &t in &NEXT_A {
        s.eval(0, &[t], false).expect("token");
    }
    s.truncate(0, 7);
    assert_eq!(s.n_past(0), 7);
    assert_eq!(s.tokens(0), &PROMPT_A[..7]);
    let mut got = vec![bits(s.eval(0, &PROMPT_A[7..], false).expect("tail"))];
    for &t in &NEXT_A[..2] {
        got.push(bits(s.eval(0, &[t], false).expect("token")));
    }
    assert!(
        got == want,
        "truncated and fed again differs from a fresh evaluation"
    );

    // Dropping the last token (what /regen does) and feeding another gives what the other
    // token gives fresh.
    s.truncate(0, PROMPT_A.len() + 1);
    let other = bits(s.eval(0, &[NEXT_B[0]], false).expect("other token"));
    s.clear();
    s.eval(0, &PROMPT_A[..7], false).expect("head");
    s.eval(0, &PROMPT_A[7..], false).expect("tail");
    s.eval(0, &NEXT_A[..1], false).expect("first");
    let fresh_other = bits(s.eval(0, &[NEXT_B[0]], false).expect("other token"));
    assert!(
        other == fresh_other,
        "a replaced last token differs from fresh"
    );
    assert_eq!(other.len(), n_vocab);
}

#[test]
fn memory_report_counts_the_kv_cache() {
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let mut e = engine(&gguf, &model);
    let mut s = Session::new(Box::new(&mut e), 3).expect("session");
    let m = s.memory();
    // SmolLM2: 30 layers × (K + V) × 64 cells × 192 values × 2 bytes (F16) per sequence.
    assert_eq!(m.kv_per_seq, 30 * 2 * 64 * 192 * 2);
    assert_eq!(m.kv, 3 * m.kv_per_seq);
    // SmolLM2 Q4_1's weights (Q4_1, and Q8_0 for the tied output) are read in place from
    // the mapped file in the exact order: the engine holds no repacked copy.
    assert_eq!(m.engine.weights, 0, "repacked weights: {:?}", m.engine);
    assert!(m.engine.work > 0, "{:?}", m.engine);
    assert_eq!(m.kv_cells_written, 0);
    s.eval(1, &PROMPT_A, false).expect("prompt");
    // A 12-token prompt runs as one padded 16-token step: 16 cells written.
    assert_eq!(s.memory().kv_cells_written, 16);
}

/// A context shift keeps the first positions, drops the next ones and moves the rest down:
/// with an F16 cache the moved keys are re-roped in place (llama.cpp's K shift); with a Q8_0
/// K cache (Hadamard-rotated keys) the moved positions are evaluated again. Either way the
/// sequence then holds the kept tokens and goes on.
#[test]
fn context_shift_moves_and_reropes_the_cache() {
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let tokens: Vec<u32> = PROMPT_A
        .iter()
        .chain(&NEXT_A)
        .chain(&PROMPT_B)
        .chain(&NEXT_B)
        .copied()
        .collect();
    let q8 = ir::graph::DType::Block(ir::ggml::GgmlType::Q8_0);
    for (kv, reroped) in [(KvTypes::F16, true), (KvTypes { k: q8, v: q8 }, false)] {
        let plan = build_plan(&model, &[1, 16], 64, kv, LogitRows::Last).expect("plan");
        let mut e = CpuEngine::new(&gguf, plan, 2).expect("compiles");
        let mut s = Session::single(&mut e).expect("session");
        s.eval(0, &tokens, false).expect("tokens");
        assert_eq!(s.shift(0, 4, 10).expect("shift"), reroped, "{kv}");
        let mut kept = tokens[..4].to_vec();
        kept.extend_from_slice(&tokens[14..]);
        assert_eq!(s.tokens(0), &kept[..]);
        let after = s.eval(0, &[NEXT_A[0]], false).expect("next").to_vec();
        assert!(after.iter().all(|x| x.is_finite()));
        // The shifted cache is not the cache of a fresh evaluation of the kept tokens
        // (their keys and values were computed with the dropped ones in view, as in
        // llama.cpp), but it predicts close to it: the same greedy token here.
        let argmax = |l: &[f32]| {
            l.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
        };
        s.clear();
        s.eval(0, &kept, false).expect("kept");
        let fresh = s.eval(0, &[NEXT_A[0]], false).expect("next").to_vec();
        eprintln!(
            "{kv}: greedy after the shift {:?}, fresh {:?}",
            argmax(&after),
            argmax(&fresh)
        );
    }
}

/// The K shift is a rotation by the position delta: layer 0's keys depend only on the token
/// and its position, so keys computed at positions `p` and re-roped by `-d` equal, within
/// f16 rounding, the keys computed at `p - d` directly.
#[test]
fn k_shift_rotates_keys_to_their_new_positions() {
    use runtime::engine::{Engine, KvStream};
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 16], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let k0 = plan
        .kv
        .iter()
        .position(|c| c.layer == 0 && c.kind == ir::graph::KvKind::K)
        .expect("layer 0 K cache");
    let mut e = CpuEngine::new(&gguf, plan, 2).expect("compiles");
    let layout = e.kv_layout().clone();
    let slot = layout.caches[k0];
    let tokens: Vec<u32> = PROMPT_A.iter().chain(&NEXT_A).copied().collect();
    let (src, d) = (10usize, 6usize);
    let n = tokens.len() - src;

    let mut a = vec![0u8; layout.stream_bytes as usize];
    let mut kv = KvStream {
        index: 0,
        mem: &mut a,
        written: 0,
    };
    e.decode(&mut kv, &tokens, 0, false).expect("decode");
    assert!(e.shift_k(&mut kv, src, n, -(d as i64)).expect("shift"));

    let mut b = vec![0u8; layout.stream_bytes as usize];
    let mut kv = KvStream {
        index: 1,
        mem: &mut b,
        written: 0,
    };
    e.decode(&mut kv, &tokens[src..], src - d, false)
        .expect("decode");

    let row = slot.row_bytes as usize;
    let f16s = |m: &[u8], cell: usize| -> Vec<f32> {
        let at = slot.offset as usize + cell * row;
        m[at..at + row]
            .chunks_exact(2)
            .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
            .collect()
    };
    let mut worst = 0f32;
    for i in 0..n {
        let (x, y) = (f16s(&a, src + i), f16s(&b, src - d + i));
        for (p, q) in x.iter().zip(&y) {
            worst = worst.max((p - q).abs() / q.abs().max(1.0));
        }
    }
    eprintln!("re-roped vs computed at the new positions: max relative difference {worst:.2e}");
    assert!(
        worst < 4e-3,
        "re-roped keys differ from keys at the new positions by {worst}"
    );
}
