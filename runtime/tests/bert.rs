//! The `bert` encoder against llama.cpp on the random-weight fixture of
//! `runtime::synth_bert` (written at test time; never committed).

use compiler::GraphOutput;
use ir::ggml::GgmlType;
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;
use runtime::synth_bert::BertFixture;
use std::path::PathBuf;

/// Writes the fixture to a fresh temporary file.
fn fixture(weight_type: GgmlType, rerank: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("modelc-bert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("bert-{weight_type}-{rerank}.gguf"));
    BertFixture {
        weight_type,
        rerank,
        seed: 0,
    }
    .write(&path)
    .expect("fixture written");
    path
}

/// The CPU engine's hidden states equal the interpreter's (llama.cpp's operation order),
/// bit for bit, with the input padded to a larger step (the padding must stay invisible to
/// the non-causal attention).
#[test]
fn hidden_states_equal_the_interpreter() {
    use runtime::interp_engine::InterpEngine;
    let path = fixture(GgmlType::F32, false);
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("bert lowers");
    assert_eq!(model.output(), GraphOutput::Embeddings);
    let prompt: Vec<u32> = vec![101, 110, 102];
    let plan = build_plan(&model, &[1, 4], 64, KvTypes::F16, LogitRows::All).expect("plan");
    let mut cpu = Session::single(CpuEngine::new(&gguf, plan, 2).expect("engine")).expect("session");
    let mut interp = Session::single(InterpEngine::new(
        &gguf,
        &model,
        64,
        prompt.len(),
        KvTypes::F16,
        ir::interp::InterpOptions::llama_cpp(),
    ))
    .expect("session");
    let c = cpu.decode(&prompt, 0, true).expect("cpu").to_vec();
    let i = interp.decode(&prompt, 0, true).expect("interp").to_vec();
    assert_eq!(c.len(), prompt.len() * 64);
    for r in 0..3 {
        let n = |v: &[f32]| runtime::embed::normalize(&v[r * 64..r * 64 + 64], 2)[..3].to_vec();
        eprintln!("row {r}: cpu {:?} interp {:?}", n(&c), n(&i));
    }
    let differ = c.iter().zip(&i).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "{differ} of {} values differ: {:?} vs {:?}", c.len(), &c[..4], &i[..4]);
}
