//! The Walsh–Hadamard rotation llama.cpp applies around a quantized KV cache
//! (`llama_mul_mat_hadamard` in src/llama-impl.h, computed on the CPU by
//! `ggml_compute_forward_fwht` in ggml-cpu/ops.cpp): with a quantized K cache, Q and K are
//! rotated after rope and before the store; with a quantized V cache, V is rotated before
//! the store and the attention output rotated back. The orthonormal Hadamard matrix is its
//! own inverse, so the attention result is unchanged up to rounding, while the rotation
//! spreads outliers over the block before 8-bit quantization.

/// One row of `n` values (a power of two) in place, as `ggml_compute_forward_fwht` computes
/// it: every value times `1 / sqrt(n)` first, then the butterflies `(u + v, u − v)` over
/// pairs `len` apart for `len = 1, 2, 4, … n / 2` (ggml's vector passes compute `u − v` as
/// `fma(v, −1, u)`, the same rounding). The result is `H · x` for the Sylvester-ordered
/// orthonormal Hadamard matrix `H` (`ggml_gen_hadamard` in src/llama-kv-cache.cpp).
///
/// Rows whose length is not a power of two are left unchanged (callers check).
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    if !n.is_power_of_two() {
        return;
    }
    let scale = 1.0f32 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
    let mut len = 1;
    while len < n {
        for i in (0..n).step_by(2 * len) {
            for j in i..i + len {
                let (u, v) = (x[j], x[j + len]);
                x[j] = u + v;
                x[j + len] = u - v;
            }
        }
        len *= 2;
    }
}

/// The rotation size llama.cpp uses for a K cache with heads of `n_embd_head_k` values:
/// the largest power of two ≥ 64 dividing it (`llama_kv_cache::build_input_k_rot`), or
/// `None` when the head is not a multiple of 64 (no rotation).
pub fn k_rot_size(n_embd_head_k: u64) -> Option<u64> {
    if n_embd_head_k == 0 || n_embd_head_k % 64 != 0 {
        return None;
    }
    let mut n = 64;
    while n_embd_head_k % (2 * n) == 0 {
        n *= 2;
    }
    Some(n)
}

/// The rotation size for a V cache with heads of `n_embd_head_v` values: 64 when the head
/// is a multiple of 64 (`llama_kv_cache::build_input_v_rot`), else `None`.
pub fn v_rot_size(n_embd_head_v: u64) -> Option<u64> {
    (n_embd_head_v > 0 && n_embd_head_v % 64 == 0).then_some(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fwht_is_the_orthonormal_hadamard_product_and_its_own_inverse() {
        let n = 64;
        // Sylvester Hadamard matrix: H[i][j] = (-1)^popcount(i & j) / sqrt(n).
        let h = |i: usize, j: usize| {
            if (i & j).count_ones() % 2 == 0 {
                0.125f64
            } else {
                -0.125
            }
        };
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
        let mut y = x.clone();
        fwht(&mut y);
        for (i, &yi) in y.iter().enumerate() {
            let want: f64 = (0..n).map(|j| h(i, j) * x[j] as f64).sum();
            assert!((yi as f64 - want).abs() < 1e-5, "row {i}: {yi} vs {want}");
        }
        fwht(&mut y);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn rotation_sizes_follow_llama_cpp() {
        assert_eq!(k_rot_size(64), Some(64));
        assert_eq!(k_rot_size(128), Some(128));
        assert_eq!(k_rot_size(192), Some(64));
        assert_eq!(k_rot_size(256), Some(256));
        assert_eq!(k_rot_size(80), None);
        assert_eq!(v_rot_size(128), Some(64));
        assert_eq!(v_rot_size(96), None);
    }
}
