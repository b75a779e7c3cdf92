mod common;
use common::*;
use ir::interp::InterpOptions;

#[test]
fn probe() {
    let Some(shared) = shared_dir() else { return };
    let prompt = fixture_prompt(&shared);
    for name in std::env::var("FIX").unwrap_or("llama-sep-F32".into()).split(',') {
        let gguf = ir::gguf::GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).unwrap();
        let rb = read_f32(&shared.join(format!("fixtures/reference/{name}.batch.f32")));
        let rs = read_f32(&shared.join(format!("fixtures/reference/{name}.step.f32")));
        for (label, o) in [("exact", InterpOptions::exact()), ("llama", InterpOptions::llama_cpp())] {
            let b = fixture_logits(&gguf, &prompt, false, o);
            let s = fixture_logits(&gguf, &prompt, true, o);
            eprintln!("{name} {label}: batch {:.6} step {:.6} (b vs s {:.6})", max_abs_diff(&b, &rb), max_abs_diff(&s, &rs), max_abs_diff(&b, &s));
        }
    }
}

#[test]
fn probe_rows() {
    let Some(shared) = shared_dir() else { return };
    let prompt = fixture_prompt(&shared);
    for name in std::env::var("FIX").unwrap_or("llama-sep-F32".into()).split(',') {
        let gguf = ir::gguf::GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).unwrap();
        let rb = read_f32(&shared.join(format!("fixtures/reference/{name}.batch.f32")));
        let b = fixture_logits(&gguf, &prompt, false, InterpOptions::llama_cpp());
        let rows: Vec<String> = (0..32).map(|i| format!("{:.1e}", max_abs_diff(&b[i*1024..(i+1)*1024], &rb[i*1024..(i+1)*1024]))).collect();
        eprintln!("{name}: {}", rows.join(" "));
    }
}
