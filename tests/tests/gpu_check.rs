//! `scripts/gpu-check`'s comparison of the CUDA runner with the CPU engine, without a GPU:
//! a CPU output of a made-up 10-token vocabulary is reduced to the reference
//! (`gpu-check reference`), and CUDA outputs doctored from it go through
//! `gpu-check compare`, which must pass agreement, ties and a constant shift of the
//! log-probabilities, and fail each mismatch naming its first position.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const N: usize = 64;
const VOCAB: usize = 10;

/// Log-probabilities at position `i` for ids `0..VOCAB`: a spread of 4.5 (so the logit scale
/// of the check is 2.25) with the top id moving with `i`.
fn logprobs(i: usize) -> Vec<f64> {
    (0..VOCAB)
        .map(|id| -1.0 - 0.5 * ((id + VOCAB - i % VOCAB) % VOCAB) as f64 - 0.001 * (i % 3) as f64)
        .collect()
}

/// One position's JSON (`probs` entry) with `lp` sorted, at most `n` entries.
fn position(lp: &[f64], n: usize) -> Value {
    let mut ids: Vec<usize> = (0..lp.len()).collect();
    ids.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    let top: Vec<Value> = ids
        .iter()
        .take(n)
        .map(|&id| json!({"id": id, "token": format!("t{id}"), "logprob": lp[id]}))
        .collect();
    json!({"id": ids[0], "token": format!("t{}", ids[0]), "logprob": lp[ids[0]], "top_logprobs": top})
}

/// A `--json` output: greedy tokens from `lps` (unless `tokens` is given) and their positions.
fn output(lps: &[Vec<f64>], tokens: Option<Vec<usize>>) -> Value {
    let probs: Vec<Value> = lps.iter().map(|lp| position(lp, VOCAB)).collect();
    let tokens = tokens.unwrap_or_else(|| {
        probs
            .iter()
            .map(|p| p["id"].as_u64().unwrap() as usize)
            .collect()
    });
    json!({"tokens": tokens, "probs": probs})
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check")
}

struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str) -> Case {
        let dir = std::env::temp_dir().join(format!(
            "modelc-gpu-check-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let cpu = output(&(0..N).map(logprobs).collect::<Vec<_>>(), None);
        std::fs::write(dir.join("cpu.json"), cpu.to_string()).unwrap();
        let st = Command::new(script())
            .arg("reference")
            .arg(dir.join("cpu.json"))
            .arg(dir.join("ref.json"))
            .status()
            .expect("runs scripts/gpu-check");
        assert!(st.success(), "gpu-check reference failed");
        Case { dir }
    }

    /// Runs `compare` on CUDA outputs `greedy` and `forced` (None: no file); exit status and
    /// output.
    fn compare(&self, greedy: Option<Value>, forced: Option<Value>) -> (bool, String) {
        let (g, f) = (self.dir.join("greedy.json"), self.dir.join("forced.json"));
        for (p, v) in [(&g, greedy), (&f, forced)] {
            let _ = std::fs::remove_file(p);
            if let Some(v) = v {
                std::fs::write(p, v.to_string()).unwrap();
            }
        }
        let out = Command::new(script())
            .args(["compare", "m"])
            .arg(self.dir.join("ref.json"))
            .args([&g, &f])
            .output()
            .expect("runs scripts/gpu-check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lps() -> Vec<Vec<f64>> {
    (0..N).map(logprobs).collect()
}

fn top(lp: &[f64]) -> usize {
    (0..lp.len())
        .max_by(|&a, &b| lp[a].total_cmp(&lp[b]).then(b.cmp(&a)))
        .unwrap()
}

#[test]
fn the_same_outputs_pass_and_the_reference_keeps_the_top_eight() {
    let c = Case::new("same");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.join("ref.json")).unwrap()).unwrap();
    assert_eq!(r["steps"].as_array().unwrap().len(), N);
    assert_eq!(r["steps"][0]["top"].as_array().unwrap().len(), 8);
    assert!((r["steps"][0]["lp_min"].as_f64().unwrap() - -5.5).abs() < 1e-9);
    let (ok, text) = c.compare(Some(output(&lps(), None)), Some(output(&lps(), None)));
    assert!(ok, "{text}");
    assert!(text.contains("greedy: the same 64 tokens"), "{text}");
}

#[test]
fn a_greedy_token_that_differs_fails_at_its_position() {
    let c = Case::new("greedy");
    let mut tokens: Vec<usize> = lps().iter().map(|l| top(l)).collect();
    tokens[5] = (tokens[5] + 1) % VOCAB;
    tokens[9] = (tokens[9] + 1) % VOCAB;
    let (ok, text) = c.compare(
        Some(output(&lps(), Some(tokens))),
        Some(output(&lps(), None)),
    );
    assert!(!ok, "{text}");
    assert!(text.contains("FAIL m: greedy token 5:"), "{text}");
}

#[test]
fn a_greedy_tie_within_1e_3_ends_the_comparison() {
    // The CPU's top two at position 5 within 5e-4: the CUDA's picking the second passes,
    // and what follows it is not compared.
    let mut cpu = lps();
    let t = top(&cpu[5]);
    let second = (t + VOCAB - 1) % VOCAB;
    cpu[5][second] = cpu[5][t] - 5e-4;
    let c = Case::new("tie");
    std::fs::write(c.dir.join("cpu.json"), output(&cpu, None).to_string()).unwrap();
    let st = Command::new(script())
        .arg("reference")
        .arg(c.dir.join("cpu.json"))
        .arg(c.dir.join("ref.json"))
        .status()
        .unwrap();
    assert!(st.success());
    let mut tokens: Vec<usize> = cpu.iter().map(|l| top(l)).collect();
    tokens[5] = second;
    tokens[6] = (tokens[6] + 3) % VOCAB;
    let (ok, text) = c.compare(
        Some(output(&cpu, Some(tokens.clone()))),
        Some(output(&cpu, None)),
    );
    assert!(ok, "{text}");
    assert!(text.contains("up to 5"), "{text}");
    // 2e-3 apart is no tie.
    cpu[5][second] = cpu[5][t] - 2e-3;
    std::fs::write(c.dir.join("cpu.json"), output(&cpu, None).to_string()).unwrap();
    let st = Command::new(script())
        .arg("reference")
        .arg(c.dir.join("cpu.json"))
        .arg(c.dir.join("ref.json"))
        .status()
        .unwrap();
    assert!(st.success());
    let (ok, text) = c.compare(Some(output(&cpu, Some(tokens))), Some(output(&cpu, None)));
    assert!(!ok, "{text}");
    assert!(text.contains("FAIL m: greedy token 5:"), "{text}");
}

#[test]
fn logits_beyond_the_tolerance_fail_at_the_first_such_position() {
    let c = Case::new("logits");
    // A constant shift is no difference of logits (the normalizer moved).
    let mut cuda = lps();
    for lp in &mut cuda[3] {
        *lp += 0.5;
    }
    let (ok, text) = c.compare(Some(output(&lps(), None)), Some(output(&cuda, None)));
    assert!(ok, "{text}");
    // One token 0.02 off at 7 (within 5e-3 × the scale 2.25 on either side) passes; 0.06
    // at 7 and 0.3 at 12 fail at 7.
    let second = |lp: &[f64]| (top(lp) + 1) % VOCAB;
    let s7 = second(&cuda[7]);
    cuda[7][s7] -= 0.02;
    let (ok, text) = c.compare(Some(output(&lps(), None)), Some(output(&cuda, None)));
    assert!(ok, "{text}");
    cuda[7][s7] -= 0.04;
    let s12 = second(&cuda[12]);
    cuda[12][s12] -= 0.3;
    let (ok, text) = c.compare(Some(output(&lps(), None)), Some(output(&cuda, None)));
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL m: forced position 7: logits differ"),
        "{text}"
    );
}

#[test]
fn a_different_forced_top_token_or_a_missing_output_fails() {
    let c = Case::new("forced");
    let mut cuda = lps();
    let t = top(&cuda[3]);
    cuda[3][(t + 2) % VOCAB] = cuda[3][t] + 0.1;
    let (ok, text) = c.compare(Some(output(&lps(), None)), Some(output(&cuda, None)));
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL m: forced position 3: the CUDA's top token"),
        "{text}"
    );
    let (ok, text) = c.compare(Some(output(&lps(), None)), None);
    assert!(!ok, "{text}");
    assert!(text.contains("FAIL m: forced: no CUDA output"), "{text}");
    let (ok, text) = c.compare(None, Some(output(&lps(), None)));
    assert!(!ok, "{text}");
    assert!(text.contains("FAIL m: greedy: no CUDA output"), "{text}");
}
