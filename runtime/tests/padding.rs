//! A run of tokens shorter than the ubatch it is computed in (the tail of a prompt padded
//! into a larger compiled step, `ir::plan::schedule`) gives its real rows exactly the logits
//! they get without the padding, bit for bit, and leaves the KV cache as if there had been
//! none: padded rows sit after every real position, so causal attention hides them, and
//! every other op works row by row.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;

const N_CTX: u32 = 32;

/// The small llama fixture (Q4_1 matrices, as SmolLM2), or `None` after a recorded skip.
fn fixture() -> Option<GgufFile> {
    modelc_tests::shared("fixtures/models/llama-sep-Q4_1.gguf")
        .map(|p| GgufFile::open(p).expect("fixture opens"))
}

fn engine<'a>(gguf: &'a GgufFile, model: &compiler::Model, ubatches: &[u32]) -> Session<'a> {
    let plan =
        build_plan(model, ubatches, N_CTX, KvTypes::F16, LogitRows::Both).expect("plan builds");
    Session::single(CpuEngine::new(gguf, plan, 2).expect("plan compiles for the CPU"))
        .expect("session")
}

/// 5 tokens padded into the 8-token step against the same 5 tokens followed by 3 other real
/// ones in that step, and against an exact 5-token step.
#[test]
fn padded_rows_leave_real_rows_bit_identical() {
    let Some(gguf) = fixture() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let n_vocab = 1024;
    let prompt: [u32; 8] = [1, 415, 293, 906, 285, 114, 58, 3];
    let real = &prompt[..5];
    let next = 726u32;

    let mut e8 = engine(&gguf, &model, &[1, 8]);
    // Padded: 5 real rows in the 8-token step (the schedule pads a tail of at least half).
    e8.clear();
    let padded = e8.decode(real, 0, true).expect("padded decode").to_vec();
    assert_eq!(padded.len(), 5 * n_vocab);
    let padded_next = e8.decode(&[next], 5, false).expect("next").to_vec();
    e8.clear();
    let padded_last = e8
        .decode(real, 0, false)
        .expect("padded, last row")
        .to_vec();
    // The same step with 8 real tokens.
    e8.clear();
    let full = e8.decode(&prompt, 0, true).expect("full decode").to_vec();
    // Position 5 is written again (the session truncates the sequence to 5 positions).
    let full_next = e8.decode(&[next], 5, false).expect("next").to_vec();
    assert!(
        padded[..] == full[..5 * n_vocab],
        "padding changed the real rows' logits"
    );
    assert!(
        padded_next == full_next,
        "what the padding left in the KV cache changed the next token's logits"
    );
    assert!(
        padded_last[..] == padded[4 * n_vocab..],
        "the last-row step's logits differ from the every-row step's last real row"
    );

    // An exact 5-token step computes the same rows.
    let mut e5 = engine(&gguf, &model, &[1, 5, 8]);
    e5.clear();
    let exact = e5.decode(real, 0, true).expect("exact decode").to_vec();
    let exact_next = e5.decode(&[next], 5, false).expect("next").to_vec();
    assert!(
        exact == padded,
        "the 5-token step and the padded 8-token step differ"
    );
    assert!(exact_next == padded_next, "the next token's logits differ");
}
