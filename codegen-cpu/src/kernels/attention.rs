//! Attention of one query head over the KV cache, as llama.cpp computes it without flash
//! attention (`build_attn_mha` in llama-graph.cpp: `kq = mul_mat(k, q)`, optional soft-cap,
//! `soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`).
//!
//! With an F16 cache, Q is rounded to f16 before the scores (ggml converts `src1` to the
//! cache's `vec_dot_type`, F16) and the probabilities are rounded to f16 before the product
//! with V; an F32 cache rounds neither (ggml's F32 `vec_dot`). Scores are f32 dot products,
//! the softmax sums its exponentials in f64 (`ggml_vec_soft_max_f32`), the weighted sum of V
//! is accumulated in f32. Only the visible keys `lo..hi` (causal mask, sliding window) are
//! read: masked scores contribute exactly 0 in ggml as well.
//!
//! Plain Rust (a first version, not Cranelift): AVX2 + FMA + F16C through `std::arch` when the
//! host has them, scalar otherwise. The exponentials use the vectorized `exp` of
//! [`super::elementwise`].

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::elementwise::{exp_shifted_sum, has_avx2};

/// Where one head's K and V rows are and how to read them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvRows {
    /// First byte of key position 0 of this KV head.
    pub k: *const u8,
    /// Bytes between consecutive key positions.
    pub k_stride: usize,
    /// First byte of value position 0 of this KV head.
    pub v: *const u8,
    /// Bytes between consecutive value positions.
    pub v_stride: usize,
    /// The cache holds f16 (else f32).
    pub f16: bool,
}

/// Scalar parameters of the scores.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScoreParams {
    /// Multiplier of the scores before the softmax.
    pub kq_scale: f32,
    /// Soft-cap applied before `kq_scale`.
    pub softcap: Option<f32>,
}

#[inline]
unsafe fn load_scalar(p: *const u8, i: usize, f16: bool) -> f32 {
    if f16 {
        half::f16::from_bits(std::ptr::read_unaligned(p.add(2 * i) as *const u16)).to_f32()
    } else {
        std::ptr::read_unaligned(p.add(4 * i) as *const f32)
    }
}

#[inline]
fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Attention output of one query head: `out[0..d_v] = Σ_j softmax_j · v_j` over the visible
/// key positions `lo..hi` (nothing visible: zeros).
///
/// `scores` is scratch for `hi - lo` values, `qbuf` for `d_k` values.
///
/// # Safety
/// `q` valid for `d_k` reads, `out` for `d_v` writes; `kv` rows `lo..hi` valid for `d_k`
/// (keys) and `d_v` (values) elements; scratch as stated; no overlap between `out` and the
/// rest.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend(
    q: *const f32,
    d_k: usize,
    kv: &KvRows,
    lo: usize,
    hi: usize,
    p: &ScoreParams,
    scores: *mut f32,
    qbuf: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    for i in 0..d_v {
        *out.add(i) = 0.0;
    }
    if lo >= hi {
        return;
    }
    for i in 0..d_k {
        let x = *q.add(i);
        *qbuf.add(i) = if kv.f16 { round_f16(x) } else { x };
    }
    let n = hi - lo;
    let simd = has_avx2() && d_k % 8 == 0;
    // Scores.
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    if simd {
        j = scores_avx2(qbuf, d_k, kv, lo, n, scores);
    }
    for j in j..n {
        let kr = kv.k.add((lo + j) * kv.k_stride);
        let mut s = 0f32;
        for i in 0..d_k {
            s += *qbuf.add(i) * load_scalar(kr, i, kv.f16);
        }
        *scores.add(j) = s;
    }
    let mut max = f32::NEG_INFINITY;
    for j in 0..n {
        let mut s = *scores.add(j);
        if let Some(cap) = p.softcap {
            s = (s * (1.0 / cap)).tanh() * cap;
        }
        s *= p.kq_scale;
        *scores.add(j) = s;
        max = max.max(s);
    }
    let sum = exp_shifted_sum(scores, n, max);
    let inv = (1.0 / sum) as f32;
    for j in 0..n {
        let pj = *scores.add(j) * inv;
        *scores.add(j) = if kv.f16 { round_f16(pj) } else { pj };
    }
    // Weighted sum of V.
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && d_v % 8 == 0 {
        weighted_sum_avx2(scores, kv, lo, n, out, d_v);
        return;
    }
    for j in 0..n {
        let pj = *scores.add(j);
        let vr = kv.v.add((lo + j) * kv.v_stride);
        for i in 0..d_v {
            *out.add(i) += pj * load_scalar(vr, i, kv.f16);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8(p: *const u8, i: usize, f16: bool) -> __m256 {
    if f16 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
    } else {
        _mm256_loadu_ps(p.add(4 * i) as *const f32)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Scores of keys `lo..lo+n`, four keys at a time; returns how many it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2(q: *const f32, d_k: usize, kv: &KvRows, lo: usize, n: usize, scores: *mut f32) -> usize {
    let mut j = 0;
    while j + 4 <= n {
        let r: [*const u8; 4] = std::array::from_fn(|u| kv.k.add((lo + j + u) * kv.k_stride));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < d_k {
            let qv = _mm256_loadu_ps(q.add(i));
            for u in 0..4 {
                acc[u] = _mm256_fmadd_ps(qv, load8(r[u], i, kv.f16), acc[u]);
            }
            i += 8;
        }
        for u in 0..4 {
            *scores.add(j + u) = hsum(acc[u]);
        }
        j += 4;
    }
    while j < n {
        let r = kv.k.add((lo + j) * kv.k_stride);
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < d_k {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), load8(r, i, kv.f16), acc);
            i += 8;
        }
        *scores.add(j) = hsum(acc);
        j += 1;
    }
    j
}

/// `out += Σ_j p_j · v_j` over `d_v` (a multiple of 8) in chunks of 64 values held in
/// registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum_avx2(p: *const f32, kv: &KvRows, lo: usize, n: usize, out: *mut f32, d_v: usize) {
    let mut c0 = 0;
    while c0 < d_v {
        let width = (d_v - c0).min(64);
        if width == 64 {
            let mut acc = [_mm256_setzero_ps(); 8];
            for j in 0..n {
                let pj = _mm256_set1_ps(*p.add(j));
                let vr = kv.v.add((lo + j) * kv.v_stride);
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(pj, load8(vr, c0 + 8 * u, kv.f16), *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(c0 + 8 * u), *a);
            }
        } else {
            for j in 0..n {
                let pj = _mm256_set1_ps(*p.add(j));
                let vr = kv.v.add((lo + j) * kv.v_stride);
                let mut i = 0;
                while i < width {
                    let o = out.add(c0 + i);
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(pj, load8(vr, c0 + i, kv.f16), _mm256_loadu_ps(o)));
                    i += 8;
                }
            }
        }
        c0 += width;
    }
}
