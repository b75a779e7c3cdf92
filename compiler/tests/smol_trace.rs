use ir::interp::{InterpOptions, Interpreter, Inputs};
use ir::graph::DType;
#[test]
fn trace() {
    let path = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let model = compiler::load_model(&gguf).unwrap();
    let toks: Vec<i32> = vec![504, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 284, 897, 3163, 624];
    let n = toks.len() as u32;
    let g = model.build_graph(&ir::interp::GraphRequest { n_tokens: n, n_outputs: 1, n_ctx: 256, kv_type: DType::F16 }).unwrap();
    let mut it = Interpreter::new(&gguf, InterpOptions { flash_attn: true, ..InterpOptions::llama_cpp() });
    let pos: Vec<i32> = (0..n as i32).collect();
    let mut stats: std::collections::BTreeMap<String, (f32, f32)> = Default::default();
    it.run_traced(&g, &Inputs { tokens: &toks, positions: &pos, output_ids: &[n as i32 - 1], kv_len: n as u64, data: &[] }, &mut |t, v| {
        let kind: String = t.name.split('-').next().unwrap().to_string();
        let mx = v.iter().fold(0f32, |a, b| a.max(b.abs()));
        let mn = v.iter().filter(|x| **x != 0.0).fold(f32::MAX, |a, b| a.min(b.abs()));
        let e = stats.entry(kind).or_insert((0.0, f32::MAX));
        e.0 = e.0.max(mx); e.1 = e.1.min(mn);
    }).unwrap();
    for (k, (mx, mn)) in stats { eprintln!("{k:20} max|x| {mx:12.4} min|x| {mn:e}"); }
}
