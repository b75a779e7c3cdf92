//! Row norms: `rms_norm` (with the norm weight multiplied in: llama.cpp's `build_norm` with
//! `LLM_NORM_RMS`, `ggml_rms_norm` then `ggml_mul`) and the layer norm `ggml_norm`.
//!
//! Plain Rust (a first version, not Cranelift). As ggml-cpu (`ggml_compute_forward_rms_norm_f32`)
//! and `ir::interp`, bit for bit: the squares are f32 products summed in f64 in order,
//! `mean = (sum / n) as f32`,
//! `scale = 1 / sqrt(mean + eps)`, then `y = x · scale` rounded to f32 and, with a weight,
//! `y · w` rounded again (the two ops of the graph, in their order, so results are
//! bit-identical to the unfused ops).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::has_avx2;

/// Σ x² over `n` values: f32 squares added in f64 one after the other, the interpreter's
/// order (`ir::interp::llama_cpu::rms_norm_row`; an f64 sum in another order can round
/// differently in its last bit, which `(sum / n) as f32` then sometimes keeps).
///
/// # Safety
/// `x` valid for `n` reads.
unsafe fn sum_squares(x: *const f32, n: usize) -> f64 {
    let mut sum = 0f64;
    for i in 0..n {
        let v = *x.add(i);
        sum += (v * v) as f64;
    }
    sum
}

/// `y = rms_norm(x, eps)`, times `w` when given, over one row of `n` values.
///
/// # Safety
/// `x` valid for `n` reads, `w` (when not null) for `n` reads, `y` for `n` writes; `y` may
/// equal `x` but must not otherwise overlap it.
pub(crate) unsafe fn rms_norm_row(x: *const f32, w: *const f32, y: *mut f32, n: usize, eps: f32) {
    let sum = sum_squares(x, n);
    let mean = (sum / n as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        scale_row_avx2(x, w, y, n, scale);
        return;
    }
    for i in 0..n {
        let v = *x.add(i) * scale;
        *y.add(i) = if w.is_null() { v } else { v * *w.add(i) };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_row_avx2(x: *const f32, w: *const f32, y: *mut f32, n: usize, scale: f32) {
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        let mut v = _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), s);
        if !w.is_null() {
            v = _mm256_mul_ps(v, _mm256_loadu_ps(w.add(i)));
        }
        _mm256_storeu_ps(y.add(i), v);
        i += 8;
    }
    for i in i..n {
        let v = *x.add(i) * scale;
        *y.add(i) = if w.is_null() { v } else { v * *w.add(i) };
    }
}

/// `y = norm(x, eps)` (`ggml_norm`: `(x - mean) / sqrt(var + eps)`, sums in f64), times `w`
/// when given, over one row of `n` values.
///
/// # Safety
/// As [`rms_norm_row`].
pub(crate) unsafe fn norm_row(x: *const f32, w: *const f32, y: *mut f32, n: usize, eps: f32) {
    let mut s = 0f64;
    for i in 0..n {
        s += *x.add(i) as f64;
    }
    let mean = (s / n as f64) as f32;
    let mut sum2 = 0f64;
    for i in 0..n {
        let d = *x.add(i) - mean;
        *y.add(i) = d;
        sum2 += (d * d) as f64;
    }
    let scale = 1.0 / ((sum2 / n as f64) as f32 + eps).sqrt();
    for i in 0..n {
        let v = *y.add(i) * scale;
        *y.add(i) = if w.is_null() { v } else { v * *w.add(i) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::interp::llama_cpu;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn rms_norm_and_norm_are_the_interpreters() {
        for seed in 1..50u64 {
            let x = random(576, seed);
            let w = random(576, seed + 1000);
            let mut want = vec![0f32; 576];
            llama_cpu::rms_norm_row(&x, &mut want, 1e-5);
            let mut y = vec![0f32; 576];
            // SAFETY: rows of 576 values.
            unsafe { rms_norm_row(x.as_ptr(), std::ptr::null(), y.as_mut_ptr(), 576, 1e-5) };
            assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            // Fused with the weight: the two ops' roundings in order.
            let want_w: Vec<f32> = want.iter().zip(&w).map(|(a, b)| a * b).collect();
            // SAFETY: as above.
            unsafe { rms_norm_row(x.as_ptr(), w.as_ptr(), y.as_mut_ptr(), 576, 1e-5) };
            assert!(y
                .iter()
                .zip(&want_w)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            llama_cpu::norm_row(&x, &mut want, 1e-5);
            // SAFETY: as above.
            unsafe { norm_row(x.as_ptr(), std::ptr::null(), y.as_mut_ptr(), 576, 1e-5) };
            assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
