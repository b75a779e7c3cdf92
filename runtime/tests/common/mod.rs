//! Helpers shared by the tests that run the `modelc` binary on the real SmolLM2 model.

use std::path::PathBuf;
use std::process::Command;

/// The file name of the default model (`scripts/fetch-model` fetches it).
pub const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The `modelc` binary built for these tests.
pub fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

/// The SmolLM2 Q4_1 model from `$MODELC_MODELS` or `~/.cache/modelc/models`, or `None` (with
/// a message saying the test skips) when it is absent.
pub fn model() -> Option<PathBuf> {
    let dir = std::env::var_os("MODELC_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelc/models"))
        })?;
    let p = dir.join(MODEL);
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} is absent (scripts/fetch-model fetches it)",
            p.display()
        );
        None
    }
}
