//! The 32-value formats with one scale (and a minimum for the `_1` types): ggml's
//! `quantize_row_q4_0_ref`, `_q4_1_ref`, `_q5_0_ref`, `_q5_1_ref`, and
//! `quantize_row_mxfp4_ref`.
//!
//! Quants are `x * id` plus a rounding offset, converted to an integer by truncation, as C's
//! float-to-integer conversion does (`(int8_t)(x0 + 8.5f)`).

use super::super::fp::e8m0_to_f32_half;
use super::super::grids::KVALUES_MXFP4;
use super::{put_f16, signed_abs_max, Fields};

/// C's `(int8_t)v` for the in-range values these quantizers produce (truncation toward zero,
/// then the low 8 bits).
#[inline]
fn trunc_i8(v: f32) -> i8 {
    v as i32 as i8
}

/// The scale of the `_0` formats: `d = max / div` with `max` the value of largest
/// magnitude, stored as f16. Returns `1 / d` in f32 (0 when `d` is 0).
fn put_d(f: &Fields, x: &[f32], b: &mut [u8], div: f32) -> f32 {
    let (_, max) = signed_abs_max(x);
    let d = max / div;
    put_f16(b, f.d.start, d);
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// One Q4_0 block (32 values → `d` f16, `qs[16]`): `d = max / -8` with `max` the value of
/// largest magnitude, `q = min(15, trunc(x / d + 8.5))`; value `j` in the low nibble of byte
/// `j`, value `j + 16` in its high nibble.
pub(super) fn q4_0(f: &Fields, x: &[f32], b: &mut [u8]) {
    let id = put_d(f, x, b, -8.0);
    for (j, o) in b[f.qs.clone()].iter_mut().enumerate() {
        let lo = trunc_i8(x[j] * id + 8.5).min(15) as u8;
        let hi = trunc_i8(x[j + 16] * id + 8.5).min(15) as u8;
        *o = lo | hi << 4;
    }
}

/// The scale and minimum of the `_1` formats: `d = (max - min) / levels` and `m = min`
/// (searched from `FLT_MAX` / `-FLT_MAX`), both stored as f16. Returns `(min, 1 / d)` in
/// f32 (`1 / d` is 0 when `d` is).
fn put_d_m(f: &Fields, x: &[f32], b: &mut [u8], levels: f32) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / levels;
    put_f16(b, f.d.start, d);
    put_f16(b, f.m.start, min);
    (min, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// One Q4_1 block (`d`, `m` f16, `qs[16]`): `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
pub(super) fn q4_1(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (min, id) = put_d_m(f, x, b, 15.0);
    for (j, o) in b[f.qs.clone()].iter_mut().enumerate() {
        let lo = trunc_i8((x[j] - min) * id + 0.5).min(15) as u8;
        let hi = trunc_i8((x[j + 16] - min) * id + 0.5).min(15) as u8;
        *o = lo | hi << 4;
    }
}

/// Packs 32 five-bit quants `q(j)`: low nibbles as Q4_0 (`qs`), the fifth bit of value `j` at
/// bit `j` of the little-endian u32 `qh`.
#[inline]
fn pack_5bit(f: &Fields, b: &mut [u8], q: impl Fn(usize) -> u8) {
    let qs = f.qs.clone();
    let qh_at = f.qh.start;
    let mut qh = 0u32;
    for j in 0..16 {
        let (lo, hi) = (q(j), q(j + 16));
        b[qs.start + j] = (lo & 0x0f) | (hi & 0x0f) << 4;
        qh |= u32::from(lo >> 4 & 1) << j;
        qh |= u32::from(hi >> 4 & 1) << (j + 16);
    }
    b[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
}

/// One Q5_0 block (`d` f16, `qh` u32, `qs[16]`): `d = max / -16`,
/// `q = min(31, trunc(x / d + 16.5))`.
pub(super) fn q5_0(f: &Fields, x: &[f32], b: &mut [u8]) {
    let id = put_d(f, x, b, -16.0);
    pack_5bit(f, b, |j| trunc_i8(x[j] * id + 16.5).min(31) as u8);
}

/// One Q5_1 block (`d`, `m` f16, `qh` u32, `qs[16]`): `d = (max - min) / 31`, `m = min`,
/// `q = trunc((x - min) / d + 0.5)` (no clamp, as in ggml).
pub(super) fn q5_1(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (min, id) = put_d_m(f, x, b, 31.0);
    pack_5bit(f, b, |j| ((x[j] - min) * id + 0.5) as i32 as u8);
}

/// C's `(int32_t)v` as x86-64 computes it (`cvttss2si`): truncation toward zero, and
/// `i32::MIN` for NaN and values outside the i32 range.
#[inline]
fn x86_trunc_i32(v: f32) -> i32 {
    if v > -2_147_483_904.0 && v < 2_147_483_648.0 {
        v as i32
    } else {
        i32::MIN
    }
}

/// One MXFP4 block (32 values → E8M0 `e`, `qs[16]`), `quantize_row_mxfp4_ref`:
/// `amax = max |x|`; `e = (uint8_t)(floor(log2f(amax)) - 2 + 127)` (0 for an all-zero
/// block; the conversion keeps the low byte, as x86 does, when the exponent falls outside
/// 0..255); each value takes the first index `i` of [`KVALUES_MXFP4`] with the least
/// `|kvalues_mxfp4[i] * d - x|`, `d = 2^(e - 128)` (product rounded, then the
/// difference: ggml-base is built without FMA); value `j` in the low nibble of byte `j`,
/// value `j + 16` in its high nibble. `log2f` is the C library's, as ggml's.
pub(super) fn mxfp4(f: &Fields, x: &[f32], b: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
    let e = if amax > 0.0 {
        x86_trunc_i32(amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    b[f.e.start] = e;
    let best = |v: f32| -> u8 {
        let mut best = 0u8;
        let mut best_err = (KVALUES_MXFP4[0] as f32 * d - v).abs();
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (k as f32 * d - v).abs();
            if err < best_err {
                best = i as u8;
                best_err = err;
            }
        }
        best
    };
    for (j, o) in b[f.qs.clone()].iter_mut().enumerate() {
        *o = best(x[j]) | best(x[j + 16]) << 4;
    }
}
