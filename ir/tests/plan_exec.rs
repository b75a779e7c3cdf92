//! The reference executor on hand-built plans: each fused kernel computes, bit for bit, what
//! the interpreter computes on the same ops unfused; the KV caches persist across steps; an
//! in-place residual works; the printer and the summary say what the plan holds.

mod plan_common;

use ir::graph::{contiguous_nb, DType, Shape};
use ir::interp::{Inputs, Interpreter};
use ir::plan::exec::{PlanExec, StepArgs};
use ir::plan::{Value, ValueId};
use plan_common::*;

#[test]
fn fused_products_equal_their_ops_unfused() {
    let w = ffn_weights();
    let inputs = Inputs {
        tokens: &TOKENS,
        kv_len: 1,
        ..Inputs::default()
    };
    let want = Interpreter::new(&w, opts())
        .run(&ffn_graph(), &inputs)
        .expect("graph runs");
    let args = StepArgs {
        tokens: &TOKENS,
        kv_len: 1,
        ..StepArgs::default()
    };
    for in_place in [false, true] {
        let plan = ffn_plan(in_place);
        let got = PlanExec::new(&plan, &w, opts())
            .expect("executor")
            .run(4, 4, &args)
            .expect("plan runs");
        assert_eq!(got, want, "in_place = {in_place}");
    }
}

#[test]
fn a_product_may_not_overwrite_its_input() {
    // `act` overwritten by the down projection that reads it: not a legal alias.
    let mut plan = ffn_plan(false);
    let s = &mut plan.steps[0];
    let act = s.kernels[2].srcs[0];
    let v = s.value(act).clone();
    s.values.push(Value {
        name: "out".into(),
        shape: Shape::new(&[16, 4]),
        nb: contiguous_nb(DType::F32, &Shape::new(&[16, 4])),
        ..v
    });
    let alias = ValueId(s.values.len() as u32 - 1);
    s.kernels[2].dsts = vec![alias];
    s.outputs = vec![alias];
    let err = plan.verify().expect_err("refused");
    assert!(err.to_string().contains("cannot work in place"), "{err}");
}

#[test]
fn rope_kv_store_and_attention_over_two_steps() {
    let w = kv_weights();
    let g = kv_graph();
    let plan = kv_plan();
    let mut interp = Interpreter::new(&w, opts());
    let mut ex = PlanExec::new(&plan, &w, opts()).expect("executor");
    for (n, toks) in [[3, 9, 0, 7], [1, 2, 5, 8]].iter().enumerate() {
        let pos: Vec<i32> = (0..4).map(|i| (4 * n + i) as i32).collect();
        let kv_len = 4 * (n as u64 + 1);
        let want = interp
            .run(
                &g,
                &Inputs {
                    tokens: toks,
                    positions: &pos,
                    kv_len,
                    ..Inputs::default()
                },
            )
            .expect("graph");
        let got = ex
            .run(
                4,
                4,
                &StepArgs {
                    tokens: toks,
                    positions: &pos,
                    kv_len,
                    ..StepArgs::default()
                },
            )
            .expect("plan");
        assert_eq!(got, want, "step {n}");
    }
    // The caches hold the same rows in both.
    assert_eq!(ex.interpreter().state().get("kc"), interp.state().get("kc"));
    assert!(interp
        .state()
        .get("kc")
        .is_some_and(|c| c.iter().any(|&x| x != 0.0)));
}

#[test]
fn printer_and_summary_describe_the_plan() {
    let plan = ffn_plan(true);
    let text = plan.to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("k1 "))
        .expect("kernel 1 line");
    assert!(
        line.starts_with("k1 rms_norm+mul+mul_mat×2+swiglu act {24, 4} @b"),
        "{line}"
    );
    assert!(
        line.contains("wg F16 {16, 24} W") && line.contains("[eps=1e-5]"),
        "{line}"
    );
    let s = plan.summary();
    assert_eq!(
        (s.steps[0].kernels, s.steps[0].fused_kernels, s.weights),
        (3, 2, 5)
    );
    assert_eq!(s.weight_bytes, 160 * 4 + 16 * 4 + 3 * 16 * 24 * 2);
    assert_eq!(s.kv_bytes, 0);
    let kv = kv_plan().summary();
    assert_eq!(kv.kv_bytes, 2 * 16 * 16 * 2);
}
