//! Hand-written dot products of one weight row (ggml blocks) with one activation row (its
//! `vec_dot_type` blocks), for the row-dot kernels of [`crate::rows`]: AVX2 through
//! `std::arch`, computing what llama.cpp's x86 AVX2 kernel of the type computes, bit for bit
//! (`ggml_vec_dot_*`, ggml-cpu/arch/x86/quants.c). A type without a routine here, or a host
//! without AVX2, takes the plain lane-faithful routine of `ir::ggml::vec_dot_avx2`, which the
//! tests compare these with.
//!
//! Routines: Q5_0, Q8_0, IQ4_NL and MXFP4 (× Q8_0), Q4_1 and Q5_1 (× Q8_1), Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_XS, TQ1_0, TQ2_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M
//! (× Q8_K). They need AVX2, FMA and F16C (what `super::has_avx2` checks).
//!
//! What "the same lanes" means for the K-quants: ggml's AVX2 kernels keep eight i32 lanes per
//! super-block, lane `j` holding the products at bytes `4j..4j+4` of every 32-value vector
//! (`maddubs` then `madd` pair neighbours), each scaled by its 16-value sub-block scale; the
//! lanes are converted to f32 once per super-block and added with one fused multiply-add by
//! the super-block scale `d = d_x · d_y`; the row ends with `hsum_float_8`. Integer sums are
//! exact in any order, so only the lane partition and the float steps must match.

use ir::ggml::GgmlType;

use crate::target::Tier;

/// Which build of the tile routines runs (`x86::avx2` or `x86::vnni`): the same numbers,
/// chosen by the host's features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX2, FMA and F16C: ggml's own instructions.
    Avx2,
    /// AVX-512 VNNI and VL on 256-bit vectors as well ([`super::has_vnni`]).
    Vnni,
}

impl Isa {
    /// The lowest [`Tier`] whose routines are this build's.
    #[cfg(test)]
    pub(crate) fn tier(self) -> Tier {
        match self {
            Isa::Avx2 => Tier::Avx2,
            Isa::Vnni => Tier::Avx512Vnni,
        }
    }
}

/// Every [`Isa`] this host can run (the tests check each build).
#[cfg(test)]
pub(crate) fn host_isas() -> Vec<Isa> {
    match Tier::host().isa() {
        Some(Isa::Vnni) => vec![Isa::Avx2, Isa::Vnni],
        Some(Isa::Avx2) => vec![Isa::Avx2],
        None => Vec::new(),
    }
}

/// `$body` with `$m` naming the module of `$isa`'s tile routines.
#[cfg(target_arch = "x86_64")]
macro_rules! on_isa {
    ($isa:expr, |$m:ident| $body:expr) => {
        match $isa {
            Isa::Avx2 => {
                use x86::avx2 as $m;
                $body
            }
            Isa::Vnni => {
                use x86::vnni as $m;
                $body
            }
        }
    };
}

/// A dot product of two whole rows of the same number of values.
///
/// # Safety
/// The host must have the CPU features the routine was chosen for ([`dot_fn`] checks), and
/// the rows must be whole rows of the weight type and its `vec_dot_type` of equal length.
pub(crate) type DotFn = unsafe fn(&[u8], &[u8]) -> f32;

/// The hand-written routine for weights of type `wtype` on this host, if there is one.
pub(crate) fn dot_fn(wtype: GgmlType, tier: Tier) -> Option<DotFn> {
    dot_fn_on(wtype, tier.isa()?)
}

/// [`dot_fn`] from `isa`'s build (which the host must have).
pub(crate) fn dot_fn_on(wtype: GgmlType, isa: Isa) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    return on_isa!(isa, |m| match wtype {
        GgmlType::Q5_0 => Some(x86::q5_0_q8_0),
        GgmlType::Q4_1 => Some(m::q4_1_q8_1),
        GgmlType::Q5_1 => Some(x86::q5_1_q8_1),
        GgmlType::Q8_0 => Some(m::q8_0_q8_0),
        GgmlType::IQ4_NL => Some(x86::iq4_nl_q8_0),
        GgmlType::Q2_K => Some(x86::q2_k_q8_k),
        GgmlType::Q3_K => Some(x86::q3_k_q8_k),
        GgmlType::Q4_K => Some(x86::q4_k_q8_k),
        GgmlType::Q5_K => Some(x86::q5_k_q8_k),
        GgmlType::Q6_K => Some(x86::q6_k_q8_k),
        GgmlType::IQ4_XS => Some(x86::iq4_xs_q8_k),
        GgmlType::TQ1_0 => Some(x86::tq1_0_q8_k),
        GgmlType::TQ2_0 => Some(x86::tq2_0_q8_k),
        GgmlType::IQ3_XXS => Some(x86::iq3_xxs_q8_k),
        GgmlType::IQ3_S => Some(x86::iq3_s_q8_k),
        GgmlType::IQ2_XXS => Some(x86::iq2_xxs_q8_k),
        GgmlType::IQ2_XS => Some(x86::iq2_xs_q8_k),
        GgmlType::IQ2_S => Some(x86::iq2_s_q8_k),
        GgmlType::IQ1_S => Some(x86::iq1_s_q8_k),
        GgmlType::IQ1_M => Some(x86::iq1_m_q8_k),
        GgmlType::MXFP4 => Some(x86::mxfp4_q8_0),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => super::fdot::dot_fn_on(wtype, isa),
        _ => None,
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wtype, isa);
        None
    }
}

/// Four columns at once: `out[c]` is what the [`DotFn`] of the type gives for the weight
/// row and activation row `a[c]` (the weight's blocks are unpacked once for the four).
///
/// # Safety
/// As [`DotFn`], for each column.
pub(crate) type Dot4Fn = unsafe fn(&[u8], &[&[u8]; 4]) -> [f32; 4];

/// The four-column form of [`dot_fn`]'s routine for `wtype` on this host, where there is
/// one: the types whose `vec_dot` order llama.cpp also keeps for prompts (Q5_0 and Q8_0
/// through tinyBLAS, which gives the same numbers, Q4_1 and Q5_1); the K-quants switch to the
/// tiled kernel there (`super::qdot_tiled`).
pub(crate) fn dot4_fn(wtype: GgmlType, tier: Tier) -> Option<Dot4Fn> {
    dot4_fn_on(wtype, tier.isa()?)
}

/// [`dot4_fn`] from `isa`'s build (which the host must have).
pub(crate) fn dot4_fn_on(wtype: GgmlType, isa: Isa) -> Option<Dot4Fn> {
    #[cfg(target_arch = "x86_64")]
    return on_isa!(isa, |m| match wtype {
        GgmlType::Q5_0 => Some(x86::q5_0_q8_0_x4),
        GgmlType::Q4_1 => Some(m::q4_1_q8_1_x4),
        GgmlType::Q5_1 => Some(m::q5_1_q8_1_x4),
        GgmlType::Q8_0 => Some(m::q8_0_q8_0_x4),
        _ => None,
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wtype, isa);
        None
    }
}

/// A tile of four weight rows × four activation rows: `out[c][r]` is what the [`DotFn`] of
/// the type gives for row `w[r]` and column `a[c]` (each weight block unpacked once per
/// tile, each activation block loaded once: measured 1.45× the one-row form for Q5_0).
///
/// # Safety
/// As [`DotFn`], for each pair.
pub(crate) type Dot4x4Fn = unsafe fn(&[&[u8]; 4], &[&[u8]; 4]) -> [[f32; 4]; 4];

/// The 4 × 4 tile form of [`dot4_fn`]'s routine for `wtype` on this host, if there is one.
pub(crate) fn dot4x4_fn(wtype: GgmlType, tier: Tier) -> Option<Dot4x4Fn> {
    dot4x4_fn_on(wtype, tier.isa()?)
}

/// [`dot4x4_fn`] from `isa`'s build (which the host must have).
pub(crate) fn dot4x4_fn_on(wtype: GgmlType, isa: Isa) -> Option<Dot4x4Fn> {
    #[cfg(target_arch = "x86_64")]
    return on_isa!(isa, |m| match wtype {
        GgmlType::Q5_0 => Some(m::q5_0_q8_0_4x4),
        GgmlType::Q8_0 => Some(m::q8_0_q8_0_4x4),
        GgmlType::Q4_1 => Some(m::q4_1_q8_1_4x4),
        GgmlType::Q5_1 => Some(m::q5_1_q8_1_4x4),
        _ => None,
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wtype, isa);
        None
    }
}

/// A 4 rows × 8 columns tile over packed activations: `tile(w, panel, nb)[c][r]` is what
/// the type's product in llama.cpp's order gives for row `w[r]` (`nb` activation blocks
/// long: values, for the float types) and column `c` of the eight activation rows
/// `pack(a, nb, panel)` packed into `panel` (`block_bytes` per block). Both routines' safety
/// contract is [`DotFn`]'s, for each pair, with `panel` holding `nb` packed blocks, `nb` a
/// multiple of `multiple`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed4x8 {
    pub pack: Pack8Fn,
    pub tile: Tile4x8Fn,
    /// The same products for six weight rows at a time, where the type has that form.
    pub tile6: Option<Tile6x8Fn>,
    /// Panel bytes per activation block (eight columns).
    pub block_bytes: usize,
    /// The tile takes rows of a multiple of this many blocks only.
    pub multiple: usize,
    /// Where the tile reads f32 weight rows made from the weight's own (F16 / BF16): the
    /// routine that writes `n` values of the row at the first pointer as f32 at the second
    /// (exact), run once per four rows and chunk of tokens instead of converting each
    /// value again for every eight columns.
    ///
    /// # Safety (of the routine)
    /// The host has the features the tile was chosen for; `2 · n` readable bytes, `n`
    /// writable f32.
    pub widen: Option<WidenFn>,
}

/// [`Packed4x8::pack`]: eight activation rows of `nb` blocks into a panel.
pub(crate) type Pack8Fn = unsafe fn(&[&[u8]; 8], usize, *mut u8);

/// [`Packed4x8::tile`]: four weight rows against a panel of `nb` blocks, `out[c][r]`.
pub(crate) type Tile4x8Fn = unsafe fn(&[&[u8]; 4], *const u8, usize) -> [[f32; 4]; 8];

/// [`Packed4x8::tile6`]: six weight rows against a panel of `nb` blocks, `out[c][r]`.
pub(crate) type Tile6x8Fn = unsafe fn(&[&[u8]; 6], *const u8, usize) -> [[f32; 6]; 8];

/// [`Packed4x8::widen`]: `n` values of a row as f32.
pub(crate) type WidenFn = unsafe fn(*const u8, usize, *mut f32);

/// The packed 4 × 8 tile of `wtype` on AVX-512 hosts (F, VL, BW, VNNI), two columns to a
/// 512-bit register (`x86::tile32x8`): Q8_0, Q5_0, Q4_1 and Q5_1, whose `vec_dot` order
/// llama.cpp keeps for prompts. (The float types' tinyBLAS-order tile is
/// `fdot::packed4x8_fn`.)
pub(crate) fn packed4x8_fn(wtype: GgmlType, tier: Tier) -> Option<Packed4x8> {
    #[cfg(target_arch = "x86_64")]
    fn quantized(pack: Pack8Fn, tile: Tile4x8Fn) -> Packed4x8 {
        Packed4x8 {
            pack,
            tile,
            tile6: None,
            block_bytes: x86::PANEL_BLOCK_BYTES,
            multiple: 1,
            widen: None,
        }
    }
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q8_0 => Some(quantized(x86::q8_0_pack8, x86::q8_0_q8_0_4x8)),
            GgmlType::Q5_0 => Some(quantized(x86::q5_0_pack8, x86::q5_0_q8_0_4x8)),
            GgmlType::Q4_1 => Some(quantized(x86::q4_1_pack8, x86::q4_1_q8_1_4x8)),
            GgmlType::Q5_1 => Some(quantized(x86::q5_1_pack8, x86::q5_1_q8_1_4x8)),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Four weight rows × one activation row: `out[r]` is what the [`DotFn`] of the type gives
/// for row `w[r]` and `a` (the activation blocks loaded once for the four rows; four
/// independent sums in flight, which decode needs to keep the memory busy).
///
/// # Safety
/// As [`DotFn`], for each row.
pub(crate) type Dot4RowsFn = unsafe fn(&[&[u8]; 4], &[u8]) -> [f32; 4];

/// The four-row form of [`dot_fn`]'s routine for `wtype` on this host, if there is one.
pub(crate) fn dot4rows_fn(wtype: GgmlType, tier: Tier) -> Option<Dot4RowsFn> {
    let isa = tier.isa()?;
    // The forms that need AVX-512 VNNI on 512-bit registers (or AVX-512 VL with VNNI and
    // BW alongside): taken from the VNNI build where the host has them.
    #[cfg(target_arch = "x86_64")]
    let vnni512 = tier.vnni();
    #[cfg(target_arch = "x86_64")]
    return on_isa!(isa, |m| match wtype {
        GgmlType::Q4_1 => Some(m::q4_1_q8_1_4rows),
        GgmlType::Q5_1 => Some(m::q5_1_q8_1_4rows),
        GgmlType::Q5_0 => Some(m::q5_0_q8_0_4rows),
        GgmlType::Q8_0 if vnni512 => Some(x86::q8_0_q8_0_4rows_512),
        GgmlType::Q8_0 => Some(m::q8_0_q8_0_4rows),
        GgmlType::IQ4_XS if vnni512 => Some(x86::iq4_xs_q8_k_4rows_vnni),
        GgmlType::Q3_K if vnni512 => Some(x86::q3_k_q8_k_4rows_vnni),
        GgmlType::Q5_K if vnni512 => Some(x86::q5_k_q8_k_4rows_vnni),
        GgmlType::Q6_K if vnni512 => Some(x86::q6_k_q8_k_4rows_vnni),
        GgmlType::Q6_K => Some(x86::q6_k_q8_k_4rows),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => super::fdot::dot4rows_fn_on(wtype, isa),
        _ => None,
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wtype, isa);
        None
    }
}

/// Bytes of a `block_q8_K`: f32 `d`, 256 × i8 `qs`, 16 × i16 `bsums`.
#[cfg(target_arch = "x86_64")]
const Q8_K_BYTES: usize = 4 + 256 + 32;

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Q8_K_BYTES;
    use ir::ggml::cpu_math::hsum8;
    use ir::ggml::grids::KVALUES_MXFP4;
    use ir::ggml::grids::{
        IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    };
    use ir::ggml::{e8m0_to_f32_half, f16_to_f32, KVALUES_IQ4NL};

    /// Bytes of a `block_q6_K`: `ql[128]`, `qh[64]`, `scales[16]` (i8), f16 `d`.
    const Q6_K_BYTES: usize = 128 + 64 + 16 + 2;

    /// `ggml_vec_dot_q6_K_q8_K` (AVX2). Per super-block, 8 i32 lanes: lane `j` sums, over
    /// the eight 32-value vectors, `scale[v/16] · q6[v] · q8[v]` for the values `v` at bytes
    /// `4j..4j+4` of the vector (`q6` unsigned, 0..63), minus `32 · (bsums[2j]·scale[2j] +
    /// bsums[2j+1]·scale[2j+1])` (the `-32` offset, folded through the activation sums);
    /// then `acc = fma(d_x·d_y, f32(lane), acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q6_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        q6_k_rows::<1, false>(&[w], a)[0]
    }

    /// [`q6_k_q8_k`] of four rows with one activation row (decode): the activation's
    /// vectors loaded once for the four rows, four sums in flight.
    ///
    /// # Safety
    /// As [`q6_k_q8_k`], for each row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k_q8_k_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        q6_k_rows::<4, false>(w, a)
    }

    /// [`q6_k_q8_k_4rows`] in fewer instructions, on AVX-512 VL and VNNI (the decode routine
    /// is bound by how many the core issues): each 6-bit value by one `vpternlogd` from its
    /// nibble and its two high bits, and the scale products added by `vpdpwssd`. The same
    /// lanes, so the same numbers.
    ///
    /// # Safety
    /// As [`q6_k_q8_k`], for each row; the host has AVX-512 F, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q6_k_q8_k_4rows_vnni(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        q6_k_rows::<4, true>(w, a)
    }

    /// The `vpshufb` controls that spread i16 scales `2v` and `2v + 1` of a 128-bit lane of
    /// eight over lanes 0..8 and 8..16 (bytes of word `2v` in the low half, of word `2v + 1`
    /// in the high half), for `v` in 0..4.
    const Q6_K_SPREAD: [[u8; 32]; 4] = {
        let mut t = [[0u8; 32]; 4];
        let mut v = 0;
        while v < 4 {
            let mut i = 0;
            while i < 32 {
                t[v][i] = (4 * v + 2 * (i / 16) + i % 2) as u8;
                i += 1;
            }
            v += 1;
        }
        t
    };

    /// [`q6_k_q8_k`] for `R` rows; with `VNNI`, in AVX-512 VL / VNNI instructions.
    ///
    /// # Safety
    /// As [`q6_k_q8_k`], for each row (inlined into such a `target_feature` caller; with
    /// `VNNI`, one with AVX-512 F, VL and VNNI).
    #[inline(always)]
    unsafe fn q6_k_rows<const R: usize, const VNNI: bool>(w: &[&[u8]; R], a: &[u8]) -> [f32; R] {
        let nb = w
            .iter()
            .fold(a.len() / Q8_K_BYTES, |n, r| n.min(r.len() / Q6_K_BYTES));
        let low4 = _mm256_set1_epi8(0x0f);
        let spread: [__m256i; 4] = std::array::from_fn(|v| load32(Q6_K_SPREAD[v].as_ptr()));
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let dy = f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)]);
            let q8 = y.add(4);
            let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
            for (r, accr) in acc.iter_mut().enumerate() {
                let x = w[r].as_ptr().add(b * Q6_K_BYTES);
                let (ql, qh, sc) = (x, x.add(128), x.add(192));
                let d = dy * f16_at(x.add(208));
                // The sixteen scales as i16: 0..8 in the low lane, 8..16 in the high one.
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
                // 32 · Σ bsum · scale per pair of 16-value groups, lane j = groups 2j, 2j+1.
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
                // Each half's eight scales in both lanes, for `spread`.
                let sc_half = [
                    _mm256_permute4x64_epi64::<0x44>(sc16),
                    _mm256_permute4x64_epi64::<0xEE>(sc16),
                ];
                let mut sumi = _mm256_setzero_si256();
                for (half, &scales) in sc_half.iter().enumerate() {
                    let l0 = _mm256_loadu_si256(ql.add(64 * half) as *const __m256i);
                    let l1 = _mm256_loadu_si256(ql.add(64 * half + 32) as *const __m256i);
                    let h = _mm256_loadu_si256(qh.add(32 * half) as *const __m256i);
                    // The four 32-value vectors of this half: low/high nibbles of ql, 2 bits
                    // of qh (bits `2v..2v + 2` of each byte, moved to bits 4..5).
                    let q = if VNNI {
                        let m = _mm256_set1_epi8(0x30);
                        let hi = [
                            _mm256_and_si256(_mm256_slli_epi16::<4>(h), m),
                            _mm256_and_si256(_mm256_slli_epi16::<2>(h), m),
                            _mm256_and_si256(h, m),
                            _mm256_and_si256(_mm256_srli_epi16::<2>(h), m),
                        ];
                        // (nibble & 0x0f) | hi: truth table 0xEC of (a, b, c) = (a & c) | b.
                        let six = |l: __m256i, hi: __m256i| {
                            _mm256_ternarylogic_epi32::<0xEC>(l, hi, low4)
                        };
                        [
                            six(l0, hi[0]),
                            six(l1, hi[1]),
                            six(_mm256_srli_epi16::<4>(l0), hi[2]),
                            six(_mm256_srli_epi16::<4>(l1), hi[3]),
                        ]
                    } else {
                        let hi = |shift: i32| -> __m256i {
                            // (qh >> shift) & 3, moved to bits 4..5.
                            let m = _mm256_and_si256(
                                _mm256_srlv_epi32(h, _mm256_set1_epi32(shift)),
                                _mm256_set1_epi8(3),
                            );
                            _mm256_slli_epi16(m, 4)
                        };
                        [
                            _mm256_or_si256(_mm256_and_si256(l0, low4), hi(0)),
                            _mm256_or_si256(_mm256_and_si256(l1, low4), hi(2)),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                hi(4),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                hi(6),
                            ),
                        ]
                    };
                    for (v, qv) in q.iter().enumerate() {
                        let y8 = _mm256_loadu_si256(q8.add(128 * half + 32 * v) as *const __m256i);
                        let p16 = _mm256_maddubs_epi16(*qv, y8);
                        // Scales 8·half + 2v and 8·half + 2v + 1 (the vector's two 16-value
                        // groups), 8 × i16 each: one shuffle.
                        let s = _mm256_shuffle_epi8(scales, spread[v]);
                        sumi = if VNNI {
                            _mm256_dpwssd_epi32(sumi, s, p16)
                        } else {
                            _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p16))
                        };
                    }
                }
                sumi = _mm256_sub_epi32(sumi, offset);
                *accr = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *accr);
            }
        }
        let mut out = [0f32; R];
        for (o, v) in out.iter_mut().zip(acc) {
            *o = hsum(v);
        }
        out
    }

    // ---- Shared pieces -----------------------------------------------------------------
    //
    // The helpers below are `#[inline(always)]` and only called from the `#[target_feature]`
    // routines of this module, into which they are inlined (so their intrinsics are compiled
    // with AVX2, FMA and F16C on).

    /// Bytes of a `block_q8_0`: f16 `d`, 32 × i8 `qs`.
    const Q8_0_BYTES: usize = 2 + 32;
    /// Bytes of a `block_q8_1`: f16 `d`, f16 `s` (`d · Σ qs`), 32 × i8 `qs`.
    const Q8_1_BYTES: usize = 2 + 2 + 32;
    /// Bytes of a `block_q5_0`: f16 `d`, `qh[4]`, `qs[16]`.
    const Q5_0_BYTES: usize = 2 + 4 + 16;
    /// Bytes of a `block_q4_1`: f16 `d`, f16 `m`, `qs[16]`.
    const Q4_1_BYTES: usize = 2 + 2 + 16;
    /// Bytes of a `block_q5_1`: f16 `d`, f16 `m`, `qh[4]`, `qs[16]`.
    const Q5_1_BYTES: usize = 2 + 2 + 4 + 16;
    /// Bytes of a `block_iq4_nl`: f16 `d`, `qs[16]`.
    const IQ4_NL_BYTES: usize = 2 + 16;
    /// Bytes of a `block_q2_K`: `scales[16]`, `qs[64]`, f16 `d`, f16 `dmin`.
    const Q2_K_BYTES: usize = 16 + 64 + 2 + 2;
    /// Bytes of a `block_q3_K`: `hmask[32]`, `qs[64]`, `scales[12]`, f16 `d`.
    const Q3_K_BYTES: usize = 32 + 64 + 12 + 2;
    /// Bytes of a `block_q4_K`: f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]`.
    const Q4_K_BYTES: usize = 2 + 2 + 12 + 128;
    /// Bytes of a `block_q5_K`: f16 `d`, f16 `dmin`, `scales[12]`, `qh[32]`, `qs[128]`.
    const Q5_K_BYTES: usize = 2 + 2 + 12 + 32 + 128;
    /// Bytes of a `block_iq4_xs`: f16 `d`, u16 `scales_h`, `scales_l[4]`, `qs[128]`.
    const IQ4_XS_BYTES: usize = 2 + 2 + 4 + 128;

    /// 32 bytes at `p`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 32 bytes of reads.
    #[inline(always)]
    unsafe fn load32(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }

    /// The f16 at `p` as f32 (exact; F16C).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 2 bytes of reads.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = i16_at(p) as u16;
        _mm_cvtss_f32(_mm_cvtph_ps(opaque128(_mm_cvtsi32_si128(bits as i32))))
    }

    /// `v` unchanged, through an empty `asm!` that LLVM cannot see into. Used on the input
    /// of `vcvtph2ps` where it is built from scalars: LLVM otherwise tends to build it with
    /// `vpinsrw` into whichever register is free (often an accumulator), which puts the
    /// conversion on the loop's dependency chain (the 256-bit Q8_0 decode kernel ran at half
    /// its speed so); this keeps a zeroing `vmovd`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::handwritten) fn opaque128(mut v: __m128i) -> __m128i {
        // SAFETY: the template is empty; the register is passed through unchanged.
        unsafe {
            std::arch::asm!("/* {0} */", inout(xmm_reg) v, options(pure, nomem, nostack, preserves_flags));
        }
        v
    }

    /// The 16 bits at `p` (an f16's), as an i16.
    ///
    /// # Safety
    /// `p` valid for 2 bytes of reads.
    #[inline(always)]
    unsafe fn i16_at(p: *const u8) -> i16 {
        std::ptr::read_unaligned(p as *const i16)
    }

    /// The product of the f16 values at `p` and `q` (both exact as f32; the product of two
    /// f16 values is exact in f32, so the order of the factors does not matter).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// and `q` valid for 2 bytes of reads each.
    #[inline(always)]
    unsafe fn f16x2_product(p: *const u8, q: *const u8) -> f32 {
        let a = std::ptr::read_unaligned(p as *const u16) as u32;
        let b = std::ptr::read_unaligned(q as *const u16) as u32;
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128((a | (b << 16)) as i32));
        _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
    }

    /// The products of the f16 values at `x1` and `y1` (lane 0) and at `x2` and `y2` (lane
    /// 2): the scales of two blocks, converted at once. (Products of two f16 values are
    /// exact in f32, in either order.)
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); each
    /// pointer valid for 2 bytes of reads.
    #[inline(always)]
    unsafe fn f16_products(x1: *const u8, y1: *const u8, x2: *const u8, y2: *const u8) -> __m128 {
        let h = |p: *const u8| std::ptr::read_unaligned(p as *const u16) as u64;
        let bits = h(x1) | h(y1) << 16 | h(x2) << 32 | h(y2) << 48;
        let v = _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64));
        _mm_mul_ps(v, _mm_movehdup_ps(v))
    }

    /// The two f16 values of the 4 bytes at `p` (a super-block's `d` and `dmin`) as f32.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 4 bytes of reads.
    #[inline(always)]
    unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(p) as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// The four f16 values of the 4 bytes at `p` then the 4 bytes at `q`, as f32 lanes 0..4.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// and `q` valid for 4 bytes of reads each.
    #[inline(always)]
    unsafe fn f16x4(p: *const u8, q: *const u8) -> __m128 {
        let a = std::ptr::read_unaligned(p as *const u32) as u64;
        let b = std::ptr::read_unaligned(q as *const u32) as u64;
        _mm_cvtph_ps(_mm_cvtsi64_si128((a | (b << 32)) as i64))
    }

    /// The f16 values at `p[0..4]` as f32 lanes 0..4.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); each
    /// pointer valid for 2 bytes of reads.
    #[inline(always)]
    unsafe fn f16x4_scattered(p: [*const u8; 4]) -> __m128 {
        let h = |i: usize| std::ptr::read_unaligned(p[i] as *const u16) as u64;
        let bits = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
        _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
    }

    /// The f32 at `p` (little-endian, as x86 stores it).
    ///
    /// # Safety
    /// `p` valid for 4 bytes of reads.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn f32_at(p: *const u8) -> f32 {
        std::ptr::read_unaligned(p as *const f32)
    }

    /// The u32 at `p`.
    ///
    /// # Safety
    /// `p` valid for 4 bytes of reads.
    #[inline(always)]
    unsafe fn u32_at(p: *const u8) -> u32 {
        std::ptr::read_unaligned(p as *const u32)
    }

    /// The 32 nibbles of the 16 bytes at `p`, as ggml lays them out for a 32-value block:
    /// low nibbles in bytes 0..16, high nibbles in bytes 16..32.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 16 bytes of reads.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn nibbles32(p: *const u8) -> __m256i {
        // The 16 bytes in both halves (one load), the high half shifted down by 4 bits.
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
        _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
    }

    /// Byte `j` = `0xFF` where bit `j` of `bits` is set, else 0.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn bytes_from_bits(bits: u32) -> __m256i {
        // Byte j takes byte j / 8 of `bits`, then tests bit j % 8 of it.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
    }

    /// ggml's `mul_add_epi8`: the signed × signed byte products of `x` and `y` as
    /// `maddubs(sign(x, x), sign(y, x))`, neighbours added into 16 i16 lanes. (The sign trick
    /// is kept as ggml has it: `y = -128` against a negative `x` stays `-128`.)
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn maddubs_signed(x: __m256i, y: __m256i) -> __m256i {
        _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
    }

    /// The i16 lanes `p` added in pairs into 8 i32 lanes.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn pairs(p: __m256i) -> __m256i {
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// How a routine forms the eight i32 lanes of 32 unsigned × signed byte products, lane
    /// `l` the sum of the products `4l..4l + 4`: the same integers either way wherever no
    /// i16 pair of AVX2's `maddubs` saturates — which holds for every caller here (4- and
    /// 5-bit unsigned weights; the sign trick's `|x| ≤ 128` times `-128..=127`, whose pairs
    /// stay within `-32768..=32512`).
    pub(in crate::handwritten) trait Lanes {
        /// Whether [`Lanes::lanes_from`] adds to a start in the same instruction, so that
        /// signed × signed products can be formed as `(x + 128)·y` from a start of
        /// `-128·Σy` (one instruction a pair, where the sign trick takes two).
        const OFFSET: bool;

        /// The lanes of `u` (unsigned bytes) times `s` (signed bytes).
        ///
        /// # Safety
        /// Only from a routine compiled with the implementation's features.
        unsafe fn lanes(u: __m256i, s: __m256i) -> __m256i;

        /// `start` plus [`Lanes::lanes`] of `u` and `s`.
        ///
        /// # Safety
        /// As [`Lanes::lanes`].
        unsafe fn lanes_from(start: __m256i, u: __m256i, s: __m256i) -> __m256i;
    }

    /// ggml's instructions: `maddubs` into i16 pairs, then `madd` by ones.
    pub(in crate::handwritten) struct Avx2;

    impl Lanes for Avx2 {
        const OFFSET: bool = false;

        #[inline(always)]
        unsafe fn lanes(u: __m256i, s: __m256i) -> __m256i {
            pairs(_mm256_maddubs_epi16(u, s))
        }

        #[inline(always)]
        unsafe fn lanes_from(start: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_add_epi32(start, Self::lanes(u, s))
        }
    }

    /// AVX-512 VNNI on 256-bit vectors: `vpdpbusd` sums the four products of each lane in
    /// one instruction ([`super::super::has_vnni`]).
    pub(in crate::handwritten) struct Vnni;

    impl Lanes for Vnni {
        const OFFSET: bool = true;

        #[inline(always)]
        unsafe fn lanes(u: __m256i, s: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
        }

        #[inline(always)]
        unsafe fn lanes_from(start: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(start, u, s)
        }
    }

    /// `acc = fma(d, f32(lanes), acc)`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn fma_lanes(d: f32, lanes: __m256i, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)
    }

    /// ggml's `hsum_float_8` of the eight lanes.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn hsum(acc: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        hsum8(&lanes)
    }

    /// From `scales` (eight i16 scales, the same in both 128-bit halves): scale `2i` in i16
    /// lanes 0..8 (the products of values 0..16 of a 32-value vector) and scale `2i + 1` in
    /// lanes 8..16 (values 16..32); ggml's `get_scale_shuffle_q3k(i)` shuffle.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn scale_pair(scales: __m256i, i: i32) -> __m256i {
        let lo = (4 * i) | ((4 * i + 1) << 8);
        let hi = (4 * i + 2) | ((4 * i + 3) << 8);
        let shuf = _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16));
        _mm256_shuffle_epi8(scales, shuf)
    }

    /// The eight i32 lanes of a Q2_K / Q3_K super-block: `Σ madd(scale pair, p16(half, k))`
    /// over its two 128-value halves and their four 32-value vectors, `p16(half, k)` the
    /// i16 products of vector `4 half + k` and `all` the sixteen i16 scales (scale `j` in
    /// lane `j`). Integer sums: exact in any order.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn k16_lanes(all: __m256i, p16: impl Fn(usize, usize) -> __m256i) -> __m256i {
        let halves = [
            _mm256_permute2x128_si256::<0x00>(all, all),
            _mm256_permute2x128_si256::<0x11>(all, all),
        ];
        let mut sumi = _mm256_setzero_si256();
        for (half, &scales) in halves.iter().enumerate() {
            let mut p = [_mm256_setzero_si256(); 4];
            for (k, pk) in p.iter_mut().enumerate() {
                *pk = _mm256_madd_epi16(scale_pair(scales, k as i32), p16(half, k));
            }
            let s01 = _mm256_add_epi32(p[0], p[1]);
            let s23 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(s01, s23));
        }
        sumi
    }

    /// Every i16 lane = lane `i` of `scales` (eight i16 scales, the same in both halves);
    /// ggml's `get_scale_shuffle_k4(i)` shuffle.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn scale_one(scales: __m256i, i: i32) -> __m256i {
        let pick = (2 * i) | ((2 * i + 1) << 8);
        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pick as i16))
    }

    /// The IQ4_NL table in both 128-bit halves (for `_mm256_shuffle_epi8`).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn iq4_table() -> __m256i {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        _mm256_set_m128i(t, t)
    }

    // ---- Q5_0, Q5_1, IQ4_NL (32-value blocks) ------------------------------------------

    /// `ggml_vec_dot_q5_0_q8_0` (AVX2). Per block: the 5-bit values as signed bytes
    /// (`nibble | 0xF0` where the fifth bit is clear, i.e. `q - 16`), times the Q8_0 bytes by
    /// the sign trick, i16 pairs added into 8 i32 lanes (lane `l`: values `4l..4l+4`);
    /// `acc = fma(d_x·d_y, f32(lanes), acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q5_0 blocks, `a` as many Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q5_0_BYTES).min(a.len() / Q8_0_BYTES);
        let high = _mm256_set1_epi8(0xf0u8 as i8);
        let lanes = |x: *const u8, y: *const u8| {
            let set = bytes_from_bits(u32_at(x.add(2)));
            let qx = _mm256_or_si256(nibbles32(x.add(6)), _mm256_andnot_si256(set, high));
            _mm256_cvtepi32_ps(pairs(maddubs_signed(qx, load32(y.add(2)))))
        };
        let mut acc = _mm256_setzero_ps();
        let mut b = 0;
        // Two blocks a step (their four f16 scales converted at once), added in block order.
        while b + 1 < nb {
            let x1 = w.as_ptr().add(b * Q5_0_BYTES);
            let y1 = a.as_ptr().add(b * Q8_0_BYTES);
            let (x2, y2) = (x1.add(Q5_0_BYTES), y1.add(Q8_0_BYTES));
            let d = f16_products(x1, y1, x2, y2);
            let (l1, l2) = (lanes(x1, y1), lanes(x2, y2));
            acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), l1, acc);
            acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehl_ps(d, d)), l2, acc);
            b += 2;
        }
        if b < nb {
            let x = w.as_ptr().add(b * Q5_0_BYTES);
            let y = a.as_ptr().add(b * Q8_0_BYTES);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16x2_product(x, y)), lanes(x, y), acc);
        }
        hsum(acc)
    }

    /// `ggml_vec_dot_q5_1_q8_1` (AVX2). Per block: the unsigned 5-bit values times the Q8_1
    /// bytes (`maddubs`), pairs into 8 i32 lanes; `acc = fma(f32(lanes), d_x·d_y, acc)`;
    /// a scalar `summs += m_x · s_y` (a product of two f16 values: exact); the result is
    /// `hsum_float_8(acc) + summs`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q5_1 blocks, `a` as many Q8_1 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q5_1_BYTES).min(a.len() / Q8_1_BYTES);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q5_1_BYTES);
            let y = a.as_ptr().add(b * Q8_1_BYTES);
            // [d_x, m_x, d_y, s_y] → lane 0: d_x·d_y, lane 1: m_x·s_y.
            let v = f16x4(x, y);
            let p = _mm_mul_ps(v, _mm_movehl_ps(v, v));
            summs += _mm_cvtss_f32(_mm_movehdup_ps(p));
            let d = _mm_cvtss_f32(p);
            let lanes = pairs(_mm256_maddubs_epi16(q5_1_quants(x), load32(y.add(4))));
            acc = fma_lanes(d, lanes, acc);
        }
        hsum(acc) + summs
    }

    /// [`q5_0_q8_0`] for four activation rows: each block's signed 5-bit values are built
    /// once; every column keeps its own eight lanes and `hsum_float_8`, as the one-column
    /// routine.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q5_0 blocks, each `a[c]` as many Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_q8_0_x4(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
        let nb = a
            .iter()
            .fold(w.len() / Q5_0_BYTES, |n, r| n.min(r.len() / Q8_0_BYTES));
        let high = _mm256_set1_epi8(0xf0u8 as i8);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q5_0_BYTES);
            let set = bytes_from_bits(u32_at(x.add(2)));
            let qx = _mm256_or_si256(nibbles32(x.add(6)), _mm256_andnot_si256(set, high));
            let ax = _mm256_sign_epi8(qx, qx);
            let y: [*const u8; 4] = std::array::from_fn(|c| a[c].as_ptr().add(b * Q8_0_BYTES));
            // The four columns' d_x·d_y at once (products of two f16 values: exact in f32,
            // as `f16x2_product` computes them).
            let dy = f16x4_scattered(y);
            let d = _mm256_castps128_ps256(_mm_mul_ps(_mm_set1_ps(f16_at(x)), dy));
            for c in 0..4 {
                let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(load32(y[c].add(2)), qx));
                let dc = _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(c as i32));
                acc[c] = _mm256_fmadd_ps(dc, _mm256_cvtepi32_ps(pairs(p)), acc[c]);
            }
        }
        [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
    }

    /// A tile of `R` weight rows × `C` activation rows of a 32-value block type with an f16
    /// `d` first and signed quants that `quants(block)` builds (`block_bytes` per block),
    /// times Q8_0, in `ggml_vec_dot_<type>_q8_0`'s order (Q5_0's and Q8_0's, which
    /// llamafile's tinyBLAS shares): per block and output `acc = fma(d_x·d_y, f32(lanes),
    /// acc)`, lane `l` the sum of products `4l..4l + 4` through the sign trick; then
    /// `hsum_float_8`. `out[c][r]`. Each block's quants are built once per row, each
    /// activation block loaded once per tile.
    ///
    /// With `exact_products` (Q8_0) and a [`Lanes`] with [`Lanes::OFFSET`], the lanes are
    /// the plain sums of products `x·y` instead: the sign trick's whenever no activation
    /// byte is `-128` with a negative weight byte beside it, which ggml's quantizer never
    /// writes (its Q8_0 bytes are `-127..=127`); `ir::ggml`'s Q8_0 reference multiplies
    /// exactly too.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into a `target_feature` caller); whole rows of equal
    /// block counts.
    #[inline(always)]
    unsafe fn tile32<L: Lanes, const R: usize, const C: usize>(
        w: &[&[u8]; R],
        a: &[&[u8]; C],
        block_bytes: usize,
        exact_products: bool,
        quants: impl Fn(*const u8) -> __m256i,
    ) -> [[f32; R]; C] {
        const { assert!(R <= 8, "one vector of row scales") };
        let offset = exact_products && L::OFFSET;
        let rows = w
            .iter()
            .fold(usize::MAX, |n, r| n.min(r.len() / block_bytes));
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / Q8_0_BYTES));
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        for b in 0..nb {
            // `ux`: |x| for the sign trick, or x + 128 (unsigned) for the offset form.
            let mut qx = [_mm256_setzero_si256(); R];
            let mut ux = [_mm256_setzero_si256(); R];
            let mut dx = [0f32; 8];
            for r in 0..R {
                let x = w[r].as_ptr().add(b * block_bytes);
                qx[r] = quants(x);
                ux[r] = if offset {
                    _mm256_xor_si256(qx[r], bias)
                } else {
                    _mm256_sign_epi8(qx[r], qx[r])
                };
                dx[r] = f16_at(x);
            }
            // Every d_x·d_y of the tile, stored and read back as broadcasts from memory (a
            // load, which AVX-512 folds into the fused multiply-add, off the vector ALU
            // ports the products need). Products of two f16 values are exact in f32, as
            // `f16x2_product` computes them.
            let mut d = [[0f32; 8]; C];
            let dxv = _mm256_loadu_ps(dx.as_ptr());
            for (c, dc) in d.iter_mut().enumerate() {
                let y = a[c].as_ptr().add(b * Q8_0_BYTES);
                _mm256_storeu_ps(
                    dc.as_mut_ptr(),
                    _mm256_mul_ps(dxv, _mm256_set1_ps(f16_at(y))),
                );
            }
            let d = std::hint::black_box(&d);
            for c in 0..C {
                let y = a[c].as_ptr().add(b * Q8_0_BYTES);
                let qy = load32(y.add(2));
                // The offset form starts each lane at -128·Σy of its four activations.
                let start = if offset {
                    _mm256_sub_epi32(_mm256_setzero_si256(), L::lanes(bias, qy))
                } else {
                    _mm256_setzero_si256()
                };
                for r in 0..R {
                    let p = if offset {
                        L::lanes_from(start, ux[r], qy)
                    } else {
                        L::lanes(ux[r], _mm256_sign_epi8(qy, qx[r]))
                    };
                    let dcr = _mm256_broadcast_ss(&d[c][r]);
                    acc[c][r] = _mm256_fmadd_ps(dcr, _mm256_cvtepi32_ps(p), acc[c][r]);
                }
            }
        }
        let mut out = [[0f32; R]; C];
        for c in 0..C {
            for r in 0..R {
                out[c][r] = hsum(acc[c][r]);
            }
        }
        out
    }

    /// How [`tile32x8`] forms the signed products of a weight block with a Q8_0 block.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Products {
        /// `(x + 128)·y` from a start of `-128·Σy` ([`tile32`]'s offset form: Q8_0).
        Offset,
        /// ggml's sign trick, `|x| · (y · sign(x))`, wrapping as `_mm256_sign_epi8` does.
        Sign,
        /// Unsigned weight quants times the activations as they are, plus `m_x · s_y` per
        /// block ([`tile32_min`]'s form: Q5_1 with Q8_1).
        Unsigned,
        /// [`Products::Unsigned`] with `d_y` folded into the lanes' conversion (Q4_1 with
        /// Q8_1, whose lane sums are small enough: [`tile32x8`]).
        UnsignedFolded,
    }

    /// `1.5 · 2^23` as f32 bits: an i32 lane started here and given a sum `s` with
    /// `|s| < 2^22` reads as the f32 `1.5 · 2^23 + s`, exactly.
    const MAGIC_BITS: i32 = 0x4B40_0000;
    /// [`MAGIC_BITS`] as a value.
    const MAGIC: f32 = 12_582_912.0;

    /// Bytes [`pack8`] writes per block: for each of the four column pairs, the two
    /// columns' 32 quants side by side (64), the lanes' start (16 × i32: `-128·Σy` of each
    /// lane's four activations for [`Products::Offset`]; `-MAGIC · d` of the lane's column
    /// as f32 for [`Products::UnsignedFolded`]; else 0) and the two columns' `d` in eight
    /// f32 lanes each (64); then the eight columns' `s` (Q8_1; 8 × f32).
    pub(in crate::handwritten) const PANEL_BLOCK_BYTES: usize = 4 * 192 + 32;

    /// Packs eight Q8_0 (`products` Offset or Sign) or Q8_1 (Unsigned) activation rows of
    /// `nb` blocks for [`tile32x8`] into `out` (`nb · PANEL_BLOCK_BYTES` bytes): the work each
    /// 4-row tile would otherwise redo per column pair (joining the pair's quants,
    /// converting and spreading their `d`, the offset form's start) done once per chunk of
    /// tokens.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 F/VL/BW/VNNI; rows of at least `nb` blocks; `out` writable
    /// for `nb · PANEL_BLOCK_BYTES` bytes.
    #[inline(always)]
    unsafe fn pack8(a: &[&[u8]; 8], nb: usize, products: Products, out: *mut u8) {
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        let zero = _mm512_setzero_si512();
        let (act_bytes, qs) = match products {
            Products::Unsigned | Products::UnsignedFolded => (Q8_1_BYTES, 4),
            _ => (Q8_0_BYTES, 2),
        };
        for b in 0..nb {
            let ob = out.add(b * PANEL_BLOCK_BYTES);
            for p in 0..4 {
                let y0 = a[2 * p].as_ptr().add(b * act_bytes);
                let y1 = a[2 * p + 1].as_ptr().add(b * act_bytes);
                let o = ob.add(p * 192);
                let qy = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(load32(y0.add(qs))),
                    load32(y1.add(qs)),
                );
                let dy = _mm512_mask_blend_ps(
                    0xff00,
                    _mm512_set1_ps(f16_at(y0)),
                    _mm512_set1_ps(f16_at(y1)),
                );
                let start = match products {
                    Products::Offset => _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, qy)),
                    // Exact: MAGIC is 3 · 2^22 and d an f16 value.
                    Products::UnsignedFolded => {
                        _mm512_castps_si512(_mm512_mul_ps(dy, _mm512_set1_ps(-MAGIC)))
                    }
                    _ => zero,
                };
                _mm512_storeu_si512(o as *mut __m512i, qy);
                _mm512_storeu_si512(o.add(64) as *mut __m512i, start);
                _mm512_storeu_ps(o.add(128) as *mut f32, dy);
            }
            let sy = ob.add(4 * 192) as *mut f32;
            for (c, row) in a.iter().enumerate() {
                *sy.add(c) = match products {
                    Products::Unsigned | Products::UnsignedFolded => {
                        f16_at(row.as_ptr().add(b * act_bytes + 2))
                    }
                    _ => 0.0,
                };
            }
        }
    }

    /// [`tile32`] as 4 weight rows × 8 activation rows on AVX-512, the activations packed by
    /// [`pack8`]: each 512-bit register holds two columns, eight lanes each, so every
    /// `vpdpbusd`, conversion and fused multiply-add serves two outputs while each keeps its
    /// own eight lanes in ggml's order (the products are `tile32`'s, bit for bit). The
    /// weight block is built once per row in both halves (`quants`); the four rows' f16
    /// scales are converted at once and read back as memory broadcasts; d_x·d_y comes from
    /// one multiply per row and column pair (products of two f16 values: exact in f32).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 F/VL/BW/VNNI (inlined into such a `target_feature` caller);
    /// whole rows of `nb` blocks; `panel` packed from `nb` blocks with `offset` equal to
    /// `products == Products::Offset`.
    #[inline(always)]
    unsafe fn tile32x8(
        w: &[&[u8]; 4],
        panel: *const u8,
        nb: usize,
        block_bytes: usize,
        products: Products,
        quants: impl Fn(*const u8) -> __m512i,
    ) -> [[f32; 4]; 8] {
        // acc[p][r]: row r with columns 2p (lanes 0..8) and 2p + 1 (lanes 8..16).
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        // summs[r]: row r's Σ m_x·s_y for the eight columns (Unsigned only).
        let mut summs = [_mm256_setzero_ps(); 4];
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        let zero = _mm512_setzero_si512();
        let unsigned = matches!(products, Products::Unsigned | Products::UnsignedFolded);
        let magic = _mm512_set1_epi32(MAGIC_BITS);
        for b in 0..nb {
            let mut ux = [zero; 4];
            let mut neg: [__mmask64; 4] = [0; 4];
            let pb = panel.add(b * PANEL_BLOCK_BYTES);
            let x: [*const u8; 4] = std::array::from_fn(|r| w[r].as_ptr().add(b * block_bytes));
            // Q4_1 / Q5_1: the four rows' f16 pairs [d_0, m_0, d_1, m_1, …] converted at
            // once and stored, read back as broadcasts from memory (loads, off the vector ALU
            // ports the products need). The other types convert each row's d on its own,
            // which measured faster there (their tile spills accumulators otherwise).
            let mut dm_buf = [0f32; 8];
            let dm = if unsigned {
                let raw = _mm_setr_epi32(
                    u32_at(x[0]) as i32,
                    u32_at(x[1]) as i32,
                    u32_at(x[2]) as i32,
                    u32_at(x[3]) as i32,
                );
                _mm256_storeu_ps(dm_buf.as_mut_ptr(), _mm256_cvtph_ps(raw));
                std::hint::black_box(&dm_buf)
            } else {
                // Never read: the other types' `dx` come from `f16_at`.
                &dm_buf
            };
            let dx: [__m512; 4] = std::array::from_fn(|r| {
                _mm512_set1_ps(if unsigned { dm[2 * r] } else { f16_at(x[r]) })
            });
            for r in 0..4 {
                let q = quants(x[r]);
                match products {
                    Products::Offset => ux[r] = _mm512_xor_si512(q, bias),
                    Products::Sign => {
                        ux[r] = _mm512_abs_epi8(q);
                        neg[r] = _mm512_movepi8_mask(q);
                    }
                    Products::Unsigned | Products::UnsignedFolded => {
                        ux[r] = q;
                        // m_x·s_y of the eight columns: products of two f16 values, exact
                        // in f32, so the fused multiply-add rounds as ggml's add does.
                        let sy = _mm256_loadu_ps(pb.add(4 * 192) as *const f32);
                        summs[r] = _mm256_fmadd_ps(sy, _mm256_set1_ps(dm[2 * r + 1]), summs[r]);
                    }
                }
            }
            for (p, accp) in acc.iter_mut().enumerate() {
                let o = pb.add(p * 192);
                let qy = _mm512_loadu_si512(o as *const __m512i);
                let dy = _mm512_loadu_ps(o.add(128) as *const f32);
                if products == Products::UnsignedFolded {
                    // Each lane's sum s has |s| ≤ 4 · 15 · 128 < 2^13, so d_y·s (an f16
                    // value times s) is exact in f32: g = fma(MAGIC + s, d_y, -MAGIC·d_y)
                    // is d_y·s, and fma(d_x, g, acc) rounds d_x·d_y·s + acc once, as
                    // fma(d_x·d_y, s, acc) does (d_x·d_y is exact too). Two fused
                    // multiply-adds in place of a conversion, a multiply and one.
                    let neg_magic_dy = _mm512_loadu_ps(o.add(64) as *const f32);
                    for (r, accr) in accp.iter_mut().enumerate() {
                        let lanes = _mm512_dpbusd_epi32(magic, ux[r], qy);
                        let g = _mm512_fmadd_ps(_mm512_castsi512_ps(lanes), dy, neg_magic_dy);
                        fmadd_broadcast(accr, g, dm.as_ptr().add(2 * r));
                    }
                    continue;
                }
                for (r, accr) in accp.iter_mut().enumerate() {
                    let start = _mm512_loadu_si512(o.add(64) as *const __m512i);
                    let lanes = match products {
                        Products::Offset => _mm512_dpbusd_epi32(start, ux[r], qy),
                        Products::Sign => _mm512_dpbusd_epi32(
                            start,
                            ux[r],
                            _mm512_mask_sub_epi8(qy, neg[r], zero, qy),
                        ),
                        _ => _mm512_dpbusd_epi32(zero, ux[r], qy),
                    };
                    let d = _mm512_mul_ps(dy, dx[r]);
                    *accr = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), *accr);
                }
            }
        }
        let mut out = [[0f32; 4]; 8];
        for (p, accp) in acc.iter().enumerate() {
            for (r, accr) in accp.iter().enumerate() {
                let [lo, hi] = halves(*accr);
                out[2 * p][r] = hsum(lo);
                out[2 * p + 1][r] = hsum(hi);
            }
        }
        if unsigned {
            for (r, sr) in summs.iter().enumerate() {
                let mut m = [0f32; 8];
                _mm256_storeu_ps(m.as_mut_ptr(), *sr);
                for (c, oc) in out.iter_mut().enumerate() {
                    oc[r] += m[c];
                }
            }
        }
        out
    }

    /// `acc = fma(g, *s, acc)`, `*s` a broadcast memory operand: one instruction whose
    /// load LLVM cannot hoist into a register of its own (the 4 × 8 tile has none to
    /// spare: its accumulators spill otherwise).
    ///
    /// # Safety
    /// AVX-512 F; `s` valid for reading an f32.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn fmadd_broadcast(acc: &mut __m512, g: __m512, s: *const f32) {
        std::arch::asm!(
            "vfmadd231ps {acc}, {g}, dword ptr [{s}]{{1to16}}",
            acc = inout(zmm_reg) *acc,
            g = in(zmm_reg) g,
            s = in(reg) s,
            options(pure, readonly, nostack, preserves_flags),
        );
    }

    /// A 32-value block's quants (256 bits) in both halves of a 512-bit register.
    ///
    /// # Safety
    /// AVX-512 F (inlined into such a `target_feature` caller).
    #[inline(always)]
    unsafe fn both_halves(q: __m256i) -> __m512i {
        _mm512_broadcast_i64x4(q)
    }

    /// [`nibbles32`] in both halves of a 512-bit register: the 16 bytes at `p` broadcast
    /// by the load, one shift and one mask.
    ///
    /// # Safety
    /// AVX-512 F (inlined into such a `target_feature` caller); `p` valid for 16 bytes.
    #[inline(always)]
    unsafe fn nibbles32x2(p: *const u8) -> __m512i {
        let all = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
        let shifted = _mm512_srlv_epi64(all, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
        _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f))
    }

    /// The packing and the 4 × 8 tile routines of one weight format ([`pack8`],
    /// [`tile32x8`]) with the features they need.
    macro_rules! packed8 {
        ($pack:ident, $tile:ident, $bytes:expr, $products:expr, |$x:ident| $quants:expr) => {
            /// [`pack8`] for this format.
            ///
            /// # Safety
            /// As [`pack8`] (the host has AVX-512 F/VL/BW/VNNI).
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
            pub(super) unsafe fn $pack(a: &[&[u8]; 8], nb: usize, out: *mut u8) {
                pack8(a, nb, $products, out)
            }

            /// [`tile32x8`] for this format.
            ///
            /// # Safety
            /// As [`tile32x8`].
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
            pub(super) unsafe fn $tile(
                w: &[&[u8]; 4],
                panel: *const u8,
                nb: usize,
            ) -> [[f32; 4]; 8] {
                tile32x8(w, panel, nb, $bytes, $products, |$x: *const u8| $quants)
            }
        };
    }

    packed8!(
        q8_0_pack8,
        q8_0_q8_0_4x8,
        Q8_0_BYTES,
        Products::Offset,
        |x| both_halves(load32(x.add(2)))
    );
    packed8!(q5_0_pack8, q5_0_q8_0_4x8, Q5_0_BYTES, Products::Sign, |x| {
        both_halves(q5_0_quants(x))
    });
    packed8!(
        q4_1_pack8,
        q4_1_q8_1_4x8,
        Q4_1_BYTES,
        Products::UnsignedFolded,
        |x| nibbles32x2(x.add(4))
    );
    packed8!(
        q5_1_pack8,
        q5_1_q8_1_4x8,
        Q5_1_BYTES,
        Products::Unsigned,
        |x| both_halves(q5_1_quants(x))
    );

    /// [`tile32`]'s four rows × one column (decode) for Q8_0 on 512-bit registers: rows
    /// `2p` and `2p + 1` share register `p` (lanes 0..8 and 8..16), the activation block in
    /// both halves, so each `vpdpbusd`, conversion and fused multiply-add serves two rows
    /// while each row keeps its own eight lanes in ggml's order (the offset form's
    /// products: bit for bit `tile32`'s). Half the vector instructions per weight byte of the
    /// 256-bit form, which is what decode needs to keep up with the memory.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 F/VL/BW/VNNI; whole Q8_0 rows of equal block counts.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(super) unsafe fn q8_0_q8_0_4rows_512(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        let nb = w
            .iter()
            .fold(a.len() / Q8_0_BYTES, |n, r| n.min(r.len() / Q8_0_BYTES));
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        let zero = _mm512_setzero_si512();
        // Lanes of register p take the scale of row 2p (0..8) and of row 2p + 1 (8..16).
        let spread = [
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        ];
        let mut acc = [_mm512_setzero_ps(); 2];
        for b in 0..nb {
            let x: [*const u8; 4] = std::array::from_fn(|r| w[r].as_ptr().add(b * Q8_0_BYTES));
            let y = a.as_ptr().add(b * Q8_0_BYTES);
            let qy = both_halves(load32(y.add(2)));
            let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, qy));
            // d_x·d_y of the four rows: products of two f16 values, exact in f32.
            let dx = _mm_cvtph_ps(_mm_setr_epi16(
                i16_at(x[0]),
                i16_at(x[1]),
                i16_at(x[2]),
                i16_at(x[3]),
                0,
                0,
                0,
                0,
            ));
            let dy = _mm_cvtph_ps(_mm_set1_epi16(i16_at(y)));
            let d = _mm512_castps128_ps512(_mm_mul_ps(dx, dy));
            for (p, accp) in acc.iter_mut().enumerate() {
                let q = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(load32(x[2 * p].add(2))),
                    load32(x[2 * p + 1].add(2)),
                );
                let lanes = _mm512_dpbusd_epi32(start, _mm512_xor_si512(q, bias), qy);
                let dp = _mm512_permutexvar_ps(spread[p], d);
                *accp = _mm512_fmadd_ps(dp, _mm512_cvtepi32_ps(lanes), *accp);
            }
        }
        let [lo0, hi0] = halves(acc[0]);
        let [lo1, hi1] = halves(acc[1]);
        [hsum(lo0), hsum(hi0), hsum(lo1), hsum(hi1)]
    }

    /// The two 256-bit halves of `v`.
    ///
    /// # Safety
    /// AVX-512 F (inlined into such a `target_feature` caller).
    #[inline(always)]
    unsafe fn halves(v: __m512) -> [__m256; 2] {
        let pd = _mm512_castps_pd(v);
        [
            _mm256_castpd_ps(_mm512_castpd512_pd256(pd)),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(pd)),
        ]
    }

    /// The signed 5-bit values of the Q5_0 block at `x` (`nibble | 0xF0` where the fifth
    /// bit is clear, i.e. `q - 16`).
    #[inline(always)]
    unsafe fn q5_0_quants(x: *const u8) -> __m256i {
        let set = bytes_from_bits(u32_at(x.add(2)));
        _mm256_or_si256(
            nibbles32(x.add(6)),
            _mm256_andnot_si256(set, _mm256_set1_epi8(0xf0u8 as i8)),
        )
    }

    /// [`tile32`] for Q5_0.
    #[inline(always)]
    unsafe fn q5_0_tile<L: Lanes, const R: usize, const C: usize>(
        w: &[&[u8]; R],
        a: &[&[u8]; C],
    ) -> [[f32; R]; C] {
        tile32::<L, R, C>(w, a, Q5_0_BYTES, false, |x| q5_0_quants(x))
    }

    /// [`tile32`] for Q8_0 (the int8 quants as they are).
    #[inline(always)]
    unsafe fn q8_0_tile<L: Lanes, const R: usize, const C: usize>(
        w: &[&[u8]; R],
        a: &[&[u8]; C],
    ) -> [[f32; R]; C] {
        tile32::<L, R, C>(w, a, Q8_0_BYTES, true, |x| load32(x.add(2)))
    }

    /// A tile of `R` weight rows × `C` activation rows of a 32-value block type with f16 `d`
    /// and `m` first and unsigned quants that `quants(block)` builds (`block_bytes` per
    /// block), times Q8_1, in `ggml_vec_dot_q4_1_q8_1`'s and `ggml_vec_dot_q5_1_q8_1`'s
    /// order: per block and output `summs += m_x·s_y` (a product of two f16 values: exact)
    /// and `acc = fma(d_x·d_y, f32(lanes), acc)`, lane `l` the sum of the products `4l..4l +
    /// 4` (`maddubs`, pairs added); then `hsum_float_8(acc) + summs`. `out[c][r]`. Each
    /// block's quants are built once per row, each activation block loaded once per tile.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into a `target_feature` caller); whole rows of equal
    /// block counts.
    #[inline(always)]
    unsafe fn tile32_min<L: Lanes, const R: usize, const C: usize>(
        w: &[&[u8]; R],
        a: &[&[u8]; C],
        block_bytes: usize,
        quants: impl Fn(*const u8) -> __m256i,
    ) -> [[f32; R]; C] {
        const { assert!(R <= 4, "one vector of row scales") };
        let rows = w
            .iter()
            .fold(usize::MAX, |n, r| n.min(r.len() / block_bytes));
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / Q8_1_BYTES));
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        // Lane 2r + 1 of `summs[c]` is row r's `summs` for column c (the even lanes gather
        // the d products and are never read).
        let mut summs = [_mm256_setzero_ps(); C];
        for b in 0..nb {
            let mut qx = [_mm256_setzero_si256(); R];
            let mut dm = [0u32; 4];
            for r in 0..R {
                let x = w[r].as_ptr().add(b * block_bytes);
                qx[r] = quants(x);
                dm[r] = u32_at(x);
            }
            // [d_0, m_0, d_1, m_1, …]: the rows' f16 pairs, converted at once.
            let dmx = _mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr() as *const __m128i));
            // Per column, [d_y, s_y] in every pair of lanes times `dmx`: d_x·d_y (even
            // lanes) and m_x·s_y (odd lanes), each a product of two f16 values, exact in
            // f32. Stored, and read back as broadcasts from memory (a load, which AVX-512
            // folds into the fused multiply-add, off the vector ALU ports that shuffles
            // would take).
            let mut pd = [[0f32; 8]; C];
            for c in 0..C {
                let y = a[c].as_ptr().add(b * Q8_1_BYTES);
                let dsy = _mm256_cvtph_ps(_mm_set1_epi32(u32_at(y) as i32));
                let p = _mm256_mul_ps(dmx, dsy);
                summs[c] = _mm256_add_ps(summs[c], p);
                _mm256_storeu_ps(pd[c].as_mut_ptr(), p);
            }
            let pd = std::hint::black_box(&pd);
            for c in 0..C {
                let qy = load32(a[c].as_ptr().add(b * Q8_1_BYTES + 4));
                for r in 0..R {
                    let lanes = _mm256_cvtepi32_ps(L::lanes(qx[r], qy));
                    let d = _mm256_broadcast_ss(&pd[c][2 * r]);
                    acc[c][r] = _mm256_fmadd_ps(d, lanes, acc[c][r]);
                }
            }
        }
        let mut out = [[0f32; R]; C];
        for c in 0..C {
            let mut m = [0f32; 8];
            _mm256_storeu_ps(m.as_mut_ptr(), summs[c]);
            for r in 0..R {
                out[c][r] = hsum(acc[c][r]) + m[2 * r + 1];
            }
        }
        out
    }

    /// The unsigned 5-bit values of a Q5_0 / Q5_1 block: the 32 high bits at `bits`, the
    /// nibbles at `nibbles`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines and their callers in this crate
    /// (the host has those features); `bits` valid for 4 bytes, `nibbles` for 16.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn q5_unsigned(
        bits: *const u8,
        nibbles: *const u8,
    ) -> __m256i {
        let set = bytes_from_bits(u32_at(bits));
        _mm256_or_si256(
            nibbles32(nibbles),
            _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
        )
    }

    /// The unsigned 5-bit values of the Q5_1 block at `x`.
    #[inline(always)]
    unsafe fn q5_1_quants(x: *const u8) -> __m256i {
        q5_unsigned(x.add(4), x.add(8))
    }

    /// The routines built on [`tile32`] and [`tile32_min`] for one [`Lanes`] and the
    /// features it needs: the one-column routines of Q4_1 and Q8_0 (`ggml_vec_dot_q4_1_q8_1`,
    /// `ggml_vec_dot_q8_0_q8_0`, AVX2), the four-column forms ([`super::Dot4Fn`]), the
    /// four-row decode forms ([`super::Dot4RowsFn`]) and the 4 × 4 tiles
    /// ([`super::Dot4x4Fn`]). Each output is what the one-column routine gives.
    macro_rules! tile_routines {
        ($isa:ident, $lanes:ty, $features:literal) => {
            #[doc = concat!("[`Lanes`] by `", stringify!($lanes), "`, compiled with `", $features, "`.")]
            pub(in crate::handwritten) mod $isa {
                use super::*;

                /// `ggml_vec_dot_q4_1_q8_1`: [`tile32_min`] for one row and one column.
                ///
                /// # Safety
                /// The module's features; `w` whole Q4_1 blocks, `a` as many Q8_1 blocks.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
                    tile32_min::<$lanes, 1, 1>(&[w], &[a], Q4_1_BYTES, |x| nibbles32(x.add(4)))[0][0]
                }

                /// `ggml_vec_dot_q8_0_q8_0`: [`tile32`] for one row and one column.
                ///
                /// # Safety
                /// The module's features; `w` whole Q8_0 blocks, `a` as many Q8_0 blocks.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
                    q8_0_tile::<$lanes, 1, 1>(&[w], &[a])[0][0]
                }

                /// Q4_1 for four activation rows.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q4_1_q8_1_x4(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
                    tile32_min::<$lanes, 1, 4>(&[w], a, Q4_1_BYTES, |x| nibbles32(x.add(4))).map(|c| c[0])
                }

                /// Q5_1 for four activation rows.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_1_q8_1_x4(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
                    tile32_min::<$lanes, 1, 4>(&[w], a, Q5_1_BYTES, |x| q5_1_quants(x)).map(|c| c[0])
                }

                /// Q8_0 for four activation rows.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q8_0_q8_0_x4(w: &[u8], a: &[&[u8]; 4]) -> [f32; 4] {
                    q8_0_tile::<$lanes, 1, 4>(&[w], a).map(|c| c[0])
                }

                /// Q4_1, four rows and one column.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q4_1_q8_1_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                    tile32_min::<$lanes, 4, 1>(w, &[a], Q4_1_BYTES, |x| nibbles32(x.add(4)))[0]
                }

                /// Q5_1, four rows and one column.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_1_q8_1_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                    tile32_min::<$lanes, 4, 1>(w, &[a], Q5_1_BYTES, |x| q5_1_quants(x))[0]
                }

                /// Q5_0, four rows and one column.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_0_q8_0_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                    q5_0_tile::<$lanes, 4, 1>(w, &[a])[0]
                }

                /// Q8_0, four rows and one column.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q8_0_q8_0_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
                    q8_0_tile::<$lanes, 4, 1>(w, &[a])[0]
                }

                /// Q4_1, 4 rows × 4 columns.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q4_1_q8_1_4x4(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                    tile32_min::<$lanes, 4, 4>(w, a, Q4_1_BYTES, |x| nibbles32(x.add(4)))
                }

                /// Q5_1, 4 rows × 4 columns.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_1_q8_1_4x4(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                    tile32_min::<$lanes, 4, 4>(w, a, Q5_1_BYTES, |x| q5_1_quants(x))
                }

                /// Q5_0, 4 rows × 4 columns.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_0_q8_0_4x4(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                    q5_0_tile::<$lanes, 4, 4>(w, a)
                }

                /// Q8_0, 4 rows × 4 columns.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q8_0_q8_0_4x4(w: &[&[u8]; 4], a: &[&[u8]; 4]) -> [[f32; 4]; 4] {
                    q8_0_tile::<$lanes, 4, 4>(w, a)
                }

                /// [`q5_0_tile`] of any shape, for the speed test of tile shapes.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[cfg(test)]
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q5_0_tile_speed_probe<const R: usize, const C: usize>(
                    w: &[&[u8]; R],
                    a: &[&[u8]; C],
                ) -> [[f32; R]; C] {
                    q5_0_tile::<$lanes, R, C>(w, a)
                }

                /// [`tile32_min`] for Q4_1 of any shape, for the speed test of tile shapes.
                ///
                /// # Safety
                /// The module's features; whole rows of equal length.
                #[cfg(test)]
                #[target_feature(enable = $features)]
                pub(in crate::handwritten) unsafe fn q4_1_tile_speed_probe<const R: usize, const C: usize>(
                    w: &[&[u8]; R],
                    a: &[&[u8]; C],
                ) -> [[f32; R]; C] {
                    tile32_min::<$lanes, R, C>(w, a, Q4_1_BYTES, |x| nibbles32(x.add(4)))
                }
            }
        };
    }

    tile_routines!(avx2, Avx2, "avx2,fma,f16c");
    tile_routines!(vnni, Vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni");

    /// The 8 i32 lanes of one IQ4_NL / MXFP4 block with one Q8_0 block: table values (of the
    /// nibbles at `x + qs`) times the Q8_0 bytes by the sign trick, i16 pairs added.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `x`
    /// a whole block with `qs[16]` at `x + qs`, `y` a whole Q8_0 block.
    #[inline(always)]
    unsafe fn lut4_lanes(table: __m256i, x: *const u8, qs: usize, y: *const u8) -> __m256i {
        let qx = _mm256_shuffle_epi8(table, nibbles32(x.add(qs)));
        pairs(maddubs_signed(qx, load32(y.add(2))))
    }

    /// `ggml_vec_dot_iq4_nl_q8_0` (AVX2, one activation column). Blocks in pairs: even
    /// blocks into `acc1`, odd ones into `acc2`, each `fma(d_y·d_x, f32(lanes), acc)`; then
    /// `hsum_float_8(acc1 + acc2)`. An odd last block goes in as ggml's scalar tail, which
    /// GCC fuses: `sum = fma(d_y·d_x, f32(isum), sum)`, `isum` the block's exact sum of
    /// products (plain signed products, no sign trick).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ4_NL blocks, `a` as many Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
        lut4_q8_0(
            w,
            a,
            (IQ4_NL_BYTES, 2),
            iq4_table(),
            |x1, y1, x2, y2| f16_products(x1, y1, x2, y2),
            |x, y| f16x2_product(y, x),
        )
    }

    /// Bytes of a `block_mxfp4`: E8M0 `e`, `qs[16]`.
    const MXFP4_BYTES: usize = 1 + 16;

    /// The MXFP4 table (`kvalues_mxfp4`) in both 128-bit halves.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn mxfp4_table() -> __m256i {
        let t = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
        _mm256_set_m128i(t, t)
    }

    /// The scales `d_y · 2^(e - 128)` of two MXFP4 blocks `x1`, `x2` with their Q8_0 blocks
    /// `y1`, `y2`, in lanes 0 and 2 (one rounding each, as ggml's `fp16 · e8m0_half`).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `x1`,
    /// `x2` valid for 1 byte, `y1`, `y2` for 2 bytes of reads.
    #[inline(always)]
    unsafe fn mxfp4_scales(x1: *const u8, y1: *const u8, x2: *const u8, y2: *const u8) -> __m128 {
        let h = |p: *const u8| std::ptr::read_unaligned(p as *const u16) as u64;
        let dy = _mm_cvtph_ps(_mm_cvtsi64_si128((h(y1) | h(y2) << 32) as i64));
        let dx = _mm_setr_ps(e8m0_to_f32_half(*x1), 0.0, e8m0_to_f32_half(*x2), 0.0);
        _mm_mul_ps(dy, dx)
    }

    /// `ggml_vec_dot_mxfp4_q8_0` (AVX2, one activation column): [`iq4_nl_q8_0`]'s order,
    /// with `kvalues_mxfp4` and `d_x = 2^(e - 128)` (`GGML_CPU_E8M0_TO_FP32_HALF`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole MXFP4 blocks, `a` as many Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
        lut4_q8_0(
            w,
            a,
            (MXFP4_BYTES, 1),
            mxfp4_table(),
            |x1, y1, x2, y2| mxfp4_scales(x1, y1, x2, y2),
            |x, y| f16_at(y) * e8m0_to_f32_half(*x),
        )
    }

    /// The even/odd-block order of [`iq4_nl_q8_0`] for blocks of `bytes` bytes with
    /// `qs[16]` at `qs`, nibbles mapped by `table`; `scales2` gives two blocks' `d_y·d_x` in
    /// lanes 0 and 2, `scale1` one block's.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn lut4_q8_0(
        w: &[u8],
        a: &[u8],
        (bytes, qs): (usize, usize),
        table: __m256i,
        scales2: impl Fn(*const u8, *const u8, *const u8, *const u8) -> __m128,
        scale1: impl Fn(*const u8, *const u8) -> f32,
    ) -> f32 {
        let nb = (w.len() / bytes).min(a.len() / Q8_0_BYTES);
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let mut b = 0;
        while b + 1 < nb {
            let x1 = w.as_ptr().add(b * bytes);
            let y1 = a.as_ptr().add(b * Q8_0_BYTES);
            let x2 = x1.add(bytes);
            let y2 = y1.add(Q8_0_BYTES);
            let l1 = lut4_lanes(table, x1, qs, y1);
            let l2 = lut4_lanes(table, x2, qs, y2);
            let d = scales2(x1, y1, x2, y2);
            let d1 = _mm256_broadcastss_ps(d);
            let d2 = _mm256_broadcastss_ps(_mm_movehl_ps(d, d));
            acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(l1), acc1);
            acc2 = _mm256_fmadd_ps(d2, _mm256_cvtepi32_ps(l2), acc2);
            b += 2;
        }
        let mut sum = hsum(_mm256_add_ps(acc1, acc2));
        if b < nb {
            let x = w.as_ptr().add(b * bytes);
            let y = a.as_ptr().add(b * Q8_0_BYTES);
            let qx = _mm256_shuffle_epi8(table, nibbles32(x.add(qs)));
            let qy = load32(y.add(2));
            // Exact signed products: widen to i16 and multiply-add pairs.
            let lo = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qx)),
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qy)),
            );
            let hi = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(qx)),
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(qy)),
            );
            let mut l = [0i32; 8];
            _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, _mm256_add_epi32(lo, hi));
            let isum = l.iter().fold(0i32, |s, &v| s.wrapping_add(v));
            sum = scale1(x, y).mul_add(isum as f32, sum);
        }
        sum
    }

    // ---- K-quants and IQ4_XS (256-value super-blocks, Q8_K activations) -----------------

    /// `ggml_vec_dot_q2_K_q8_K` (AVX2). Per super-block: 8 i32 lanes of the mins,
    /// `m[2l]·bsums[2l] + m[2l+1]·bsums[2l+1]`, go in first, `acc = fma(-d_y·dmin_x, ·, acc)`;
    /// then the 2-bit values times the Q8_K bytes (`maddubs`), times the 4-bit scale of each
    /// 16 values (`madd`), summed over the eight 32-value vectors into 8 i32 lanes,
    /// `acc = fma(d_y·d_x, ·, acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q2_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q2_K_BYTES).min(a.len() / Q8_K_BYTES);
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q2_K_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let (xd, xdmin) = f16_pair(x.add(80));
            let d = yd * xd;
            let dmin = -yd * xdmin;
            let q8 = y.add(4);
            let packed = _mm_loadu_si128(x as *const __m128i);
            let scales8 = _mm_and_si128(packed, m4);
            let mins8 = _mm_and_si128(_mm_srli_epi16(packed, 4), m4);
            let mins = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), load32(y.add(260)));
            acc = fma_lanes(dmin, mins, acc);
            let sumi = k16_lanes(_mm256_cvtepi8_epi16(scales8), |half, k| {
                let bits = load32(x.add(16 + 32 * half));
                let q2 =
                    _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                _mm256_maddubs_epi16(q2, load32(q8.add(32 * (4 * half + k))))
            });
            acc = fma_lanes(d, sumi, acc);
        }
        hsum(acc)
    }

    /// The sixteen 6-bit Q3_K scales of the 12 bytes at `p`, minus 32, as i16 in one
    /// register (scale `j` in lane `j`).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 12 bytes of reads.
    #[inline(always)]
    unsafe fn q3_k_scales(p: *const u8) -> __m256i {
        let (a0, a1, a2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
        let (low, high) = (0x0f0f_0f0fu32, 0x0303_0303u32);
        let s = _mm_setr_epi32(
            ((a0 & low) | ((a2 & high) << 4)) as i32,
            ((a1 & low) | (((a2 >> 2) & high) << 4)) as i32,
            (((a0 >> 4) & low) | (((a2 >> 4) & high) << 4)) as i32,
            (((a1 >> 4) & low) | (((a2 >> 6) & high) << 4)) as i32,
        );
        _mm256_cvtepi8_epi16(_mm_sub_epi8(s, _mm_set1_epi8(32)))
    }

    /// `ggml_vec_dot_q3_K_q8_K` (AVX2). Per super-block: over the eight 32-value vectors,
    /// `maddubs(low 2 bits, y) - maddubs(4 where the high bit is clear, y)` (i16), times the
    /// scale `sc - 32` of each 16 values (`madd`), summed into 8 i32 lanes;
    /// `acc = fma(d_y·d_x, ·, acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q3_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q3_K_BYTES).min(a.len() / Q8_K_BYTES);
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let zero = _mm256_setzero_si256();
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q3_K_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f32_at(y) * f16_at(x.add(108));
            let q8 = y.add(4);
            let hbits = load32(x);
            let sumi = k16_lanes(q3_k_scales(x.add(96)), |half, k| {
                let g = 4 * half + k;
                let bits = load32(x.add(32 + 32 * half));
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // 4 where bit g of the hmask byte is clear, else 0.
                let bit = _mm256_and_si256(hbits, _mm256_set1_epi8((1u8 << g) as i8));
                let high = _mm256_and_si256(_mm256_cmpeq_epi8(bit, zero), four);
                let y8 = load32(q8.add(32 * g));
                _mm256_sub_epi16(
                    _mm256_maddubs_epi16(low, y8),
                    _mm256_maddubs_epi16(high, y8),
                )
            });
            acc = fma_lanes(d, sumi, acc);
        }
        hsum(acc)
    }

    /// `v` shifted by `by` bits within each 16-bit lane, by an immediate: left for `by > 0`,
    /// right (logical) for `by < 0`. `by` must be known where the caller is compiled (a
    /// constant or the index of an unrolled loop) for the `match` to fold away.
    #[inline(always)]
    unsafe fn shift16(v: __m256i, by: i32) -> __m256i {
        match by {
            7 => _mm256_slli_epi16::<7>(v),
            6 => _mm256_slli_epi16::<6>(v),
            5 => _mm256_slli_epi16::<5>(v),
            4 => _mm256_slli_epi16::<4>(v),
            3 => _mm256_slli_epi16::<3>(v),
            2 => _mm256_slli_epi16::<2>(v),
            1 => _mm256_slli_epi16::<1>(v),
            0 => v,
            -1 => _mm256_srli_epi16::<1>(v),
            -2 => _mm256_srli_epi16::<2>(v),
            -3 => _mm256_srli_epi16::<3>(v),
            -4 => _mm256_srli_epi16::<4>(v),
            -5 => _mm256_srli_epi16::<5>(v),
            -6 => _mm256_srli_epi16::<6>(v),
            _ => _mm256_srli_epi16::<7>(v),
        }
    }

    /// [`q3_k_q8_k`] of four rows with one activation row (decode), on AVX-512 VL and VNNI,
    /// in fewer instructions (the decode routine is bound by how many the core issues): the
    /// two low bits by an immediate shift and a mask, the `4 where the high bit is clear`
    /// by a shift and `andn`, the scale products added by `vpdpwssd`; the activation's
    /// vectors loaded once for the four rows, whose chains are interleaved. The same i16
    /// products and the same lanes, so the same numbers.
    ///
    /// # Safety
    /// As [`q3_k_q8_k`], for each row; the host has AVX-512 F, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q3_k_q8_k_4rows_vnni(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        let nb = w
            .iter()
            .fold(a.len() / Q8_K_BYTES, |n, r| n.min(r.len() / Q3_K_BYTES));
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let q8 = y.add(4);
            let x: [*const u8; 4] = std::array::from_fn(|r| w[r].as_ptr().add(b * Q3_K_BYTES));
            let mut d = [0f32; 4];
            // Row `r`'s scales of half `h` in both 128-bit lanes.
            let mut halves = [[zero; 2]; 4];
            for r in 0..4 {
                d[r] = yd * f16_at(x[r].add(108));
                let all = q3_k_scales(x[r].add(96));
                halves[r] = [
                    _mm256_permute2x128_si256::<0x00>(all, all),
                    _mm256_permute2x128_si256::<0x11>(all, all),
                ];
            }
            // Two chains per row (even and odd vectors), four rows interleaved.
            let mut sumi = [[zero; 2]; 4];
            q3_k_vector::<0, 0>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<0, 1>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<0, 2>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<0, 3>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<1, 0>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<1, 1>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<1, 2>(&x, q8, &halves, &mut sumi);
            q3_k_vector::<1, 3>(&x, q8, &halves, &mut sumi);
            for r in 0..4 {
                acc[r] = fma_lanes(d[r], _mm256_add_epi32(sumi[r][0], sumi[r][1]), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum(acc[r]))
    }

    /// Vector `4 · HALF + K` of a Q3_K super-block for [`q3_k_q8_k_4rows_vnni`]'s four
    /// rows (blocks at `x`, the Q8_K quants at `q8`): each row's i16 products times its
    /// scale pair, added into `sumi[r][K % 2]`. Constant shifts (generic over the vector).
    ///
    /// # Safety
    /// Inlined into [`q3_k_q8_k_4rows_vnni`] (AVX-512 VL and VNNI); whole blocks at `x`
    /// and `q8`.
    #[inline(always)]
    unsafe fn q3_k_vector<const HALF: usize, const K: usize>(
        x: &[*const u8; 4],
        q8: *const u8,
        halves: &[[__m256i; 2]; 4],
        sumi: &mut [[__m256i; 2]; 4],
    ) {
        let g = 4 * HALF + K;
        let y8 = load32(q8.add(32 * g));
        let (m3, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
        // ggml subtracts maddubs(4 where the high bit is clear, y) from maddubs(low bits,
        // y); the same i16 (neither saturates) is maddubs(low bits + 4 · high bit, y) −
        // maddubs(4, y), whose second term the four rows share.
        let four_y = _mm256_maddubs_epi16(four, y8);
        for r in 0..4 {
            let bits = load32(x[r].add(32 + 32 * HALF));
            let hbits = load32(x[r]);
            // Bits 2K..2K + 2 of each byte at bits 0..2 (masked below).
            let low = shift16(bits, -2 * K as i32);
            // Bit g of each hmask byte at bit 2.
            let moved = shift16(hbits, 2 - g as i32);
            // (low & 3) | (moved & 4): truth table 0xEC of (a, b, c) = (a & c) | b.
            let q3 = _mm256_ternarylogic_epi32::<0xEC>(low, _mm256_and_si256(moved, four), m3);
            let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3, y8), four_y);
            let s = scale_pair(halves[r][HALF], K as i32);
            sumi[r][K % 2] = _mm256_dpwssd_epi32(sumi[r][K % 2], s, p16);
        }
    }

    /// The eight 6-bit scales (i16 lanes 0..8) and eight 6-bit mins (lanes 8..16) of the 12
    /// packed bytes at `p` of a Q4_K / Q5_K super-block.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `p`
    /// valid for 12 bytes of reads.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn k4_scales_mins(p: *const u8) -> __m256i {
        let (u0, u1, u2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
        let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        let scales_lo = u0 & m6;
        let scales_hi = (u2 & m4) | (((u0 >> 6) & m2) << 4);
        let mins_lo = u1 & m6;
        let mins_hi = ((u2 >> 4) & m4) | (((u1 >> 6) & m2) << 4);
        _mm256_cvtepu8_epi16(_mm_setr_epi32(
            scales_lo as i32,
            scales_hi as i32,
            mins_lo as i32,
            mins_hi as i32,
        ))
    }

    /// The sums of the eight i32 lanes of `u[0..4]` (exact), lane `i` for `u[i]`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn hsum4_i32_vec(u: [__m256i; 4]) -> __m128i {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(u[0], u[1]), _mm256_hadd_epi32(u[2], u[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    }

    /// The eight 6-bit scales and mins of the Q4_K / Q5_K super-block whose 12 bytes of
    /// `scales` start at `p` (ggml's `get_scale_min_k4`), unpacked in vector registers:
    /// bytes `0..4` scales 0..4, `4..8` mins 0..4, `8..12` scales 4..8, `12..16` mins 4..8.
    ///
    /// # Safety
    /// AVX2 (inlined into such a caller); `p` valid for 16 bytes.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn k4_scales_mins_vec(p: *const u8) -> __m128i {
        // u32 lanes [u0, u1, u2, -] of the 12 bytes.
        let v = _mm_loadu_si128(p as *const __m128i);
        // [u0, u1, u0 >> 2, u1 >> 2] & [m6, m6, 0x30, 0x30]: the low scales and mins,
        // and the two high bits of the high ones in place.
        let low = _mm_and_si128(
            _mm_srlv_epi32(
                _mm_shuffle_epi32::<0b01_00_01_00>(v),
                _mm_setr_epi32(0, 0, 2, 2),
            ),
            _mm_setr_epi32(0x3f3f_3f3f, 0x3f3f_3f3f, 0x3030_3030, 0x3030_3030),
        );
        // [-, -, u2, u2 >> 4] & [0, 0, m4, m4]: the low four bits of the high ones.
        let high = _mm_and_si128(
            _mm_srlv_epi32(
                _mm_shuffle_epi32::<0b10_10_10_10>(v),
                _mm_setr_epi32(0, 0, 0, 4),
            ),
            _mm_setr_epi32(0, 0, 0x0f0f_0f0f, 0x0f0f_0f0f),
        );
        _mm_or_si128(low, high)
    }

    /// The four i32 mins lanes of a Q4_K / Q5_K super-block: lane `t` =
    /// `m[2t]·s[2t] + m[2t+1]·s[2t+1]` with `s[j] = bsums[2j] + bsums[2j+1]` (i16 `hadd`).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features); `y`
    /// a whole Q8_K block.
    #[inline(always)]
    unsafe fn k4_mins(mins_scales: __m256i, y: *const u8) -> __m128i {
        let bsums = load32(y.add(260));
        let s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bsums),
            _mm256_extracti128_si256::<1>(bsums),
        );
        _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_scales), s)
    }

    /// `ggml_vec_dot_q4_K_q8_K` (AVX2). Per super-block: four i32 mins lanes
    /// ([`k4_mins`]) into `acc_m = fma(-d_y·dmin_x, ·, acc_m)` (4 lanes); over the eight
    /// 32-value vectors the nibbles times the Q8_K bytes (`maddubs`), times the vector's
    /// scale (`madd`), summed into 8 i32 lanes, `acc = fma(d_y·d_x, ·, acc)`. The result is
    /// `hsum_float_8(acc) + ((acc_m0 + acc_m2) + (acc_m1 + acc_m3))`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q4_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q4_K_BYTES).min(a.len() / Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q4_K_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let (xd, xdmin) = f16_pair(x);
            let d = yd * xd;
            let dmin = -yd * xdmin;
            let ms = k4_scales_mins(x.add(4));
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins(ms, y)), acc_m);
            let scales = _mm256_permute2x128_si256::<0x00>(ms, ms);
            let q4 = x.add(16);
            let q8 = y.add(4);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let bits = load32(q4.add(32 * j));
                let lo = _mm256_and_si256(bits, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                let pl = _mm256_madd_epi16(
                    scale_one(scales, 2 * j as i32),
                    _mm256_maddubs_epi16(lo, load32(q8.add(64 * j))),
                );
                let ph = _mm256_madd_epi16(
                    scale_one(scales, 2 * j as i32 + 1),
                    _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32))),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            acc = fma_lanes(d, sumi, acc);
        }
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum(acc) + _mm_cvtss_f32(m)
    }

    /// `ggml_vec_dot_q5_K_q8_K` (AVX2). As Q4_K with a fifth bit (16 added where bit `g` of
    /// `qh[byte]` is set, for vector `g`), except the mins: the four [`k4_mins`] lanes are
    /// added into one i32 and go into a scalar `summs = fma(-d_y·dmin_x, f32(mins), summs)`
    /// (GCC fuses ggml's `summs += dmin * mins`); the result is `hsum_float_8(acc) + summs`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole Q5_K blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / Q5_K_BYTES).min(a.len() / Q8_K_BYTES);
        let m4 = _mm256_set1_epi8(0x0f);
        let sixteen = _mm256_set1_epi8(16);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for b in 0..nb {
            let x = w.as_ptr().add(b * Q5_K_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let (xd, xdmin) = f16_pair(x);
            let d = yd * xd;
            let dmin = -yd * xdmin;
            let ms = k4_scales_mins(x.add(4));
            let m = k4_mins(ms, y);
            let m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
            let m = _mm_add_epi32(m, _mm_shuffle_epi32::<0b01>(m));
            summs = dmin.mul_add(_mm_cvtsi128_si32(m) as f32, summs);
            let scales = _mm256_permute2x128_si256::<0x00>(ms, ms);
            let hbits = load32(x.add(16));
            let q5 = x.add(48);
            let q8 = y.add(4);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let bits = load32(q5.add(32 * j));
                let h0 = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                let h1 = _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8);
                let hi0 =
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, h0), h0), sixteen);
                let hi1 =
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, h1), h1), sixteen);
                let v0 = _mm256_or_si256(_mm256_and_si256(bits, m4), hi0);
                let v1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), hi1);
                let p0 = _mm256_madd_epi16(
                    scale_one(scales, 2 * j as i32),
                    _mm256_maddubs_epi16(v0, load32(q8.add(64 * j))),
                );
                let p1 = _mm256_madd_epi16(
                    scale_one(scales, 2 * j as i32 + 1),
                    _mm256_maddubs_epi16(v1, load32(q8.add(64 * j + 32))),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = fma_lanes(d, sumi, acc);
        }
        hsum(acc) + summs
    }

    /// [`q5_k_q8_k`] of four rows with one activation row (decode), on AVX-512 VL and VNNI,
    /// in fewer instructions (the decode routine is bound by how many the core issues): the
    /// scales and mins unpacked in vector registers ([`k4_scales_mins_vec`]), each scale
    /// broadcast by a load from a table of i16 pairs, each 5-bit value by a shift, a mask and one `vpternlogd`, the scale
    /// products added by `vpdpwssd`, the four rows interleaved (independent chains) and
    /// their mins terms in the lanes of one vector. The same lanes and the same float
    /// steps per row, so the same numbers.
    ///
    /// # Safety
    /// As [`q5_k_q8_k`], for each row; the host has AVX-512 F, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q5_k_q8_k_4rows_vnni(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        let nb = w
            .iter()
            .fold(a.len() / Q8_K_BYTES, |n, r| n.min(r.len() / Q5_K_BYTES));
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut summs = _mm_setzero_ps();
        // Row `r`'s scale `j` as the i16 pair (s_j, s_j), for `vpdpwssd`.
        let mut sc = [[0u32; 8]; 4];
        for b in 0..nb {
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let q8 = y.add(4);
            // s_j = bsums[2j] + bsums[2j + 1] in the i16 lanes that hold the mins of
            // `cvtepu8_epi16(k4_scales_mins_vec(..))`: [0 × 4, s_0..4 | 0 × 4, s_4..8].
            let bsums = load32(y.add(260));
            let s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bsums),
                _mm256_extracti128_si256::<1>(bsums),
            );
            let s = _mm256_setr_m128i(
                _mm_slli_si128::<8>(s),
                _mm_unpackhi_epi64(_mm_setzero_si128(), s),
            );
            let x: [*const u8; 4] = std::array::from_fn(|r| w[r].as_ptr().add(b * Q5_K_BYTES));
            let mut mins = [zero; 4];
            let mut d = [0f32; 4];
            let mut dmin = [0f32; 4];
            for r in 0..4 {
                let (xd, xdmin) = f16_pair(x[r]);
                d[r] = yd * xd;
                dmin[r] = -yd * xdmin;
                // [sc_0..4, mn_0..4 | sc_4..8, mn_4..8] as i16.
                let v = _mm256_cvtepu8_epi16(k4_scales_mins_vec(x[r].add(4)));
                _mm256_storeu_si256(
                    sc[r].as_mut_ptr() as *mut __m256i,
                    _mm256_unpacklo_epi16(v, v),
                );
                mins[r] = _mm256_madd_epi16(v, s);
            }
            // Through memory: each scale is broadcast by a load, not moved from a register.
            let sc = std::hint::black_box(&sc);
            // Σ_j mn_j · s_j of each row (exact), then `summs = fma(dmin, f32(·), summs)`
            // in its lane, as the one-row routine's scalar.
            let m = hsum4_i32_vec(mins);
            let dmin = _mm_loadu_ps(dmin.as_ptr());
            summs = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(m), summs);
            // Two chains per row (even and odd vectors), four rows interleaved.
            let mut sumi = [[zero; 2]; 4];
            q5_k_vectors::<0>(&x, q8, sc, &mut sumi);
            q5_k_vectors::<1>(&x, q8, sc, &mut sumi);
            q5_k_vectors::<2>(&x, q8, sc, &mut sumi);
            q5_k_vectors::<3>(&x, q8, sc, &mut sumi);
            for r in 0..4 {
                acc[r] = fma_lanes(d[r], _mm256_add_epi32(sumi[r][0], sumi[r][1]), acc[r]);
            }
        }
        let mut s = [0f32; 4];
        _mm_storeu_ps(s.as_mut_ptr(), summs);
        std::array::from_fn(|r| hsum(acc[r]) + s[r])
    }

    /// Vectors `2J` and `2J + 1` of a Q5_K super-block for [`q5_k_q8_k_4rows_vnni`]'s four
    /// rows (blocks at `x`, the Q8_K quants at `q8`, the scale pairs `sc`): each row's i16
    /// products times its scale, added into `sumi[r][0]` and `sumi[r][1]`. Constant shifts
    /// (generic over the pair).
    ///
    /// # Safety
    /// Inlined into [`q5_k_q8_k_4rows_vnni`] (AVX-512 VL and VNNI); whole blocks at `x`
    /// and `q8`.
    #[inline(always)]
    unsafe fn q5_k_vectors<const J: usize>(
        x: &[*const u8; 4],
        q8: *const u8,
        sc: &[[u32; 8]; 4],
        sumi: &mut [[__m256i; 2]; 4],
    ) {
        let (m4, sixteen) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(16));
        let y0 = load32(q8.add(64 * J));
        let y1 = load32(q8.add(64 * J + 32));
        for r in 0..4 {
            let hbits = load32(x[r].add(16));
            let bits = load32(x[r].add(48 + 32 * J));
            // Bit `k` of each `qh` byte moved to bit 4 (16), the rest cleared.
            let bit = |k: usize| _mm256_and_si256(shift16(hbits, 4 - k as i32), sixteen);
            // (nibble & 0x0f) | bit: truth table 0xEC of (a, b, c) = (a & c) | b.
            let v0 = _mm256_ternarylogic_epi32::<0xEC>(bits, bit(2 * J), m4);
            let v1 =
                _mm256_ternarylogic_epi32::<0xEC>(_mm256_srli_epi16::<4>(bits), bit(2 * J + 1), m4);
            let scale = |k: usize| _mm256_set1_epi32(sc[r][k] as i32);
            sumi[r][0] =
                _mm256_dpwssd_epi32(sumi[r][0], scale(2 * J), _mm256_maddubs_epi16(v0, y0));
            sumi[r][1] =
                _mm256_dpwssd_epi32(sumi[r][1], scale(2 * J + 1), _mm256_maddubs_epi16(v1, y1));
        }
    }

    /// `ggml_vec_dot_iq4_xs_q8_K` (AVX2). Per super-block: over the eight 32-value blocks,
    /// table values times the Q8_K bytes by the sign trick (i16), times the block's scale
    /// `ls - 32` (`madd`), into two sets of 8 i32 lanes (even and odd blocks) that are added;
    /// `acc = fma(d_x·d_y, ·, acc)`; `hsum_float_8` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ4_XS blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ4_XS_BYTES).min(a.len() / Q8_K_BYTES);
        let table = iq4_table();
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ4_XS_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            let sh = std::ptr::read_unaligned(x.add(2) as *const u16) as u32;
            let qs = x.add(8);
            let q8 = y.add(4);
            let mut sumi1 = _mm256_setzero_si256();
            let mut sumi2 = _mm256_setzero_si256();
            for t in 0..4 {
                let sl = *x.add(4 + t) as u32;
                let ls1 = ((sl & 0x0f) | ((sh >> (4 * t)) & 3) << 4) as i32 - 32;
                let ls2 = ((sl >> 4) | ((sh >> (4 * t + 2)) & 3) << 4) as i32 - 32;
                let q1 = _mm256_shuffle_epi8(table, nibbles32(qs.add(32 * t)));
                let q2 = _mm256_shuffle_epi8(table, nibbles32(qs.add(32 * t + 16)));
                let p1 = maddubs_signed(q1, load32(q8.add(64 * t)));
                let p2 = maddubs_signed(q2, load32(q8.add(64 * t + 32)));
                sumi1 =
                    _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(ls1 as i16)), sumi1);
                sumi2 =
                    _mm256_add_epi32(_mm256_madd_epi16(p2, _mm256_set1_epi16(ls2 as i16)), sumi2);
            }
            acc = fma_lanes(d, _mm256_add_epi32(sumi1, sumi2), acc);
        }
        hsum(acc)
    }

    /// [`iq4_xs_q8_k`] of four rows with one activation row (decode), on AVX-512 VL and
    /// VNNI, in fewer instructions (the decode routine is bound by how many the core
    /// issues): each row's eight block scales unpacked in vector registers and broadcast by
    /// loads from a table of i16 pairs, the scale products added by `vpdpwssd`, the
    /// activation's vectors loaded once for the four rows, whose chains are interleaved.
    /// The same i16 products and the same lanes, so the same numbers.
    ///
    /// # Safety
    /// As [`iq4_xs_q8_k`], for each row; the host has AVX-512 F, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn iq4_xs_q8_k_4rows_vnni(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        let nb = w
            .iter()
            .fold(a.len() / Q8_K_BYTES, |n, r| n.min(r.len() / IQ4_XS_BYTES));
        let table = iq4_table();
        let zero = _mm256_setzero_si256();
        // Block `j`'s scale: nibble `j % 2` of `scales_l[j / 2]`, bits `2j..2j + 2` of
        // `scales_h`.
        let low_shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
        let high_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        let mut acc = [_mm256_setzero_ps(); 4];
        // Row `r`'s scale `ls - 32` of block `j` as the i16 pair (ls, ls), for `vpdpwssd`.
        let mut ls = [[0u32; 8]; 4];
        for b in 0..nb {
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let yd = f32_at(y);
            let q8 = y.add(4);
            let x: [*const u8; 4] = std::array::from_fn(|r| w[r].as_ptr().add(b * IQ4_XS_BYTES));
            let mut d = [0f32; 4];
            for r in 0..4 {
                d[r] = f16_at(x[r]) * yd;
                // scales_l's bytes twice each, one per i32 lane: [l0, l0, l1, l1, …].
                let l = _mm_cvtsi32_si128(u32_at(x[r].add(4)) as i32);
                let l = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(l, l));
                let low = _mm256_and_si256(_mm256_srlv_epi32(l, low_shift), _mm256_set1_epi32(15));
                // scales_h (and scales_l above it, shifted out of the two bits kept).
                let h = _mm256_set1_epi32(u32_at(x[r].add(2)) as i32);
                let high = _mm256_and_si256(_mm256_srlv_epi32(h, high_shift), _mm256_set1_epi32(3));
                let s = _mm256_sub_epi32(
                    _mm256_or_si256(low, _mm256_slli_epi32::<4>(high)),
                    _mm256_set1_epi32(32),
                );
                // (s & 0xffff) | (s << 16): truth table 0xEC of (a, b, c) = (a & c) | b.
                let pair = _mm256_ternarylogic_epi32::<0xEC>(
                    s,
                    _mm256_slli_epi32::<16>(s),
                    _mm256_set1_epi32(0xffff),
                );
                _mm256_storeu_si256(ls[r].as_mut_ptr() as *mut __m256i, pair);
            }
            // Through memory: each scale is broadcast by a load, not moved from a register.
            let ls = std::hint::black_box(&ls);
            // Two chains per row (even and odd blocks), four rows interleaved.
            let mut sumi = [[zero; 2]; 4];
            for t in 0..4 {
                let y1 = load32(q8.add(64 * t));
                let y2 = load32(q8.add(64 * t + 32));
                for r in 0..4 {
                    let qs = x[r].add(8 + 32 * t);
                    let q1 = _mm256_shuffle_epi8(table, nibbles32(qs));
                    let q2 = _mm256_shuffle_epi8(table, nibbles32(qs.add(16)));
                    let scale = |j: usize| _mm256_set1_epi32(ls[r][j] as i32);
                    sumi[r][0] =
                        _mm256_dpwssd_epi32(sumi[r][0], maddubs_signed(q1, y1), scale(2 * t));
                    sumi[r][1] =
                        _mm256_dpwssd_epi32(sumi[r][1], maddubs_signed(q2, y2), scale(2 * t + 1));
                }
            }
            for r in 0..4 {
                acc[r] = fma_lanes(d[r], _mm256_add_epi32(sumi[r][0], sumi[r][1]), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum(acc[r]))
    }

    /// Bytes of a `block_iq3_xxs`: f16 `d`, grid indices `qs[64]`, `scales_and_signs[32]`.
    const IQ3_XXS_BYTES: usize = 2 + 64 + 32;

    /// Bytes of a `block_iq3_s`: f16 `d`, `qs[64]`, `qh[8]`, `signs[32]`, `scales[4]`.
    const IQ3_S_BYTES: usize = 2 + 64 + 8 + 32 + 4;

    /// 32-value block `ib` of an IQ3_XXS block at `x`: the grid magnitudes, the sign operand
    /// ([`sign_bytes`]) and the multiplier `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ3_XXS block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq3_xxs_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let aux = u32_at(x.add(66 + 4 * ib));
        let mag = iq3_xxs_magnitudes(x.add(2 + 8 * ib));
        (
            mag,
            sign_bytes(aux),
            _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        )
    }

    /// 32-value block `ib` of an IQ3_S block at `x`: the `iq3s_grid` magnitudes (indices
    /// `qs[8 ib + k] | (bit k of qh[ib]) << 8`), the sign operand (`-1` where bit `v % 8` of
    /// `signs[4 ib + v / 8]` is set, else `1`) and the multiplier `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ3_S block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq3_s_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let qs = x.add(2 + 8 * ib);
        let qh = *x.add(66 + ib) as usize;
        let g = |k: usize| IQ3S_GRID[*qs.add(k) as usize | ((qh >> k) & 1) << 8] as i32;
        let mag = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
        let signs = _mm256_or_si256(
            bytes_from_bits(u32_at(x.add(74 + 4 * ib))),
            _mm256_set1_epi8(1),
        );
        let ls = (*x.add(106 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
        (mag, signs, _mm256_set1_epi16(2 * ls as i16 + 1))
    }

    /// The lanes of one IQ3_XXS / IQ3_S super-block with one Q8_K block as their AVX2
    /// `vec_dot` kernels build them: per 32-value block the magnitudes times the activation
    /// with the signs applied (`_mm256_sign_epi8`: `-(-128)` stays `-128`, as ggml's
    /// `sign_epi8` and `(y ^ s) - s` give) by `maddubs`, times `2 ls + 1` by `madd`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole block of the type
    /// `parts` reads, `q8` the 256 activation bytes.
    #[inline(always)]
    unsafe fn grid_lanes(
        x: *const u8,
        q8: *const u8,
        parts: unsafe fn(*const u8, usize) -> (__m256i, __m256i, __m256i),
    ) -> __m256i {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let (mag, signs, scale) = parts(x, ib);
            let sy = _mm256_sign_epi8(load32(q8.add(32 * ib)), signs);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(mag, sy), scale);
            sumi = _mm256_add_epi32(sumi, p);
        }
        sumi
    }

    /// `ggml_vec_dot_iq3_xxs_q8_K` (AVX2): [`grid_lanes`] per super-block,
    /// `acc = fma(d_x·d_y, f32(lane), acc)`; `0.25 · hsum_float_8(acc)` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ3_XXS blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq3_xxs_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ3_XXS_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ3_XXS_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            acc = fma_lanes(d, grid_lanes(x, y.add(4), iq3_xxs_parts), acc);
        }
        0.25 * hsum(acc)
    }

    /// Bytes of a `block_iq2_xxs`: f16 `d`, `qs[64]` (per 32 values four grid indices and a
    /// u32 of signs and scale).
    const IQ2_XXS_BYTES: usize = 2 + 64;

    /// 32-value block `ib` of an IQ2_XXS block at `x`: the `iq2xxs_grid` magnitudes of its
    /// four index bytes, the sign operand ([`sign_bytes`] of the u32 after them) and the
    /// multiplier `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ2_XXS block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq2_xxs_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let q = x.add(2 + 8 * ib);
        let aux = u32_at(q.add(4));
        let g = |k: usize| IQ2XXS_GRID[*q.add(k) as usize] as i64;
        let mag = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
        (
            mag,
            sign_bytes(aux),
            _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        )
    }

    /// 32-value block `ib` of an IQ2_XS block at `x`: the `iq2xs_grid` magnitudes of its
    /// four u16 (`q & 511`), the sign operand (`ksigns_iq2xs[q >> 9]` per 8 values) and the
    /// multipliers `2 ls + 1` of its first 16 values (i16 lanes 0..8) and last 16 (8..16).
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ2_XS block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq2_xs_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let q = x.add(2 + 8 * ib);
        let u = |k: usize| u16::from_le_bytes([*q.add(2 * k), *q.add(2 * k + 1)]) as usize;
        let g = |k: usize| IQ2XS_GRID[u(k) & 511] as i64;
        let s = |k: usize| SIGNS64[u(k) >> 9] as i64;
        let mag = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
        let signs = _mm256_setr_epi64x(s(0), s(1), s(2), s(3));
        let sc = *x.add(66 + ib);
        let lo = _mm_set1_epi16(2 * (sc & 0x0f) as i16 + 1);
        let hi = _mm_set1_epi16(2 * (sc >> 4) as i16 + 1);
        (mag, signs, _mm256_set_m128i(hi, lo))
    }

    /// `ggml_vec_dot_iq2_xs_q8_K` (AVX2): [`grid_lanes`] per super-block (each 16 values
    /// their own scale), `acc = fma(d_x·d_y, f32(lane), acc)`; `0.125 · hsum_float_8(acc)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ2_XS blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq2_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ2_XS_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ2_XS_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            acc = fma_lanes(d, grid_lanes(x, y.add(4), iq2_xs_parts), acc);
        }
        0.125 * hsum(acc)
    }

    /// 32-value block `ib` of an IQ2_S block at `x`: the `iq2s_grid` magnitudes (indices
    /// `qs[4 ib + l] | (bits 2l..2l+2 of qh[ib]) << 8`), the sign operand (bit `j` of sign
    /// byte `qs[32 + 4 ib + l]` for value `8l + j`) and the per-16 multipliers `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ2_S block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq2_s_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let qs = x.add(2 + 4 * ib);
        let qh = *x.add(66 + ib) as usize;
        let g = |l: usize| IQ2S_GRID[*qs.add(l) as usize | ((qh >> (2 * l)) & 3) << 8] as i64;
        let mag = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
        let signs = _mm256_or_si256(
            bytes_from_bits(u32_at(x.add(34 + 4 * ib))),
            _mm256_set1_epi8(1),
        );
        let sc = *x.add(74 + ib);
        let lo = _mm_set1_epi16(2 * (sc & 0x0f) as i16 + 1);
        let hi = _mm_set1_epi16(2 * (sc >> 4) as i16 + 1);
        (mag, signs, _mm256_set_m128i(hi, lo))
    }

    /// Bytes of a `block_iq2_s`: f16 `d`, `qs[64]` (indices, then signs), `qh[8]`,
    /// `scales[8]`.
    const IQ2_S_BYTES: usize = 2 + 64 + 8 + 8;

    /// `ggml_vec_dot_iq2_s_q8_K` (AVX2): [`grid_lanes`] per super-block (each 16 values
    /// their own scale), `acc = fma(d_x·d_y, f32(lane), acc)`; `0.125 · hsum_float_8(acc)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ2_S blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq2_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ2_S_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ2_S_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            acc = fma_lanes(d, grid_lanes(x, y.add(4), iq2_s_parts), acc);
        }
        0.125 * hsum(acc)
    }

    /// Bytes of a `block_iq1_s`: f16 `d`, `qs[32]`, `qh[8]` (u16).
    const IQ1_S_BYTES: usize = 2 + 32 + 16;

    /// The `iq1s_grid` values (-1, 0, 1 as bytes) of 32-value block `ib` of an IQ1_S block
    /// at `x` (indices `qs[4 ib + l] | (bits 3l..3l+3 of qh[ib]) << 8`), and `qh[ib]`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ1_S block, `ib < 8`.
    #[inline(always)]
    unsafe fn iq1_s_grid(x: *const u8, ib: usize) -> (__m256i, u32) {
        let qs = x.add(2 + 4 * ib);
        let qh = u16::from_le_bytes([*x.add(34 + 2 * ib), *x.add(35 + 2 * ib)]) as usize;
        let g = |l: usize| IQ1S_GRID[*qs.add(l) as usize | ((qh >> (3 * l)) & 7) << 8] as i64;
        (_mm256_setr_epi64x(g(0), g(1), g(2), g(3)), qh as u32)
    }

    /// 32-value block `ib` of an IQ1_S block at `x` as the tiled kernel codes it: the weights
    /// `8 · grid + delta` (delta `-1` where bit 15 of `qh[ib]` is set, else `1`), a sign
    /// operand of ones, and the multiplier `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ1_S block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq1_s_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let (g, qh) = iq1_s_grid(x, ib);
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        let w = _mm256_add_epi8(
            _mm256_sign_epi8(_mm256_set1_epi8(8), g),
            _mm256_set1_epi8(delta),
        );
        let ls = (2 * ((qh >> 12) & 7) + 1) as i16;
        (w, _mm256_set1_epi8(1), _mm256_set1_epi16(ls))
    }

    /// `ggml_vec_dot_iq1_s_q8_K` (AVX2). Per 32-value block the grid values times the Q8_K
    /// bytes by the sign trick, times `2 ls + 1` (`madd`), into 8 i32 lanes; apart, the exact
    /// `sumi1 = Σ (2 ls + 1) · (±1) · (bsums[2 ib] + bsums[2 ib + 1])`. Per super-block
    /// `d = d_y·d_x`, `acc = fma(d, f32(lane), acc)`, `acc1 = fma(d, f32(sumi1), acc1)`; at the
    /// end `hsum_float_8(acc) + 0.125 · acc1`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ1_S blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq1_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ1_S_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        let mut acc1 = 0f32;
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ1_S_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let mut sumi = _mm256_setzero_si256();
            let mut sumi1 = 0i32;
            for ib in 0..8 {
                let (g, qh) = iq1_s_grid(x, ib);
                let ls = (2 * ((qh >> 12) & 7) + 1) as i16;
                let p = _mm256_madd_epi16(
                    maddubs_signed(g, load32(y.add(4 + 32 * ib))),
                    _mm256_set1_epi16(ls),
                );
                sumi = _mm256_add_epi32(sumi, p);
                let bs = |j: usize| {
                    i16::from_le_bytes([*y.add(260 + 2 * j), *y.add(261 + 2 * j)]) as i32
                };
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                sumi1 += (bs(2 * ib) + bs(2 * ib + 1)) * delta * ls as i32;
            }
            let d = f32_at(y) * f16_at(x);
            acc = fma_lanes(d, sumi, acc);
            acc1 = d.mul_add(sumi1 as f32, acc1);
        }
        hsum(acc) + 0.125 * acc1
    }

    /// Bytes of a `block_iq1_m`: `qs[32]`, `qh[16]`, `scales[8]` (no `d` field).
    const IQ1_M_BYTES: usize = 32 + 16 + 8;

    /// IQ1_M's super-block scale: the f16 assembled from the top nibbles of the four u16
    /// scales at `x + 48` (first u16 lowest).
    ///
    /// # Safety
    /// `x` a whole IQ1_M block.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq1_m_d(x: *const u8) -> f32 {
        let sc = |k: usize| u16::from_le_bytes([*x.add(48 + 2 * k), *x.add(49 + 2 * k)]);
        let bits =
            (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
        f16_to_f32(bits)
    }

    /// 32-value block `ib` of an IQ1_M block at `x`: the `iq1s_grid` values, the delta signs
    /// (`-1` bytes for the 8 values whose `qh` nibble has bit 3 set, else `1`) and the
    /// multipliers `2 ls + 1` of its first 16 values (i16 lanes 0..8) and last 16.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ1_M block, `ib < 8`.
    #[inline(always)]
    unsafe fn iq1_m_grid(x: *const u8, ib: usize) -> (__m256i, __m256i, __m256i) {
        let nib = |k: usize| ((*x.add(32 + k / 2) >> (4 * (k % 2))) & 0x0f) as usize;
        let g = |l: usize| {
            let k = 4 * ib + l;
            IQ1S_GRID[*x.add(k) as usize | (nib(k) & 7) << 8] as i64
        };
        let dl = |l: usize| {
            if nib(4 * ib + l) & 8 != 0 {
                -1i64
            } else {
                0x0101_0101_0101_0101
            }
        };
        let sc = u16::from_le_bytes([*x.add(48 + 2 * (ib / 2)), *x.add(49 + 2 * (ib / 2))]);
        let sh = 6 * (ib % 2);
        let lo = _mm_set1_epi16(2 * ((sc >> sh) & 7) as i16 + 1);
        let hi = _mm_set1_epi16(2 * ((sc >> (sh + 3)) & 7) as i16 + 1);
        (
            _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            _mm256_setr_epi64x(dl(0), dl(1), dl(2), dl(3)),
            _mm256_set_m128i(hi, lo),
        )
    }

    /// 32-value block `ib` of an IQ1_M block at `x` as the tiled kernel codes it: the weights
    /// `8 · grid + delta` (delta ±1 per 8 values), a sign operand of ones, and the per-16
    /// multipliers `2 ls + 1`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `x` a whole IQ1_M block, `ib < 8`.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq1_m_parts(
        x: *const u8,
        ib: usize,
    ) -> (__m256i, __m256i, __m256i) {
        let (g, delta, scales) = iq1_m_grid(x, ib);
        let w = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta);
        (w, _mm256_set1_epi8(1), scales)
    }

    /// `ggml_vec_dot_iq1_m_q8_K` (AVX2). Per 32-value block: the grid values times the Q8_K
    /// bytes by the sign trick, and the activation bytes with each 8 values' delta sign
    /// applied (`_mm256_sign_epi8`) added in pairs, each times its 16 values' `2 ls + 1`
    /// (`madd`), into two sets of 8 i32 lanes; per super-block `d = d_y·d`,
    /// `acc1 = fma(d, f32(lane1), acc1)`, `acc2 = fma(d, f32(lane2), acc2)`; at the end
    /// `fma(hsum_float_8(acc2), 0.125, hsum_float_8(acc1))`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ1_M blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq1_m_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ1_M_BYTES).min(a.len() / Q8_K_BYTES);
        let ones = _mm256_set1_epi8(1);
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ1_M_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let mut s1 = _mm256_setzero_si256();
            let mut s2 = _mm256_setzero_si256();
            for ib in 0..8 {
                let (g, delta, scales) = iq1_m_grid(x, ib);
                let yv = load32(y.add(4 + 32 * ib));
                let p1 = _mm256_madd_epi16(maddubs_signed(g, yv), scales);
                let p2 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(ones, _mm256_sign_epi8(yv, delta)),
                    scales,
                );
                s1 = _mm256_add_epi32(s1, p1);
                s2 = _mm256_add_epi32(s2, p2);
            }
            let d = f32_at(y) * iq1_m_d(x);
            acc1 = fma_lanes(d, s1, acc1);
            acc2 = fma_lanes(d, s2, acc2);
        }
        hsum(acc2).mul_add(0.125, hsum(acc1))
    }

    /// Bytes of a `block_iq2_xs`: f16 `d`, `qs[32]` (u16), `scales[8]`.
    const IQ2_XS_BYTES: usize = 2 + 64 + 8;

    /// `ggml_vec_dot_iq2_xxs_q8_K` (AVX2): [`grid_lanes`] per super-block,
    /// `acc = fma(d_x·d_y, f32(lane), acc)`; `0.125 · hsum_float_8(acc)` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ2_XXS blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq2_xxs_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ2_XXS_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ2_XXS_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            acc = fma_lanes(d, grid_lanes(x, y.add(4), iq2_xxs_parts), acc);
        }
        0.125 * hsum(acc)
    }

    /// `ggml_vec_dot_iq3_s_q8_K` (AVX2): [`grid_lanes`] per super-block,
    /// `acc = fma(d_x·d_y, f32(lane), acc)`; `hsum_float_8(acc)` at the end.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole IQ3_S blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq3_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / IQ3_S_BYTES).min(a.len() / Q8_K_BYTES);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * IQ3_S_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f16_at(x) * f32_at(y);
            acc = fma_lanes(d, grid_lanes(x, y.add(4), iq3_s_parts), acc);
        }
        hsum(acc)
    }

    /// The 32 grid magnitudes of an IQ3_XXS 32-value block: `iq3xxs_grid` of the eight
    /// index bytes at `q3`, each entry's 4 bytes in order.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines; `q3` valid for 8 bytes.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn iq3_xxs_magnitudes(q3: *const u8) -> __m256i {
        let g = |k: usize| IQ3XXS_GRID[*q3.add(k) as usize] as i32;
        _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7))
    }

    /// Per value of a 32-value block, `-1` (0xFF) where the value is negative and `1`
    /// otherwise, from the four 7-bit `ksigns_iq2xs` indices in bits 0..28 of `aux` (index
    /// `l` for values `8l .. 8l + 8`): a `_mm256_sign_epi8` operand.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines.
    #[inline(always)]
    pub(in crate::handwritten) unsafe fn sign_bytes(aux: u32) -> __m256i {
        let s = |l: u32| SIGNS64[((aux >> (7 * l)) & 127) as usize] as i64;
        _mm256_setr_epi64x(s(0), s(1), s(2), s(3))
    }

    /// [`ir::ggml::grids::KSIGNS_IQ2XS`] as 8 bytes each, `0xFF` for a set bit and `0x01`
    /// for a clear one.
    static SIGNS64: [u64; 128] = {
        let mut t = [0u64; 128];
        let mut k = 0;
        while k < 128 {
            let s = KSIGNS_IQ2XS[k];
            let mut j = 0;
            while j < 8 {
                let byte: u64 = if s & (1 << j) != 0 { 0xff } else { 0x01 };
                t[k] |= byte << (8 * j);
                j += 1;
            }
            k += 1;
        }
        t
    };

    /// Bytes of a `block_tq1_0`: `qs[48]` (five base-3 digits a byte), `qh[4]` (four), f16 `d`.
    const TQ1_0_BYTES: usize = 48 + 4 + 2;
    /// Bytes of a `block_tq2_0`: `qs[64]` (four 2-bit digits a byte), f16 `d`.
    const TQ2_0_BYTES: usize = 64 + 2;

    /// Digit `n` of every byte `q` of a TQ1_0 vector, `((q · 3^n mod 256) · 3) >> 8` (0..2),
    /// with `3^n` given per i16 lane in `pow` (the two bytes of a lane share it): the even
    /// byte's `q · 3^n` by `mullo` (its low byte), moved to the top of the lane; the odd
    /// byte's already there after masking; `mulhi` by 3 of `m << 8` is `(m · 3) >> 8`.
    ///
    /// # Safety
    /// Only from this module's `avx2,fma,f16c` routines (the host has those features).
    #[inline(always)]
    unsafe fn ternary_digits(q: __m256i, pow: __m256i) -> __m256i {
        let three = _mm256_set1_epi16(3);
        let even = _mm256_slli_epi16(_mm256_mullo_epi16(q, pow), 8);
        let odd = _mm256_mullo_epi16(_mm256_and_si256(q, _mm256_set1_epi16(-256)), pow);
        _mm256_or_si256(
            _mm256_mulhi_epu16(even, three),
            _mm256_slli_epi16(_mm256_mulhi_epu16(odd, three), 8),
        )
    }

    /// `ggml_vec_dot_tq1_0_q8_K` (AVX2). Per super-block: the unsigned digits (0..2) times
    /// the Q8_K bytes by `maddubs`, value `v` (activation byte `v`) in i16 lane `(v % 32) / 2`,
    /// summed in i16; the Q8_K `bsums` subtracted (the `- 1` of every digit), wrapping; i16
    /// lanes added in pairs into 8 i32 lanes; `acc = fma(d_y·d_x, f32(lane), acc)`;
    /// `hsum_float_8` at the end (`ir::ggml::vec_dot_avx2`'s TQ1_0 order).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole TQ1_0 blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tq1_0_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / TQ1_0_BYTES).min(a.len() / Q8_K_BYTES);
        const POW3: [i16; 5] = [1, 3, 9, 27, 81];
        let pows = POW3.map(|p| _mm256_set1_epi16(p));
        // Two digits of qs[32..48] per vector: 3^(2k) in the low half, 3^(2k+1) in the high.
        let pow01 = _mm256_setr_epi16(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
        let pow23 = _mm256_setr_epi16(9, 9, 9, 9, 9, 9, 9, 9, 27, 27, 27, 27, 27, 27, 27, 27);
        // Digit 4 of qs[32..48] in the low half; in the high half qh repeated four times,
        // bytes 4n..4n+4 (i16 lanes 2n, 2n+1) taking digit n.
        let pow45 = _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * TQ1_0_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f32_at(y) * f16_at(x.add(52));
            let q8 = y.add(4);
            let q = load32(x);
            let mut s16 = _mm256_setzero_si256();
            for (n, pow) in pows.iter().enumerate() {
                let p = _mm256_maddubs_epi16(ternary_digits(q, *pow), load32(q8.add(32 * n)));
                s16 = _mm256_add_epi16(s16, p);
            }
            let tail = _mm_loadu_si128(x.add(32) as *const __m128i);
            let both = _mm256_broadcastsi128_si256(tail);
            let with_qh = _mm256_inserti128_si256(
                _mm256_castsi128_si256(tail),
                _mm_set1_epi32(u32_at(x.add(48)) as i32),
                1,
            );
            for (k, (v, pow)) in [(both, pow01), (both, pow23), (with_qh, pow45)]
                .into_iter()
                .enumerate()
            {
                let p = _mm256_maddubs_epi16(ternary_digits(v, pow), load32(q8.add(160 + 32 * k)));
                s16 = _mm256_add_epi16(s16, p);
            }
            s16 = _mm256_sub_epi16(s16, load32(y.add(260)));
            acc = fma_lanes(d, pairs(s16), acc);
        }
        hsum(acc)
    }

    /// `ggml_vec_dot_tq2_0_q8_K` (AVX2): as [`tq1_0_q8_k`], the digits being the 2-bit
    /// fields of TQ2_0 (bits `2l..2l+2` of byte `32h + m` are value `128h + 32l + m`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w` whole TQ2_0 blocks, `a` as many Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tq2_0_q8_k(w: &[u8], a: &[u8]) -> f32 {
        let nb = (w.len() / TQ2_0_BYTES).min(a.len() / Q8_K_BYTES);
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let x = w.as_ptr().add(b * TQ2_0_BYTES);
            let y = a.as_ptr().add(b * Q8_K_BYTES);
            let d = f32_at(y) * f16_at(x.add(64));
            let q8 = y.add(4);
            let mut s16 = _mm256_setzero_si256();
            for h in 0..2 {
                let q = load32(x.add(32 * h));
                let q8h = q8.add(128 * h);
                let d0 = _mm256_and_si256(q, m3);
                let d1 = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
                let d2 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
                let d3 = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
                let p01 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(d0, load32(q8h)),
                    _mm256_maddubs_epi16(d1, load32(q8h.add(32))),
                );
                let p23 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(d2, load32(q8h.add(64))),
                    _mm256_maddubs_epi16(d3, load32(q8h.add(96))),
                );
                s16 = _mm256_add_epi16(s16, _mm256_add_epi16(p01, p23));
            }
            s16 = _mm256_sub_epi16(s16, load32(y.add(260)));
            acc = fma_lanes(d, pairs(s16), acc);
        }
        hsum(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::{
        block_format, quantize_activations, vec_dot, vec_dot_type, FieldKind, Q8Flavor,
    };

    fn rng(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Every type with a routine, with the byte offsets of its f16 scale fields (`d`, and
    /// `m` / `dmin` where it has one).
    const TYPES: [(GgmlType, &[usize]); 21] = [
        (GgmlType::Q5_0, &[0]),
        (GgmlType::Q4_1, &[0, 2]),
        (GgmlType::Q8_0, &[0]),
        (GgmlType::Q5_1, &[0, 2]),
        (GgmlType::IQ4_NL, &[0]),
        (GgmlType::Q2_K, &[80, 82]),
        (GgmlType::Q3_K, &[108]),
        (GgmlType::Q4_K, &[0, 2]),
        (GgmlType::Q5_K, &[0, 2]),
        (GgmlType::Q6_K, &[208]),
        (GgmlType::IQ4_XS, &[0]),
        (GgmlType::TQ1_0, &[52]),
        (GgmlType::TQ2_0, &[64]),
        (GgmlType::IQ3_XXS, &[0]),
        (GgmlType::IQ3_S, &[0]),
        (GgmlType::IQ2_XXS, &[0]),
        (GgmlType::IQ2_XS, &[0]),
        (GgmlType::IQ2_S, &[0]),
        (GgmlType::IQ1_S, &[0]),
        (GgmlType::IQ1_M, &[]),
        (GgmlType::MXFP4, &[]),
    ];

    /// Random whole blocks of `t` with finite, moderate f16 scales at the offsets listed.
    fn random_row(t: GgmlType, blocks: usize, f16_at: &[usize], seed: &mut u64) -> Vec<u8> {
        let mut row: Vec<u8> = (0..blocks * t.type_size())
            .map(|_| rng(seed) as u8)
            // Q8_0 weights are -127..127 (ggml's quantizer never writes -128, where the
            // sign trick of the x86 kernels and the exact products of the reference differ).
            .map(|b| {
                if t == GgmlType::Q8_0 && b == 0x80 {
                    0x81
                } else {
                    b
                }
            })
            .collect();
        for b in 0..blocks {
            for &o in f16_at {
                let sign = if rng(seed).is_multiple_of(5) {
                    -1.0
                } else {
                    1.0
                };
                let v = half::f16::from_f32(sign * ((rng(seed) % 1000) as f32 / 20000.0 + 1e-3));
                row[b * t.type_size() + o..][..2].copy_from_slice(&v.to_le_bytes());
            }
        }
        if t == GgmlType::MXFP4 {
            // E8M0 exponents for scales 2^-10 .. 2 (random bytes reach 2^127).
            for blk in row.chunks_exact_mut(t.type_size()) {
                blk[0] = 118 + (rng(seed) % 12) as u8;
            }
        }
        if t == GgmlType::IQ1_M {
            for blk in row.chunks_exact_mut(t.type_size()) {
                let v = half::f16::from_f32((rng(seed) % 1000) as f32 / 20000.0 + 1e-3);
                for k in 0..4 {
                    let at = 48 + 2 * k;
                    let sc = u16::from_le_bytes([blk[at], blk[at + 1]]);
                    let sc = (sc & 0x0fff) | (((v.to_bits() >> (4 * k)) & 0x0f) << 12);
                    blk[at..at + 2].copy_from_slice(&sc.to_le_bytes());
                }
            }
        }
        row
    }

    /// A raw activation row of `act` blocks: random bytes everywhere (quants at -128 too,
    /// sums unrelated to the quants) except a moderate scale (f16 `d` and `s` of Q8_0 / Q8_1,
    /// f32 `d` of Q8_K).
    fn raw_act(act: GgmlType, blocks: usize, seed: &mut u64) -> Vec<u8> {
        let size = act.type_size();
        let mut row: Vec<u8> = (0..blocks * size).map(|_| rng(seed) as u8).collect();
        for blk in row.chunks_exact_mut(size) {
            let d = (rng(seed) % 1000) as f32 / 50000.0 + 1e-4;
            if act == GgmlType::Q8_K {
                blk[..4].copy_from_slice(&d.to_le_bytes());
            } else {
                blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                if act == GgmlType::Q8_1 {
                    let s = half::f16::from_f32(d * ((rng(seed) % 4001) as f32 - 2000.0));
                    blk[2..4].copy_from_slice(&s.to_le_bytes());
                }
            }
        }
        row
    }

    /// The f16 offsets listed are those of the format description.
    #[test]
    fn listed_scale_offsets_are_the_formats() {
        for (t, f16_at) in TYPES {
            let f = block_format(t).expect("described");
            let mut want: Vec<usize> = f
                .fields
                .iter()
                .filter(|f| {
                    matches!(
                        f.kind,
                        FieldKind::Scale(ir::ggml::ScalarKind::F16)
                            | FieldKind::Min(ir::ggml::ScalarKind::F16)
                            | FieldKind::MinScale(ir::ggml::ScalarKind::F16)
                    )
                })
                .map(|f| f.offset)
                .collect();
            want.sort_unstable();
            assert_eq!(f16_at, &want[..], "{}", t.name());
        }
    }

    /// The four-row forms (decode) give each row what the one-row routine gives (random
    /// rows and raw activations).
    #[test]
    fn four_row_routines_match_one() {
        let mut seed = 0x4a11_u64;
        for_each_case(&mut seed, |seed, t, f16_at, isa, blocks| {
            let (Some(f), Some(f4r)) = (dot_fn_on(t, isa), dot4rows_fn(t, isa.tier())) else {
                return;
            };
            let act_t = vec_dot_type(t).expect("has a vec_dot_type");
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| random_row(t, blocks, f16_at, seed))
                .collect();
            let ws: [&[u8]; 4] = std::array::from_fn(|r| &rows[r][..]);
            let a = raw_act(act_t, blocks * t.block_size() / act_t.block_size(), seed);
            // SAFETY: both chosen for this host; whole rows of equal length.
            let got = unsafe { f4r(&ws, &a) };
            for (r, v) in got.iter().enumerate() {
                // SAFETY: as above.
                let want = unsafe { f(ws[r], &a) };
                assert_eq!(v.to_bits(), want.to_bits(), "{} 4 rows, row {r}", t.name());
            }
        });
    }

    /// Runs `case(seed, type, its f16 offsets, isa, blocks)` 100 times for each type of
    /// [`TYPES`], each build this host runs, and rows of 1, 3 and 18 blocks.
    fn for_each_case(
        seed: &mut u64,
        mut case: impl FnMut(&mut u64, GgmlType, &[usize], Isa, usize),
    ) {
        for isa in host_isas() {
            for (t, f16_at) in TYPES {
                for blocks in [1usize, 3, 18] {
                    for _ in 0..100 {
                        case(seed, t, f16_at, isa, blocks);
                    }
                }
            }
        }
    }

    /// The four-column forms give each column what the one-column routine gives (random
    /// quantized and raw activations).
    #[test]
    fn four_column_routines_match_one() {
        let mut seed = 0x5151_u64;
        for_each_case(&mut seed, |seed, t, f16_at, isa, blocks| {
            let (Some(f), Some(f4)) = (dot_fn_on(t, isa), dot4_fn_on(t, isa)) else {
                return;
            };
            let act_t = vec_dot_type(t).expect("has a vec_dot_type");
            let n_act = blocks * t.block_size() / act_t.block_size();
            let w = random_row(t, blocks, f16_at, seed);
            let acts: Vec<Vec<u8>> = (0..8).map(|_| raw_act(act_t, n_act, seed)).collect();
            let a8: [&[u8]; 8] = std::array::from_fn(|c| &acts[c][..]);
            let a: [&[u8]; 4] = std::array::from_fn(|c| a8[c]);
            // SAFETY: both chosen for this host; whole rows of equal length.
            let got = unsafe { f4(&w, &a) };
            for c in 0..4 {
                // SAFETY: as above.
                let want = unsafe { f(&w, a[c]) };
                assert_eq!(got[c].to_bits(), want.to_bits(), "{} column {c}", t.name());
            }
            let more: Vec<Vec<u8>> = (0..3)
                .map(|_| random_row(t, blocks, f16_at, seed))
                .collect();
            let ws: [&[u8]; 4] = [&w, &more[0], &more[1], &more[2]];
            let check = |got: &[[f32; 4]], what: &str| {
                for (c, col) in got.iter().enumerate() {
                    for (r, v) in col.iter().enumerate() {
                        // SAFETY: as above.
                        let want = unsafe { f(ws[r], a8[c]) };
                        assert_eq!(v.to_bits(), want.to_bits(), "{} {what} r{r} c{c}", t.name());
                    }
                }
            };
            if let Some(f44) = dot4x4_fn_on(t, isa) {
                // SAFETY: as above.
                check(&unsafe { f44(&ws, &a) }, "4x4");
            }
            if let (Isa::Vnni, Some(f48)) = (isa, packed4x8_fn(t, crate::target::Tier::host())) {
                let mut panel = vec![0u8; blocks * f48.block_bytes];
                // SAFETY: as above; the panel holds `blocks` packed blocks.
                let got = unsafe {
                    (f48.pack)(&a8, blocks, panel.as_mut_ptr());
                    (f48.tile)(&ws, panel.as_ptr(), blocks)
                };
                check(&got, "4x8");
            }
        });
    }

    /// Speed of Q5_0 and Q4_1 tile shapes on hot data (weights 576 × 1536, 32 tokens), for
    /// each build the host can run:
    /// `cargo test --release -p codegen-cpu --lib tile_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    #[cfg(target_arch = "x86_64")]
    fn tile_speed() {
        type Probe<const R: usize, const C: usize> =
            unsafe fn(&[&[u8]; R], &[&[u8]; C]) -> [[f32; R]; C];
        fn run<const R: usize, const C: usize>(
            f: Probe<R, C>,
            w: &[Vec<u8>],
            acts: &[Vec<u8>],
        ) -> f64 {
            let mut best = f64::MAX;
            let mut sink = 0f32;
            for _ in 0..150 {
                let t0 = std::time::Instant::now();
                for r in (0..w.len()).step_by(R) {
                    let ws: [&[u8]; R] = std::array::from_fn(|i| &w[r + i][..]);
                    for c in (0..acts.len()).step_by(C) {
                        let a: [&[u8]; C] = std::array::from_fn(|i| &acts[c + i][..]);
                        // SAFETY: the probe's build is one the host has; whole rows.
                        let o = unsafe { f(&ws, &a) };
                        sink += o[0][0];
                    }
                }
                best = best.min(t0.elapsed().as_secs_f64());
            }
            std::hint::black_box(sink);
            (w.len() * acts.len() * 576) as f64 / best / 1e9
        }
        let (k, m, n) = (576usize, 1536usize, 32usize);
        for isa in host_isas() {
            for (t, act_t, f16_at) in [
                (GgmlType::Q5_0, GgmlType::Q8_0, &[0usize][..]),
                (GgmlType::Q4_1, GgmlType::Q8_1, &[0, 2]),
            ] {
                let mut seed = 7u64;
                let w: Vec<Vec<u8>> = (0..m)
                    .map(|_| random_row(t, k / 32, f16_at, &mut seed))
                    .collect();
                let acts: Vec<Vec<u8>> =
                    (0..n).map(|_| raw_act(act_t, k / 32, &mut seed)).collect();
                macro_rules! shape {
                    ($r:literal, $c:literal) => {{
                        let f: Probe<$r, $c> = match (isa, t) {
                            (Isa::Avx2, GgmlType::Q5_0) => x86::avx2::q5_0_tile_speed_probe,
                            (Isa::Vnni, GgmlType::Q5_0) => x86::vnni::q5_0_tile_speed_probe,
                            (Isa::Avx2, _) => x86::avx2::q4_1_tile_speed_probe,
                            (Isa::Vnni, _) => x86::vnni::q4_1_tile_speed_probe,
                        };
                        let g = run::<$r, $c>(f, &w, &acts);
                        eprintln!("{isa:?} {} {}x{}: {g:.1} GMAC/s", t.name(), $r, $c);
                    }};
                }
                shape!(1, 1);
                shape!(4, 1);
                shape!(1, 4);
                shape!(2, 4);
                shape!(4, 2);
                shape!(4, 4);
                shape!(2, 8);
                shape!(4, 8);
            }
        }
    }

    /// Every routine agrees with ggml's scalar dot product of the type to rounding (same
    /// maths, another order), and with `ir::ggml::vec_dot_avx2` (the same order) bit for bit;
    /// with 1, 2, 3 and 8 blocks (super-blocks for the K-quants), on quantized activations
    /// and on raw random activation blocks (bit for bit only: there ggml's sign trick turns
    /// `-128` products around, which the scalar code does not).
    #[test]
    fn routines_match_the_references() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let isas = host_isas();
        for (t, f16_at, isa) in isas.iter().flat_map(|&isa| TYPES.map(|(t, f)| (t, f, isa))) {
            let Some(f) = dot_fn_on(t, isa) else {
                eprintln!("no hand-written routine for {} on this host", t.name());
                continue;
            };
            let act_t = vec_dot_type(t).expect("has a vec_dot_type");
            let bs = t.block_size();
            let mut differ = 0;
            for blocks in [1usize, 2, 3, 8] {
                for _ in 0..200 {
                    let w = random_row(t, blocks, f16_at, &mut seed);
                    let x: Vec<f32> = (0..blocks * bs)
                        .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).expect("quantizes");
                    // SAFETY: `dot_fn` chose it for this host; whole rows of equal length.
                    let got = unsafe { f(&w, &act) };
                    let scalar = vec_dot(t, &w, &act).expect("scalar dot");
                    // Rounding scales with the terms summed, not with their (cancelling) sum.
                    let mut wf = vec![0f32; blocks * bs];
                    ir::ggml::dequantize(t, &w, &mut wf).expect("dequantizes");
                    let mag: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                    assert!(
                        (got - scalar).abs() <= 1e-4 * mag.max(1.0),
                        "{} {blocks} blocks: {got} vs scalar {scalar}",
                        t.name()
                    );
                    let x86 = ir::ggml::vec_dot_avx2(t, &w, &act).expect("x86 reference");
                    assert_eq!(
                        got.to_bits(),
                        x86.to_bits(),
                        "{} {blocks} blocks: {got} vs {x86}",
                        t.name()
                    );
                    differ += (got.to_bits() != scalar.to_bits()) as usize;

                    let mut raw = raw_act(act_t, blocks * bs / act_t.block_size(), &mut seed);
                    if t == GgmlType::Q8_0 {
                        // ir's Q8_0 reference multiplies exactly; ggml's sign trick differs
                        // only on a -128 activation byte, which its quantizer never writes.
                        for blk in raw.chunks_exact_mut(34) {
                            blk[2..]
                                .iter_mut()
                                .filter(|b| **b == 0x80)
                                .for_each(|b| *b = 0x81);
                        }
                    }
                    // SAFETY: as above.
                    let got = unsafe { f(&w, &raw) };
                    let x86 = ir::ggml::vec_dot_avx2(t, &w, &raw).expect("x86 reference");
                    assert_eq!(
                        got.to_bits(),
                        x86.to_bits(),
                        "{} {blocks} blocks, raw activations: {got} vs {x86}",
                        t.name()
                    );
                }
            }
            assert!(
                differ > 0,
                "{}: never differs from the scalar order",
                t.name()
            );
        }
    }
}
