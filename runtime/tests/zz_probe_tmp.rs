use ir::gguf::GgufFile;
use runtime::tokenizer::Vocab;
#[test]
fn probe() {
    for p in ["/work/shared/vocab/ggml-vocab-llama-spm.gguf", "/work/shared/vocab/ggml-vocab-phi-3.gguf", "/root/.cache/modelc/models/gemma-3-270m-q4_k_m.gguf", "/work/shared/fixtures/models/llama-sep-F32.gguf"] {
        let f = GgufFile::open(p).unwrap();
        let v = Vocab::from_gguf(&f).unwrap();
        let mut bad = Vec::new();
        for id in 0..v.n_vocab() as u32 {
            let t = v.token_text(id).unwrap();
            let cs: Vec<char> = t.chars().collect();
            for i in 1..cs.len() {
                if cs[i] == '\u{2581}' && cs[i-1] != '\u{2581}' { bad.push((id, t.to_string(), v.token_type(id))); break; }
            }
        }
        println!("{p}: {} tokens with X▁ inside; first: {:?}", bad.len(), &bad[..bad.len().min(15)]);
        let nl: Vec<_> = (0..v.n_vocab() as u32).filter(|&id| { let t=v.token_text(id).unwrap(); t.len()>1 && t.contains('\n') && !t.chars().all(|c| c=='\n') }).take(10).map(|id| v.token_text(id).unwrap().to_string()).collect();
        println!("  newline-mixed tokens: {:?}", nl);
    }
}
