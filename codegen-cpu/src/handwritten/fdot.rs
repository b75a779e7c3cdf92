//! Hand-written dot products of F32, F16 and BF16 weight rows with activation rows of the
//! same type (their `vec_dot_type`: ggml rounds the f32 activations to F16 / BF16 first), for the
//! row-dot kernels of [`crate::rows`]: AVX2 + FMA + F16C through `std::arch`, bit for bit
//! what llama.cpp's x86 AVX2 build computes, in its two orders:
//!
//! - one activation column (decode): `ggml_vec_dot_f32` / `_f16` / `_bf16`
//!   (ggml-cpu/vec.cpp). F32 and F16: four 8-lane accumulators over chunks of 32 values, each
//!   `acc = fma(w, a, acc)`, reduced as `GGML_F32x8_REDUCE` (`(s0 + s2) + (s1 + s3)` per lane,
//!   then the halves and two horizontal adds); BF16: four accumulators `acc += w · a`
//!   (multiply, then add), reduced per lane as `(c0 + c2) + (c1 + c3)` then `hsum_float_8`.
//!   The values past the last whole chunk of 32 are added one by one in f64 (in f32 for
//!   F32).
//! - two or more columns (prompts): llamafile's tinyBLAS (`tinyBLAS<8, __m256, …>`,
//!   llamafile/sgemm.cpp): one 8-lane accumulator per output, `acc = fma(w, a, acc)` over
//!   chunks of 8, then its `hsum` (the same as `hsum_float_8`). tinyBLAS refuses rows that
//!   are not whole chunks of 8; those take `ir::ggml`'s reference here, as they take
//!   `vec_dot` in ggml.
//!
//! Products of two F16 (or two BF16) values are exact in f32, so the operand order inside a
//! product does not matter; only the accumulation order does. The references these are
//! tested against are `ir::ggml::vec_dot_avx2` and `ir::ggml::vec_dot_avx2_mul_mat` (the
//! interpreter's order).

use ir::ggml::GgmlType;

use super::qdot::{Dot4RowsFn, Dot4x4Fn, DotFn, Isa};
use super::qdot_tiled::{Tiled4Fn, TiledFn};
use crate::target::Tier;

/// The `vec_dot` routine (one column) for `wtype` on `isa`.
pub(crate) fn dot_fn_on(wtype: GgmlType, isa: Isa) -> Option<DotFn> {
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    return match wtype {
        GgmlType::F32 => Some(x86::f32_vec_dot),
        GgmlType::F16 => Some(x86::f16_vec_dot),
        GgmlType::BF16 => Some(x86::bf16_vec_dot),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wtype;
        None
    }
}

/// The four-row `vec_dot` routine for `wtype` on `isa`.
pub(crate) fn dot4rows_fn_on(wtype: GgmlType, isa: Isa) -> Option<Dot4RowsFn> {
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    return match (wtype, isa) {
        (GgmlType::F32, Isa::Vnni) => Some(x86::f32_vec_dot_4rows_avx512),
        (GgmlType::F16, Isa::Vnni) => Some(x86::f16_vec_dot_4rows_avx512),
        (GgmlType::BF16, Isa::Vnni) => Some(x86::bf16_vec_dot_4rows_avx512),
        (GgmlType::F32, _) => Some(x86::f32_vec_dot_4rows),
        (GgmlType::F16, _) => Some(x86::f16_vec_dot_4rows),
        (GgmlType::BF16, _) => Some(x86::bf16_vec_dot_4rows),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wtype;
        None
    }
}

/// The tinyBLAS-order routine (one row, one column) for `wtype` on this host.
pub(crate) fn tinyblas_fn(wtype: GgmlType) -> Option<TiledFn> {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        return match wtype {
            GgmlType::F32 => Some(x86::f32_tinyblas),
            GgmlType::F16 => Some(x86::f16_tinyblas),
            GgmlType::BF16 => Some(x86::bf16_tinyblas),
            _ => None,
        };
    }
    let _ = wtype;
    None
}

/// The tinyBLAS-order routine for one row and four columns.
pub(crate) fn tinyblas4_fn(wtype: GgmlType) -> Option<Tiled4Fn> {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        return match wtype {
            GgmlType::F32 => Some(x86::f32_tinyblas_1x4),
            GgmlType::F16 => Some(x86::f16_tinyblas_1x4),
            GgmlType::BF16 => Some(x86::bf16_tinyblas_1x4),
            _ => None,
        };
    }
    let _ = wtype;
    None
}

/// The tinyBLAS-order 4 rows × 4 columns tile (`out[c][r]`) for `wtype` on `isa` (the
/// AVX-512 build holds the sixteen accumulators in its 32 registers; the AVX2 one runs two
/// 4 × 2 halves: the same numbers).
pub(crate) fn tinyblas4x4_fn_on(wtype: GgmlType, isa: Isa) -> Option<Dot4x4Fn> {
    #[cfg(target_arch = "x86_64")]
    return match (wtype, isa) {
        (GgmlType::F32, Isa::Avx2) => Some(x86::f32_tinyblas_4x4),
        (GgmlType::F32, Isa::Vnni) => Some(x86::f32_tinyblas_4x4_avx512),
        (GgmlType::F16, Isa::Avx2) => Some(x86::f16_tinyblas_4x4),
        (GgmlType::BF16, Isa::Avx2) => Some(x86::bf16_tinyblas_4x4),
        (GgmlType::F16, Isa::Vnni) => Some(x86::f16_tinyblas_4x4_avx512),
        (GgmlType::BF16, Isa::Vnni) => Some(x86::bf16_tinyblas_4x4_avx512),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wtype, isa);
        None
    }
}

/// The tinyBLAS-order 4 × 8 tile over packed activations ([`super::qdot::Packed4x8`]) for
/// `wtype` on hosts with AVX-512: [`tinyblas4x8_fn`]'s products, each activation chunk
/// converted to f32 once per chunk of tokens. Rows must be whole chunks of eight values
/// (tinyBLAS's own condition; `multiple`).
pub(crate) fn packed4x8_fn(wtype: GgmlType, tier: Tier) -> Option<super::qdot::Packed4x8> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        // F16 / BF16 weights widened to f32 once per four rows and chunk of tokens, then
        // the F32 tile: the same products and sums (the widening is exact).
        let (pack, widen): (super::qdot::Pack8Fn, _) = match wtype {
            GgmlType::F32 => (x86::f32_pack8, None),
            GgmlType::F16 => (x86::f16_pack8, Some(x86::f16_widen as _)),
            GgmlType::BF16 => (x86::bf16_pack8, Some(x86::bf16_widen as _)),
            _ => return None,
        };
        return Some(super::qdot::Packed4x8 {
            pack,
            tile: x86::f32_tinyblas_4x8_packed,
            tile6: Some(x86::f32_tinyblas_6x8_packed),
            block_bytes: x86::PANEL_VALUE_BYTES,
            multiple: 8,
            widen,
        });
    }
    let _ = (wtype, tier);
    None
}

/// A tile of four weight rows × eight activation rows: `out[c][r]` is what the tinyBLAS
/// routine gives for row `w[r]` and column `a[c]`.
///
/// # Safety
/// The host must have the features the routine was chosen for ([`tinyblas4x8_fn`]); rows of
/// one length.
pub(crate) type Dot4x8Fn = unsafe fn(&[&[u8]; 4], &[&[u8]; 8]) -> [[f32; 4]; 8];

/// The tinyBLAS-order 4 rows × 8 columns tile for `wtype`, on hosts with AVX-512 (the
/// [`Isa::Vnni`] ones): two columns share a 512-bit register, each in its own eight lanes,
/// so every output keeps tinyBLAS's eight-lane sum while each `vfmadd` does sixteen
/// products.
pub(crate) fn tinyblas4x8_fn(wtype: GgmlType, tier: Tier) -> Option<Dot4x8Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::F32 => Some(x86::f32_tinyblas_4x8_avx512),
            GgmlType::F16 => Some(x86::f16_tinyblas_4x8_avx512),
            GgmlType::BF16 => Some(x86::bf16_tinyblas_4x8_avx512),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

#[cfg(target_arch = "x86_64")]
pub(in crate::handwritten) mod x86 {
    use std::arch::x86_64::*;

    use ir::ggml::{self, GgmlType};

    /// How 8 values of a row become f32 lanes.
    trait Half {
        const TYPE: GgmlType;
        /// Bytes per value.
        const BYTES: usize;
        /// Whether `vec_dot` adds the values past the last chunk of 32 in f64 (F16, BF16)
        /// or in f32 (F32: `ggml_vec_dot_f32`).
        const TAIL_F64: bool;
        /// Whether `vec_dot` accumulates with a fused multiply-add (F16) or a multiply
        /// then an add (BF16).
        const VEC_DOT_FMA: bool;
        /// The 8 values at byte `p`.
        ///
        /// # Safety
        /// AVX2 + F16C; `8 · BYTES` readable bytes at `p`.
        unsafe fn load8(p: *const u8) -> __m256;
        /// One value at byte offset `o` of `row`, as f32.
        fn at(row: &[u8], o: usize) -> f32;
        /// The 8 values at `lo` in lanes 0..8 and the 8 at `hi` in lanes 8..16.
        ///
        /// # Safety
        /// AVX-512F; `8 · BYTES` readable bytes at each pointer.
        unsafe fn load8x2(lo: *const u8, hi: *const u8) -> __m512;
        /// The 16 values at byte `p` (one 256-bit or 512-bit load).
        ///
        /// # Safety
        /// AVX-512F (BW for BF16's widening); `16 · BYTES` readable bytes at `p`.
        unsafe fn load16(p: *const u8) -> __m512;
    }

    struct F32;
    struct F16;
    struct Bf16;

    impl Half for F32 {
        const TYPE: GgmlType = GgmlType::F32;
        const BYTES: usize = 4;
        const VEC_DOT_FMA: bool = true;
        const TAIL_F64: bool = false;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            _mm256_loadu_ps(p as *const f32)
        }
        fn at(row: &[u8], o: usize) -> f32 {
            f32::from_le_bytes([row[o], row[o + 1], row[o + 2], row[o + 3]])
        }
        #[inline(always)]
        unsafe fn load8x2(lo: *const u8, hi: *const u8) -> __m512 {
            if lo == hi {
                // One load, no shuffle: `vbroadcastf64x4`.
                return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(lo as *const f64)));
            }
            let l = _mm512_castps256_ps512(_mm256_loadu_ps(lo as *const f32));
            let h = _mm256_castps_pd(_mm256_loadu_ps(hi as *const f32));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(l), h))
        }
        #[inline(always)]
        unsafe fn load16(p: *const u8) -> __m512 {
            _mm512_loadu_ps(p as *const f32)
        }
    }

    impl Half for F16 {
        const TYPE: GgmlType = GgmlType::F16;
        const BYTES: usize = 2;
        const VEC_DOT_FMA: bool = true;
        const TAIL_F64: bool = true;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }
        fn at(row: &[u8], o: usize) -> f32 {
            half::f16::from_bits(u16::from_le_bytes([row[o], row[o + 1]])).to_f32()
        }
        #[inline(always)]
        unsafe fn load8x2(lo: *const u8, hi: *const u8) -> __m512 {
            _mm512_cvtph_ps(pair(lo, hi))
        }
        #[inline(always)]
        unsafe fn load16(p: *const u8) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        }
    }

    /// The 16 bytes at `lo` then the 16 at `hi` (the same load twice when they are equal:
    /// `vbroadcasti128`).
    #[inline(always)]
    unsafe fn pair(lo: *const u8, hi: *const u8) -> __m256i {
        if lo == hi {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(lo as *const __m128i))
        } else {
            _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(lo as *const __m128i)),
                _mm_loadu_si128(hi as *const __m128i),
            )
        }
    }

    impl Half for Bf16 {
        const TYPE: GgmlType = GgmlType::BF16;
        const BYTES: usize = 2;
        const VEC_DOT_FMA: bool = false;
        const TAIL_F64: bool = true;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
        fn at(row: &[u8], o: usize) -> f32 {
            f32::from_bits(u32::from(u16::from_le_bytes([row[o], row[o + 1]])) << 16)
        }
        #[inline(always)]
        unsafe fn load8x2(lo: *const u8, hi: *const u8) -> __m512 {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(pair(lo, hi))))
        }
        #[inline(always)]
        unsafe fn load16(p: *const u8) -> __m512 {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }

    /// `hsum_float_8` / tinyBLAS's `hsum`: `((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))`.
    #[inline(always)]
    unsafe fn hsum8(x: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    /// `GGML_F32x8_REDUCE` of four accumulators (F16's `vec_dot`).
    #[inline(always)]
    unsafe fn reduce_4x8(s: [__m256; 4]) -> f32 {
        let s0 = _mm256_add_ps(s[0], s[2]);
        let s1 = _mm256_add_ps(s[1], s[3]);
        let s0 = _mm256_add_ps(s0, s1);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps::<1>(s0));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    /// `vec_dot` of `R` weight rows with one activation row (module doc), `n` values each.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // j and r index ggml's accumulators and the rows
    unsafe fn vec_dot<H: Half, const R: usize>(w: [&[u8]; R], a: &[u8]) -> [f32; R] {
        let n = a.len() / H::BYTES;
        let np = n & !31;
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let ap = a.as_ptr();
        let mut i = 0;
        while i < np {
            for j in 0..4 {
                let av = H::load8(ap.add(H::BYTES * (i + 8 * j)));
                for r in 0..R {
                    let wv = H::load8(w[r].as_ptr().add(H::BYTES * (i + 8 * j)));
                    acc[r][j] = if H::VEC_DOT_FMA {
                        _mm256_fmadd_ps(wv, av, acc[r][j])
                    } else {
                        _mm256_add_ps(_mm256_mul_ps(wv, av), acc[r][j])
                    };
                }
            }
            i += 32;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = vec_dot_end::<H>(acc[r], w[r], a, np);
        }
        out
    }

    /// The end of `vec_dot` for one row: ggml's reduction of the four accumulators, then
    /// the values from `np` on (past the last chunk of 32) added one by one.
    #[inline(always)]
    unsafe fn vec_dot_end<H: Half>(c: [__m256; 4], w: &[u8], a: &[u8], np: usize) -> f32 {
        let n = a.len() / H::BYTES;
        let vec = if H::VEC_DOT_FMA {
            reduce_4x8(c)
        } else {
            hsum8(_mm256_add_ps(
                _mm256_add_ps(c[0], c[2]),
                _mm256_add_ps(c[1], c[3]),
            ))
        };
        let tail = (np..n).map(|k| H::at(w, H::BYTES * k) * H::at(a, H::BYTES * k));
        if H::TAIL_F64 {
            tail.fold(vec as f64, |s, p| s + p as f64) as f32
        } else {
            tail.fold(vec, |s, p| s + p)
        }
    }

    /// Lanes 0..8 of `v`.
    #[inline(always)]
    unsafe fn low8(v: __m512) -> __m256 {
        _mm512_castps512_ps256(v)
    }

    /// Lanes 8..16 of `v`.
    #[inline(always)]
    unsafe fn high8(v: __m512) -> __m256 {
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
    }

    /// [`vec_dot`] with 512-bit vectors: ggml's accumulators `2p` and `2p + 1` (values
    /// `i + 16p .. i + 16p + 16` of each chunk of 32) share one register, so each load,
    /// widening, multiply and add serves sixteen lanes; the lanes' operations and the
    /// final reduction are [`vec_dot`]'s.
    #[inline(always)]
    unsafe fn vec_dot_512<H: Half, const R: usize>(w: [&[u8]; R], a: &[u8]) -> [f32; R] {
        let n = a.len() / H::BYTES;
        let np = n & !31;
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let ap = a.as_ptr();
        let mut i = 0;
        while i < np {
            for p in 0..2 {
                let av = H::load16(ap.add(H::BYTES * (i + 16 * p)));
                for (r, accr) in acc.iter_mut().enumerate() {
                    let wv = H::load16(w[r].as_ptr().add(H::BYTES * (i + 16 * p)));
                    accr[p] = if H::VEC_DOT_FMA {
                        _mm512_fmadd_ps(wv, av, accr[p])
                    } else {
                        _mm512_add_ps(_mm512_mul_ps(wv, av), accr[p])
                    };
                }
            }
            i += 32;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let c = [
                low8(acc[r][0]),
                high8(acc[r][0]),
                low8(acc[r][1]),
                high8(acc[r][1]),
            ];
            out[r] = vec_dot_end::<H>(c, w[r], a, np);
        }
        out
    }

    /// tinyBLAS's products of `R` weight rows with `C` activation rows: `out[c][r]`. Rows
    /// must be whole chunks of 8 (the callers check).
    #[inline(always)]
    unsafe fn tinyblas<H: Half, const R: usize, const C: usize>(
        w: [&[u8]; R],
        a: [&[u8]; C],
    ) -> [[f32; R]; C] {
        let n = a[0].len() / H::BYTES;
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        let mut l = 0;
        while l < n {
            let mut bv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                bv[c] = H::load8(a[c].as_ptr().add(H::BYTES * l));
            }
            for r in 0..R {
                let av = H::load8(w[r].as_ptr().add(H::BYTES * l));
                for c in 0..C {
                    acc[c][r] = _mm256_fmadd_ps(av, bv[c], acc[c][r]);
                }
            }
            l += 8;
        }
        let mut out = [[0f32; R]; C];
        for c in 0..C {
            for r in 0..R {
                out[c][r] = hsum8(acc[c][r]);
            }
        }
        out
    }

    /// tinyBLAS's products of four weight rows with eight activation rows, `out[c][r]`:
    /// columns `2p` and `2p + 1` in the low and high eight lanes of one accumulator per row,
    /// each weight chunk broadcast to both halves. Rows must be whole chunks of 8.
    #[inline(always)]
    unsafe fn tinyblas_4x8<H: Half>(w: [&[u8]; 4], a: [&[u8]; 8]) -> [[f32; 4]; 8] {
        let n = a[0].len() / H::BYTES;
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let mut l = 0;
        while l < n {
            let o = H::BYTES * l;
            let mut bv = [_mm512_setzero_ps(); 4];
            for (p, b) in bv.iter_mut().enumerate() {
                *b = H::load8x2(a[2 * p].as_ptr().add(o), a[2 * p + 1].as_ptr().add(o));
            }
            for r in 0..4 {
                let wp = w[r].as_ptr().add(o);
                let av = H::load8x2(wp, wp);
                for p in 0..4 {
                    acc[p][r] = _mm512_fmadd_ps(av, bv[p], acc[p][r]);
                }
            }
            l += 8;
        }
        let mut out = [[0f32; 4]; 8];
        for p in 0..4 {
            for r in 0..4 {
                let v = acc[p][r];
                out[2 * p][r] = hsum8(_mm512_castps512_ps256(v));
                out[2 * p + 1][r] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                    _mm512_castps_pd(v),
                )));
            }
        }
        out
    }

    /// Panel bytes per value of eight packed columns ([`pack8`]).
    pub(super) const PANEL_VALUE_BYTES: usize = 32;

    /// Packs eight activation rows of `n` values (a multiple of 8) for
    /// [`tinyblas_rx8_packed`]: per chunk of eight values and column pair `p`, columns
    /// `2p` and `2p + 1` as f32 in lanes 0..8 and 8..16 (the conversion and the joining of
    /// the pair done once per chunk of tokens instead of once per four weight rows).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL (inlined into such a caller); rows of at least `n`
    /// values; `out` writable for `n · PANEL_VALUE_BYTES` bytes.
    #[inline(always)]
    unsafe fn pack8<H: Half>(a: &[&[u8]; 8], n: usize, out: *mut u8) {
        let mut l = 0;
        while l < n {
            let o = H::BYTES * l;
            let dst = out.add(l * PANEL_VALUE_BYTES) as *mut f32;
            for p in 0..4 {
                let v = H::load8x2(a[2 * p].as_ptr().add(o), a[2 * p + 1].as_ptr().add(o));
                _mm512_storeu_ps(dst.add(16 * p), v);
            }
            l += 8;
        }
    }

    /// [`tinyblas_4x8`] for `R` weight rows over activations packed by [`pack8`] (`n`
    /// values, a multiple of 8): the same fused multiply-adds in the same order, `out[c][r]`.
    /// Each chunk's `R` weight vectors stay in registers while each panel vector is loaded
    /// once for all of them (six rows: 24 accumulators, and a panel load feeds six
    /// multiply-adds where four rows' fed four).
    ///
    /// # Safety
    /// As [`pack8`]; weight rows of at least `n` values.
    #[inline(always)]
    unsafe fn tinyblas_rx8_packed<H: Half, const R: usize>(
        w: &[&[u8]; R],
        panel: *const u8,
        n: usize,
    ) -> [[f32; R]; 8] {
        let mut acc = [[_mm512_setzero_ps(); R]; 4];
        let mut l = 0;
        while l < n {
            let o = H::BYTES * l;
            let pb = panel.add(l * PANEL_VALUE_BYTES) as *const f32;
            let mut av = [_mm512_setzero_ps(); R];
            for (r, a) in av.iter_mut().enumerate() {
                let wp = w[r].as_ptr().add(o);
                *a = H::load8x2(wp, wp);
            }
            for (p, accp) in acc.iter_mut().enumerate() {
                let b = _mm512_loadu_ps(pb.add(16 * p));
                for (r, a) in accp.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(av[r], b, *a);
                }
            }
            l += 8;
        }
        let mut out = [[0f32; R]; 8];
        for p in 0..4 {
            for r in 0..R {
                let v = hsum8_pair(acc[p][r]);
                out[2 * p][r] = v[0];
                out[2 * p + 1][r] = v[1];
            }
        }
        out
    }

    /// [`hsum8`] of both eight-lane halves of `v` at once (the same additions in the same
    /// tree: `x_l + x_(l+4)`, then lanes 0 + 2 and 1 + 3, then those two), without moving
    /// either half out first.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn hsum8_pair(v: __m512) -> [f32; 2] {
        let a = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        let b = _mm512_add_ps(a, _mm512_permute_ps::<0b01_00_11_10>(a));
        let c = _mm512_add_ps(b, _mm512_permute_ps::<0b10_11_00_01>(b));
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), c);
        [lanes[0], lanes[8]]
    }

    /// The packing of [`pack8`] for one value type.
    macro_rules! pack {
        ($h:ty, $pack:ident) => {
            /// [`pack8`] for this type.
            ///
            /// # Safety
            /// As [`pack8`] (the host has AVX-512F/VL).
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
            pub(super) unsafe fn $pack(a: &[&[u8]; 8], n: usize, out: *mut u8) {
                pack8::<$h>(a, n, out)
            }
        };
    }

    pack!(F32, f32_pack8);
    pack!(F16, f16_pack8);
    pack!(Bf16, bf16_pack8);

    /// [`tinyblas_rx8_packed`] for four F32 weight rows: the tile of all three float types
    /// (F16 and BF16 rows are widened to f32 first: [`f16_widen`], [`bf16_widen`]).
    ///
    /// # Safety
    /// As [`tinyblas_rx8_packed`] (the host has AVX-512F/VL).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(super) unsafe fn f32_tinyblas_4x8_packed(
        w: &[&[u8]; 4],
        panel: *const u8,
        n: usize,
    ) -> [[f32; 4]; 8] {
        tinyblas_rx8_packed::<F32, 4>(w, panel, n)
    }

    /// [`f32_tinyblas_4x8_packed`] for six rows.
    ///
    /// # Safety
    /// As [`tinyblas_rx8_packed`] (the host has AVX-512F/VL).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(super) unsafe fn f32_tinyblas_6x8_packed(
        w: &[&[u8]; 6],
        panel: *const u8,
        n: usize,
    ) -> [[f32; 6]; 8] {
        tinyblas_rx8_packed::<F32, 6>(w, panel, n)
    }

    /// `n` (a multiple of 8) F16 values at `src` as f32 at `dst` (exact).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `2 · n` readable bytes at `src`, `n` writable f32 at `dst`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16_widen(src: *const u8, n: usize, dst: *mut f32) {
        for l in (0..n).step_by(8) {
            _mm256_storeu_ps(dst.add(l), F16::load8(src.add(2 * l)));
        }
    }

    /// `n` (a multiple of 8) BF16 values at `src` as f32 at `dst` (exact).
    ///
    /// # Safety
    /// AVX2; `2 · n` readable bytes at `src`, `n` writable f32 at `dst`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn bf16_widen(src: *const u8, n: usize, dst: *mut f32) {
        for l in (0..n).step_by(8) {
            _mm256_storeu_ps(dst.add(l), Bf16::load8(src.add(2 * l)));
        }
    }

    /// Whether `rows` (of `bytes`-byte values) are of one length and whole tinyBLAS chunks.
    fn tinyblas_rows(rows: &[&[u8]], bytes: usize) -> bool {
        let len = rows.first().map_or(0, |r| r.len());
        rows.iter().all(|r| r.len() == len) && len.is_multiple_of(8 * bytes)
    }

    /// The reference (tinyBLAS refuses the length: llama.cpp's `vec_dot`).
    fn reference(t: GgmlType, w: &[u8], a: &[u8], n_cols: usize) -> f32 {
        ggml::vec_dot_avx2_mul_mat(t, w, a, n_cols).unwrap_or(f32::NAN)
    }

    macro_rules! routines {
        ($h:ty, $dot:ident, $dot4rows:ident, $dot4rows512:ident, $tb:ident, $tb1x4:ident, $tb4x4:ident, $tb4x4_512:ident, $tb4x8_512:ident) => {
            /// tinyBLAS, four rows × eight columns, two columns per 512-bit register.
            ///
            /// # Safety
            /// AVX2, FMA, F16C, AVX-512F and AVX-512VL.
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
            pub(super) unsafe fn $tb4x8_512(w: &[&[u8]; 4], a: &[&[u8]; 8]) -> [[f32; 4]; 8] {
                let all: [&[u8]; 12] = std::array::from_fn(|i| if i < 4 { w[i] } else { a[i - 4] });
                if !tinyblas_rows(&all, <$h>::BYTES) {
                    return std::array::from_fn(|c| {
                        std::array::from_fn(|r| reference(<$h>::TYPE, w[r], a[c], 2))
                    });
                }
                tinyblas_4x8::<$h>(*w, *a)
            }

            /// `vec_dot` (module doc).
            ///
            /// # Safety
            /// AVX2, FMA and F16C; `w` and `a` rows of the same number of values.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $dot(w: &[u8], a: &[u8]) -> f32 {
                if w.len() != a.len() {
                    return reference(<$h>::TYPE, w, a, 1);
                }
                vec_dot::<$h, 1>([w], a)[0]
            }

            /// `vec_dot` of four rows (two passes of two: the accumulators stay in
            /// registers).
            ///
            /// # Safety
            /// As the one-row form, for each row.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $dot4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                if w.iter().any(|r| r.len() != a.len()) {
                    return std::array::from_fn(|r| reference(<$h>::TYPE, w[r], a, 1));
                }
                let x = vec_dot::<$h, 2>([w[0], w[1]], a);
                let y = vec_dot::<$h, 2>([w[2], w[3]], a);
                [x[0], x[1], y[0], y[1]]
            }

            /// `vec_dot` of four rows with 512-bit vectors ([`vec_dot_512`]: the
            /// activation loaded once for the four rows).
            ///
            /// # Safety
            /// As the one-row form, for each row; AVX-512F/VL/BW.
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
            pub(super) unsafe fn $dot4rows512(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                if w.iter().any(|r| r.len() != a.len()) {
                    return std::array::from_fn(|r| reference(<$h>::TYPE, w[r], a, 1));
                }
                vec_dot_512::<$h, 4>(*w, a)
            }

            /// tinyBLAS, one row and one column.
            ///
            /// # Safety
            /// AVX2, FMA and F16C.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $tb(w: &[u8], a: &[u8]) -> f32 {
                if !tinyblas_rows(&[w, a], <$h>::BYTES) {
                    return reference(<$h>::TYPE, w, a, 2);
                }
                tinyblas::<$h, 1, 1>([w], [a])[0][0]
            }

            /// tinyBLAS, one row and four columns (`out[c]`).
            ///
            /// # Safety
            /// AVX2, FMA and F16C.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $tb1x4(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
                if !tinyblas_rows(&[w, a[0], a[1], a[2], a[3]], <$h>::BYTES) {
                    return std::array::from_fn(|c| reference(<$h>::TYPE, w, a[c], 2));
                }
                let v = tinyblas::<$h, 1, 4>([w], *a);
                std::array::from_fn(|c| v[c][0])
            }

            /// tinyBLAS, four rows × four columns (`out[c][r]`), as two 4 × 2 halves.
            ///
            /// # Safety
            /// AVX2, FMA and F16C.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $tb4x4(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                if !tinyblas_rows(
                    &[w[0], w[1], w[2], w[3], a[0], a[1], a[2], a[3]],
                    <$h>::BYTES,
                ) {
                    return std::array::from_fn(|c| {
                        std::array::from_fn(|r| reference(<$h>::TYPE, w[r], a[c], 2))
                    });
                }
                let x = tinyblas::<$h, 4, 2>(*w, [a[0], a[1]]);
                let y = tinyblas::<$h, 4, 2>(*w, [a[2], a[3]]);
                [x[0], x[1], y[0], y[1]]
            }

            /// tinyBLAS, four rows × four columns in one pass (32 vector registers).
            ///
            /// # Safety
            /// AVX2, FMA, F16C, AVX-512F and AVX-512VL.
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
            pub(super) unsafe fn $tb4x4_512(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                if !tinyblas_rows(
                    &[w[0], w[1], w[2], w[3], a[0], a[1], a[2], a[3]],
                    <$h>::BYTES,
                ) {
                    return std::array::from_fn(|c| {
                        std::array::from_fn(|r| reference(<$h>::TYPE, w[r], a[c], 2))
                    });
                }
                tinyblas::<$h, 4, 4>(*w, *a)
            }
        };
    }

    routines!(
        F32,
        f32_vec_dot,
        f32_vec_dot_4rows,
        f32_vec_dot_4rows_avx512,
        f32_tinyblas,
        f32_tinyblas_1x4,
        f32_tinyblas_4x4,
        f32_tinyblas_4x4_avx512,
        f32_tinyblas_4x8_avx512
    );
    routines!(
        F16,
        f16_vec_dot,
        f16_vec_dot_4rows,
        f16_vec_dot_4rows_avx512,
        f16_tinyblas,
        f16_tinyblas_1x4,
        f16_tinyblas_4x4,
        f16_tinyblas_4x4_avx512,
        f16_tinyblas_4x8_avx512
    );
    routines!(
        Bf16,
        bf16_vec_dot,
        bf16_vec_dot_4rows,
        bf16_vec_dot_4rows_avx512,
        bf16_tinyblas,
        bf16_tinyblas_1x4,
        bf16_tinyblas_4x4,
        bf16_tinyblas_4x4_avx512,
        bf16_tinyblas_4x8_avx512
    );
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The bytes of `v` (the f32 rows a widened tile reads).
    fn bytemuck_f32(v: &[f32]) -> &[u8] {
        // SAFETY: any f32 is 4 initialized bytes; the slice covers exactly `v`.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, 4 * v.len()) }
    }
    use ir::ggml;

    /// Random F16 / BF16 rows of `n` values in `[-2, 2)` (a deterministic generator).
    fn rows(t: GgmlType, n: usize, count: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        (0..count)
            .map(|_| {
                let x: Vec<f32> = (0..n).map(|_| next()).collect();
                let mut b = vec![0u8; t.type_size() * n];
                ggml::quantize(t, &x, &mut b, ggml::Q8Flavor::X86).expect("converts");
                b
            })
            .collect()
    }

    /// Every routine equals `ir::ggml`'s reference bit for bit, at lengths with and without
    /// a tail past the chunks of 32 (and one that tinyBLAS refuses), on every build this
    /// host runs.
    #[test]
    #[allow(clippy::needless_range_loop)] // r indexes results and references alike
    fn half_dots_equal_the_reference() {
        let Some(isa) = Tier::host().isa() else {
            return;
        };
        let isas = if isa == Isa::Vnni {
            vec![Isa::Avx2, Isa::Vnni]
        } else {
            vec![Isa::Avx2]
        };
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for n in [8usize, 40, 576, 1544, 20] {
                let w = rows(t, n, 4, 1 + n as u64);
                let a = rows(t, n, 4, 99 + n as u64);
                let vd = |r: usize, c: usize| ggml::vec_dot_avx2(t, &w[r], &a[c]).unwrap();
                let tb =
                    |r: usize, c: usize| ggml::vec_dot_avx2_mul_mat(t, &w[r], &a[c], 4).unwrap();
                let w4: [&[u8]; 4] = std::array::from_fn(|r| w[r].as_slice());
                let a4: [&[u8]; 4] = std::array::from_fn(|c| a[c].as_slice());
                for &isa in &isas {
                    let name = format!("{} n={n} {isa:?}", t.name());
                    // SAFETY: the host runs `isa`'s build; rows of equal length.
                    unsafe {
                        let d = dot_fn_on(t, isa).expect("vec_dot");
                        assert_eq!(d(&w[0], &a[1]).to_bits(), vd(0, 1).to_bits(), "{name}");
                        let d4 = dot4rows_fn_on(t, isa).expect("4 rows")(&w4, &a[2]);
                        for r in 0..4 {
                            assert_eq!(d4[r].to_bits(), vd(r, 2).to_bits(), "{name} row {r}");
                        }
                        let tile = tinyblas4x4_fn_on(t, isa).expect("4x4")(&w4, &a4);
                        for (c, tc) in tile.iter().enumerate() {
                            for (r, v) in tc.iter().enumerate() {
                                assert_eq!(v.to_bits(), tb(r, c).to_bits(), "{name} {r},{c}");
                            }
                        }
                    }
                }
                if let Some(f) = tinyblas4x8_fn(t, Tier::host()) {
                    let a8: [&[u8]; 8] = std::array::from_fn(|c| a[c % 4].as_slice());
                    // SAFETY: chosen for this host; rows of equal length.
                    let tile = unsafe { f(&w4, &a8) };
                    for (c, tc) in tile.iter().enumerate() {
                        for (r, v) in tc.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                tb(r, c % 4).to_bits(),
                                "{} n={n} 4x8 {r},{c}",
                                t.name()
                            );
                        }
                    }
                }
                if let Some(pk) = packed4x8_fn(t, Tier::host()).filter(|pk| n % pk.multiple == 0) {
                    let a8: [&[u8]; 8] = std::array::from_fn(|c| a[(c + 1) % 4].as_slice());
                    let mut panel = vec![0u8; n * pk.block_bytes];
                    // The rows the tile reads: widened to f32 where the type says so.
                    let mut wide = vec![0f32; 4 * n];
                    let wide_rows: Vec<&[u8]> = match pk.widen {
                        Some(widen) => wide
                            .chunks_exact_mut(n)
                            .zip(&w4)
                            .map(|(dst, src)| {
                                // SAFETY: chosen for this host; `n` values each side.
                                unsafe { widen(src.as_ptr(), n, dst.as_mut_ptr()) };
                                let bytes: &[u8] = bytemuck_f32(dst);
                                bytes
                            })
                            .collect(),
                        None => w4.to_vec(),
                    };
                    let tile_rows: [&[u8]; 4] = std::array::from_fn(|r| wide_rows[r]);
                    // SAFETY: chosen for this host; rows of `n` values, `n` a multiple of 8.
                    let tile = unsafe {
                        (pk.pack)(&a8, n, panel.as_mut_ptr());
                        (pk.tile)(&tile_rows, panel.as_ptr(), n)
                    };
                    for (c, tc) in tile.iter().enumerate() {
                        for (r, v) in tc.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                tb(r, (c + 1) % 4).to_bits(),
                                "{} n={n} packed 4x8 {r},{c}",
                                t.name()
                            );
                        }
                    }
                }
                // SAFETY: chosen for this host; rows of equal length.
                unsafe {
                    let one = tinyblas_fn(t).expect("tinyBLAS")(&w[3], &a[0]);
                    assert_eq!(one.to_bits(), tb(3, 0).to_bits(), "{} n={n}", t.name());
                    let v = tinyblas4_fn(t).expect("1x4")(&w[1], &a4);
                    for (c, x) in v.iter().enumerate() {
                        assert_eq!(
                            x.to_bits(),
                            tb(1, c).to_bits(),
                            "{} n={n} col {c}",
                            t.name()
                        );
                    }
                }
            }
        }
    }

    /// The two orders differ (so the tests above would catch a routine of the wrong one).
    #[test]
    fn vec_dot_and_tinyblas_orders_differ() {
        let t = GgmlType::F16;
        let w = rows(t, 576, 8, 5);
        let a = rows(t, 576, 8, 6);
        let differ = (0..8).any(|i| {
            ggml::vec_dot_avx2(t, &w[i], &a[i]).unwrap().to_bits()
                != ggml::vec_dot_avx2_mul_mat(t, &w[i], &a[i], 2)
                    .unwrap()
                    .to_bits()
        });
        assert!(differ);
    }
}
