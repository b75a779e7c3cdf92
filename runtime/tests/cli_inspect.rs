//! `modelc inspect` against llama.cpp's view of the real models (`../shared/reference/models.json`),
//! and its behaviour on broken files: exit status 1, one line on stderr, quickly.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

/// A real model of the models folder, or `None` after a recorded skip.
fn model(name: &str) -> Option<PathBuf> {
    modelc_tests::require(
        modelc_tests::models_dir().join(name),
        "scripts/fetch-model --gemma fetches it",
    )
}

#[test]
fn inspect_matches_llama_cpp_for_the_real_models() {
    let Some(models_json) = modelc_tests::shared("reference/models.json") else {
        return;
    };
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(models_json).unwrap()).unwrap();
    for r in reference.as_array().unwrap() {
        let Some(path) = model(r["file"].as_str().unwrap()) else {
            continue;
        };
        let out = modelc()
            .arg("inspect")
            .arg(&path)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let h = &d["hparams"];
        for (ours, theirs) in [
            ("n_layer", "n_layer"),
            ("n_embd", "n_embd"),
            ("n_head", "n_head"),
            ("n_head_kv", "n_head_kv"),
            ("n_ff", "n_ff"),
            ("n_vocab", "vocab_size_tokens_array"),
            ("n_ctx_train", "context_length"),
        ] {
            assert_eq!(h[ours], r[theirs], "{}: {ours}", r["file"]);
        }
        if let Some(hd) = r["head_dim_k"].as_u64() {
            assert_eq!(h["n_embd_head_k"], hd);
        }
        assert_eq!(h["tied_output"], r["tied_embeddings"]);
        assert_eq!(d["n_params"], r["n_params"]);
        assert_eq!(d["file_size_bytes"], r["size_bytes"]);
        assert_eq!(d["tensor_data_bytes"], r["tensor_data_bytes"]);
        for (ty, n) in r["type_mix_count"].as_object().unwrap() {
            assert_eq!(d["type_mix"][ty]["tensors"], *n, "{}: {ty}", r["file"]);
            assert_eq!(
                d["type_mix"][ty]["bytes"], r["type_mix_bytes"][ty],
                "{}: {ty}",
                r["file"]
            );
        }
        assert_eq!(d["tokenizer"]["model"], r["tokenizer.ggml.model"]);
        assert_eq!(d["tokenizer"]["pre"], r["tokenizer.ggml.pre"]);
        assert_eq!(d["chat_template"]["present"], r["chat_template_present"]);
        let text = modelc()
            .arg("inspect")
            .arg(&path)
            .arg("--metadata")
            .output()
            .unwrap();
        assert!(text.status.success());
        let s = String::from_utf8(text.stdout).unwrap();
        assert!(s.contains("arr[str,"), "long arrays are abbreviated");
        assert!(s.contains("blk.0.attn_q.weight"));
    }
}

#[test]
fn inspect_reads_vocab_only_files_and_fixtures() {
    for f in [
        "vocab/ggml-vocab-llama-spm.gguf",
        "fixtures/models/gemma3-Q4_K.gguf",
    ] {
        let Some(path) = modelc_tests::shared(f) else {
            continue;
        };
        let out = modelc().arg("inspect").arg(path).output().unwrap();
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn broken_files_exit_1_with_one_line() {
    let dir = std::env::temp_dir().join(format!("modelc-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut huge = b"GGUF".to_vec();
    huge.extend_from_slice(&3u32.to_le_bytes());
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    huge.extend_from_slice(&0u64.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("not-gguf", b"hello world, not a model".to_vec()),
        ("huge-count", huge),
        ("truncated", {
            let mut w = ir::gguf::GgufWriter::new();
            w.add_kv(
                "general.architecture",
                ir::gguf::Value::String("llama".into()),
            );
            w.add_tensor("t", &[64], ir::ggml::GgmlType::F32, vec![0; 256])
                .unwrap();
            let b = w.to_bytes().unwrap();
            b[..b.len() - 10].to_vec()
        }),
    ];
    for (name, bytes) in cases {
        let p = dir.join(format!("{name}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        let t0 = Instant::now();
        let out = modelc().arg("inspect").arg(&p).output().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{name} took {:?}",
            t0.elapsed()
        );
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains("error") && err.contains(name), "{name}: {err}");
    }
    let out = modelc()
        .arg("inspect")
        .arg(dir.join("missing.gguf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
}

/// Output that cannot be written is not a panic: a full disk gives one line and status 1, a
/// pipe closed by the reader ends the command quietly (status 141, as a SIGPIPE death).
#[test]
fn unwritable_output_is_one_line_not_a_panic() {
    let Some(fixture) = modelc_tests::shared("fixtures/models/llama-sep-Q4_0.gguf") else {
        return;
    };
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let out = modelc()
            .args(["inspect", "--metadata"])
            .arg(&fixture)
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("writing output"), "{err}");
    }
    let mut child = modelc()
        .args(["inspect", "--metadata"])
        .arg(&fixture)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(matches!(out.status.code(), Some(0) | Some(141)), "{err}");
}
