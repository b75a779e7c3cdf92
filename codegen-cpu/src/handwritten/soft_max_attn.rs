//! llama.cpp's attention without flash attention (`-fa off`: `build_attn_mha`'s
//! `kq = mul_mat(k, q)`, `soft_max_ext`, `kqv = mul_mat(v, kq)`) for one query head, in the
//! order llama.cpp's x86 CPU kernels add, as the interpreter computes it
//! (`ir/src/interp/attention.rs`, `head` with llama.cpp's rounding):
//!
//! - Q rounded to f16 for an F16 K (`mul_mat` converts it to K's `vec_dot_type`), quantized
//!   to Q8_0 for a Q8_0 K, kept for an F32 K;
//! - the scores: for a llama.cpp ubatch of one token `ggml_vec_dot_f16` (4 × 8 lanes,
//!   [`flash::dot_f16`]); for two or more tokens llamafile's tinyBLAS (one 8-lane accumulator
//!   of fused multiply-adds, `hsum_float_8`); a Q8_0 K takes `ggml_vec_dot_q8_0_q8_0` either way;
//!   then the soft-cap and `kq_scale`;
//! - `ggml_vec_soft_max_f32` over the cells of the 8-aligned span (masked cells −∞), the
//!   probabilities rounded to f16 for an F16 V (`mul_mat(v, kq)` converts `kq` to V's type);
//! - the weighted sum of V in lane accumulators indexed by the absolute cell: 8 lanes
//!   reduced by `hsum_float_8` (tinyBLAS) or 32 lanes reduced by `GGML_F32x8_REDUCE`
//!   (`ggml_vec_dot_f16`), computed here for all of a head's `d_v` values at once.

use super::attention::{KvRows, ScoreParams};
#[cfg(target_arch = "x86_64")]
use super::elementwise::hsum8;
use super::elementwise::soft_max_exp;
use super::flash::{dot_f16, dot_q8, quantize_q};
#[cfg(target_arch = "x86_64")]
use super::has_avx2;

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[inline(always)]
unsafe fn load(p: *const u8, i: usize, f16: bool) -> f32 {
    if f16 {
        half::f16::from_bits(std::ptr::read_unaligned(p.add(2 * i) as *const u16)).to_f32()
    } else {
        std::ptr::read_unaligned(p.add(4 * i) as *const f32)
    }
}

/// Scratch floats [`attend_exact`] needs for a cache of `n_ctx` cells: Q, the scores and
/// exponentials of the span, and 32 lane accumulators of `d_v` values.
pub(crate) fn exact_scratch(d_k: usize, d_v: usize, n_ctx: usize) -> usize {
    d_k + 2 * (n_ctx + 16) + 32 * d_v
}

/// One query head (module doc): `out[0..d_v]` from `q[0..d_k]` over the visible cells
/// `lo..hi`; `batch`: llama.cpp's ubatch has two or more tokens. `kv.f16` says whether K and V
/// rows (K unless Q8_0) hold f16 (else f32): K and V are one float type, or Q8_0 K and F16 V.
pub(crate) struct ExactQuery<'a> {
    pub q: *const f32,
    pub d_k: usize,
    pub kv: &'a KvRows,
    pub lo: usize,
    pub hi: usize,
    pub batch: bool,
    pub p: &'a ScoreParams,
    /// [`exact_scratch`] floats.
    pub scratch: *mut f32,
    pub out: *mut f32,
    pub d_v: usize,
}

/// Computes one [`ExactQuery`], with AVX2 + FMA + F16C when the host has them (the same
/// values either way).
///
/// # Safety
/// `q` valid for `d_k` reads, `out` for `d_v` writes; `kv` rows `0..hi` valid; `scratch`
/// holds [`exact_scratch`] floats for a cache of at least `hi` cells; `d_k` is a multiple of
/// 32 with a Q8_0 K (the lowering checks its heads); nothing overlaps `out`.
pub(crate) unsafe fn attend_exact(a: &ExactQuery<'_>) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return attend_avx2(a);
    }
    attend_body::<false>(a)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(a: &ExactQuery<'_>) {
    attend_body::<true>(a)
}

#[inline(always)]
unsafe fn attend_body<const SIMD: bool>(a: &ExactQuery<'_>) {
    let ExactQuery {
        q,
        d_k,
        kv,
        lo,
        hi,
        batch,
        p,
        scratch,
        out,
        d_v,
    } = *a;
    for d in 0..d_v {
        *out.add(d) = 0.0;
    }
    if lo >= hi {
        return;
    }
    let qb = scratch;
    let (lo8, hi8) = (lo & !7, (hi + 7) & !7);
    let n8 = hi8 - lo8;
    let w = std::slice::from_raw_parts_mut(scratch.add(d_k), n8);
    let e = std::slice::from_raw_parts_mut(scratch.add(d_k + n8), n8);
    let lanes = if batch { 8 } else { 32 };
    let acc = std::slice::from_raw_parts_mut(scratch.add(d_k + 2 * n8), lanes * d_v);
    // Scores of the visible cells; the rest of the span stays masked.
    w.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
    if kv.k_q8 {
        quantize_q(q, d_k, qb as *mut u8);
    } else {
        for i in 0..d_k {
            let x = *q.add(i);
            *qb.add(i) = if kv.f16 { round_f16(x) } else { x };
        }
    }
    let mut max = f32::NEG_INFINITY;
    // A wrapped ring's gap keeps -inf (weight 0; lanes stay by absolute cell).
    for j in kv.ranges(lo, hi).into_iter().flatten() {
        let kr = kv.k.add(j * kv.k_stride);
        let mut s = if kv.k_q8 {
            dot_q8::<SIMD>(kr, qb as *const u8, d_k / 32)
        } else if batch {
            #[cfg(target_arch = "x86_64")]
            let r = if !d_k.is_multiple_of(8) {
                dot_f32::<SIMD>(kr, kv.f16, qb, d_k)
            } else if SIMD {
                tinyblas_dot_avx2(kr, kv.f16, qb, d_k)
            } else {
                tinyblas_dot(kr, kv.f16, qb, d_k)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let r = if d_k.is_multiple_of(8) {
                tinyblas_dot(kr, kv.f16, qb, d_k)
            } else {
                dot_f32::<SIMD>(kr, kv.f16, qb, d_k)
            };
            r
        } else {
            dot_f16::<SIMD>(kr, kv.f16, qb, d_k)
        };
        if let Some(cap) = p.softcap {
            s = (s * (1.0 / cap)).tanh() * cap;
        }
        s *= p.kq_scale;
        max = max.max(s);
        w[j - lo8] = s;
    }
    let sum = soft_max_exp(w, max, e);
    let inv = (1.0 / sum) as f32;
    // Weighted sum of V: lane j % lanes of every output value, across d_v at once.
    acc.iter_mut().for_each(|x| *x = 0.0);
    for j in kv.ranges(lo, hi).into_iter().flatten() {
        let pj = e[j - lo8] * inv;
        let pj = if kv.f16 { round_f16(pj) } else { pj };
        let vr = kv.v.add(j * kv.v_stride);
        let a = &mut acc[(j % lanes) * d_v..][..d_v];
        #[cfg(target_arch = "x86_64")]
        let d0 = if SIMD { mad_avx2(a, vr, kv.f16, pj) } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let d0 = 0;
        for (d, x) in a.iter_mut().enumerate().skip(d0) {
            *x = load(vr, d, kv.f16).mul_add(pj, *x);
        }
    }
    let l = |i: usize, d: usize| acc[i * d_v + d];
    for d in 0..d_v {
        *out.add(d) = if batch {
            // hsum_float_8
            ((l(0, d) + l(4, d)) + (l(2, d) + l(6, d)))
                + ((l(1, d) + l(5, d)) + (l(3, d) + l(7, d)))
        } else {
            // GGML_F32x8_REDUCE of four 8-lane accumulators (lanes 8·s + i).
            let u: [f32; 8] =
                std::array::from_fn(|i| (l(i, d) + l(16 + i, d)) + (l(8 + i, d) + l(24 + i, d)));
            let t = [u[0] + u[4], u[1] + u[5], u[2] + u[6], u[3] + u[7]];
            (t[0] + t[1]) + (t[2] + t[3])
        };
    }
}

/// `ggml_vec_dot_f32`, which ggml takes where tinyBLAS refuses a length that is not a multiple
/// of 8: [`dot_f16`]'s 4 × 8 lanes over the whole chunks of 32, the rest added in f32.
#[inline(always)]
unsafe fn dot_f32<const SIMD: bool>(k: *const u8, f16: bool, q: *const f32, d_k: usize) -> f32 {
    let np = d_k & !31;
    let mut sum = dot_f16::<SIMD>(k, f16, q, np);
    for i in np..d_k {
        sum += load(k, i, f16) * *q.add(i);
    }
    sum
}

/// llamafile tinyBLAS's product of one K row with Q: one 8-lane accumulator of fused
/// multiply-adds over chunks of 8, then `hsum_float_8` (`d_k` a multiple of 8).
#[inline(always)]
unsafe fn tinyblas_dot(k: *const u8, f16: bool, q: *const f32, d_k: usize) -> f32 {
    let mut a = [0f32; 8];
    for i in (0..d_k).step_by(8) {
        for (l, x) in a.iter_mut().enumerate() {
            *x = load(k, i + l, f16).mul_add(*q.add(i + l), *x);
        }
    }
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// [`tinyblas_dot`] in AVX2 (the same operations).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tinyblas_dot_avx2(k: *const u8, f16: bool, q: *const f32, d_k: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    for i in (0..d_k).step_by(8) {
        acc = _mm256_fmadd_ps(load8(k, i, f16), _mm256_loadu_ps(q.add(i)), acc);
    }
    hsum8(acc)
}

/// `a[d] = fma(v[d], p, a[d])` for the whole multiples of 8 of `a`; returns how many.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn mad_avx2(a: &mut [f32], v: *const u8, f16: bool, p: f32) -> usize {
    use std::arch::x86_64::*;
    let pv = _mm256_set1_ps(p);
    let n = a.len() & !7;
    for d in (0..n).step_by(8) {
        let x = a.as_mut_ptr().add(d);
        _mm256_storeu_ps(x, _mm256_fmadd_ps(load8(v, d, f16), pv, _mm256_loadu_ps(x)));
    }
    n
}

/// Values `i .. i + 8` of an F16 or F32 row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load8(p: *const u8, i: usize, f16: bool) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if f16 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
    } else {
        _mm256_loadu_ps(p.add(4 * i) as *const f32)
    }
}
