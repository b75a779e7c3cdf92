mod common;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};
use std::time::Instant;

#[test]
fn smol_speed() {
    let path = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let model = compiler::load_model(&gguf).unwrap();
    eprintln!("{:?}", model.hparams);
    for (label, o) in [("exact", InterpOptions::exact()), ("llama", InterpOptions::llama_cpp())] {
        let mut s = Session::new(&gguf, &model, SessionOptions { n_ctx: 1024, interp: o, ..Default::default() });
        let prompt: Vec<u32> = (0..64).map(|i| 100 + i * 7).collect();
        let t = Instant::now();
        s.eval(&prompt, 0, &Outputs::Last).unwrap();
        let pp = t.elapsed();
        let t = Instant::now();
        for i in 0..5 {
            s.eval(&[200 + i], 64 + i, &Outputs::Last).unwrap();
        }
        eprintln!("{label}: pp64 {:?} ({:.1} ms/tok), tg {:.1} ms/tok", pp, pp.as_secs_f64() * 1000.0 / 64.0, t.elapsed().as_secs_f64() * 1000.0 / 5.0);
    }
}

#[test]
fn smol_decode_only() {
    let path = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let model = compiler::load_model(&gguf).unwrap();
    let o = if std::env::var("LLAMA").is_ok() { InterpOptions::llama_cpp() } else { InterpOptions::exact() };
    let mut s = Session::new(&gguf, &model, SessionOptions { n_ctx: 1024, interp: o, ..Default::default() });
    let t = Instant::now();
    for i in 0..20 {
        s.eval(&[200 + i], i, &Outputs::Last).unwrap();
    }
    eprintln!("decode {:.1} ms/tok", t.elapsed().as_secs_f64() * 1000.0 / 20.0);
}
