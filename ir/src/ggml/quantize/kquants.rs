//! The K-quants (super-blocks of 256 values with quantized sub-block scales): ggml's
//! `quantize_row_q2_K_ref` ... `quantize_row_q6_K_ref` and the scale searches they use
//! (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`).
//!
//! Each routine first searches a scale (and minimum) per sub-block, quantizes those to 4, 6
//! or 8 bits against one f16 super-block scale, then quantizes the values again against the
//! rounded sub-block scales. All f32 arithmetic is in ggml's order, one operation at a time.

use super::{ggml_nearest_int as nearest_int, put_f16, signed_abs_max, Fields};
use crate::ggml::{scale_min_k4, QK_K};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `t[0] + t[1] + ...` added left to right from 0, as ggml's `sum += term` loops do.
#[inline(always)]
fn in_order_sum<const N: usize>(t: &[f32; N]) -> f32 {
    t.iter().fold(0.0f32, |s, &v| s + v)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, NULL)`: a symmetric scale for `x` with
/// quants `L[i] = l + nmax`, `l` in `-nmax..nmax`, weighting each value by `x^2`; starts
/// from `-nmax / max` and tries `-(nmax + 0.1 is) / max` for `is` in -9..=9, keeping the
/// scale of least weighted squared error. Returns the scale (0 for an all-zero group, with
/// `L` zero).
fn make_qx_quants<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [i8; N]) -> f32 {
    let (amax, max) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // The terms of both sums for one candidate are computed value by value (vectorizable),
    // then added in ggml's order: `sumlx += (w * x) * l`, `suml2 += (w * l) * l`, w = x^2.
    let w: [f32; N] = std::array::from_fn(|i| x[i] * x[i]);
    let wx: [f32; N] = std::array::from_fn(|i| w[i] * x[i]);
    let sums = |iscale: f32| {
        let l: [f32; N] = std::array::from_fn(|i| quant(iscale, x[i]) as f32);
        let lx: [f32; N] = std::array::from_fn(|i| wx[i] * l[i]);
        let l2: [f32; N] = std::array::from_fn(|i| w[i] * l[i] * l[i]);
        (in_order_sum(&lx), in_order_sum(&l2))
    };
    let fill = |iscale: f32, l_out: &mut [i8; N]| {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (nmax + quant(iscale, v)) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    fill(iscale, l_out);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: a symmetric scale with quants
/// `L[i] = l + nmax`, refined by up to 5 passes that move one quant at a time when that
/// lowers the `x^2`-weighted error. Returns the scale (0 for an all-zero group, `L` zero).
fn make_q3_quants<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [i8; N]) -> f32 {
    let (amax, max) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (o, &v) in l_out.iter_mut().zip(x) {
            let w = v * v;
            let cur = *o as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *o as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for o in l_out.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of `make_qkx2_quants`: candidate inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)` for `is` in `0..=nstep`; `use_mad` weighs
/// absolute instead of squared errors.
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

impl Qkx2 {
    /// `make_qkx2_quants`: an asymmetric scale and minimum for `x` (the minimum clamped to
    /// at most 0), quants `L[i]` in `0..=nmax`, chosen among the candidate scales by the
    /// `weights`-weighted error of a least-squares fit. Returns `(scale, -min)`.
    fn quantize<const N: usize>(
        &self,
        x: &[f32; N],
        weights: &[f32; N],
        l_out: &mut [u8; N],
    ) -> (f32, f32) {
        let n = N;
        let nmax = self.nmax;
        let (mut min, mut max) = (x[0], x[0]);
        let mut sum_w = weights[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..n {
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            let w = weights[i];
            sum_w += w;
            sum_x += w * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            l_out.fill(0);
            return (0.0, -min);
        }
        let error = |d: f32| if self.use_mad { d.abs() } else { d * d };
        let mut iscale = nmax as f32 / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best_error = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_out[i] = l as u8;
            let diff = scale * l as f32 + min - x[i];
            best_error += weights[i] * error(diff);
        }
        if self.nstep < 1 {
            return (scale, -min);
        }
        let mut laux = [0u8; N];
        let w = weights;
        for is in 0..=self.nstep {
            iscale = (self.rmin + self.rdelta * is as f32 + nmax as f32) / (max - min);
            // Per-value terms first (vectorizable), then the sums in ggml's order.
            let l: [f32; N] =
                std::array::from_fn(|i| nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as f32);
            let wl: [f32; N] = std::array::from_fn(|i| w[i] * l[i]);
            let sum_l = in_order_sum(&wl);
            let sum_l2 = in_order_sum(&std::array::from_fn::<f32, N, _>(|i| wl[i] * l[i]));
            let sum_xl = in_order_sum(&std::array::from_fn::<f32, N, _>(|i| wl[i] * x[i]));
            let det = sum_w * sum_l2 - sum_l * sum_l;
            if det > 0.0 {
                let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
                let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
                if this_min > 0.0 {
                    this_min = 0.0;
                    this_scale = sum_xl / sum_l2;
                }
                let cur_error = in_order_sum(&std::array::from_fn::<f32, N, _>(|i| {
                    w[i] * error(this_scale * l[i] + this_min - x[i])
                }));
                if cur_error < best_error {
                    for (o, &v) in laux.iter_mut().zip(&l) {
                        *o = v as u8;
                    }
                    l_out.copy_from_slice(&laux);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }
}

impl Qkx2 {
    /// [`Qkx2::quantize`] of each `N` values of the super-block `x` (`M = 256 / N` of them)
    /// with the weights `weights(values)`, quants into `l`: `(scales, mins)`.
    fn sub_blocks<const N: usize, const M: usize>(
        &self,
        x: &[f32],
        l: &mut [u8; QK_K],
        weights: impl Fn(&[f32; N]) -> [f32; N],
    ) -> ([f32; M], [f32; M]) {
        let (ln, _) = l.as_chunks_mut::<N>();
        let (xn, _) = x.as_chunks::<N>();
        let (mut scales, mut mins) = ([0.0f32; M], [0.0f32; M]);
        for j in 0..M {
            (scales[j], mins[j]) = self.quantize(&xn[j], &weights(&xn[j]), &mut ln[j]);
        }
        (scales, mins)
    }
}

/// The largest of `v` if positive, else 0 (ggml's `if (scale > max_scale)` from 0).
fn positive_max(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, &s| if s > m { s } else { m })
}

/// Packs 2-bit quants `l[0..256]` as Q2_K / Q3_K store them: per 128 values, byte `j` of 32
/// holds values `j`, `j + 32`, `j + 64`, `j + 96` at bits 0, 2, 4, 6.
fn pack_2bit(l: &[u8], qs: &mut [u8]) {
    for (half, q) in l.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for (j, o) in q.iter_mut().enumerate() {
            *o = half[j] | half[j + 32] << 2 | half[j + 64] << 4 | half[j + 96] << 6;
        }
    }
}

/// One Q2_K super-block (`scales[16]`, `qs[64]`, `d`, `dmin`): per 16 values
/// `make_qkx2_quants(nmax 3, weights |x|, rmin -0.5, rdelta 0.1, nstep 15, mad)`; scales and
/// minimums to 4 bits against `d = max_scale / 15`, `dmin = max_min / 15`; then
/// `q = clamp(round((x + dm) / dl), 0, 3)`.
pub(super) fn q2_k(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (sc_r, qs_r) = (f.scales.clone(), f.qs.clone());
    let (d_at, dmin_at) = (f.d.start, f.dmin.start);
    let search = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut l = [0u8; QK_K];
    let (scales, mins) = search.sub_blocks::<16, { QK_K / 16 }>(x, &mut l, |xs| xs.map(f32::abs));
    let (max_scale, max_min) = (positive_max(&scales), positive_max(&mins));
    let sc = &mut b[sc_r.clone()];
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (o, &s) in sc.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s) as u8;
        }
    } else {
        sc.fill(0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (o, &m) in sc.iter_mut().zip(&mins) {
            *o |= (nearest_int(iscale * m) << 4) as u8;
        }
    }
    let d = put_f16(
        b,
        d_at,
        if max_scale > 0.0 {
            max_scale / 15.0
        } else {
            0.0
        },
    );
    let dmin = put_f16(b, dmin_at, if max_min > 0.0 { max_min / 15.0 } else { 0.0 });
    for j in 0..QK_K / 16 {
        let s = b[sc_r.start + j];
        let dl = d * (s & 0xf) as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * (s >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dl).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut b[qs_r]);
}

/// The scale `search` finds for each 16 values of the super-block `x`, with its quants in
/// `l` (Q3_K and Q6_K; their largest scale is then [`signed_abs_max`] of these).
fn scales_of_16(
    x: &[f32],
    l: &mut [i8; QK_K],
    search: impl Fn(&[f32; 16], &mut [i8; 16]) -> f32,
) -> [f32; QK_K / 16] {
    let (l16, _) = l.as_chunks_mut::<16>();
    let (x16, _) = x.as_chunks::<16>();
    std::array::from_fn(|j| search(&x16[j], &mut l16[j]))
}

/// One Q3_K super-block (`hmask[32]`, `qs[64]`, `scales[12]`, `d`): per 16 values
/// `make_q3_quants(nmax 4)`; scales to signed 6 bits against `d = max_scale / -32`; then
/// `q = clamp(round(x / dl), -4, 3) + 4`, the high bit in `hmask`, the low two in `qs`.
pub(super) fn q3_k(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (hm_r, qs_r, sc_r) = (f.hmask.clone(), f.qs.clone(), f.scales.clone());
    let d_at = f.d.start;
    let mut l = [0i8; QK_K];
    let scales = scales_of_16(x, &mut l, |xs, ls| make_q3_quants(4, xs, ls));
    let (_, max_scale) = signed_abs_max(&scales);
    let sc = &mut b[sc_r.clone()];
    sc.fill(0);
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            let q = (nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                sc[j] = q as u8 & 0xf;
            } else {
                sc[j - 8] |= (q as u8 & 0xf) << 4;
            }
            sc[j % 4 + 8] |= ((q >> 4) as u8) << (2 * (j / 4));
        }
        put_f16(b, d_at, 1.0 / iscale)
    } else {
        put_f16(b, d_at, 0.0)
    };
    for j in 0..QK_K / 16 {
        let sc = &b[sc_r.clone()];
        let lo = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let s = (lo | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) as i8 - 32;
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int(x[16 * j + ii] / dl).clamp(-4, 3) as i8 + 4;
        }
    }
    let hmask = &mut b[hm_r];
    hmask.fill(0);
    for (j, q) in l.iter_mut().enumerate() {
        if *q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *q -= 4;
        }
    }
    let l = l.map(|q| q as u8);
    pack_2bit(&l, &mut b[qs_r]);
}

/// The shared part of Q4_K and Q5_K: per 32 values `make_qkx2_quants` with weights
/// `sqrt(mean(x^2)) + |x|`; scales and minimums to 6 bits (ggml's `get_scale_min_k4`
/// packing) against `d = max_scale / 63`, `dmin = max_min / 63`; then
/// `q = clamp(round((x + dm) / dl), 0, nmax)` into `l`.
fn q45_k(f: &Fields, search: &Qkx2, x: &[f32], b: &mut [u8], l: &mut [u8; QK_K]) {
    let sc_r = f.scales.clone();
    let (d_at, dmin_at) = (f.d.start, f.dmin.start);
    let (scales, mins) = search.sub_blocks::<32, { QK_K / 32 }>(x, l, |xs| {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        xs.map(|v| av_x + v.abs())
    });
    let (max_scale, max_min) = (positive_max(&scales), positive_max(&mins));
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[sc_r.clone()];
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xf) | (lm & 0xf) << 4;
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(b, d_at, max_scale / 63.0);
    let dmin = put_f16(b, dmin_at, max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (s, m) = scale_min_k4(j, &b[sc_r.clone()]);
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dl).clamp(0, search.nmax) as u8;
        }
    }
}

/// One Q4_K super-block (`d`, `dmin`, `scales[12]`, `qs[128]`): [`q45_k`] with nmax 15,
/// rmin -1, rdelta 0.1, nstep 20; per 64 values, byte `j` of 32 holds value `j` (low nibble)
/// and `j + 32` (high nibble).
pub(super) fn q4_k(f: &Fields, x: &[f32], b: &mut [u8]) {
    let search = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut l = [0u8; QK_K];
    q45_k(f, &search, x, b, &mut l);
    let qs = &mut b[f.qs.clone()];
    for (ls, q) in l.chunks_exact(64).zip(qs.chunks_exact_mut(32)) {
        for (j, o) in q.iter_mut().enumerate() {
            *o = ls[j] | ls[j + 32] << 4;
        }
    }
}

/// One Q5_K super-block (`d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`): [`q45_k`] with
/// nmax 31, rmin -0.5, rdelta 0.1, nstep 15; low nibbles as Q4_K, the fifth bit of value
/// `64 p + j` at bit `2 p` of `qh[j]` and of value `64 p + 32 + j` at bit `2 p + 1`.
pub(super) fn q5_k(f: &Fields, x: &[f32], b: &mut [u8]) {
    let search = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let mut l = [0u8; QK_K];
    q45_k(f, &search, x, b, &mut l);
    let (qh_r, qs_r) = (f.qh.clone(), f.qs.clone());
    let mut qh = [0u8; 32];
    for (p, (ls, q)) in l
        .chunks_exact(64)
        .zip(b[qs_r].chunks_exact_mut(32))
        .enumerate()
    {
        for (j, o) in q.iter_mut().enumerate() {
            let (mut l1, mut l2) = (ls[j], ls[j + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= 1 << (2 * p);
            }
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= 2 << (2 * p);
            }
            *o = l1 | l2 << 4;
        }
    }
    b[qh_r].copy_from_slice(&qh);
}

/// One Q6_K super-block (`ql[128]`, `qh[64]`, `scales[16]` int8, `d`): per 16 values
/// `make_qx_quants(nmax 32, rmse_type 1)`; scales to int8 against `d = max_scale / -128`;
/// then `q = clamp(round(x / dl), -32, 31) + 32`. An all-zero super-block is all zero bytes.
pub(super) fn q6_k(f: &Fields, x: &[f32], b: &mut [u8]) {
    let (ql_r, qh_r, sc_r) = (f.ql.clone(), f.qh.clone(), f.scales.clone());
    let d_at = f.d.start;
    let mut l = [0i8; QK_K];
    let scales = scales_of_16(x, &mut l, |xs, ls| make_qx_quants(32, xs, ls));
    let (max_abs, max_scale) = signed_abs_max(&scales);
    if max_abs < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(b, d_at, 1.0 / iscale);
    for (j, &s) in scales.iter().enumerate() {
        b[sc_r.start + j] = nearest_int(iscale * s).min(127) as i8 as u8;
    }
    for j in 0..QK_K / 16 {
        let dl = d * b[sc_r.start + j] as i8 as f32;
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int(x[16 * j + ii] / dl).clamp(-32, 31) as i8 + 32;
        }
    }
    let l = l.map(|q| q as u8);
    let (ql_all, qh_all) = (ql_r, qh_r);
    for (h, ls) in l.chunks_exact(128).enumerate() {
        for j in 0..32 {
            let (q1, q2, q3, q4) = (ls[j], ls[j + 32], ls[j + 64], ls[j + 96]);
            b[ql_all.start + 64 * h + j] = (q1 & 0xf) | (q3 & 0xf) << 4;
            b[ql_all.start + 64 * h + j + 32] = (q2 & 0xf) | (q4 & 0xf) << 4;
            b[qh_all.start + 32 * h + j] =
                q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6;
        }
    }
}
