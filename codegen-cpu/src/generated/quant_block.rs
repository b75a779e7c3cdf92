//! Generator of quantized matmul kernels in the block order ([`super::SumOrder::Block`]):
//! Q4_0, Q4_1, Q8_0 weights × 8-bit activations, driven by a [`QuantFormat`] description.
//! The default kernels (module `quant`) follow llama.cpp's x86 order bit for bit; these
//! trade that for about 1.4× less vector work per weight byte (`--sum-order block`).
//!
//! Per output row and block of 32 values (ggml's scalar order, `ggml_vec_dot_q4_1_q8_1`
//! without SIMD):
//!
//! ```text
//! sumi  = Σ_j q_w[j] · q_a[j]            (exact, in integers; q_w - z for a zero point z)
//! acc  += (d_w · d_a) · sumi  (+ m_w · s_a for Q4_1)
//! ```
//!
//! Loop nest of one kernel call (shapes are constants, `g` is runtime):
//!
//! ```text
//! for G groups of 4 rows at a time in g_begin..g_end (then single groups for the rest)
//!   for each tile of T tokens             G·T accumulators f32x4 (one lane per row)
//!     for each block b (unrolled by U)
//!       decode the G·4 rows' quants once (16-byte chunks: and / shift)
//!       for each token t: load each pre-broadcast activation chunk once, pmaddubsw it
//!         with the G weight vectors, sum in i16
//!       per group and token: pmaddwd → i32, correct for the zero point, cvt → f32,
//!         fma with d_w·d_a (and m_w·s_a)
//!     store the G·T vectors of 4 rows
//! ```
//!
//! G > 1 shares the activation loads between groups, T > 1 shares the decoded weights
//! between tokens (prompt processing, which is compute-bound). When the activations of all
//! tokens exceed about 160 KiB (ubatch 64 at k = 1536), the whole nest runs once per chunk
//! of tokens, so that the activations stay in L2.
//!
//! i16 headroom: a 4-bit product pair is at most 2·15·128 = 3840 and 8 chunks are summed
//! (30720 < 32767); 8-bit products use `|w|` and the sign moved onto the activation and are
//! widened to i32 after every chunk (2·128·127 = 32512).

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32X4, I16X8, I32X4, I8X16};
use cranelift_codegen::ir::{InstBuilder, Value};

use super::emit::{Emit, F16Consts};
use super::quant::{for_token_chunks, QuantShape};
use super::KernelArgs;
use crate::actq::{act_row_bytes, ACT_AUX_OFFSET, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
use crate::formats::{QuantFormat, GROUP_ROWS, QK};

/// Vector constants shared by the whole kernel.
struct Consts {
    mask_0f: Value,
    zero_i8: Value,
    f16: F16Consts,
}

/// Where a tile reads and writes: `ng` groups from `wg` (`gstride` bytes apart), `nt`
/// tokens from `at` (`arb` bytes apart), results from `ot`.
struct Tile {
    wg: Value,
    at: Value,
    ot: Value,
    ng: usize,
    nt: usize,
}

/// Activation bytes one pass over the weight rows may stream (about 1/3 of Zen 3's 512 KiB
/// L2): with more tokens than fit, the tokens are cut into chunks, and each chunk makes its
/// own pass over the weight rows (which then come from L3 once per chunk instead of the
/// activations coming from L3 once per group).
const ACT_CHUNK_BYTES: usize = 160 << 10;

/// Emits the body of a quantized matmul kernel (see the module doc).
pub(crate) fn emit(e: &mut Emit, a: &KernelArgs, s: &QuantShape) {
    let arb = act_row_bytes(s.k);
    let tokens = s.tiling.tokens.clamp(1, s.n);
    // tokens per chunk: a multiple of the tile, at least one tile
    let chunk = ((ACT_CHUNK_BYTES / arb) / tokens * tokens)
        .max(tokens)
        .min(s.n);
    // Constants live in registers for the whole kernel (a `vconst` is never folded into
    // the instruction using it).
    let c = Consts {
        mask_0f: e.splat_u8_const(0x0F),
        zero_i8: e.zero(I8X16),
        f16: e.f16_consts(),
    };
    for_token_chunks(e, a, s, chunk, |e, act, out, n| {
        emit_rows(e, a, s, &c, act, out, n)
    });
}

/// The groups `g_begin..g_end` for `n` tokens of activations at `act`, results at `out`.
fn emit_rows(
    e: &mut Emit,
    a: &KernelArgs,
    s: &QuantShape,
    c: &Consts,
    act: Value,
    out: Value,
    n: usize,
) {
    let nb = s.k / QK;
    let gstride = nb * s.fmt.group_block_bytes();
    let ng = s.tiling.groups.max(1);
    let (w, g_end) = (a.w, a.g_end);
    let g = if ng > 1 {
        e.strided_loop(a.g_begin, g_end, ng, |e, g| {
            let wg = e.offset_ptr(w, g, gstride);
            let og = e.offset_ptr(out, g, 4 * GROUP_ROWS);
            emit_token_tiles(e, s, c, wg, act, og, ng, n);
        })
    } else {
        a.g_begin
    };
    e.range_loop(g, g_end, |e, g| {
        let wg = e.offset_ptr(w, g, gstride);
        let og = e.offset_ptr(out, g, 4 * GROUP_ROWS);
        emit_token_tiles(e, s, c, wg, act, og, 1, n);
    });
}

/// `n` tokens for `ng` groups starting at `wg`: full tiles of `tokens`, then the rest.
#[allow(clippy::too_many_arguments)]
fn emit_token_tiles(
    e: &mut Emit,
    s: &QuantShape,
    c: &Consts,
    wg: Value,
    act: Value,
    og: Value,
    ng: usize,
    n: usize,
) {
    let arb = act_row_bytes(s.k);
    let tokens = s.tiling.tokens.clamp(1, n);
    let full_tiles = n / tokens;
    let rem = n % tokens;
    let out_row = 4 * s.m; // bytes between tokens in `out`
    let tile = |at, ot, nt| Tile { wg, at, ot, ng, nt };
    if full_tiles == 1 {
        emit_tile(e, s, c, &tile(act, og, tokens));
    } else if full_tiles > 1 {
        e.counted_loop(full_tiles, |e, ti| {
            let at = e.offset_ptr(act, ti, tokens * arb);
            let ot = e.offset_ptr(og, ti, tokens * out_row);
            emit_tile(e, s, c, &tile(at, ot, tokens));
        });
    }
    if rem > 0 {
        let at =
            e.fb.ins()
                .iadd_imm_s(act, (full_tiles * tokens * arb) as i64);
        let ot =
            e.fb.ins()
                .iadd_imm_s(og, (full_tiles * tokens * out_row) as i64);
        emit_tile(e, s, c, &tile(at, ot, rem));
    }
}

/// `ng` groups of 4 rows × `nt` tokens over all of `k`; stores the `ng·nt` result vectors.
fn emit_tile(e: &mut Emit, s: &QuantShape, c: &Consts, tile: &Tile) {
    let nb = s.k / QK;
    let gbb = s.fmt.group_block_bytes();
    let gstride = nb * gbb;
    let arb = act_row_bytes(s.k);
    let (ng, nt) = (tile.ng, tile.nt);
    let unroll = s.tiling.unroll.clamp(1, nb);
    let zero = e.zero(F32X4);
    // Accumulators, indexed `(kind·ng + group)·nt + token`: kind 0 sums the `d` terms, kind
    // 1 (formats with a minimum, small tiles) the `m` terms: two short FMA chains instead of
    // one long one where there are few chains; with more, registers are the scarcer thing.
    let n_kind = if s.fmt.has_min && ng * nt <= 2 { 2 } else { 1 };
    let acc: Vec<_> = (0..n_kind * ng * nt).map(|_| e.var(F32X4, zero)).collect();
    let pty = e.fb.func.dfg.value_type(tile.wg);
    let wp = e.var(pty, tile.wg);
    let ap = e.var(pty, tile.at);
    let step = |e: &mut Emit, blocks: usize| {
        for u in 0..blocks {
            let w = e.fb.use_var(wp);
            let a = e.fb.use_var(ap);
            let mut accs: Vec<Value> = acc.iter().map(|&v| e.fb.use_var(v)).collect();
            let blk = Block {
                w,
                wo: u * gbb,
                gstride,
                ng,
                a,
                ao: u * ACT_BLOCK_BYTES,
                arb,
                nt,
                split_min: n_kind == 2,
            };
            emit_block(e, &s.fmt, c, &blk, &mut accs);
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
    if !nb.is_multiple_of(unroll) {
        step(e, nb % unroll);
    }
    for j in 0..ng {
        for t in 0..nt {
            let mut x = e.fb.use_var(acc[j * nt + t]);
            if n_kind == 2 {
                let y = e.fb.use_var(acc[(ng + j) * nt + t]);
                x = e.fb.ins().fadd(x, y);
            }
            e.store(x, tile.ot, j * 4 * GROUP_ROWS + t * 4 * s.m);
        }
    }
}

/// The operands of one block step: group `j`'s group-block is at `w + wo + j·gstride`,
/// token `t`'s activation block at `a + ao + t·arb`.
struct Block {
    w: Value,
    wo: usize,
    gstride: usize,
    ng: usize,
    a: Value,
    ao: usize,
    arb: usize,
    nt: usize,
    /// The `m` terms go to their own accumulators (kind 1) rather than with the `d` terms.
    split_min: bool,
}

/// One block of 32 values for `ng` groups × `nt` tokens, accumulated into `accs` (indexed
/// as in `emit_tile`).
fn emit_block(e: &mut Emit, fmt: &QuantFormat, consts: &Consts, b: &Block, accs: &mut [Value]) {
    let (ng, nt) = (b.ng, b.nt);
    let wo = |j: usize| b.wo + j * b.gstride;
    let qo = |j: usize| wo(j) + fmt.group_qs_offset();
    // the pre-broadcast activation chunk `c` (values 4c..4c+4) of token `t`
    let aq = |t: usize, c: usize| b.ao + t * b.arb + ACT_QS_OFFSET + 16 * c;
    let a = b.a;
    // Integer sums per group and token (index `j·nt + t`), one i32 lane per row.
    let mut isum: Vec<Option<Value>> = vec![None; ng * nt];
    if fmt.bits == 4 {
        let mut acc16: Vec<Option<Value>> = vec![None; ng * nt];
        for c in 0..4 {
            let mut lo = Vec::with_capacity(ng);
            let mut hi = Vec::with_capacity(ng);
            for j in 0..ng {
                let raw = e.load(I8X16, b.w, qo(j) + 16 * c);
                lo.push(e.fb.ins().band(raw, consts.mask_0f));
                let raw16 = e.bitcast(I16X8, raw);
                let sh = e.fb.ins().ushr_imm_u(raw16, 4);
                let sh = e.bitcast(I8X16, sh);
                hi.push(e.fb.ins().band(sh, consts.mask_0f));
            }
            for t in 0..nt {
                let alo = e.load(I8X16, a, aq(t, c));
                let ahi = e.load(I8X16, a, aq(t, 4 + c));
                for j in 0..ng {
                    let plo = e.pmaddubsw(alo, lo[j]);
                    let phi = e.pmaddubsw(ahi, hi[j]);
                    let p = e.fb.ins().iadd(plo, phi);
                    let acc = &mut acc16[j * nt + t];
                    *acc = Some(match *acc {
                        None => p,
                        Some(x) => e.fb.ins().iadd(x, p),
                    });
                }
            }
        }
        for (i, x) in acc16.into_iter().enumerate() {
            isum[i] = x.map(|x| e.hadd_i16_pairs(x));
        }
    } else {
        for c in 0..8 {
            let mut aw = Vec::with_capacity(ng);
            let mut neg = Vec::with_capacity(ng);
            for j in 0..ng {
                let wq = e.load(I8X16, b.w, qo(j) + 16 * c);
                aw.push(e.fb.ins().iabs(wq));
                neg.push(e.fb.ins().icmp(IntCC::SignedLessThan, wq, consts.zero_i8));
            }
            for t in 0..nt {
                let av = e.load(I8X16, a, aq(t, c));
                for j in 0..ng {
                    let x = e.fb.ins().bxor(av, neg[j]);
                    let sa = e.fb.ins().isub(x, neg[j]);
                    let p = e.pmaddubsw(sa, aw[j]);
                    let p = e.hadd_i16_pairs(p);
                    let sum = &mut isum[j * nt + t];
                    *sum = Some(match *sum {
                        None => p,
                        Some(x) => e.fb.ins().iadd(x, p),
                    });
                }
            }
        }
    }
    let dw: Vec<Value> = (0..ng)
        .map(|j| e.f16x4_to_f32x4(b.w, wo(j), &consts.f16))
        .collect();
    let mw: Vec<Value> = if fmt.has_min {
        (0..ng)
            .map(|j| e.f16x4_to_f32x4(b.w, wo(j) + 8, &consts.f16))
            .collect()
    } else {
        Vec::new()
    };
    for t in 0..nt {
        let ab = b.ao + t * b.arb;
        let da = e.load(F32X4, a, ab);
        let za = if fmt.zero_point != 0 {
            // Σ(q - z)·a = Σq·a - z·Σa; `z·Σa` is stored with the activation block.
            Some(e.load(I32X4, a, ab + ACT_AUX_OFFSET))
        } else {
            None
        };
        for j in 0..ng {
            let Some(mut si) = isum[j * nt + t] else {
                continue;
            };
            if let Some(za) = za {
                si = e.fb.ins().isub(si, za);
            }
            let sf = e.fb.ins().fcvt_from_sint(F32X4, si);
            let dd = e.fb.ins().fmul(dw[j], da);
            let i = j * nt + t;
            accs[i] = e.fb.ins().fma(sf, dd, accs[i]);
        }
        if fmt.has_min {
            let sa = e.load(F32X4, a, ab + ACT_AUX_OFFSET);
            for (j, &m) in mw.iter().enumerate() {
                let i = if b.split_min {
                    (ng + j) * nt + t
                } else {
                    j * nt + t
                };
                accs[i] = e.fb.ins().fma(m, sa, accs[i]);
            }
        }
    }
}
