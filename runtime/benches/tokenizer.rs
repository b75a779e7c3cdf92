//! Tokenizer throughput: `cargo bench -p runtime --bench tokenizer`.
//!
//! Tokenizes about 1 MB of English prose (`../shared/reference/ppl-text.txt`, repeated) with
//! each available vocabulary, on one thread, and prints MB/s. Vocabularies whose files are
//! absent are skipped with a message.

use ir::gguf::GgufFile;
use runtime::tokenizer::Vocab;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() {
    let shared = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"));
    let prose = match std::fs::read_to_string(shared.join("reference/ppl-text.txt")) {
        Ok(t) => t,
        Err(e) => {
            println!("skipped: {}: {e}", shared.join("reference/ppl-text.txt").display());
            return;
        }
    };
    let mut text = String::with_capacity(1 << 20);
    while text.len() < 1_000_000 {
        text.push_str(&prose);
        text.push('\n');
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let models = home.join(".cache/modelc/models");
    let files = [
        models.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        models.join("gemma-3-270m-q4_k_m.gguf"),
        shared.join("vocab/ggml-vocab-llama-bpe.gguf"),
        shared.join("vocab/ggml-vocab-qwen2.gguf"),
        shared.join("vocab/ggml-vocab-gpt-2.gguf"),
        shared.join("vocab/ggml-vocab-llama-spm.gguf"),
        shared.join("vocab/ggml-vocab-deepseek-coder.gguf"),
    ];
    println!("text: {} bytes of English prose", text.len());
    println!("{:<40} {:>8} {:>9} {:>10} {:>8}", "vocabulary", "load ms", "tokens", "best ms", "MB/s");
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Ok(file) = GgufFile::open(&f) else {
            println!("{name:<40} skipped (absent)");
            continue;
        };
        let t0 = Instant::now();
        let vocab = match Vocab::from_gguf(&file) {
            Ok(v) => v,
            Err(e) => {
                println!("{name:<40} {e}");
                continue;
            }
        };
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut best = f64::MAX;
        let mut n = 0;
        for _ in 0..3 {
            let t = Instant::now();
            n = vocab.tokenize(&text, false, false).len();
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name:<40} {load_ms:>8.1} {n:>9} {:>10.1} {:>8.2}",
            best * 1e3,
            text.len() as f64 / best / 1e6
        );
    }
}
