//! Generator of quantized matmul kernels (Q4_0, Q4_1, Q8_0 weights × 8-bit activations),
//! driven by a [`QuantFormat`] description.
//!
//! Per output row and block of 32 values the result is ggml's
//! (`ggml_vec_dot_q4_1_q8_1` / `_q4_0_q8_0` / `_q8_0_q8_0`):
//!
//! ```text
//! sumi  = Σ_j q_w[j] · q_a[j]            (exact, in integers; q_w - z for a zero point z)
//! acc  += (d_w · d_a) · sumi  (+ m_w · s_a for Q4_1)
//! ```
//!
//! Loop nest of one kernel call (shapes are constants, `g` is runtime):
//!
//! ```text
//! for g in g_begin..g_end                 4 rows, one per 32-bit lane
//!   for each tile of T tokens             T accumulators f32x4 (one lane per row)
//!     for each block b (unrolled by U)
//!       decode the 4 rows' quants once (16-byte chunks: and / shift)
//!       for each token t: pmaddubsw with the broadcast 4 activation bytes, summed in i16
//!       per token: pmaddwd → i32, correct for the zero point, cvt → f32, fma with d_w·d_a
//!     store the T vectors of 4 rows
//! ```
//!
//! i16 headroom: a 4-bit product pair is at most 2·15·128 = 3840 and 8 chunks are summed
//! (30720 < 32767); 8-bit products use `|w|` and the sign moved onto the activation and are
//! widened to i32 after every chunk (2·128·127 = 32512).

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32X4, I16X8, I32X4, I8X16};
use cranelift_codegen::ir::{InstBuilder, Value};

use super::{KernelArgs, Tiling};
use crate::actq::{act_row_bytes, ACT_AUX_OFFSET, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
use crate::emit::Emit;
use crate::formats::{QuantFormat, GROUP_ROWS, QK};

/// Fixed shape of one generated kernel.
pub(crate) struct QuantShape {
    pub fmt: QuantFormat,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub tiling: Tiling,
}

/// Emits the body of a quantized matmul kernel (see the module doc).
pub(crate) fn emit(e: &mut Emit, a: &KernelArgs, s: &QuantShape) {
    let nb = s.k / QK;
    let gbb = s.fmt.group_block_bytes();
    let group_stride = nb * gbb;
    let arb = act_row_bytes(s.k);
    let tokens = s.tiling.tokens.clamp(1, s.n);
    let full_tiles = s.n / tokens;
    let rem = s.n % tokens;
    let out_row = 4 * s.m; // bytes between tokens in `out`
    let (w, act, out) = (a.w, a.act, a.out);
    // Constants live in registers for the whole kernel (a `vconst` is never folded into
    // the instruction using it).
    let c = Consts {
        mask_0f: e.splat_u8_const(0x0F),
        zero_i8: e.zero(I8X16),
    };
    e.range_loop(a.g_begin, a.g_end, |e, g| {
        let wg = e.offset_ptr(w, g, group_stride);
        let og = e.offset_ptr(out, g, 4 * GROUP_ROWS);
        if full_tiles == 1 {
            emit_tile(e, s, &c, wg, act, og, tokens);
        } else if full_tiles > 1 {
            e.counted_loop(full_tiles, |e, ti| {
                let at = e.offset_ptr(act, ti, tokens * arb);
                let ot = e.offset_ptr(og, ti, tokens * out_row);
                emit_tile(e, s, &c, wg, at, ot, tokens);
            });
        }
        if rem > 0 {
            let at = e.fb.ins().iadd_imm_s(act, (full_tiles * tokens * arb) as i64);
            let ot = e.fb.ins().iadd_imm_s(og, (full_tiles * tokens * out_row) as i64);
            emit_tile(e, s, &c, wg, at, ot, rem);
        }
    });
}

/// Vector constants shared by the whole kernel.
struct Consts {
    mask_0f: Value,
    zero_i8: Value,
}

/// One group of 4 rows × `nt` tokens over all of `k`; stores the `nt` result vectors.
fn emit_tile(
    e: &mut Emit,
    s: &QuantShape,
    c: &Consts,
    wg: Value,
    at: Value,
    ot: Value,
    nt: usize,
) {
    let nb = s.k / QK;
    let gbb = s.fmt.group_block_bytes();
    let arb = act_row_bytes(s.k);
    let unroll = s.tiling.unroll.clamp(1, nb);
    let zero = e.zero(F32X4);
    let acc: Vec<_> = (0..nt).map(|_| e.var(F32X4, zero)).collect();
    let pty = e.fb.func.dfg.value_type(wg);
    let wp = e.var(pty, wg);
    let ap = e.var(pty, at);
    let step = |e: &mut Emit, blocks: usize| {
        for u in 0..blocks {
            let w = e.fb.use_var(wp);
            let a = e.fb.use_var(ap);
            let mut accs: Vec<Value> = acc.iter().map(|&v| e.fb.use_var(v)).collect();
            emit_block(e, &s.fmt, c, w, u * gbb, a, u * ACT_BLOCK_BYTES, arb, &mut accs);
            for (v, x) in acc.iter().zip(accs) {
                e.fb.def_var(*v, x);
            }
        }
        let w = e.fb.use_var(wp);
        let a = e.fb.use_var(ap);
        let w2 = e.fb.ins().iadd_imm_s(w, (blocks * gbb) as i64);
        let a2 = e.fb.ins().iadd_imm_s(a, (blocks * ACT_BLOCK_BYTES) as i64);
        e.fb.def_var(wp, w2);
        e.fb.def_var(ap, a2);
    };
    e.counted_loop(nb / unroll, |e, _| step(e, unroll));
    if nb % unroll > 0 {
        step(e, nb % unroll);
    }
    for (t, v) in acc.iter().enumerate() {
        let x = e.fb.use_var(*v);
        e.store(x, ot, t * 4 * s.m);
    }
}

/// One block of 32 values for 4 rows × `accs.len()` tokens: `w + wo` is the group-block,
/// `a + ao` the first token's activation block, `arb` the activation row stride.
#[allow(clippy::too_many_arguments)]
fn emit_block(
    e: &mut Emit,
    fmt: &QuantFormat,
    consts: &Consts,
    w: Value,
    wo: usize,
    a: Value,
    ao: usize,
    arb: usize,
    accs: &mut [Value],
) {
    let nt = accs.len();
    let qo = wo + fmt.group_qs_offset();
    // the pre-broadcast activation chunk `j` (values 4j..4j+4) of token `t`
    let aq = |t: usize, j: usize| ao + t * arb + ACT_QS_OFFSET + 16 * j;
    // Integer sums per token, one i32 lane per row.
    let mut isum: Vec<Option<Value>> = vec![None; nt];
    if fmt.bits == 4 {
        let mut acc16: Vec<Option<Value>> = vec![None; nt];
        for c in 0..4 {
            let raw = e.load(I8X16, w, qo + 16 * c);
            let lo = e.fb.ins().band(raw, consts.mask_0f);
            let raw16 = e.bitcast(I16X8, raw);
            let sh = e.fb.ins().ushr_imm_u(raw16, 4);
            let sh = e.bitcast(I8X16, sh);
            let hi = e.fb.ins().band(sh, consts.mask_0f);
            for t in 0..nt {
                let alo = e.load(I8X16, a, aq(t, c));
                let plo = e.pmaddubsw(alo, lo);
                let ahi = e.load(I8X16, a, aq(t, 4 + c));
                let phi = e.pmaddubsw(ahi, hi);
                let p = e.fb.ins().iadd(plo, phi);
                acc16[t] = Some(match acc16[t] {
                    None => p,
                    Some(x) => e.fb.ins().iadd(x, p),
                });
            }
        }
        for (t, x) in acc16.into_iter().enumerate() {
            isum[t] = x.map(|x| e.hadd_i16_pairs(x));
        }
    } else {
        for c in 0..8 {
            let wq = e.load(I8X16, w, qo + 16 * c);
            let aw = e.fb.ins().iabs(wq);
            let neg = e.fb.ins().icmp(IntCC::SignedLessThan, wq, consts.zero_i8);
            let mut prods = Vec::with_capacity(nt);
            for t in 0..nt {
                let av = e.load(I8X16, a, aq(t, c));
                let x = e.fb.ins().bxor(av, neg);
                let sa = e.fb.ins().isub(x, neg);
                prods.push(e.pmaddubsw(sa, aw));
            }
            for (t, p) in prods.into_iter().enumerate() {
                let p = e.hadd_i16_pairs(p);
                isum[t] = Some(match isum[t] {
                    None => p,
                    Some(x) => e.fb.ins().iadd(x, p),
                });
            }
        }
    }
    let dw = e.load(F32X4, w, wo);
    let mw = if fmt.has_min {
        Some(e.load(F32X4, w, wo + 16))
    } else {
        None
    };
    for t in 0..nt {
        let Some(mut si) = isum[t] else { continue };
        if fmt.zero_point != 0 {
            // Σ(q - z)·a = Σq·a - z·Σa; `z·Σa` is stored with the activation block.
            let za = e.load(I32X4, a, ao + t * arb + ACT_AUX_OFFSET);
            si = e.fb.ins().isub(si, za);
        }
        let sf = e.fb.ins().fcvt_from_sint(F32X4, si);
        let da = e.load(F32X4, a, ao + t * arb);
        let dd = e.fb.ins().fmul(dw, da);
        let mut acc = e.fb.ins().fma(sf, dd, accs[t]);
        if let Some(mw) = mw {
            let sa = e.load(F32X4, a, ao + t * arb + ACT_AUX_OFFSET);
            acc = e.fb.ins().fma(mw, sa, acc);
        }
        accs[t] = acc;
    }
}
