//! Each pass on its own, on a tiny llama made in memory (no shared files needed): what it
//! fuses, what it must leave alone, and that the plan still computes the graph's logits bit
//! for bit (reference executor against the interpreter).

mod passes_common;

use compiler::passes::{compile, pass_names, pipeline, CompileOptions, Module, PassCtx, PassError};
use ir::ggml::GgmlType;
use ir::gguf::GgufFile;
use ir::graph::{DType, Graph, Op};
use ir::interp::{GraphRequest, GraphSource};
use ir::plan::{Base, Epilogue, KernelOp, MulMatSpec, Plan};
use passes_common::{graph_logits, plan_logits, tiny_llama, tiny_prompt};

const N_CTX: u32 = 64;

fn copts() -> CompileOptions {
    CompileOptions {
        ubatches: vec![1, 32],
        all_logits: true,
        n_ctx: N_CTX,
        ..CompileOptions::default()
    }
}

/// Runs `specialize`, `kernelize` and then only the passes named in `only`.
fn run_passes(source: &dyn GraphSource, only: &[&str]) -> Plan {
    let opts = copts();
    let cx = PassCtx {
        source,
        opts: &opts,
    };
    let mut m = Module::default();
    for p in pipeline() {
        if p.name == "specialize" || p.name == "kernelize" || only.contains(&p.name) {
            (p.run)(&mut m, &cx).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            if let Some(plan) = &m.plan {
                plan.verify()
                    .unwrap_or_else(|e| panic!("after {}: {e}", p.name));
            }
        }
    }
    m.plan.expect("a plan")
}

fn ops(plan: &Plan, n_tokens: u32) -> Vec<KernelOp> {
    plan.steps
        .iter()
        .find(|s| s.n_tokens == n_tokens)
        .expect("step")
        .kernels
        .iter()
        .map(|k| k.op.clone())
        .collect()
}

fn n_of(plan: &Plan, f: impl Fn(&KernelOp) -> bool) -> usize {
    ops(plan, 32).iter().filter(|o| f(o)).count()
}

fn is_mm(op: &KernelOp, norm: bool, n: u8, e: Epilogue) -> bool {
    matches!(op, KernelOp::MulMat(MulMatSpec { norm: x, n_mat, epilogue }) if x.is_some() == norm && *n_mat == n && *epilogue == e)
}

/// Asserts the plan computes what the interpreter computes on the graphs, bit for bit.
fn assert_same_logits(gguf: &GgufFile, source: &dyn GraphSource, plan: &Plan, what: &str) {
    let prompt = tiny_prompt();
    let want = graph_logits(gguf, source, N_CTX, &prompt);
    let got = plan_logits(gguf, plan, &prompt);
    assert!(
        got.0 == want.0,
        "{what}: batch logits differ by {:e}",
        passes_common::max_abs_diff(&got.0, &want.0)
    );
    assert!(
        got.1 == want.1,
        "{what}: one-token logits differ by {:e}",
        passes_common::max_abs_diff(&got.1, &want.1)
    );
}

#[test]
fn pipeline_lists_the_passes_in_order() {
    assert_eq!(
        pass_names(),
        [
            "specialize",
            "kernelize",
            "fuse-rms-norm-mul",
            "fuse-siblings",
            "fuse-norm-mul-mat",
            "fuse-glu",
            "fuse-residual-add",
            "fuse-rope-kv-store",
            "plan-memory"
        ]
    );
}

#[test]
fn each_fusion_alone_fuses_its_pattern_and_keeps_logits() {
    let gguf = tiny_llama(3, false, GgmlType::F16);
    let model = compiler::load_model(&gguf).expect("lowers");
    let n = 3;
    let base = run_passes(&model, &[]);
    let n_base = ops(&base, 32).len();
    assert!(
        ops(&base, 32).iter().all(|o| !o.is_fused()),
        "kernelize fuses nothing"
    );
    assert_same_logits(&gguf, &model, &base, "kernelize");

    let p = run_passes(&model, &["fuse-rms-norm-mul"]);
    // attn_norm and ffn_norm of each layer, and the output norm.
    assert_eq!(
        n_of(&p, |o| matches!(o, KernelOp::RmsNormMul { .. })),
        2 * n + 1
    );
    assert_eq!(
        n_of(&p, |o| matches!(o, KernelOp::Op(Op::RmsNorm { .. }))),
        0
    );
    assert_eq!(ops(&p, 32).len(), n_base - (2 * n + 1));
    assert_same_logits(&gguf, &model, &p, "fuse-rms-norm-mul");

    let p = run_passes(&model, &["fuse-siblings"]);
    assert_eq!(n_of(&p, |o| is_mm(o, false, 3, Epilogue::None)), n);
    assert_eq!(n_of(&p, |o| is_mm(o, false, 2, Epilogue::None)), n);
    assert_same_logits(&gguf, &model, &p, "fuse-siblings");

    // Needs fuse-rms-norm-mul and fuse-siblings before it: alone it finds nothing.
    assert_eq!(
        ops(&run_passes(&model, &["fuse-norm-mul-mat"]), 32).len(),
        n_base
    );
    assert_eq!(ops(&run_passes(&model, &["fuse-glu"]), 32).len(), n_base);

    let p = run_passes(&model, &["fuse-rms-norm-mul", "fuse-norm-mul-mat"]);
    // Without sibling fusion, each of q, k, v (and gate, up) takes the norm as its prologue.
    assert_eq!(n_of(&p, |o| is_mm(o, true, 1, Epilogue::None)), 5 * n + 1);
    assert_same_logits(&gguf, &model, &p, "fuse-norm-mul-mat");

    let p = run_passes(&model, &["fuse-siblings", "fuse-glu"]);
    assert_eq!(n_of(&p, |o| is_mm(o, false, 2, Epilogue::Swiglu)), n);
    assert_eq!(n_of(&p, |o| matches!(o, KernelOp::Op(Op::Swiglu))), 0);
    assert_same_logits(&gguf, &model, &p, "fuse-glu");

    let p = run_passes(&model, &["fuse-residual-add"]);
    // attn_output and ffn_down of every layer but the last, whose attention output rows are
    // selected (get_rows) before the add.
    assert_eq!(n_of(&p, |o| is_mm(o, false, 1, Epilogue::Add)), 2 * n - 1);
    assert_same_logits(&gguf, &model, &p, "fuse-residual-add");

    let p = run_passes(&model, &["fuse-rope-kv-store"]);
    // Without sibling fusion Q's rope is found through the attention that reads the cache.
    assert_eq!(
        n_of(&p, |o| matches!(o, KernelOp::RopeKvStore(r) if r.q && r.v)),
        n
    );
    assert_eq!(
        n_of(&p, |o| matches!(o, KernelOp::Op(Op::Rope(_) | Op::KvStore))),
        0
    );
    assert_same_logits(&gguf, &model, &p, "fuse-rope-kv-store");
}

#[test]
fn full_pipeline_on_a_tied_model() {
    let gguf = tiny_llama(2, true, GgmlType::F32);
    let model = compiler::load_model(&gguf).expect("lowers");
    let plan = compile(&model, &copts(), &mut |_, _| {}).expect("compiles");
    for step in &plan.steps {
        let names: Vec<String> = step.kernels.iter().map(|k| k.op.name()).collect();
        assert_eq!(
            names,
            [
                "get_rows",
                "rms_norm+mul+mul_mat×3",
                "rope+kv_store+rope_q+kv_store_v",
                "attention",
                "mul_mat+add",
                "rms_norm+mul+mul_mat×2+swiglu",
                "mul_mat+add",
                "rms_norm+mul+mul_mat×3",
                "rope+kv_store+rope_q+kv_store_v",
                "attention",
                "mul_mat",
                "get_rows",
                "get_rows",
                "add",
                "rms_norm+mul+mul_mat×2+swiglu",
                "mul_mat+add",
                "rms_norm+mul+mul_mat",
            ],
            "step {}",
            step.n_tokens
        );
    }
    assert_same_logits(&gguf, &model, &plan, "pipeline");
    // The tied matrix is one weight, read by the lookup and the output projection.
    let emb = plan.weight("token_embd.weight").expect("token_embd");
    let s = plan.step(1, 1).expect("step");
    let readers = s
        .kernels
        .iter()
        .filter(|k| k.srcs.iter().any(|v| s.value(*v).base == Base::Weight(emb)))
        .count();
    assert_eq!(readers, 2);
}

/// The tiny model's graphs with extra outputs: intermediates that another consumer reads.
struct ExtraOutputs<'a> {
    model: &'a compiler::Model,
    names: &'a [&'a str],
}

impl GraphSource for ExtraOutputs<'_> {
    fn build_graph(&self, req: &GraphRequest) -> Result<Graph, String> {
        let mut g = self.model.build_graph(req).map_err(|e| e.to_string())?;
        for n in self.names {
            let t = g.find(n).ok_or_else(|| format!("no tensor {n}"))?;
            g.mark_output(t);
        }
        Ok(g)
    }
}

#[test]
fn an_intermediate_someone_else_reads_is_not_fused_away() {
    let gguf = tiny_llama(2, false, GgmlType::F32);
    let model = compiler::load_model(&gguf).expect("lowers");
    // The bare norm of layer 0, the normed input of layer 1, Q of layer 0 and the gate of
    // layer 1 are step outputs: their producers must stay.
    let src = ExtraOutputs {
        model: &model,
        names: &["norm-attn_norm-0", "attn_norm-1", "Qcur-0", "ffn_gate-1"],
    };
    let plan = compile(&src, &copts(), &mut |_, _| {}).expect("compiles");
    let s = plan.step(32, 32).expect("step");
    let op_of = |name: &str| -> KernelOp {
        s.kernels
            .iter()
            .find(|k| k.dsts.iter().any(|d| s.value(*d).name == name))
            .map(|k| k.op.clone())
            .unwrap_or_else(|| panic!("no kernel writes {name}"))
    };
    assert_eq!(
        op_of("norm-attn_norm-0"),
        KernelOp::Op(Op::RmsNorm { eps: 1e-5 })
    );
    assert_eq!(op_of("attn_norm-1"), KernelOp::RmsNormMul { eps: 1e-5 });
    // Q of layer 0 still comes out of the q/k/v product, which keeps its results; the gate
    // of layer 1 keeps gate/up from taking the swiglu.
    assert!(is_mm(&op_of("Qcur-0"), false, 3, Epilogue::None));
    assert!(is_mm(&op_of("ffn_gate-1"), true, 2, Epilogue::None));
    assert_eq!(s.outputs.len(), 5);
    assert_same_logits(&gguf, &src, &plan, "extra outputs");
}

#[test]
fn memory_plan_shares_the_arena_and_reuses_in_place() {
    let gguf = tiny_llama(3, false, GgmlType::F32);
    let model = compiler::load_model(&gguf).expect("lowers");
    let plan = compile(&model, &copts(), &mut |_, _| {}).expect("compiles");
    for s in &plan.steps {
        let total: u64 = s.buffers.iter().map(|b| b.bytes).sum();
        assert!(
            s.arena_bytes < total,
            "step {}: arena {} ≥ sum of buffers {total}",
            s.n_tokens,
            s.arena_bytes
        );
        assert_eq!(s.arena_bytes % plan.align, 0);
        // The residual stream: the embedding, each layer's ffn_inp and l_out (but the last
        // layer's, whose rows are selected) are one buffer, updated in place.
        let base_of = |name: &str| {
            s.values
                .iter()
                .find(|v| v.name == name)
                .map(|v| v.base)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let stream = base_of("inp_embd");
        for name in ["ffn_inp-0", "l_out-0", "ffn_inp-1", "l_out-1"] {
            assert_eq!(
                base_of(name),
                stream,
                "{name} is not in the residual buffer"
            );
        }
    }
    assert_same_logits(&gguf, &model, &plan, "planned");

    // Two buffers alive at once must not share bytes: the verifier catches a plan that puts
    // every buffer at offset 0.
    let mut bad = plan.clone();
    for b in &mut bad.steps[1].buffers {
        b.offset = Some(0);
    }
    let err = bad.verify().expect_err("overlapping buffers verify");
    assert!(err.to_string().contains("overlap"), "{err}");
}

#[test]
fn plan_json_round_trips_and_runs_the_same() {
    let gguf = tiny_llama(2, false, GgmlType::F16);
    let model = compiler::load_model(&gguf).expect("lowers");
    let plan = compile(&model, &copts(), &mut |_, _| {}).expect("compiles");
    let json = plan.to_json();
    let back = Plan::from_json(&json).expect("reads back");
    assert_eq!(back, plan);
    assert_same_logits(&gguf, &model, &back, "from JSON");
    // A plan with a kernel whose operands no longer fit is refused on reading (in the
    // 32-token step, where the input {64, 32} and the norm weight {64} differ in shape).
    let mut broken = plan.clone();
    let s = &mut broken.steps[1];
    let k = s
        .kernels
        .iter()
        .position(|k| matches!(k.op, KernelOp::MulMat(_)))
        .expect("a product");
    s.kernels[k].srcs.swap(0, 1);
    assert!(Plan::from_json(&broken.to_json()).is_err());
}

#[test]
fn specialize_checks_its_options() {
    let gguf = tiny_llama(1, false, GgmlType::F32);
    let model = compiler::load_model(&gguf).expect("lowers");
    let bad = |o: CompileOptions| compile(&model, &o, &mut |_, _| {}).expect_err("refused");
    assert!(matches!(
        bad(CompileOptions {
            ubatches: vec![],
            ..copts()
        }),
        PassError::Options(_)
    ));
    assert!(matches!(
        bad(CompileOptions {
            ubatches: vec![0, 8],
            ..copts()
        }),
        PassError::Options(_)
    ));
    assert!(matches!(
        bad(CompileOptions {
            ubatches: vec![128],
            ..copts()
        }),
        PassError::Options(_)
    ));
    assert!(matches!(
        bad(CompileOptions {
            kv_types: ir::graph::KvTypes::same(DType::BF16),
            ..copts()
        }),
        PassError::Options(_)
    ));
    // Sizes are sorted and deduplicated; one logit row per step unless all_logits.
    let plan = compile(
        &model,
        &CompileOptions {
            ubatches: vec![16, 1, 16],
            all_logits: false,
            ..copts()
        },
        &mut |_, _| {},
    )
    .expect("compiles");
    let shapes: Vec<(u32, u32)> = plan
        .steps
        .iter()
        .map(|s| (s.n_tokens, s.n_outputs))
        .collect();
    assert_eq!(shapes, [(1, 1), (16, 1)]);
}

#[test]
fn dump_after_sees_every_pass() {
    let gguf = tiny_llama(1, false, GgmlType::F32);
    let model = compiler::load_model(&gguf).expect("lowers");
    let mut dumps = Vec::new();
    compile(&model, &copts(), &mut |p, m| {
        dumps.push((p.name, m.to_string()))
    })
    .expect("compiles");
    assert_eq!(dumps.len(), pipeline().len());
    assert!(
        dumps[0].1.contains("graph n_tokens=1 n_outputs=1\n"),
        "specialize dumps the graphs"
    );
    assert!(
        dumps[1].1.contains("(not planned)"),
        "kernelize dumps an unplanned plan"
    );
    let last = &dumps.last().expect("plan-memory").1;
    assert!(
        last.contains("rms_norm+mul+mul_mat×3") && last.contains("@A+"),
        "{last}"
    );
}

#[test]
fn one_logit_row_of_a_padded_prompt() {
    use ir::interp::{Outputs, Session, SessionOptions};
    use ir::plan::exec::{PlanExec, StepArgs};
    let gguf = tiny_llama(2, false, GgmlType::F16);
    let model = compiler::load_model(&gguf).expect("lowers");
    let plan = compile(
        &model,
        &CompileOptions {
            all_logits: false,
            ..copts()
        },
        &mut |_, _| {},
    )
    .expect("compiles");
    let prompt = tiny_prompt();
    let so = SessionOptions {
        n_ctx: N_CTX,
        interp: passes_common::opts(),
        ..SessionOptions::default()
    };
    let mut s = Session::new(&gguf, &model, so);
    let want = s.eval(&prompt, 0, &Outputs::Last).expect("eval").values;
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let c = ir::plan::schedule::chunks(&[1, 32], 0, 20, N_CTX).expect("schedule");
    assert_eq!(c.len(), 1, "20 tokens run as one padded step of 32");
    let c = c[0];
    let mut ex = PlanExec::new(&plan, &gguf, passes_common::opts()).expect("executor");
    let (t, p) = (c.tokens(&toks), c.positions());
    let args = StepArgs {
        tokens: &t,
        positions: &p,
        output_ids: &[c.last_row()],
        kv_len: c.kv_len(),
    };
    let got = ex.run(32, 1, &args).expect("step").remove(0);
    assert!(
        got == want,
        "last-row logits differ by {:e}",
        passes_common::max_abs_diff(&got, &want)
    );
}
