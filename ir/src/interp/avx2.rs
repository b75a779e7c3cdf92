//! What llama.cpp's CPU kernels compute on x86-64 with AVX2, FMA and F16C (the build that
//! produced `shared/reference/`), operation for operation, so the interpreter can follow its
//! roundings rather than only its maths. Each function says which ggml kernel it mirrors and
//! in which order that kernel adds; all are plain scalar code (lanes written out), checked by
//! the unit tests against straightforward definitions.
//!
//! Why: activations are rounded to 8 bits before every quantized product, so a difference in
//! the last bit of an f32 sum can move an activation across a rounding boundary, and on a
//! 30-layer model such flips add up to tenths of a nat in the log-probabilities. Reproducing
//! the summation order removes most of them.

/// ggml's `hsum_float_8` (x86 quants.c): `((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))`.
#[inline(always)]
pub(crate) fn hsum8(x: &[f32; 8]) -> f32 {
    let r = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// `GGML_F32x8_REDUCE` for four 8-lane accumulators (simd-mappings.h, AVX):
/// `x0 += x2, x1 += x3, x0 += x1`, then the halves added and two horizontal adds:
/// `((t0 + t1) + (t2 + t3))` with `t_i = x0[i] + x0[i + 4]`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) fn reduce_4x8(mut s: [[f32; 8]; 4]) -> f32 {
    for l in 0..8 {
        s[0][l] += s[2][l];
        s[1][l] += s[3][l];
    }
    for l in 0..8 {
        s[0][l] += s[1][l];
    }
    let t = [
        s[0][0] + s[0][4],
        s[0][1] + s[0][5],
        s[0][2] + s[0][6],
        s[0][3] + s[0][7],
    ];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `ggml_vec_dot_f16` with AVX/F16C (vec.cpp): 4 accumulators of 8 lanes over chunks of 32
/// values, each `acc = fma(x, y, acc)`; [`reduce_4x8`]; the leftover values (beyond a
/// multiple of 32) added one by one in f64; the result rounded to f32. `x` and `y` hold f16
/// values (the products are exact in f32).
#[inline(always)]
pub(crate) fn dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *a = x[k].mul_add(y[k], *a);
            }
        }
    }
    let mut sum = reduce_4x8(s) as f64;
    for k in np..n {
        sum += (x[k] * y[k]) as f64;
    }
    sum as f32
}

/// llamafile's `tinyBLAS` (sgemm.cpp) for one output element of a product with F32, F16 or
/// BF16 operands, as llama.cpp's CPU `mul_mat` uses it when the product has at least two
/// columns: one 8-lane accumulator, `acc = fma(a, b, acc)` over chunks of 8, then
/// [`hsum8`]. Lengths that are not a multiple of 8 are refused by tinyBLAS; they take
/// [`dot_f32`] here as in ggml.
#[inline(always)]
pub(crate) fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    if n % 8 != 0 {
        return dot_f32(a, b);
    }
    let mut acc = [0f32; 8];
    for (x, y) in a[..n].chunks_exact(8).zip(b[..n].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_f32` with AVX + FMA (vec.cpp): like [`dot_f16`] (4 × 8 lanes, fused
/// multiply-adds, [`reduce_4x8`]) but the leftovers are added in f32.
#[inline(always)]
pub(crate) fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *a = x[k].mul_add(y[k], *a);
            }
        }
    }
    let mut sum = reduce_4x8(s);
    for k in np..n {
        sum += x[k] * y[k];
    }
    sum
}

/// `ggml_vec_dot_bf16` with AVX2 (vec.cpp): four 8-lane accumulators over chunks of 32,
/// `c = c + x * y` (no fused multiply-add), combined as `(c1 + c3) + (c2 + c4)`, then
/// [`hsum8`]; leftovers added in f64.
#[inline(always)]
pub(crate) fn dot_bf16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut c = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in c.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *a += x[k] * y[k];
            }
        }
    }
    let mut t = [0f32; 8];
    for l in 0..8 {
        t[l] = (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]);
    }
    let mut sum = hsum8(&t) as f64;
    for k in np..n {
        sum += (x[k] * y[k]) as f64;
    }
    sum as f32
}

const R: u32 = 0x4b40_0000; // 0x1.8p23
const LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0
const LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20
const LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1
const P0: u32 = 0x3c07_2010; // 0x1.0e4020p-7
const P1: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5
const P2: u32 = 0x3e2a_af33; // 0x1.555e66p-3
const P3: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2
const P4: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `ggml_v_expf` for AVX2 + FMA (vec.h; adapted by ggml from Arm's optimized routines), one
/// lane: `x = n ln2 + b` with `n` rounded by the 1.5·2^23 trick, a degree-5 polynomial in
/// `b`, the exponent added to the bits; large |n| handled by the two-factor scaling. Within
/// about 1.5 ulp of `exp`; this is bit-for-bit what each lane of ggml's vector computes.
#[inline(always)]
pub(crate) fn v_expf(x: f32) -> f32 {
    let r = c(R);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let big = n.abs() > 126.0;
    let u = b * b;
    let j = c(P0)
        .mul_add(b, c(P1))
        .mul_add(u, c(P2).mul_add(b, c(P3)))
        .mul_add(u, c(P4) * b);
    if !big {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `ggml_v_silu`: `x / (1 + v_expf(0 - x))`.
#[inline(always)]
pub(crate) fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_vec_swiglu_f32` / `ggml_vec_silu_f32` on one row: [`v_silu`] for the values in whole
/// groups of 8, ggml's scalar `x / (1 + expf(-x))` for the rest; times `g` when given.
pub(crate) fn silu_row(x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
    let whole = x.len() & !7;
    for i in 0..x.len() {
        let s = if i < whole {
            v_silu(x[i])
        } else {
            x[i] / (1.0 + (-x[i]).exp())
        };
        y[i] = match g {
            Some(g) => s * g[i],
            None => s,
        };
    }
}

/// `ggml_vec_soft_max_f32` (vec.cpp, AVX2 + FMA): `y = v_expf(x - max)` in groups of 8, each
/// group's sum ([`hsum8`]) added to an f64 total; the remaining values with `expf`, added
/// one by one. Returns the total.
pub(crate) fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let whole = x.len() & !7;
    let mut sum = 0f64;
    for i in (0..whole).step_by(8) {
        let mut v = [0f32; 8];
        for l in 0..8 {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
        sum += hsum8(&v) as f64;
    }
    for i in whole..x.len() {
        let v = (x[i] - max).exp();
        sum += v as f64;
        y[i] = v;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_exp_and_handles_the_range_ends() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (v_expf(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3.0 * f32::EPSILON as f64, "relative error {worst}");
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(100.0), f32::INFINITY);
        // Between the ends (|n| in 126..192) the two-factor path keeps subnormals.
        let t = v_expf(-95.0) as f64;
        assert!((t - (-95f64).exp()).abs() / (-95f64).exp() < 1e-5);
    }

    #[test]
    fn reductions_add_every_lane_once() {
        let x = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        assert_eq!(hsum8(&x), 255.0);
        let s = [[1.0; 8], [2.0; 8], [4.0; 8], [8.0; 8]];
        assert_eq!(reduce_4x8(s), 120.0);
        let a: Vec<f32> = (0..70).map(|i| (i % 7) as f32 - 3.0).collect();
        let want: f32 = a.iter().map(|v| v * v).sum();
        assert_eq!(dot_f16(&a, &a), want);
        assert_eq!(dot_f32(&a, &a), want);
        assert_eq!(dot_bf16(&a, &a), want);
        assert_eq!(
            dot_tinyblas(&a[..64], &a[..64]),
            a[..64].iter().map(|v| v * v).sum::<f32>()
        );
    }

    #[test]
    fn softmax_exponentials_sum_like_exp() {
        let x: Vec<f32> = (0..21).map(|i| i as f32 * 0.3 - 2.0).collect();
        let mut y = vec![0f32; 21];
        let s = soft_max_exp(&x, 4.0, &mut y);
        let want: f64 = x.iter().map(|&v| ((v - 4.0) as f64).exp()).sum();
        assert!((s - want).abs() / want < 1e-6);
    }
}
