//! What the attention kernels share: where a KV head's rows are ([`KvRows`]), the score
//! parameters ([`ScoreParams`]), and the conversion of a range of cached keys and values to
//! f32 ([`load_kv_f32`]) that the tiled flash kernel reads. The kernels themselves are
//! [`super::flash`] (llama.cpp's flash attention, its CPU default) and
//! [`super::soft_max_attn`] (its soft_max path, `-fa off`).
//!
//! Plain Rust (not Cranelift): AVX2 + FMA + F16C through `std::arch` when the host has them,
//! scalar otherwise.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::has_avx2;

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
    /// Cells masked inside the query's visible span `lo..hi` (a wrapped ring's older
    /// positions, [`ir::graph::VisibleCells::gap`]); empty (`(x, x)`) otherwise.
    pub gap: (usize, usize),
}

impl KvRows {
    /// The visible cells of `lo..hi` as two ranges in cell order (around [`KvRows::gap`]).
    #[inline(always)]
    pub fn ranges(&self, lo: usize, hi: usize) -> [std::ops::Range<usize>; 2] {
        let (g0, g1) = self.gap;
        if g0 < g1 {
            [lo..g0.clamp(lo, hi), g1.clamp(lo, hi)..hi]
        } else {
            [lo..hi, hi..hi]
        }
    }
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
