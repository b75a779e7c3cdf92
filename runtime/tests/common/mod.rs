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
