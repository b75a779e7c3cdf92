mod common;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};
use ir::graph::DType;

#[test]
fn pos0() {
    let path = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let model = compiler::load_model(&gguf).unwrap();
    let s = std::fs::read_to_string("/work/shared/reference/ref-SmolLM2-135M-Instruct.Q4_1.json").unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    let flash = InterpOptions { flash_attn: true, ..InterpOptions::llama_cpp() };
    let variants: Vec<(&str, InterpOptions, DType)> = vec![
        ("flash", flash, DType::F16),
        ("nonFA", InterpOptions::llama_cpp(), DType::F16),
        ("flash-refQ8", InterpOptions { q8_flavor: ir::ggml::Q8Flavor::Reference, ..flash }, DType::F16),
        ("flash-refOrder", InterpOptions { avx2_order: false, ..flash }, DType::F16),
        ("flash-kv32", flash, DType::F32),
        ("exact", InterpOptions::exact(), DType::F16),
    ];
    for pi in [3usize, 0, 1] {
        let p = &v["prompts"][pi];
        let toks: Vec<u32> = p["tokens_add_special_true"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let top5: Vec<(usize, f64)> = p["teacher_forced"]["top5"][0].as_array().unwrap().iter().map(|e| (e[0].as_u64().unwrap() as usize, e[1].as_f64().unwrap())).collect();
        for (label, o, kv) in &variants {
            let mut s = Session::new(&gguf, &model, SessionOptions { n_ctx: 256, kv_type: *kv, interp: *o, ..Default::default() });
            let l = s.eval(&toks, 0, &Outputs::Last).unwrap().values;
            let max = l.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
            let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            let d: Vec<String> = top5.iter().map(|&(id, r)| format!("{:+.6}", l[id] as f64 - lse - r)).collect();
            eprintln!("prompt {pi} ({} tok) {label}: {}", toks.len(), d.join(" "));
        }
    }
}
