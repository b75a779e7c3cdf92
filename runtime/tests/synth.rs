//! `modelc synth` (issue 14 point 4): a small random llama with SmolLM2's tokenizer is
//! written, reads back with the right shapes and `modelc quantize`'s mix of types, runs, and
//! is byte-identical for a seed whatever the thread count.

use ir::ggml::GgmlType;
use ir::gguf::GgufFile;
use std::path::{Path, PathBuf};
use std::process::Command;

fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

/// An empty directory of this process for test `name` (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("modelc-synth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes a 2-layer model of n_embd 256 (K-quant blocks fit) to `out`.
fn synth(vocab: &Path, out: &Path, seed: &str, threads: &str, ftype: &str) {
    let o = modelc()
        .args(["synth"])
        .arg(out)
        .args(["--n-embd", "256", "--n-layer", "2", "--n-ff", "512"])
        .args(["--n-head", "4", "--n-head-kv", "2", "--type", ftype])
        .args(["--seed", seed, "-t", threads, "--vocab-from"])
        .arg(vocab)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn synth_writes_a_loadable_deterministic_llama() {
    let Some(vocab) = modelc_tests::smollm2() else {
        return;
    };
    let d = scratch("llama");
    let (a, b, c) = (d.join("a.gguf"), d.join("b.gguf"), d.join("c.gguf"));
    synth(&vocab, &a, "1", "1", "Q4_K_M");
    synth(&vocab, &b, "1", "2", "Q4_K_M");
    synth(&vocab, &c, "2", "2", "Q4_K_M");
    let (ba, bb, bc) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert!(ba == bb, "one seed, two thread counts: the files differ");
    assert!(ba != bc, "two seeds give the same file");

    let f = GgufFile::open(&a).unwrap();
    let md = f.metadata();
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(md.get_u32("llama.block_count").unwrap(), Some(2));
    assert_eq!(md.get_u32("llama.embedding_length").unwrap(), Some(256));
    assert_eq!(md.get_u32("general.file_type").unwrap(), Some(15));
    let v = GgufFile::open(&vocab).unwrap();
    assert_eq!(
        md.get_array("tokenizer.ggml.tokens")
            .unwrap()
            .map(|a| a.len()),
        v.metadata()
            .get_array("tokenizer.ggml.tokens")
            .unwrap()
            .map(|a| a.len())
    );
    let t = |name: &str| {
        let t = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        (t.shape().to_vec(), t.ggml_type)
    };
    assert_eq!(t("token_embd.weight"), (vec![256, 49152], GgmlType::Q4_K));
    assert_eq!(t("output.weight"), (vec![256, 49152], GgmlType::Q6_K));
    assert_eq!(t("blk.0.attn_k.weight"), (vec![256, 128], GgmlType::Q4_K));
    // Q4_K_M's mix: more bits for attn_v and ffn_down in the last layer of two.
    assert_eq!(t("blk.0.attn_v.weight").1, GgmlType::Q4_K);
    assert_eq!(t("blk.1.attn_v.weight").1, GgmlType::Q6_K);
    assert_eq!(t("blk.1.ffn_down.weight"), (vec![512, 256], GgmlType::Q6_K));
    assert_eq!(t("blk.1.ffn_norm.weight"), (vec![256], GgmlType::F32));
    assert_eq!(f.tensors().len(), 1 + 2 * 9 + 2);
    // Norms are 1.0; weights are small.
    let norm = f.tensor("output_norm.weight").unwrap();
    assert!(f
        .tensor_data(norm)
        .chunks_exact(4)
        .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) == 1.0));

    // It runs, and greedy text is text.
    let o = modelc()
        .arg("run")
        .arg(&a)
        .args(["-p", "Hello", "-n", "4", "--temp", "0", "-t", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!o.stdout.is_empty());

    // Bad shapes are one line and status 1, and leave nothing.
    let o = modelc()
        .arg("synth")
        .arg(d.join("bad.gguf"))
        .args(["--n-embd", "100", "--n-head", "3", "--vocab-from"])
        .arg(&vocab)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("n_head"));
    assert!(!d.join("bad.gguf").exists());
    let _ = std::fs::remove_dir_all(&d);
}

/// The last line of `modelc perplexity MODEL` on two 256-token chunks of the shared text.
fn perplexity(model: &Path, text: &Path) -> String {
    let o = modelc()
        .arg("perplexity")
        .arg(model)
        .arg("-f")
        .arg(text)
        .args(["-c", "256", "--chunks", "2", "-t", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.lines()
        .rfind(|l| l.contains("Final estimate"))
        .unwrap_or_else(|| panic!("no estimate in {out}"))
        .to_string()
}

/// The `8b` preset (issue 44): Llama-3.1-8B's rope base and training context, its 128256-token
/// vocabulary required, and its `llama3` rope scaling as `convert_hf_to_gguf.py` writes it, a
/// `rope_freqs.weight` of `n_rot / 2` divisors, which modelc's llama lowering gives every
/// rope (as llama.cpp's `get_rope_factors` does): the same file with the divisors set to 1
/// scores differently. Shrunk to one layer of n_embd 256 (head size 128, as Llama's).
#[test]
fn synth_8b_preset_writes_and_uses_llama3_rope_freqs() {
    let (Some(vocab), Some(text), Some(smol)) = (
        modelc_tests::shared("vocab/ggml-vocab-llama-bpe.gguf"),
        modelc_tests::shared("reference/ppl-text.txt"),
        modelc_tests::smollm2(),
    ) else {
        return;
    };
    let d = scratch("8b");
    let small = |out: &Path, vocab: &Path| {
        modelc()
            .arg("synth")
            .arg(out)
            .args(["--preset", "8b", "--n-embd", "256", "--n-layer", "1"])
            .args(["--n-ff", "512", "--n-head", "2", "--n-head-kv", "1"])
            .args(["--type", "Q8_0", "--vocab-from"])
            .arg(vocab)
            .output()
            .unwrap()
    };
    // Another vocabulary size is refused in one line.
    let o = small(&d.join("smol-vocab.gguf"), &smol);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("128256-token vocabulary"));
    assert!(!d.join("smol-vocab.gguf").exists());

    let a = d.join("a.gguf");
    let o = small(&a, &vocab);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = GgufFile::open(&a).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_f32("llama.rope.freq_base").unwrap(), Some(500000.0));
    assert_eq!(md.get_u32("llama.context_length").unwrap(), Some(131072));
    assert_eq!(
        md.get_u32("llama.attention.head_count_kv").unwrap(),
        Some(1)
    );
    let rope = f.tensor("rope_freqs.weight").expect("rope_freqs.weight");
    assert_eq!(
        (rope.shape().to_vec(), rope.ggml_type),
        (vec![64], GgmlType::F32)
    );
    let factors: Vec<f32> = f
        .tensor_data(rope)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!((factors[0], factors[28], factors[63]), (1.0, 1.0, 8.0));
    assert!((factors[29] - 1.207_483_9).abs() < 1e-5, "{factors:?}");

    // The same file with every divisor 1.0 (found by its bytes: 256 of them, once).
    let stored = f.tensor_data(rope).to_vec();
    drop(f);
    let mut bytes = std::fs::read(&a).unwrap();
    let at = bytes
        .windows(stored.len())
        .position(|w| w == stored.as_slice())
        .expect("the factors' bytes");
    for c in bytes[at..at + stored.len()].chunks_exact_mut(4) {
        c.copy_from_slice(&1f32.to_le_bytes());
    }
    let ones = d.join("ones.gguf");
    std::fs::write(&ones, &bytes).unwrap();
    let (scaled, unscaled) = (perplexity(&a, &text), perplexity(&ones, &text));
    assert_ne!(scaled, unscaled, "rope_freqs.weight changes nothing");
    let _ = std::fs::remove_dir_all(&d);
}
