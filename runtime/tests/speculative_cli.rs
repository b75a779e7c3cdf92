//! Speculative decoding on `modelc run` with SmolLM2, n-gram lookup (`--spec-type
//! ngram-simple`) and a draft model (`-md`, SmolLM2's Q4_0 file drafting for its Q4_1): the
//! same greedy text and tokens as without, llama-server's `draft_n` / `draft_n_accepted` in
//! the JSON timings, the acceptance line on stderr; a draft model with another vocabulary,
//! types modelc lacks and llama.cpp's removed draft flags are refused with the reason.

mod common;

use common::{json_output, model, modelc};

const PROMPT: &str = "one two three four five six seven eight nine ten, one two three four five six seven eight nine ten, one two three four five six seven eight nine ten, one two";
const SPEC: [&str; 6] = [
    "--spec-type",
    "ngram-simple",
    "--spec-ngram-simple-size-n",
    "2",
    "--spec-ngram-simple-size-m",
    "8",
];

fn run(m: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut c = modelc();
    c.arg("run")
        .arg(m)
        .args([
            "-p", PROMPT, "--temp", "0", "-n", "40", "-t", "2", "-c", "512",
        ])
        .args(extra);
    c
}

#[test]
fn same_tokens_and_draft_counts() {
    let Some(m) = model() else { return };
    let plain = json_output(run(&m, &[]).arg("--json"));
    let spec = json_output(run(&m, &SPEC).arg("--json"));
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["content"], plain["content"]);
    assert!(plain["timings"].get("draft_n").is_none());
    let t = &spec["timings"];
    let (n, accepted) = (t["draft_n"].as_u64(), t["draft_n_accepted"].as_u64());
    assert!(
        matches!((n, accepted), (Some(n), Some(a)) if n > 0 && a > 0 && a <= n),
        "{t}"
    );
    // Text output: the same text, and llama-server's acceptance line on stderr.
    let out = run(&m, &SPEC).output().expect("runs");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        plain["content"].as_str().expect("content")
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("draft acceptance = "), "{err}");
}

/// A seeded sampled run: every emitted token is one draw of the sampler chain from its own
/// position's logits, with or without speculation, so the tokens are the same.
#[test]
fn seeded_sampling_is_unchanged() {
    let Some(m) = model() else { return };
    let seeded = ["--temp", "0.8", "-s", "42", "--json"];
    let plain = json_output(&mut run(&m, &seeded));
    let spec = json_output(run(&m, &seeded).args(SPEC));
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert!(
        spec["timings"]["draft_n"].as_u64() > Some(0),
        "{}",
        spec["timings"]
    );
}

#[test]
fn unsupported_types_and_removed_flags_are_refused() {
    let Some(m) = model() else { return };
    for (args, says) in [
        (&["--spec-type", "ngram-mod"][..], "not supported"),
        (&["--spec-type", "bogus"][..], "unknown type"),
        (&["--draft-max", "8"][..], "removed"),
        (&["-md", "absent-draft.gguf"][..], "-md absent-draft.gguf"),
        (
            &["--spec-type", "draft-simple"][..],
            "needs a draft model (-md FILE)",
        ),
        (&["-td", "2"][..], "not supported"),
        (&["--spec-ngram-simple-size-n", "0"][..], "1 to 1024"),
    ] {
        let out = run(&m, args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was taken");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// SmolLM2's Q4_0 file (made by scripts/make-variants), a draft with SmolLM2's vocabulary.
fn draft_model() -> Option<std::path::PathBuf> {
    modelc_tests::require(
        modelc_tests::models_dir().join("SmolLM2-135M-Instruct.Q4_0.gguf"),
        "scripts/make-variants makes it",
    )
}

/// `-md`: greedy and seeded sampled output as without it; drafts proposed and accepted.
#[test]
fn draft_model_same_tokens() {
    let (Some(m), Some(d)) = (model(), draft_model()) else {
        return;
    };
    let md = ["-md", d.to_str().expect("utf-8 path")];
    let plain = json_output(run(&m, &[]).arg("--json"));
    let spec = json_output(run(&m, &md).arg("--json"));
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["content"], plain["content"]);
    let t = &spec["timings"];
    let (n, accepted) = (t["draft_n"].as_u64(), t["draft_n_accepted"].as_u64());
    assert!(
        matches!((n, accepted), (Some(n), Some(a)) if n > 0 && a > 0 && a <= n),
        "{t}"
    );
    // Longer drafts, and with the n-gram lookup asked first.
    let more = json_output(
        run(&m, &md)
            .args([
                "--spec-draft-n-max",
                "8",
                "--spec-type",
                "ngram-simple,draft-simple",
            ])
            .arg("--json"),
    );
    assert_eq!(more["tokens"], plain["tokens"]);
    let seeded = ["--temp", "0.8", "-s", "7", "--json"];
    let plain = json_output(&mut run(&m, &seeded));
    let spec = json_output(run(&m, &seeded).args(md));
    assert_eq!(spec["tokens"], plain["tokens"]);
    // Text output: the acceptance line on stderr.
    let out = run(&m, &md).output().expect("runs");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("draft acceptance = "), "{err}");
}

/// A draft model whose vocabulary is not the target's (Gemma 3 for SmolLM2) is refused
/// before generation, saying why; the server refuses -md.
#[test]
fn draft_model_with_another_vocabulary_is_refused() {
    let (Some(m), Some(g)) = (model(), modelc_tests::gemma3()) else {
        return;
    };
    let out = run(&m, &["-md", g.to_str().expect("utf-8 path")])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot draft for this model"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
