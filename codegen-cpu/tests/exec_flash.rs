//! The executor's flash attention (llama.cpp's default on the CPU) against the interpreter's
//! (`InterpOptions::llama_cpp`), bit for bit, with SmolLM2-135M's head shapes (9 query heads,
//! 3 KV heads of 64) and a cache of 1024 cells, over a sequence of ubatches that takes every
//! kernel ggml chooses: 64 tokens (tiled), 1 token over a short cache (reference kernel),
//! 5 tokens (reference kernel), 5 real tokens padded into the 64-token step (reference
//! kernel: the choice follows the real count), 72 tokens run as a 64-token step and 8
//! single-token steps (tiled: the choice follows llama.cpp's ubatch, not the step),
//! 64-token steps up to 531 cells, then single tokens over 532+ cells (split-KV decode: one
//! chunk per llama.cpp thread). The rope of Q
//! is compared too. Also a sliding window with soft-capping and NEOX rope (tiles skipped or
//! partly masked), and llama.cpp run with one thread (one split chunk). Also the caches
//! `-ctk`/`-ctv` choose: Q8_0 K and V (the reference kernel always: Q quantized to Q8_0,
//! `vec_dot_q8_0_q8_0` scores, V dequantized into an f32 accumulator), Q8_0 with F16, and
//! F32.

mod exec_common;

use codegen_cpu::exec::{CompiledPlan, StepArgs};
use exec_common::*;
use ir::ggml::GgmlType;
use ir::graph::{AttnParams, DType, Graph, Input, KvKind, KvTypes, RopeMode, RopeParams, Shape};
use ir::interp::{Inputs, InterpOptions, Interpreter, MemWeights};

const D: u64 = 64;
const N_HEAD: u64 = 9;
const N_HEAD_KV: u64 = 3;
const N_CTX: u64 = 1024;

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

/// llama's attention block for `n` tokens: rope Q and K, store K and V in caches of
/// `kv_types`, attend.
fn attn_graph(n: u64, mode: RopeMode, p: AttnParams, kv_types: KvTypes) -> Graph {
    let mut g = Graph::new();
    let e = |r: Result<ir::graph::TensorId, ir::graph::GraphError>| r.expect("graph op");
    let pos = g.input("inp_pos", Input::Positions, DType::I32, Shape::new(&[n]));
    let q = g.input("q", Input::Data, DType::F32, Shape::new(&[D, N_HEAD, n]));
    let k = g.input("k", Input::Data, DType::F32, Shape::new(&[D, N_HEAD_KV, n]));
    let v = g.input("v", Input::Data, DType::F32, Shape::new(&[D, N_HEAD_KV, n]));
    let qr = e(g.rope("Qcur_rope", q, pos, None, rope_params(mode)));
    let kr = e(g.rope("Kcur_rope", k, pos, None, rope_params(mode)));
    let gqa = D * N_HEAD_KV;
    let mut views = Vec::new();
    for (kind, tag, cur, t) in [
        (KvKind::K, "k", kr, kv_types.k),
        (KvKind::V, "v", v, kv_types.v),
    ] {
        let cache = g.input(
            format!("cache_{tag}_l0"),
            Input::KvCache { layer: 0, kind },
            t,
            Shape::new(&[gqa, N_CTX]),
        );
        let (es, head) = (t.type_size(), t.row_size(D).expect("whole blocks"));
        let cell = t.row_size(gqa).expect("whole blocks");
        let flat = e(g.reshape(&format!("{tag}cur_2d"), cur, &[gqa, n]));
        let all = e(g.kv_store(&format!("cache_{tag}_store"), cache, flat, pos));
        let shape = Shape::new(&[D, N_HEAD_KV, N_CTX]).with_kv_dim(2);
        views.push(e(g.view(
            tag,
            all,
            shape,
            [es, head, cell, cell * N_CTX],
            0,
        )));
    }
    let kqv = e(g.attention("kqv", qr, views[0], views[1], pos, p));
    let out = e(g.reshape("kqv_out", kqv, &[D * N_HEAD, n]));
    g.mark_output(out);
    g.mark_output(qr);
    g
}

/// Whether two vectors are equal bit for bit; prints the largest difference otherwise.
fn same_bits(what: &str, a: &[f32], b: &[f32]) -> bool {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let n = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    if n > 0 {
        let (d, m) = diff(a, b);
        eprintln!(
            "{what}: {n} of {} values differ, max {d:.3e} (max |ref| {m:.3e})",
            a.len()
        );
    }
    n == 0
}

/// Runs the sequence of the module doc on the executor (`n_threads`, llama.cpp threads
/// `llama_threads`) and the interpreter; every run's Q rope and attention output must be
/// bit-identical.
fn check(mode: RopeMode, p: AttnParams, n_threads: usize, llama_threads: usize) {
    check_kv(mode, p, n_threads, llama_threads, KvTypes::F16)
}

/// [`check`] with caches of `kv_types`.
fn check_kv(
    mode: RopeMode,
    p: AttnParams,
    n_threads: usize,
    llama_threads: usize,
    kv_types: KvTypes,
) {
    let graphs: Vec<(u32, Graph)> = [1u64, 5, 64]
        .iter()
        .map(|&n| (n as u32, attn_graph(n, mode, p, kv_types)))
        .collect();
    let plan = plan_with_ctx(&graphs, N_CTX as u32);
    let w = MemWeights::new();
    let mut cpu = CompiledPlan::new(&plan, &w, n_threads).expect("plan compiles");
    assert!(cpu.flash_attn(), "flash attention is the default");
    cpu.set_llama_threads(llama_threads);
    let opts = InterpOptions {
        llama_threads,
        ..InterpOptions::llama_cpp()
    };
    let mut interp = Interpreter::new(&w, opts);
    let mut kv = codegen_cpu::layout::AlignedBuf::zeroed(cpu.kv_layout().stream_bytes as usize);
    // llama.cpp's ubatches: (its size, the executor's steps as (step size, real tokens)).
    let mut seq: Vec<(usize, Vec<(usize, usize)>)> = vec![
        (64, vec![(64, 64)]),
        (1, vec![(1, 1)]),
        (5, vec![(5, 5)]),
        (5, vec![(64, 5)]),
        // 72 tokens cut into 64 + 8 × 1: every query still takes the tiled kernel.
        (72, [(64, 64)].into_iter().chain([(1, 1); 8]).collect()),
    ];
    seq.extend((0..6).map(|_| (64, vec![(64, 64)])));
    seq.extend((0..3).map(|_| (1, vec![(1, 1)])));
    let mut rng = Rng(7);
    let mut pos0 = 0usize;
    let mut ok = true;
    let row_q = (D * N_HEAD) as usize;
    let row_kv = (D * N_HEAD_KV) as usize;
    for (r, (n_llama, steps)) in seq.iter().enumerate() {
        let n_llama = *n_llama;
        let q = rng.vec(n_llama * row_q, -1.0, 1.0);
        let k = rng.vec(n_llama * row_kv, -1.0, 1.0);
        let v = rng.vec(n_llama * row_kv, -1.0, 1.0);
        let pos: Vec<i32> = (pos0..pos0 + n_llama).map(|p| p as i32).collect();
        // The executor: the ubatch's steps, padding rows after the real ones.
        let (mut cq, mut ca) = (Vec::new(), Vec::new());
        let mut done = 0;
        for &(n, n_real) in steps {
            let pad = |x: &[f32], row: usize| {
                let mut v = x[done * row..(done + n_real) * row].to_vec();
                v.resize(n * row, 0.5);
                v
            };
            let (sq, sk, sv) = (pad(&q, row_q), pad(&k, row_kv), pad(&v, row_kv));
            let sp: Vec<i32> = (0..n).map(|i| (pos0 + done + i) as i32).collect();
            let data = [("q", &sq[..]), ("k", &sk[..]), ("v", &sv[..])];
            let args = StepArgs {
                tokens: &[],
                positions: &sp,
                output_ids: &[],
                kv_len: pos0 + done + n,
                data: &data,
            };
            cpu.step_real(
                kv.as_mut_slice(),
                n as u32,
                n as u32,
                n_real,
                n_llama,
                0,
                &args,
            )
            .expect("cpu step");
            ca.extend_from_slice(&cpu.output(0).expect("output")[..n_real * row_q]);
            cq.extend_from_slice(&cpu.output(1).expect("output")[..n_real * row_q]);
            done += n_real;
        }
        assert_eq!(done, n_llama);
        // The interpreter runs the ubatch, as llama.cpp.
        let g = attn_graph(n_llama as u64, mode, p, kv_types);
        let data = [("q", &q[..]), ("k", &k[..]), ("v", &v[..])];
        let inputs = Inputs {
            tokens: &[],
            positions: &pos,
            output_ids: &[],
            kv_len: (pos0 + n_llama) as u64,
            data: &data,
        };
        let i = interp.run(&g, &inputs).expect("interpreter runs");
        let what = format!(
            "{mode:?} window={:?} softcap={:?} t={n_threads} llama_t={llama_threads} kv {kv_types} run {r} (ubatch {n_llama} as {steps:?}, kv {})",
            p.window,
            p.softcap,
            pos0 + n_llama
        );
        ok &= same_bits(&format!("{what} q_rope"), &cq, &i[1]);
        ok &= same_bits(&format!("{what} attention"), &ca, &i[0]);
        pos0 += n_llama;
    }
    assert!(
        ok,
        "the executor's flash attention differs from the interpreter's"
    );
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
fn smollm2_heads_bit_exact() {
    check(RopeMode::Norm, smollm2_attn(), 2, 2);
}

#[test]
fn one_executor_thread_and_one_llama_thread() {
    check(RopeMode::Norm, smollm2_attn(), 1, 2);
    check(RopeMode::Norm, smollm2_attn(), 2, 1);
}

#[test]
fn window_softcap_neox_bit_exact() {
    let p = AttnParams {
        kq_scale: 0.125,
        softcap: Some(5.0),
        window: Some(100),
        causal: true,
    };
    check(RopeMode::Neox, p, 2, 2);
}

const Q8_0: DType = DType::Block(GgmlType::Q8_0);

#[test]
fn q8_0_caches_bit_exact() {
    check_kv(RopeMode::Norm, smollm2_attn(), 2, 2, KvTypes::same(Q8_0));
}

#[test]
fn mixed_q8_0_and_f16_caches_bit_exact() {
    let (k, v) = (
        KvTypes {
            k: Q8_0,
            v: DType::F16,
        },
        KvTypes {
            k: DType::F16,
            v: Q8_0,
        },
    );
    check_kv(RopeMode::Norm, smollm2_attn(), 2, 2, k);
    check_kv(RopeMode::Norm, smollm2_attn(), 2, 2, v);
}

#[test]
fn q8_0_window_softcap_bit_exact() {
    let p = AttnParams {
        kq_scale: 0.125,
        softcap: Some(5.0),
        window: Some(100),
        causal: true,
    };
    check_kv(RopeMode::Neox, p, 2, 2, KvTypes::same(Q8_0));
}

#[test]
fn f32_caches_bit_exact() {
    check_kv(
        RopeMode::Norm,
        smollm2_attn(),
        2,
        2,
        KvTypes::same(DType::F32),
    );
}

#[test]
fn quantized_cache_refuses_the_soft_max_path() {
    let graphs = vec![(
        1u32,
        attn_graph(1, RopeMode::Norm, smollm2_attn(), KvTypes::same(Q8_0)),
    )];
    let plan = plan_with_ctx(&graphs, N_CTX as u32);
    let w = MemWeights::new();
    let mut cpu = CompiledPlan::new(&plan, &w, 1).expect("plan compiles");
    let e = cpu
        .set_flash_attn(false)
        .expect_err("no soft_max path for Q8_0");
    assert!(e.to_string().contains("needs flash attention"), "{e}");
    assert!(cpu.flash_attn(), "flash attention stays on");
}

/// A sliding-window cache as a ring ([`ir::plan::Plan::kv_layout_ring`], sized for
/// ubatches of 64 as llama.cpp sizes its SWA cache): the executor and the interpreter store
/// position `p` in cell `p % cells` and attend over the cells in cell order, bit for bit,
/// past the ring's end (several times for a small window), with ubatches that straddle the ring's end: 5 tokens, 64-token
/// ubatches (tiled kernel), then 5-token and single-token ones (reference or split-KV
/// kernel). `flash` off: llama.cpp's soft_max path.
fn check_ring(window: u32, flash: bool, kv_types: KvTypes, n_runs_64: usize) {
    let p = AttnParams {
        kq_scale: 0.125,
        softcap: None,
        window: Some(window),
        causal: true,
    };
    let mode = RopeMode::Neox;
    let graphs: Vec<(u32, Graph)> = [1u64, 5, 64]
        .iter()
        .map(|&n| (n as u32, attn_graph(n, mode, p, kv_types)))
        .collect();
    let plan = plan_with_ctx(&graphs, N_CTX as u32);
    assert!(plan.kv.iter().all(|c| c.window == Some(window)));
    let w = MemWeights::new();
    let opts = codegen_cpu::exec::ExecOptions {
        n_threads: 2,
        kv_ring_ubatch: Some(64),
        ..Default::default()
    };
    let mut cpu = CompiledPlan::load(&plan, &w, &opts).expect("plan compiles");
    cpu.set_flash_attn(flash).expect("attention path");
    let cells = ir::plan::swa_cells(N_CTX, window, 64);
    assert!(cells < N_CTX);
    assert!(cpu.kv_layout().caches.iter().all(|c| c.n_cells == cells));
    let iopts = InterpOptions {
        flash_attn: flash,
        kv_ring_ubatch: Some(64),
        ..InterpOptions::llama_cpp()
    };
    let mut interp = Interpreter::new(&w, iopts);
    let mut kv = codegen_cpu::layout::AlignedBuf::zeroed(cpu.kv_layout().stream_bytes as usize);
    let mut seq = vec![5usize];
    seq.extend(std::iter::repeat_n(64, n_runs_64));
    seq.extend([5, 1, 1, 5, 1]);
    let mut rng = Rng(11);
    let (mut pos0, mut ok) = (0usize, true);
    let (row_q, row_kv) = ((D * N_HEAD) as usize, (D * N_HEAD_KV) as usize);
    for (r, &n) in seq.iter().enumerate() {
        let q = rng.vec(n * row_q, -1.0, 1.0);
        let k = rng.vec(n * row_kv, -1.0, 1.0);
        let v = rng.vec(n * row_kv, -1.0, 1.0);
        let pos: Vec<i32> = (pos0..pos0 + n).map(|p| p as i32).collect();
        let data = [("q", &q[..]), ("k", &k[..]), ("v", &v[..])];
        let args = StepArgs {
            tokens: &[],
            positions: &pos,
            output_ids: &[],
            kv_len: pos0 + n,
            data: &data,
        };
        cpu.step_real(kv.as_mut_slice(), n as u32, n as u32, n, n, 0, &args)
            .expect("cpu step");
        let ca = cpu.output(0).expect("output")[..n * row_q].to_vec();
        let g = attn_graph(n as u64, mode, p, kv_types);
        let inputs = Inputs {
            tokens: &[],
            positions: &pos,
            output_ids: &[],
            kv_len: (pos0 + n) as u64,
            data: &data,
        };
        let i = interp.run(&g, &inputs).expect("interpreter runs");
        let what = format!("ring of {cells} window {window} flash {flash} kv {kv_types} run {r} (ubatch {n}, kv {})", pos0 + n);
        ok &= same_bits(&what, &ca, &i[0]);
        pos0 += n;
    }
    assert!(pos0 as u64 > cells + 64, "the ring wraps");
    assert!(
        ok,
        "the executor's ring attention differs from the interpreter's"
    );
}

#[test]
fn ring_cache_bit_exact() {
    // Window 40: a ring of 256 cells (tiles wholly inside the masked gap are skipped).
    check_ring(40, true, KvTypes::F16, 9);
    check_ring(40, false, KvTypes::F16, 9);
    check_ring(40, true, KvTypes::same(Q8_0), 9);
}

#[test]
fn ring_cache_split_kv_decode_bit_exact() {
    // Window 300: a ring of 512 cells, so single tokens take the split-KV decode.
    check_ring(300, true, KvTypes::F16, 12);
}
