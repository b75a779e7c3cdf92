//! The text forms on a real model: SmolLM2-135M compiled for every ubatch size `modelc
//! compile` builds by default (1, 8, 16, 32, 64). After every pass the printed module parses
//! back into an equal module and prints the same text again; so do the graphs `modelc graph`
//! prints. Also a small module read from text, run through one pass by name.

use compiler::passes::{compile, run_pass, CompileOptions, FixedGraphs, Module, PassCtx};
use ir::graph::KvTypes;

/// `runtime/src/cli/compile.rs`'s `--ubatch` default.
const UBATCHES: [u32; 5] = [1, 8, 16, 32, 64];

/// Print → parse → equal → print gives the same text.
fn assert_module_round_trips(m: &Module, what: &str) {
    let text = m.to_string();
    let back = Module::parse(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
    if m.plan.is_some() {
        assert_eq!(back.plan, m.plan, "{what}: plan");
        assert!(back.graphs.is_empty());
    } else {
        assert_eq!(back.graphs, m.graphs, "{what}: graphs");
    }
    assert!(back.to_string() == text, "{what}: printed again differs");
}

#[test]
fn smollm2_module_round_trips_after_every_pass_at_every_ubatch() {
    let Some(path) = modelc_tests::smollm2() else {
        return;
    };
    let gguf = ir::gguf::GgufFile::open(&path).expect("SmolLM2 opens");
    let model = compiler::load_model(&gguf).expect("SmolLM2 lowers");
    for (all_logits, kv_types) in [
        (false, KvTypes::F16),
        (
            true,
            KvTypes::same(ir::graph::DType::Block(ir::ggml::GgmlType::Q8_0)),
        ),
    ] {
        let opts = CompileOptions {
            ubatches: UBATCHES.to_vec(),
            all_logits,
            n_ctx: 4096,
            kv_types,
            ..CompileOptions::default()
        };
        let mut passes = Vec::new();
        let plan = compile(&model, &opts, &mut |p, m| {
            assert_module_round_trips(m, &format!("after {} (all_logits {all_logits})", p.name));
            passes.push(p.name);
        })
        .expect("compiles");
        assert_eq!(passes, compiler::passes::pass_names());
        assert_eq!(plan.ubatch_sizes(), UBATCHES);
        // Each step alone, as a plan of one ubatch size.
        for s in &plan.steps {
            let one = ir::plan::Plan {
                steps: vec![s.clone()],
                ..plan.clone()
            };
            let text = one.to_string();
            let back = ir::plan::parse_plan(&text).expect("step parses");
            assert_eq!(back, one, "ubatch {}", s.n_tokens);
            assert_eq!(back.to_string(), text);
        }
    }
}

#[test]
fn smollm2_graphs_as_modelc_graph_prints_them_round_trip() {
    let Some(path) = modelc_tests::smollm2() else {
        return;
    };
    let gguf = ir::gguf::GgufFile::open(&path).expect("SmolLM2 opens");
    let model = compiler::load_model(&gguf).expect("SmolLM2 lowers");
    for n in UBATCHES {
        let g = model
            .build_graph(&ir::interp::GraphRequest {
                n_tokens: n,
                n_outputs: n,
                n_ctx: 4096,
                kv_types: KvTypes::F16,
            })
            .expect("graph");
        let text = g.to_string();
        let back: ir::graph::Graph = text.parse().unwrap_or_else(|e| panic!("ubatch {n}: {e}"));
        assert_eq!(back, g, "ubatch {n}");
        assert_eq!(back.to_string(), text);
    }
}

#[test]
fn one_pass_runs_on_a_module_read_from_text() {
    let text = "\
; after specialize
graph n_tokens=2 n_outputs=2
input inp_tokens: I32 {2} tokens
input token_embd.weight: F32 {4, 10} weight
inp_embd = (F32) get_rows(token_embd.weight {4, 10}, inp_tokens {2}) = {4, 2}
input output.weight: F32 {4, 10} weight
result_output = (F32) mul_mat(output.weight, inp_embd) = {10, 2}
outputs: result_output
";
    let mut m = Module::parse(text).expect("parses");
    assert_eq!(m.graphs.len(), 1);
    assert_module_round_trips(&m, "input");
    let opts = CompileOptions {
        ubatches: vec![2],
        all_logits: true,
        n_ctx: 8,
        ..CompileOptions::default()
    };
    let source = FixedGraphs(m.graphs.clone());
    let cx = PassCtx {
        source: &source,
        opts: &opts,
    };
    run_pass("specialize", &mut m, &cx).expect("specialize");
    run_pass("kernelize", &mut m, &cx).expect("kernelize");
    let plan = m.plan.clone().expect("a plan");
    assert_eq!(plan.steps[0].kernels.len(), 2);
    assert_module_round_trips(&m, "kernelized");
    let e = run_pass("fuse-everything", &mut m, &cx).expect_err("no such pass");
    assert!(
        e.to_string().contains("passes: specialize, kernelize"),
        "{e}"
    );
    // Errors keep the line numbers of the whole text.
    let bad = text.replace("get_rows(", "get_row(");
    let e = Module::parse(&bad).expect_err("unknown op");
    assert_eq!((e.line, e.col), (5, 18), "{e}");
    let e = Module::parse("input x: F32 {1} data\n").expect_err("no header");
    assert!(
        e.to_string()
            .contains("expected `graph n_tokens=N n_outputs=M`"),
        "{e}"
    );
    let e = Module::parse("graph n_tokens=2 n_outputs=x\n").expect_err("bad header");
    assert_eq!((e.line, e.col), (1, 18), "{e}");
    assert_eq!(Module::parse("; nothing\n\n"), Ok(Module::default()));
}
