//! modelc's end-to-end tests (`tests/tests/`: sessions, generation and fidelity on the real
//! models) and what every crate's tests share to find the real models and the reference
//! data without ever passing by skipping:
//!
//! - [`require`]: a file a test needs. Present: its path. Absent: with
//!   `MODELC_REQUIRE_MODELS=1` (set by `.ci/run`) the test fails, naming the file and how to
//!   get it; without it the test is skipped, and the skip is recorded ([`skip`]) so that
//!   `scripts/test` reports every skip once, visibly, at the end of the run.
//! - [`smollm2`], [`gemma3`], [`shared`]: the usual files.
//!
//! The crate is a dev-dependency of every crate whose tests read such files.

pub mod filetest;

use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable that turns a missing model or reference into a failure.
pub const REQUIRE_ENV: &str = "MODELC_REQUIRE_MODELS";

/// The environment variable naming the file skips are appended to (`scripts/test` sets it
/// and prints the file's lines at the end).
pub const SKIP_LOG_ENV: &str = "MODELC_SKIP_LOG";

/// Whether missing test data fails the test (`MODELC_REQUIRE_MODELS` set to anything but
/// `0` or empty).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Records that the calling test skipped for `reason`: one line on stderr, and one line in
/// the skip log when [`SKIP_LOG_ENV`] names one. With [`required`], panics instead: a test
/// that cannot run is a failure there.
///
/// # Panics
/// With `MODELC_REQUIRE_MODELS=1`, always.
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    assert!(
        !required(),
        "{test}: {reason} ({REQUIRE_ENV} is set, so missing test data is a failure)"
    );
    eprintln!("SKIP {test}: {reason}");
    if let Some(log) = std::env::var_os(SKIP_LOG_ENV) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            // One write call per line, so that lines of tests running at once never mix.
            let _ = f.write_all(format!("{test}: {reason}\n").as_bytes());
        }
    }
}

/// `path` if it exists; else [`skip`] with `how` (how to get it) and `None`.
///
/// # Panics
/// As [`skip`].
pub fn require(path: impl AsRef<Path>, how: &str) -> Option<PathBuf> {
    let p = path.as_ref();
    if p.exists() {
        Some(p.to_path_buf())
    } else {
        skip(&format!("{} is absent ({how})", p.display()));
        None
    }
}

/// The folder of the real models: `$MODELC_MODELS`, else `~/.cache/modelc/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("MODELC_MODELS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelc/models")))
        .unwrap_or_else(|| PathBuf::from(".cache/modelc/models"))
}

/// The file name of the default model, SmolLM2-135M-Instruct Q4_1.
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The file name of Gemma 3 270M Q4_K_M.
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// SmolLM2 Q4_1 ([`require`]).
pub fn smollm2() -> Option<PathBuf> {
    require(models_dir().join(SMOLLM2), "scripts/fetch-model fetches it")
}

/// Gemma 3 270M Q4_K_M ([`require`]).
pub fn gemma3() -> Option<PathBuf> {
    require(
        models_dir().join(GEMMA3),
        "scripts/fetch-model --gemma fetches it",
    )
}

/// The workspace's `../shared` folder (fixtures, reference outputs, vocab suites).
pub fn shared_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"))
}

/// `../shared/REL` ([`require`]).
pub fn shared(rel: &str) -> Option<PathBuf> {
    require(
        shared_root().join(rel),
        "the shared folder lies beside the repository in CI and on developers' machines",
    )
}

/// Natural-log softmax of `logits` in f64, as `shared/reference/` computes its log-probabilities
/// (`logit - logsumexp(all logits)` in double precision).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}
