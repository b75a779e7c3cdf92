//! Quantized KV caches (`-ctk q8_0`, `-ctv q8_0`) against llama.cpp, end to end: greedy
//! continuations of three prompts with Q8_0 K and V, Q8_0 K with F16 V and F16 K with Q8_0 V
//! equal llama.cpp's text, in `modelc run` and in a compiled runner; the perplexity of
//! `shared/reference/ppl-text.txt` equals llama-perplexity's chunk by chunk; with `-fa off`
//! (llama.cpp's soft_max path, F16 cache or Q8_0 K) the interpreter and the CPU engine write
//! llama-completion's text. The expected
//! outputs and the commands that made them are in `tests/data/kv_quantized_llama_cpp.json`
//! (llama.cpp rotates Q, K and V with a Walsh–Hadamard matrix around a quantized cache; these
//! outputs are what that rotation, Q8_0 storage and its flash kernel produce).
//!
//! Needs SmolLM2-135M-Instruct Q4_1 (and, for the perplexity, `../shared`): see
//! `modelc_tests::require`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{model, modelc};

fn reference() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kv_quantized_llama_cpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference data")).expect("json")
}

/// Runs `cmd`, asserting success; returns stdout.
fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every completion case: `run` with the case's flags and the case's expected text.
fn check_completions(what: &str, run: &mut dyn FnMut(&str, &str, &str) -> String) {
    let r = reference();
    let mut bad = Vec::new();
    for c in r["completions"].as_array().expect("completions") {
        let (id, k, v) = (
            c["prompt_id"].as_str().unwrap(),
            c["cache_type_k"].as_str().unwrap(),
            c["cache_type_v"].as_str().unwrap(),
        );
        let prompt = r["prompts"][id].as_str().expect("prompt");
        let got = run(prompt, k, v);
        let want = c["content"].as_str().unwrap();
        if got.trim_end() != want.trim_end() {
            bad.push(format!(
                "{id} -ctk {k} -ctv {v}:\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what} differs from llama.cpp:\n{}",
        bad.join("\n")
    );
}

#[test]
fn run_continuations_equal_llama_cpp() {
    let Some(m) = model() else { return };
    check_completions("modelc run", &mut |prompt, k, v| {
        stdout_of(modelc().arg("run").arg(&m).args([
            "-p", prompt, "-n", "48", "--temp", "0", "-t", "2", "-c", "2048", "-ctk", k, "-ctv", v,
        ]))
    });
}

#[test]
fn runner_continuations_equal_llama_cpp() {
    let Some(m) = model() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_cache_quantized");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    // Cache types change the kernels: one runner per pair, compiled with it.
    let compile = |k: &str, v: &str| {
        let runner = dir.join(format!("smol_{k}_{v}"));
        stdout_of(
            modelc()
                .arg("compile")
                .arg(&m)
                .arg("-o")
                .arg(&runner)
                .args(["-c", "2048", "--cache-type-k", k, "--cache-type-v", v]),
        );
        runner
    };
    let runner = compile("q8_0", "q8_0");
    let info = stdout_of(Command::new(&runner).arg("info"));
    assert!(info.contains("KV cache k q8_0, v q8_0"), "{info}");
    let mut runners = std::collections::HashMap::new();
    check_completions("the runner", &mut |prompt, k, v| {
        let r = runners
            .entry((k.to_string(), v.to_string()))
            .or_insert_with(|| compile(k, v));
        stdout_of(Command::new(&*r).args([
            "-p", prompt, "-n", "48", "--temp", "0", "-t", "2", "-ctk", k, "-ctv", v,
        ]))
    });
    // Another pair than the compiled one is refused in one line naming the command that
    // compiles a runner for it.
    let out = Command::new(&runner)
        .args(["-p", "hi", "-n", "2", "-ctk", "f16", "-ctv", "f16"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("compiled for -ctk q8_0 -ctv q8_0") && err.lines().count() == 1,
        "{err}"
    );
    // Only the flash kernels read a quantized cache: -fa off is refused in one line.
    let out = Command::new(&runner)
        .args(["-p", "hi", "-n", "2", "-fa", "off"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs flash attention") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn perplexity_equals_llama_cpp() {
    let Some(m) = model() else { return };
    let Some(text) = modelc_tests::shared("reference/ppl-text.txt") else {
        return;
    };
    let r = reference();
    let out = modelc()
        .arg("perplexity")
        .arg(&m)
        .arg("-f")
        .arg(&text)
        .args([
            "-c", "256", "-b", "256", "-t", "2", "-ctk", "q8_0", "-ctv", "q8_0",
        ])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let chunks: Vec<String> = r["perplexity_q8_0"]["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .enumerate()
        .map(|(i, c)| format!("[{}]{:.4}", i + 1, c.as_f64().unwrap()))
        .collect();
    let line = chunks.join(",");
    assert!(all.contains(&line), "chunks differ: want {line}\n{all}");
    let fin = r["perplexity_q8_0"]["final"].as_str().unwrap();
    assert!(
        all.contains(&format!("PPL = {fin}")),
        "want PPL = {fin}\n{all}"
    );
}

/// `modelc run` on the CPU engine or the interpreter, greedy, 32 tokens, with `args`: the text.
fn greedy_32(m: &Path, backend: &str, prompt: &str, args: &[&str]) -> String {
    stdout_of(
        modelc()
            .arg("run")
            .arg(m)
            .args([
                "--backend",
                backend,
                "-p",
                prompt,
                "-n",
                "32",
                "--temp",
                "0",
            ])
            .args(["-t", "2", "-c", "2048"])
            .args(args),
    )
}

/// Every case of the reference set `set` through [`greedy_32`] on `backends`.
fn check_set(m: &Path, set: &str, backends: &[&str], args: &[&str]) {
    let r = reference();
    for c in r[set]["cases"].as_array().expect("cases") {
        let id = c["prompt_id"].as_str().unwrap();
        let prompt = r["prompts"][id].as_str().expect("prompt");
        let want = c["content"].as_str().unwrap();
        for backend in backends {
            let got = greedy_32(m, backend, prompt, args);
            assert_eq!(
                got.trim_end(),
                want.trim_end(),
                "{set} {id} --backend {backend}"
            );
        }
    }
}

/// `-fa off` (llama.cpp's soft_max path) with an F16 cache and with a Q8_0 K (Q converted to
/// Q8_0, `vec_dot_q8_0_q8_0` scores): both the interpreter and the CPU engine
/// (`codegen-cpu/src/handwritten/soft_max_attn.rs`) write llama-completion's text.
#[test]
fn soft_max_path_equals_llama_cpp() {
    let Some(m) = model() else { return };
    let both = ["cpu", "interp"];
    check_set(&m, "no_flash_f16", &both, &["-fa", "off"]);
    check_set(
        &m,
        "no_flash_k_q8_0",
        &both,
        &["-ctk", "q8_0", "-fa", "off"],
    );
}

/// `-ctk f32 -ctv f32` with flash attention: llama.cpp casts the F32 K and V to F16 before its
/// flash kernel; the CPU engine (which then keeps the cache's values rounded to f16) writes
/// llama-completion's text (the interpreter's cast is checked against it bit for bit in
/// `codegen-cpu/tests/exec_flash.rs`).
#[test]
fn f32_cache_with_flash_attention_equals_llama_cpp() {
    let Some(m) = model() else { return };
    check_set(&m, "flash_f32", &["cpu"], &["-ctk", "f32", "-ctv", "f32"]);
}
