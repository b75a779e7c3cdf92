//! The Metal backend's host side, on any OS: a fixture compiles with it (one lint-clean MSL
//! library and a dispatch table per step), its payload survives the artifact's JSON, the
//! shared GPU host checks accept the generated program, and loading it refuses in one line
//! elsewhere than macOS; `modelc compile --target metal` writes a runner that does the same,
//! and `--emit-source DIR` writes `DIR/model.metal`.
#![cfg(feature = "metal")]

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::backend::metal::{self, MetalBackend};
use runtime::backend::{Backend, LoadOptions, LogitRows, Payload, Target};
use std::path::PathBuf;
use std::process::Command;

const FIXTURE: &str = "fixtures/models/llama-sep-Q4_0.gguf";

/// The fixture and its Metal payload (ubatches 1 and 4, a context of 64).
fn payload() -> Option<(PathBuf, GgufFile, Payload)> {
    let path = modelc_tests::shared(FIXTURE)?;
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("fixture lowers");
    let plan = runtime::cpu_engine::build_plan(&model, &[1, 4], 64, KvTypes::F16, LogitRows::Both)
        .expect("plan");
    let payload = MetalBackend::default()
        .build(plan)
        .expect("the Metal backend builds the fixture");
    Some((path, gguf, payload))
}

fn opts(n_ctx: usize) -> LoadOptions {
    LoadOptions {
        n_threads: 1,
        n_ctx,
        flash_attn: true,
        logits: LogitRows::Both,
        swa_full: false,
    }
}

#[test]
fn the_fixture_compiles_and_survives_json() {
    let Some((_, gguf, p)) = payload() else {
        return;
    };
    assert_eq!(p.kind(), "metal");
    let json = serde_json::to_string(&p).expect("serializes");
    assert!(json.contains(r#""kind":"metal""#), "tagged as metal");
    let back: Payload = serde_json::from_str(&json).expect("parses back");
    assert_eq!(back.kind(), "metal");
    let (Payload::Metal { program: a, .. }, Payload::Metal { program: b, .. }) = (&p, &back) else {
        panic!("not metal payloads");
    };
    assert_eq!(a, b);
    assert_eq!(back.plan().steps.len(), p.plan().steps.len());
    assert_eq!(a.steps.len(), p.plan().steps.len());
    assert!(a.steps.iter().all(|s| !s.launches.is_empty()));

    // `--emit-source`: one file, the program's source, which the lint accepts.
    let files = MetalBackend::default().sources(p.plan()).expect("sources");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, metal::SOURCE_FILE);
    assert_eq!(files[0].1, a.source);
    let lint = codegen_metal::lint(&files[0].1);
    assert!(lint.is_empty(), "lint: {lint:?}");

    // The host checks the macOS engine makes before touching the device.
    let checked = metal::check(p.plan(), a, &gguf, &opts(64)).expect("checks pass");
    assert_eq!(checked.steps.len(), p.plan().steps.len());
    assert_eq!(checked.weights.len(), p.plan().weights.len());
    assert!(checked.n_vocab > 0);
}

#[test]
fn a_source_the_lint_refuses_is_an_error_naming_its_lines() {
    let e =
        metal::check_source("kernel void f(float* p) { double x = 0; }\n").expect_err("refused");
    let e = format!("{e:#}");
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(
        e.starts_with("--target metal:") && e.contains("line 1"),
        "{e}"
    );
}

#[test]
fn loading_refuses_in_one_line() {
    let Some((_, gguf, p)) = payload() else {
        return;
    };
    let be = runtime::backend::backend(Target::Metal, &Default::default()).expect("metal backend");
    assert_eq!(be.target(), Target::Metal);
    let err = |r: anyhow::Result<Box<dyn runtime::engine::Engine + '_>>| match r {
        Ok(_) => panic!("loaded"),
        Err(e) => format!("{e:#}"),
    };
    let cpu = Payload::Plan {
        plan: Box::new(p.plan().clone()),
    };
    let e = err(be.load(&cpu, &gguf, &opts(16)));
    assert!(e.contains("built for another target"), "{e}");
    let e = err(be.load(&p, &gguf, &opts(16)));
    assert!(!e.contains('\n'), "one line: {e}");
    if cfg!(target_os = "macos") {
        eprintln!("{e}");
    } else {
        assert_eq!(e, metal::not_macos());
        assert!(e.contains("run on macOS only"), "{e}");
    }
}

#[test]
fn the_runner_refuses_to_run_here_and_emit_source_writes_the_library() {
    if cfg!(target_os = "macos") {
        return;
    }
    let Some(model) = modelc_tests::shared(FIXTURE) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("modelc-metal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let runner = dir.join("llama-metal");
    let src = dir.join("src");
    let out = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("compile")
        .arg(&model)
        .args(["--target", "metal", "--ubatch", "1,4", "-c", "64", "-o"])
        .arg(&runner)
        .arg("--emit-source")
        .arg(&src)
        .output()
        .expect("modelc runs");
    assert!(
        out.status.success(),
        "compile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(src.join(metal::SOURCE_FILE)).expect("model.metal");
    assert!(text.contains("kernel void"), "an MSL library");
    assert!(codegen_metal::lint(&text).is_empty());

    let out = Command::new(&runner)
        .args(["-p", "Hello", "-n", "4"])
        .output()
        .expect("the runner runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].contains(&metal::not_macos()), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
