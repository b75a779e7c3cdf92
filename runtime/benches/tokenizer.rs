//! Tokenizer throughput: `cargo bench -p runtime --bench tokenizer`.
//!
//! Tokenizes about 1 MB of English prose (`../shared/reference/ppl-text.txt`, 20 KB repeated)
//! with each available vocabulary, on one thread, and prints MB/s: `fast` is
//! `Vocab::tokenize` (which encodes each distinct word once per call, so the repetition helps
//! it), `plain` is `Vocab::tokenize_plain` (llama.cpp's algorithms without those shortcuts: a
//! lower bound for text with no repetition at all). Vocabularies whose files are absent are
//! skipped with a message.

use ir::gguf::GgufFile;
use runtime::tokenizer::Vocab;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() {
    let shared = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"));
    let prose = match std::fs::read_to_string(shared.join("reference/ppl-text.txt")) {
        Ok(t) => t,
        Err(e) => {
            println!(
                "skipped: {}: {e}",
                shared.join("reference/ppl-text.txt").display()
            );
            return;
        }
    };
    let mut text = String::with_capacity(1 << 20);
    while text.len() < 1_000_000 {
        text.push_str(&prose);
        text.push('\n');
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
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
    println!(
        "{:<36} {:>8} {:>8} {:>8} {:>10} {:>9} {:>10}",
        "vocabulary", "load ms", "tokens", "fast ms", "fast MB/s", "plain ms", "plain MB/s"
    );
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(file) = GgufFile::open(&f) else {
            println!("{name:<36} skipped (absent)");
            continue;
        };
        let t0 = Instant::now();
        let vocab = match Vocab::from_gguf(&file) {
            Ok(v) => v,
            Err(e) => {
                println!("{name:<36} {e}");
                continue;
            }
        };
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;
        let time = |f: &dyn Fn() -> usize| {
            let mut best = f64::MAX;
            let mut n = 0;
            for _ in 0..3 {
                let t = Instant::now();
                n = f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            (n, best)
        };
        let (n, fast) = time(&|| vocab.tokenize(&text, false, false).len());
        let (n_plain, plain) = time(&|| vocab.tokenize_plain(&text, false, false).len());
        assert_eq!(n, n_plain, "{name}: the shortcuts changed the result");
        let mbs = |s: f64| text.len() as f64 / s / 1e6;
        println!(
            "{name:<36} {load_ms:>8.1} {n:>8} {:>8.1} {:>10.2} {:>9.1} {:>10.2}",
            fast * 1e3,
            mbs(fast),
            plain * 1e3,
            mbs(plain)
        );
    }
}
