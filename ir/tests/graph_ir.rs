//! The IR on its own: the builder's shape rules and error messages, the verifier, the printer,
//! serde, and the interpreter's ops checked against each other (attention as one op against
//! the same computation spelled out with mul_mat, soft_max, views and permutes).

use ir::graph::{AttnParams, DType, Graph, GraphError, Input, KvKind, Op, Shape};
use ir::interp::{Inputs, InterpOptions, Interpreter, MemWeights};

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn shape_errors_name_the_op_the_node_and_both_shapes() {
    let mut g = Graph::new();
    let w = g.weight(
        "blk.0.attn_q.weight",
        DType::Block(ir::ggml::GgmlType::Q4_0),
        Shape::new(&[576, 576]),
    );
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[512, 7]));
    let e = g.mul_mat("Qcur-0", w, x).expect_err("ne0 differs");
    let msg = e.to_string();
    assert!(matches!(e, GraphError::Op { op: "mul_mat", .. }), "{e:?}");
    assert!(
        msg.contains("Qcur-0") && msg.contains("{576, 576} Q4_0") && msg.contains("{512, 7} F32"),
        "{msg}"
    );
    // Broadcasting follows ggml_can_repeat.
    let n = g.input("w", Input::Data, DType::F32, Shape::new(&[513]));
    assert!(g.mul("bad", x, n).is_err());
    let n = g.input("w2", Input::Data, DType::F32, Shape::new(&[512]));
    let ok = g.mul("ok", x, n).expect("broadcast");
    assert_eq!(g.tensor(ok).shape, Shape::new(&[512, 7]));
    // Reshape needs a contiguous source.
    let p = g.permute("p", x, [1, 0, 2, 3]).expect("permute");
    assert!(!g.tensor(p).contiguous);
    assert!(g.reshape("r", p, &[3584]).is_err());
    let c = g.cont("c", p).expect("cont");
    let r = g.reshape("r", c, &[3584]).expect("reshape");
    assert_eq!(g.tensor(r).shape, Shape::new(&[3584]));
    // Views may not reach past their source.
    assert!(g
        .view("v", x, Shape::new(&[512, 8]), [4, 2048, 0, 0], 0)
        .is_err());
}

#[test]
fn the_verifier_catches_edits_that_break_types() {
    let mut g = Graph::new();
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[8, 2]));
    let y = g.rms_norm("norm", x, 1e-5).expect("norm");
    g.mark_output(y);
    g.verify().expect("valid");
    let mut bad = g.clone();
    bad.tensors[y.index()].shape = Shape::new(&[8, 3]);
    let e = bad.verify().expect_err("recorded shape is wrong");
    assert!(
        e.to_string().contains("rms_norm norm")
            && e.to_string().contains("{8, 3}")
            && e.to_string().contains("{8, 2}"),
        "{e}"
    );
    // Serialized graphs are verified when read.
    let json = bad.to_json();
    assert!(Graph::from_json(&json).is_err());
    assert_eq!(Graph::from_json(&g.to_json()).expect("valid json"), g);
    assert!(matches!(Graph::from_json("{"), Err(GraphError::Serde(_))));
}

#[test]
fn printer_writes_one_line_per_node() {
    let mut g = Graph::new();
    let x = g.input("inp", Input::Data, DType::F32, Shape::new(&[4, 3]));
    let w = g.weight("w", DType::F32, Shape::new(&[4, 5]));
    let y = g.mul_mat("out", w, x).expect("mul_mat");
    let z = g.scale("scaled", y, 0.5).expect("scale");
    g.mark_output(z);
    let text = g.to_string();
    let want = "input inp: F32 {4, 3} data\ninput w: F32 {4, 5} weight\nout = (F32) mul_mat(w {4, 5}, inp {4, 3}) = {5, 3}\nscaled = (F32) scale(out {5, 3}) = {5, 3} [s=0.5]\noutputs: scaled\n";
    assert_eq!(text, want);
}

/// Attention over a cache written by kv_store, as one op and spelled out; exact arithmetic.
#[test]
fn attention_op_equals_its_decomposition() {
    let (d, n_head, n_head_kv, n_tok, n_ctx) = (8u64, 4u64, 2u64, 5u64, 16u64);
    let gqa = d * n_head_kv;
    let mut g = Graph::new();
    let q = g.input(
        "q",
        Input::Data,
        DType::F32,
        Shape::new(&[d, n_head, n_tok]),
    );
    let kcur = g.input("kcur", Input::Data, DType::F32, Shape::new(&[gqa, n_tok]));
    let vcur = g.input("vcur", Input::Data, DType::F32, Shape::new(&[gqa, n_tok]));
    let pos = g.input("pos", Input::Positions, DType::I32, Shape::new(&[n_tok]));
    let kc = g.input(
        "cache_k_l0",
        Input::KvCache {
            layer: 0,
            kind: KvKind::K,
        },
        DType::F32,
        Shape::new(&[gqa, n_ctx]),
    );
    let vc = g.input(
        "cache_v_l0",
        Input::KvCache {
            layer: 0,
            kind: KvKind::V,
        },
        DType::F32,
        Shape::new(&[gqa, n_ctx]),
    );
    let ka = g.kv_store("k_store", kc, kcur, pos).expect("store");
    let va = g.kv_store("v_store", vc, vcur, pos).expect("store");
    let kv_shape = Shape::new(&[d, n_head_kv, n_ctx]).with_kv_dim(2);
    let nb = [4, 4 * d, 4 * gqa, 4 * gqa * n_ctx];
    let k = g.view("k", ka, kv_shape, nb, 0).expect("view");
    let v = g.view("v", va, kv_shape, nb, 0).expect("view");
    let p = AttnParams {
        kq_scale: 0.35,
        softcap: None,
        window: None,
        causal: false,
    };
    let fused = g.attention("kqv", q, k, v, pos, p).expect("attention");
    // Spelled out as llama.cpp's build_attn_mha does it, without a mask (non-causal).
    let kp = g.permute("kp", k, [0, 2, 1, 3]).expect("permute"); // {d, n_kv, n_head_kv}
    let qp = g.permute("qp", q, [0, 2, 1, 3]).expect("permute"); // {d, n_tok, n_head}
    let kq = g.mul_mat("kq", kp, qp).expect("kq"); // {n_kv, n_tok, n_head}
    let sm = g.soft_max("kq_soft_max", kq, 0.35).expect("softmax");
    let vt = g.permute("vt", v, [1, 2, 0, 3]).expect("permute"); // {n_kv, d, n_head_kv}
    let vt = g.cont("vt_cont", vt).expect("cont");
    let kqv = g.mul_mat("kqv_mm", vt, sm).expect("kqv"); // {d, n_tok, n_head}
    let out = g.permute("kqv_perm", kqv, [0, 2, 1, 3]).expect("permute"); // {d, n_head, n_tok}
    let out = g.cont("kqv_cont", out).expect("cont");
    g.mark_output(fused);
    g.mark_output(out);
    g.verify().expect("valid");
    assert_eq!(
        g.tensor(kq).shape,
        Shape::new(&[n_ctx, n_tok, n_head]).with_kv_dim(0)
    );

    let w = MemWeights::new();
    let mut it = Interpreter::new(&w, InterpOptions::exact());
    let (qv, kv, vv) = (
        vals((d * n_head * n_tok) as usize, 1),
        vals((gqa * n_tok) as usize, 2),
        vals((gqa * n_tok) as usize, 3),
    );
    let positions: Vec<i32> = (3..3 + n_tok as i32).collect();
    let data = [
        ("q", qv.as_slice()),
        ("kcur", kv.as_slice()),
        ("vcur", vv.as_slice()),
    ];
    let inputs = Inputs {
        positions: &positions,
        kv_len: 8,
        data: &data,
        ..Inputs::default()
    };
    let outs = it.run(&g, &inputs).expect("runs");
    assert_eq!(outs[0].len(), (d * n_head * n_tok) as usize);
    for (a, b) in outs[0].iter().zip(&outs[1]) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    // The caches persist: positions 0..3 were never written and hold zeros.
    let cache = it.state().get("cache_k_l0").expect("cache");
    assert!(cache[..(3 * gqa) as usize].iter().all(|&x| x == 0.0));
    assert_eq!(
        &cache[(3 * gqa) as usize..(4 * gqa) as usize],
        &kv[..gqa as usize]
    );
    // A KV length past the cache is refused.
    let bad = Inputs {
        kv_len: 17,
        ..inputs
    };
    assert!(it.run(&g, &bad).is_err());
}

#[test]
fn views_and_permutes_move_the_right_elements() {
    let mut g = Graph::new();
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[4, 3]));
    // Column 1 of each row, as a {1, 3} view with row stride 16 bytes.
    let col = g
        .view("col", x, Shape::new(&[1, 3]), [4, 16, 48, 48], 4)
        .expect("view");
    let t = g.permute("t", x, [1, 0, 2, 3]).expect("permute");
    let t = g.cont("t_cont", t).expect("cont");
    g.mark_output(col);
    g.mark_output(t);
    let w = MemWeights::new();
    let xv: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let data = [("x", xv.as_slice())];
    let outs = Interpreter::new(&w, InterpOptions::exact())
        .run(
            &g,
            &Inputs {
                data: &data,
                ..Inputs::default()
            },
        )
        .expect("runs");
    assert_eq!(outs[0], vec![1.0, 5.0, 9.0]);
    assert_eq!(
        outs[1],
        vec![0.0, 4.0, 8.0, 1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0]
    );
    assert_eq!(g.nodes.iter().filter(|n| n.op.is_view()).count(), 2);
    assert_eq!(Op::KvStore.in_place_src(), Some(0));
}

#[test]
fn missing_or_mismatched_weights_are_named() {
    let mut g = Graph::new();
    let w = g.weight("blk.0.w", DType::F32, Shape::new(&[4, 2]));
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[4, 1]));
    let y = g.mul_mat("y", w, x).expect("mul_mat");
    g.mark_output(y);
    let xv = [1.0f32; 4];
    let data = [("x", &xv[..])];
    let inputs = Inputs {
        data: &data,
        ..Inputs::default()
    };
    let empty = MemWeights::new();
    let e = Interpreter::new(&empty, InterpOptions::exact())
        .run(&g, &inputs)
        .expect_err("no weight");
    assert!(e.to_string().contains("blk.0.w"), "{e}");
    let mut wrong = MemWeights::new();
    wrong.insert_f32("blk.0.w", [4, 3, 1, 1], &[0.0; 12]);
    let e = Interpreter::new(&wrong, InterpOptions::exact())
        .run(&g, &inputs)
        .expect_err("wrong shape");
    assert!(
        e.to_string().contains("{4, 2}") && e.to_string().contains("{4, 3}"),
        "{e}"
    );
    let mut right = MemWeights::new();
    right.insert_f32(
        "blk.0.w",
        [4, 2, 1, 1],
        &[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 0.5, 2.0],
    );
    let out = Interpreter::new(&right, InterpOptions::exact())
        .run(&g, &inputs)
        .expect("runs");
    assert_eq!(out[0], vec![10.0, 1.5]);
}
