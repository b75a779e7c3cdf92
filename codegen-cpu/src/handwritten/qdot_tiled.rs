//! Hand-written dot products of one weight row with one activation row in the order of
//! llama.cpp's prompt-sized matrix products (8 or more activation columns) on x86 AVX2:
//!
//! - ggml-cpu's tiled K-quant kernel (ggml-cpu/tiled: `tiled.cpp`, the AVX2 microkernel of
//!   `tiled-kernel.cpp`) for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights with Q8_K
//!   activations;
//! - llamafile's tinyBLAS (`tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>`, ggml-cpu/llamafile/
//!   sgemm.cpp) for IQ4_NL weights with Q8_0 activations (two or more columns).
//!
//! Each routine returns, bit for bit, what `ir::ggml::vec_dot_avx2_mul_mat(t, w, a, 8)`
//! returns (the scalar reproduction these are tested against).
//!
//! The tiled order: per 256-value super-block, the exact integers
//! `s1 = Σ_sub scale · (w · y)` and, for the types with mins (Q2_K, Q4_K, Q5_K),
//! `s2 = Σ_sub min · bsum`; then one f32 `r = xd · s1`, `r = fma(-xdmin, s2, r)` where there
//! are mins, and `out = fma(r, yd, out)` from `out = 0`. The integer sums are exact in any
//! order, so they are computed here in whatever lane order is fastest (nibbles unpacked,
//! `maddubs` / `madd` against per-16 or per-32 scales in i32 lanes, one horizontal sum per
//! super-block); only the float steps follow llama.cpp's order. None of the partial sums
//! can overflow (the largest `maddubs` pair is `2 · 63 · 128` for Q6_K; IQ4_XS and IQ4_NL use
//! ggml's sign trick, `maddubs(|w|, y · sign(w))`, exactly as the reference does, so even
//! an activation byte of -128 gives the reference's number).
//!
//! The tinyBLAS order for IQ4_NL is lane-exact: eight f32 lanes, lane `l` accumulating
//! `fma(dx · dy, isum_l, acc_l)` over the blocks, `isum_l` the sum of the products at bytes
//! `4l .. 4l + 4` of the block's 32-byte vector (low nibbles first, then high nibbles);
//! then ggml's `hsum_float_8`.
//!
//! Portability: every `std::arch` item is inside `#[cfg(target_arch = "x86_64")]` code and
//! [`tiled_fn`] returns a routine only when [`super::has_avx2`] says the host has AVX2, FMA
//! and F16C; elsewhere callers take `ir::ggml::vec_dot_avx2_mul_mat`.

use ir::ggml::GgmlType;

/// A dot product of two whole rows of the same number of values (weight blocks, then
/// activation blocks: Q8_K, or Q8_0 for IQ4_NL).
///
/// # Safety
/// The host must have the CPU features the routine was chosen for ([`tiled_fn`] checks).
/// The routines read only whole blocks inside both slices (the number of blocks is the
/// smaller of the two rows' block counts), but callers must pass rows of equal value
/// counts to get the product.
pub(crate) type TiledFn = unsafe fn(&[u8], &[u8]) -> f32;

/// The hand-written routine for the prompt-sized (8 or more activation columns) product of
/// weights of type `wtype` on this host, if there is one: what
/// `ir::ggml::vec_dot_avx2_mul_mat(wtype, w, a, n)` computes for `n >= 8`, for Q2_K, Q3_K,
/// Q4_K, Q5_K, Q6_K, IQ4_XS (tiled kernel) and IQ4_NL (tinyBLAS, the same from `n >= 2`).
pub(crate) fn tiled_fn(wtype: GgmlType, tier: crate::target::Tier) -> Option<TiledFn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() {
        return tiled_fn_on(wtype, tier.vnni());
    }
    let _ = (wtype, tier);
    None
}

/// [`tiled_fn`] from the AVX-512 VNNI build (`vnni`, which the host must have) or the AVX2
/// one.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tiled_fn_on(wtype: GgmlType, vnni: bool) -> Option<TiledFn> {
    if super::has_avx2() {
        // The routine `$f` of the build `vnni` names.
        macro_rules! pick {
            ($f:ident) => {
                Some(if vnni {
                    x86::vnni::$f as TiledFn
                } else {
                    x86::avx2::$f
                })
            };
        }
        return match wtype {
            GgmlType::Q2_K => pick!(q2_k_q8_k_tiled),
            GgmlType::Q3_K => pick!(q3_k_q8_k_tiled),
            GgmlType::Q4_K => pick!(q4_k_q8_k_tiled),
            GgmlType::Q5_K => pick!(q5_k_q8_k_tiled),
            GgmlType::Q6_K => pick!(q6_k_q8_k_tiled),
            GgmlType::IQ4_XS => pick!(iq4_xs_q8_k_tiled),
            GgmlType::IQ3_XXS => pick!(iq3_xxs_q8_k_tiled),
            GgmlType::IQ3_S => pick!(iq3_s_q8_k_tiled),
            GgmlType::IQ2_XXS => pick!(iq2_xxs_q8_k_tiled),
            GgmlType::IQ2_XS => pick!(iq2_xs_q8_k_tiled),
            GgmlType::IQ2_S => pick!(iq2_s_q8_k_tiled),
            GgmlType::IQ1_S => pick!(iq1_s_q8_k_tiled),
            GgmlType::IQ1_M => pick!(iq1_m_q8_k_tiled),
            GgmlType::IQ4_NL => pick!(iq4_nl_q8_0_tinyblas),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => super::fdot::tinyblas_fn(wtype),
            _ => None,
        };
    }
    let _ = wtype;
    None
}

/// Four columns at once: `out[c]` is what the [`TiledFn`] of the type gives for the weight
/// row and activation row `a[c]` (the weight's blocks are unpacked once for the four).
///
/// # Safety
/// As [`TiledFn`], for each column.
pub(crate) type Tiled4Fn = unsafe fn(&[u8], &[&[u8]; 4]) -> [f32; 4];

/// The four-column form of [`tiled_fn`]'s routine for `wtype` on this host, if there is one.
pub(crate) fn tiled4_fn(wtype: GgmlType, tier: crate::target::Tier) -> Option<Tiled4Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() {
        return tiled4_fn_on(wtype, tier.vnni());
    }
    let _ = (wtype, tier);
    None
}

/// [`tiled4_fn`] from the AVX-512 VNNI build (`vnni`, which the host must have) or the AVX2
/// one.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tiled4_fn_on(wtype: GgmlType, vnni: bool) -> Option<Tiled4Fn> {
    if super::has_avx2() {
        // The routine `$f` of the build `vnni` names.
        macro_rules! pick {
            ($f:ident) => {
                Some(if vnni {
                    x86::vnni::$f as Tiled4Fn
                } else {
                    x86::avx2::$f
                })
            };
        }
        return match wtype {
            GgmlType::Q2_K => pick!(q2_k_q8_k_tiled4),
            GgmlType::Q3_K => pick!(q3_k_q8_k_tiled4),
            GgmlType::Q4_K => pick!(q4_k_q8_k_tiled4),
            GgmlType::Q5_K => pick!(q5_k_q8_k_tiled4),
            GgmlType::Q6_K => pick!(q6_k_q8_k_tiled4),
            GgmlType::IQ4_XS => pick!(iq4_xs_q8_k_tiled4),
            GgmlType::IQ3_XXS => pick!(iq3_xxs_q8_k_tiled4),
            GgmlType::IQ3_S => pick!(iq3_s_q8_k_tiled4),
            GgmlType::IQ2_XXS => pick!(iq2_xxs_q8_k_tiled4),
            GgmlType::IQ2_XS => pick!(iq2_xs_q8_k_tiled4),
            GgmlType::IQ2_S => pick!(iq2_s_q8_k_tiled4),
            GgmlType::IQ1_S => pick!(iq1_s_q8_k_tiled4),
            GgmlType::IQ1_M => pick!(iq1_m_q8_k_tiled4),
            GgmlType::IQ4_NL => pick!(iq4_nl_q8_0_tinyblas4),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => super::fdot::tinyblas4_fn(wtype),
            _ => None,
        };
    }
    let _ = wtype;
    None
}

#[cfg(target_arch = "x86_64")]
pub(in crate::handwritten) mod x86 {
    use std::arch::x86_64::*;

    use crate::handwritten::qdot::x86::{
        iq1_m_d, iq1_m_parts, iq1_s_parts, iq2_s_parts, iq2_xs_parts, iq2_xxs_parts, iq3_s_parts,
        iq3_xxs_parts, opaque128,
    };
    use ir::ggml::KVALUES_IQ4NL;

    /// Bytes of a `block_q8_K`: f32 `d`, 256 × i8 `qs` @4, 16 × i16 `bsums` @260.
    const Q8_K_BYTES: usize = 292;
    /// Bytes of a `block_q8_0`: f16 `d`, 32 × i8 `qs` @2.
    const Q8_0_BYTES: usize = 34;
    /// `block_q2_K`: `scales[16]` @0, `qs[64]` @16, f16 `d` @80, f16 `dmin` @82.
    const Q2_K_BYTES: usize = 84;
    /// `block_q3_K`: `hmask[32]` @0, `qs[64]` @32, `scales[12]` @96, f16 `d` @108.
    const Q3_K_BYTES: usize = 110;
    /// `block_q4_K`: f16 `d` @0, f16 `dmin` @2, `scales[12]` @4, `qs[128]` @16.
    const Q4_K_BYTES: usize = 144;
    /// `block_q5_K`: f16 `d` @0, f16 `dmin` @2, `scales[12]` @4, `qh[32]` @16, `qs[128]` @48.
    const Q5_K_BYTES: usize = 176;
    /// `block_q6_K`: `ql[128]` @0, `qh[64]` @128, i8 `scales[16]` @192, f16 `d` @208.
    const Q6_K_BYTES: usize = 210;
    /// `block_iq4_xs`: f16 `d` @0, u16 `scales_h` @2, `scales_l[4]` @4, `qs[128]` @8.
    const IQ4_XS_BYTES: usize = 136;
    /// `block_iq3_xxs`: f16 `d` @0, grid indices `qs[64]` @2, `scales_and_signs[32]` @66.
    const IQ3_XXS_BYTES: usize = 98;
    /// `block_iq2_xxs`: f16 `d` @0, `qs[64]` @2.
    const IQ2_XXS_BYTES: usize = 66;
    /// `block_iq2_xs`: f16 `d` @0, `qs[32]` (u16) @2, `scales[8]` @66.
    const IQ2_XS_BYTES: usize = 74;
    /// `block_iq2_s`: f16 `d` @0, `qs[64]` @2 (indices, then signs), `qh[8]` @66,
    /// `scales[8]` @74.
    const IQ2_S_BYTES: usize = 82;
    /// `block_iq1_s`: f16 `d` @0, `qs[32]` @2, `qh[8]` (u16) @34.
    const IQ1_S_BYTES: usize = 50;
    /// `block_iq1_m`: `qs[32]` @0, `qh[16]` @32, `scales[8]` @48.
    const IQ1_M_BYTES: usize = 56;
    /// `block_iq3_s`: f16 `d` @0, `qs[64]` @2, `qh[8]` @66, `signs[32]` @74, `scales[4]` @106.
    const IQ3_S_BYTES: usize = 110;
    /// `block_iq4_nl`: f16 `d` @0, `qs[16]` @2.
    const IQ4_NL_BYTES: usize = 18;

    // ---- Shared pieces -----------------------------------------------------------------

    /// The f16 with bits `h` as f32 (exact; NaNs made quiet, as `vcvtph2ps` does).
    ///
    /// Integer code: measured faster here than a one-lane `vcvtph2ps` in the Q5_K and
    /// IQ4_XS loops (2.5 times slower there, for reasons not found), and the value is off
    /// the loop's dependency chain either way.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn f16_bits(h: u16) -> f32 {
        let h = h as u32;
        let sign = (h & 0x8000) << 16;
        let em = h & 0x7fff;
        let bits = if em < 0x0400 {
            // zero or subnormal: em · 2^-24, exact
            (em as f32 * f32::from_bits(0x3380_0000)).to_bits()
        } else if em < 0x7c00 {
            // normal: the exponent rebiased from 15 to 127
            (em << 13) + (112 << 23)
        } else if em == 0x7c00 {
            0x7f80_0000
        } else {
            (em << 13) | 0x7fc0_0000
        };
        f32::from_bits(bits | sign)
    }

    /// The f16 at `p` as f32 (exact).
    ///
    /// # Safety
    /// F16C; `p` valid for two bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_at(p: *const u8) -> f32 {
        f16_bits(u16::from_le_bytes([*p, *p.add(1)]))
    }

    /// The product of the f16s at `p` and `q` as f32 (`f32(p) · f32(q)`, one rounding).
    ///
    /// # Safety
    /// F16C; `p` and `q` valid for two bytes each.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_product(p: *const u8, q: *const u8) -> f32 {
        let hp = u16::from_le_bytes([*p, *p.add(1)]) as u32;
        let hq = u16::from_le_bytes([*q, *q.add(1)]) as u32;
        let v = _mm_cvtph_ps(opaque128(_mm_cvtsi32_si128((hp | (hq << 16)) as i32)));
        _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
    }

    /// The little-endian f32 at `p`.
    ///
    /// # Safety
    /// `p` valid for four bytes.
    #[inline(always)]
    unsafe fn f32_at(p: *const u8) -> f32 {
        f32::from_bits(u32::from_le(std::ptr::read_unaligned(p as *const u32)))
    }

    /// The little-endian u32 at `p`.
    ///
    /// # Safety
    /// `p` valid for four bytes.
    #[inline(always)]
    unsafe fn u32_at(p: *const u8) -> u32 {
        u32::from_le(std::ptr::read_unaligned(p as *const u32))
    }

    /// 32 bytes at `p`.
    ///
    /// # Safety
    /// AVX; `p` valid for 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load256(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }

    /// 16 bytes at `p`.
    ///
    /// # Safety
    /// SSE2; `p` valid for 16 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load128(p: *const u8) -> __m128i {
        _mm_loadu_si128(p as *const __m128i)
    }

    /// The sums of the eight i32 lanes of `a` and of `b` (wrapping, as registers add; the
    /// sums here never wrap).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum2_i32(a: __m256i, b: __m256i) -> (i32, i32) {
        // [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
        let t = _mm256_hadd_epi32(a, b);
        let u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let v = _mm_hadd_epi32(u, u);
        (_mm_cvtsi128_si32(v), _mm_extract_epi32::<1>(v))
    }

    /// The sum of the eight i32 lanes of `a` (wrapping).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum_i32(a: __m256i) -> i32 {
        let u = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let u = _mm_add_epi32(u, _mm_shuffle_epi32::<0b01_00_11_10>(u));
        let u = _mm_add_epi32(u, _mm_shuffle_epi32::<0b10_11_00_01>(u));
        _mm_cvtsi128_si32(u)
    }

    /// One super-block of the tiled kernel without mins: `out = fma(xd · s1, yd, out)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tiled_step(out: f32, xd: f32, s1: i32, yd: f32) -> f32 {
        (xd * s1 as f32).mul_add(yd, out)
    }

    /// One super-block of the tiled kernel with mins:
    /// `out = fma(fma(-xdmin, s2, xd · s1), yd, out)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tiled_step_min(out: f32, xd: f32, xdmin: f32, s1: i32, s2: i32, yd: f32) -> f32 {
        let r = (-xdmin).mul_add(s2 as f32, xd * s1 as f32);
        r.mul_add(yd, out)
    }

    /// `v` unchanged, through an empty `asm!` that LLVM cannot see into. Used on the
    /// broadcast scale vectors: seeing that both 128-bit halves are equal, LLVM otherwise
    /// rewrites each one-instruction `pshufb` of them into up to three shuffles
    /// (`pshuflw` / `pshufd` / `vpermq`), all on the one shuffle port (measured: Q2_K and
    /// Q6_K about 15% faster with it).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn opaque(mut v: __m256i) -> __m256i {
        // SAFETY: the template is empty; the register is passed through unchanged.
        unsafe {
            std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
        }
        v
    }

    /// The `pshufb` mask that puts i16 lane `lo` (of a 128-bit vector of eight i16, the
    /// same in both halves) into all eight i16 lanes of the low half and i16 lane `hi` into
    /// all eight of the high half.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pick16(lo: i32, hi: i32) -> __m256i {
        let l = (((2 * lo + 1) << 8) | (2 * lo)) as i16;
        let h = (((2 * hi + 1) << 8) | (2 * hi)) as i16;
        _mm256_setr_m128i(_mm_set1_epi16(l), _mm_set1_epi16(h))
    }

    /// 16 per-16-value scales as i16, `v` holding them as bytes (unsigned when `signed` is
    /// false): `(lo, hi)`, `lo` holding scales 0..8 and `hi` scales 8..16, each in both
    /// 128-bit halves (for [`pick16`] shuffles), and `all`, the sixteen in order (for a
    /// `madd` with the Q8_K `bsums`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scales16(v: __m128i, signed: bool) -> (__m256i, __m256i, __m256i) {
        let (a, b) = if signed {
            (
                _mm_cvtepi8_epi16(v),
                _mm_cvtepi8_epi16(_mm_unpackhi_epi64(v, v)),
            )
        } else {
            (
                _mm_cvtepu8_epi16(v),
                _mm_cvtepu8_epi16(_mm_unpackhi_epi64(v, v)),
            )
        };
        (
            opaque(_mm256_broadcastsi128_si256(a)),
            opaque(_mm256_broadcastsi128_si256(b)),
            _mm256_setr_m128i(a, b),
        )
    }

    /// The eight 6-bit scales and eight 6-bit mins of a Q4_K / Q5_K super-block (ggml's
    /// `get_scale_min_k4` for `j = 0..8`), as bytes `j` of two u64: `(scales, mins)`.
    ///
    /// # Safety
    /// `p` valid for the 12 bytes of `scales`.
    #[inline(always)]
    unsafe fn k4_scales_mins(p: *const u8) -> (u64, u64) {
        let (u0, u1, u2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
        let sc_lo = u0 & 0x3f3f_3f3f;
        let mn_lo = u1 & 0x3f3f_3f3f;
        let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
        let mn_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
        (
            sc_lo as u64 | ((sc_hi as u64) << 32),
            mn_lo as u64 | ((mn_hi as u64) << 32),
        )
    }

    /// `s2 = Σ_g min_g · (bsums[2g] + bsums[2g+1])` of a Q4_K / Q5_K super-block, as eight
    /// i32 lanes (lane `g` = the term of group `g`).
    ///
    /// # Safety
    /// AVX2; `y` valid for the 292 bytes of a Q8_K block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn k4_mins_lanes(mins: u64, y: *const u8) -> __m256i {
        // each min twice, for the two 16-value bsums of its 32-value group
        let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        let m = _mm_shuffle_epi8(_mm_cvtsi64_si128(mins as i64), dup);
        _mm256_madd_epi16(load256(y.add(260)), _mm256_cvtepu8_epi16(m))
    }

    /// The i32 lanes of `Σ scale_g · (q · y)` over the eight 32-value groups of a Q4_K /
    /// Q5_K super-block, `quants(j)` giving the unsigned quants of groups `2j` and `2j + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (inlined into them); `y` valid for
    /// the 292 bytes of a Q8_K block.
    #[inline(always)]
    unsafe fn k4_sums<const V: bool>(
        scales: u64,
        y: *const u8,
        quants: impl Fn(usize) -> (__m256i, __m256i),
    ) -> __m256i {
        let sc = opaque(_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(
            _mm_cvtsi64_si128(scales as i64),
        )));
        let q8 = y.add(4);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = quants(j);
            let plo = _mm256_maddubs_epi16(lo, load256(q8.add(64 * j)));
            let phi = _mm256_maddubs_epi16(hi, load256(q8.add(64 * j + 32)));
            let g = 2 * j as i32;
            let slo = _mm256_shuffle_epi8(sc, pick16(g, g));
            let shi = _mm256_shuffle_epi8(sc, pick16(g + 1, g + 1));
            acc = madd_acc::<V>(acc, plo, slo);
            acc = madd_acc::<V>(acc, phi, shi);
        }
        acc
    }

    /// `Σ scale_j · (q · y)` over the sixteen 16-value sub-blocks of a Q2_K / Q3_K / Q6_K
    /// super-block, as i32 lanes: `quants(half, k)` gives the unsigned quants of the 32-value
    /// group `4 half + k` (sub-blocks `2g`, `2g + 1`), `(sc_lo, sc_hi)` the scales from
    /// [`scales16`].
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (inlined into them); `y` valid for
    /// the 292 bytes of a Q8_K block.
    #[inline(always)]
    unsafe fn k16_sums<const V: bool>(
        sc_lo: __m256i,
        sc_hi: __m256i,
        y: *const u8,
        quants: impl Fn(usize, usize) -> __m256i,
    ) -> __m256i {
        let q8 = y.add(4);
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let sc = if half == 0 { sc_lo } else { sc_hi };
            for k in 0..4 {
                let q = quants(half, k);
                let p = _mm256_maddubs_epi16(q, load256(q8.add(128 * half + 32 * k)));
                let s = _mm256_shuffle_epi8(sc, pick16(2 * k as i32, 2 * k as i32 + 1));
                acc = madd_acc::<V>(acc, p, s);
            }
        }
        acc
    }

    /// The number of whole super-blocks the weight row and every activation row have.
    #[inline(always)]
    fn blocks<const C: usize>(w: &[u8], wb: usize, a: &[&[u8]; C], ab: usize) -> usize {
        a.iter().fold(w.len() / wb, |n, r| n.min(r.len() / ab))
    }

    /// `acc + madd(p, s)`: the i16 pairs of `p` times those of `s`, summed into i32 lanes
    /// (`pmaddwd`) and added. With `V` (AVX-512 VNNI builds) one `vpdpwssd`, which computes
    /// the same sums (it does not saturate, and no pair here can reach the one `pmaddwd`
    /// overflow, `-32768 · -32768` twice).
    ///
    /// # Safety
    /// Inlined into a routine with AVX2 (and, with `V`, AVX-512 VNNI and VL).
    #[inline(always)]
    unsafe fn madd_acc<const V: bool>(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
        if V {
            _mm256_dpwssd_epi32(acc, p, s)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
        }
    }

    /// The one-column and four-column entry points of each column-generic routine
    /// (`$generic::<C, V>(w, a) -> [f32; C]`), with the target features (so that the
    /// generic body is inlined into them with those features on): one module per build.
    macro_rules! entry_points {
        ($vnni:literal, $features:literal, $(($one:ident, $four:ident, $generic:ident)),* $(,)?) => {
            $(
                /// One column ([`super::TiledFn`]).
                ///
                /// # Safety
                #[doc = concat!("The host has ", $features, "; `w` whole weight blocks, `a` as many")]
                /// activation blocks (only the whole blocks both have are read).
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn $one(w: &[u8], a: &[u8]) -> f32 {
                    $generic::<1, $vnni>(w, &[a])[0]
                }

                /// Four columns ([`super::Tiled4Fn`]): each output as the one-column routine
                /// gives it; the weight's blocks are unpacked once for the four.
                ///
                /// # Safety
                /// As the one-column routine, for each column.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn $four(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
                    $generic::<4, $vnni>(w, a)
                }
            )*
        };
    }

    /// Both builds' entry points of every tiled routine.
    macro_rules! all_entry_points {
        ($vnni:literal, $features:literal) => {
            entry_points!(
                $vnni,
                $features,
                (q4_k_q8_k_tiled, q4_k_q8_k_tiled4, q4_k_tiled),
                (q5_k_q8_k_tiled, q5_k_q8_k_tiled4, q5_k_tiled),
                (q6_k_q8_k_tiled, q6_k_q8_k_tiled4, q6_k_tiled),
                (q2_k_q8_k_tiled, q2_k_q8_k_tiled4, q2_k_tiled),
                (q3_k_q8_k_tiled, q3_k_q8_k_tiled4, q3_k_tiled),
                (iq4_xs_q8_k_tiled, iq4_xs_q8_k_tiled4, iq4_xs_tiled),
                (iq3_xxs_q8_k_tiled, iq3_xxs_q8_k_tiled4, iq3_xxs_tiled),
                (iq3_s_q8_k_tiled, iq3_s_q8_k_tiled4, iq3_s_tiled),
                (iq2_xxs_q8_k_tiled, iq2_xxs_q8_k_tiled4, iq2_xxs_tiled),
                (iq2_xs_q8_k_tiled, iq2_xs_q8_k_tiled4, iq2_xs_tiled),
                (iq2_s_q8_k_tiled, iq2_s_q8_k_tiled4, iq2_s_tiled),
                (iq1_s_q8_k_tiled, iq1_s_q8_k_tiled4, iq1_s_tiled),
                (iq1_m_q8_k_tiled, iq1_m_q8_k_tiled4, iq1_m_tiled),
                (iq4_nl_q8_0_tinyblas, iq4_nl_q8_0_tinyblas4, iq4_nl_tinyblas),
            );
        };
    }

    // ---- The tiled K-quant kernels ----------------------------------------------------
    //
    // Each is generic over the number of activation columns `C` and the build `V`: per
    // super-block, the weight's quants and scales are unpacked once, then every column's
    // integer sums and float steps follow (each column's numbers are those of the
    // one-column form, in either build).

    /// AVX2, FMA and F16C: ggml's own instructions.
    pub(super) mod avx2 {
        use super::*;
        all_entry_points!(false, "avx2,fma,f16c");
    }

    /// AVX-512 VNNI and VL as well: each `pmaddwd` + add is one `vpdpwssd`
    /// ([`super::super::has_vnni`]).
    pub(super) mod vnni {
        use super::*;
        all_entry_points!(true, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni");
    }

    /// The Q4_K / Q5_K tiled step for `C` columns, the eight 32-value groups' unsigned
    /// quants `q[j] = (group 2j, group 2j + 1)` unpacked: per column `s1 = Σ_g sc_g · (q · y)`,
    /// `s2 = Σ_g m_g · (bsums[2g] + bsums[2g+1])`, `out = fma(fma(-dmin, s2, d · s1), yd, out)`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (inlined into them); `x` a whole
    /// Q4_K / Q5_K block (`d`, `dmin`, `scales` at 0, 2, 4), each `y[c]` a whole Q8_K block.
    #[inline(always)]
    unsafe fn k4_step<const C: usize, const V: bool>(
        x: *const u8,
        q: &[(__m256i, __m256i); 4],
        y: [*const u8; C],
        out: &mut [f32; C],
    ) {
        let (scales, mins) = k4_scales_mins(x.add(4));
        let (d, dmin) = (f16_at(x), f16_at(x.add(2)));
        for c in 0..C {
            let s2 = k4_mins_lanes(mins, y[c]);
            let s1 = k4_sums::<V>(scales, y[c], |j| q[j]);
            let (s1, s2) = hsum2_i32(s1, s2);
            out[c] = tiled_step_min(out[c], d, dmin, s1, s2, f32_at(y[c]));
        }
    }

    /// The block pointers of super-block `i` of the `C` activation rows.
    #[inline(always)]
    unsafe fn col_blocks<const C: usize>(a: &[&[u8]; C], i: usize, ab: usize) -> [*const u8; C] {
        let mut y = [std::ptr::null(); C];
        for c in 0..C {
            y[c] = a[c].as_ptr().add(i * ab);
        }
        y
    }

    /// Q4_K × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled, AVX2
    /// microkernel of `tiled-kernel.cpp`): per super-block `s1 = Σ_g sc_g · (q · y)` and
    /// `s2 = Σ_g m_g · (bsums[2g] + bsums[2g+1])` (6-bit scales and mins of the eight
    /// 32-value groups), `out = fma(fma(-dmin, s2, d · s1), yd, out)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into the entry points); `w` whole Q4_K blocks, each
    /// `a[c]` as many Q8_K blocks (only the whole blocks all have are read).
    #[inline(always)]
    unsafe fn q4_k_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, Q4_K_BYTES, a, Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * Q4_K_BYTES);
            let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
            for (j, qj) in q.iter_mut().enumerate() {
                let v = load256(x.add(16 + 32 * j));
                *qj = (
                    _mm256_and_si256(v, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                );
            }
            k4_step::<C, V>(x, &q, col_blocks(a, i, Q8_K_BYTES), &mut out);
        }
        out
    }

    /// Q5_K × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled): as
    /// [`q4_k_tiled`], the quants being the nibbles plus 16 where bit `g` of `qh` is set.
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with Q5_K blocks.
    #[inline(always)]
    unsafe fn q5_k_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, Q5_K_BYTES, a, Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let one = _mm256_set1_epi8(1);
        let two = _mm256_set1_epi8(2);
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * Q5_K_BYTES);
            let qh = load256(x.add(16));
            let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
            for (j, qj) in q.iter_mut().enumerate() {
                let v = load256(x.add(48 + 32 * j));
                // bits 2j and 2j + 1 of qh at bits 0 and 1 (the masks drop what the 16-bit
                // shift brings in from the neighbouring byte)
                let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32));
                let hlo = _mm256_slli_epi16::<4>(_mm256_and_si256(h, one));
                let hhi = _mm256_slli_epi16::<3>(_mm256_and_si256(h, two));
                *qj = (
                    _mm256_or_si256(_mm256_and_si256(v, m4), hlo),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), hhi),
                );
            }
            k4_step::<C, V>(x, &q, col_blocks(a, i, Q8_K_BYTES), &mut out);
        }
        out
    }

    /// The tiled step of the types without mins and with sixteen 16-value sub-blocks
    /// (Q3_K, Q6_K), `q[4 half + k]` the unsigned quants of 32-value group `4 half + k`
    /// offset by `2^shift` (`shift` 2 for Q3_K's `+4`, 5 for Q6_K's `+32`), `scales` the
    /// signed sub-block scales as bytes: per column `s1 = Σ_j sc_j · (q · y) - 2^shift ·
    /// Σ_j sc_j · bsums[j]`, `out = fma(d · s1, yd, out)`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (inlined into them); each `y[c]` a
    /// whole Q8_K block.
    #[inline(always)]
    unsafe fn k16_step<const C: usize, const SHIFT: i32, const V: bool>(
        d: f32,
        scales: __m128i,
        q: &[__m256i; 8],
        y: [*const u8; C],
        out: &mut [f32; C],
    ) {
        let (sc_lo, sc_hi, sc_all) = scales16(scales, true);
        for c in 0..C {
            let offset = _mm256_madd_epi16(load256(y[c].add(260)), sc_all);
            let s1 = k16_sums::<V>(sc_lo, sc_hi, y[c], |half, k| q[4 * half + k]);
            let s1 = hsum_i32(_mm256_sub_epi32(s1, _mm256_slli_epi32::<SHIFT>(offset)));
            out[c] = tiled_step(out[c], d, s1, f32_at(y[c]));
        }
    }

    /// Q6_K × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled): per
    /// super-block `s1 = Σ_j sc_j · ((q - 32) · y)` over the sixteen 16-value sub-blocks
    /// (computed as `Σ sc_j · (q · y) - 32 · Σ sc_j · bsums[j]`), `out = fma(d · s1, yd, out)`.
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with Q6_K blocks.
    #[inline(always)]
    unsafe fn q6_k_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, Q6_K_BYTES, a, Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let m03 = _mm256_set1_epi8(0x03);
        let m0c = _mm256_set1_epi8(0x0c);
        let m30 = _mm256_set1_epi8(0x30);
        let mc0 = _mm256_set1_epi8(0xc0u8 as i8);
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * Q6_K_BYTES);
            let mut q = [_mm256_setzero_si256(); 8];
            for (g, qg) in q.iter_mut().enumerate() {
                let (half, k) = (g / 4, g % 4);
                let l = load256(x.add(64 * half + 32 * (k % 2)));
                let l = if k < 2 {
                    _mm256_and_si256(l, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l), m4)
                };
                let h = load256(x.add(128 + 32 * half));
                // the two high bits of group `4 half + k` at bits 4 and 5
                let h = match k {
                    0 => _mm256_slli_epi16::<4>(_mm256_and_si256(h, m03)),
                    1 => _mm256_slli_epi16::<2>(_mm256_and_si256(h, m0c)),
                    2 => _mm256_and_si256(h, m30),
                    _ => _mm256_srli_epi16::<2>(_mm256_and_si256(h, mc0)),
                };
                *qg = _mm256_or_si256(l, h);
            }
            let y = col_blocks(a, i, Q8_K_BYTES);
            k16_step::<C, 5, V>(f16_at(x.add(208)), load128(x.add(192)), &q, y, &mut out);
        }
        out
    }

    /// Q2_K × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled): per
    /// super-block `s1 = Σ_j sc_j · (q · y)` and `s2 = Σ_j m_j · bsums[j]` over the sixteen
    /// 16-value sub-blocks (4-bit scales and mins), `out = fma(fma(-dmin, s2, d · s1), yd,
    /// out)`.
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with Q2_K blocks.
    #[inline(always)]
    unsafe fn q2_k_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, Q2_K_BYTES, a, Q8_K_BYTES);
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * Q2_K_BYTES);
            let sm = load128(x);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sm), m4));
            let (sc_lo, sc_hi, _) = scales16(_mm_and_si128(sm, m4), false);
            let mut q = [_mm256_setzero_si256(); 8];
            for (g, qg) in q.iter_mut().enumerate() {
                let v = load256(x.add(16 + 32 * (g / 4)));
                let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (g % 4) as i32));
                *qg = _mm256_and_si256(v, m3);
            }
            let (d, dmin) = (f16_at(x.add(80)), f16_at(x.add(82)));
            let y = col_blocks(a, i, Q8_K_BYTES);
            for c in 0..C {
                let s2 = _mm256_madd_epi16(load256(y[c].add(260)), mins);
                let s1 = k16_sums::<V>(sc_lo, sc_hi, y[c], |half, k| q[4 * half + k]);
                let (s1, s2) = hsum2_i32(s1, s2);
                out[c] = tiled_step_min(out[c], d, dmin, s1, s2, f32_at(y[c]));
            }
        }
        out
    }

    /// The sixteen 6-bit scales of a Q3_K super-block minus 32 (ggml's packing: low
    /// nibbles from bytes 0..8, two high bits from bytes 8..12), as i8 bytes in order.
    ///
    /// # Safety
    /// `p` valid for the 12 bytes of `scales`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::handwritten) unsafe fn q3_k_scales(p: *const u8) -> __m128i {
        let (u0, u1, u2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
        let k4 = 0x0f0f_0f0f;
        let k2 = 0x0303_0303;
        let b0 = (u0 & k4) | ((u2 & k2) << 4);
        let b1 = (u1 & k4) | (((u2 >> 2) & k2) << 4);
        let b2 = ((u0 >> 4) & k4) | (((u2 >> 4) & k2) << 4);
        let b3 = ((u1 >> 4) & k4) | (((u2 >> 6) & k2) << 4);
        let v = _mm_setr_epi32(b0 as i32, b1 as i32, b2 as i32, b3 as i32);
        _mm_sub_epi8(v, _mm_set1_epi8(32))
    }

    /// Q3_K × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled): per
    /// super-block `s1 = Σ_j (sc_j - 32) · (w · y)` over the sixteen 16-value sub-blocks,
    /// with `w = q - 4` where the `hmask` bit is clear and `w = q` where it is set (computed
    /// as `Σ sc_j · ((q + 4 h) · y) - 4 · Σ sc_j · bsums[j]`), `out = fma(d · s1, yd, out)`.
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with Q3_K blocks.
    #[inline(always)]
    unsafe fn q3_k_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, Q3_K_BYTES, a, Q8_K_BYTES);
        let m3 = _mm256_set1_epi8(3);
        let bit = [
            _mm256_set1_epi8(1),
            _mm256_set1_epi8(2),
            _mm256_set1_epi8(4),
            _mm256_set1_epi8(8),
        ];
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * Q3_K_BYTES);
            let hm = load256(x);
            let hm_hi = _mm256_srli_epi16::<4>(hm);
            let mut q = [_mm256_setzero_si256(); 8];
            for (g, qg) in q.iter_mut().enumerate() {
                let (half, k) = (g / 4, g % 4);
                let v = load256(x.add(32 + 32 * half));
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // bit `4 half + k` of hmask, at bit 2
                let h = _mm256_and_si256(if half == 0 { hm } else { hm_hi }, bit[k]);
                let h = match k {
                    0 => _mm256_slli_epi16::<2>(h),
                    1 => _mm256_slli_epi16::<1>(h),
                    2 => h,
                    _ => _mm256_srli_epi16::<1>(h),
                };
                *qg = _mm256_or_si256(low, h);
            }
            let y = col_blocks(a, i, Q8_K_BYTES);
            k16_step::<C, 2, V>(f16_at(x.add(108)), q3_k_scales(x.add(96)), &q, y, &mut out);
        }
        out
    }

    /// IQ4_XS × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled): per
    /// super-block `s1 = Σ_b (ls_b - 32) · (v · y)` over the eight 32-value blocks (`v` the
    /// IQ4_NL table values, products through the sign trick as ggml), `out = fma(d · s1, yd,
    /// out)`.
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ4_XS blocks.
    #[inline(always)]
    unsafe fn iq4_xs_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, IQ4_XS_BYTES, a, Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let table = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr() as *const u8));
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * IQ4_XS_BYTES);
            let sh = u16::from_le_bytes([*x.add(2), *x.add(3)]) as u32;
            let sl = u32_at(x.add(4));
            // per 32-value block b: the table values v (for the sign trick) and |v|
            let mut v = [_mm256_setzero_si256(); 8];
            let mut s = [_mm256_setzero_si256(); 8];
            for p in 0..4 {
                let q = load256(x.add(8 + 32 * p));
                // [block 2p low nibbles | block 2p+1 low], then the high nibbles
                let vlo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
                let vhi =
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                v[2 * p] = _mm256_permute2x128_si256::<0x20>(vlo, vhi);
                v[2 * p + 1] = _mm256_permute2x128_si256::<0x31>(vlo, vhi);
            }
            for (b, sb) in s.iter_mut().enumerate() {
                let ls = ((sl >> (4 * b)) & 0x0f) | (((sh >> (2 * b)) & 3) << 4);
                *sb = _mm256_set1_epi16(ls as i16 - 32);
            }
            let d = f16_at(x);
            let y = col_blocks(a, i, Q8_K_BYTES);
            for c in 0..C {
                let q8 = y[c].add(4);
                let mut acc = _mm256_setzero_si256();
                for b in 0..8 {
                    let yv = load256(q8.add(32 * b));
                    let prod = _mm256_maddubs_epi16(
                        _mm256_sign_epi8(v[b], v[b]),
                        _mm256_sign_epi8(yv, v[b]),
                    );
                    acc = madd_acc::<V>(acc, prod, s[b]);
                }
                out[c] = tiled_step(out[c], d, hsum_i32(acc), f32_at(y[c]));
            }
        }
        out
    }

    /// IQ3_XXS / IQ3_S × Q8_K in the order of llama.cpp's tiled kernel (ggml-cpu/tiled, AVX2
    /// microkernel with `BIAS = 128`, `ACTBIAS`): per super-block the exact
    /// `s1 = Σ_b (2 ls_b + 1) · (w · y)` over the eight 32-value blocks, `w` the signed grid
    /// values; computed as ggml does, `maddubs(y + 128, w)` (never saturating: `|w| <= 62`)
    /// minus `128 · Σ_b (2 ls_b + 1) · Σ w` (so a `-128` activation byte counts as itself);
    /// `out = fma((d · d_scale) · s1, yd, out)` (`d_scale` 0.25 for IQ3_XXS, 1 for IQ3_S;
    /// `d` the f16 at the block's start, or IQ1_M's assembled scale when `iq1m`).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with blocks of `block_bytes` bytes that `parts` reads.
    #[inline(always)]
    unsafe fn grid_tiled<const C: usize, const V: bool>(
        w: &[u8],
        a: &[&[u8]; C],
        block_bytes: usize,
        d_scale: f32,
        iq1m: bool,
        parts: unsafe fn(*const u8, usize) -> (__m256i, __m256i, __m256i),
    ) -> [f32; C] {
        let nb = blocks(w, block_bytes, a, Q8_K_BYTES);
        let bias = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi8(1);
        let mut out = [0f32; C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * block_bytes);
            let mut v = [_mm256_setzero_si256(); 8];
            let mut s = [_mm256_setzero_si256(); 8];
            let mut corr = _mm256_setzero_si256();
            for b in 0..8 {
                let (mag, signs, scale) = parts(x, b);
                v[b] = _mm256_sign_epi8(mag, signs);
                s[b] = scale;
                let wsum = _mm256_maddubs_epi16(ones, v[b]);
                corr = madd_acc::<V>(corr, wsum, s[b]);
            }
            let corr = hsum_i32(corr).wrapping_mul(128);
            let d = if iq1m { iq1_m_d(x) } else { f16_at(x) } * d_scale;
            let y = col_blocks(a, i, Q8_K_BYTES);
            for c in 0..C {
                let q8 = y[c].add(4);
                let mut acc = _mm256_setzero_si256();
                for b in 0..8 {
                    let yb = _mm256_xor_si256(load256(q8.add(32 * b)), bias);
                    let prod = _mm256_maddubs_epi16(yb, v[b]);
                    acc = madd_acc::<V>(acc, prod, s[b]);
                }
                let s1 = hsum_i32(acc).wrapping_sub(corr);
                out[c] = tiled_step(out[c], d, s1, f32_at(y[c]));
            }
        }
        out
    }

    /// IQ3_XXS in the tiled kernel's order ([`grid_tiled`]).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ3_XXS blocks.
    #[inline(always)]
    unsafe fn iq3_xxs_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ3_XXS_BYTES, 0.25, false, iq3_xxs_parts)
    }

    /// IQ2_XXS in the tiled kernel's order ([`grid_tiled`]; magnitudes at most 43).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ2_XXS blocks.
    #[inline(always)]
    unsafe fn iq2_xxs_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ2_XXS_BYTES, 0.125, false, iq2_xxs_parts)
    }

    /// IQ2_XS in the tiled kernel's order ([`grid_tiled`]; 16-value sub-blocks).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ2_XS blocks.
    #[inline(always)]
    unsafe fn iq2_xs_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ2_XS_BYTES, 0.125, false, iq2_xs_parts)
    }

    /// IQ2_S in the tiled kernel's order ([`grid_tiled`]; 16-value sub-blocks).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ2_S blocks.
    #[inline(always)]
    unsafe fn iq2_s_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ2_S_BYTES, 0.125, false, iq2_s_parts)
    }

    /// IQ1_S in the tiled kernel's order ([`grid_tiled`] over the codes `8 · grid + delta`,
    /// with `d · 0.125`).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ1_S blocks.
    #[inline(always)]
    unsafe fn iq1_s_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ1_S_BYTES, 0.125, false, iq1_s_parts)
    }

    /// IQ1_M in the tiled kernel's order ([`grid_tiled`] over the codes `8 · grid + delta`,
    /// 16-value sub-blocks, with `d · 0.125`).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ1_M blocks.
    #[inline(always)]
    unsafe fn iq1_m_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ1_M_BYTES, 0.125, true, iq1_m_parts)
    }

    /// IQ3_S in the tiled kernel's order ([`grid_tiled`]).
    ///
    /// # Safety
    /// As [`q4_k_tiled`], with IQ3_S blocks.
    #[inline(always)]
    unsafe fn iq3_s_tiled<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        grid_tiled::<C, V>(w, a, IQ3_S_BYTES, 1.0, false, iq3_s_parts)
    }

    // ---- tinyBLAS ----------------------------------------------------------------------

    /// IQ4_NL × Q8_0 as llamafile's `tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>` (sgemm.cpp)
    /// computes one output: eight f32 lanes, per block `acc_l = fma(dx · dy, isum_l, acc_l)`
    /// with `isum_l` the exact sum of the table value × activation products at bytes
    /// `4l .. 4l + 4` of the block's vector (low nibbles are values 0..16, high nibbles
    /// 16..32; products through the sign trick, pairs added with `madd` by ones); then
    /// `hsum_float_8`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into the entry points); `w` whole IQ4_NL blocks, each
    /// `a[c]` as many Q8_0 blocks (only the whole blocks all have are read).
    #[inline(always)]
    unsafe fn iq4_nl_tinyblas<const C: usize, const V: bool>(w: &[u8], a: &[&[u8]; C]) -> [f32; C] {
        let nb = blocks(w, IQ4_NL_BYTES, a, Q8_0_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let table = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr() as *const u8));
        let mut acc = [_mm256_setzero_ps(); C];
        for i in 0..nb {
            let x = w.as_ptr().add(i * IQ4_NL_BYTES);
            // the 16 bytes in both halves, the high half shifted right by 4
            let q = _mm256_broadcastsi128_si256(load128(x.add(2)));
            let q = _mm256_srlv_epi32(q, shift);
            let v = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
            let abs = _mm256_sign_epi8(v, v);
            let y = col_blocks(a, i, Q8_0_BYTES);
            for c in 0..C {
                let yv = load256(y[c].add(2));
                let prod = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(yv, v));
                let isum = _mm256_madd_epi16(prod, ones);
                let d = f16_product(x, y[c]);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc[c]);
            }
        }
        let mut out = [0f32; C];
        for c in 0..C {
            // hsum_float_8: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))
            let r = _mm_add_ps(
                _mm256_castps256_ps128(acc[c]),
                _mm256_extractf128_ps::<1>(acc[c]),
            );
            let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
            let r = _mm_add_ss(r, _mm_movehdup_ps(r));
            out[c] = _mm_cvtss_f32(r);
        }
        out
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{tiled_fn, TiledFn};
    use ir::ggml::{
        block_format, f32_to_f16, quantize_activations, vec_dot, vec_dot_avx2_mul_mat, GgmlType,
        Q8Flavor,
    };

    const TYPES: [GgmlType; 14] = [
        GgmlType::IQ1_M,
        GgmlType::IQ1_S,
        GgmlType::IQ2_S,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_XXS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
        GgmlType::IQ4_NL,
    ];

    /// xorshift
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// A uniform f32 in `[lo, hi)`.
    fn uniform(s: &mut u64, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((next(s) >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// Stores the f16 `h` as an IQ1_M block's scale (top nibbles of its four u16 scales).
    pub(crate) fn set_iq1_m_d(blk: &mut [u8], h: u16) {
        for k in 0..4 {
            let at = 48 + 2 * k;
            let sc = u16::from_le_bytes([blk[at], blk[at + 1]]);
            let sc = (sc & 0x0fff) | (((h >> (4 * k)) & 0x0f) << 12);
            blk[at..at + 2].copy_from_slice(&sc.to_le_bytes());
        }
    }

    /// `n` random weight blocks of `t` with random quants and sane f16 `d` (and `dmin`).
    fn random_weights(t: GgmlType, n_values: usize, s: &mut u64) -> Vec<u8> {
        let f = block_format(t).unwrap();
        let d = f.field("d").map(|fl| fl.offset);
        let dmin = f.field("dmin").map(|fl| fl.offset);
        let mut w = vec![0u8; n_values / t.block_size() * t.type_size()];
        w.iter_mut().for_each(|b| *b = next(s) as u8);
        for blk in w.chunks_exact_mut(t.type_size()) {
            let dv = uniform(s, -0.02, 0.02);
            match d {
                Some(d) => blk[d..d + 2].copy_from_slice(&f32_to_f16(dv).to_le_bytes()),
                // IQ1_M: the f16 d in the top nibbles of the four u16 scales at 48.
                None => set_iq1_m_d(blk, f32_to_f16(dv)),
            }
            if let Some(m) = dmin {
                let mv = uniform(s, 0.0, 0.01);
                blk[m..m + 2].copy_from_slice(&f32_to_f16(mv).to_le_bytes());
            }
        }
        w
    }

    /// Random activations, with an occasional block of a few large values (so a block's
    /// scale is set by an outlier, as in real prompts).
    fn random_acts(n_values: usize, s: &mut u64) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n_values).map(|_| uniform(s, -2.0, 2.0)).collect();
        for _ in 0..n_values / 512 {
            let i = (next(s) as usize) % n_values;
            x[i] = uniform(s, -40.0, 40.0);
        }
        x
    }

    fn routine(t: GgmlType) -> Option<TiledFn> {
        let f = tiled_fn(t, crate::target::Tier::host());
        if f.is_none() {
            eprintln!("no AVX2/FMA/F16C on this host: {t} not tested");
        }
        f
    }

    /// Every routine gives `vec_dot_avx2_mul_mat(t, w, a, 8)` bit for bit, on rows of 1, 3
    /// and 8 super-blocks (IQ4_NL: 8, 24 and 64 blocks, and odd counts), and is close to the
    /// scalar `vec_dot`.
    #[test]
    fn qdot_tiled_matches_the_reference_bit_for_bit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for t in TYPES {
            let Some(f) = routine(t) else { continue };
            let sizes: &[usize] = if t == GgmlType::IQ4_NL {
                &[32, 96, 256, 768, 2048]
            } else {
                &[256, 768, 2048]
            };
            let mut differ_scalar = 0;
            let mut checked = 0;
            for &n in sizes {
                for _ in 0..200 {
                    let w = random_weights(t, n, &mut seed);
                    let x = random_acts(n, &mut seed);
                    let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
                    let want = vec_dot_avx2_mul_mat(t, &w, &act, 8).unwrap();
                    // SAFETY: `tiled_fn` returned it, so the host has the features; whole rows.
                    let got = unsafe { f(&w, &act) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{t} n={n}: {got} vs reference {want}"
                    );
                    let scalar = vec_dot(t, &w, &act).unwrap();
                    differ_scalar += (scalar.to_bits() != got.to_bits()) as usize;
                    let mag: f32 = {
                        // Σ|w·x| bound for the tolerance
                        let mut wf = vec![0f32; n];
                        ir::ggml::dequantize(t, &w, &mut wf).unwrap();
                        wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum()
                    };
                    assert!(
                        (got - scalar).abs() <= 1e-5 * mag + 1e-6,
                        "{t} n={n}: {got} vs scalar vec_dot {scalar} (Σ|w·x| = {mag})"
                    );
                    checked += 1;
                }
            }
            eprintln!("{t}: {checked} rows bit-exact, {differ_scalar} differ from scalar vec_dot");
        }
    }

    /// The four-column forms give each column what the one-column form gives, on random
    /// weights and quantized activations and on raw activation bytes.
    #[test]
    fn qdot_tiled_four_columns_match_one() {
        let mut seed = 0x4c0f_u64;
        for t in TYPES {
            let (Some(f), Some(f4)) =
                (routine(t), super::tiled4_fn(t, crate::target::Tier::host()))
            else {
                continue;
            };
            for n in [256usize, 2048] {
                for _ in 0..50 {
                    let w = random_weights(t, n, &mut seed);
                    let acts: Vec<Vec<u8>> = (0..4)
                        .map(|_| {
                            let x = random_acts(n, &mut seed);
                            quantize_activations(t, &x, Q8Flavor::X86).unwrap().1
                        })
                        .collect();
                    let a: [&[u8]; 4] = std::array::from_fn(|c| &acts[c][..]);
                    // SAFETY: both chosen for this host; whole rows of equal length.
                    let got = unsafe { f4(&w, &a) };
                    for c in 0..4 {
                        // SAFETY: as above.
                        let want = unsafe { f(&w, a[c]) };
                        assert_eq!(got[c].to_bits(), want.to_bits(), "{t} n={n} column {c}");
                    }
                }
            }
        }
    }

    /// The AVX-512 VNNI build gives the AVX2 build's numbers bit for bit (one and four
    /// columns), on quantized and on raw activation bytes, where the host runs both.
    #[test]
    fn qdot_tiled_builds_agree() {
        if !super::super::has_vnni() {
            eprintln!("no AVX-512 VNNI on this host: one build only");
            return;
        }
        let mut seed = 0x7a1e_d00d_u64;
        for t in TYPES {
            let (Some(f), Some(g)) = (super::tiled_fn_on(t, false), super::tiled_fn_on(t, true))
            else {
                continue;
            };
            let (Some(f4), Some(g4)) =
                (super::tiled4_fn_on(t, false), super::tiled4_fn_on(t, true))
            else {
                panic!("{t}: a one-column routine without its four-column form");
            };
            for n in [256usize, 2048] {
                for round in 0..60 {
                    let w = random_weights(t, n, &mut seed);
                    let acts: Vec<Vec<u8>> = (0..4)
                        .map(|_| {
                            let x = random_acts(n, &mut seed);
                            let mut a = quantize_activations(t, &x, Q8Flavor::X86).unwrap().1;
                            if round % 3 == 0 {
                                // raw bytes beside the scales: -128 included
                                for b in a.iter_mut().skip(4).step_by(3) {
                                    *b = next(&mut seed) as u8;
                                }
                            }
                            a
                        })
                        .collect();
                    let a: [&[u8]; 4] = std::array::from_fn(|c| &acts[c][..]);
                    // SAFETY: both builds run on this host; whole rows of equal length.
                    let (x4, y4) = unsafe { (f4(&w, &a), g4(&w, &a)) };
                    for c in 0..4 {
                        // SAFETY: as above.
                        let (x, y) = unsafe { (f(&w, a[c]), g(&w, a[c])) };
                        assert_eq!(x.to_bits(), y.to_bits(), "{t} n={n} column {c}");
                        assert_eq!(x4[c].to_bits(), y4[c].to_bits(), "{t} n={n} 4 columns, {c}");
                    }
                }
            }
        }
    }

    /// The f16 conversion is exact for every bit pattern.
    #[test]
    fn qdot_tiled_f16_conversion_is_exact() {
        if routine(GgmlType::Q4_K).is_none() {
            return;
        }
        for h in 0..=u16::MAX {
            // SAFETY: `routine` found the features.
            let got = unsafe { super::x86::f16_bits(h) };
            let want = ir::ggml::f16_to_f32(h);
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}: {got} vs {want}");
        }
    }

    /// Edge values: all quants at their extremes (every nibble / bit set or clear, scales
    /// at their limits), activations saturating at ±127.
    #[test]
    fn qdot_tiled_extremes_match() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for t in TYPES {
            let Some(f) = routine(t) else { continue };
            let n = 768;
            for fill in [0x00u8, 0xff, 0x80, 0x7f, 0x55, 0xaa] {
                let f16s = block_format(t).unwrap();
                let mut w = vec![fill; n / t.block_size() * t.type_size()];
                for blk in w.chunks_exact_mut(t.type_size()) {
                    for name in ["d", "dmin"] {
                        if let Some(fl) = f16s.field(name) {
                            let v = uniform(&mut seed, 0.001, 0.05);
                            blk[fl.offset..fl.offset + 2]
                                .copy_from_slice(&f32_to_f16(v).to_le_bytes());
                        }
                    }
                }
                for xs in [1.0f32, -1.0] {
                    let x: Vec<f32> = (0..n)
                        .map(|i| if i.is_multiple_of(3) { xs } else { -xs * 0.999 })
                        .collect();
                    let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
                    let want = vec_dot_avx2_mul_mat(t, &w, &act, 8).unwrap();
                    // SAFETY: as above.
                    let got = unsafe { f(&w, &act) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{t} fill {fill:#x}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Activation blocks of raw random bytes (every int8 quant, -128 included, with the
    /// `bsums` that go with them, and all-zero blocks), longer rows: still the reference's
    /// numbers (the sign trick of IQ4_XS / IQ4_NL wraps on -128 as ggml's does).
    #[test]
    fn qdot_tiled_raw_activations_match() {
        let mut seed = 0x0bad_cafe_f00d_u64;
        for t in TYPES {
            let Some(f) = routine(t) else { continue };
            for n in [256usize, 8192] {
                for rep in 0..100usize {
                    let w = random_weights(t, n, &mut seed);
                    let mut act = vec![0u8; 0];
                    if t == GgmlType::IQ4_NL {
                        for _ in 0..n / 32 {
                            let d = uniform(&mut seed, -0.05, 0.05);
                            act.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                            act.extend((0..32).map(|_| next(&mut seed) as u8));
                        }
                    } else {
                        for b in 0..n / 256 {
                            let zero = rep.is_multiple_of(7) && b == 0;
                            let d = if zero {
                                0.0
                            } else {
                                uniform(&mut seed, -0.05, 0.05)
                            };
                            let qs: Vec<u8> = (0..256)
                                .map(|_| if zero { 0 } else { next(&mut seed) as u8 })
                                .collect();
                            act.extend_from_slice(&d.to_le_bytes());
                            act.extend_from_slice(&qs);
                            for j in 0..16 {
                                let sum: i32 = qs[16 * j..16 * j + 16]
                                    .iter()
                                    .map(|&q| q as i8 as i32)
                                    .sum();
                                act.extend_from_slice(&(sum as i16).to_le_bytes());
                            }
                        }
                    }
                    let want = vec_dot_avx2_mul_mat(t, &w, &act, 8).unwrap();
                    // SAFETY: as above.
                    let got = unsafe { f(&w, &act) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{t} n={n}: {got} vs {want}");
                }
            }
        }
    }

    /// Rough speed on one core: ns per call on a 4096-value row and GB/s of weight bytes,
    /// hot (one weight row again and again) and streamed (4096 rows, 9 to 14 MB, the
    /// activation row hot), the best of many trials (the machine may be shared); with the
    /// one-column AVX2 `vec_dot` routine of [`super::super::qdot`] and the scalar reference
    /// for comparison. `cargo test --release -p codegen-cpu --lib qdot_tiled_speed --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn qdot_tiled_speed() {
        let mut seed = 0x5eed_u64;
        let k = 4096;
        let mut sink = 0f32;
        // best seconds per call of `f` over `trials` runs of `reps` calls on rows 0..rows
        let mut time = |f: &dyn Fn(&[u8]) -> f32, w: &[u8], rows: usize, reps: usize| {
            let rb = w.len() / rows;
            let mut best = f64::MAX;
            for _ in 0..25 {
                let t0 = std::time::Instant::now();
                for i in 0..reps {
                    sink += f(std::hint::black_box(&w[(i % rows) * rb..][..rb]));
                }
                best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
            }
            best
        };
        for t in TYPES {
            let Some(f) = routine(t) else { continue };
            let rows = 4096;
            let w = random_weights(t, k * rows, &mut seed);
            let x = random_acts(k, &mut seed);
            let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
            let rb = w.len() / rows;
            // SAFETY: `tiled_fn` returned it, so the host has the features; whole rows.
            let tiled = |r: &[u8]| unsafe { f(r, &act) };
            let hot = time(&tiled, &w[..rb], 1, 2000);
            let streamed = time(&tiled, &w, rows, rows);
            let vd = super::super::qdot::dot_fn(t, crate::target::Tier::host()).map(|g| {
                // SAFETY: as above (`dot_fn` checks the features).
                time(&|r: &[u8]| unsafe { g(r, &act) }, &w[..rb], 1, 2000)
            });
            let reference = |r: &[u8]| vec_dot_avx2_mul_mat(t, r, &act, 8).unwrap();
            let scalar = time(&reference, &w[..rb], 1, 20);
            let gbs = |s: f64| rb as f64 / s / 1e9;
            eprintln!(
                "{t}: hot {:.0} ns/row ({:.1} GB/s), streamed {:.0} ns/row ({:.1} GB/s); \
                 vec_dot avx2 {}; scalar reference {:.0} ns/row ({:.0}x slower)",
                hot * 1e9,
                gbs(hot),
                streamed * 1e9,
                gbs(streamed),
                vd.map_or("-".to_string(), |s| format!(
                    "{:.0} ns/row ({:.1} GB/s)",
                    s * 1e9,
                    gbs(s)
                )),
                scalar * 1e9,
                scalar / hot,
            );
        }
        eprintln!("[{sink}]");
    }
}
