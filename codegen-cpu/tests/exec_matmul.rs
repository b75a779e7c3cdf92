//! The executor's matmul kernels as the plan fuses them — `rms_norm+mul+mul_mat×3` (q/k/v),
//! `rms_norm+mul+mul_mat×2+swiglu` (gate/up), `mul_mat+add` (down with the residual),
//! `rms_norm+mul+mul_mat` (output) — and the embedding `get_rows` and the final
//! `rms_norm+mul`, against the interpreter (llama.cpp's roundings) on random inputs of
//! SmolLM2-135M's shapes, for every weight type the CPU kernels take, with 1 and 64 tokens.
//!
//! Tolerance: the integer block sums are exact in both; the f32 sums of the scaled block
//! terms run in another order, and a norm's f64 sum in another order may flip the rounding
//! of an activation by one step — both far below 1e-3 of the largest output.

mod exec_common;

use exec_common::*;
use ir::ggml::GgmlType;
use ir::graph::{DType, Graph, Input, Shape};
use ir::interp::MemWeights;

const N_EMBD: u64 = 576;
const N_FF: u64 = 1536;
const N_KV: u64 = 192;

fn weight(
    g: &mut Graph,
    w: &mut MemWeights,
    rng: &mut Rng,
    name: &str,
    t: GgmlType,
    k: u64,
    m: u64,
) -> ir::graph::TensorId {
    w.insert(
        name,
        t,
        [k, m, 1, 1],
        random_weight(t, k as usize, m as usize, rng),
    );
    g.weight(
        name,
        DType::from_ggml(t).expect("dtype"),
        Shape::new(&[k, m]),
    )
}

fn norm_weight(
    g: &mut Graph,
    w: &mut MemWeights,
    rng: &mut Rng,
    name: &str,
) -> ir::graph::TensorId {
    w.insert_f32(name, [N_EMBD, 1, 1, 1], &rng.vec(N_EMBD as usize, 0.8, 1.2));
    g.weight(name, DType::F32, Shape::new(&[N_EMBD]))
}

/// One llama layer's products for `n` tokens with weights of type `t`: q/k/v from the
/// normed input, the residual add of the output projection, gate/up/swiglu and the down
/// projection with the residual.
fn layer_graph(n: u64, t: GgmlType, w: &mut MemWeights) -> Graph {
    let mut rng = Rng(0x5eed ^ t as u64);
    let mut g = Graph::new();
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[N_EMBD, n]));
    let attn = g.input("attn", Input::Data, DType::F32, Shape::new(&[N_EMBD, n]));
    let an = norm_weight(&mut g, w, &mut rng, "attn_norm.weight");
    let wq = weight(&mut g, w, &mut rng, "attn_q.weight", t, N_EMBD, N_EMBD);
    let wk = weight(&mut g, w, &mut rng, "attn_k.weight", t, N_EMBD, N_KV);
    let wv = weight(&mut g, w, &mut rng, "attn_v.weight", t, N_EMBD, N_KV);
    let wo = weight(&mut g, w, &mut rng, "attn_output.weight", t, N_EMBD, N_EMBD);
    let fnw = norm_weight(&mut g, w, &mut rng, "ffn_norm.weight");
    let wg = weight(&mut g, w, &mut rng, "ffn_gate.weight", t, N_EMBD, N_FF);
    let wu = weight(&mut g, w, &mut rng, "ffn_up.weight", t, N_EMBD, N_FF);
    let wd = weight(&mut g, w, &mut rng, "ffn_down.weight", t, N_FF, N_EMBD);
    let e = |r: Result<ir::graph::TensorId, ir::graph::GraphError>| r.expect("graph op");
    let nx = e(g.rms_norm("attn_norm_raw", x, 1e-5));
    let nx = e(g.mul("attn_norm", nx, an));
    let q = e(g.mul_mat("Qcur", wq, nx));
    let k = e(g.mul_mat("Kcur", wk, nx));
    let v = e(g.mul_mat("Vcur", wv, nx));
    let o = e(g.mul_mat("attn_out", wo, attn));
    let h = e(g.add("ffn_inp", o, x));
    let nh = e(g.rms_norm("ffn_norm_raw", h, 1e-5));
    let nh = e(g.mul("ffn_norm", nh, fnw));
    let gate = e(g.mul_mat("ffn_gate", wg, nh));
    let up = e(g.mul_mat("ffn_up", wu, nh));
    let s = e(g.swiglu("ffn_swiglu", gate, up));
    let d = e(g.mul_mat("ffn_out", wd, s));
    let out = e(g.add("l_out", d, h));
    for t in [out, q, k, v, h] {
        g.mark_output(t);
    }
    g
}

fn check_layer(t: GgmlType, n: u64, n_threads: usize) {
    let mut w = MemWeights::new();
    let g = layer_graph(n, t, &mut w);
    let plan = plan_of(&[(n as u32, g.clone())]);
    let kinds = kinds(&plan, n as u32);
    for want in [
        "rms_norm+mul+mul_mat×3",
        "mul_mat+add",
        "rms_norm+mul+mul_mat×2+swiglu",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "{want} not fused: {kinds:?}"
        );
    }
    let mut rng = Rng(77 + n);
    let x = rng.vec((N_EMBD * n) as usize, -2.0, 2.0);
    let attn = rng.vec((N_EMBD * n) as usize, -1.0, 1.0);
    let pos: Vec<i32> = (0..n as i32).collect();
    let data = [("x", &x[..]), ("attn", &attn[..])];
    let run = Run {
        n_tokens: n as u32,
        tokens: &[],
        positions: &pos,
        kv_len: n as usize,
        data: &data,
    };
    let res = run_both(&[(n as u32, g)], &w, &[run], n_threads, llama_cpp());
    let (c, i) = &res[0];
    for (j, name) in ["l_out", "Qcur", "Kcur", "Vcur", "ffn_inp"]
        .iter()
        .enumerate()
    {
        assert_close(
            &format!("{} {name} n={n} t={n_threads}", t.name()),
            &c[j],
            &i[j],
            1e-3,
        );
    }
}

#[test]
fn layer_q4_1() {
    check_layer(GgmlType::Q4_1, 1, 2);
    check_layer(GgmlType::Q4_1, 64, 2);
    check_layer(GgmlType::Q4_1, 64, 1);
}

#[test]
fn layer_q4_0() {
    check_layer(GgmlType::Q4_0, 1, 2);
    check_layer(GgmlType::Q4_0, 64, 2);
}

#[test]
fn layer_q8_0() {
    check_layer(GgmlType::Q8_0, 1, 2);
    check_layer(GgmlType::Q8_0, 64, 2);
}

#[test]
fn layer_f16() {
    check_layer(GgmlType::F16, 1, 2);
    check_layer(GgmlType::F16, 7, 2);
}

#[test]
fn layer_f32() {
    check_layer(GgmlType::F32, 1, 2);
    check_layer(GgmlType::F32, 7, 2);
}

/// The embedding lookup (Q8_0 `token_embd` of SmolLM2's size, read in place), the final
/// norm fused into the tied output projection, for 1 and 64 tokens.
#[test]
fn embedding_and_output() {
    let (n_vocab, e) = (49152u64, N_EMBD);
    let mut rng = Rng(99);
    let mut w = MemWeights::new();
    w.insert(
        "token_embd.weight",
        GgmlType::Q8_0,
        [e, n_vocab, 1, 1],
        random_weight(GgmlType::Q8_0, e as usize, n_vocab as usize, &mut rng),
    );
    w.insert_f32(
        "output_norm.weight",
        [e, 1, 1, 1],
        &rng.vec(e as usize, 0.8, 1.2),
    );
    for n in [1u64, 64] {
        let mut g = Graph::new();
        let toks = g.input("inp_tokens", Input::Tokens, DType::I32, Shape::new(&[n]));
        let table = g.weight(
            "token_embd.weight",
            DType::Block(GgmlType::Q8_0),
            Shape::new(&[e, n_vocab]),
        );
        let onw = g.weight("output_norm.weight", DType::F32, Shape::new(&[e]));
        let x = g.get_rows("inp_embd", table, toks).expect("get_rows");
        let h = g.scale("h", x, 3.0).expect("scale");
        let nn = g.rms_norm("norm_raw", h, 1e-5).expect("norm");
        let nn = g.mul("result_norm", nn, onw).expect("mul");
        let logits = g.mul_mat("result_output", table, nn).expect("mul_mat");
        g.mark_output(logits);
        g.mark_output(x);
        let plan = plan_of(&[(n as u32, g.clone())]);
        assert!(kinds(&plan, n as u32)
            .iter()
            .any(|k| k == "rms_norm+mul+mul_mat"));
        let toks: Vec<i32> = (0..n).map(|_| (rng.next() % n_vocab) as i32).collect();
        let pos: Vec<i32> = (0..n as i32).collect();
        let run = Run {
            n_tokens: n as u32,
            tokens: &toks,
            positions: &pos,
            kv_len: n as usize,
            data: &[],
        };
        let res = run_both(&[(n as u32, g)], &w, &[run], 2, llama_cpp());
        let (c, i) = &res[0];
        assert_eq!(
            c[1], i[1],
            "get_rows is the reference dequantizer: bit-identical"
        );
        assert_close(&format!("output n={n}"), &c[0], &i[0], 1e-3);
    }
}

/// A weight whose row count is not a multiple of 4 (the last group's rows take the scalar
/// path), and an unfused `rms_norm+mul` result.
#[test]
fn ragged_rows_and_plain_norm() {
    let mut rng = Rng(5);
    let mut w = MemWeights::new();
    let mut g = Graph::new();
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[64, 3]));
    let nw = {
        w.insert_f32("n.weight", [64, 1, 1, 1], &rng.vec(64, 0.5, 1.5));
        g.weight("n.weight", DType::F32, Shape::new(&[64]))
    };
    let wr = weight(&mut g, &mut w, &mut rng, "r.weight", GgmlType::Q4_1, 64, 6);
    let n = g.rms_norm("nr", x, 1e-6).expect("norm");
    let n = g.mul("nm", n, nw).expect("mul");
    let y = g.mul_mat("y", wr, x).expect("mul_mat");
    g.mark_output(y);
    g.mark_output(n);
    let plan = plan_of(&[(3, g.clone())]);
    assert!(kinds(&plan, 3).iter().any(|k| k == "rms_norm+mul"));
    let xs = rng.vec(64 * 3, -3.0, 3.0);
    let data = [("x", &xs[..])];
    let run = Run {
        n_tokens: 3,
        tokens: &[],
        positions: &[0, 1, 2],
        kv_len: 3,
        data: &data,
    };
    for nt in [1, 2] {
        let res = run_both(&[(3, g.clone())], &w, &[Run { ..run }], nt, llama_cpp());
        let (c, i) = &res[0];
        assert_close("ragged mul_mat", &c[0], &i[0], 1e-4);
        assert_close("rms_norm+mul", &c[1], &i[1], 1e-6);
    }
}
