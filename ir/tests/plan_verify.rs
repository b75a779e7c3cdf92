//! The plan verifier, liveness and the serialized form: each rule is broken once on a
//! hand-built plan and the error says what is wrong.

mod plan_common;

use ir::graph::{DType, Input, Op, Shape};
use ir::plan::liveness::{liveness, Live};
use ir::plan::{Base, KernelOp, Plan, PlanError, ValueId};
use plan_common::*;

fn refused(plan: &Plan, needle: &str) {
    let err = plan.verify().expect_err("the plan must not verify");
    assert!(
        err.to_string().contains(needle),
        "expected {needle:?} in: {err}"
    );
}

#[test]
fn hand_built_plans_verify() {
    ffn_plan(false).verify().expect("ffn");
    ffn_plan(true).verify().expect("ffn in place");
    kv_plan().verify().expect("kv");
}

#[test]
fn kernel_operands_are_typed_by_the_expansion() {
    let mut p = ffn_plan(false);
    // gate/up + swiglu with the weights of the down projection: K = 24 ≠ 16.
    p.steps[0].kernels[1].srcs[2] = p.steps[0].kernels[2].srcs[1];
    refused(&p, "mul_mat");
    let mut p = ffn_plan(false);
    p.steps[0].kernels[1].dsts.push(ValueId(0));
    refused(&p, "takes 4..=4 sources and 1 results");
}

#[test]
fn reads_before_writes_are_refused() {
    let mut p = ffn_plan(false);
    p.steps[0].kernels.swap(0, 1);
    refused(&p, "reads x before anything writes it");
}

#[test]
fn weights_and_caches_are_written_only_by_stores() {
    let mut p = ffn_plan(false);
    p.weights.push(ir::plan::WeightBuf {
        name: "w_out".into(),
        dtype: DType::F32,
        shape: Shape::new(&[16, 4]),
    });
    let s = &mut p.steps[0];
    let mut v = s.value(s.kernels[2].dsts[0]).clone();
    v.base = Base::Weight(ir::plan::WeightId(5));
    s.values.push(v);
    s.kernels[2].dsts = vec![ValueId(s.values.len() as u32 - 1)];
    refused(&p, "writes weight out");
    let mut p = kv_plan();
    let s = &mut p.steps[0];
    // A copy of the V cache into the K cache: well typed, but not a store.
    let (kc, vc) = (s.kernels[3].dsts[0], s.kernels[3].dsts[2]);
    let mut copy = s.kernels[4].clone();
    copy.op = KernelOp::Op(Op::Cont);
    copy.srcs = vec![vc];
    copy.dsts = vec![kc];
    s.kernels.push(copy);
    refused(&p, "writes KV cache kc but is no KV store");
}

#[test]
fn values_stay_inside_their_base() {
    let mut p = ffn_plan(false);
    let s = &mut p.steps[0];
    let x = s.kernels[0].dsts[0];
    s.values[x.index()].offset = 64;
    refused(&p, "reaches past its base");
}

#[test]
fn planned_offsets_are_aligned_inside_and_disjoint_while_live() {
    // Buffers: tokens, pos, qin, kin, vin, qr, att. kin is written by kernel 1 while qin
    // (written by kernel 0, read by kernel 3) is live: they must not share bytes.
    let mut p = kv_plan();
    let set = |p: &mut Plan, offs: [u64; 7], arena: u64| {
        for (b, o) in p.steps[0].buffers.iter_mut().zip(offs) {
            b.offset = Some(o);
        }
        p.steps[0].arena_bytes = arena;
    };
    set(&mut p, [0, 64, 128, 128, 640, 896, 1408], 1920);
    refused(&p, "qin (bytes 128..640, live 1..=4) and kin (bytes 128..384, live 2..=4) overlap while both are live");
    set(&mut p, [0, 64, 128, 640, 896, 1152, 1664], 2176);
    p.verify().expect("disjoint");
    // tokens (read last by kernel 0) and att (written by kernel 4) may share bytes.
    set(&mut p, [1664, 64, 128, 640, 896, 1152, 1664], 2176);
    p.verify().expect("tokens and att never live together");
    p.steps[0].buffers[2].offset = Some(132);
    refused(&p, "misaligned or outside the arena");
    p.steps[0].buffers[2].offset = Some(128);
    p.steps[0].arena_bytes = 2000;
    refused(&p, "misaligned or outside the arena");
    p.steps[0].arena_bytes = 2176;
    p.steps[0].buffers[3].offset = None;
    refused(&p, "6 of 7 buffers have offsets");
}

#[test]
fn liveness_counts_slots_from_inputs_to_outputs() {
    let p = ffn_plan(false);
    let live = liveness(&p.steps[0]);
    // tokens: input, read by k0; x: written by k0, read by k1 and k2; act: k1..k2; out:
    // written by k2, read after the last kernel.
    assert_eq!(
        live,
        vec![
            Some(Live { first: 0, last: 1 }),
            Some(Live { first: 1, last: 3 }),
            Some(Live { first: 2, last: 3 }),
            Some(Live { first: 3, last: 4 }),
        ]
    );
    assert!(!live[0].unwrap().overlaps(&live[2].unwrap()));
    assert!(live[1].unwrap().overlaps(&live[3].unwrap()));
}

#[test]
fn inputs_have_their_kinds_and_lengths() {
    let mut p = ffn_plan(false);
    p.steps[0].inputs[0].kind = Input::Weight;
    refused(&p, "cannot be a step input");
    let mut p = ffn_plan(false);
    p.steps[0].n_tokens = 5;
    refused(&p, "must be I32 {5}");
}

#[test]
fn shared_tables_and_step_order() {
    let mut p = kv_plan();
    p.kv[1].shape = Shape::new(&[16, 8]);
    refused(&p, "n_ctx = 16");
    let mut p = kv_plan();
    p.kv[1].kind = p.kv[0].kind;
    refused(&p, "appears twice");
    let mut p = ffn_plan(false);
    p.steps.push(p.steps[0].clone());
    refused(&p, "increasing (n_tokens, n_outputs)");
    let mut p = ffn_plan(false);
    p.align = 48;
    refused(&p, "not a power of two");
}

#[test]
fn json_round_trip_and_refusals() {
    let p = kv_plan();
    let back = Plan::from_json(&p.to_json()).expect("reads back");
    assert_eq!(back, p);
    let mut other = p.clone();
    other.format += 1;
    assert!(
        matches!(Plan::from_json(&other.to_json()), Err(PlanError::Serde(m)) if m.contains("format"))
    );
    assert!(matches!(
        Plan::from_json("{\"format\": 1"),
        Err(PlanError::Serde(_))
    ));
    // Ids out of range in a file are errors, not panics.
    let mut bad = p.clone();
    bad.steps[0].kernels[0].srcs[0] = ValueId(999);
    assert!(matches!(
        Plan::from_json(&bad.to_json()),
        Err(PlanError::Invalid { .. })
    ));
    let mut bad = p.clone();
    bad.steps[0].values[0].base = Base::Weight(ir::plan::WeightId(77));
    assert!(matches!(
        Plan::from_json(&bad.to_json()),
        Err(PlanError::Invalid { .. })
    ));
    // A target annotation is carried along and printed, and changes nothing else.
    let mut annotated = p.clone();
    annotated.steps[0].kernels[4].target = Some(serde_json::json!({"threads": 2}));
    let back = Plan::from_json(&annotated.to_json()).expect("annotated");
    assert_eq!(
        back.steps[0].kernels[4].target,
        annotated.steps[0].kernels[4].target
    );
    assert!(back.to_string().contains("target={\"threads\":2}"));
    assert_eq!(
        back.steps[0].kernels[4].op,
        KernelOp::Op(Op::Attention(attn()))
    );
    let _ = DType::F32;
}
