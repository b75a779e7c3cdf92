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
use super::flash::{dot_q8, quantize_q};

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
    /// The float rows (K and V, unless Q8_0) hold f16 (else f32).
    pub f16: bool,
    /// K rows are Q8_0 blocks (scores by `ggml_vec_dot_q8_0_q8_0` of Q quantized to Q8_0).
    pub k_q8: bool,
    /// V rows are Q8_0 blocks (flash attention only).
    pub v_q8: bool,
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
    let n = hi - lo;
    let simd = has_avx2() && d_k.is_multiple_of(8);
    // Scores. A Q8_0 K: `mul_mat(k, q)` converts Q to Q8_0 and adds in
    // `ggml_vec_dot_q8_0_q8_0`'s order (tinyBLAS's Q8_0 kernel adds the same way).
    let mut j = 0;
    if kv.k_q8 {
        let qq = qbuf as *mut u8;
        quantize_q(q, d_k, qq);
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            scores_q8_avx2(qq, d_k, kv, lo, n, scores);
            j = n;
        }
        for j in j..n {
            let kr = kv.k.add((lo + j) * kv.k_stride);
            *scores.add(j) = dot_q8::<false>(kr, qq, d_k / 32);
        }
        j = n;
    } else {
        #[cfg(target_arch = "x86_64")]
        if simd {
            copy_round_avx2(q, qbuf, d_k, kv.f16);
        }
        if !simd {
            for i in 0..d_k {
                let x = *q.add(i);
                *qbuf.add(i) = if kv.f16 { round_f16(x) } else { x };
            }
        }
        #[cfg(target_arch = "x86_64")]
        if simd {
            j = scores_avx2(qbuf, d_k, kv, lo, n, scores);
        }
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
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        j = scale_round_avx2(scores, n, inv, kv.f16);
    }
    for j in j..n {
        let pj = *scores.add(j) * inv;
        *scores.add(j) = if kv.f16 { round_f16(pj) } else { pj };
    }
    // Weighted sum of V.
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && d_v.is_multiple_of(8) {
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

/// `dst = src` (rounded through f16 when `f16`) for `n` (a multiple of 8) values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn copy_round_avx2(src: *const f32, dst: *mut f32, n: usize, f16: bool) {
    let mut i = 0;
    while i < n {
        let mut v = _mm256_loadu_ps(src.add(i));
        if f16 {
            v = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        }
        _mm256_storeu_ps(dst.add(i), v);
        i += 8;
    }
}

/// `w[j] *= inv` (rounded through f16 when `f16`) in place; returns how many it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_round_avx2(w: *mut f32, n: usize, inv: f32, f16: bool) -> usize {
    let s = _mm256_set1_ps(inv);
    let mut j = 0;
    while j + 8 <= n {
        let mut v = _mm256_mul_ps(_mm256_loadu_ps(w.add(j)), s);
        if f16 {
            v = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        }
        _mm256_storeu_ps(w.add(j), v);
        j += 8;
    }
    j
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
unsafe fn scores_avx2(
    q: *const f32,
    d_k: usize,
    kv: &KvRows,
    lo: usize,
    n: usize,
    scores: *mut f32,
) -> usize {
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
        for (u, a) in acc.iter().enumerate() {
            *scores.add(j + u) = hsum(*a);
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
unsafe fn weighted_sum_avx2(
    p: *const f32,
    kv: &KvRows,
    lo: usize,
    n: usize,
    out: *mut f32,
    d_v: usize,
) {
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
                    _mm256_storeu_ps(
                        o,
                        _mm256_fmadd_ps(pj, load8(vr, c0 + i, kv.f16), _mm256_loadu_ps(o)),
                    );
                    i += 8;
                }
            }
        }
        c0 += width;
    }
}

/// Most queries one [`attend_tile`] call handles (register tile of the score product).
pub(crate) const TILE_QUERIES: usize = 6;

/// Keys per block of the tiled products; converted K/V ranges are padded to a multiple.
pub(crate) const KEY_BLOCK: usize = 16;

/// Converts keys `j0..j1` of one KV head to f32: `kt` transposed (`kt[d·ldk + (j - j0)]`),
/// `vf` row-major (`vf[(j - j0)·d_v + d]`), zero-padded to a multiple of [`KEY_BLOCK`] keys.
///
/// # Safety
/// `kv` rows `j0..j1` valid; `kt` holds `d_k·ldk` values with `ldk ≥` the padded count,
/// `vf` the padded count times `d_v`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn load_kv_f32(
    kv: &KvRows,
    d_k: usize,
    d_v: usize,
    j0: usize,
    j1: usize,
    kt: *mut f32,
    ldk: usize,
    vf: *mut f32,
) {
    let n = j1 - j0;
    let np = n.next_multiple_of(KEY_BLOCK);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && d_k.is_multiple_of(8) && d_v.is_multiple_of(8) {
        load_kv_avx2(kv, d_k, d_v, j0, n, np, kt, ldk, vf);
        return;
    }
    for j in 0..np {
        let (kr, vr) = (
            kv.k.add((j0 + j) * kv.k_stride),
            kv.v.add((j0 + j) * kv.v_stride),
        );
        for d in 0..d_k {
            *kt.add(d * ldk + j) = if j < n {
                load_scalar(kr, d, kv.f16)
            } else {
                0.0
            };
        }
        let dst = vf.add(j * d_v);
        #[cfg(target_arch = "x86_64")]
        if j < n && has_avx2() && d_v.is_multiple_of(8) {
            let mut d = 0;
            while d < d_v {
                _mm256_storeu_ps(dst.add(d), load8(vr, d, kv.f16));
                d += 8;
            }
            continue;
        }
        for d in 0..d_v {
            *dst.add(d) = if j < n {
                load_scalar(vr, d, kv.f16)
            } else {
                0.0
            };
        }
    }
}

/// The scores of keys `lo..lo + n` (Q8_0 rows) with the Q8_0 query `qq`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_q8_avx2(
    qq: *const u8,
    d_k: usize,
    kv: &KvRows,
    lo: usize,
    n: usize,
    sc: *mut f32,
) {
    for j in 0..n {
        *sc.add(j) = dot_q8::<true>(kv.k.add((lo + j) * kv.k_stride), qq, d_k / 32);
    }
}

/// [`load_kv_f32`] with 8×8 register transposes of the keys.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn load_kv_avx2(
    kv: &KvRows,
    d_k: usize,
    d_v: usize,
    j0: usize,
    n: usize,
    np: usize,
    kt: *mut f32,
    ldk: usize,
    vf: *mut f32,
) {
    let zero = _mm256_setzero_ps();
    let mut j = 0;
    while j < np {
        for d in (0..d_k).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|u| {
                if j + u < n {
                    load8(kv.k.add((j0 + j + u) * kv.k_stride), d, kv.f16)
                } else {
                    zero
                }
            });
            // 8×8 transpose: row u (key j+u, dims d..d+8) becomes column u.
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let c = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (l, v) in c.iter().enumerate() {
                _mm256_storeu_ps(kt.add((d + l) * ldk + j), *v);
            }
        }
        for u in 0..8 {
            let dst = vf.add((j + u) * d_v);
            let vr = kv.v.add((j0 + j + u) * kv.v_stride);
            let mut d = 0;
            while d < d_v {
                let x = if j + u < n {
                    load8(vr, d, kv.f16)
                } else {
                    zero
                };
                _mm256_storeu_ps(dst.add(d), x);
                d += 8;
            }
        }
        j += 8;
    }
}

/// One query of a tile: its f32 values, its visible keys and where its output goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileQuery {
    /// `d_k` query values.
    pub q: *const f32,
    /// Visible keys `lo..hi` (absolute positions).
    pub lo: usize,
    pub hi: usize,
    /// `d_v` output values.
    pub out: *mut f32,
}

/// Attention of up to [`TILE_QUERIES`] queries sharing one KV head whose keys `j0..` were
/// converted by [`load_kv_f32`] (every query's `lo..hi` inside the converted range). Same
/// arithmetic as [`attend`] (f16 rounding of Q and probabilities with an F16 cache).
///
/// `scratch` holds `TILE_QUERIES·(d_k + ldk)` values.
///
/// # Safety
/// As described; outputs do not overlap anything else.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend_tile(
    qs: &[TileQuery],
    d_k: usize,
    d_v: usize,
    j0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    f16: bool,
    p: &ScoreParams,
    scratch: *mut f32,
) {
    let nq = qs.len();
    let qbuf = scratch;
    let sc = scratch.add(TILE_QUERIES * d_k);
    // Key range of the tile, relative to j0, padded to whole blocks.
    let lo = qs.iter().map(|q| q.lo).min().unwrap_or(j0) - j0;
    let hi = qs.iter().map(|q| q.hi).max().unwrap_or(j0) - j0;
    for (i, q) in qs.iter().enumerate() {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() && d_k.is_multiple_of(8) {
            copy_round_avx2(q.q, qbuf.add(i * d_k), d_k, f16);
        } else {
            for d in 0..d_k {
                let x = *q.q.add(d);
                *qbuf.add(i * d_k + d) = if f16 { round_f16(x) } else { x };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for d in 0..d_k {
            let x = *q.q.add(d);
            *qbuf.add(i * d_k + d) = if f16 { round_f16(x) } else { x };
        }
        for d in 0..d_v {
            *q.out.add(d) = 0.0;
        }
    }
    if lo >= hi {
        return;
    }
    let b0 = lo / KEY_BLOCK * KEY_BLOCK;
    let b1 = hi.next_multiple_of(KEY_BLOCK);
    #[cfg(target_arch = "x86_64")]
    let simd = has_avx2() && d_v.is_multiple_of(16);
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    // Scores: sc[i·ldk + j] for j in b0..b1.
    #[cfg(target_arch = "x86_64")]
    if simd {
        match nq {
            1 => scores_tile_avx2::<1>(qbuf, d_k, kt, ldk, b0, b1, sc),
            2 => scores_tile_avx2::<2>(qbuf, d_k, kt, ldk, b0, b1, sc),
            3 => scores_tile_avx2::<3>(qbuf, d_k, kt, ldk, b0, b1, sc),
            4 => scores_tile_avx2::<4>(qbuf, d_k, kt, ldk, b0, b1, sc),
            5 => scores_tile_avx2::<5>(qbuf, d_k, kt, ldk, b0, b1, sc),
            _ => scores_tile_avx2::<6>(qbuf, d_k, kt, ldk, b0, b1, sc),
        }
    }
    if !simd {
        for i in 0..nq {
            for j in b0..b1 {
                let mut s = 0f32;
                for d in 0..d_k {
                    s += *qbuf.add(i * d_k + d) * *kt.add(d * ldk + j);
                }
                *sc.add(i * ldk + j) = s;
            }
        }
    }
    // Softmax of each query over its own keys; zero elsewhere in b0..b1.
    for (i, q) in qs.iter().enumerate() {
        let row = sc.add(i * ldk);
        let (ql, qh) = (q.lo - j0, q.hi - j0);
        for j in b0..ql.max(b0) {
            *row.add(j) = 0.0;
        }
        for j in qh.min(b1)..b1 {
            *row.add(j) = 0.0;
        }
        if ql >= qh {
            continue;
        }
        let w = row.add(ql);
        let n = qh - ql;
        let mut max = f32::NEG_INFINITY;
        for j in 0..n {
            let mut s = *w.add(j);
            if let Some(cap) = p.softcap {
                s = (s * (1.0 / cap)).tanh() * cap;
            }
            s *= p.kq_scale;
            *w.add(j) = s;
            max = max.max(s);
        }
        let sum = exp_shifted_sum(w, n, max);
        let inv = (1.0 / sum) as f32;
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            j = scale_round_avx2(w, n, inv, f16);
        }
        for j in j..n {
            let pj = *w.add(j) * inv;
            *w.add(j) = if f16 { round_f16(pj) } else { pj };
        }
    }
    // Weighted sums of V.
    #[cfg(target_arch = "x86_64")]
    if simd {
        let outs: [*mut f32; TILE_QUERIES] =
            std::array::from_fn(|i| qs.get(i).map_or(std::ptr::null_mut(), |q| q.out));
        match nq {
            1 => pv_tile_avx2::<1>(sc, ldk, vf, d_v, b0, b1, &outs),
            2 => pv_tile_avx2::<2>(sc, ldk, vf, d_v, b0, b1, &outs),
            3 => pv_tile_avx2::<3>(sc, ldk, vf, d_v, b0, b1, &outs),
            4 => pv_tile_avx2::<4>(sc, ldk, vf, d_v, b0, b1, &outs),
            5 => pv_tile_avx2::<5>(sc, ldk, vf, d_v, b0, b1, &outs),
            _ => pv_tile_avx2::<6>(sc, ldk, vf, d_v, b0, b1, &outs),
        }
        return;
    }
    for (i, q) in qs.iter().enumerate() {
        for j in b0..b1 {
            let pj = *sc.add(i * ldk + j);
            for d in 0..d_v {
                *q.out.add(d) += pj * *vf.add(j * d_v + d);
            }
        }
    }
}

/// `sc[i·ldk + j] = q_i · k_j` for keys `b0..b1` (whole blocks of 16) and `NQ` queries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_tile_avx2<const NQ: usize>(
    q: *const f32,
    d_k: usize,
    kt: *const f32,
    ldk: usize,
    b0: usize,
    b1: usize,
    sc: *mut f32,
) {
    let mut j = b0;
    while j < b1 {
        let mut acc = [[_mm256_setzero_ps(); 2]; NQ];
        for d in 0..d_k {
            let k0 = _mm256_loadu_ps(kt.add(d * ldk + j));
            let k1 = _mm256_loadu_ps(kt.add(d * ldk + j + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_broadcast_ss(&*q.add(i * d_k + d));
                a[0] = _mm256_fmadd_ps(qv, k0, a[0]);
                a[1] = _mm256_fmadd_ps(qv, k1, a[1]);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(sc.add(i * ldk + j), a[0]);
            _mm256_storeu_ps(sc.add(i * ldk + j + 8), a[1]);
        }
        j += KEY_BLOCK;
    }
}

/// `out_i[d] = Σ_j sc[i·ldk + j] · vf[j·d_v + d]` over keys `b0..b1` for `NQ` queries,
/// 16 output values at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pv_tile_avx2<const NQ: usize>(
    sc: *const f32,
    ldk: usize,
    vf: *const f32,
    d_v: usize,
    b0: usize,
    b1: usize,
    outs: &[*mut f32; TILE_QUERIES],
) {
    let mut c = 0;
    while c < d_v {
        let mut acc = [[_mm256_setzero_ps(); 2]; NQ];
        for j in b0..b1 {
            let v0 = _mm256_loadu_ps(vf.add(j * d_v + c));
            let v1 = _mm256_loadu_ps(vf.add(j * d_v + c + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                let pj = _mm256_broadcast_ss(&*sc.add(i * ldk + j));
                a[0] = _mm256_fmadd_ps(pj, v0, a[0]);
                a[1] = _mm256_fmadd_ps(pj, v1, a[1]);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(outs[i].add(c), a[0]);
            _mm256_storeu_ps(outs[i].add(c + 8), a[1]);
        }
        c += 16;
    }
}
