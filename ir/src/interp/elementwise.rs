//! Row-wise and elementwise ops: norms, unary activations, broadcasting add / mul, GLUs and
//! softmax, each written as ggml-cpu's ops.cpp / vec.h compute it (sums of squares and of
//! exponentials in f64, `ggml_float`; everything else in f32).

use super::layout::{for_each_index, Lay};
use crate::ggml::{f16_to_f32, f32_to_f16};

/// `sqrt(2 / π)` as ggml writes it (`SQRT_2_OVER_PI`).
#[allow(clippy::excessive_precision)]
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4;
/// `GELU_COEF_A` of ggml.
const GELU_COEF_A: f32 = 0.044715;

/// Applies `f` to each actual row of `x`, writing the row of the result (same layout).
pub(crate) fn map_rows(x: &[f32], lay: &Lay, mut f: impl FnMut(&[f32], &mut [f32])) -> Vec<f32> {
    let mut out = vec![0f32; lay.alloc];
    let n0 = lay.ne[0];
    for r in 0..lay.n_rows() {
        let o = lay.row_off(r);
        f(&x[o..o + n0], &mut out[o..o + n0]);
    }
    out
}

/// `ggml_rms_norm`: `y = x * (1 / sqrt(mean(x²) + eps))`, the sum of squares in f64.
pub(crate) fn rms_norm_row(x: &[f32], y: &mut [f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// `ggml_norm`: `y = (x - mean) / sqrt(var + eps)`, sums in f64.
pub(crate) fn norm_row(x: &[f32], y: &mut [f32], eps: f32) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
    let mut sum2 = 0f64;
    for (o, &v) in y.iter_mut().zip(x) {
        let d = v - mean;
        *o = d;
        sum2 += (d * d) as f64;
    }
    let scale = 1.0 / ((sum2 / n) as f32 + eps).sqrt();
    for o in y.iter_mut() {
        *o *= scale;
    }
}

/// `ggml_soft_max_ext` without mask on one row: `exp(x * scale - max)`, normalized by the
/// f64 sum.
pub(crate) fn soft_max_row(x: &[f32], y: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v * scale;
        max = max.max(*o);
    }
    soft_max_in_place(y, max);
}

/// `ggml_soft_max_ext` without mask of one row as llama.cpp's x86 build computes it
/// (`ggml_compute_forward_soft_max_f32`): `x · scale`, its max, `ggml_v_expf` in groups of 8
/// and libm's `expf` after ([`crate::ggml::cpu_math::soft_max_exp`]), the sum in f64, then
/// `y · (1 / sum)`.
pub(crate) fn soft_max_row_x86(x: &[f32], y: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v * scale;
        max = max.max(*o);
    }
    let w = y.to_vec();
    let sum = crate::ggml::cpu_math::soft_max_exp(&w, max, y);
    let inv = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= inv);
}

/// Turns scores `w` (max `max`) into probabilities as `ggml_vec_soft_max_f32` does.
pub(crate) fn soft_max_in_place(w: &mut [f32], max: f32) {
    let mut sum = 0f64;
    for v in w.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in w.iter_mut() {
        *v *= inv;
    }
}

/// `ggml_silu_f32`: `x / (1 + exp(-x))`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ggml_gelu_f32`, the tanh form.
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// GELU as ggml's CPU backend evaluates it (`GGML_GELU_FP16`): 0 at or below -10, `x` at or
/// above 10, otherwise the f16 table entry of the f16-rounded input
/// (`f16(gelu(f16(x)))`).
#[inline]
pub(crate) fn gelu_f16_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let t = crate::ggml::cpu_math::gelu_table_value(f16_to_f32(f32_to_f16(x)));
        f16_to_f32(f32_to_f16(t))
    }
}

/// Elementwise `f(x)` over the actual elements (same layout).
pub(crate) fn unary(x: &[f32], lay: &Lay, f: impl Fn(f32) -> f32) -> Vec<f32> {
    map_rows(x, lay, |a, y| {
        for (o, &v) in y.iter_mut().zip(a) {
            *o = f(v);
        }
    })
}

/// `f(a, b)` with `b` repeated over `a` (ggml's binary-op broadcasting).
pub(crate) fn binary(
    a: &[f32],
    la: &Lay,
    b: &[f32],
    lb: &Lay,
    f: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let mut out = vec![0f32; la.alloc];
    let n0 = la.ne[0];
    for r in 0..la.n_rows() {
        let [i1, i2, i3] = la.row_coords(r);
        let oa = la.row_off(r);
        let ob = lb.off([0, i1 % lb.ne[1], i2 % lb.ne[2], i3 % lb.ne[3]]);
        let (ra, ro) = (&a[oa..oa + n0], oa);
        if lb.ne[0] == n0 {
            for i in 0..n0 {
                out[ro + i] = f(ra[i], b[ob + i]);
            }
        } else {
            for i in 0..n0 {
                out[ro + i] = f(ra[i], b[ob + i % lb.ne[0]]);
            }
        }
    }
    out
}

/// `f(gate, up)` elementwise for two tensors of one layout.
pub(crate) fn glu(g: &[f32], u: &[f32], lay: &Lay, f: impl Fn(f32) -> f32) -> Vec<f32> {
    let mut out = vec![0f32; lay.alloc];
    for_each_index(lay, |_, o| out[o] = f(g[o]) * u[o]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_near_one() {
        let x = [2.0f32; 8];
        let mut y = [0f32; 8];
        rms_norm_row(&x, &mut y, 0.0);
        assert!(y.iter().all(|&v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn softmax_sums_to_one() {
        let x = [1.0f32, 2.0, 3.0, -1.0];
        let mut y = [0f32; 4];
        soft_max_row(&x, &mut y, 0.5);
        let s: f32 = y.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(y[2] > y[1] && y[1] > y[0] && y[0] > y[3]);
    }

    #[test]
    fn gelu_table_matches_gelu_closely_and_clamps() {
        assert_eq!(gelu_f16_table(-11.0), 0.0);
        assert_eq!(gelu_f16_table(12.5), 12.5);
        for x in [-3.0f32, -0.5, 0.1, 0.7, 2.5] {
            assert!((gelu_f16_table(x) - gelu(x)).abs() < 4e-3, "{x}");
        }
    }
}
