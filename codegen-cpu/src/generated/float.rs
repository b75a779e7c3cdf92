//! Generator of float matmul kernels: F32, F16 and BF16 weights (converted to f32 in
//! registers, exactly), activations as f32 rows.
//!
//! ggml computes F16 (BF16) matmuls on activations rounded to F16 (BF16), its `vec_dot_type`,
//! with products accumulated in f32. Products of two F16 (BF16) values are exact in f32, so
//! this kernel on converted weights and activations rounded the same way (done by
//! [`crate::matmul::MatmulKernel::prepare`]) computes the same sums up to summation order.
//!
//! Loop nest: 4 rows (one per lane) × a tile of T tokens; each `k` step loads (and converts)
//! the 4 rows' weights once and does one `vfmadd` per token with the activation lane
//! broadcast by `pshufd`; several accumulators per token hide the FMA latency.

use cranelift_codegen::ir::types::F32X4;
use cranelift_codegen::ir::{InstBuilder, Value};
use ir::ggml::GgmlType;

use super::emit::{Emit, F16Consts};
use super::{KernelArgs, Tiling};
use crate::formats::GROUP_ROWS;

/// Fixed shape of one generated kernel.
pub(crate) struct FloatShape {
    pub wtype: GgmlType,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub tiling: Tiling,
}

/// Emits the body of a float matmul kernel (see the module doc).
pub(crate) fn emit(e: &mut Emit, a: &KernelArgs, s: &FloatShape) {
    let group_stride = s.k * s.wtype.type_size() * GROUP_ROWS;
    let f16 = e.f16_consts();
    let arb = s.k * 4;
    let tokens = s.tiling.tokens.clamp(1, s.n);
    let full_tiles = s.n / tokens;
    let rem = s.n % tokens;
    let out_row = 4 * s.m;
    let (w, act, out) = (a.w, a.act, a.out);
    e.range_loop(a.g_begin, a.g_end, |e, g| {
        let wg = e.offset_ptr(w, g, group_stride);
        let og = e.offset_ptr(out, g, 4 * GROUP_ROWS);
        if full_tiles == 1 {
            emit_tile(e, s, &f16, wg, act, og, tokens);
        } else if full_tiles > 1 {
            e.counted_loop(full_tiles, |e, ti| {
                let at = e.offset_ptr(act, ti, tokens * arb);
                let ot = e.offset_ptr(og, ti, tokens * out_row);
                emit_tile(e, s, &f16, wg, at, ot, tokens);
            });
        }
        if rem > 0 {
            let at =
                e.fb.ins()
                    .iadd_imm_s(act, (full_tiles * tokens * arb) as i64);
            let ot =
                e.fb.ins()
                    .iadd_imm_s(og, (full_tiles * tokens * out_row) as i64);
            emit_tile(e, s, &f16, wg, at, ot, rem);
        }
    });
}

fn emit_tile(
    e: &mut Emit,
    s: &FloatShape,
    f16: &F16Consts,
    wg: Value,
    at: Value,
    ot: Value,
    nt: usize,
) {
    let arb = s.k * 4;
    let wstep = s.wtype.type_size() * GROUP_ROWS; // bytes per `k` step of a group
    let unroll = s.tiling.unroll.clamp(1, s.k);
    // Accumulators per token: a few independent FMA chains, within the 16 vector registers.
    let na = if nt >= 3 { 1 } else { 4 / nt };
    let zero = e.zero(F32X4);
    let acc: Vec<Vec<_>> = (0..nt)
        .map(|_| (0..na).map(|_| e.var(F32X4, zero)).collect())
        .collect();
    let pty = e.fb.func.dfg.value_type(wg);
    let wp = e.var(pty, wg);
    let ap = e.var(pty, at);
    let step = |e: &mut Emit, ks: usize| {
        let w = e.fb.use_var(wp);
        let a = e.fb.use_var(ap);
        // activations: one vector load per 4 `k` and token, lanes broadcast with `pshufd`
        let mut av: Vec<Value> = Vec::new();
        for kk in 0..ks {
            if kk % 4 == 0 {
                av = (0..nt)
                    .map(|t| {
                        if ks - kk >= 4 {
                            e.load(F32X4, a, t * arb + kk * 4)
                        } else {
                            // fewer than 4 values left in the row: load them one by one
                            e.load_partial_f32(a, t * arb + kk * 4, ks - kk)
                        }
                    })
                    .collect();
            }
            let wv = match s.wtype {
                GgmlType::F16 => e.f16x4_to_f32x4(w, kk * wstep, f16),
                GgmlType::BF16 => e.bf16x4_to_f32x4(w, kk * wstep),
                _ => e.load(F32X4, w, kk * wstep),
            };
            for (t, acc_t) in acc.iter().enumerate() {
                let ab = e.lane_broadcast32(av[t], kk % 4);
                let var = acc_t[kk % na];
                let x = e.fb.use_var(var);
                let y = e.fb.ins().fma(wv, ab, x);
                e.fb.def_var(var, y);
            }
        }
        let w2 = e.fb.ins().iadd_imm_s(w, (ks * wstep) as i64);
        let a2 = e.fb.ins().iadd_imm_s(a, (ks * 4) as i64);
        e.fb.def_var(wp, w2);
        e.fb.def_var(ap, a2);
    };
    e.counted_loop(s.k / unroll, |e, _| step(e, unroll));
    if !s.k.is_multiple_of(unroll) {
        step(e, s.k % unroll);
    }
    for (t, acc_t) in acc.iter().enumerate() {
        let mut sum = e.fb.use_var(acc_t[0]);
        for &v in &acc_t[1..] {
            let x = e.fb.use_var(v);
            sum = e.fb.ins().fadd(sum, x);
        }
        e.store(sum, ot, t * 4 * s.m);
    }
}
