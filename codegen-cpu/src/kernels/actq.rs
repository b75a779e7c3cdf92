//! Generator of the activation quantizer: f32 values to the pre-broadcast 8-bit blocks of
//! [`crate::actq`], the same bytes as [`crate::actq::quantize_act`] (the plain-Rust
//! reference it is tested against), for one [`QuantFormat`].
//!
//! Signature (System V): `fn(x: *const f32, out: *mut u8, n_blocks: i64)`; block `b` reads
//! `x[32b..32b+32]` and writes `out[160b..160b+160]`.
//!
//! Per block, as ggml's x86 `quantize_row_q8_0/q8_1`: `amax` (an unsigned integer max of the
//! absolute values' bits, the same order as the floats for non-NaN values), `d = amax/127`,
//! `id = 127/amax` (0 when `amax` is 0), `q = cvtt(round_half_even(x·id))`, packed with
//! signed saturation; `d` and `s = d·Σq` rounded to f16 precision with integer arithmetic
//! (Cranelift has no f16 conversion), `z·Σq` for a zero point `z`.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32X4, I16X8, I32X4, I64, I8X16};
use cranelift_codegen::ir::{Function, InstBuilder, UserFuncName, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

use crate::actq::{ACT_AUX_OFFSET, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
use crate::emit::Emit;
use crate::formats::{ActKind, QuantFormat, QK};
use crate::jit::Jit;

/// Builds the quantizer function for `fmt`.
pub(crate) fn build(jit: &Jit, fmt: &QuantFormat) -> Function {
    let ptr = jit.pointer_type();
    let sig = jit.signature(&[ptr, ptr, I64]);
    let mut func = Function::with_name_signature(UserFuncName::default(), sig);
    let mut fctx = FunctionBuilderContext::new();
    {
        let fb = FunctionBuilder::new(&mut func, &mut fctx);
        let mut e = Emit::new(fb);
        let entry = e.fb.create_block();
        e.fb.append_block_params_for_function_params(entry);
        e.fb.switch_to_block(entry);
        e.fb.seal_block(entry);
        let p = e.fb.block_params(entry).to_vec();
        let (x, out, n) = (p[0], p[1], p[2]);
        let zero = e.fb.ins().iconst(I64, 0);
        e.range_loop(zero, n, |e, b| {
            let xb = e.offset_ptr(x, b, QK * 4);
            let ob = e.offset_ptr(out, b, ACT_BLOCK_BYTES);
            emit_block(e, fmt, xb, ob);
        });
        e.ret();
        e.fb.finalize(jit.frontend_config());
    }
    func
}

fn splat_u32(e: &mut Emit, v: u32) -> Value {
    let mut b = [0u8; 16];
    for c in b.chunks_exact_mut(4) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    e.vconst(I32X4, b)
}

fn splat_f32(e: &mut Emit, v: f32) -> Value {
    let c = splat_u32(e, v.to_bits());
    e.bitcast(F32X4, c)
}

/// All four lanes = the unsigned max (`op` = umax) or sum (`op` = iadd) over the lanes.
fn horizontal(e: &mut Emit, v: Value, max: bool) -> Value {
    let s1 = lane_swap(e, v, [2, 3, 0, 1]);
    let v = if max {
        e.fb.ins().umax(v, s1)
    } else {
        e.fb.ins().iadd(v, s1)
    };
    let s2 = lane_swap(e, v, [1, 0, 3, 2]);
    if max {
        e.fb.ins().umax(v, s2)
    } else {
        e.fb.ins().iadd(v, s2)
    }
}

/// 32-bit lane permutation (`pshufd`).
fn lane_swap(e: &mut Emit, v: Value, lanes: [usize; 4]) -> Value {
    let b = e.bitcast(I8X16, v);
    let mut mask = [0u8; 16];
    for (i, m) in mask.iter_mut().enumerate() {
        *m = (4 * lanes[i / 4] + i % 4) as u8;
    }
    let imm = e.fb.func.dfg.immediates.push(mask.to_vec().into());
    let r = e.fb.ins().shuffle(b, b, imm);
    e.bitcast(I32X4, r)
}

/// `x` (f32x4, finite or not) rounded to the nearest f16 value (ties to even), as f32:
/// what `f16::from_f32(x).to_f32()` gives, including f16 subnormals, overflow to infinity
/// and NaN staying NaN.
fn round_to_f16(e: &mut Emit, x: Value) -> Value {
    let bits = e.bitcast(I32X4, x);
    let sign_mask = splat_u32(e, 0x8000_0000);
    let sign = e.fb.ins().band(bits, sign_mask);
    let abs_mask = splat_u32(e, 0x7fff_ffff);
    let ab = e.fb.ins().band(bits, abs_mask);
    // normal f16 range: round the f32 mantissa to 10 bits, ties to even
    let odd = e.fb.ins().ushr_imm_u(ab, 13);
    let one = splat_u32(e, 1);
    let odd = e.fb.ins().band(odd, one);
    let bias = splat_u32(e, 0xfff);
    let r = e.fb.ins().iadd(ab, bias);
    let r = e.fb.ins().iadd(r, odd);
    let keep = splat_u32(e, 0xffff_e000);
    let r = e.fb.ins().band(r, keep);
    // below 2^-14 (f16 subnormals): round to a multiple of 2^-24 by adding 0.5 (whose ulp
    // is 2^-24) and subtracting it again
    let abf = e.bitcast(F32X4, ab);
    let half = splat_f32(e, 0.5);
    let t = e.fb.ins().fadd(abf, half);
    let half = splat_f32(e, 0.5);
    let t = e.fb.ins().fsub(t, half);
    let sub = e.bitcast(I32X4, t);
    let min_normal = splat_u32(e, 0x3880_0000);
    let is_sub = e.fb.ins().icmp(IntCC::SignedLessThan, ab, min_normal);
    let r = e.fb.ins().bitselect(is_sub, sub, r);
    // beyond the largest f16 (65504) after rounding: infinity; NaN stays as it was
    let max_f16 = splat_u32(e, 0x477f_e000);
    let ovf = e.fb.ins().icmp(IntCC::SignedGreaterThan, r, max_f16);
    let inf = splat_u32(e, 0x7f80_0000);
    let r = e.fb.ins().bitselect(ovf, inf, r);
    let is_nan = e.fb.ins().icmp(IntCC::SignedGreaterThan, ab, inf);
    let r = e.fb.ins().bitselect(is_nan, ab, r);
    let r = e.fb.ins().bor(r, sign);
    e.bitcast(F32X4, r)
}

fn emit_block(e: &mut Emit, fmt: &QuantFormat, x: Value, out: Value) {
    let v: Vec<Value> = (0..8).map(|i| e.load(F32X4, x, 16 * i)).collect();
    // amax over the block, in all lanes
    let abs_mask = splat_u32(e, 0x7fff_ffff);
    let a: Vec<Value> = v
        .iter()
        .map(|&vi| {
            let bits = e.bitcast(I32X4, vi);
            e.fb.ins().band(bits, abs_mask)
        })
        .collect();
    let mut level = a;
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|p| e.fb.ins().umax(p[0], p[1]))
            .collect();
    }
    let amax_bits = horizontal(e, level[0], true);
    let amax = e.bitcast(F32X4, amax_bits);
    let c127 = splat_f32(e, 127.0);
    let d = e.fb.ins().fdiv(amax, c127);
    let c127 = splat_f32(e, 127.0);
    let id = e.fb.ins().fdiv(c127, amax);
    let zero = e.zero(F32X4);
    let nonzero = e.fb.ins().fcmp(FloatCC::NotEqual, amax, zero);
    let nonzero = e.bitcast(F32X4, nonzero);
    let id = e.fb.ins().band(id, nonzero);
    // quants
    let q: Vec<Value> = v
        .iter()
        .map(|&vi| {
            let s = e.fb.ins().fmul(vi, id);
            let r = e.fb.ins().nearest(s);
            e.fb.ins().x86_cvtt2dq(I32X4, r)
        })
        .collect();
    let w: Vec<Value> = q
        .chunks(2)
        .map(|p| e.fb.ins().snarrow(p[0], p[1]))
        .collect();
    debug_assert_eq!(e.fb.func.dfg.value_type(w[0]), I16X8);
    let b0 = e.fb.ins().snarrow(w[0], w[1]);
    let b1 = e.fb.ins().snarrow(w[2], w[3]);
    for j in 0..8 {
        let src = if j < 4 { b0 } else { b1 };
        let chunk = e.lane_broadcast32(src, j % 4);
        e.store(chunk, out, ACT_QS_OFFSET + 16 * j);
    }
    // scales
    let d16 = round_to_f16(e, d);
    e.store(d16, out, 0);
    let mut level = q;
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|p| e.fb.ins().iadd(p[0], p[1]))
            .collect();
    }
    let sum = horizontal(e, level[0], false);
    let aux = match fmt.act {
        ActKind::Q8_1 => {
            let sf = e.fb.ins().fcvt_from_sint(F32X4, sum);
            let s = e.fb.ins().fmul(d, sf);
            round_to_f16(e, s)
        }
        ActKind::Q8_0 => {
            let z = splat_u32(e, fmt.zero_point as u32);
            let zs = e.fb.ins().imul(sum, z);
            e.bitcast(F32X4, zs)
        }
    };
    e.store(aux, out, ACT_AUX_OFFSET);
}
