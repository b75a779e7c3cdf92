//! Hand-written dot products of one weight row (ggml blocks) with one activation row (its
//! `vec_dot_type` blocks), for the row-dot kernels of [`crate::rows`]: AVX2 through
//! `std::arch`, computing what llama.cpp's x86 AVX2 kernel of the type computes, bit for bit
//! (`ggml_vec_dot_*`, ggml-cpu/arch/x86/quants.c). A type without a routine here, or a host
//! without AVX2, takes the plain lane-faithful routine of `ir::ggml::vec_dot_avx2`, which the
//! tests compare these with.
//!
//! What "the same lanes" means for the K-quants: ggml's AVX2 kernels keep eight i32 lanes per
//! super-block, lane `j` holding the products at bytes `4j..4j+4` of every 32-value vector
//! (`maddubs` then `madd` pair neighbours), each scaled by its 16-value sub-block scale; the
//! lanes are converted to f32 once per super-block and added with one fused multiply-add by
//! the super-block scale `d = d_x · d_y`; the row ends with `hsum_float_8`. Integer sums are
//! exact in any order, so only the lane partition and the float steps must match.

use ir::ggml::GgmlType;

/// A dot product of two whole rows of the same number of values.
///
/// # Safety
/// The host must have the CPU features the routine was chosen for ([`dot_fn`] checks), and
/// the rows must be whole rows of the weight type and its `vec_dot_type` of equal length.
pub(crate) type DotFn = unsafe fn(&[u8], &[u8]) -> f32;

/// The hand-written routine for weights of type `wtype` on this host, if there is one.
pub(crate) fn dot_fn(wtype: GgmlType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        return match wtype {
            GgmlType::Q6_K => Some(x86::q6_k_q8_k),
            _ => None,
        };
    }
    let _ = wtype;
    None
}

/// Bytes of a `block_q8_K`: f32 `d`, 256 × i8 `qs`, 16 × i16 `bsums`.
#[cfg(target_arch = "x86_64")]
const Q8_K_BYTES: usize = 4 + 256 + 32;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Q8_K_BYTES;
    use ir::ggml::cpu_math::hsum8;
    use ir::ggml::f16_to_f32;

    /// Bytes of a `block_q6_K`: `ql[128]`, `qh[64]`, `scales[16]` (i8), f16 `d`.
    const Q6_K_BYTES: usize = 128 + 64 + 16 + 2;

    /// `ggml_vec_dot_q6_K_q8_K` (AVX2). Per super-block, 8 i32 lanes: lane `j` sums, over
    /// the eight 32-value vectors, `scale[v/16] · q6[v] · q8[v]` for the values `v` at bytes
    /// `4j..4j+4` of the vector (`q6` unsigned, 0..63), minus `32 · (bsums[2j]·scale[2j] +
    /// bsums[2j+1]·scale[2j+1])` (the `-32` offset, folded through the activation sums);
    /// then `acc = fma(d_x·d_y, f32(lane), acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2 and FMA; `w` whole Q6_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q6_K_BYTES).min(a.len() / Q8_K_BYTES);
        let low4 = _mm256_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q6_K_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let (ql, qh, sc) = (x, x.add(128), x.add(192));
            let dx = f16_to_f32(u16::from_le_bytes([*x.add(208), *x.add(209)]));
            let dy = f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)]);
            let d = dy * dx;
            let q8 = y.add(4);
            let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
            let scales = _mm_loadu_si128(sc as *const __m128i);
            // 32 · Σ bsum · scale per pair of 16-value groups, lane j = groups 2j, 2j+1.
            let offset =
                _mm256_slli_epi32(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(scales)), 5);
            let mut sumi = _mm256_setzero_si256();
            for half in 0..2 {
                let l0 = _mm256_loadu_si256(ql.add(64 * half) as *const __m256i);
                let l1 = _mm256_loadu_si256(ql.add(64 * half + 32) as *const __m256i);
                let h = _mm256_loadu_si256(qh.add(32 * half) as *const __m256i);
                // The four 32-value vectors of this half: low/high nibbles of ql, 2 bits of qh.
                let hi = |shift: i32| -> __m256i {
                    // (qh >> shift) & 3, moved to bits 4..5.
                    let m = _mm256_and_si256(
                        _mm256_srlv_epi32(h, _mm256_set1_epi32(shift)),
                        _mm256_set1_epi8(3),
                    );
                    _mm256_slli_epi16(m, 4)
                };
                let q = [
                    _mm256_or_si256(_mm256_and_si256(l0, low4), hi(0)),
                    _mm256_or_si256(_mm256_and_si256(l1, low4), hi(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), hi(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), hi(6)),
                ];
                for (v, qv) in q.iter().enumerate() {
                    let y8 = _mm256_loadu_si256(q8.add(128 * half + 32 * v) as *const __m256i);
                    let p16 = _mm256_maddubs_epi16(*qv, y8);
                    // Scales of the two 16-value groups of this vector, 8 × i16 each.
                    let g = 8 * half + 2 * v;
                    let s0 = *sc.add(g) as i8 as i16;
                    let s1 = *sc.add(g + 1) as i8 as i16;
                    let s = _mm256_setr_epi16(
                        s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1,
                    );
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p16));
                }
            }
            sumi = _mm256_sub_epi32(sumi, offset);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        hsum8(&lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::{quantize_activations, vec_dot, Q8Flavor};

    fn rng(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random whole blocks of `t` with finite, moderate f16 scales at the offsets listed.
    fn random_row(t: GgmlType, blocks: usize, f16_at: &[usize], seed: &mut u64) -> Vec<u8> {
        let mut row: Vec<u8> = (0..blocks * t.type_size())
            .map(|_| rng(seed) as u8)
            .collect();
        for b in 0..blocks {
            for &o in f16_at {
                let v = half::f16::from_f32((rng(seed) % 1000) as f32 / 20000.0 + 1e-3);
                row[b * t.type_size() + o..][..2].copy_from_slice(&v.to_le_bytes());
            }
        }
        row
    }

    /// Every routine agrees with ggml's scalar dot product of the type to rounding (same
    /// maths, another order), and with `ir::ggml::vec_dot_avx2` (the same order) bit for bit
    /// where that computes the type.
    #[test]
    fn routines_match_the_references() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for (t, f16_at) in [(GgmlType::Q6_K, &[208usize][..])] {
            let Some(f) = dot_fn(t) else {
                eprintln!("no hand-written routine for {} on this host", t.name());
                continue;
            };
            for blocks in [1usize, 3, 8] {
                for _ in 0..20 {
                    let w = random_row(t, blocks, f16_at, &mut seed);
                    let x: Vec<f32> = (0..blocks * 256)
                        .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).expect("quantizes");
                    // SAFETY: `dot_fn` chose it for this host; whole rows of equal length.
                    let got = unsafe { f(&w, &act) };
                    let scalar = vec_dot(t, &w, &act).expect("scalar dot");
                    assert!(
                        (got - scalar).abs() <= 1e-4 * scalar.abs().max(1.0),
                        "{}: {got} vs scalar {scalar}",
                        t.name()
                    );
                    if let Ok(x86) = ir::ggml::vec_dot_avx2(t, &w, &act) {
                        assert_eq!(got.to_bits(), x86.to_bits(), "{}: {got} vs {x86}", t.name());
                    }
                }
            }
        }
    }
}
