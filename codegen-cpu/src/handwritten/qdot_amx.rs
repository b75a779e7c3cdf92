//! Q4_K, Q5_K, Q3_K, Q2_K and Q6_K weights × packed Q8_K activation panels on AMX tiles
//! ([`super::amx`]), sixteen weight rows against every sixteen-column panel of a chunk of
//! tokens at once, in llama.cpp's orders: for Q4_K those of its repacked kernels
//! (`ggml_gemm_q4_K_8x8_q8_K` / `ggml_gemv_q4_K_8x8_q8_K`, ggml-cpu/arch/x86/repack.cpp; the
//! module doc of [`super::qdot_repack`] states them), for the others the tiled K-quant
//! order of [`super::qdot_tiled`]: each output is the AVX-512 tiles' number bit for bit.
//!
//! How the integers are formed. `tdpbusd` multiplies unsigned bytes by signed bytes, and a
//! quant times its sub-block scale (`sc·q ≤ 63 · 31` for Q5_K) does not fit a byte. So
//! each scale is split, `sc = 2^F·h + l` (`0 ≤ l < 2^F`; `F` = 4 for Q4_K's 4-bit quants, 3
//! for Q5_K's 5-bit and Q3_K's 3-bit ones; Q2_K's products fit whole, `h = 0`), and a
//! weight row is unpacked once per super-block into two tiles of bytes, `l·q` and `h·q`:
//! one tile row is 64 values (two 32-value sub-blocks, or four 16-value ones), so one
//! `tdpbusd` of each against the activations' 64 bytes gives `Σ l·q·y` and `Σ h·q·y` for 16
//! rows × 16 columns, and `2^F·hi + lo` is their exact `Σ sc·q·y`. Q3_K's and Q6_K's
//! scales are signed: their `h` is too, and the `h·q` tiles (signed bytes) take `tdpbssd`. Q4_K's gemm
//! order takes the sums per pair of sub-blocks (its fused multiply-add per pair); its gemv
//! order and the tiled order let the tiles add the whole super-block first. The mins' (or
//! Q3_K's scales') integers against the activations' `bsums` come from `vpmaddwd` /
//! `vpdpwssd` as in the AVX-512 tiles; all of these are exact, so their order does not
//! matter, and the f32 operations after them are the AVX-512 tiles' own.
//!
//! The unpacking (`vpmullw`: for unsigned factors a word's two bytes times the same `l`
//! cannot carry, since each product is below 256; signed ones per byte) is paid once per
//! super-block for all of a chunk's panels, not once per sixteen columns; two panels share
//! each weight tile load. Q6_K's 8-bit signed scales against 6-bit quants need both
//! splits (`sc = 16h + l`, `q = lo + 16·hi`): four tiles a pair, one panel a step.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::amx;
use super::qdot::x86::{f16_at, k4_scales_mins_vec};
use super::qdot_repack::x86::Q8_K_PANEL16_BYTES;

/// Weight rows of one call.
pub(crate) const ROWS: usize = 16;

/// Panels one call accumulates at a time (a call with more runs in batches of this many).
const MAX_GROUPS: usize = 8;

/// Bytes of one tile: 16 rows × 64 bytes.
const TILE: usize = 1024;

/// A 64-byte aligned buffer of `N` bytes (tile loads and stores want whole cache lines).
#[repr(C, align(64))]
struct Aligned<const N: usize>([u8; N]);

/// One super-block of sixteen weight rows, unpacked for the tiles.
#[repr(C, align(64))]
struct Unpacked {
    /// Per pair of sub-blocks `p`: the `l·q` tile at `T·p · TILE` (`T` = [`tiles_of`]),
    /// the `h·q` tile after it, and for split quants the same two of the high parts (row
    /// `i` at `64 i`: value vector `2p`'s 32 values, then `2p + 1`'s).
    tiles: Aligned<{ 16 * TILE }>,
    /// Row `i`'s `vpmaddwd` operands of the mins' integers (or, for the types without
    /// mins, of the scales' `t`): pair `j` of i16 factors for the activations' `bsums` pair
    /// `j` ([`Format::scales`]).
    mins: [[u32; 8]; ROWS],
    /// Row `i`'s `d` and `dmin`.
    d: [f32; ROWS],
    dmin: [f32; ROWS],
}

/// Where [`k4_scales_mins_vec`] puts sub-block `j`'s scale (its min is 4 further on).
const fn scale_at(j: usize) -> usize {
    if j < 4 {
        j
    } else {
        j + 4
    }
}

/// `vpermw` indices spreading pair `p`'s two scales over a 64-byte row: words 0..16 (the
/// first sub-block's 32 bytes) take scale `2p`, words 16..32 scale `2p + 1`.
const PAIR_SCALES: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut p = 0;
    while p < 4 {
        let mut w = 0;
        while w < 32 {
            t[p][w] = scale_at(2 * p + w / 16) as u16;
            w += 1;
        }
        p += 1;
    }
    t
};

/// `vpermw` indices spreading pair `p`'s four 16-value scales (of sixteen i16 words) over
/// a 64-byte row: eight words (16 values) each.
const PAIR_SCALES16: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut p = 0;
    while p < 4 {
        let mut w = 0;
        while w < 32 {
            t[p][w] = (4 * p + w / 8) as u16;
            w += 1;
        }
        p += 1;
    }
    t
};

/// A weight format the kernel reads: Q4_K and Q5_K (the same 6-bit scales and mins in
/// 12 bytes at offset 4, `d` and `dmin` before them; 4- and 5-bit unsigned quants), and the
/// formats with a scale per 16 values: Q3_K (signed 6-bit scales, 3-bit quants offset by
/// 4), Q2_K (4-bit scales and mins, 2-bit quants), Q6_K (signed 8-bit scales, 6-bit quants
/// offset by 32).
pub(crate) trait Format {
    /// Bytes of one super-block.
    const BLOCK: usize;
    /// The scale split `sc = 2^FOLD·h + l` (`0 ≤ l < 2^FOLD`): both `l·q` and `h·q` must
    /// fit a byte for every quant `q` (4 for Q4_K's `q ≤ 15`, Q6_K's 4-bit parts and Q2_K,
    /// whose `h` is 0; 3 for Q5_K's `q ≤ 31` and Q3_K's `q ≤ 7`).
    const FOLD: u32;
    /// Whether scales may be negative (Q3_K, Q6_K): `h` is then signed, its tile of signed
    /// bytes multiplied by `tdpbssd`.
    const SIGNED: bool = false;
    /// The tiled order's step for the types without mins: `s1 - 2^SHIFT·t` (`t` the scales
    /// times `bsums`; 2 for Q3_K, 5 for Q6_K); `None` for the types with mins.
    const SHIFT: Option<u32> = None;
    /// Whether the quants come in two parts, `q = lo + 16·hi` (Q6_K's 4 + 2 bits: its
    /// 8-bit scales times 6-bit quants need both splits), each with its own two tiles.
    const SPLIT: bool = false;
    /// For [`Format::SPLIT`] formats, pair `p`'s high parts (`quants` gives the low ones).
    ///
    /// # Safety
    /// As [`Format::quants`].
    #[inline(always)]
    unsafe fn quants_hi(_x: *const u8, _p: usize) -> __m512i {
        _mm512_setzero_si512()
    }
    /// [`PAIR_SCALES`] or [`PAIR_SCALES16`] for the words of [`Format::scales`].
    const SCALE_IDX: [[u16; 32]; 4];
    /// The block at `x`'s scales as i16 words (what [`Format::SCALE_IDX`] indexes), its
    /// eight `vpmaddwd` operands ([`Unpacked::mins`]: i16 pairs as u32), `d` and `dmin`.
    ///
    /// # Safety
    /// AVX-512F/BW, F16C (inlined into such a caller); `x` a whole block.
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32);
    /// Pair `p`'s 64 unsigned quants of the block at `x`, one a byte: sub-block `2p`'s 32
    /// values, then sub-block `2p + 1`'s.
    ///
    /// # Safety
    /// AVX-512F/BW (inlined into such a caller); `x` a whole block.
    unsafe fn quants(x: *const u8, p: usize) -> __m512i;
}

/// The 32 bytes at `p` as 64 nibbles: the low ones, then the high ones.
///
/// # Safety
/// AVX-512F/BW (inlined into such a caller); `p` valid for 32 bytes.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m512i {
    let v = _mm256_loadu_si256(p as *const __m256i);
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4));
    _mm512_and_si512(both, _mm512_set1_epi8(0x0f))
}

/// The 32 bytes at `p` in both halves of a 512-bit vector.
///
/// # Safety
/// AVX-512F (inlined into such a caller); `p` valid for 32 bytes.
#[inline(always)]
unsafe fn twice(p: *const u8) -> __m512i {
    let v = _mm256_loadu_si256(p as *const __m256i);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), v)
}

/// Bit `a` of each byte of `v`'s first half and bit `b` of its second half, at bit 0 (16-bit
/// shifts: the mask drops what they bring in from the neighbouring byte); `mask` keeps more
/// bits from there on (1 for one bit, 3 for two).
///
/// # Safety
/// AVX-512F/BW (inlined into such a caller).
#[inline(always)]
unsafe fn bits(v: __m512i, (a, b): (i16, i16), mask: i8) -> __m512i {
    let by = _mm512_mask_blend_epi16(0xffff_0000, _mm512_set1_epi16(a), _mm512_set1_epi16(b));
    _mm512_and_si512(_mm512_srlv_epi16(v, by), _mm512_set1_epi8(mask))
}

/// Q4_K: 144-byte blocks, the nibbles of `qs` (offset 16) low then high per 32 bytes.
pub(crate) struct Q4K;

impl Format for Q4K {
    const BLOCK: usize = 144;
    const FOLD: u32 = 4;
    const SCALE_IDX: [[u16; 32]; 4] = PAIR_SCALES;
    #[inline(always)]
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
        k4_scales(x)
    }
    #[inline(always)]
    unsafe fn quants(x: *const u8, p: usize) -> __m512i {
        nibbles(x.add(16 + 32 * p))
    }
}

/// Q5_K: 176-byte blocks, Q4_K's nibbles (`qs` at offset 48) and a fifth bit from `qh`
/// (offset 16: bit `j` of byte `k` for value `k` of sub-block `j`).
pub(crate) struct Q5K;

impl Format for Q5K {
    const BLOCK: usize = 176;
    const FOLD: u32 = 3;
    const SCALE_IDX: [[u16; 32]; 4] = PAIR_SCALES;
    #[inline(always)]
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
        k4_scales(x)
    }
    #[inline(always)]
    unsafe fn quants(x: *const u8, p: usize) -> __m512i {
        // Bit 2p of each `qh` byte for the first sub-block, bit 2p + 1 for the second.
        let p = p as i16;
        let bit = bits(twice(x.add(16)), (2 * p, 2 * p + 1), 1);
        _mm512_or_si512(
            nibbles(x.add(48 + 32 * p as usize)),
            _mm512_slli_epi16(bit, 4),
        )
    }
}

/// [`Format::scales`] of Q4_K and Q5_K: the 6-bit scales and mins at offset 4 (mins `j`
/// twice in each operand: sub-block `j`'s two `bsums`), `d` and `dmin` at 0 and 2.
///
/// # Safety
/// AVX-512F/BW, F16C (inlined into such a caller); `x` a whole block.
#[inline(always)]
unsafe fn k4_scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
    let sm = k4_scales_mins_vec(x.add(4));
    let words = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
    // The mins, bytes 4..8 and 12..16, in order.
    let m = _mm_shuffle_epi8(
        sm,
        _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0),
    );
    let m = _mm256_cvtepu8_epi32(m);
    let ops = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
    (words, ops, f16_at(x), f16_at(x.add(2)))
}

/// Q3_K: 110-byte blocks (`hmask[32]`, `qs[64]`, `scales[12]`, `d`), the quants `q + 4`
/// where the `hmask` bit is set (0..8) as `qdot_tiled` takes them, sixteen signed scales.
pub(crate) struct Q3K;

impl Format for Q3K {
    const BLOCK: usize = 110;
    const FOLD: u32 = 3;
    const SIGNED: bool = true;
    const SHIFT: Option<u32> = Some(2);
    const SCALE_IDX: [[u16; 32]; 4] = PAIR_SCALES16;
    #[inline(always)]
    unsafe fn quants(x: *const u8, p: usize) -> __m512i {
        // Value vectors 2p and 2p + 1: bits 2k.. of `qs` half `p / 2` (k = 2 (p % 2) and
        // the next), and bit 4 (p / 2) + k of `hmask` at bit 2.
        let (half, k) = (p / 2, 2 * (p % 2) as i16);
        let low = bits(twice(x.add(32 + 32 * half)), (2 * k, 2 * k + 2), 3);
        let h = 4 * half as i16 + k;
        let bit = bits(twice(x), (h, h + 1), 1);
        _mm512_or_si512(low, _mm512_slli_epi16(bit, 2))
    }
    #[inline(always)]
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
        let sc = _mm256_cvtepi8_epi16(super::qdot_tiled::x86::q3_k_scales(x.add(96)));
        // The words in pairs are the operands already: scales 2j and 2j + 1.
        (_mm512_castsi256_si512(sc), sc, f16_at(x.add(108)), 0.0)
    }
}

/// Q2_K: 84-byte blocks (`scales[16]`: scale and min nibbles, `qs[64]`, `d`, `dmin`), 2-bit
/// quants with sixteen 4-bit scales and mins. `sc·q ≤ 45`, so the `h·q` tile is zeros
/// (`FOLD` 4 leaves `h = 0`): one wasted `tdpbusd` per pair, kept for one code path.
pub(crate) struct Q2K;

impl Format for Q2K {
    const BLOCK: usize = 84;
    const FOLD: u32 = 4;
    const SCALE_IDX: [[u16; 32]; 4] = PAIR_SCALES16;
    #[inline(always)]
    unsafe fn quants(x: *const u8, p: usize) -> __m512i {
        // Value vectors 2p and 2p + 1: bits 2k.. of `qs` half `p / 2`, k = 2 (p % 2) and
        // the next.
        let k = 2 * (p % 2) as i16;
        bits(twice(x.add(16 + 32 * (p / 2))), (2 * k, 2 * k + 2), 3)
    }
    #[inline(always)]
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
        let sm = _mm_loadu_si128(x as *const __m128i);
        let m4 = _mm_set1_epi8(0x0f);
        let scales = _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sm), m4));
        (
            _mm512_castsi256_si512(scales),
            mins,
            f16_at(x.add(80)),
            f16_at(x.add(82)),
        )
    }
}

/// Q6_K: 210-byte blocks (`ql[128]`, `qh[64]`, `scales[16]`, `d`), 6-bit quants (the
/// weight plus 32, as `qdot_tiled` takes them) with sixteen signed 8-bit scales: `sc =
/// 16h + l` and `q = lo + 16·hi`, four tiles a pair.
pub(crate) struct Q6K;

impl Format for Q6K {
    const BLOCK: usize = 210;
    const FOLD: u32 = 4;
    const SIGNED: bool = true;
    const SHIFT: Option<u32> = Some(5);
    const SPLIT: bool = true;
    const SCALE_IDX: [[u16; 32]; 4] = PAIR_SCALES16;
    #[inline(always)]
    unsafe fn quants(x: *const u8, p: usize) -> __m512i {
        // Value vectors 2p, 2p + 1: the low nibbles of `ql[64 (p / 2)..][..64]` for even
        // `p`, the high ones for odd.
        let v = _mm512_loadu_si512(x.add(64 * (p / 2)) as *const __m512i);
        let v = if p % 2 == 1 {
            _mm512_srli_epi16(v, 4)
        } else {
            v
        };
        _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn quants_hi(x: *const u8, p: usize) -> __m512i {
        // Bits 4 (p % 2).. and 4 (p % 2) + 2.. of `qh[32 (p / 2)..][..32]`.
        let s = 4 * (p % 2) as i16;
        bits(twice(x.add(128 + 32 * (p / 2))), (s, s + 2), 3)
    }
    #[inline(always)]
    unsafe fn scales(x: *const u8) -> (__m512i, __m256i, f32, f32) {
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
        (_mm512_castsi256_si512(sc), sc, f16_at(x.add(208)), 0.0)
    }
}

/// Tiles a pair of [`Unpacked`] holds for format `F`: 2, or 4 for split quants.
const fn tiles_of<F: Format>() -> usize {
    if F::SPLIT {
        4
    } else {
        2
    }
}

/// `q·f` per byte for factors `f` (i16 words) that may be negative (a negative low byte
/// would borrow from the high one in one `vpmullw`): even bytes, then odd ones.
///
/// # Safety
/// AVX-512F/BW (inlined into such a caller).
#[inline(always)]
unsafe fn mul_signed(q: __m512i, f: __m512i) -> __m512i {
    let even = _mm512_mullo_epi16(_mm512_and_si512(q, _mm512_set1_epi16(0xff)), f);
    let odd = _mm512_mullo_epi16(_mm512_srli_epi16(q, 8), f);
    _mm512_or_si512(
        _mm512_and_si512(even, _mm512_set1_epi16(0xff)),
        _mm512_slli_epi16(odd, 8),
    )
}

/// The f32 orders of [`update`]: llama.cpp's repacked Q4_K gemm (a fused multiply-add per
/// pair of sub-blocks) and gemv (one per super-block: `acc = fma(isum, d·d_y, acc)`, the
/// mins likewise, the result `acc - acc_min`), and the tiled K-quant order of
/// `qdot_tiled` (per super-block `r = d·s1`, `r = fma(-dmin, t, r)`, `out = fma(r, d_y,
/// out)`).
const GEMM: u8 = 0;
const GEMV: u8 = 1;
const TILED: u8 = 2;

/// Unpacks super-block `b` of the sixteen rows `w` into `u` (every field written).
///
/// # Safety
/// AVX-512F/BW, F16C (inlined into such a caller); every row holds more than `b` blocks
/// of `F`; `u` valid for writes.
#[inline(always)]
unsafe fn unpack<F: Format>(w: &[&[u8]; ROWS], b: usize, u: *mut Unpacked) {
    let idx: [__m512i; 4] =
        std::array::from_fn(|p| _mm512_loadu_si512(F::SCALE_IDX[p].as_ptr() as *const __m512i));
    let tiles = std::ptr::addr_of_mut!((*u).tiles) as *mut u8;
    let d = std::ptr::addr_of_mut!((*u).d) as *mut f32;
    let dmin = std::ptr::addr_of_mut!((*u).dmin) as *mut f32;
    let mins = std::ptr::addr_of_mut!((*u).mins) as *mut [u32; 8];
    let fold = _mm_cvtsi32_si128(F::FOLD as i32);
    for (i, row) in w.iter().enumerate() {
        let x = row.as_ptr().add(F::BLOCK * b);
        let (words, ops, dx, dminx) = F::scales(x);
        d.add(i).write(dx);
        dmin.add(i).write(dminx);
        _mm256_storeu_si256(mins.add(i) as *mut __m256i, ops);
        let lo = _mm512_and_si512(words, _mm512_set1_epi16((1 << F::FOLD) - 1));
        // Arithmetic: a negative scale's `h` is negative, `l` stays in 0..2^FOLD.
        let hi = _mm512_sra_epi16(words, fold);
        for (p, idx) in idx.iter().enumerate() {
            let at = tiles.add(tiles_of::<F>() * p * TILE + 64 * i);
            let l = _mm512_permutexvar_epi16(*idx, lo);
            let h = _mm512_permutexvar_epi16(*idx, hi);
            let parts = if F::SPLIT { 2 } else { 1 };
            for part in 0..parts {
                let q = if part == 0 {
                    F::quants(x, p)
                } else {
                    F::quants_hi(x, p)
                };
                let at = at.add(2 * TILE * part);
                _mm512_store_si512(at as *mut __m512i, _mm512_mullo_epi16(q, l));
                let qh = if F::SIGNED {
                    mul_signed(q, h)
                } else {
                    _mm512_mullo_epi16(q, h)
                };
                _mm512_store_si512(at.add(TILE) as *mut __m512i, qh);
            }
        }
    }
}

/// The f32 state of one panel: per row, the sums of the values and of the mins (the
/// result is their difference), sixteen columns in the lanes.
#[derive(Clone, Copy)]
struct Acc {
    sum: [__m512; ROWS],
    min: [__m512; ROWS],
}

/// Tiles of one step: the `l·q` and `h·q` tiles at `a` (pair `p` of an [`Unpacked`]) times
/// the activation tiles at `b0` (and `b1`, with `TWO`) into `tmm4`/`tmm5` (and
/// `tmm6`/`tmm7`), zeroed first unless `ACC`; the `h·q` tile by `tdpbssd` when `signed`
/// (signed bytes), else by `tdpbusd`.
///
/// # Safety
/// [`amx::configure`] has run on this thread; `a` holds two tiles, `b0`/`b1` one each
/// (16 rows of 64 bytes, 64 bytes apart).
#[inline(always)]
unsafe fn products<const TWO: bool, const ACC: bool>(
    a: *const u8,
    b0: *const u8,
    b1: *const u8,
    signed: bool,
) {
    if !ACC {
        std::arch::asm!(
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, preserves_flags, nomem)
        );
    }
    std::arch::asm!(
        "tileloadd tmm0, [{a} + {s}]",
        "tileloadd tmm1, [{a} + {s} + 1024]",
        "tileloadd tmm2, [{b0} + {s}]",
        "tdpbusd tmm4, tmm0, tmm2",
        a = in(reg) a,
        b0 = in(reg) b0,
        s = in(reg) 64usize,
        options(nostack, preserves_flags, readonly),
    );
    if signed {
        std::arch::asm!(
            "tdpbssd tmm5, tmm1, tmm2",
            options(nostack, preserves_flags, nomem)
        );
    } else {
        std::arch::asm!(
            "tdpbusd tmm5, tmm1, tmm2",
            options(nostack, preserves_flags, nomem)
        );
    }
    if TWO {
        std::arch::asm!(
            "tileloadd tmm3, [{b1} + {s}]",
            "tdpbusd tmm6, tmm0, tmm3",
            b1 = in(reg) b1,
            s = in(reg) 64usize,
            options(nostack, preserves_flags, readonly),
        );
        if signed {
            std::arch::asm!(
                "tdpbssd tmm7, tmm1, tmm3",
                options(nostack, preserves_flags, nomem)
            );
        } else {
            std::arch::asm!(
                "tdpbusd tmm7, tmm1, tmm3",
                options(nostack, preserves_flags, nomem)
            );
        }
    }
}

/// The tiles of one pair of format `F` (at `a`) against the activation tiles `b0` (and `b1`
/// with `two`): [`products`] or for split quants [`products4`], added to the sum tiles
/// with `acc`, else into zeroed ones.
///
/// # Safety
/// As [`products`].
#[inline(always)]
unsafe fn pair_products<F: Format>(
    a: *const u8,
    (b0, b1): (*const u8, *const u8),
    two: bool,
    acc: bool,
) {
    match (F::SPLIT, two, acc) {
        (true, _, false) => products4::<false>(a, b0),
        (true, _, true) => products4::<true>(a, b0),
        (false, true, false) => products::<true, false>(a, b0, b1, F::SIGNED),
        (false, true, true) => products::<true, true>(a, b0, b1, F::SIGNED),
        (false, false, false) => products::<false, false>(a, b0, b1, F::SIGNED),
        (false, false, true) => products::<false, true>(a, b0, b1, F::SIGNED),
    }
}

/// [`products`] for split quants, one panel: the four tiles at `a` (`l·lo`, `h·lo`, `l·hi`,
/// `h·hi`; the `h` ones signed) times the activation tile at `b0` into `tmm4`–`tmm7`.
///
/// # Safety
/// As [`products`]; `a` holds four tiles.
#[inline(always)]
unsafe fn products4<const ACC: bool>(a: *const u8, b0: *const u8) {
    if !ACC {
        std::arch::asm!(
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, preserves_flags, nomem)
        );
    }
    std::arch::asm!(
        "tileloadd tmm2, [{b0} + {s}]",
        "tileloadd tmm0, [{a} + {s}]",
        "tdpbusd tmm4, tmm0, tmm2",
        "tileloadd tmm1, [{a} + {s} + 1024]",
        "tdpbssd tmm5, tmm1, tmm2",
        "tileloadd tmm3, [{a} + {s} + 2048]",
        "tdpbusd tmm6, tmm3, tmm2",
        "tileloadd tmm0, [{a} + {s} + 3072]",
        "tdpbssd tmm7, tmm0, tmm2",
        a = in(reg) a,
        b0 = in(reg) b0,
        s = in(reg) 64usize,
        options(nostack, preserves_flags, readonly),
    );
}

/// Stores `tmm4`/`tmm5` (and `tmm6`/`tmm7` with `TWO`) to `c`, one tile each, in order.
///
/// # Safety
/// [`amx::configure`] has run on this thread; `c` writable for 2 (4) tiles.
#[inline(always)]
unsafe fn store<const TWO: bool>(c: *mut u8) {
    std::arch::asm!(
        "tilestored [{c} + {s}], tmm4",
        "tilestored [{c} + {s} + 1024], tmm5",
        c = in(reg) c,
        s = in(reg) 64usize,
        options(nostack, preserves_flags),
    );
    if TWO {
        std::arch::asm!(
            "tilestored [{c} + {s} + 2048], tmm6",
            "tilestored [{c} + {s} + 3072], tmm7",
            c = in(reg) c,
            s = in(reg) 64usize,
            options(nostack, preserves_flags),
        );
    }
}

/// `2^FOLD·hi + lo` of row `i` of the two stored tiles at `c` (for split quants, that of
/// the next two times 16 added): the exact integer sums.
///
/// # Safety
/// AVX-512F (inlined into such a caller); `c` holds two stored tiles.
#[inline(always)]
unsafe fn sums<F: Format>(c: *const u8, i: usize) -> __m512i {
    let pair = |c: *const u8| {
        let lo = _mm512_load_si512(c.add(64 * i) as *const __m512i);
        let hi = _mm512_load_si512(c.add(TILE + 64 * i) as *const __m512i);
        let hi = _mm512_sll_epi32(hi, _mm_cvtsi32_si128(F::FOLD as i32));
        _mm512_add_epi32(hi, lo)
    };
    if F::SPLIT {
        // `q = lo + 16·hi`: the high parts' sums after the low ones' two tiles.
        _mm512_add_epi32(pair(c), _mm512_slli_epi32(pair(c.add(2 * TILE)), 4))
    } else {
        pair(c)
    }
}

/// `vpdpwssd`: `acc` plus the i16 pair products of `a` and `b`, one instruction (LLVM
/// splits the intrinsic into `vpmaddwd` and `vpaddd`, two).
///
/// # Safety
/// AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    std::arch::asm!(
        "vpdpwssd {r}, {a}, {b}",
        r = inout(zmm_reg) r,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    r
}

/// One panel's f32 updates after the tiles of one step, for every row: in `ORDER` (a step
/// is pair `p` in the gemm order, the super-block in the others). `dv` holds the panel's
/// `d·d_y` and `dmin·d_y` per row (the repacked orders), formed here at the super-block's
/// first step; `first` is the first step of the first super-block (the state starts at 0).
///
/// # Safety
/// AVX-512F/BW/VNNI (inlined into such a caller); `c` holds this panel's two stored
/// tiles, `o` is its packed super-block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn update<F: Format, const ORDER: u8>(
    u: &Unpacked,
    o: *const u8,
    p: usize,
    c: *const u8,
    acc: &mut MaybeUninit<Acc>,
    dv: &mut MaybeUninit<Acc>,
    first: bool,
) {
    let dy = _mm512_loadu_ps(o.add(4608) as *const f32);
    if p == 0 && ORDER != TILED {
        let at = dv.as_mut_ptr();
        for i in 0..ROWS {
            let d = _mm512_mul_ps(_mm512_set1_ps(u.d[i]), dy);
            std::ptr::addr_of_mut!((*at).sum[i]).write(d);
            let dmin = _mm512_mul_ps(_mm512_set1_ps(u.dmin[i]), dy);
            std::ptr::addr_of_mut!((*at).min[i]).write(dmin);
        }
    }
    let bsum = |j: usize| _mm512_loadu_si512(o.add(4096 + 64 * j) as *const __m512i);
    let m = |i: usize, j: usize| _mm512_set1_epi32(u.mins[i][j] as i32);
    for i in 0..ROWS {
        let mins = if ORDER == GEMM {
            dpwssd(
                _mm512_madd_epi16(bsum(2 * p), m(i, 2 * p)),
                bsum(2 * p + 1),
                m(i, 2 * p + 1),
            )
        } else {
            let mut all = _mm512_madd_epi16(bsum(0), m(i, 0));
            for j in 1..8 {
                all = dpwssd(all, bsum(j), m(i, j));
            }
            all
        };
        let at = acc.as_mut_ptr();
        let sum = std::ptr::addr_of_mut!((*at).sum[i]);
        let min = std::ptr::addr_of_mut!((*at).min[i]);
        let zero = _mm512_setzero_ps();
        let (s0, m0) = if first {
            (zero, zero)
        } else {
            (sum.read(), min.read())
        };
        let s1 = sums::<F>(c, i);
        if ORDER == TILED {
            // `qdot_tiled`'s step; the mins' state stays 0.
            let r = match F::SHIFT {
                Some(shift) => {
                    let t = _mm512_sll_epi32(mins, _mm_cvtsi32_si128(shift as i32));
                    let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(s1, t));
                    _mm512_mul_ps(_mm512_set1_ps(u.d[i]), s)
                }
                None => {
                    let r = _mm512_mul_ps(_mm512_set1_ps(u.d[i]), _mm512_cvtepi32_ps(s1));
                    _mm512_fmadd_ps(_mm512_set1_ps(-u.dmin[i]), _mm512_cvtepi32_ps(mins), r)
                }
            };
            sum.write(_mm512_fmadd_ps(r, dy, s0));
            if first {
                min.write(zero);
            }
        } else {
            let dv = dv.assume_init_ref();
            sum.write(_mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), dv.sum[i], s0));
            min.write(_mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), dv.min[i], m0));
        }
    }
}

/// Sixteen Q4_K rows `w` (`nb` blocks each) against the panels of groups `g0..g1` of
/// `panel` (each `nb` blocks of [`super::qdot_repack`]'s `q8_k_pack16`, one after
/// another from `panel`): llama.cpp's repacked gemm order, or with `gemv` its gemv order.
/// Writes `out[c·out_stride + i]` for rows `i < rows` and columns `c` (`16·g + lane`) in
/// `cols.0..cols.1`; rows past `rows` may repeat real ones (their results are dropped).
///
/// # Safety
/// AVX-512F/BW/VL/VNNI, F16C and [`amx::has_amx`]; every row holds `nb` Q4_K blocks;
/// the panels hold groups `g0..g1`; `out` writable at those indices.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn q4_k_rows16(
    w: &[&[u8]; ROWS],
    panel: *const u8,
    nb: usize,
    groups: (usize, usize),
    gemv: bool,
    out: *mut f32,
    out_stride: usize,
    (rows, cols): (usize, (usize, usize)),
) {
    let order = if gemv { GEMV } else { GEMM };
    rows16::<Q4K>(w, panel, nb, groups, order, (out, out_stride), (rows, cols));
}

/// [`q4_k_rows16`] for rows of a tiled-order format (`F`: [`Q5K`], [`Q3K`], [`Q2K`], [`Q6K`]), in the
/// tiled K-quant order of `qdot_tiled` (the one order of llama.cpp's prompt products for
/// them; `gemv` is ignored).
///
/// # Safety
/// As [`q4_k_rows16`], the rows of format `F`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiled_rows16<F: Format>(
    w: &[&[u8]; ROWS],
    panel: *const u8,
    nb: usize,
    groups: (usize, usize),
    _gemv: bool,
    out: *mut f32,
    out_stride: usize,
    (rows, cols): (usize, (usize, usize)),
) {
    rows16::<F>(w, panel, nb, groups, TILED, (out, out_stride), (rows, cols));
}

/// [`q4_k_rows16`] for format `F` in `order`.
///
/// # Safety
/// As [`q4_k_rows16`], the rows of format `F`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn rows16<F: Format>(
    w: &[&[u8]; ROWS],
    panel: *const u8,
    nb: usize,
    (g0, g1): (usize, usize),
    order: u8,
    (out, out_stride): (*mut f32, usize),
    (rows, cols): (usize, (usize, usize)),
) {
    if nb == 0 {
        // No blocks: every product is zero.
        for c in cols.0.max(16 * g0)..cols.1.min(16 * g1) {
            for i in 0..rows {
                *out.add(c * out_stride + i) = 0.0;
            }
        }
        return;
    }
    amx::configure();
    let mut acc: [MaybeUninit<Acc>; MAX_GROUPS] = [MaybeUninit::uninit(); MAX_GROUPS];
    let mut g = g0;
    while g < g1 {
        let end = g1.min(g + MAX_GROUPS);
        let acc = &mut acc[..end - g];
        match order {
            GEMM => batch::<F, GEMM>(w, panel, nb, g, acc),
            GEMV => batch::<F, GEMV>(w, panel, nb, g, acc),
            _ => batch::<F, TILED>(w, panel, nb, g, acc),
        }
        let mask = ((1u32 << rows) - 1) as u16;
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: `batch` wrote every state of `acc`.
            let a = a.assume_init_ref();
            let by_col = transpose16(std::array::from_fn(|i| _mm512_sub_ps(a.sum[i], a.min[i])));
            let first = 16 * (g + k);
            for c in cols.0.max(first)..cols.1.min(first + 16) {
                _mm512_mask_storeu_ps(out.add(c * out_stride), mask, by_col[c - first]);
            }
        }
        g = end;
    }
}

/// The 16 × 16 transpose: lane `j` of vector `i` to lane `i` of vector `j`.
///
/// # Safety
/// AVX-512F (inlined into such a caller).
#[inline(always)]
unsafe fn transpose16(v: [__m512; 16]) -> [__m512; 16] {
    const LO: i32 = 0b10_00_10_00;
    const HI: i32 = 0b11_01_11_01;
    let pd = |x: __m512| _mm512_castps_pd(x);
    let ps = |x: __m512d| _mm512_castpd_ps(x);
    // Per 128-bit lane `L` of quad `q`'s result `4q + e`: column `4L + e` of rows 4q..4q + 4.
    let mut c = [_mm512_setzero_ps(); 16];
    for q in 0..4 {
        let t0 = _mm512_unpacklo_ps(v[4 * q], v[4 * q + 1]);
        let t1 = _mm512_unpackhi_ps(v[4 * q], v[4 * q + 1]);
        let t2 = _mm512_unpacklo_ps(v[4 * q + 2], v[4 * q + 3]);
        let t3 = _mm512_unpackhi_ps(v[4 * q + 2], v[4 * q + 3]);
        c[4 * q] = ps(_mm512_unpacklo_pd(pd(t0), pd(t2)));
        c[4 * q + 1] = ps(_mm512_unpackhi_pd(pd(t0), pd(t2)));
        c[4 * q + 2] = ps(_mm512_unpacklo_pd(pd(t1), pd(t3)));
        c[4 * q + 3] = ps(_mm512_unpackhi_pd(pd(t1), pd(t3)));
    }
    // Then the lanes: column `4L + e` is lane `L` of `c[e]`, `c[4 + e]`, `c[8 + e]`,
    // `c[12 + e]`, in that order.
    let mut out = [_mm512_setzero_ps(); 16];
    for e in 0..4 {
        let x = _mm512_shuffle_f32x4::<LO>(c[e], c[4 + e]);
        let y = _mm512_shuffle_f32x4::<HI>(c[e], c[4 + e]);
        let x2 = _mm512_shuffle_f32x4::<LO>(c[8 + e], c[12 + e]);
        let y2 = _mm512_shuffle_f32x4::<HI>(c[8 + e], c[12 + e]);
        out[e] = _mm512_shuffle_f32x4::<LO>(x, x2);
        out[8 + e] = _mm512_shuffle_f32x4::<HI>(x, x2);
        out[4 + e] = _mm512_shuffle_f32x4::<LO>(y, y2);
        out[12 + e] = _mm512_shuffle_f32x4::<HI>(y, y2);
    }
    out
}

/// [`q4_k_rows16`] for at most [`MAX_GROUPS`] groups from `g0`, one state each written
/// to `acc` (`nb` > 0). Software-pipelined: each step's tiles are computed and stored
/// before the vector updates of the step before them, so that the tile unit and the
/// vector units work at the same time (in program order a step's updates are longer
/// than the reorder window).
///
/// # Safety
/// As [`q4_k_rows16`], configured.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn batch<F: Format, const ORDER: u8>(
    w: &[&[u8]; ROWS],
    panel: *const u8,
    nb: usize,
    g0: usize,
    acc: &mut [MaybeUninit<Acc>],
) {
    let mut u: [MaybeUninit<Unpacked>; 2] = [MaybeUninit::uninit(), MaybeUninit::uninit()];
    // The stored tiles of a step, two buffers taking turns.
    let mut staged: [MaybeUninit<Aligned<{ 4 * TILE }>>; 2] =
        [MaybeUninit::uninit(), MaybeUninit::uninit()];
    let mut dv: [MaybeUninit<Acc>; MAX_GROUPS] = [MaybeUninit::uninit(); MAX_GROUPS];
    let group = nb * Q8_K_PANEL16_BYTES;
    let groups = acc.len();
    // The step whose updates are pending.
    let mut pending: Option<Step> = None;
    let mut turn = 0;
    for b in 0..nb {
        let unpacked = u[b & 1].as_mut_ptr();
        unpack::<F>(w, b, unpacked);
        let a = std::ptr::addr_of!((*unpacked).tiles) as *const u8;
        let mut k = 0;
        while k < groups {
            // Split quants fill the sum tiles with one panel.
            let two = k + 1 < groups && !F::SPLIT;
            let o0 = panel.add((g0 + k) * group + b * Q8_K_PANEL16_BYTES);
            let o1 = if two { o0.add(group) } else { o0 };
            for p in 0..if ORDER == GEMM { 4 } else { 1 } {
                // The gemm order: pair `p` alone; the others: all four pairs added.
                let pairs = if ORDER == GEMM { p..p + 1 } else { 0..4 };
                for q in pairs.clone() {
                    let at = a.add(tiles_of::<F>() * q * TILE);
                    let (b0, b1) = (o0.add(TILE * q), o1.add(TILE * q));
                    pair_products::<F>(at, (b0, b1), two, q > pairs.start);
                }
                let c = staged[turn].as_mut_ptr() as *mut u8;
                if two || F::SPLIT {
                    store::<true>(c);
                } else {
                    store::<false>(c);
                }
                let step = Step { b, k, two, p, c };
                if let Some(prev) = pending.replace(step) {
                    prev.update::<F, ORDER>(panel, group, g0, &u, acc, &mut dv);
                }
                turn ^= 1;
            }
            k += if two { 2 } else { 1 };
        }
    }
    if let Some(prev) = pending {
        prev.update::<F, ORDER>(panel, group, g0, &u, acc, &mut dv);
    }
}

/// One step of [`batch`]: super-block `b`, groups `g0 + k` (and the next with `two`), pair
/// `p` (the gemm order), its tiles stored at `c`.
#[derive(Clone, Copy)]
struct Step {
    b: usize,
    k: usize,
    two: bool,
    p: usize,
    c: *const u8,
}

impl Step {
    /// The step's vector updates ([`update`]) of its one or two panels.
    ///
    /// # Safety
    /// As [`batch`]; `u[b & 1]` holds super-block `b` unpacked, `c` the step's tiles, and
    /// `dv[k]` (`dv[k + 1]`) were formed by this super-block's first step unless this is it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn update<F: Format, const ORDER: u8>(
        self,
        panel: *const u8,
        group: usize,
        g0: usize,
        u: &[MaybeUninit<Unpacked>; 2],
        acc: &mut [MaybeUninit<Acc>],
        dv: &mut [MaybeUninit<Acc>; MAX_GROUPS],
    ) {
        let u = u[self.b & 1].assume_init_ref();
        let o = panel.add((g0 + self.k) * group + self.b * Q8_K_PANEL16_BYTES);
        let first = self.b == 0 && self.p == 0;
        update::<F, ORDER>(
            u,
            o,
            self.p,
            self.c,
            &mut acc[self.k],
            &mut dv[self.k],
            first,
        );
        if self.two {
            let (o, c) = (o.add(group), self.c.add(2 * TILE));
            let (acc, dv) = (&mut acc[self.k + 1], &mut dv[self.k + 1]);
            update::<F, ORDER>(u, o, self.p, c, acc, dv, first);
        }
    }
}
