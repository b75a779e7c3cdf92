//! IQ4_NL and IQ4_XS: 4-bit indices into ggml's non-linear grid [`KVALUES_IQ4NL`], as
//! ggml's `quantize_row_iq4_nl_impl` computes them without an importance matrix (each value
//! weighted by `x^2`, 7 extra scale tries each way: `quantize_iq4_nl` / `quantize_iq4_xs`).

use super::{ggml_nearest_int as nearest_int, put_f16, signed_abs_max, Fields};
use crate::ggml::{KVALUES_IQ4NL, QK_K};

/// ggml's `GROUP_MAX_EPS`.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Extra scale tries on each side of the first guess (`ntry` in ggml).
const NTRY: i32 = 7;

/// ggml's `best_index_int8(16, kvalues_iq4nl, x)`: the index of the grid value nearest to
/// `x` (the upper one on exact ties; the ends for values outside the grid).
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The scale of one block of 32 values `x` (0 for an all-zero block): the best
/// `x^2`-weighted least-squares scale over the grid indices from `d = -max / -127` and from
/// `1 / d = (itry - 127) / max` for `itry` in `-7..=7`.
fn block_scale(x: &[f32]) -> f32 {
    let (amax, max) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &xv in x {
            let q = KVALUES_IQ4NL[best_index(id * xv) as usize] as f32;
            let w = xv * xv;
            sumqx += w * q * xv;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / v0;
    let (sumqx, sumq2) = sums(1.0 / d);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + KVALUES_IQ4NL[0] as i32) as f32 / max;
        let (sumqx, sumq2) = sums(id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices per 16 bytes: index `j` in the low nibble of byte `j`, `j + 16` in the
/// high nibble.
fn pack(l: &[u8], qs: &mut [u8]) {
    for (ls, q) in l.chunks_exact(32).zip(qs.chunks_exact_mut(16)) {
        for (j, o) in q.iter_mut().enumerate() {
            *o = ls[j] | ls[j + 16] << 4;
        }
    }
}

/// Grid indices of `x` for scale `d` (`id = 1 / d`, 0 when `d` is 0).
fn indices(x: &[f32], d: f32, l: &mut [u8]) {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in l.iter_mut().zip(x) {
        *o = best_index(id * v);
    }
}

/// One IQ4_NL block (32 values → `d` f16, `qs[16]`): `d` is [`block_scale`] stored as f16
/// and the indices are taken against the unrounded scale.
pub(super) fn iq4_nl(f: &Fields, x: &[f32], b: &mut [u8]) {
    let d = block_scale(x);
    put_f16(b, f.d.start, d);
    let mut l = [0u8; 32];
    indices(x, d, &mut l);
    pack(&l, &mut b[f.qs.clone()]);
}

/// One IQ4_XS super-block (`d` f16, `scales_h` u16, `scales_l[4]`, `qs[128]`): a
/// [`block_scale`] per 32 values, quantized to 6 bits (`l` in -32..=31, stored `+ 32`, low
/// nibbles in `scales_l`, top two bits in `scales_h`) against `d = max_scale / -32`; the
/// indices are taken against each rounded block scale `d * l`.
pub(super) fn iq4_xs(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (sh_at, sl_r, qs_r) = (f.scales_h.start, f.scales_l.clone(), f.qs.clone());
    let mut scales = [0.0f32; QK_K / 32];
    let (mut amax, mut max_scale) = (0.0f32, 0.0f32);
    for (s, xs) in scales.iter_mut().zip(x.chunks_exact(32)) {
        *s = block_scale(xs);
        if s.abs() > amax {
            amax = s.abs();
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, f.d.start, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut l = [0u8; QK_K];
    let mut scales_h = 0u16;
    b[sl_r.clone()].fill(0);
    for (ib, &s) in scales.iter().enumerate() {
        let ls = nearest_int(id * s).clamp(-32, 31);
        indices(
            &x[32 * ib..32 * ib + 32],
            d * ls as f32,
            &mut l[32 * ib..32 * ib + 32],
        );
        let q = (ls + 32) as u8;
        b[sl_r.start + ib / 2] |= (q & 0xf) << (4 * (ib % 2));
        scales_h |= u16::from(q >> 4) << (2 * ib);
    }
    b[sh_at..sh_at + 2].copy_from_slice(&scales_h.to_le_bytes());
    pack(&l, &mut b[qs_r]);
}
