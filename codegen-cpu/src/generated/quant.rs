//! Generator of quantized matmul kernels (Q4_0, Q4_1, Q8_0 weights × 8-bit activations),
//! driven by a [`QuantFormat`] description.
//!
//! Every output element is computed in the order of llama.cpp's x86 AVX2 kernels
//! (`ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1`, `_q8_0_q8_0` in ggml-cpu/arch/x86/quants.c; the
//! interpreter's `Order::Avx2`, [`ir::ggml::vec_dot_avx2`]), so the results are the same f32
//! values bit for bit, for every shape and tiling:
//!
//! ```text
//! per block of 32 values:
//!   d       = d_w · d_a                                  (f32 multiply)
//!   lane_l  = Σ_{j = 4l..4l+3} (q_w[j] - z) · q_a[j]       (exact, i32; l = 0..8)
//!   acc_l   = fma(d, f32(lane_l), acc_l)
//!   summs   = summs + m_w · s_a                          (Q4_1 only; multiply, then add)
//! result = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
//!          (+ summs for Q4_1)                            (ggml's `hsum_float_8`)
//! ```
//!
//! Here `acc_l` is an f32x4 holding lane `l` of the 4 rows of a repacked group (one row per
//! 32-bit SIMD lane, see [`crate::layout`]): 16-byte chunk `c` of a group-block holds values
//! `4c..4c+4` of the 4 rows (for 4-bit formats: low nibbles, lane `c`; high nibbles, values
//! `16+4c..`, lane `4+c`), so one `pmaddubsw` with the pre-broadcast activation chunk and one
//! `pmaddwd` give `lane_l` of 4 rows, then `cvtdq2ps` and one `vfmadd`.
//!
//! Loop nest of one kernel call (shapes are constants, `g` is runtime):
//!
//! ```text
//! for each chunk of tokens whose activations fit in about 160 KiB (all tokens, mostly)
//!   for each group of 4 rows in g_begin..g_end
//!     n > 1, 4-bit formats: decode the group's nibbles and scales once into a stack scratch
//!     for each tile of T tokens (T = 1 at decode, 2 otherwise; the last tile smaller)
//!       Q4_1: sweep the blocks for summs (one f32x4 per token)
//!       for each pass over a set of 8/T lanes (1 pass for T = 1, 2 for T = 2)
//!         8 accumulators f32x4 (the pass's lanes × the tile's tokens)
//!         for each block b (unrolled by U)
//!           the pass's weight chunks (decoded, or from the scratch), then per token:
//!           d = d_w·d_a; per lane: pmaddubsw, pmaddwd, cvtdq2ps, vfmadd
//!         keep the pass's lane sums (registers for one pass, else a stack slot)
//!       per token: hsum8 (+ summs), store the 4 rows
//! ```
//!
//! Eight accumulators fill the 16 xmm registers with the constants and temporaries, so a
//! tile of T tokens sweeps the blocks once per set of `8/T` lanes (the lanes are independent
//! until the final sum), and the group's weights and the tile's activations stay in L1. The
//! tiling's `groups` is not used by these kernels (one group at a time); `tokens` is rounded
//! to 1, 2 or 4. When the activations of all tokens exceed about 160 KiB (ubatch 64 at
//! k = 1536), the nest runs once per chunk of tokens, so that the activations stay in L2.
//!
//! Cost against ggml's scalar order (one fused multiply-add per block and row), which these
//! kernels followed before: eight `pmaddwd`, `cvtdq2ps` and `vfmadd` per block, row and
//! token instead of one, which no tiling removes (they are per output element). Measured
//! with `kernel-bench` on this project's machine (Zen 3, one thread, in cache): Q4_1
//! {576, 576} decode 15 → 21 µs, ubatch 64 at 34 → 23.5 GMAC/s; SmolLM2-135M Q4_1 end to
//! end (2 threads) tg64 about 157 → 129 t/s, pp512 about 480 → 317 t/s.
//!
//! Integer ranges: a 4-bit product pair is at most 2·15·128 = 3840 in i16; Q4_0 subtracts
//! `8·(a_0 + a_1)` from each pair in i16 (exact). 8-bit products use `|w|` and the sign moved
//! onto the activation, as ggml's `_mm256_sign_epi8` trick does (same saturation), and are
//! widened to i32 right away.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32X4, I16X8, I8X16};
use cranelift_codegen::ir::{InstBuilder, StackSlotData, StackSlotKind, Value};
use cranelift_frontend::Variable;

use super::emit::{Emit, F16Consts};
use super::{KernelArgs, Tiling};
use crate::actq::{act_row_bytes, ACT_AUX_OFFSET, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
use crate::formats::{QuantFormat, GROUP_ROWS, QK};

/// Fixed shape of one generated kernel.
pub(crate) struct QuantShape {
    pub fmt: QuantFormat,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub tiling: Tiling,
}

/// Vector constants shared by the whole kernel.
struct Consts {
    mask_0f: Value,
    /// 8 in every byte (Q4_0's zero point), for formats with one.
    zero_point: Option<Value>,
    zero_i8: Value,
    f16: F16Consts,
    /// The stack scratch a group's decoded weights go to (see [`scratch_block_bytes`]), for
    /// kernels that use it.
    scratch: Option<Value>,
}

/// Activation bytes one pass over the weight rows may stream (about 1/3 of Zen 3's 512 KiB
/// L2): with more tokens than fit, the tokens are cut into chunks, and each chunk makes its
/// own pass over the weight rows (which then come from L3 once per chunk instead of the
/// activations coming from L3 once per group).
const ACT_CHUNK_BYTES: usize = 160 << 10;

/// Largest stack scratch for one group's decoded weights (`k` up to 409 blocks = 13 088
/// values for Q4_1, 455 blocks for Q4_0); kernels for larger `k` decode the weights in every
/// pass.
const SCRATCH_MAX_BYTES: usize = 64 << 10;

/// Bytes per block of the decoded-weights scratch (4-bit formats, `n > 1`): the 8 lanes'
/// unsigned quants (16 bytes each: lane `l` at `16·l`, the low nibbles of chunk `l` for
/// `l < 4`, the high nibbles of chunk `l - 4` else), then `d` of the 4 rows as f32x4, then
/// (Q4_1) `m` as f32x4.
fn scratch_block_bytes(fmt: &QuantFormat) -> usize {
    128 + 16 + if fmt.has_min { 16 } else { 0 }
}

/// Emits the body of a quantized matmul kernel (see the module doc).
pub(crate) fn emit(e: &mut Emit, a: &KernelArgs, s: &QuantShape) {
    let arb = act_row_bytes(s.k);
    let chunk = (ACT_CHUNK_BYTES / arb).clamp(1, s.n);
    // Constants live in registers for the whole kernel (a `vconst` is never folded into
    // the instruction using it).
    let c = Consts {
        mask_0f: e.splat_u8_const(0x0F),
        zero_point: (s.fmt.zero_point != 0).then(|| e.splat_u8_const(s.fmt.zero_point as u8)),
        zero_i8: e.zero(I8X16),
        f16: e.f16_consts(),
        scratch: None,
    };
    let nb = s.k / QK;
    let sbb = scratch_block_bytes(&s.fmt);
    let c = if s.fmt.bits == 4 && s.n > 1 && nb * sbb <= SCRATCH_MAX_BYTES {
        let slot = e.fb.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (nb * sbb) as u32,
            4,
        ));
        let pty = e.fb.func.dfg.value_type(a.w);
        Consts {
            scratch: Some(e.fb.ins().stack_addr(pty, slot, 0)),
            ..c
        }
    } else {
        c
    };
    for_token_chunks(e, a, s, chunk, |e, act, out, n| {
        emit_rows(e, a, s, &c, act, out, n)
    });
}

/// Emits `body(act, out, n)` for the tokens of a kernel call cut into chunks of `chunk`
/// tokens (a loop over the whole chunks, then the remainder): `act` and `out` point at the
/// chunk's first activation row and output row. Shared by both quantized kernel orders.
pub(crate) fn for_token_chunks(
    e: &mut Emit,
    a: &KernelArgs,
    s: &QuantShape,
    chunk: usize,
    mut body: impl FnMut(&mut Emit, Value, Value, usize),
) {
    let arb = act_row_bytes(s.k);
    let full_chunks = s.n / chunk;
    let rem = s.n % chunk;
    if full_chunks == 1 {
        body(e, a.act, a.out, chunk);
    } else if full_chunks > 1 {
        e.counted_loop(full_chunks, |e, ci| {
            let act = e.offset_ptr(a.act, ci, chunk * arb);
            let out = e.offset_ptr(a.out, ci, chunk * 4 * s.m);
            body(e, act, out, chunk);
        });
    }
    if rem > 0 {
        let act =
            e.fb.ins()
                .iadd_imm_s(a.act, (full_chunks * chunk * arb) as i64);
        let out =
            e.fb.ins()
                .iadd_imm_s(a.out, (full_chunks * chunk * 4 * s.m) as i64);
        body(e, act, out, rem);
    }
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
    let arb = act_row_bytes(s.k);
    let out_row = 4 * s.m; // bytes between tokens in `out`
    let tokens = tile_tokens(s.tiling.tokens).min(n);
    let full_tiles = n / tokens;
    let rem = n % tokens;
    let w = a.w;
    e.range_loop(a.g_begin, a.g_end, |e, g| {
        let wg = e.offset_ptr(w, g, gstride);
        let og = e.offset_ptr(out, g, 4 * GROUP_ROWS);
        let wg = match c.scratch {
            Some(sp) => {
                emit_predecode(e, s, c, wg, sp);
                sp
            }
            None => wg,
        };
        if full_tiles == 1 {
            emit_tile(e, s, c, wg, act, og, tokens);
        } else if full_tiles > 1 {
            e.counted_loop(full_tiles, |e, ti| {
                let at = e.offset_ptr(act, ti, tokens * arb);
                let ot = e.offset_ptr(og, ti, tokens * out_row);
                emit_tile(e, s, c, wg, at, ot, tokens);
            });
        }
        if rem > 0 {
            let at =
                e.fb.ins()
                    .iadd_imm_s(act, (full_tiles * tokens * arb) as i64);
            let ot =
                e.fb.ins()
                    .iadd_imm_s(og, (full_tiles * tokens * out_row) as i64);
            emit_tile(e, s, c, wg, at, ot, rem);
        }
    });
}

/// Decodes the group at `wg` into the scratch at `sp` (layout: [`scratch_block_bytes`]).
fn emit_predecode(e: &mut Emit, s: &QuantShape, c: &Consts, wg: Value, sp: Value) {
    let nb = s.k / QK;
    let gbb = s.fmt.group_block_bytes();
    let sbb = scratch_block_bytes(&s.fmt);
    let qo = s.fmt.group_qs_offset();
    let pty = e.fb.func.dfg.value_type(wg);
    let wp = e.var(pty, wg);
    let dp = e.var(pty, sp);
    e.counted_loop(nb, |e, _| {
        let w = e.fb.use_var(wp);
        let d = e.fb.use_var(dp);
        let dw = e.f16x4_to_f32x4(w, 0, &c.f16);
        e.store(dw, d, 128);
        if s.fmt.has_min {
            let mw = e.f16x4_to_f32x4(w, 8, &c.f16);
            e.store(mw, d, 144);
        }
        for ch in 0..4 {
            let (lo, hi) = nibbles(e, c, w, qo + 16 * ch);
            e.store(lo, d, 16 * ch);
            e.store(hi, d, 16 * (4 + ch));
        }
        let w2 = e.fb.ins().iadd_imm_s(w, gbb as i64);
        let d2 = e.fb.ins().iadd_imm_s(d, sbb as i64);
        e.fb.def_var(wp, w2);
        e.fb.def_var(dp, d2);
    });
}

/// The low and high nibbles of the 16 bytes at `w + off`, as u8x16.
fn nibbles(e: &mut Emit, c: &Consts, w: Value, off: usize) -> (Value, Value) {
    let raw = e.load(I8X16, w, off);
    let lo = e.fb.ins().band(raw, c.mask_0f);
    let raw16 = e.bitcast(I16X8, raw);
    let sh = e.fb.ins().ushr_imm_u(raw16, 4);
    let sh = e.bitcast(I8X16, sh);
    let hi = e.fb.ins().band(sh, c.mask_0f);
    (lo, hi)
}

/// Tokens per tile for a tiling's `tokens`: 1, 2 or 4 (the lanes of one pass over the
/// blocks are `8 / tokens`).
fn tile_tokens(t: usize) -> usize {
    match t {
        0 | 1 => 1,
        2 | 3 => 2,
        _ => 4,
    }
}

/// One group of 4 rows at `wg` × `nt` (1..=4) tokens at `at` over all of `k`; stores the 4
/// results of each token at `ot` (tokens `4·m` bytes apart).
///
/// The `8·nt` lane accumulators do not all fit in registers for `nt > 1`, but the lanes are
/// independent until the final sum: the blocks are swept once per set of `8 / nt'` lanes
/// (`nt'` = `nt` rounded up to a power of two), each sweep decoding its chunks of the
/// group's weights once for all tokens (the group's weights and the tile's activations stay
/// in L1). Q4_1's `m·s` sums take their own sweep when `nt > 1`.
fn emit_tile(e: &mut Emit, s: &QuantShape, c: &Consts, wg: Value, at: Value, ot: Value, nt: usize) {
    let nb = s.k / QK;
    // `wg` is the group's weights, or their decoded copy in the scratch
    let gbb = match c.scratch {
        Some(_) => scratch_block_bytes(&s.fmt),
        None => s.fmt.group_block_bytes(),
    };
    let arb = act_row_bytes(s.k);
    let unroll = s.tiling.unroll.clamp(1, nb);
    let lanes_per_pass = 8 / nt.next_power_of_two();
    // chunks (16 bytes of each row) per pass: a 4-bit chunk feeds lanes c and 4 + c
    let chunks_per_pass = if s.fmt.bits == 4 {
        lanes_per_pass / 2
    } else {
        lanes_per_pass
    };
    let n_chunks = if s.fmt.bits == 4 { 4 } else { 8 };
    let n_pass = n_chunks / chunks_per_pass;
    let pty = e.fb.func.dfg.value_type(wg);
    let sweep = |e: &mut Emit, body: &dyn Fn(&mut Emit, &Blk)| {
        let wp = e.var(pty, wg);
        let ap = e.var(pty, at);
        let step = |e: &mut Emit, blocks: usize| {
            let w = e.fb.use_var(wp);
            let a = e.fb.use_var(ap);
            for u in 0..blocks {
                let blk = Blk {
                    w,
                    wo: u * gbb,
                    a,
                    ao: u * ACT_BLOCK_BYTES,
                    arb,
                };
                body(e, &blk);
            }
            let w2 = e.fb.ins().iadd_imm_s(w, (blocks * gbb) as i64);
            let a2 = e.fb.ins().iadd_imm_s(a, (blocks * ACT_BLOCK_BYTES) as i64);
            e.fb.def_var(wp, w2);
            e.fb.def_var(ap, a2);
        };
        e.counted_loop(nb / unroll, |e, _| step(e, unroll));
        if !nb.is_multiple_of(unroll) {
            step(e, nb % unroll);
        }
    };
    // Q4_1's m·s sums: one accumulator per token, in a sweep of their own (fewer live
    // registers in the lane sweeps)
    let summs: Vec<Value> = if s.fmt.has_min {
        let zero = e.zero(F32X4);
        let vars: Vec<Variable> = (0..nt).map(|_| e.var(F32X4, zero)).collect();
        sweep(e, &|e, blk| emit_summs(e, c, blk, &vars));
        vars.iter().map(|&v| e.fb.use_var(v)).collect()
    } else {
        Vec::new()
    };
    // Lane sums of finished passes wait in a stack slot (token t, lane l at 16·(8t + l)).
    let slot = (n_pass > 1).then(|| {
        e.fb.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (16 * 8 * nt) as u32,
            4,
        ))
    });
    let mut lanes: Vec<Vec<Option<Value>>> = vec![vec![None; 8]; nt];
    for p in 0..n_pass {
        let chunks: Vec<usize> = (p * chunks_per_pass..(p + 1) * chunks_per_pass).collect();
        let pass_lanes: Vec<usize> = if s.fmt.bits == 4 {
            chunks.iter().flat_map(|&c| [c, 4 + c]).collect()
        } else {
            chunks.clone()
        };
        let zero = e.zero(F32X4);
        let acc: Vec<Vec<Option<Variable>>> = (0..nt)
            .map(|_| {
                (0..8)
                    .map(|l| pass_lanes.contains(&l).then(|| e.var(F32X4, zero)))
                    .collect()
            })
            .collect();
        sweep(e, &|e, blk| emit_block(e, &s.fmt, c, blk, &chunks, &acc));
        for (t, acc) in acc.iter().enumerate() {
            for (l, v) in acc.iter().enumerate() {
                if let Some(v) = v {
                    let x = e.fb.use_var(*v);
                    match slot {
                        Some(ss) => {
                            e.fb.ins()
                                .stack_store(pty, x, ss, (16 * (8 * t + l)) as i32);
                        }
                        None => lanes[t][l] = Some(x),
                    }
                }
            }
        }
    }
    for (t, kept) in lanes.iter().enumerate() {
        // ggml's hsum_float_8: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
        let x: Vec<Value> = (0..8)
            .map(|l| match (kept[l], slot) {
                (Some(v), _) => v,
                (None, Some(ss)) => {
                    e.fb.ins()
                        .stack_load(pty, F32X4, ss, (16 * (8 * t + l)) as i32)
                }
                (None, None) => unreachable!("every lane is summed in some pass"),
            })
            .collect();
        let r04 = e.fb.ins().fadd(x[0], x[4]);
        let r26 = e.fb.ins().fadd(x[2], x[6]);
        let r15 = e.fb.ins().fadd(x[1], x[5]);
        let r37 = e.fb.ins().fadd(x[3], x[7]);
        let lo = e.fb.ins().fadd(r04, r26);
        let hi = e.fb.ins().fadd(r15, r37);
        let mut r = e.fb.ins().fadd(lo, hi);
        if let Some(&sm) = summs.get(t) {
            r = e.fb.ins().fadd(r, sm);
        }
        e.store(r, ot, t * 4 * s.m);
    }
}

/// Where one block step reads: the group-block at `w + wo`, token `t`'s activation block at
/// `a + ao + t·arb`.
struct Blk {
    w: Value,
    wo: usize,
    a: Value,
    ao: usize,
    arb: usize,
}

/// Q4_1's `summs_t += m_w · s_a` (a multiply, then an add, as ggml) for each token `t`.
fn emit_summs(e: &mut Emit, c: &Consts, b: &Blk, summs: &[Variable]) {
    let mw = match c.scratch {
        Some(_) => e.load(F32X4, b.w, b.wo + 144),
        None => e.f16x4_to_f32x4(b.w, b.wo + 8, &c.f16),
    };
    for (t, &sm) in summs.iter().enumerate() {
        let sa = e.load(F32X4, b.a, b.ao + t * b.arb + ACT_AUX_OFFSET);
        let p = e.fb.ins().fmul(mw, sa);
        let x = e.fb.use_var(sm);
        let x = e.fb.ins().fadd(x, p);
        e.fb.def_var(sm, x);
    }
}

/// One block of 32 values of one group and the tile's tokens (`acc[t]`, 8 lane
/// accumulators each), for the 16-byte weight chunks `chunks` only (see [`emit_tile`]).
fn emit_block(
    e: &mut Emit,
    fmt: &QuantFormat,
    c: &Consts,
    b: &Blk,
    chunks: &[usize],
    acc: &[Vec<Option<Variable>>],
) {
    let (w, a) = (b.w, b.a);
    let qo = b.wo + fmt.group_qs_offset();
    // token t's pre-broadcast activation chunk `l` (values 4l..4l+4)
    let aq = |t: usize, l: usize| b.ao + t * b.arb + ACT_QS_OFFSET + 16 * l;
    let dw = match c.scratch {
        Some(_) => e.load(F32X4, w, b.wo + 128),
        None => e.f16x4_to_f32x4(w, b.wo, &c.f16),
    };
    // d_t = d_w · d_a: computed once per block and token when several chunks use it
    let dt = |e: &mut Emit, t: usize| {
        let da = e.load(F32X4, a, b.ao + t * b.arb);
        e.fb.ins().fmul(dw, da)
    };
    let pre: Vec<Value> = if chunks.len() > 1 {
        (0..acc.len()).map(|t| dt(e, t)).collect()
    } else {
        Vec::new()
    };
    // lane l of the 4 rows: i16 pair sums → i32 → f32 → acc_l = fma(d, lane, acc_l)
    let finish = |e: &mut Emit, t: usize, l: usize, d: Value, p16: Value| {
        let li = e.hadd_i16_pairs(p16);
        let lf = e.fb.ins().fcvt_from_sint(F32X4, li);
        let Some(v) = acc[t][l] else {
            unreachable!("lane {l} is not in this pass")
        };
        let x = e.fb.use_var(v);
        let x = e.fb.ins().fma(lf, d, x);
        e.fb.def_var(v, x);
    };
    for &ch in chunks {
        if fmt.bits == 4 {
            let (lo, hi) = match c.scratch {
                Some(_) => (
                    e.load(I8X16, w, b.wo + 16 * ch),
                    e.load(I8X16, w, b.wo + 16 * (4 + ch)),
                ),
                None => nibbles(e, c, w, qo + 16 * ch),
            };
            for t in 0..acc.len() {
                let d = match pre.get(t) {
                    Some(&d) => d,
                    None => dt(e, t),
                };
                for (l, nib) in [(ch, lo), (4 + ch, hi)] {
                    let av = e.load(I8X16, a, aq(t, l));
                    let p = e.pmaddubsw(av, nib);
                    let p = match c.zero_point {
                        None => p,
                        Some(z) => {
                            // Σ(q - z)·a = Σq·a - z·Σa, per pair in i16 (exact)
                            let pz = e.pmaddubsw(av, z);
                            let p = e.bitcast(I16X8, p);
                            let pz = e.bitcast(I16X8, pz);
                            e.fb.ins().isub(p, pz)
                        }
                    };
                    finish(e, t, l, d, p);
                }
            }
        } else {
            let wq = e.load(I8X16, w, qo + 16 * ch);
            let aw = e.fb.ins().iabs(wq);
            let neg = e.fb.ins().icmp(IntCC::SignedLessThan, wq, c.zero_i8);
            for t in 0..acc.len() {
                let d = match pre.get(t) {
                    Some(&d) => d,
                    None => dt(e, t),
                };
                let av = e.load(I8X16, a, aq(t, ch));
                let x = e.fb.ins().bxor(av, neg);
                let sa = e.fb.ins().isub(x, neg);
                let p = e.pmaddubsw(sa, aw);
                finish(e, t, ch, d, p);
            }
        }
    }
}
