#[test]
fn sums() {
    let path = std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/modelc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let mut out = String::new();
    for t in gguf.tensors() {
        let d = gguf.tensor_data(t);
        let mut h: u64 = 0xcbf29ce484222325;
        for x in d.iter().step_by(97) { h = (h ^ *x as u64).wrapping_mul(0x100000001b3); }
        out += &format!("{} {:016x}\n", t.name, h);
    }
    std::fs::write("/tmp/rs_sums.txt", out).unwrap();
}
