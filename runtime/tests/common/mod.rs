//! Helpers shared by the tests that run the `modelc` binary on the real SmolLM2 model.

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
