//! `--spec-type ngram-simple` on `modelc run` with SmolLM2: the same greedy text and tokens
//! as without, llama-server's `draft_n` / `draft_n_accepted` in the JSON timings, the
//! acceptance line on stderr; types modelc lacks and llama.cpp's removed draft flags are
//! refused with the reason.

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
        (
            &["-md", "draft.gguf"][..],
            "draft models for speculative decoding are not supported",
        ),
        (&["--spec-ngram-simple-size-n", "0"][..], "1 to 1024"),
    ] {
        let out = run(&m, args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was taken");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
