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

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("modelc-synth-{}", std::process::id()));
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
    let d = scratch();
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
