//! The executor's `rope+kv_store+rope_q+kv_store_v` and `attention` kernels against the
//! interpreter, with SmolLM2-135M's head shapes (9 query heads, 3 KV heads of 64), over a
//! sequence of steps that fills the KV cache: 64 tokens, 1, 64 more, 1 (the interpreter
//! keeps its own caches). Also a sliding window with soft-capping and NEOX rope, and an F32
//! cache (which rounds nothing, as llama.cpp's F32 path).
//!
//! With the interpreter computing llama.cpp's soft_max path the attention must agree bit for
//! bit (`handwritten::soft_max_attn` follows the same order); against the interpreter's plain f32
//! path the tolerance is 1e-3 of the largest output (f16-rounded probabilities).

mod exec_common;

use exec_common::*;
use ir::graph::{AttnParams, DType, Graph, Input, KvKind, KvTypes, RopeMode, RopeParams, Shape};
use ir::interp::{InterpOptions, MemWeights};

const D: u64 = 64;
const N_HEAD: u64 = 9;
const N_HEAD_KV: u64 = 3;

fn rope_params(mode: RopeMode) -> RopeParams {
    RopeParams {
        mode,
        n_rot: D as u32,
        freq_base: 100000.0,
        freq_scale: 1.0,
        n_ctx_orig: 8192,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

/// llama's attention block for `n` tokens (as `compiler::arch` builds it): rope Q and K,
/// store K and V, attend over the cache views.
fn attn_graph(n: u64, mode: RopeMode, p: AttnParams, kv: KvTypes) -> Graph {
    let mut g = Graph::new();
    let e = |r: Result<ir::graph::TensorId, ir::graph::GraphError>| r.expect("graph op");
    let pos = g.input("inp_pos", Input::Positions, DType::I32, Shape::new(&[n]));
    let q = g.input("q", Input::Data, DType::F32, Shape::new(&[D, N_HEAD, n]));
    let k = g.input("k", Input::Data, DType::F32, Shape::new(&[D, N_HEAD_KV, n]));
    let v = g.input("v", Input::Data, DType::F32, Shape::new(&[D, N_HEAD_KV, n]));
    let qr = e(g.rope("Qcur_rope", q, pos, None, rope_params(mode)));
    let kr = e(g.rope("Kcur_rope", k, pos, None, rope_params(mode)));
    let gqa = D * N_HEAD_KV;
    let n_ctx = N_CTX as u64;
    let mut views = Vec::new();
    for (kind, tag, cur, t) in [(KvKind::K, "k", kr, kv.k), (KvKind::V, "v", v, kv.v)] {
        let cache = g.input(
            format!("cache_{tag}_l0"),
            Input::KvCache { layer: 0, kind },
            t,
            Shape::new(&[gqa, n_ctx]),
        );
        let (es, head) = (t.type_size(), t.row_size(D).expect("whole blocks"));
        let cell = t.row_size(gqa).expect("whole blocks");
        let flat = e(g.reshape(&format!("{tag}cur_2d"), cur, &[gqa, n]));
        let all = e(g.kv_store(&format!("cache_{tag}_store"), cache, flat, pos));
        let shape = Shape::new(&[D, N_HEAD_KV, n_ctx]).with_kv_dim(2);
        views.push(e(g.view(
            tag,
            all,
            shape,
            [es, head, cell, cell * n_ctx],
            0,
        )));
    }
    let kqv = e(g.attention("kqv", qr, views[0], views[1], pos, p));
    let out = e(g.reshape("kqv_out", kqv, &[D * N_HEAD, n]));
    g.mark_output(out);
    g.mark_output(qr);
    g
}

/// Runs the sequence on the executor and the interpreter; attention must agree bit for bit
/// when the interpreter computes llama.cpp's soft_max path (`attn_f16`), within `1e-3`
/// otherwise (the interpreter's plain f32 path).
fn check(mode: RopeMode, p: AttnParams, kv: KvTypes, opts: InterpOptions, n_threads: usize) {
    let graphs = vec![
        (1u32, attn_graph(1, mode, p, kv)),
        (64u32, attn_graph(64, mode, p, kv)),
    ];
    let plan = plan_of(&graphs);
    for n in [1, 64] {
        let k = kinds(&plan, n);
        assert!(
            k.iter().any(|x| x == "rope+kv_store+rope_q+kv_store_v"),
            "not fused: {k:?}"
        );
        assert!(k.iter().any(|x| x == "attention"), "{k:?}");
    }
    let mut rng = Rng(42);
    let mut inputs = Vec::new();
    let mut pos0 = 0usize;
    for n in [64usize, 1, 64, 1] {
        let q = rng.vec(n * (D * N_HEAD) as usize, -1.0, 1.0);
        let k = rng.vec(n * (D * N_HEAD_KV) as usize, -1.0, 1.0);
        let v = rng.vec(n * (D * N_HEAD_KV) as usize, -1.0, 1.0);
        let pos: Vec<i32> = (pos0..pos0 + n).map(|p| p as i32).collect();
        inputs.push((n, q, k, v, pos));
        pos0 += n;
    }
    let data: Vec<[(&str, &[f32]); 3]> = inputs
        .iter()
        .map(|(_, q, k, v, _)| [("q", &q[..]), ("k", &k[..]), ("v", &v[..])])
        .collect();
    let runs: Vec<Run> = inputs
        .iter()
        .zip(&data)
        .map(|((n, _, _, _, pos), d)| Run {
            n_tokens: *n as u32,
            tokens: &[],
            positions: pos,
            kv_len: *pos.last().expect("pos") as usize + 1,
            data: d,
        })
        .collect();
    let w = MemWeights::new();
    for (r, (c, i)) in run_both(&graphs, &w, &runs, n_threads, opts)
        .iter()
        .enumerate()
    {
        let what = format!(
            "{mode:?} window={:?} softcap={:?} {kv} t={n_threads} run {r}",
            p.window, p.softcap
        );
        assert_close(&format!("{what} q_rope"), &c[1], &i[1], 1e-6);
        if opts.attn_f16 {
            let differ = c[0]
                .iter()
                .zip(&i[0])
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "{what} attention: values differ from the interpreter's"
            );
        } else {
            assert_close(&format!("{what} attention"), &c[0], &i[0], 1e-3);
        }
    }
}

fn smollm2_attn() -> AttnParams {
    AttnParams {
        kq_scale: 0.125,
        softcap: None,
        window: None,
        causal: true,
    }
}

#[test]
fn smollm2_heads_f16_cache() {
    check(RopeMode::Norm, smollm2_attn(), KvTypes::F16, llama_cpp(), 2);
    check(RopeMode::Norm, smollm2_attn(), KvTypes::F16, llama_cpp(), 1);
}

#[test]
fn window_softcap_neox() {
    let p = AttnParams {
        kq_scale: 0.125,
        softcap: Some(5.0),
        window: Some(8),
        causal: true,
    };
    check(RopeMode::Neox, p, KvTypes::F16, llama_cpp(), 2);
}

#[test]
fn f32_cache_rounds_nothing() {
    let opts = InterpOptions {
        attn_f16: false,
        ..llama_cpp()
    };
    check(
        RopeMode::Norm,
        smollm2_attn(),
        KvTypes::same(DType::F32),
        opts,
        2,
    );
    // llama.cpp's soft_max path with F32 caches: no f16 rounding of Q or the probabilities.
    check(
        RopeMode::Norm,
        smollm2_attn(),
        KvTypes::same(DType::F32),
        llama_cpp(),
        2,
    );
}

/// A Q8_0 K cache without flash attention (`-ctk q8_0 -fa off`): Q quantized to Q8_0 and
/// `ggml_vec_dot_q8_0_q8_0` scores, one query at a time, in one and several tokens.
#[test]
fn q8_0_k_cache_soft_max_path() {
    let kv = KvTypes {
        k: DType::Block(ir::ggml::GgmlType::Q8_0),
        v: DType::F16,
    };
    check(RopeMode::Norm, smollm2_attn(), kv, llama_cpp(), 2);
    check(RopeMode::Norm, smollm2_attn(), kv, llama_cpp(), 1);
}
