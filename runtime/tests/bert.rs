//! The `bert` encoder against llama.cpp on the random-weight fixtures of
//! `runtime::synth_bert` (written at test time, checked against the sha256 recorded with
//! llama.cpp's answers in `tests/data/bert_llama_cpp.json`, made by `scripts/bert-reference`
//! with an x86-64 AVX2 build of llama.cpp):
//!
//! - embeddings: `modelc embed`'s text (the same engine, pooling, normalisation and
//!   formatting) against `llama-embedding`'s stdout: byte for byte with Q8_0 weights; with
//!   F32 weights (whose products differ from llama.cpp's in the last bits of a few values),
//!   a cosine of at least 0.99999 per printed vector;
//! - reranking: the scores of `/rerank`'s sequences through the classification head against
//!   llama-server's: equal with Q8_0 weights, within 1e-5 (relative) with F32.

use compiler::GraphOutput;
use ir::ggml::GgmlType;
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;
use runtime::synth_bert::BertFixture;
use std::path::PathBuf;

/// Writes the fixture to a fresh temporary file (one per call: the tests run at once and
/// must not read a file another is writing).
fn fixture(weight_type: GgmlType, rerank: bool) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("modelc-bert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("bert-{weight_type}-{rerank}-{call}.gguf"));
    BertFixture {
        weight_type,
        rerank,
        seed: 0,
    }
    .write(&path)
    .expect("fixture written");
    path
}

/// The CPU engine's hidden states equal the interpreter's (llama.cpp's operation order),
/// bit for bit, with the input padded to a larger step (the padding must stay invisible to
/// the non-causal attention).
#[test]
fn hidden_states_equal_the_interpreter() {
    use runtime::interp_engine::InterpEngine;
    let path = fixture(GgmlType::F32, false);
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("bert lowers");
    assert_eq!(model.output(), GraphOutput::Embeddings);
    let prompt: Vec<u32> = vec![101, 110, 102];
    let plan = build_plan(&model, &[1, 4], 64, KvTypes::F16, LogitRows::All).expect("plan");
    let mut cpu =
        Session::single(CpuEngine::new(&gguf, plan, 2).expect("engine")).expect("session");
    let mut interp = Session::single(InterpEngine::new(
        &gguf,
        &model,
        64,
        prompt.len(),
        KvTypes::F16,
        ir::interp::InterpOptions::llama_cpp(),
    ))
    .expect("session");
    let c = cpu.decode(&prompt, 0, true).expect("cpu").to_vec();
    let i = interp.decode(&prompt, 0, true).expect("interp").to_vec();
    assert_eq!(c.len(), prompt.len() * 64);
    let differ = c
        .iter()
        .zip(&i)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{differ} of {} values differ: {:?} vs {:?}",
        c.len(),
        &c[..4],
        &i[..4]
    );
}

fn reference() -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/bert_llama_cpp.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference data")).expect("json")
}

/// The fixture of a reference case, checked to be the file llama.cpp read.
fn case_fixture(case: &serde_json::Value, rerank: bool) -> PathBuf {
    let ty = match case["type"].as_str().expect("type") {
        "F32" => GgmlType::F32,
        "Q8_0" => GgmlType::Q8_0,
        other => panic!("type {other}"),
    };
    let path = fixture(ty, rerank);
    let bytes = std::fs::read(&path).expect("fixture");
    let sha = sha256_hex(&bytes);
    assert_eq!(
        sha,
        case["sha256"].as_str().expect("sha256"),
        "the fixture changed: rerun scripts/bert-reference"
    );
    path
}

fn sha256_hex(bytes: &[u8]) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(bytes)?;
            c.wait_with_output()
        })
        .expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// An embedder over the CPU engine for the fixture at `path`, as `modelc embed` opens one.
fn with_embedder<R>(
    path: &std::path::Path,
    pooling: Option<runtime::embed::Pooling>,
    f: impl FnOnce(&mut runtime::embed::Embedder<'_>, &runtime::tokenizer::Vocab) -> R,
) -> R {
    let gguf = GgufFile::open(path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("bert lowers");
    let vocab = runtime::tokenizer::Vocab::from_gguf(&gguf).expect("vocab");
    let pooling = runtime::embed::Pooling::resolve(pooling, &gguf).expect("pooling");
    // What `modelc embed` compiles for a non-causal model of 128 positions.
    let ub = [1, 2, 4, 8, 16, 32, 64, 128];
    let plan = build_plan(&model, &ub, 128, KvTypes::F16, LogitRows::All).expect("plan");
    let session =
        Session::single(CpuEngine::new(&gguf, plan, 2).expect("engine")).expect("session");
    let mut e = runtime::embed::Embedder::open(session, pooling, &gguf).expect("embedder");
    f(&mut e, &vocab)
}

/// The numbers of `llama-embedding`'s text, one vector per `embedding N:` line.
fn printed_vectors(s: &str) -> Vec<Vec<f32>> {
    s.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(_, v)| {
            v.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .collect()
}

#[test]
fn embeddings_equal_llama_embedding() {
    use runtime::embed::Pooling;
    let data = reference();
    let cases = data["embeddings"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let path = case_fixture(case, false);
        let prompt = case["prompt"].as_str().expect("prompt");
        let pooling = case["pooling"]
            .as_str()
            .map(|p| Pooling::from_name(p).expect("pooling"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_modelc"));
        cmd.arg("embed").arg(&path).args(["-p", prompt, "-t", "2"]);
        if let Some(p) = pooling {
            cmd.args(["--pooling", p.name()]);
        }
        let out = cmd.output().expect("modelc embed runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = String::from_utf8(out.stdout).expect("utf-8");
        let theirs = case["stdout"].as_str().expect("stdout");
        let what = format!("{} {prompt:?} {:?}", case["type"], case["pooling"]);
        if case["type"] == "Q8_0" {
            assert_eq!(ours, theirs, "{what}");
        } else {
            let (a, b) = (printed_vectors(&ours), printed_vectors(theirs));
            assert_eq!(a.len(), b.len(), "{what}");
            for (x, y) in a.iter().zip(&b) {
                let c = runtime::embed::cosine(x, y);
                assert!(c >= 0.99999, "{what}: cosine {c}");
            }
        }
    }
}

#[test]
fn rerank_scores_equal_llama_server() {
    let data = reference();
    let cases = data["rerank"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let path = case_fixture(case, true);
        let query = case["query"].as_str().expect("query");
        let docs: Vec<&str> = case["documents"]
            .as_array()
            .expect("documents")
            .iter()
            .map(|d| d.as_str().expect("a document"))
            .collect();
        let scores: Vec<f32> = with_embedder(&path, None, |e, vocab| {
            assert_eq!(
                e.pooling(),
                runtime::embed::Pooling::Rank,
                "the fixture's pooling_type"
            );
            docs.iter()
                .map(|d| {
                    let t = runtime::server::api::rerank::rerank_tokens(vocab, query, d);
                    e.embed(&t).expect("scores")[0][0]
                })
                .collect()
        });
        for r in case["response"]["results"].as_array().expect("results") {
            let i = r["index"].as_u64().expect("index") as usize;
            let want = r["relevance_score"].as_f64().expect("score") as f32;
            if case["type"] == "Q8_0" {
                assert_eq!(
                    scores[i].to_bits(),
                    want.to_bits(),
                    "document {i}: {} vs {want}",
                    scores[i]
                );
            } else {
                assert!(
                    (scores[i] - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "document {i}: {} vs {want}",
                    scores[i]
                );
            }
        }
    }
}
