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
        let rs = read_f32(&shared.join(format!("fixtures/reference/{name}.step.f32")));
        for (lab, o) in [("avx2", InterpOptions::llama_cpp()), ("ref", InterpOptions { avx2_order: false, ..InterpOptions::llama_cpp() })] {
        let b = fixture_logits(&gguf, &prompt, false, o);
        let rows: Vec<String> = (0..32).map(|i| format!("{:.0e}", max_abs_diff(&b[i*1024..(i+1)*1024], &rb[i*1024..(i+1)*1024]))).collect();
        eprintln!("{name} {lab} batch: {}", rows.join(" "));
        let b = fixture_logits(&gguf, &prompt, true, o);
        let rows: Vec<String> = (0..32).map(|i| format!("{:.0e}", max_abs_diff(&b[i*1024..(i+1)*1024], &rs[i*1024..(i+1)*1024]))).collect();
        eprintln!("{name} {lab} step:  {}", rows.join(" "));
        }
    }
}

#[test]
fn probe_greedy() {
    use ir::interp::{Outputs, Session, SessionOptions};
    let Some(shared) = shared_dir() else { return };
    let prompt = fixture_prompt(&shared);
    for name in std::env::var("FIX").unwrap_or("llama-sep-F32".into()).split(',') {
        let gguf = ir::gguf::GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).unwrap();
        let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(shared.join(format!("fixtures/reference/{name}.json"))).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let want_off = ids(&j["greedy"]);
        let want_on = ids(&j["observed"]["flash_on_greedy"]);
        let model = compiler::load_model(&gguf).unwrap();
        for (lab, o, want) in [("off", InterpOptions::llama_cpp(), &want_off), ("flash", InterpOptions { flash_attn: true, ..InterpOptions::llama_cpp() }, &want_on)] {
            let mut s = Session::new(&gguf, &model, SessionOptions { n_ctx: 256, interp: o, ..Default::default() });
            let mut l = s.eval(&prompt, 0, &Outputs::Last).unwrap().values;
            let mut got = vec![];
            for i in 0..16 {
                let t = l.iter().enumerate().fold((0, f32::MIN), |a, (k, &v)| if v > a.1 { (k, v) } else { a }).0 as u32;
                got.push(t);
                l = s.eval(&[t], 32 + i, &Outputs::Last).unwrap().values;
            }
            let agree = got.iter().zip(want.iter()).take_while(|(a, b)| a == b).count();
            eprintln!("{name} {lab}: greedy agrees for {agree}/16");
        }
    }
}

#[test]
fn probe_flash_diff() {
    let Some(shared) = shared_dir() else { return };
    let prompt = fixture_prompt(&shared);
    for name in std::env::var("FIX").unwrap_or("llama-sep-F32".into()).split(',') {
        let gguf = ir::gguf::GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).unwrap();
        let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(shared.join(format!("fixtures/reference/{name}.json"))).unwrap()).unwrap();
        let rb = read_f32(&shared.join(format!("fixtures/reference/{name}.batch.f32")));
        let rs = read_f32(&shared.join(format!("fixtures/reference/{name}.step.f32")));
        let o = InterpOptions { flash_attn: true, ..InterpOptions::llama_cpp() };
        let b = fixture_logits(&gguf, &prompt, false, o);
        let s = fixture_logits(&gguf, &prompt, true, o);
        eprintln!("{name}: ours(FA) vs ref(off) batch {:.7} (llama.cpp: {}), step {:.7} (llama.cpp: {}), FA batch vs step {:.7} (llama.cpp: {})", max_abs_diff(&b, &rb), j["observed"]["flash_on_vs_off_batch_max_abs_diff"], max_abs_diff(&s, &rs), j["observed"]["flash_on_vs_off_step_max_abs_diff"], max_abs_diff(&b, &s), j["observed"]["flash_on_batch_vs_step_max_abs_diff"]);
    }
}
