//! Fuzz target: any bytes tokenize, with and without special-token parsing, on three kinds of
//! vocabulary (SentencePiece, byte-level BPE, WordPiece), without a panic; the ids are in the
//! vocabulary and detokenize. The vocabularies come from `../shared/vocab/` (and the BERT one
//! from there or `$MODELC_LLAMA_CPP/models/`).

#![no_main]

use ir::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;
use runtime::tokenizer::Vocab;
use std::path::PathBuf;
use std::sync::OnceLock;

fn vocabularies() -> &'static [Vocab] {
    static V: OnceLock<Vec<Vocab>> = OnceLock::new();
    V.get_or_init(|| {
        let shared = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vocab"));
        let llama = std::env::var_os("MODELC_LLAMA_CPP").map(|p| PathBuf::from(p).join("models"));
        let mut out = Vec::new();
        for name in ["llama-spm", "qwen2", "bert-bge"] {
            let file = format!("ggml-vocab-{name}.gguf");
            let path = [Some(shared.clone()), llama.clone()]
                .into_iter()
                .flatten()
                .map(|d| d.join(&file))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{file} not found"));
            let gguf = GgufFile::open(&path).expect("vocabulary opens");
            out.push(Vocab::from_gguf(&gguf).expect("vocabulary loads"));
        }
        out
    })
}

fuzz_target!(|data: &[u8]| {
    for v in vocabularies() {
        for special in [false, true] {
            let ids = v.tokenize_bytes(data, special, special);
            assert!(ids.iter().all(|&id| (id as usize) < v.n_vocab()));
            let _ = v.detokenize(&ids, special);
        }
    }
});
