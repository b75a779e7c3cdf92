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
//!
//! ggml's vectorized `expf` and what is built on it (`hsum_float_8`, SiLU, the softmax
//! exponentials) are shared with the backends' kernels, so they live in
//! [`crate::ggml::cpu_math`] and are re-exported here.

pub(crate) use crate::ggml::cpu_math::{hsum8, soft_max_exp, v_silu};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
