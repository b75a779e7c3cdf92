//! The passes on the llama-family fixtures: after every pass, the plan run by the reference
//! executor (`ir::plan::exec`) gives the logits the interpreter gives on the graph, bit for
//! bit, for the 32-token prompt as one ubatch of 64 (padded) and one token at a time.
//! Also the plan summary of SmolLM2 when the model is cached.

mod passes_common;

use compiler::passes::{compile, CompileOptions, Module, Pass};
use ir::gguf::GgufFile;
use ir::plan::{KernelOp, Plan};
use passes_common::{graph_logits, max_abs_diff, plan_logits};
use std::path::PathBuf;

const N_CTX: u32 = 256;

/// `shared/` when its fixture models are there, else `None` after a recorded skip.
fn shared_dir() -> Option<PathBuf> {
    modelc_tests::shared("fixtures/models")?;
    Some(modelc_tests::shared_root())
}

fn prompt(shared: &std::path::Path) -> Vec<u32> {
    let s = std::fs::read_to_string(shared.join("fixtures/reference/prompt.json"))
        .expect("prompt.json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("prompt.json parses");
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

/// Compiles `name` for ubatches {1, 64} with every row's logits, and checks the plan after
/// every pass against the interpreter. Returns the final plan.
fn check_fixture(shared: &std::path::Path, name: &str) -> Plan {
    let gguf =
        GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let prompt = prompt(shared);
    let (want_batch, want_step) = graph_logits(&gguf, &model, N_CTX, &prompt);
    let copts = CompileOptions {
        ubatches: vec![1, 64],
        all_logits: true,
        n_ctx: N_CTX,
        ..CompileOptions::default()
    };
    let mut checked = Vec::new();
    let plan = compile(&model, &copts, &mut |pass: &Pass, m: &Module| {
        let Some(plan) = &m.plan else { return };
        let (b, s) = plan_logits(&gguf, plan, &prompt);
        let (db, ds) = (max_abs_diff(&b, &want_batch), max_abs_diff(&s, &want_step));
        eprintln!("{name} after {}: batch {db:e}, step {ds:e}", pass.name);
        assert!(
            b == want_batch,
            "{name}: batch logits changed by pass {} (max diff {db:e})",
            pass.name
        );
        assert!(
            s == want_step,
            "{name}: one-token logits changed by pass {} (max diff {ds:e})",
            pass.name
        );
        checked.push(pass.name);
    })
    .expect("compiles");
    assert_eq!(
        checked.len(),
        compiler::passes::pipeline().len() - 1,
        "every pass after specialize was checked"
    );
    plan
}

/// Compiles `name` and checks only the final plan against the interpreter.
fn check_final(shared: &std::path::Path, name: &str) -> Plan {
    let gguf =
        GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let prompt = prompt(shared);
    let (want_batch, want_step) = graph_logits(&gguf, &model, N_CTX, &prompt);
    let copts = CompileOptions {
        all_logits: true,
        n_ctx: N_CTX,
        ..CompileOptions::default()
    };
    let plan = compile(&model, &copts, &mut |_, _| {}).expect("compiles");
    let (b, s) = plan_logits(&gguf, &plan, &prompt);
    let (db, ds) = (max_abs_diff(&b, &want_batch), max_abs_diff(&s, &want_step));
    eprintln!("{name}: batch {db:e}, step {ds:e}");
    assert!(
        b == want_batch && s == want_step,
        "{name}: plan logits differ (batch {db:e}, step {ds:e})"
    );
    plan
}

/// Kernels of step `n_tokens` whose op `f` accepts.
fn count(plan: &Plan, n_tokens: u32, f: impl Fn(&KernelOp) -> bool) -> usize {
    plan.steps
        .iter()
        .find(|s| s.n_tokens == n_tokens)
        .expect("step")
        .kernels
        .iter()
        .filter(|k| f(&k.op))
        .count()
}

/// What the llama lowering fuses into, per layer: norm+q/k/v, rope+stores, attention, the
/// output projection with the residual (not in the last layer, whose output rows are
/// selected between the two), norm+gate/up+swiglu, down with the residual; then the final
/// norm with the output projection.
fn assert_llama_fusion(plan: &Plan, n_layer: usize) {
    use ir::plan::{Epilogue, MulMatSpec};
    for step in [1, 64] {
        let mm = |norm: bool, n: u8, e: Epilogue| {
            count(
                plan,
                step,
                |op| matches!(op, KernelOp::MulMat(MulMatSpec { norm: no, n_mat, epilogue }) if no.is_some() == norm && *n_mat == n && *epilogue == e),
            )
        };
        assert_eq!(
            mm(true, 3, Epilogue::None),
            n_layer,
            "rms_norm+mul+mul_mat×3"
        );
        assert_eq!(
            mm(true, 2, Epilogue::Swiglu),
            n_layer,
            "rms_norm+mul+mul_mat×2+swiglu"
        );
        assert_eq!(mm(false, 1, Epilogue::Add), 2 * n_layer - 1, "mul_mat+add");
        assert_eq!(mm(true, 1, Epilogue::None), 1, "output norm + projection");
        assert_eq!(
            count(
                plan,
                step,
                |op| matches!(op, KernelOp::RopeKvStore(r) if r.q && r.v)
            ),
            n_layer,
            "rope+kv_store"
        );
        assert_eq!(
            count(plan, step, |op| matches!(
                op,
                KernelOp::Op(ir::graph::Op::Attention(_))
            )),
            n_layer,
            "attention"
        );
        // Left unfused besides attention: the embedding lookup, the last layer's two row
        // selections, its add and its attention output product.
        assert_eq!(
            count(plan, step, |op| !op.is_fused()),
            n_layer + 5,
            "unfused kernels"
        );
    }
}

#[test]
fn llama_sep_f32_every_pass_keeps_logits() {
    let Some(shared) = shared_dir() else { return };
    let plan = check_fixture(&shared, "llama-sep-F32");
    assert_llama_fusion(&plan, 2);
    println!("{}", plan.summary());
}

#[test]
fn llama_sep_q4_0_every_pass_keeps_logits() {
    let Some(shared) = shared_dir() else { return };
    let plan = check_fixture(&shared, "llama-sep-Q4_0");
    assert_llama_fusion(&plan, 2);
}

#[test]
fn llama_tied_q4_k_every_pass_keeps_logits() {
    let Some(shared) = shared_dir() else { return };
    let plan = check_fixture(&shared, "llama-tied-Q4_K");
    assert_llama_fusion(&plan, 2);
    // The tied matrix is one weight, read by the lookup and the output projection.
    assert_eq!(
        plan.weights
            .iter()
            .filter(|w| w.name == "token_embd.weight")
            .count(),
        1
    );
    assert!(plan.weight("output.weight").is_none());
}

#[test]
fn llama_types_final_plan_keeps_logits() {
    let Some(shared) = shared_dir() else { return };
    for name in [
        "llama-sep-F16",
        "llama-sep-BF16",
        "llama-sep-Q8_0",
        "llama-sep-Q4_1",
        "llama-tied-F32",
    ] {
        let plan = check_final(&shared, name);
        assert_llama_fusion(&plan, 2);
    }
}

#[test]
fn other_families_final_plan_keeps_logits() {
    let Some(shared) = shared_dir() else { return };
    for name in ["qwen2-F32", "qwen3-F32", "gemma3-F32", "phi3-F32"] {
        let plan = check_final(&shared, name);
        println!("{name}:\n{}", plan.summary());
    }
}

/// The plan summary of SmolLM2-135M (Q4_1) as `modelc compile` makes it by default:
/// ubatches {1, 64}, one logit row, n_ctx 4096, F16 KV cache.
#[test]
fn smollm2_plan_summary() {
    let Some(path) = modelc_tests::smollm2() else {
        return;
    };
    let gguf = GgufFile::open(&path).expect("SmolLM2 opens");
    let model = compiler::load_model(&gguf).expect("SmolLM2 lowers");
    let t = std::time::Instant::now();
    let mut last = t;
    let plan = compile(&model, &CompileOptions::default(), &mut |p, _| {
        println!("  {:<20} {:.2?}", p.name, last.elapsed());
        last = std::time::Instant::now();
    })
    .expect("compiles");
    let took = t.elapsed();
    let hp = &model.hparams;
    println!(
        "SmolLM2-135M Q4_1, compiled in {took:.2?}:\n{}",
        plan.summary()
    );
    assert_llama_fusion(&plan, hp.n_layer as usize);
    // KV: K and V of every layer, {n_embd_k_gqa, n_ctx} F16.
    let kv = 2 * hp.n_layer as u64 * hp.n_embd_k_gqa() as u64 * 4096 * 2;
    assert_eq!(plan.kv_bytes(), kv);
    // Weights: every tensor of the file is read (the tied output reads token_embd).
    let file: u64 = gguf
        .tensors()
        .iter()
        .map(|t| t.ggml_type.row_size(t.ne[0]).unwrap() * t.ne[1] * t.ne[2] * t.ne[3])
        .sum();
    assert_eq!(plan.weight_bytes(), file);
    println!("plan JSON: {} bytes", plan.to_json().len());
    let all = CompileOptions {
        all_logits: true,
        ..CompileOptions::default()
    };
    let all = compile(&model, &all, &mut |_, _| {}).expect("compiles with every row's logits");
    println!("with every row's logits:\n{}", all.summary());
    // The decode arena holds no more than a few rows of activations and one row of logits.
    let one = plan.step(1, 1).expect("decode step");
    assert!(
        one.arena_bytes < 1 << 20,
        "decode arena {} bytes",
        one.arena_bytes
    );
}
