//! The activation quantizers of the row-dot kernels ([`crate::rows`]) in ggml's own block
//! layouts, AVX2 through `std::arch`: Q8_0 and Q8_1 as llama.cpp's x86 build quantizes them
//! (`quantize_row_q8_0` / `quantize_row_q8_1`, ggml-cpu/arch/x86/quants.c) and Q8_K as
//! `quantize_row_q8_K_ref` (ggml-quants.c). The numbers are those of
//! `ir::ggml::quantize(.., Q8Flavor::X86)`, which the tests compare these with byte for byte
//! and which is the path on hosts without AVX2 (and for other types).
//!
//! Per 32-value block (Q8_0 / Q8_1): `amax = max|x|`, `d = amax / 127`, `id = 127 / amax`
//! (0 for an all-zero block), `q = round_half_even(x · id)` (`vcvtps2dq` in the default
//! rounding mode), `d` stored as f16, Q8_1's `s = f16(d · Σq)`. Per 256-value block (Q8_K):
//! `max` the first value of largest magnitude, `iscale = -127 / max`,
//! `q = min(127, round_half_even(iscale · x))`, `d = 1 / iscale` as f32, `bsums` the sums of
//! each 16 quants (an all-zero block is all zeros).

use ir::ggml::GgmlType;

/// Quantizes `x` into `dst` as `act` (Q8_0, Q8_1 or Q8_K) if this host has the AVX2 path;
/// returns `false` (and writes nothing) otherwise or for another type.
///
/// `x.len()` must be a whole number of `act` blocks and `dst` exactly their bytes (the
/// caller, [`crate::rows::RowDot::prepare`], sized both at lowering).
pub(crate) fn quantize(act: GgmlType, x: &[f32], dst: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        let (bs, bytes) = (act.block_size(), act.type_size());
        if !x.len().is_multiple_of(bs) || dst.len() != x.len() / bs * bytes {
            return false;
        }
        // SAFETY: the host has AVX2, FMA and F16C; lengths checked just above.
        unsafe {
            match act {
                GgmlType::Q8_0 => x86::q8_0(x, dst, false),
                GgmlType::Q8_1 => x86::q8_0(x, dst, true),
                GgmlType::Q8_K => x86::q8_k(x, dst),
                _ => return false,
            }
        }
        return true;
    }
    let _ = (act, x, dst);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use ir::ggml::f32_to_f16;

    /// The eight f32 at `p`.
    ///
    /// # Safety
    /// AVX; `p` valid for 32 bytes.
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    /// The largest of the eight lanes.
    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// `round_half_even(x · s)` of 32 values at `x` as i8 at `q` (saturating, as the
    /// conversions of the reference do for in-range values); returns `Σ q`.
    #[inline(always)]
    unsafe fn round32(x: *const f32, s: __m256, q: *mut u8) -> i32 {
        let i: [__m256i; 4] =
            std::array::from_fn(|j| _mm256_cvtps_epi32(_mm256_mul_ps(load(x.add(8 * j)), s)));
        let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        // packs interleave the 128-bit halves: restore the order with one permute
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q as *mut __m256i, p);
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    }

    /// Q8_0 (`with_sum`: Q8_1) blocks of `x` into `dst` (module doc of the parent).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `x` whole 32-value blocks, `dst` exactly their bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0(x: &[f32], dst: &mut [u8], with_sum: bool) {
        let bytes = if with_sum { 36 } else { 34 };
        let qs = if with_sum { 4 } else { 2 };
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        for (xb, b) in x.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
            let p = xb.as_ptr();
            let m = (0..4).fold(_mm256_setzero_ps(), |m, j| {
                _mm256_max_ps(m, _mm256_and_ps(load(p.add(8 * j)), abs))
            });
            let amax = hmax(m);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let sum = round32(p, _mm256_set1_ps(id), b.as_mut_ptr().add(qs));
            b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            if with_sum {
                b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
            }
        }
    }

    /// Q8_K blocks of `x` into `dst` (module doc of the parent).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `x` whole 256-value blocks, `dst` exactly their bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_k(x: &[f32], dst: &mut [u8]) {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        for (xb, b) in x.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
            let p = xb.as_ptr();
            let m = (0..32).fold(_mm256_setzero_ps(), |m, j| {
                _mm256_max_ps(m, _mm256_and_ps(load(p.add(8 * j)), abs))
            });
            let amax = hmax(m);
            if amax == 0.0 {
                b.fill(0);
                continue;
            }
            // The first value of that magnitude gives the sign.
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            let s = _mm256_set1_ps(iscale);
            let q = b.as_mut_ptr().add(4);
            for j in 0..8 {
                round32(p.add(32 * j), s, q.add(32 * j));
            }
            // min(127, ·): only +128 can overflow (an iscale · x just above 127.5).
            let cap = _mm256_set1_epi8(127);
            for j in 0..8 {
                let v = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                _mm256_storeu_si256(q.add(32 * j) as *mut __m256i, _mm256_min_epi8(v, cap));
            }
            for g in 0..16 {
                let v = _mm_loadu_si128(q.add(16 * g) as *const __m128i);
                let w = _mm256_madd_epi16(_mm256_cvtepi8_epi16(v), _mm256_set1_epi16(1));
                let s = _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
                let sum = _mm_cvtsi128_si32(s) as i16;
                b[260 + 2 * g..262 + 2 * g].copy_from_slice(&sum.to_le_bytes());
            }
            b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::Q8Flavor;

    fn rng(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Byte for byte `ir::ggml::quantize(.., X86)`: random rows, rows with ties of the
    /// largest magnitude in both signs, all-zero blocks, halves (rounding ties) and outliers.
    #[test]
    fn quantizers_match_the_reference() {
        let mut seed = 0x5eed_1234_u64;
        for act in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            for case in 0..400 {
                let n = 512;
                let mut x: Vec<f32> = (0..n)
                    .map(|_| (rng(&mut seed) % 20001) as f32 / 1000.0 - 10.0)
                    .collect();
                match case % 5 {
                    0 => x[..256].fill(0.0),
                    1 => {
                        // the largest magnitude twice, negative first
                        x[7] = -12.5;
                        x[200] = 12.5;
                    }
                    2 => x.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0),
                    3 => x[(rng(&mut seed) % 512) as usize] = 1e4,
                    _ => {}
                }
                let bytes = n / act.block_size() * act.type_size();
                let mut want = vec![0u8; bytes];
                ir::ggml::quantize(act, &x, &mut want, Q8Flavor::X86).expect("quantizes");
                let mut got = vec![0u8; bytes];
                if !quantize(act, &x, &mut got) {
                    eprintln!("no AVX2 path on this host");
                    return;
                }
                assert_eq!(got, want, "{act} case {case}");
            }
        }
    }
}
