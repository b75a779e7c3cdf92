//! Helpers shared by the tests that run the `modelc` binary on the real SmolLM2 model.

// Not every test file that includes this module uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The `modelc` binary built for these tests.
pub fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

/// The SmolLM2 Q4_1 model ([`modelc_tests::smollm2`]: `None` after a recorded skip when it
/// is absent, a failure under `MODELC_REQUIRE_MODELS=1`).
pub fn model() -> Option<PathBuf> {
    modelc_tests::smollm2()
}

/// Runs `cmd`, asserts it succeeded (showing its stderr if not) and parses its stdout as JSON
/// (`modelc run --json`, `inspect --json`).
pub fn json_output(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// Runs `modelc run` on `model` for each case of `tests/data/NAME` (`{"cases": [{"prompt",
/// "args", "content"}]}`, texts llama-completion wrote with the same flags) with `-t 2 -c
/// 2048`, and returns a line per case whose text differs (trailing whitespace aside).
pub fn cases_differing_from_llama_cpp(model: &std::path::Path, name: &str) -> Vec<String> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p).expect("reference data")).expect("json");
    let mut bad = Vec::new();
    for c in r["cases"].as_array().expect("cases") {
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg"))
            .collect();
        let out = modelc()
            .arg("run")
            .arg(model)
            .args(["-p", c["prompt"].as_str().expect("prompt")])
            .args(["-t", "2", "-c", "2048"])
            .args(&args)
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = String::from_utf8_lossy(&out.stdout);
        let want = c["content"].as_str().expect("content");
        if got.trim_end() != want.trim_end() {
            bad.push(format!("{args:?}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    bad
}

/// A runner named `smol` for `model`, compiled with `modelc compile -c N_CTX --ubatch 1,16`
/// into the test target's folder `dir` (each test file compiles its own once).
///
/// # Panics
/// When the compile fails (its stderr in the message).
pub fn compile_runner(model: &std::path::Path, dir: &str, n_ctx: u32) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let runner = dir.join("smol");
    let out = modelc()
        .arg("compile")
        .arg(model)
        .arg("-o")
        .arg(&runner)
        .args(["-c", &n_ctx.to_string(), "--ubatch", "1,16"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    runner
}
