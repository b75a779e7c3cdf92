//! `perplexity --kl-divergence-base FILE` / `--kl-divergence` end to end (issue 17 point 5):
//! SmolLM2 against its own saved log-probabilities gives a KL divergence of about 0 and the
//! same top token everywhere; the file has llama-perplexity's size; a bad base file is one
//! line and status 1.

use std::process::Command;

fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

#[test]
fn a_model_against_its_own_base_has_no_divergence() {
    let (Some(model), Some(text)) = (
        modelc_tests::smollm2(),
        modelc_tests::shared("reference/ppl-text.txt"),
    ) else {
        return;
    };
    let d = std::env::temp_dir().join(format!("modelc-kld-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let base = d.join("base.kld");
    let o = modelc()
        .arg("perplexity")
        .arg(&model)
        .arg("-f")
        .arg(&text)
        .args([
            "-c",
            "128",
            "--chunks",
            "2",
            "-t",
            "2",
            "--kl-divergence-base",
        ])
        .arg(&base)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Header, 2 × 128 tokens, 2 chunks × 63 scored tokens × (49152 + 4) u16.
    let len = std::fs::metadata(&base).unwrap().len();
    assert_eq!(len, 20 + 4 * 256 + 2 * 63 * 49156 * 2);

    let o = modelc()
        .arg("perplexity")
        .arg(&model)
        .args(["-t", "2", "--kl-divergence", "--kl-divergence-base"])
        .arg(&base)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("Same top p: 100.000 ± 0.000 %"), "{out}");
    let kld: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("Mean    KLD:"))
        .and_then(|r| r.split('±').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no mean KLD in {out}"));
    assert!(kld.abs() < 1e-4, "{kld}");

    // A file that is not one: one line, status 1.
    std::fs::write(&base, b"not logits").unwrap();
    let o = modelc()
        .arg("perplexity")
        .arg(&model)
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(&base)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A base file to write that is the model, the text or a link to either is refused before
/// anything is read, and the file is left as it was (llama-perplexity would overwrite it).
/// Text that is not UTF-8 is scored as llama-perplexity scores it (its bytes tokenized).
#[test]
fn the_base_file_never_replaces_the_model_or_the_text() {
    let Some(fixture) = modelc_tests::shared("fixtures/models/llama-sep-Q4_0.gguf") else {
        return;
    };
    let d = std::env::temp_dir().join(format!("modelc-kld-guard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let model = d.join("model.gguf");
    std::fs::copy(&fixture, &model).unwrap();
    let text = d.join("text.txt");
    // Invalid UTF-8 in the middle of ordinary text.
    let mut bytes = b"the quick brown fox jumps over the lazy dog. ".repeat(40);
    bytes.extend_from_slice(b"\xff\xfe caf\xe9 ");
    bytes.extend_from_slice(&b"and then the dog slept in the sun all day. ".repeat(40));
    std::fs::write(&text, &bytes).unwrap();
    let link = d.join("link.gguf");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let before = std::fs::read(&model).unwrap();
    let perplexity = |base: &std::path::Path| {
        modelc()
            .arg("perplexity")
            .arg(&model)
            .arg("-f")
            .arg(&text)
            .args([
                "-c",
                "64",
                "--chunks",
                "1",
                "-t",
                "1",
                "--kl-divergence-base",
            ])
            .arg(base)
            .output()
            .unwrap()
    };
    for (base, what) in [
        (&model, "the model file"),
        (&link, "the model file"),
        (&text, "the text being scored"),
    ] {
        let o = perplexity(base);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(what), "{err}");
    }
    assert_eq!(std::fs::read(&model).unwrap(), before);
    assert_eq!(std::fs::read(&text).unwrap(), bytes);
    // The same text scored, and a base file elsewhere written.
    let base = d.join("base.kld");
    let o = perplexity(&base);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("Final estimate: PPL = "), "{out}");
    assert!(base.exists());
    let _ = std::fs::remove_dir_all(&d);
}
