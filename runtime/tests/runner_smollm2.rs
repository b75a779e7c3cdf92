//! The main job end to end: `modelc compile` SmolLM2-135M-Instruct Q4_1 into a runner, then
//! check the runner against llama.cpp's reference outputs (`../shared/reference/`):
//! - teacher-forced: with llama.cpp's greedy continuation forced, the top-5 log-probabilities
//!   at every position agree within 0.1 nat (ids may swap only between near-equal candidates);
//! - free-running greedy: where the text parts from llama.cpp's, the two candidates were a
//!   near-tie by our own log-probabilities. The leading match is printed for every prompt.
//!
//! The compiled CPU kernels follow llama.cpp's x86 AVX2 arithmetic (matmul summation order,
//! flash attention, vectorized `expf`), so the runner reproduces llama.cpp's logits bit for bit
//! on these prompts, as the interpreter does (`compiler/tests/smollm2_fidelity.rs`); the test
//! asserts the issue's 0.1-nat target.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The fidelity target of the issue, in nat.
const TARGET: f64 = 0.1;

/// The model and llama.cpp's reference for it, or `None` after a recorded skip.
fn setup() -> Option<(PathBuf, Value)> {
    let reference = modelc_tests::shared("reference/ref-SmolLM2-135M-Instruct.Q4_1.json")?;
    let model = modelc_tests::smollm2()?;
    let reference = std::fs::read_to_string(reference).expect("read the reference");
    Some((
        model,
        serde_json::from_str(&reference).expect("reference json"),
    ))
}

fn compile(model: &Path, dir: &Path) -> PathBuf {
    let runner = dir.join("smol");
    let out = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("compile")
        .arg(model)
        .arg("-o")
        .arg(&runner)
        .args(["-c", "1024"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    runner
}

fn run_json(runner: &Path, prompt: &str, extra: &[&str]) -> Value {
    let out = Command::new(runner)
        .args([
            "-p",
            prompt,
            "--temp",
            "0",
            "-n",
            "48",
            "--json",
            "--n-probs",
            "5",
            "-t",
            "2",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "runner failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Largest gap between our top-5 and the reference top-5 at one position: each reference id
/// must be in ours with a close log-prob, or be below our 5th by little; the gap is returned.
fn top5_gap(ours: &Value, reference: &Value) -> f64 {
    let ours: Vec<(u64, f64)> = ours["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t["logprob"].as_f64().unwrap()))
        .collect();
    let fifth = ours.last().map_or(f64::NEG_INFINITY, |t| t.1);
    let mut worst: f64 = 0.0;
    for r in reference.as_array().unwrap() {
        let (id, lp) = (r[0].as_u64().unwrap(), r[1].as_f64().unwrap());
        let gap = match ours.iter().find(|t| t.0 == id) {
            Some(t) => (t.1 - lp).abs(),
            None => (fifth - lp).max(0.0),
        };
        worst = worst.max(gap);
    }
    worst
}

#[test]
fn runner_within_target_of_llama_cpp() {
    check_runner(TARGET, TARGET);
}

fn check_runner(tol_tf: f64, tol_tie: f64) {
    let Some((model, reference)) = setup() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("modelc-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let runner = compile(&model, &dir);
    let mut worst_tf: f64 = 0.0;
    for p in reference["prompts"].as_array().unwrap() {
        let prompt = p["prompt"].as_str().unwrap();
        let expect_prompt = ids(&p["tokens_add_special_true"]);
        let forced = ids(&p["completion"]["tokens"]);
        let forced_s = forced
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let tf = run_json(&runner, prompt, &["--forced-tokens", &forced_s]);
        assert_eq!(
            ids(&tf["prompt_tokens"]),
            expect_prompt,
            "{}: prompt tokens",
            p["id"]
        );
        assert_eq!(ids(&tf["tokens"]), forced, "{}: forced tokens", p["id"]);
        let ours = tf["probs"].as_array().unwrap();
        let theirs = p["teacher_forced"]["top5"].as_array().unwrap();
        assert_eq!(ours.len(), theirs.len());
        let gap = ours
            .iter()
            .zip(theirs)
            .map(|(o, t)| top5_gap(o, t))
            .fold(0.0, f64::max);
        worst_tf = worst_tf.max(gap);
        assert!(
            gap <= tol_tf,
            "{}: teacher-forced top-5 differs by {gap:.4} nat",
            p["id"]
        );

        let free = run_json(&runner, prompt, &[]);
        let got = ids(&free["tokens"]);
        let lead = got.iter().zip(&forced).take_while(|(a, b)| a == b).count();
        eprintln!("{}: {lead}/{} leading greedy tokens equal llama.cpp's (teacher-forced max gap {gap:.4})", p["id"], forced.len());
        if lead < forced.len().min(got.len()) {
            // At the parting position both candidates must be a near-tie by our log-probs.
            let top = free["probs"][lead]["top_logprobs"].as_array().unwrap();
            let lp = |id: u64| {
                top.iter()
                    .find(|t| t["id"] == id)
                    .map(|t| t["logprob"].as_f64().unwrap())
            };
            let (a, b) = (lp(got[lead]), lp(forced[lead]));
            eprintln!(
                "  parts at {lead}: ours {} ({a:?}) vs llama.cpp {} ({b:?})",
                got[lead], forced[lead]
            );
            let (Some(a), Some(b)) = (a, b) else {
                panic!("{}: llama.cpp's token is not in our top 5", p["id"])
            };
            assert!(
                (a - b).abs() <= tol_tie,
                "{}: not a near-tie ({a} vs {b})",
                p["id"]
            );
        }
    }
    eprintln!("worst teacher-forced top-5 gap over all prompts: {worst_tf:.4} nat");
    std::fs::remove_dir_all(&dir).ok();
}

/// `modelc compile --kernels fast` makes a runner whose default is the fast kernels (its
/// `bench` says `CPU (fast)`), and its own `--kernels exact` still chooses llama.cpp's.
#[test]
fn compiled_kernels_are_the_runners_default() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("modelc-runner-fast-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let runner = dir.join("smol-fast");
    let out = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(&runner)
        .args(["-c", "256", "--ubatch", "1,8", "--kernels", "fast"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compile: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = Command::new(&runner).arg("info").output().unwrap();
    assert!(String::from_utf8_lossy(&info.stdout).contains("kernels         = fast"));
    let backend = |extra: &[&str]| {
        let out = Command::new(&runner)
            .args([
                "bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bench: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        rows[0]["backends"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(backend(&[]), "CPU (fast)");
    assert_eq!(backend(&["--kernels", "exact"]), "CPU");
    // A runner's messages carry its own name, whatever it is called.
    let renamed = dir.join("my-runner");
    std::fs::copy(&runner, &renamed).unwrap();
    let out = Command::new(&renamed).arg("-x").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("my-runner: error: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `modelc compile --cpu NAME` chooses the kernels for that CPU: a runner for an older x86
/// level (AVX2) runs here and gives the same greedy tokens as the native one; its `info`
/// names the CPU; one for another architecture is refused at start in one line; the runner
/// takes no `--cpu` of its own; an unknown name is refused by compile, listing the names.
#[test]
fn compile_for_another_cpu() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("modelc-runner-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let compile = |name: &str, cpu: Option<&str>| {
        let runner = dir.join(name);
        let mut c = Command::new(env!("CARGO_BIN_EXE_modelc"));
        c.arg("compile")
            .arg(&model)
            .arg("-o")
            .arg(&runner)
            .args(["-c", "256", "--ubatch", "1,8"]);
        if let Some(cpu) = cpu {
            c.args(["--cpu", cpu]);
        }
        (runner, c.output().unwrap())
    };
    let tokens = |runner: &Path| {
        let out = Command::new(runner)
            .args(["-p", "The capital of France", "--temp", "0", "-n", "8"])
            .args(["--json", "-t", "2"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        ids(&v["tokens"])
    };
    let (native, out) = compile("smol-native", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if codegen_cpu::target::Tier::host() >= codegen_cpu::target::Tier::Avx2 {
        let (haswell, out) = compile("smol-haswell", Some("haswell"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info = Command::new(&haswell).arg("info").output().unwrap();
        let info = String::from_utf8_lossy(&info.stdout).to_string();
        assert!(
            info.contains("cpu             = haswell (x86_64, kernels up to avx2)"),
            "{info}"
        );
        assert_eq!(tokens(&haswell), tokens(&native));
        let out = Command::new(&haswell)
            .args(["--cpu", "native", "-p", "x"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("--cpu: this runner's kernels were chosen for haswell"),
            "{err}"
        );
    }
    let foreign = if cfg!(target_arch = "x86_64") {
        "armv8-a"
    } else {
        "x86-64"
    };
    let (other, out) = compile("smol-other", Some(foreign));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&other)
        .args(["-p", "x", "-n", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("compiled for {foreign}")) && err.contains("--cpu native"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (_, out) = compile("smol-bad", Some("pentium"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown CPU 'pentium'") && err.contains("znver4"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
