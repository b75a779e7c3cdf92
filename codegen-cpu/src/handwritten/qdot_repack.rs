//! Dot products in the order of llama.cpp's *repacked* x86 kernels, for the weights its AVX2
//! build interleaves at load time (Q4_0, IQ4_NL, MXFP4, Q4_K with `ne[1] % 8 == 0`:
//! `ir::ggml::repacked_by_llama_cpp`). Those kernels (`ggml_gemv_*_8x8_*` /
//! `ggml_gemm_*_8x8_*`, ggml-cpu/arch/x86/repack.cpp) add each block's exact integer sum
//! into one f32 accumulator per output instead of the eight lanes of `ggml_vec_dot_*`:
//!
//! - Q4_0 / IQ4_NL / MXFP4 × Q8_0 (gemv and gemm alike): `acc = fma(isum_b, dx_b · dy_b,
//!   acc)` over the 32-value blocks `b` (MXFP4's `dx_b = 2^(e - 128)`);
//! - Q4_K × Q8_K: per super-block, gemv: `acc = fma(Σ_j sc_j·isum_j, d·dy, acc)` and
//!   `acc_min = fma(Σ_j m_j·bsum_j, dmin·dy, acc_min)` over its 8 sub-blocks `j`; gemm: the
//!   same with one fma per pair of sub-blocks; the result `acc - acc_min`.
//!
//! We do not interleave: every output depends on one weight row and one activation column,
//! so the row-dot kernels read ggml's rows in place and compute these orders per row (the
//! module doc of `ir::ggml`'s `repack_x86` has the details and how they were checked). The
//! AVX2 routines here are checked bit for bit against `ir::ggml::RepackedRow::dot`, which is
//! also the plain path on other hosts.

use ir::ggml::{GgmlType, RepackKernel, RepackedRow};

use crate::target::Tier;

#[cfg(target_arch = "x86_64")]
use super::qdot_amx;

/// A repacked-order dot product of two whole rows; the kernel (gemv or gemm) chooses the
/// order for Q4_K.
///
/// # Safety
/// The host must have the CPU features the routine was chosen for ([`dot_fn`] checks), and
/// the rows must be whole rows of the weight type and its activation type of equal length.
pub(crate) type RepackDotFn = unsafe fn(&[u8], &[u8], RepackKernel) -> f32;

/// The AVX2 routine for `wtype` on this host, if there is one.
pub(crate) fn dot_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDotFn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() {
        return match wtype {
            GgmlType::Q4_0 => Some(x86::q4_0),
            GgmlType::IQ4_NL => Some(x86::iq4_nl),
            GgmlType::MXFP4 => Some(x86::mxfp4),
            GgmlType::Q4_K => Some(x86::q4_k),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Eight rows at once in the same order (each lane one row's chain of fused multiply-adds,
/// as llama.cpp's interleaved kernels keep them): `out[i]` is what [`RepackDotFn`] gives for
/// row `i` and the gemv kernel. Q4_0, IQ4_NL and MXFP4 only (their gemm and gemv orders
/// agree).
///
/// # Safety
/// As [`RepackDotFn`], for each of the eight rows.
pub(crate) type RepackDot8Fn = unsafe fn(&[&[u8]; 8], &[u8]) -> [f32; 8];

/// The eight-row AVX2 routine for `wtype` on this host, if there is one.
pub(crate) fn dot8_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot8Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() {
        return match wtype {
            GgmlType::Q4_0 => Some(x86::q4_0_x8),
            GgmlType::IQ4_NL => Some(x86::iq4_nl_x8),
            GgmlType::MXFP4 => Some(x86::mxfp4_x8),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Four activation columns at once: `out[c]` is what [`RepackDotFn`] gives for the row,
/// column `a[c]` and the kernel (the weight's blocks are unpacked once for the four).
///
/// # Safety
/// As [`RepackDotFn`], for each column.
pub(crate) type RepackDot4Fn = unsafe fn(&[u8], &[&[u8]; 4], RepackKernel) -> [f32; 4];

/// The four-column AVX2 routine for `wtype` on this host, if there is one (Q4_K: Q4_0 and
/// IQ4_NL take [`RepackDot8x4Fn`]).
pub(crate) fn dot4_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot4Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() && wtype == GgmlType::Q4_K {
        return Some(x86::q4_k_x4);
    }
    let _ = (wtype, tier);
    None
}

/// Four rows × four columns: `out[c][r]` is what [`RepackDotFn`] gives for row `w[r]`,
/// column `a[c]` and the kernel.
///
/// # Safety
/// As [`RepackDotFn`], for each pair.
pub(crate) type RepackDot4x4Fn = unsafe fn(&[&[u8]; 4], &[&[u8]; 4], RepackKernel) -> [[f32; 4]; 4];

/// The four-row, four-column AVX2 routine for `wtype` on this host, if there is one (Q4_K).
pub(crate) fn dot4x4_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot4x4Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() && wtype == GgmlType::Q4_K {
        return Some(x86::q4_k_4x4);
    }
    let _ = (wtype, tier);
    None
}

/// The four-row routine of the gemv order ([`RepackKernel::Gemv`]) for `wtype` on this
/// host, if there is one (Q4_K with AVX-512 VNNI and VBMI): `out[r]` is what
/// [`RepackDotFn`] gives for row `w[r]`, the activation row and the gemv kernel (a decode
/// token's product; llama.cpp's gemv for the last `ncols % 4` columns). Safety: as
/// [`RepackDotFn`], for each row.
pub(crate) fn gemv4rows_fn(wtype: GgmlType, tier: Tier) -> Option<super::qdot::Dot4RowsFn> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() && tier.vbmi() && wtype == GgmlType::Q4_K {
        return Some(x86::q4_k_gemv_4rows);
    }
    let _ = (wtype, tier);
    None
}

/// Eight rows × four columns: `out[c][i]` is what [`RepackDot8Fn`] gives for row `i` and
/// column `a[c]` (llama.cpp's gemm tile: each weight block is unpacked once for the four
/// columns). Q4_0, IQ4_NL and MXFP4 only.
///
/// # Safety
/// As [`RepackDot8Fn`], for each column.
pub(crate) type RepackDot8x4Fn = unsafe fn(&[&[u8]; 8], &[&[u8]; 4]) -> [[f32; 8]; 4];

/// The eight-row, four-column AVX2 routine for `wtype` on this host, if there is one.
pub(crate) fn dot8x4_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot8x4Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.avx2() {
        return match wtype {
            GgmlType::Q4_0 => Some(x86::q4_0_x8x4),
            GgmlType::IQ4_NL => Some(x86::iq4_nl_x8x4),
            GgmlType::MXFP4 => Some(x86::mxfp4_x8x4),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Eight rows × eight columns in the gemm kernel's order: `out[c][i]` is what
/// [`RepackDotFn`] gives for row `w[i]`, column `a[c]` and [`RepackKernel::Gemm`]. Q4_0,
/// IQ4_NL and Q4_K, on hosts with AVX-512 VNNI (`super::has_vnni`): the exact integer sums
/// come from `vpdpbusd` with the eight columns in the lanes (the activation blocks
/// transposed once per block for the eight rows, each weight row's four bytes at a time
/// broadcast against them), about half the instructions of the four-column tiles, whose
/// lanes are per row and need a horizontal sum per pair.
///
/// # Safety
/// As [`RepackDotFn`], for each pair.
pub(crate) type RepackDot8x8Fn = unsafe fn(&[&[u8]; 8], &[&[u8]; 8]) -> [[f32; 8]; 8];

/// The eight-row, eight-column routine for `wtype` on this host, if there is one.
pub(crate) fn dot8x8_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot8x8Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q4_0 => Some(x86::q4_0_x8x8),
            GgmlType::IQ4_NL => Some(x86::iq4_nl_x8x8),
            GgmlType::Q4_K if tier.vnni() => Some(x86::q4_k_gemm_x8x8),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Eight rows × eight columns in the *block* order (`--kernels fast`, not llama.cpp's):
/// per 32-value block the exact integer sum of products, then `acc = fma(isum, d_x·d_y,
/// acc)` and, for Q4_1 / Q5_1, `acc = fma(m_x, s_y, acc)`; within rounding of
/// `ggml_vec_dot_*`. Q4_1, Q5_0, Q5_1 and Q8_0 (the types whose exact decode routines the
/// fast mode keeps for one token), on hosts with AVX-512 VNNI; the same
/// columns-in-lanes tile as [`dot8x8_fn`].
pub(crate) fn block_dot8x8_fn(wtype: GgmlType, tier: Tier) -> Option<RepackDot8x8Fn> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q4_1 => Some(x86::q4_1_block_x8x8),
            GgmlType::Q5_0 => Some(x86::q5_0_block_x8x8),
            GgmlType::Q5_1 => Some(x86::q5_1_block_x8x8),
            GgmlType::Q8_0 => Some(x86::q8_0_block_x8x8),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// Eight weight rows × sixteen activation columns packed once per chunk of tokens, the
/// columns in the lanes of 512-bit vectors: `tile(w, panel, nb)[c][i]` is what
/// [`RepackDot8x8Fn`] (or the block order's tile) gives for row `w[i]` (`nb` blocks) and
/// column `c` of the sixteen activation rows `pack(a, nb, panel)` packed into `panel`
/// (`block_bytes` per block). Both routines' safety contract is [`RepackDotFn`]'s, for each
/// pair, with `panel` holding `nb` packed blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed8x16 {
    pub pack: Pack16Fn,
    pub tile: Tile8x16Fn,
    /// Panel bytes per activation block (sixteen columns).
    pub block_bytes: usize,
    /// Whether the tile is the gemm kernel's order only (Q4_K): columns that llama.cpp's
    /// gemv computes (past the last whole four of its `ncols`) must not take it.
    pub gemm_only: bool,
    /// For a gemm-only tile, the same form in the gemv kernel's order (over the same
    /// panel), for those columns — all of them in a batched decode step: for the sixteen
    /// columns, and for the first eight only (zeros after them).
    pub gemv: Option<[Tile8x16Fn; 2]>,
    /// Sixteen rows against all of a chunk's panels at once, where the type has that form
    /// on this host (the K-quants with AMX: `qdot_amx`); it then takes every column the
    /// tiles would, in the same orders.
    pub rows16: Option<Rows16Fn>,
}

/// [`Packed8x16::pack`]: sixteen activation rows of `nb` blocks into a panel.
pub(crate) type Pack16Fn = unsafe fn(&[&[u8]; 16], usize, *mut u8);

/// [`Packed8x16::tile`]: eight weight rows against a panel of `nb` blocks, `out[c][i]`.
pub(crate) type Tile8x16Fn = unsafe fn(&[&[u8]; 8], *const u8, usize) -> [[f32; 8]; 16];

/// [`Packed8x16::rows16`]: `f(w, panel, nb, (g0, g1), gemv, out, out_stride, (rows, (c0,
/// c1)))` writes `out[c·out_stride + i]` for rows `i < rows` of the sixteen weight rows `w`
/// (rows past `rows` may repeat real ones) and columns `c0 ≤ c < c1` of groups `g0..g1`
/// (column `16·g + lane`) of the panels packed one after another at `panel` (`nb` blocks
/// each), in the gemm order of the tile, or with `gemv` in that of [`Packed8x16::gemv`].
/// Safety: as [`Tile8x16Fn`], for each of those pairs.
pub(crate) type Rows16Fn = unsafe fn(
    &[&[u8]; 16],
    *const u8,
    usize,
    (usize, usize),
    bool,
    *mut f32,
    usize,
    (usize, (usize, usize)),
);

/// The packed 8 × 16 form of [`dot8x8_fn`] for `wtype` on AVX-512 VNNI hosts: Q4_0 and
/// IQ4_NL (whose gemm and gemv orders agree) and Q4_K (gemm columns only: `gemm_only`).
pub(crate) fn packed8x16_fn(wtype: GgmlType, tier: Tier) -> Option<Packed8x16> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q4_0 => Some(b32_packed(x86::q4_0_pack16, x86::q4_0_x8x16)),
            GgmlType::IQ4_NL => Some(b32_packed(x86::iq4_nl_pack16, x86::iq4_nl_x8x16)),
            GgmlType::Q4_K if tier.vnni() => Some(Packed8x16 {
                pack: x86::q8_k_pack16,
                tile: x86::q4_k_gemm_x8x16,
                block_bytes: x86::Q8_K_PANEL16_BYTES,
                gemm_only: true,
                gemv: Some([x86::q4_k_gemv_x8x16, x86::q4_k_gemv_x8x8]),
                rows16: amx_rows16(qdot_amx::q4_k_rows16, tier),
            }),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// The packed 8 × 16 tile of llama.cpp's tiled K-quant order (`qdot_tiled`: the numbers of
/// `mul_mat` with 8 or more columns) for `wtype` on AVX-512 VNNI/BW hosts: Q2_K, Q3_K,
/// Q5_K, Q6_K, IQ4_XS and the grid I-quants (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
/// IQ1_M).
pub(crate) fn tiled_packed8x16_fn(wtype: GgmlType, tier: Tier) -> Option<Packed8x16> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q2_K => Some(tiled_packed_amx::<qdot_amx::Q2K>(
                x86::q2_k_tiled_x8x16,
                tier,
            )),
            GgmlType::Q3_K => Some(tiled_packed_amx::<qdot_amx::Q3K>(
                x86::q3_k_tiled_x8x16,
                tier,
            )),
            GgmlType::Q5_K => Some(tiled_packed_amx::<qdot_amx::Q5K>(
                x86::q5_k_tiled_x8x16,
                tier,
            )),
            GgmlType::IQ4_XS => Some(tiled_packed(x86::iq4_xs_tiled_x8x16)),
            GgmlType::IQ3_XXS => Some(tiled_packed(x86::iq3_xxs_tiled_x8x16)),
            GgmlType::IQ3_S => Some(tiled_packed(x86::iq3_s_tiled_x8x16)),
            GgmlType::IQ2_XXS => Some(tiled_packed(x86::iq2_xxs_tiled_x8x16)),
            GgmlType::IQ2_XS => Some(tiled_packed(x86::iq2_xs_tiled_x8x16)),
            GgmlType::IQ2_S => Some(tiled_packed(x86::iq2_s_tiled_x8x16)),
            GgmlType::IQ1_S => Some(tiled_packed(x86::iq1_s_tiled_x8x16)),
            GgmlType::IQ1_M => Some(tiled_packed(x86::iq1_m_tiled_x8x16)),
            GgmlType::Q6_K => Some(tiled_packed_amx::<qdot_amx::Q6K>(
                x86::q6_k_tiled_x8x16,
                tier,
            )),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// `f` where this host can run the sixteen-row AMX forms of `qdot_amx` (AMX-INT8 with the
/// kernel's permission; the callers checked AVX-512 VNNI/BW).
#[cfg(target_arch = "x86_64")]
fn amx_rows16(f: Rows16Fn, tier: Tier) -> Option<Rows16Fn> {
    tier.amx().then_some(f)
}

/// [`tiled_packed`] with the sixteen-row AMX form of format `F` where the host has it.
#[cfg(target_arch = "x86_64")]
fn tiled_packed_amx<F: qdot_amx::Format>(tile: Tile8x16Fn, tier: Tier) -> Packed8x16 {
    Packed8x16 {
        rows16: amx_rows16(qdot_amx::tiled_rows16::<F>, tier),
        ..tiled_packed(tile)
    }
}

/// A tiled-order tile over the Q8_K panel of [`x86::q8_k_pack16`].
#[cfg(target_arch = "x86_64")]
fn tiled_packed(tile: Tile8x16Fn) -> Packed8x16 {
    Packed8x16 {
        pack: x86::q8_k_pack16,
        tile,
        block_bytes: x86::Q8_K_PANEL16_BYTES,
        gemm_only: false,
        gemv: None,
        rows16: None,
    }
}

/// The packed 8 × 16 form of [`block_dot8x8_fn`] (the block order of `--kernels fast`).
pub(crate) fn block_packed8x16_fn(wtype: GgmlType, tier: Tier) -> Option<Packed8x16> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        return match wtype {
            GgmlType::Q4_1 => Some(b32_packed(x86::q4_1_block_pack16, x86::q4_1_block_x8x16)),
            GgmlType::Q5_0 => Some(b32_packed(x86::q5_0_block_pack16, x86::q5_0_block_x8x16)),
            GgmlType::Q5_1 => Some(b32_packed(x86::q5_1_block_pack16, x86::q5_1_block_x8x16)),
            GgmlType::Q8_0 => Some(b32_packed(x86::q8_0_block_pack16, x86::q8_0_block_x8x16)),
            _ => None,
        };
    }
    let _ = (wtype, tier);
    None
}

/// A [`Packed8x16`] of the 32-value block tiles (`x86::b32_x8x16`).
#[cfg(target_arch = "x86_64")]
fn b32_packed(pack: Pack16Fn, tile: Tile8x16Fn) -> Packed8x16 {
    Packed8x16 {
        pack,
        tile,
        block_bytes: x86::PANEL16_BLOCK_BYTES,
        gemm_only: false,
        gemv: None,
        rows16: None,
    }
}

/// The plain path: `ir::ggml::RepackedRow` (decodes the row, then dots).
pub(crate) fn dot_plain(wtype: GgmlType, w: &[u8], a: &[u8], kernel: RepackKernel) -> f32 {
    RepackedRow::new(wtype, w)
        .and_then(|r| r.dot(a, kernel))
        .unwrap_or(f32::NAN)
}

#[cfg(target_arch = "x86_64")]
pub(in crate::handwritten) mod x86 {
    use std::arch::x86_64::*;

    use super::super::qdot::x86::{
        f16_at, hsum4_i32_vec, iq1_m_d, iq1_m_parts, iq1_s_parts, iq2_s_parts, iq2_xs_parts,
        iq2_xxs_parts, iq3_s_parts, iq3_xxs_parts, k4_scales_mins_vec, nibbles32 as nibbles,
        q5_unsigned,
    };
    use super::super::qdot_tiled::x86::q3_k_scales;
    use ir::ggml::grids::KVALUES_MXFP4;
    use ir::ggml::{e8m0_to_f32_half, scale_min_k4, RepackKernel, KVALUES_IQ4NL};

    /// Σ of the 8 i32 lanes.
    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// Σ x_i·y_i over 32 signed bytes each (exact).
    #[inline(always)]
    unsafe fn isum_i8(x: __m256i, y: __m256i) -> i32 {
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }

    /// A 32-value weight block with one scale and 4-bit codes: its bytes, where `qs[16]`
    /// starts, and its scale as f32 from the block's address (a generic parameter, not a
    /// function pointer, so that it inlines into the routines' target features).
    trait B32 {
        /// Bytes of a block.
        const BYTES: usize;
        /// Offset of `qs[16]` in the block.
        const QS: usize;
        /// The block's scale `dx`.
        ///
        /// # Safety
        /// Only from this module's `avx2,fma,f16c` routines; `x` a whole block.
        unsafe fn dx(x: *const u8) -> f32;

        /// The scales of eight blocks given by the first two bytes of each (little-endian
        /// in `raw[i]`; the scale field and what follows it), lane `i` for block `i`: the
        /// same values as [`B32::dx`].
        ///
        /// # Safety
        /// Only from this module's `avx2,fma,f16c` routines.
        unsafe fn dx8(raw: &[u16; 8]) -> __m256;
    }

    /// `block_q4_0` / `block_iq4_nl`: f16 `d`, `qs[16]`.
    struct F16B32;
    impl B32 for F16B32 {
        const BYTES: usize = 18;
        const QS: usize = 2;
        #[inline(always)]
        unsafe fn dx(x: *const u8) -> f32 {
            f16_at(x)
        }
        #[inline(always)]
        unsafe fn dx8(raw: &[u16; 8]) -> __m256 {
            // f16 → f32 by F16C: exact, as the scalar conversion.
            _mm256_cvtph_ps(_mm_loadu_si128(raw.as_ptr() as *const __m128i))
        }
    }

    /// `block_mxfp4`: E8M0 `e` (`2^(e - 128)`, ggml's `GGML_CPU_E8M0_TO_FP32_HALF`),
    /// `qs[16]`.
    struct Mxfp4B32;
    impl B32 for Mxfp4B32 {
        const BYTES: usize = 17;
        const QS: usize = 1;
        #[inline(always)]
        unsafe fn dx(x: *const u8) -> f32 {
            e8m0_to_f32_half(*x)
        }
        #[inline(always)]
        unsafe fn dx8(raw: &[u16; 8]) -> __m256 {
            // `e8m0_to_f32_half` in eight lanes: bits `0x00200000 << e` for e < 2 (the
            // subnormals), else `(e - 1) << 23`; the high byte of each u16 is not the
            // block's and is masked off.
            let e = _mm256_and_si256(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(raw.as_ptr() as *const __m128i)),
                _mm256_set1_epi32(0xff),
            );
            let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small))
        }
    }

    /// Q4_0 / IQ4_NL / MXFP4 blocks × Q8_0 (34-byte blocks): one accumulator,
    /// `acc = fma(isum_b, dx·dy, acc)`; `map` turns nibbles into values.
    #[inline(always)]
    unsafe fn b32<F: B32>(w: &[u8], a: &[u8], map: impl Fn(__m256i) -> __m256i) -> f32 {
        let nb = (w.len() / F::BYTES).min(a.len() / 34);
        let mut acc = 0f32;
        for b in 0..nb {
            let x = w.as_ptr().add(F::BYTES * b);
            let y = a.as_ptr().add(34 * b);
            let qx = map(nibbles(x.add(F::QS)));
            let qy = _mm256_loadu_si256(y.add(2) as *const __m256i);
            let isum = isum_i8(qx, qy);
            acc = (isum as f32).mul_add(F::dx(x) * f16_at(y), acc);
        }
        acc
    }

    /// The eight rows' sums of `v[i]`'s eight lanes, lane `i` for row `i` (exact).
    #[inline(always)]
    unsafe fn hsum8_rows(v: [__m256i; 8]) -> __m256i {
        let s01 = _mm256_hadd_epi32(v[0], v[1]);
        let s23 = _mm256_hadd_epi32(v[2], v[3]);
        let s45 = _mm256_hadd_epi32(v[4], v[5]);
        let s67 = _mm256_hadd_epi32(v[6], v[7]);
        let s0123 = _mm256_hadd_epi32(s01, s23);
        let s4567 = _mm256_hadd_epi32(s45, s67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(s0123, s4567, 0x20),
            _mm256_permute2x128_si256(s0123, s4567, 0x31),
        )
    }

    /// [`b32`] for eight rows and `C` columns: lane `i` of column `c`'s accumulator is row
    /// `i`'s chain with that column; each weight block is unpacked once for the `C` columns.
    #[inline(always)]
    unsafe fn b32_x8<F: B32, const C: usize>(
        w: &[&[u8]; 8],
        a: &[&[u8]; C],
        map: impl Fn(__m256i) -> __m256i,
    ) -> [[f32; 8]; C] {
        let rows = w.iter().map(|r| r.len() / F::BYTES).min().unwrap_or(0);
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / 34));
        let mut acc = [_mm256_setzero_ps(); C];
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            let mut qx = [_mm256_setzero_si256(); 8];
            let mut ax = [_mm256_setzero_si256(); 8];
            let mut dx = [0u16; 8];
            for (i, row) in w.iter().enumerate() {
                let x = row.as_ptr().add(F::BYTES * b);
                // The same bytes of the next eight rows (the caller's next call, when rows
                // are contiguous as in a tensor): eight short rows read side by side are
                // eight streams too short for the hardware prefetcher to pick up. A
                // prefetch never faults, so the address may lie past the tensor.
                if (F::BYTES * b) % 64 < F::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(8 * row.len()) as *const i8);
                }
                qx[i] = map(nibbles(x.add(F::QS)));
                ax[i] = _mm256_sign_epi8(qx[i], qx[i]);
                dx[i] = std::ptr::read_unaligned(x as *const u16);
            }
            let dx = F::dx8(&dx);
            for c in 0..C {
                let y = a[c].as_ptr().add(34 * b);
                let qy = _mm256_loadu_si256(y.add(2) as *const __m256i);
                let dy = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([*y, *y.add(1)])));
                let mut part = [_mm256_setzero_si256(); 8];
                for i in 0..8 {
                    let p = _mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(qy, qx[i]));
                    part[i] = _mm256_madd_epi16(p, ones);
                }
                let isum = _mm256_cvtepi32_ps(hsum8_rows(part));
                // dx·dy per lane, rounded as the one-row routine rounds it.
                acc[c] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dx, dy), acc[c]);
            }
        }
        let mut out = [[0f32; 8]; C];
        for c in 0..C {
            _mm256_storeu_ps(out[c].as_mut_ptr(), acc[c]);
        }
        out
    }

    /// The eight activation blocks' bytes transposed by 4-byte groups: vector `k` holds
    /// bytes `4k..4k + 4` of column `c` in lane `c` (an 8 × 8 transpose of 32-bit values).
    ///
    /// # Safety
    /// AVX2 (inlined into a `target_feature` caller that has it).
    #[inline(always)]
    unsafe fn columns_by_group(y: [__m256i; 8]) -> [__m256i; 8] {
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (a, b) = (y[i & !1], y[i | 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(a, b)
            } else {
                _mm256_unpackhi_epi32(a, b)
            }
        });
        // u[j]: groups j and j + 4 of columns 0..4 (j < 4) or 4..8 (j ≥ 4).
        let u: [__m256i; 8] = std::array::from_fn(|j| {
            let base = if j < 4 { 0 } else { 4 };
            let (lo, hi) = (t[base + (j % 4) / 2], t[base + 2 + (j % 4) / 2]);
            if j % 2 == 0 {
                _mm256_unpacklo_epi64(lo, hi)
            } else {
                _mm256_unpackhi_epi64(lo, hi)
            }
        });
        std::array::from_fn(|k| {
            if k < 4 {
                _mm256_permute2x128_si256(u[k], u[k + 4], 0x20)
            } else {
                _mm256_permute2x128_si256(u[k - 4], u[k], 0x31)
            }
        })
    }

    /// How [`b32_x8x8`] reads a 32-value block type and its activation blocks.
    #[derive(Clone, Copy)]
    struct Block32 {
        /// Bytes of a weight block (f16 `d` first).
        bytes: usize,
        /// The weight's value is its unsigned byte minus `zero`.
        zero: u8,
        /// An f16 `m` follows `d` (Q4_1 / Q5_1: the activations are Q8_1, with `s`).
        min: bool,
    }

    /// Eight rows × eight columns of a 32-value block type with AVX-512 VNNI, the columns in
    /// the lanes: [`b32_x8x16`] over the eight columns packed twice (a chunk's leftover
    /// group of eight and the tests take it; whole groups of sixteen go through the packed
    /// tile directly). Per block, `isum` is the exact integer sum of the block's products,
    /// then `acc = fma(isum, d_x·d_y, acc)` (the repacked kernels' order, [`b32`]) and, for
    /// types with a min, `acc = fma(m_x, s_y, acc)`. `out[c][i]`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI (inlined into a `target_feature` caller); eight
    /// whole rows and eight activation rows (Q8_0, or Q8_1 where `fmt.min`) of equal block
    /// counts.
    #[inline(always)]
    unsafe fn b32_x8x8(
        w: &[&[u8]; 8],
        a: &[&[u8]; 8],
        fmt: Block32,
        unsigned: impl Fn(*const u8) -> __m256i,
    ) -> [[f32; 8]; 8] {
        let act_bytes = if fmt.min { 36 } else { 34 };
        let rows = w.iter().map(|r| r.len() / fmt.bytes).min().unwrap_or(0);
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / act_bytes));
        let mut panel = vec![0u8; nb * PANEL16_BLOCK_BYTES];
        pack16(
            &std::array::from_fn(|c| a[c % 8]),
            nb,
            fmt,
            panel.as_mut_ptr(),
        );
        let v = b32_x8x16(w, panel.as_ptr(), nb, fmt, unsigned);
        std::array::from_fn(|c| v[c])
    }

    /// Bytes of one block of a [`pack16`] panel: the sixteen columns' activation bytes in
    /// eight groups (bytes `4k..4k + 4` of column `c` in lane `c` of group `k`, 8 × 64), the
    /// lanes' start `-zero · Σy` (64), the columns' `d` (64) and `s` (Q8_1; 64).
    pub(super) const PANEL16_BLOCK_BYTES: usize = 8 * 64 + 3 * 64;

    /// Packs sixteen activation rows (Q8_0, or Q8_1 where `fmt.min`) of `nb` blocks for
    /// [`b32_x8x16`] into `out` (`nb · PANEL16_BLOCK_BYTES` bytes): the transposes, starts
    /// and scale conversions [`b32_x8x8`] redoes for every eight rows, done once per chunk
    /// of tokens.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI (inlined into such a caller); rows of at least
    /// `nb` blocks; `out` writable for `nb · PANEL16_BLOCK_BYTES` bytes.
    #[inline(always)]
    unsafe fn pack16(a: &[&[u8]; 16], nb: usize, fmt: Block32, out: *mut u8) {
        let (act_bytes, qs) = if fmt.min { (36, 4) } else { (34, 2) };
        let zeros = _mm512_set1_epi8(fmt.zero as i8);
        for b in 0..nb {
            let y: [*const u8; 16] = std::array::from_fn(|c| a[c].as_ptr().add(act_bytes * b));
            let half = |h: usize| {
                columns_by_group(std::array::from_fn(|c| {
                    _mm256_loadu_si256(y[8 * h + c].add(qs) as *const __m256i)
                }))
            };
            let (lo, hi) = (half(0), half(1));
            let o = out.add(b * PANEL16_BLOCK_BYTES);
            let mut start = _mm512_setzero_si512();
            for k in 0..8 {
                let g = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[k]), hi[k]);
                _mm512_storeu_si512(o.add(64 * k) as *mut __m512i, g);
                if fmt.zero != 0 {
                    start = _mm512_dpbusd_epi32(start, zeros, g);
                }
            }
            let start = _mm512_sub_epi32(_mm512_setzero_si512(), start);
            _mm512_storeu_si512(o.add(512) as *mut __m512i, start);
            let f16s = |at: usize| {
                let h: [u16; 16] =
                    std::array::from_fn(|c| u16::from_le_bytes([*y[c].add(at), *y[c].add(at + 1)]));
                _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i))
            };
            _mm512_storeu_ps(o.add(576) as *mut f32, f16s(0));
            let sy = if fmt.min {
                f16s(2)
            } else {
                _mm512_setzero_ps()
            };
            _mm512_storeu_ps(o.add(640) as *mut f32, sy);
        }
    }

    /// [`b32_x8x8`] for eight rows × sixteen columns packed by [`pack16`], the columns in
    /// the lanes of 512-bit vectors: each lane's integers and fused multiply-adds are
    /// `b32_x8x8`'s, so every output is the same bit for bit. `out[c][i]`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI (inlined into such a caller); eight whole rows of
    /// `nb` blocks; `panel` packed from `nb` blocks with the same `fmt`.
    #[inline(always)]
    unsafe fn b32_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
        fmt: Block32,
        unsigned: impl Fn(*const u8) -> __m256i,
    ) -> [[f32; 8]; 16] {
        let mut acc = [_mm512_setzero_ps(); 8];
        for b in 0..nb {
            let o = panel.add(b * PANEL16_BLOCK_BYTES);
            let groups: [__m512i; 8] =
                std::array::from_fn(|k| _mm512_loadu_si512(o.add(64 * k) as *const __m512i));
            let start = _mm512_loadu_si512(o.add(512) as *const __m512i);
            let dy = _mm512_loadu_ps(o.add(576) as *const f32);
            let sy = _mm512_loadu_ps(o.add(640) as *const f32);
            for (i, row) in w.iter().enumerate() {
                let x = row.as_ptr().add(fmt.bytes * b);
                if (fmt.bytes * b) % 64 < fmt.bytes {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(8 * row.len()) as *const i8);
                }
                let mut ux = [0u32; 8];
                _mm256_storeu_si256(ux.as_mut_ptr() as *mut __m256i, unsigned(x));
                let ux = std::hint::black_box(&ux);
                let (mut u, mut v) = (start, _mm512_setzero_si512());
                for k in (0..8).step_by(2) {
                    u = _mm512_dpbusd_epi32(u, _mm512_set1_epi32(ux[k] as i32), groups[k]);
                    v = _mm512_dpbusd_epi32(v, _mm512_set1_epi32(ux[k + 1] as i32), groups[k + 1]);
                }
                let isum = _mm512_add_epi32(u, v);
                let d = _mm512_mul_ps(_mm512_set1_ps(f16_at(x)), dy);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[i]);
                if fmt.min {
                    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(x.add(2))), sy, acc[i]);
                }
            }
        }
        let mut by_row = [[0f32; 16]; 8];
        for i in 0..8 {
            _mm512_storeu_ps(by_row[i].as_mut_ptr(), acc[i]);
        }
        std::array::from_fn(|c| std::array::from_fn(|i| by_row[i][c]))
    }

    /// The pack and tile routines of [`b32_x8x16`] for one block format.
    macro_rules! packed16 {
        ($pack:ident, $tile:ident, $fmt:expr, |$x:ident| $unsigned:expr) => {
            /// [`pack16`] for this format.
            ///
            /// # Safety
            /// As [`pack16`] (the host has AVX-512F/VL/VNNI).
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
            pub(super) unsafe fn $pack(a: &[&[u8]; 16], nb: usize, out: *mut u8) {
                pack16(a, nb, $fmt, out)
            }

            /// [`b32_x8x16`] for this format.
            ///
            /// # Safety
            /// As [`b32_x8x16`] (the host has AVX-512F/VL/VNNI).
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
            pub(super) unsafe fn $tile(
                w: &[&[u8]; 8],
                panel: *const u8,
                nb: usize,
            ) -> [[f32; 8]; 16] {
                b32_x8x16(w, panel, nb, $fmt, |$x: *const u8| $unsigned)
            }
        };
    }

    const Q4_1_BLOCK: Block32 = Block32 {
        bytes: 20,
        zero: 0,
        min: true,
    };
    const Q5_0_BLOCK: Block32 = Block32 {
        bytes: 22,
        zero: 16,
        min: false,
    };
    const Q5_1_BLOCK: Block32 = Block32 {
        bytes: 24,
        zero: 0,
        min: true,
    };
    const Q8_0_BLOCK: Block32 = Block32 {
        bytes: 34,
        zero: 128,
        min: false,
    };
    const IQ4_NL_BLOCK: Block32 = Block32 { zero: 128, ..Q4_0 };

    packed16!(q4_0_pack16, q4_0_x8x16, Q4_0, |x| nibbles(x.add(2)));
    packed16!(iq4_nl_pack16, iq4_nl_x8x16, IQ4_NL_BLOCK, |x| {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        _mm256_xor_si256(
            _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles(x.add(2))),
            _mm256_set1_epi8(0x80u8 as i8),
        )
    });
    packed16!(
        q4_1_block_pack16,
        q4_1_block_x8x16,
        Q4_1_BLOCK,
        |x| nibbles(x.add(4))
    );
    packed16!(q5_0_block_pack16, q5_0_block_x8x16, Q5_0_BLOCK, |x| {
        q5_unsigned(x.add(2), x.add(6))
    });
    packed16!(q5_1_block_pack16, q5_1_block_x8x16, Q5_1_BLOCK, |x| {
        q5_unsigned(x.add(4), x.add(8))
    });
    packed16!(q8_0_block_pack16, q8_0_block_x8x16, Q8_0_BLOCK, |x| {
        _mm256_xor_si256(
            _mm256_loadu_si256(x.add(2) as *const __m256i),
            _mm256_set1_epi8(0x80u8 as i8),
        )
    });

    /// Q4_0 and IQ4_NL blocks (18 bytes: f16 `d`, 16 bytes of nibbles).
    const Q4_0: Block32 = Block32 {
        bytes: 18,
        zero: 8,
        min: false,
    };

    /// Q4_0, eight rows × eight columns ([`super::RepackDot8x8Fn`]; values `q - 8`).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512VL and VNNI; eight whole rows and eight activation rows of
    /// equal length.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q4_0_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        b32_x8x8(w, a, Q4_0, |x| nibbles(x.add(2)))
    }

    /// IQ4_NL, eight rows × eight columns ([`super::RepackDot8x8Fn`]; table values + 128).
    ///
    /// # Safety
    /// As [`q4_0_x8x8`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn iq4_nl_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        b32_x8x8(w, a, IQ4_NL_BLOCK, |x| {
            _mm256_xor_si256(_mm256_shuffle_epi8(table, nibbles(x.add(2))), bias)
        })
    }

    /// Q4_1 in the block order ([`super::block_dot8x8_fn`]; values `q`, plus `m`).
    ///
    /// # Safety
    /// As [`q4_0_x8x8`] (Q8_1 activations).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q4_1_block_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        b32_x8x8(w, a, Q4_1_BLOCK, |x| nibbles(x.add(4)))
    }

    /// Q5_0 in the block order ([`super::block_dot8x8_fn`]; values `q - 16`).
    ///
    /// # Safety
    /// As [`q4_0_x8x8`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q5_0_block_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        b32_x8x8(w, a, Q5_0_BLOCK, |x| q5_unsigned(x.add(2), x.add(6)))
    }

    /// Q5_1 in the block order ([`super::block_dot8x8_fn`]; values `q`, plus `m`).
    ///
    /// # Safety
    /// As [`q4_0_x8x8`] (Q8_1 activations).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q5_1_block_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        b32_x8x8(w, a, Q5_1_BLOCK, |x| q5_unsigned(x.add(4), x.add(8)))
    }

    /// Q8_0 in the block order ([`super::block_dot8x8_fn`]; values `u - 128`).
    ///
    /// # Safety
    /// As [`q4_0_x8x8`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn q8_0_block_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        b32_x8x8(w, a, Q8_0_BLOCK, |x| {
            _mm256_xor_si256(_mm256_loadu_si256(x.add(2) as *const __m256i), bias)
        })
    }

    /// Q4_K (144-byte blocks) × Q8_K (292-byte blocks) in the gemm order for eight rows ×
    /// eight columns ([`super::RepackDot8x8Fn`]), the columns in the lanes: per super-block,
    /// each sub-block's exact `Σ q·y` by `vpdpbusd` (nibbles against the transposed
    /// activations), the pair sums `sc·isum` and `m·bsum` as integers, then per pair of
    /// sub-blocks `acc = fma(isum, d_x·d_y, acc)` and `acc_min = fma(imin, dmin_x·d_y,
    /// acc_min)` as `q4_k_gemm4`; the result `acc - acc_min`. Computed by
    /// [`q4_k_gemm_x8x16`] over the eight columns packed twice.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512VL, VNNI and BW; eight whole rows and eight activation rows of
    /// equal length.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q4_k_gemm_x8x8(w: &[&[u8]; 8], a: &[&[u8]; 8]) -> [[f32; 8]; 8] {
        let rows = w.iter().fold(usize::MAX, |n, r| n.min(r.len() / 144));
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / 292));
        let mut panel = vec![0u8; nb * Q8_K_PANEL16_BYTES];
        q8_k_pack16(&std::array::from_fn(|c| a[c % 8]), nb, panel.as_mut_ptr());
        let v = q4_k_gemm_x8x16(w, panel.as_ptr(), nb);
        std::array::from_fn(|c| v[c])
    }

    /// The eight 6-bit scales then the eight 6-bit mins of a Q4_K / Q5_K block's 12-byte
    /// `scales` at `s` (ggml's `get_scale_min_k4` for every sub-block at once).
    ///
    /// # Safety
    /// `s` valid for 12 bytes of reads.
    #[inline(always)]
    unsafe fn scales_mins_k4(s: *const u8) -> [u8; 16] {
        let word = |k: usize| std::ptr::read_unaligned(s.add(4 * k) as *const u32);
        let (w0, w1, w2) = (word(0), word(1), word(2));
        let (m6, m4, m2) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
        let scales_hi = (w2 & m4) | (((w0 >> 6) & m2) << 4);
        let mins_hi = ((w2 >> 4) & m4) | (((w1 >> 6) & m2) << 4);
        let mut out = [0u8; 16];
        for (k, v) in [w0 & m6, scales_hi, w1 & m6, mins_hi]
            .into_iter()
            .enumerate()
        {
            out[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Bytes of one super-block of a [`q8_k_pack16`] panel: the sixteen columns' Q8_K
    /// values in 64 groups (group `8v + k`: bytes `4k..4k + 4` of value vector `v` of column
    /// `c` in lane `c`, 64 × 64), their i16 `bsums` in eight pairs (8 × 64) and `d` (64).
    pub(in crate::handwritten) const Q8_K_PANEL16_BYTES: usize = 64 * 64 + 8 * 64 + 64;

    /// Packs sixteen Q8_K activation rows of `nb` super-blocks for [`q4_k_gemm_x8x16`].
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI/BW; rows of at least `nb` Q8_K blocks; `out` writable
    /// for `nb · Q8_K_PANEL16_BYTES` bytes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q8_k_pack16(a: &[&[u8]; 16], nb: usize, out: *mut u8) {
        for b in 0..nb {
            let y: [*const u8; 16] = std::array::from_fn(|c| a[c].as_ptr().add(292 * b));
            let o = out.add(b * Q8_K_PANEL16_BYTES);
            // Column groups of the 32 bytes at `at` of every column, 16 lanes each.
            let join = |at: usize, dst: *mut u8| {
                let half = |h: usize| {
                    columns_by_group(std::array::from_fn(|c| {
                        _mm256_loadu_si256(y[8 * h + c].add(at) as *const __m256i)
                    }))
                };
                let (lo, hi) = (half(0), half(1));
                for k in 0..8 {
                    let g = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[k]), hi[k]);
                    _mm512_storeu_si512(dst.add(64 * k) as *mut __m512i, g);
                }
            };
            for v in 0..8 {
                join(4 + 32 * v, o.add(512 * v));
            }
            join(260, o.add(4096));
            let dy: [f32; 16] =
                std::array::from_fn(|c| std::ptr::read_unaligned(y[c] as *const f32));
            _mm512_storeu_ps(o.add(4608) as *mut f32, _mm512_loadu_ps(dy.as_ptr()));
        }
    }

    /// [`q4_k_gemm_x8x8`] for eight rows × sixteen columns packed by [`q8_k_pack16`], the
    /// columns in the lanes of 512-bit vectors: each lane's integers and fused
    /// multiply-adds are the 8 × 8 tile's, so each output is the same bit for bit. Every
    /// intrinsic is inlined (`vpmaddwd` on 512 bits needs AVX-512BW enabled here: without it
    /// each call went through memory and the tile ran at half of Q4_0's speed).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI/BW; eight whole rows of `nb` Q4_K blocks; `panel`
    /// packed from `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q4_k_gemm_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        q4_k_x8x16::<false, Cols16>(w, panel, nb)
    }

    /// [`q4_k_gemm_x8x16`] in the gemv kernel's order (`ir::ggml::RepackedRow::dot` with
    /// `RepackKernel::Gemv`): the same integer sums, added over the whole super-block before
    /// one fused multiply-add each for the values and the mins.
    ///
    /// # Safety
    /// As [`q4_k_gemm_x8x16`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q4_k_gemv_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        q4_k_x8x16::<true, Cols16>(w, panel, nb)
    }

    /// [`q4_k_gemv_x8x16`] for the first eight columns of the panel only, on 256-bit
    /// vectors (a group of eight or fewer real columns: a batched step of eight sequences
    /// pays for eight lanes, not sixteen); columns 8..16 of the result are zeros.
    ///
    /// # Safety
    /// As [`q4_k_gemm_x8x16`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q4_k_gemv_x8x8(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        q4_k_x8x16::<true, Cols8>(w, panel, nb)
    }

    /// The vectors of [`q4_k_x8x16`]: all sixteen columns of a [`q8_k_pack16`] panel in
    /// 512-bit registers ([`Cols16`]), or its first eight in 256-bit ones ([`Cols8`]). Each
    /// lane's operations are the same either way.
    trait Cols {
        type I: Copy;
        type F: Copy;
        /// # Safety (of every method)
        /// AVX-512F/VL/VNNI/BW (inlined into such a caller); loads read 64 (`Cols16`) or 32
        /// bytes, stores write 16 or 8 f32.
        unsafe fn zero_i() -> Self::I;
        unsafe fn zero_f() -> Self::F;
        unsafe fn load_i(p: *const u8) -> Self::I;
        unsafe fn load_f(p: *const u8) -> Self::F;
        unsafe fn set1_i(x: i32) -> Self::I;
        unsafe fn set1_f(x: f32) -> Self::F;
        unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
        unsafe fn mullo(a: Self::I, b: Self::I) -> Self::I;
        unsafe fn madd(a: Self::I, b: Self::I) -> Self::I;
        unsafe fn dpbusd(acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
        unsafe fn dpwssd(acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
        unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
        unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
        unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
        unsafe fn cvt(a: Self::I) -> Self::F;
        unsafe fn store_f(p: *mut f32, v: Self::F);
    }

    /// Sixteen columns, 512-bit vectors.
    struct Cols16;
    /// The first eight columns, 256-bit vectors.
    struct Cols8;

    impl Cols for Cols16 {
        type I = __m512i;
        type F = __m512;
        #[inline(always)]
        unsafe fn zero_i() -> __m512i {
            _mm512_setzero_si512()
        }
        #[inline(always)]
        unsafe fn zero_f() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load_i(p: *const u8) -> __m512i {
            _mm512_loadu_si512(p as *const __m512i)
        }
        #[inline(always)]
        unsafe fn load_f(p: *const u8) -> __m512 {
            _mm512_loadu_ps(p as *const f32)
        }
        #[inline(always)]
        unsafe fn set1_i(x: i32) -> __m512i {
            _mm512_set1_epi32(x)
        }
        #[inline(always)]
        unsafe fn set1_f(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn mullo(a: __m512i, b: __m512i) -> __m512i {
            _mm512_mullo_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn madd(a: __m512i, b: __m512i) -> __m512i {
            _mm512_madd_epi16(a, b)
        }
        #[inline(always)]
        unsafe fn dpbusd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            _mm512_dpbusd_epi32(acc, a, b)
        }
        #[inline(always)]
        unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            _mm512_dpwssd_epi32(acc, a, b)
        }
        #[inline(always)]
        unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
            _mm512_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn cvt(a: __m512i) -> __m512 {
            _mm512_cvtepi32_ps(a)
        }
        #[inline(always)]
        unsafe fn store_f(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
    }

    impl Cols for Cols8 {
        type I = __m256i;
        type F = __m256;
        #[inline(always)]
        unsafe fn zero_i() -> __m256i {
            _mm256_setzero_si256()
        }
        #[inline(always)]
        unsafe fn zero_f() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load_i(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const __m256i)
        }
        #[inline(always)]
        unsafe fn load_f(p: *const u8) -> __m256 {
            _mm256_loadu_ps(p as *const f32)
        }
        #[inline(always)]
        unsafe fn set1_i(x: i32) -> __m256i {
            _mm256_set1_epi32(x)
        }
        #[inline(always)]
        unsafe fn set1_f(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
            _mm256_add_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn mullo(a: __m256i, b: __m256i) -> __m256i {
            _mm256_mullo_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn madd(a: __m256i, b: __m256i) -> __m256i {
            _mm256_madd_epi16(a, b)
        }
        #[inline(always)]
        unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(acc, a, b)
        }
        #[inline(always)]
        unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_dpwssd_epi32(acc, a, b)
        }
        #[inline(always)]
        unsafe fn mul_f(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn sub_f(a: __m256, b: __m256) -> __m256 {
            _mm256_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn cvt(a: __m256i) -> __m256 {
            _mm256_cvtepi32_ps(a)
        }
        #[inline(always)]
        unsafe fn store_f(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
    }

    /// Super-block `b` of eight Q4_K rows unpacked for the tiles: row `i`'s quants as
    /// bytes (`q[i][j]`: sub-block `j`'s 32 values, 4-byte group `k` in `q[i][j][k]`), its
    /// eight 6-bit scales then its eight mins in both halves of a u32 (`sc[i]`), its `d`.
    ///
    /// # Safety
    /// AVX2, AVX-512F (inlined into such a caller); eight rows of more than `b` blocks.
    #[inline(always)]
    unsafe fn q4_k_unpack(
        w: &[&[u8]; 8],
        b: usize,
        q: &mut [[[u32; 8]; 8]; 8],
        sc: &mut [[u32; 16]; 8],
        dx: &mut [f32; 8],
    ) {
        let m4 = _mm256_set1_epi8(0x0f);
        for (i, row) in w.iter().enumerate() {
            let x = row.as_ptr().add(144 * b);
            for p in 0..4 {
                let qs = _mm256_loadu_si256(x.add(16 + 32 * p) as *const __m256i);
                let lo = _mm256_and_si256(qs, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
                _mm256_storeu_si256(q[i][2 * p].as_mut_ptr() as *mut __m256i, lo);
                _mm256_storeu_si256(q[i][2 * p + 1].as_mut_ptr() as *mut __m256i, hi);
            }
            let sm = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                scales_mins_k4(x.add(4)).as_ptr() as *const __m128i
            ));
            let sm = _mm512_mask_or_epi32(sm, 0xff00, sm, _mm512_slli_epi32(sm, 16));
            _mm512_storeu_si512(sc[i].as_mut_ptr() as *mut __m512i, sm);
            dx[i] = f16_at(x);
        }
    }

    /// The mins part of super-block `b` (panel block at `o`) for the eight rows: the
    /// exact integers `m·bsum` by `vpmaddwd` / `vpdpwssd`, then per sub-block pair (gemm
    /// order) or per super-block (`GEMV`) `acc_min[i] = fma(mins, dmin·d_y, acc_min[i])`.
    ///
    /// # Safety
    /// As [`q4_k_x8x16`]'s; `sc` from [`q4_k_unpack`] of the same super-block.
    #[inline(always)]
    unsafe fn q4_k_mins<const GEMV: bool, C: Cols>(
        w: &[&[u8]; 8],
        b: usize,
        o: *const u8,
        sc: &[[u32; 16]; 8],
        dy: C::F,
        acc_min: &mut [C::F; 8],
    ) {
        let bsum = |j: usize| C::load_i(o.add(4096 + 64 * j));
        for i in 0..8 {
            let dmin = C::mul_f(C::set1_f(f16_at(w[i].as_ptr().add(144 * b + 2))), dy);
            let mut all = C::zero_i();
            for p in 0..4 {
                let m = |j: usize| C::set1_i(sc[i][8 + j] as i32);
                let mins = C::dpwssd(
                    C::madd(bsum(2 * p), m(2 * p)),
                    bsum(2 * p + 1),
                    m(2 * p + 1),
                );
                if GEMV {
                    all = C::add_i(all, mins);
                } else {
                    acc_min[i] = C::fmadd(C::cvt(mins), dmin, acc_min[i]);
                }
            }
            if GEMV {
                acc_min[i] = C::fmadd(C::cvt(all), dmin, acc_min[i]);
            }
        }
    }

    /// [`q4_k_gemm_x8x16`] (`GEMV` false: a fused multiply-add per pair of sub-blocks) and
    /// [`q4_k_gemv_x8x16`] (`GEMV` true: one per super-block). A `target_feature` function
    /// itself, so that the closures inside get the features (a closure takes those of the
    /// function it is written in).
    ///
    /// # Safety
    /// As [`q4_k_gemm_x8x16`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    #[inline]
    unsafe fn q4_k_x8x16<const GEMV: bool, C: Cols>(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let mut acc = [C::zero_f(); 8];
        let mut acc_min = [C::zero_f(); 8];
        // Per super-block: each row's nibbles (row, sub-block, 4-byte group), scales and
        // `d`, then the sub-blocks outermost so that each one's eight activation groups
        // are loaded once for the eight rows. Integer sums are exact in any order; every
        // row's f32 operations keep the 8 × 8 tile's order.
        let mut q = [[[0u32; 8]; 8]; 8];
        // Row `i`'s eight 6-bit scales, then its eight mins in both halves of a u32.
        let mut sc = [[0u32; 16]; 8];
        let mut dx = [0f32; 8];
        for b in 0..nb {
            let o = panel.add(b * Q8_K_PANEL16_BYTES);
            let dy = C::load_f(o.add(4608));
            q4_k_unpack(w, b, &mut q, &mut sc, &mut dx);
            // Through memory: each scale is broadcast by a load, not moved from a register.
            let sc = std::hint::black_box(&sc);
            q4_k_mins::<GEMV, C>(w, b, o, sc, dy, &mut acc_min);
            let q = std::hint::black_box(&q);
            // Σ q·y of sub-block `j` for every row, scaled by the row's `sc`.
            let scaled = |j: usize| -> [C::I; 8] {
                let g: [C::I; 8] = std::array::from_fn(|k| C::load_i(o.add(64 * (8 * j + k))));
                // A loop, not `array::from_fn`: its closure is not inlined.
                let mut out = [C::zero_i(); 8];
                for (i, o) in out.iter_mut().enumerate() {
                    let (mut u, mut v) = (C::zero_i(), C::zero_i());
                    for k in (0..8).step_by(2) {
                        u = C::dpbusd(u, C::set1_i(q[i][j][k] as i32), g[k]);
                        v = C::dpbusd(v, C::set1_i(q[i][j][k + 1] as i32), g[k + 1]);
                    }
                    let sum = C::add_i(u, v);
                    *o = C::mullo(sum, C::set1_i(sc[i][j] as i32));
                }
                out
            };
            let mut all = [C::zero_i(); 8];
            for p in 0..4 {
                let even = scaled(2 * p);
                let odd = scaled(2 * p + 1);
                for i in 0..8 {
                    let sums = C::add_i(even[i], odd[i]);
                    if GEMV {
                        all[i] = C::add_i(all[i], sums);
                    } else {
                        let d = C::mul_f(C::set1_f(dx[i]), dy);
                        acc[i] = C::fmadd(C::cvt(sums), d, acc[i]);
                    }
                }
            }
            if GEMV {
                for i in 0..8 {
                    let d = C::mul_f(C::set1_f(dx[i]), dy);
                    acc[i] = C::fmadd(C::cvt(all[i]), d, acc[i]);
                }
            }
        }
        let mut by_row = [[0f32; 16]; 8];
        for i in 0..8 {
            C::store_f(by_row[i].as_mut_ptr(), C::sub_f(acc[i], acc_min[i]));
        }
        std::array::from_fn(|c| std::array::from_fn(|i| by_row[i][c]))
    }

    /// What [`k16_x8x16`]'s `unpack` returns for one weight block besides its quants: the
    /// sixteen sub-block scales as i8 bytes, the sixteen factors of the `bsums` term (the
    /// scales again for the types without mins, the mins for Q2_K / Q5_K), `d`, and `dmin`
    /// (0 for the types without mins).
    type K16Block = (__m128i, __m128i, f32, f32);

    /// The tiled K-quant order of [`crate::handwritten::qdot_tiled`] for the types with
    /// sixteen 16-value sub-blocks (Q2_K, Q3_K, Q6_K; Q5_K's 32-value ones as pairs of
    /// halves with one scale; the I-quants), eight rows × sixteen Q8_K columns
    /// packed by [`q8_k_pack16`], the columns in the lanes of 512-bit vectors: per
    /// super-block and column the exact `s1 = Σ_j sc_j · (q · y)` (`q` the unsigned quants:
    /// `vpdpbusd` against the transposed activations, then `vpmulld` by the sub-block scale)
    /// and `t = Σ_j f_j · bsums[j]`; then without mins (`MIN` false; `f` the scales, the
    /// quants offset by `2^SHIFT`: 2 for Q3_K, 5 for Q6_K) `out = fma(d · (s1 - 2^SHIFT ·
    /// t), yd, out)` as `qdot_tiled`'s `k16_step`, with mins (`f` the mins) `out =
    /// fma(fma(-dmin, t, d · s1), yd, out)` as its Q2_K step, from 0: each output the same
    /// bit for bit. `block_bytes` is the weight block's size; `unpack(x, q)` writes block
    /// `x`'s 256 unsigned quants into `q` (value vector `v`, 4-byte group `k`) and returns
    /// the rest ([`K16Block`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI/BW (inlined into such a caller); eight whole rows of
    /// `nb` blocks; `panel` packed from `nb` Q8_K blocks.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // i, j and v index several arrays
    unsafe fn k16_x8x16<const SHIFT: u32, const MIN: bool>(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
        block_bytes: usize,
        unpack: impl Fn(*const u8, &mut [[u32; 8]; 8]) -> K16Block,
    ) -> [[f32; 8]; 16] {
        let mut out = [_mm512_setzero_ps(); 8];
        let mut q = [[[0u32; 8]; 8]; 8];
        // Row `i`'s scales, one per sub-block (i32), and its `bsums` factors in pairs of
        // i16 for `vpdpwssd`.
        let mut sc = [[0u32; 16]; 8];
        let mut pairs = [[0u32; 8]; 8];
        let mut dx = [(0f32, 0f32); 8];
        for b in 0..nb {
            let o = panel.add(b * Q8_K_PANEL16_BYTES);
            for (i, row) in w.iter().enumerate() {
                let (scales, factors, d, dmin) =
                    unpack(row.as_ptr().add(block_bytes * b), &mut q[i]);
                dx[i] = (d, dmin);
                _mm512_storeu_si512(
                    sc[i].as_mut_ptr() as *mut __m512i,
                    _mm512_cvtepi8_epi32(scales),
                );
                _mm256_storeu_si256(
                    pairs[i].as_mut_ptr() as *mut __m256i,
                    _mm256_cvtepi8_epi16(factors),
                );
            }
            // Through memory: each scale is broadcast by a load, not moved from a register.
            let (q, sc, pairs) = std::hint::black_box((&q, &sc, &pairs));
            let mut t = [_mm512_setzero_si512(); 8];
            for (i, ti) in t.iter_mut().enumerate() {
                for j in 0..8 {
                    let bsum = _mm512_loadu_si512(o.add(4096 + 64 * j) as *const __m512i);
                    *ti = _mm512_dpwssd_epi32(*ti, bsum, _mm512_set1_epi32(pairs[i][j] as i32));
                }
            }
            let mut s1 = [_mm512_setzero_si512(); 8];
            for v in 0..8 {
                let g: [__m512i; 8] = std::array::from_fn(|k| {
                    _mm512_loadu_si512(o.add(64 * (8 * v + k)) as *const __m512i)
                });
                // A loop, not `array::from_fn`: its closure is not inlined.
                for (i, s) in s1.iter_mut().enumerate() {
                    let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for k in 0..4 {
                        let wq = |k: usize| _mm512_set1_epi32(q[i][v][k] as i32);
                        lo = _mm512_dpbusd_epi32(lo, wq(k), g[k]);
                        hi = _mm512_dpbusd_epi32(hi, wq(k + 4), g[k + 4]);
                    }
                    let scale = |j: usize| _mm512_set1_epi32(sc[i][j] as i32);
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(lo, scale(2 * v)));
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(hi, scale(2 * v + 1)));
                }
            }
            let dy = _mm512_loadu_ps(o.add(4608) as *const f32);
            for i in 0..8 {
                let (d, dmin) = dx[i];
                let r = if MIN {
                    let r = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(s1[i]));
                    _mm512_fmadd_ps(_mm512_set1_ps(-dmin), _mm512_cvtepi32_ps(t[i]), r)
                } else {
                    let s = _mm512_sub_epi32(s1[i], _mm512_slli_epi32::<SHIFT>(t[i]));
                    _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(s))
                };
                out[i] = _mm512_fmadd_ps(r, dy, out[i]);
            }
        }
        let mut by_row = [[0f32; 16]; 8];
        for i in 0..8 {
            _mm512_storeu_ps(by_row[i].as_mut_ptr(), out[i]);
        }
        std::array::from_fn(|c| std::array::from_fn(|i| by_row[i][c]))
    }

    /// The I-quants' tiled order (`qdot_tiled`'s `grid_tiled`: IQ3_XXS, IQ3_S, IQ2_XXS,
    /// IQ2_XS, IQ2_S, IQ1_S, IQ1_M) through [`k16_x8x16`] (offset `2^7`): block `x`'s
    /// signed grid values `w` (`|w| <= 62`) written as `w + 128` into `q`, each 16-value
    /// sub-block's multiplier from the lanes of `parts`' scale vector, and `d · d_scale`
    /// (IQ1_M's assembled scale when `iq1m`): so the tile computes the exact `s1 = Σ scale ·
    /// (w · y)`, then `out = fma(d · s1, yd, out)`, each output the same bit for bit.
    ///
    /// # Safety
    /// AVX2 (inlined into such a caller); `x` a whole block that `parts` reads.
    #[inline(always)]
    unsafe fn grid_unpack(
        x: *const u8,
        q: &mut [[u32; 8]; 8],
        (d_scale, iq1m): (f32, bool),
        parts: unsafe fn(*const u8, usize) -> (__m256i, __m256i, __m256i),
    ) -> K16Block {
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        let mut scales = [0i8; 16];
        for (b, qb) in q.iter_mut().enumerate() {
            let (mag, signs, scale) = parts(x, b);
            let v = _mm256_sign_epi8(mag, signs);
            _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, _mm256_xor_si256(v, bias));
            // The i16 multiplier of values 2k, 2k + 1 in lane k: lanes 0 and 8 are the two
            // 16-value halves'.
            let mut lanes = [0i16; 16];
            _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, scale);
            scales[2 * b] = lanes[0] as i8;
            scales[2 * b + 1] = lanes[8] as i8;
        }
        let scales = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
        let d = if iq1m { iq1_m_d(x) } else { f16_at(x) } * d_scale;
        (scales, scales, d, 0.0)
    }

    /// The I-quant tiles of [`grid_unpack`], one per type: each type's unpacking is a
    /// function with the tile's target features (a closure has none, and as a call its
    /// intrinsics and `parts` stayed out of line: 2 × slower than the per-column kernels).
    macro_rules! grid_tiles {
        ($($name:ident, $unpack:ident: $parts:ident, $bytes:expr, $d_scale:expr, $iq1m:expr;)*) => {$(
            /// [`grid_unpack`] for this type.
            ///
            /// # Safety
            /// As [`grid_unpack`] (the host has AVX-512F/VL/VNNI/BW).
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
            unsafe fn $unpack(x: *const u8, q: &mut [[u32; 8]; 8]) -> K16Block {
                grid_unpack(x, q, ($d_scale, $iq1m), $parts)
            }

            /// [`k16_x8x16`] over [`grid_unpack`] for this type.
            ///
            /// # Safety
            /// As [`k16_x8x16`] (the host has AVX-512F/VL/VNNI/BW).
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
            pub(super) unsafe fn $name(
                w: &[&[u8]; 8],
                panel: *const u8,
                nb: usize,
            ) -> [[f32; 8]; 16] {
                k16_x8x16::<7, false>(w, panel, nb, $bytes, |x, q| $unpack(x, q))
            }
        )*};
    }

    grid_tiles! {
        iq3_xxs_tiled_x8x16, iq3_xxs_unpack: iq3_xxs_parts, 98, 0.25, false;
        iq3_s_tiled_x8x16, iq3_s_unpack: iq3_s_parts, 110, 1.0, false;
        iq2_xxs_tiled_x8x16, iq2_xxs_unpack: iq2_xxs_parts, 66, 0.125, false;
        iq2_xs_tiled_x8x16, iq2_xs_unpack: iq2_xs_parts, 74, 0.125, false;
        iq2_s_tiled_x8x16, iq2_s_unpack: iq2_s_parts, 82, 0.125, false;
        iq1_s_tiled_x8x16, iq1_s_unpack: iq1_s_parts, 50, 0.125, false;
        iq1_m_tiled_x8x16, iq1_m_unpack: iq1_m_parts, 56, 0.125, true;
    }

    /// IQ4_XS (136-byte blocks: `d`, `scales_h`, `scales_l[4]`, `qs[128]`) in the tiled
    /// order, eight rows × sixteen Q8_K columns packed by [`q8_k_pack16`], the columns in
    /// the lanes: per super-block and column `s1 = Σ_b (ls_b - 32) · p_b` over the eight
    /// 32-value blocks, `out = fma(d · s1, yd, out)` from 0, as `qdot_tiled`'s IQ4_XS
    /// routine. `p_b` is ggml's sum of products through the sign trick, `|v| · sign(y, v)`:
    /// `Σ v · y` except where an activation byte is -128 against a negative table value,
    /// which the trick wraps to `-128 · |v|` (256 · v below the true product). Computed as
    /// `vpdpbusd` of `v + 128` against the activations, minus `128 · bsums`, plus `256 ·
    /// Σ min(v, 0)` over the -128 bytes (found per group once for the eight rows; only the
    /// groups holding one take a second `vpdpbusd`): each output the same bit for bit.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F/VL/VNNI/BW (the host has them); eight whole rows of `nb`
    /// blocks; `panel` packed from `nb` Q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn iq4_xs_tiled_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let m4 = _mm256_set1_epi8(0x0f);
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        let mut out = [_mm512_setzero_ps(); 8];
        // Row `i`'s values `v + 128` and `min(v, 0)` (block, 4-byte group) and block scales.
        let mut q = [[[0u32; 8]; 8]; 8];
        let mut neg = [[[0u32; 8]; 8]; 8];
        let mut sc = [[0u32; 8]; 8];
        let mut dx = [0f32; 8];
        for b in 0..nb {
            let o = panel.add(b * Q8_K_PANEL16_BYTES);
            for (i, row) in w.iter().enumerate() {
                let x = row.as_ptr().add(136 * b);
                dx[i] = f16_at(x);
                let sh = u16::from_le_bytes([*x.add(2), *x.add(3)]) as u32;
                let sl = std::ptr::read_unaligned(x.add(4) as *const u32);
                for (blk, s) in sc[i].iter_mut().enumerate() {
                    let ls = ((sl >> (4 * blk)) & 0x0f) | (((sh >> (2 * blk)) & 3) << 4);
                    *s = (ls as i32 - 32) as u32;
                }
                for p in 0..4 {
                    let qs = _mm256_loadu_si256(x.add(8 + 32 * p) as *const __m256i);
                    let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(qs, m4));
                    let hi =
                        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4));
                    // Block 2p: its 16 bytes' low nibbles then high nibbles; block 2p + 1 the
                    // upper halves.
                    let v = [
                        _mm256_permute2x128_si256::<0x20>(lo, hi),
                        _mm256_permute2x128_si256::<0x31>(lo, hi),
                    ];
                    for (h, vh) in v.into_iter().enumerate() {
                        let blk = 2 * p + h;
                        let u = _mm256_xor_si256(vh, bias);
                        let m = _mm256_min_epi8(vh, _mm256_setzero_si256());
                        _mm256_storeu_si256(q[i][blk].as_mut_ptr() as *mut __m256i, u);
                        _mm256_storeu_si256(neg[i][blk].as_mut_ptr() as *mut __m256i, m);
                    }
                }
            }
            // Through memory: each value group is broadcast by a load.
            let (q, neg, sc) = std::hint::black_box((&q, &neg, &sc));
            let mut s1 = [_mm512_setzero_si512(); 8];
            let minus128 = _mm512_set1_epi8(-128);
            let one = _mm512_set1_epi8(1);
            for v in 0..8 {
                let g: [__m512i; 8] = std::array::from_fn(|k| {
                    _mm512_loadu_si512(o.add(64 * (8 * v + k)) as *const __m512i)
                });
                // The -128 activation bytes of each group (1 where one is, else 0).
                let flags: [u64; 8] =
                    std::array::from_fn(|k| _mm512_cmpeq_epi8_mask(g[k], minus128));
                let bsum = _mm512_loadu_si512(o.add(4096 + 64 * v) as *const __m512i);
                let offset = _mm512_madd_epi16(bsum, _mm512_set1_epi16(128));
                // A loop, not `array::from_fn`: its closure is not inlined.
                for (i, s) in s1.iter_mut().enumerate() {
                    let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for k in (0..8).step_by(2) {
                        let wq = |k: usize| _mm512_set1_epi32(q[i][v][k] as i32);
                        lo = _mm512_dpbusd_epi32(lo, wq(k), g[k]);
                        hi = _mm512_dpbusd_epi32(hi, wq(k + 1), g[k + 1]);
                    }
                    let mut corr = _mm512_setzero_si512();
                    for k in 0..8 {
                        if flags[k] != 0 {
                            let f = _mm512_maskz_mov_epi8(flags[k], one);
                            let m = _mm512_set1_epi32(neg[i][v][k] as i32);
                            corr = _mm512_dpbusd_epi32(corr, f, m);
                        }
                    }
                    let p = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), offset);
                    let p = _mm512_add_epi32(p, _mm512_slli_epi32::<8>(corr));
                    let scale = _mm512_set1_epi32(sc[i][v] as i32);
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(p, scale));
                }
            }
            let dy = _mm512_loadu_ps(o.add(4608) as *const f32);
            for i in 0..8 {
                let r = _mm512_mul_ps(_mm512_set1_ps(dx[i]), _mm512_cvtepi32_ps(s1[i]));
                out[i] = _mm512_fmadd_ps(r, dy, out[i]);
            }
        }
        let mut by_row = [[0f32; 16]; 8];
        for i in 0..8 {
            _mm512_storeu_ps(by_row[i].as_mut_ptr(), out[i]);
        }
        std::array::from_fn(|c| std::array::from_fn(|i| by_row[i][c]))
    }

    /// Q5_K (176-byte blocks: `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`) in the tiled
    /// order, eight rows × sixteen columns: [`k16_x8x16`] with mins, each 32-value
    /// sub-block's 6-bit scale and min given to both its 16-value halves (the same exact
    /// integers `s1` and `s2 = Σ_j m_j · (bsums[2j] + bsums[2j + 1])` as `qdot_tiled`'s
    /// `k4_step`, so the same outputs bit for bit).
    ///
    /// # Safety
    /// As [`k16_x8x16`] (the host has AVX-512F/VL/VNNI/BW).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q5_k_tiled_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let m4 = _mm256_set1_epi8(0x0f);
        let one = _mm256_set1_epi8(1);
        k16_x8x16::<0, true>(w, panel, nb, 176, |x, q| {
            let qh = _mm256_loadu_si256(x.add(16) as *const __m256i);
            for j in 0..4 {
                let v = _mm256_loadu_si256(x.add(48 + 32 * j) as *const __m256i);
                // Bits 2j and 2j + 1 of `qh` (each byte's own: the mask drops what the
                // 16-bit shifts bring in from the neighbouring byte), at bit 4.
                let bit = |s: i32| {
                    let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                    _mm256_slli_epi16::<4>(_mm256_and_si256(h, one))
                };
                let lo = _mm256_or_si256(_mm256_and_si256(v, m4), bit(2 * j as i32));
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                    bit(2 * j as i32 + 1),
                );
                _mm256_storeu_si256(q[2 * j].as_mut_ptr() as *mut __m256i, lo);
                _mm256_storeu_si256(q[2 * j + 1].as_mut_ptr() as *mut __m256i, hi);
            }
            // Eight scales then eight mins (6 bits: fit i8), each byte twice.
            let sm = _mm_loadu_si128(scales_mins_k4(x.add(4)).as_ptr() as *const __m128i);
            let (scales, mins) = (_mm_unpacklo_epi8(sm, sm), _mm_unpackhi_epi8(sm, sm));
            (scales, mins, f16_at(x), f16_at(x.add(2)))
        })
    }

    /// Q6_K (210-byte blocks: `ql[128]`, `qh[64]`, `scales[16]`, `d`) in the tiled order,
    /// eight rows × sixteen columns ([`k16_x8x16`], quants `q + 32`).
    ///
    /// # Safety
    /// As [`k16_x8x16`] (the host has AVX-512F/VL/VNNI/BW).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q6_k_tiled_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let m4 = _mm256_set1_epi8(0x0f);
        let m3 = _mm256_set1_epi8(0x03);
        k16_x8x16::<5, false>(w, panel, nb, 210, |x, q| {
            for half in 0..2 {
                let ql = |k: usize| _mm256_loadu_si256(x.add(64 * half + 32 * k) as *const __m256i);
                let qh = _mm256_loadu_si256(x.add(128 + 32 * half) as *const __m256i);
                let (l0, l1) = (ql(0), ql(1));
                let low = [
                    _mm256_and_si256(l0, m4),
                    _mm256_and_si256(l1, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                ];
                let high = [
                    _mm256_and_si256(qh, m3),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(qh), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(qh), m3),
                ];
                for k in 0..4 {
                    let v = _mm256_or_si256(low[k], _mm256_slli_epi16::<4>(high[k]));
                    _mm256_storeu_si256(q[4 * half + k].as_mut_ptr() as *mut __m256i, v);
                }
            }
            let scales = _mm_loadu_si128(x.add(192) as *const __m128i);
            (scales, scales, f16_at(x.add(208)), 0.0)
        })
    }

    /// Q3_K (110-byte blocks: `hmask[32]`, `qs[64]`, `scales[12]`, `d`) in the tiled order,
    /// eight rows × sixteen columns ([`k16_x8x16`], quants `q + 4`: two low bits, the
    /// `hmask` bit as 4).
    ///
    /// # Safety
    /// As [`k16_x8x16`] (the host has AVX-512F/VL/VNNI/BW).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q3_k_tiled_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        k16_x8x16::<2, false>(w, panel, nb, 110, |x, q| {
            let hm = _mm256_loadu_si256(x as *const __m256i);
            for half in 0..2 {
                let v = _mm256_loadu_si256(x.add(32 + 32 * half) as *const __m256i);
                for k in 0..4 {
                    let low = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32));
                    let low = _mm256_and_si256(low, m3);
                    // Bit `4 half + k` of each `hmask` byte, at bit 2.
                    let h = _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * half + k) as i32));
                    let h = _mm256_slli_epi16::<2>(_mm256_and_si256(h, one));
                    let g = _mm256_or_si256(low, h);
                    _mm256_storeu_si256(q[4 * half + k].as_mut_ptr() as *mut __m256i, g);
                }
            }
            let scales = q3_k_scales(x.add(96));
            (scales, scales, f16_at(x.add(108)), 0.0)
        })
    }

    /// Q2_K (84-byte blocks: `scales[16]` (scale and min nibbles), `qs[64]`, `d`, `dmin`)
    /// in the tiled order, eight rows × sixteen columns ([`k16_x8x16`] with mins).
    ///
    /// # Safety
    /// As [`k16_x8x16`] (the host has AVX-512F/VL/VNNI/BW).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
    pub(super) unsafe fn q2_k_tiled_x8x16(
        w: &[&[u8]; 8],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 8]; 16] {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        k16_x8x16::<0, true>(w, panel, nb, 84, |x, q| {
            for half in 0..2 {
                let v = _mm256_loadu_si256(x.add(16 + 32 * half) as *const __m256i);
                for k in 0..4 {
                    let g = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32));
                    let g = _mm256_and_si256(g, m3);
                    _mm256_storeu_si256(q[4 * half + k].as_mut_ptr() as *mut __m256i, g);
                }
            }
            let sm = _mm_loadu_si128(x as *const __m128i);
            let scales = _mm_and_si128(sm, m4);
            let mins = _mm_and_si128(_mm_srli_epi16::<4>(sm), m4);
            (scales, mins, f16_at(x.add(80)), f16_at(x.add(82)))
        })
    }

    /// Q4_0, eight rows ([`super::RepackDot8Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and one activation row of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_x8(w: &[&[u8]; 8], a: &[u8]) -> [f32; 8] {
        b32_x8::<F16B32, 1>(w, &[a], |q| _mm256_sub_epi8(q, _mm256_set1_epi8(8)))[0]
    }

    /// Q4_0, eight rows × four columns ([`super::RepackDot8x4Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and four activation rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_x8x4(w: &[&[u8]; 8], a: &[&[u8]; 4]) -> [[f32; 8]; 4] {
        b32_x8::<F16B32, 4>(w, a, |q| _mm256_sub_epi8(q, _mm256_set1_epi8(8)))
    }

    /// IQ4_NL, eight rows ([`super::RepackDot8Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and one activation row of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq4_nl_x8(w: &[&[u8]; 8], a: &[u8]) -> [f32; 8] {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        b32_x8::<F16B32, 1>(w, &[a], |q| _mm256_shuffle_epi8(table, q))[0]
    }

    /// IQ4_NL, eight rows × four columns ([`super::RepackDot8x4Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and four activation rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq4_nl_x8x4(w: &[&[u8]; 8], a: &[&[u8]; 4]) -> [[f32; 8]; 4] {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        b32_x8::<F16B32, 4>(w, a, |q| _mm256_shuffle_epi8(table, q))
    }

    /// Q4_0 in the repacked kernels' order (values `q - 8`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0(w: &[u8], a: &[u8], _k: RepackKernel) -> f32 {
        b32::<F16B32>(w, a, |q| _mm256_sub_epi8(q, _mm256_set1_epi8(8)))
    }

    /// IQ4_NL in the repacked kernels' order (values `kvalues_iq4nl[q]`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn iq4_nl(w: &[u8], a: &[u8], _k: RepackKernel) -> f32 {
        let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        b32::<F16B32>(w, a, |q| _mm256_shuffle_epi8(table, q))
    }

    /// The MXFP4 table (`kvalues_mxfp4`) in both 128-bit halves.
    #[inline(always)]
    unsafe fn mxfp4_table() -> __m256i {
        let t = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
        _mm256_set_m128i(t, t)
    }

    /// MXFP4 in the repacked kernels' order (`ggml_gemv_mxfp4_8x8_q8_0` /
    /// `ggml_gemm_mxfp4_8x8_q8_0`: values `kvalues_mxfp4[q]`, `dx = 2^(e - 128)`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mxfp4(w: &[u8], a: &[u8], _k: RepackKernel) -> f32 {
        let table = mxfp4_table();
        b32::<Mxfp4B32>(w, a, |q| _mm256_shuffle_epi8(table, q))
    }

    /// MXFP4, eight rows ([`super::RepackDot8Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and one activation row of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mxfp4_x8(w: &[&[u8]; 8], a: &[u8]) -> [f32; 8] {
        let table = mxfp4_table();
        b32_x8::<Mxfp4B32, 1>(w, &[a], |q| _mm256_shuffle_epi8(table, q))[0]
    }

    /// MXFP4, eight rows × four columns ([`super::RepackDot8x4Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; eight whole rows and four activation rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mxfp4_x8x4(w: &[&[u8]; 8], a: &[&[u8]; 4]) -> [[f32; 8]; 4] {
        let table = mxfp4_table();
        b32_x8::<Mxfp4B32, 4>(w, a, |q| _mm256_shuffle_epi8(table, q))
    }

    /// Q4_K (144-byte blocks) × Q8_K (292-byte blocks) in the gemv or gemm order (module
    /// doc of the parent).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k(w: &[u8], a: &[u8], kernel: RepackKernel) -> f32 {
        q4_k_cols(w, &[a], kernel)[0]
    }

    /// [`q4_k`] for four activation rows ([`super::RepackDot4Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_x4(w: &[u8], a: &[&[u8]; 4], kernel: RepackKernel) -> [f32; 4] {
        if kernel == RepackKernel::Gemm {
            return q4_k_gemm4::<1>(&[w], a).map(|c| c[0]);
        }
        q4_k_cols(w, a, kernel)
    }

    /// [`q4_k`] for four rows × four activation rows ([`super::RepackDot4x4Fn`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; whole rows of equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_4x4(
        w: &[&[u8]; 4],
        a: &[&[u8]; 4],
        kernel: RepackKernel,
    ) -> [[f32; 4]; 4] {
        if kernel == RepackKernel::Gemm {
            return q4_k_gemm4::<4>(w, a);
        }
        q4_k_tile(w, a, kernel)
    }

    /// [`q4_k_tile`] in the gemm order for `R` rows × 4 columns, the float steps of the
    /// four columns side by side in the lanes of one vector (lane `c` runs exactly column
    /// `c`'s chain of fused multiply-adds): per row and super-block, the pair sums of the
    /// four columns come out of one horizontal add tree per pair, lane `c` for column `c`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // p indexes sub-block pairs in several arrays
    unsafe fn q4_k_gemm4<const R: usize>(w: &[&[u8]; R], a: &[&[u8]; 4]) -> [[f32; R]; 4] {
        let rows = w.iter().fold(usize::MAX, |n, r| n.min(r.len() / 144));
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / 292));
        let m4 = _mm256_set1_epi8(0x0f);
        let (mut acc, mut acc_min) = ([_mm_setzero_ps(); R], [_mm_setzero_ps(); R]);
        for b in 0..nb {
            let y: [*const u8; 4] = std::array::from_fn(|c| a[c].as_ptr().add(292 * b));
            let dy = _mm_setr_ps(
                std::ptr::read_unaligned(y[0] as *const f32),
                std::ptr::read_unaligned(y[1] as *const f32),
                std::ptr::read_unaligned(y[2] as *const f32),
                std::ptr::read_unaligned(y[3] as *const f32),
            );
            for r in 0..R {
                let x = w[r].as_ptr().add(144 * b);
                let s = std::slice::from_raw_parts(x.add(4), 12);
                let mut q = [_mm256_setzero_si256(); 8];
                for p in 0..4 {
                    let qs = _mm256_loadu_si256(x.add(16 + 32 * p) as *const __m256i);
                    q[2 * p] = _mm256_and_si256(qs, m4);
                    q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
                }
                let mut sc = [_mm256_setzero_si256(); 8];
                let mut m16 = [0i16; 16];
                for j in 0..8 {
                    let (scale, min) = scale_min_k4(j, s);
                    sc[j] = _mm256_set1_epi16(scale as i16);
                    m16[2 * j] = min as i16;
                    m16[2 * j + 1] = min as i16;
                }
                let mins = _mm256_loadu_si256(m16.as_ptr() as *const __m256i);
                // pair[c][p]: column c's lanes of sub-blocks 2p and 2p + 1; ml[c]: mins.
                let mut pair = [[_mm256_setzero_si256(); 4]; 4];
                let mut ml = [_mm256_setzero_si256(); 4];
                for c in 0..4 {
                    for p in 0..4 {
                        let v = |j: usize| {
                            let qy = _mm256_loadu_si256(y[c].add(4 + 32 * j) as *const __m256i);
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], qy), sc[j])
                        };
                        pair[c][p] = _mm256_add_epi32(v(2 * p), v(2 * p + 1));
                    }
                    let bsums = _mm256_loadu_si256(y[c].add(260) as *const __m256i);
                    ml[c] = _mm256_madd_epi16(bsums, mins);
                }
                // min pair sums: h01 = [c0: p0 p1, c1: p0 p1 | c0: p2 p3, c1: p2 p3], h23 alike
                let h01 = _mm256_hadd_epi32(ml[0], ml[1]);
                let h23 = _mm256_hadd_epi32(ml[2], ml[3]);
                let (lo01, lo23) = (_mm256_castsi256_ps(h01), _mm256_castsi256_ps(h23));
                let pick = |lo: __m256, hi: __m256, half: bool, odd: bool| {
                    let (l, h) = if half {
                        (_mm256_extractf128_ps(lo, 1), _mm256_extractf128_ps(hi, 1))
                    } else {
                        (_mm256_castps256_ps128(lo), _mm256_castps256_ps128(hi))
                    };
                    let v = if odd {
                        _mm_shuffle_ps(l, h, 0b11_01_11_01)
                    } else {
                        _mm_shuffle_ps(l, h, 0b10_00_10_00)
                    };
                    _mm_cvtepi32_ps(_mm_castps_si128(v))
                };
                let xd = _mm_set1_ps(f16_at(x));
                let xdmin = _mm_set1_ps(f16_at(x.add(2)));
                let (d, dmin) = (_mm_mul_ps(xd, dy), _mm_mul_ps(xdmin, dy));
                for p in 0..4 {
                    let isum = hsum4_i32_vec([pair[0][p], pair[1][p], pair[2][p], pair[3][p]]);
                    acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), d, acc[r]);
                    let imin = pick(lo01, lo23, p >= 2, p % 2 == 1);
                    acc_min[r] = _mm_fmadd_ps(imin, dmin, acc_min[r]);
                }
            }
        }
        let mut out = [[0f32; R]; 4];
        for r in 0..R {
            let mut v = [0f32; 4];
            _mm_storeu_ps(v.as_mut_ptr(), _mm_sub_ps(acc[r], acc_min[r]));
            for c in 0..4 {
                out[c][r] = v[c];
            }
        }
        out
    }

    /// The sums of the eight i32 lanes of `u[0..4]` (exact).
    #[inline(always)]
    unsafe fn hsum4_i32(u: [__m256i; 4]) -> [i32; 4] {
        let s = hsum4_i32_vec(u);
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, s);
        out
    }

    /// The `vpermb` controls that spread a Q4_K super-block's eight scales (in
    /// [`k4_scales_mins_vec`]'s layout, zero-extended to 64 bytes) into the i16 lanes
    /// [`q4_k_gemv_4rows`] multiplies its packed sums by: control `h` serves sub-blocks
    /// `4h..4h + 4`, i16 `k` (128-bit lane `k / 8`, word `k % 8`) taking the scale of
    /// sub-block `4h + 2·(k / 16) + (k % 8) / 4`, its high byte zero (byte 16).
    const Q4_K_SPREAD: [[u8; 64]; 2] = {
        let mut t = [[16u8; 64]; 2];
        let mut h = 0;
        while h < 2 {
            let mut k = 0;
            while k < 32 {
                let j = 4 * h + 2 * (k / 16) + (k % 8) / 4;
                // Scale j's byte in [`k4_scales_mins_vec`]'s layout.
                t[h][2 * k] = (if j < 4 { j } else { j + 4 }) as u8;
                k += 1;
            }
            h += 1;
        }
        t
    };

    /// [`q4_k`] in the gemv order for four rows and one activation row
    /// ([`super::RepackGemv4RowsFn`]), on AVX-512 VNNI. Per super-block and row the two
    /// integers of the gemv order are formed otherwise, exactly, in few instructions (the
    /// routine is bound by how many the core issues):
    /// - `isum`: each 64-byte load of nibbles holds sub-blocks `(j, j + 2)` in its low
    ///   nibbles and `(j + 1, j + 3)` in its high ones, multiplied by `vpdpbusd` against
    ///   the activations arranged the same way once per super-block. Each i32 lane is four
    ///   products, at most `4 · 15 · 128` in size, so `vpackssdw` of the two sums loses
    ///   nothing and puts four sub-blocks' lanes in i16, which one `vpdpwssd` multiplies by
    ///   their 6-bit scales (unpacked in vector registers by [`k4_scales_mins_vec`], spread
    ///   by one `vpermb` per four sub-blocks, [`Q4_K_SPREAD`]);
    /// - `imin` from `madd` of the mins with the bsums' pair sums.
    ///
    /// The float steps are the gemv order's, the four rows in the lanes of one vector: `acc
    /// = fma(isum, d_x·d_y, acc)`, `acc_min = fma(imin, dmin_x·d_y, acc_min)`, then `acc -
    /// acc_min`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 F/VL/BW/VNNI/VBMI; four whole rows of equal length and a
    /// Q8_K row of at least as many blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi")]
    pub(super) unsafe fn q4_k_gemv_4rows(w: &[&[u8]; 4], a: &[u8]) -> [f32; 4] {
        let rows = w.iter().fold(usize::MAX, |n, r| n.min(r.len() / 144));
        let nb = rows.min(a.len() / 292);
        let m4 = _mm512_set1_epi8(0x0f);
        let zero = _mm512_setzero_si512();
        const Z: i8 = -1;
        let mins16 = _mm_setr_epi8(4, Z, 5, Z, 6, Z, 7, Z, 12, Z, 13, Z, 14, Z, 15, Z);
        let spread = Q4_K_SPREAD.map(|c| _mm512_loadu_si512(c.as_ptr() as *const __m512i));
        let (mut acc, mut acc_min) = (_mm_setzero_ps(), _mm_setzero_ps());
        for b in 0..nb {
            let y = a.as_ptr().add(292 * b);
            let dy = std::ptr::read_unaligned(y as *const f32);
            // s_j = bsums[2j] + bsums[2j + 1] (i16: at most 32 · 128).
            let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
            let s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bsums),
                _mm256_extracti128_si256::<1>(bsums),
            );
            // The activations of sub-blocks (j, j + 2) in one vector: (0, 2), (1, 3), (4,
            // 6), (5, 7).
            let qy: [__m512i; 4] = std::array::from_fn(|v| {
                let j = 4 * (v / 2) + v % 2;
                let lo = _mm256_loadu_si256(y.add(4 + 32 * j) as *const __m256i);
                let hi = _mm256_loadu_si256(y.add(4 + 32 * (j + 2)) as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            });
            let mut isum = [_mm256_setzero_si256(); 4];
            let mut imin = [_mm_setzero_si128(); 4];
            let mut dm = [0u32; 4];
            for r in 0..4 {
                let x = w[r].as_ptr().add(144 * b);
                dm[r] = std::ptr::read_unaligned(x as *const u32);
                let sm = k4_scales_mins_vec(x.add(4));
                let scales = _mm512_zextsi128_si512(sm);
                // The mins as i16, in order.
                let mins = _mm_shuffle_epi8(sm, mins16);
                imin[r] = _mm_madd_epi16(mins, s);
                let mut sum = zero;
                for h in 0..2 {
                    let qs = _mm512_loadu_si512(x.add(16 + 64 * h) as *const __m512i);
                    let lo = _mm512_and_si512(qs, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(qs), m4);
                    let t = _mm512_packs_epi32(
                        _mm512_dpbusd_epi32(zero, lo, qy[2 * h]),
                        _mm512_dpbusd_epi32(zero, hi, qy[2 * h + 1]),
                    );
                    let sc = _mm512_permutexvar_epi8(spread[h], scales);
                    sum = _mm512_dpwssd_epi32(sum, t, sc);
                }
                isum[r] = _mm256_add_epi32(
                    _mm512_castsi512_si256(sum),
                    _mm512_extracti64x4_epi64::<1>(sum),
                );
            }
            // [d_0, dmin_0, d_1, dmin_1, …] of the four rows, times d_y.
            let dmx = _mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr() as *const __m128i));
            let dd = _mm256_mul_ps(dmx, _mm256_set1_ps(dy));
            // Even lanes (d) and odd lanes (dmin), four each.
            let even = _mm256_permutevar8x32_ps(dd, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
            let (d4, dmin4) = (
                _mm256_castps256_ps128(even),
                _mm256_extractf128_ps::<1>(even),
            );
            let isum4 = hsum4_i32_vec(isum);
            let imin4 = _mm_hadd_epi32(
                _mm_hadd_epi32(imin[0], imin[1]),
                _mm_hadd_epi32(imin[2], imin[3]),
            );
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(isum4), d4, acc);
            acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(imin4), dmin4, acc_min);
        }
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), _mm_sub_ps(acc, acc_min));
        out
    }

    /// [`q4_k`] for `C` columns of one row.
    #[inline(always)]
    unsafe fn q4_k_cols<const C: usize>(
        w: &[u8],
        a: &[&[u8]; C],
        kernel: RepackKernel,
    ) -> [f32; C] {
        let out = q4_k_tile::<1, C>(&[w], a, kernel);
        std::array::from_fn(|c| out[c][0])
    }

    /// [`q4_k`] for `R` rows × `C` columns, `out[c][r]`. Per super-block, sub-block `j`'s
    /// integer sum scaled by its 6-bit scale is `madd(maddubs(q_j, y_j), sc_j)` in eight i32
    /// lanes (exact: at most `2 · 15 · 128 · 63` a lane), and its mins term
    /// `m_j · (bsums[2j] + bsums[2j+1])` is lane `j` of one `madd`; the gemm order adds them
    /// per pair of sub-blocks, the gemv order per super-block, then the float steps of the
    /// module doc. Each row's block is unpacked once per tile, each column's once per row.
    #[inline(always)]
    unsafe fn q4_k_tile<const R: usize, const C: usize>(
        w: &[&[u8]; R],
        a: &[&[u8]; C],
        kernel: RepackKernel,
    ) -> [[f32; R]; C] {
        let rows = w.iter().fold(usize::MAX, |n, r| n.min(r.len() / 144));
        let nb = a.iter().fold(rows, |n, r| n.min(r.len() / 292));
        let gemm = kernel == RepackKernel::Gemm;
        let m4 = _mm256_set1_epi8(0x0f);
        let (mut acc, mut acc_min) = ([[0f32; R]; C], [[0f32; R]; C]);
        for b in 0..nb {
            let mut q = [[_mm256_setzero_si256(); 8]; R];
            let mut sc = [[_mm256_setzero_si256(); 8]; R];
            let mut mins = [_mm256_setzero_si256(); R];
            let mut xd = [(0f32, 0f32); R];
            for r in 0..R {
                let x = w[r].as_ptr().add(144 * b);
                let s = std::slice::from_raw_parts(x.add(4), 12);
                for p in 0..4 {
                    let qs = _mm256_loadu_si256(x.add(16 + 32 * p) as *const __m256i);
                    q[r][2 * p] = _mm256_and_si256(qs, m4);
                    q[r][2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
                }
                let mut m16 = [0i16; 16];
                for j in 0..8 {
                    let (scale, min) = scale_min_k4(j, s);
                    sc[r][j] = _mm256_set1_epi16(scale as i16);
                    m16[2 * j] = min as i16;
                    m16[2 * j + 1] = min as i16;
                }
                mins[r] = _mm256_loadu_si256(m16.as_ptr() as *const __m256i);
                xd[r] = (f16_at(x), f16_at(x.add(2)));
            }
            for c in 0..C {
                let y = a[c].as_ptr().add(292 * b);
                let dy = f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)]);
                let mut qy = [_mm256_setzero_si256(); 8];
                for (j, v) in qy.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(y.add(4 + 32 * j) as *const __m256i);
                }
                let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
                for r in 0..R {
                    let (d, dmin) = (xd[r].0 * dy, xd[r].1 * dy);
                    let v: [__m256i; 8] = std::array::from_fn(|j| {
                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[r][j], qy[j]), sc[r][j])
                    });
                    let ml = _mm256_madd_epi16(bsums, mins[r]);
                    let (acc, acc_min) = (&mut acc[c][r], &mut acc_min[c][r]);
                    if gemm {
                        let pair = |p: usize| _mm256_add_epi32(v[2 * p], v[2 * p + 1]);
                        let isum = hsum4_i32([pair(0), pair(1), pair(2), pair(3)]);
                        let mut m = [0i32; 8];
                        _mm256_storeu_si256(m.as_mut_ptr() as *mut __m256i, ml);
                        for p in 0..4 {
                            *acc = (isum[p] as f32).mul_add(d, *acc);
                            let imin = m[2 * p] + m[2 * p + 1];
                            *acc_min = (imin as f32).mul_add(dmin, *acc_min);
                        }
                    } else {
                        let t = [
                            _mm256_add_epi32(v[0], v[1]),
                            _mm256_add_epi32(v[2], v[3]),
                            _mm256_add_epi32(v[4], v[5]),
                            _mm256_add_epi32(v[6], v[7]),
                        ];
                        let all = _mm256_add_epi32(
                            _mm256_add_epi32(t[0], t[1]),
                            _mm256_add_epi32(t[2], t[3]),
                        );
                        *acc = (hsum_i32(all) as f32).mul_add(d, *acc);
                        *acc_min = (hsum_i32(ml) as f32).mul_add(dmin, *acc_min);
                    }
                }
            }
        }
        std::array::from_fn(|c| std::array::from_fn(|r| acc[c][r] - acc_min[c][r]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::{repack_quantize_activations, Q8Flavor};

    /// The block-order tiles of `--kernels fast` agree with ggml's scalar dot product of
    /// the type to rounding (another order of the same sums), and with the exact order's
    /// integers: random weights and activations, every output of an 8 × 8 tile.
    #[test]
    fn block_order_tiles_match_the_scalar_dot() {
        let mut seed = 0x0b10_c0de_u64;
        for t in [
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let Some(f) = block_dot8x8_fn(t, crate::target::Tier::host()) else {
                eprintln!("no block-order tile for {t} on this host");
                continue;
            };
            let (ts, n) = (t.type_size(), 5 * 32);
            let nb = n / 32;
            for _ in 0..20 {
                let mut w: Vec<u8> = (0..8 * nb * ts).map(|_| rng(&mut seed) as u8).collect();
                let mut wf = vec![0f32; 8 * n];
                for b in 0..8 * nb {
                    let f16s: &[usize] = match t {
                        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
                        _ => &[0],
                    };
                    for &o in f16s {
                        let v =
                            half::f16::from_f32((rng(&mut seed) % 1000) as f32 / 20000.0 + 1e-3);
                        w[b * ts + o..][..2].copy_from_slice(&v.to_le_bytes());
                    }
                    if t == GgmlType::Q8_0 {
                        for q in &mut w[b * ts + 2..(b + 1) * ts] {
                            if *q == 0x80 {
                                *q = 0x81;
                            }
                        }
                    }
                }
                ir::ggml::dequantize(t, &w, &mut wf).expect("dequantizes");
                let rows: [&[u8]; 8] = std::array::from_fn(|i| &w[i * nb * ts..][..nb * ts]);
                let xs: Vec<Vec<f32>> = (0..8)
                    .map(|_| {
                        (0..n)
                            .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                            .collect()
                    })
                    .collect();
                let acts: Vec<Vec<u8>> = xs
                    .iter()
                    .map(|x| {
                        ir::ggml::quantize_activations(t, x, Q8Flavor::X86)
                            .expect("quantizes")
                            .1
                    })
                    .collect();
                let a: [&[u8]; 8] = std::array::from_fn(|c| &acts[c][..]);
                // SAFETY: chosen for this host; whole rows of equal length.
                let got = unsafe { f(&rows, &a) };
                for c in 0..8 {
                    for i in 0..8 {
                        let want = ir::ggml::vec_dot(t, rows[i], a[c]).expect("scalar dot");
                        let mag: f32 = wf[i * n..(i + 1) * n]
                            .iter()
                            .zip(&xs[c])
                            .map(|(w, x)| (w * x).abs())
                            .sum();
                        assert!(
                            (got[c][i] - want).abs() <= 1e-4 * mag.max(1.0),
                            "{t} row {i} col {c}: {} vs {want}",
                            got[c][i]
                        );
                    }
                }
            }
        }
    }

    /// The packed tiles of the tiled K-quant order equal `ir::ggml`'s reproduction of that
    /// kernel for every column, on activations that hold -128 bytes too (which ggml's
    /// quantizer never writes, but the sign trick of IQ4_XS wraps: the tile must give the
    /// reference's number even then).
    #[test]
    fn tiled_order_tiles_match_the_reference() {
        let mut seed = 0x0071_13d0_u64;
        for t in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ1_S,
            GgmlType::IQ1_M,
        ] {
            let Some(pk) = tiled_packed8x16_fn(t, crate::target::Tier::host()) else {
                eprintln!("no tiled-order 8 x 16 tile for {t} on this host");
                continue;
            };
            // IQ1_M has no f16 field: its scale is assembled from its `scales` nibbles
            // (made finite below).
            let (ts, f16s) = (t.type_size(), crate::rows::f16_scale_offsets(t));
            for nb in [1usize, 3] {
                let mut w: Vec<u8> = (0..8 * nb * ts).map(|_| rng(&mut seed) as u8).collect();
                for blk in w.chunks_exact_mut(ts) {
                    for &o in &f16s {
                        let v =
                            half::f16::from_f32((rng(&mut seed) % 1000) as f32 / 20000.0 - 0.02);
                        blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                    }
                    if t == GgmlType::IQ1_M {
                        // The scale's top nibble (sign and high exponent bits) 0x2.
                        blk[55] = (blk[55] & 0x0f) | 0x20;
                    }
                }
                let rows: [&[u8]; 8] = std::array::from_fn(|i| &w[i * nb * ts..][..nb * ts]);
                let acts: Vec<Vec<u8>> = (0..16)
                    .map(|c| {
                        let x: Vec<f32> = (0..256 * nb)
                            .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                            .collect();
                        let mut a = ir::ggml::quantize_activations(t, &x, Q8Flavor::X86)
                            .expect("quantizes")
                            .1;
                        // A few -128 bytes (more in some columns), the bsums kept true.
                        for blk in a.chunks_exact_mut(292) {
                            for _ in 0..=(c % 3) {
                                let at = (rng(&mut seed) % 256) as usize;
                                blk[4 + at] = 0x80;
                            }
                            for j in 0..16 {
                                let sum: i32 = blk[4 + 16 * j..][..16]
                                    .iter()
                                    .map(|&q| q as i8 as i32)
                                    .sum();
                                blk[260 + 2 * j..][..2]
                                    .copy_from_slice(&(sum as i16).to_le_bytes());
                            }
                        }
                        a
                    })
                    .collect();
                let a: [&[u8]; 16] = std::array::from_fn(|c| &acts[c][..]);
                let mut panel = vec![0u8; nb * pk.block_bytes];
                // SAFETY: chosen for this host; whole rows of `nb` blocks.
                let got = unsafe {
                    (pk.pack)(&a, nb, panel.as_mut_ptr());
                    (pk.tile)(&rows, panel.as_ptr(), nb)
                };
                for c in 0..16 {
                    for i in 0..8 {
                        let want = ir::ggml::vec_dot_avx2_mul_mat(t, rows[i], a[c], 16)
                            .expect("reference");
                        assert_eq!(
                            got[c][i].to_bits(),
                            want.to_bits(),
                            "{t} nb={nb} row {i} col {c}: {} vs {want}",
                            got[c][i]
                        );
                    }
                }
            }
        }
    }

    /// The packed 8 × 16 tiles on sixteen distinct columns: Q4_0, IQ4_NL and Q4_K give
    /// `ir::ggml::RepackedRow`'s gemm numbers bit for bit; the block order's four types are
    /// within rounding of the scalar `vec_dot`.
    #[test]
    fn packed_tiles_match_the_references() {
        let mut seed = 0x0001_6c01_u64;
        let cases = [
            (
                GgmlType::Q4_0,
                packed8x16_fn(GgmlType::Q4_0, crate::target::Tier::host()),
                true,
            ),
            (
                GgmlType::IQ4_NL,
                packed8x16_fn(GgmlType::IQ4_NL, crate::target::Tier::host()),
                true,
            ),
            (
                GgmlType::Q4_K,
                packed8x16_fn(GgmlType::Q4_K, crate::target::Tier::host()),
                true,
            ),
            // The AVX-512 gemm tile, whichever form `packed8x16_fn` chose for prompts.
            (
                GgmlType::Q4_K,
                #[cfg(target_arch = "x86_64")]
                packed8x16_fn(GgmlType::Q4_K, crate::target::Tier::host()).map(|p| Packed8x16 {
                    tile: x86::q4_k_gemm_x8x16,
                    ..p
                }),
                #[cfg(not(target_arch = "x86_64"))]
                None,
                true,
            ),
            (
                GgmlType::Q4_1,
                block_packed8x16_fn(GgmlType::Q4_1, crate::target::Tier::host()),
                false,
            ),
            (
                GgmlType::Q5_0,
                block_packed8x16_fn(GgmlType::Q5_0, crate::target::Tier::host()),
                false,
            ),
            (
                GgmlType::Q5_1,
                block_packed8x16_fn(GgmlType::Q5_1, crate::target::Tier::host()),
                false,
            ),
            (
                GgmlType::Q8_0,
                block_packed8x16_fn(GgmlType::Q8_0, crate::target::Tier::host()),
                false,
            ),
        ];
        for (t, packed, exact) in cases {
            let Some(pk) = packed else {
                eprintln!("no packed 8 x 16 tile for {t} on this host");
                continue;
            };
            let ts = t.type_size();
            for nb in [1usize, 5, 18] {
                let n = t.block_size() * nb;
                let mut w: Vec<u8> = (0..8 * nb * ts).map(|_| rng(&mut seed) as u8).collect();
                for b in 0..8 * nb {
                    let f16s: &[usize] = match t {
                        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K => &[0, 2],
                        _ => &[0],
                    };
                    for &o in f16s {
                        let v =
                            half::f16::from_f32((rng(&mut seed) % 1000) as f32 / 20000.0 - 0.02);
                        w[b * ts + o..][..2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                let rows: [&[u8]; 8] = std::array::from_fn(|i| &w[i * nb * ts..][..nb * ts]);
                let acts: Vec<Vec<u8>> = (0..16)
                    .map(|_| {
                        let x: Vec<f32> = (0..n)
                            .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                            .collect();
                        ir::ggml::quantize_activations(t, &x, Q8Flavor::X86)
                            .expect("quantizes")
                            .1
                    })
                    .collect();
                let a: [&[u8]; 16] = std::array::from_fn(|c| &acts[c][..]);
                let mut panel = vec![0u8; nb * pk.block_bytes];
                // SAFETY: chosen for this host; whole rows of `nb` blocks.
                let got = unsafe {
                    (pk.pack)(&a, nb, panel.as_mut_ptr());
                    (pk.tile)(&rows, panel.as_ptr(), nb)
                };
                for c in 0..16 {
                    for i in 0..8 {
                        let g = got[c][i];
                        if exact {
                            let want = dot_plain(t, rows[i], a[c], RepackKernel::Gemm);
                            assert_eq!(g.to_bits(), want.to_bits(), "{t} nb={nb} row {i} col {c}");
                        } else {
                            let want = ir::ggml::vec_dot(t, rows[i], a[c]).expect("scalar dot");
                            let tol = 1e-5 * want.abs().max(1.0) * nb as f32;
                            assert!(
                                (g - want).abs() <= tol,
                                "{t} nb={nb} row {i} col {c}: {g} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The sixteen-row forms (Q4_K and Q5_K on AMX hosts) give llama.cpp's numbers bit for
    /// bit: Q4_K's repacked gemm and gemv (`ir::ggml::RepackedRow`), Q5_K's tiled order
    /// (`ir::ggml::vec_dot_avx2_mul_mat` with 8 columns); over several panels (an odd one
    /// last), for fewer rows than sixteen and a column range inside the panels, writing
    /// nothing else.
    #[test]
    fn rows16_matches_the_reference() {
        let mut seed = 0x0001_a3c5_u64;
        for t in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::Q6_K,
        ] {
            let pk = packed8x16_fn(t, crate::target::Tier::host())
                .or_else(|| tiled_packed8x16_fn(t, crate::target::Tier::host()));
            let Some((pk, rows16)) = pk.and_then(|p| Some((p, p.rows16?))) else {
                eprintln!("no sixteen-row {t} form on this host");
                continue;
            };
            let ts = t.type_size();
            for nb in [1usize, 5, 18] {
                let mut w: Vec<u8> = (0..16 * nb * ts).map(|_| rng(&mut seed) as u8).collect();
                let f16s: &[usize] = match t {
                    GgmlType::Q3_K => &[108],
                    GgmlType::Q2_K => &[80, 82],
                    GgmlType::Q6_K => &[208],
                    _ => &[0, 2],
                };
                for b in 0..16 * nb {
                    for &o in f16s {
                        let v =
                            half::f16::from_f32((rng(&mut seed) % 1000) as f32 / 20000.0 - 0.02);
                        w[b * ts + o..][..2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                let rows: [&[u8]; 16] = std::array::from_fn(|i| &w[i * nb * ts..][..nb * ts]);
                let groups = 3;
                let acts: Vec<Vec<u8>> = (0..16 * groups)
                    .map(|_| {
                        let x: Vec<f32> = (0..256 * nb)
                            .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                            .collect();
                        ir::ggml::quantize_activations(t, &x, Q8Flavor::X86)
                            .expect("quantizes")
                            .1
                    })
                    .collect();
                let group = nb * pk.block_bytes;
                let mut panel = vec![0u8; groups * group];
                for g in 0..groups {
                    let a: [&[u8]; 16] = std::array::from_fn(|c| &acts[16 * g + c][..]);
                    // SAFETY: chosen for this host; whole rows of `nb` blocks.
                    unsafe { (pk.pack)(&a, nb, panel.as_mut_ptr().add(g * group)) };
                }
                let orders: &[(bool, Option<RepackKernel>)] = match t {
                    GgmlType::Q4_K => &[
                        (false, Some(RepackKernel::Gemm)),
                        (true, Some(RepackKernel::Gemv)),
                    ],
                    _ => &[(false, None)],
                };
                for &(gemv, kernel) in orders {
                    for (n_rows, (c0, c1)) in [(16, (0, 48)), (11, (5, 40))] {
                        let stride = 20;
                        let mut out = vec![f32::NAN; 48 * stride];
                        // SAFETY: chosen for this host; the panels hold three groups; `out`
                        // covers 48 columns of `stride` values.
                        unsafe {
                            rows16(
                                &rows,
                                panel.as_ptr(),
                                nb,
                                (0, groups),
                                gemv,
                                out.as_mut_ptr(),
                                stride,
                                (n_rows, (c0, c1)),
                            )
                        };
                        for c in 0..48 {
                            for i in 0..stride {
                                let got = out[c * stride + i];
                                if i >= n_rows || c < c0 || c >= c1 {
                                    assert!(got.is_nan(), "{t} nb={nb} wrote row {i} col {c}");
                                    continue;
                                }
                                let want = match kernel {
                                    Some(k) => dot_plain(t, rows[i], &acts[c], k),
                                    None => ir::ggml::vec_dot_avx2_mul_mat(t, rows[i], &acts[c], 8)
                                        .expect("tiled product"),
                                };
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{t} nb={nb} {kernel:?} row {i} col {c}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    fn rng(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// An MXFP4 E8M0 exponent for a scale of 2^-10 .. 2 (random bytes reach 2^127), one in
    /// eight 0..4 (the subnormal scales 2^-128, 2^-127 and their neighbours).
    fn e8m0_scale(seed: &mut u64) -> u8 {
        let r = rng(seed);
        if r.is_multiple_of(8) {
            (r >> 8) as u8 % 4
        } else {
            118 + (r >> 8) as u8 % 12
        }
    }

    /// The AVX2 routines equal `ir::ggml::RepackedRow::dot` bit for bit, both kernels.
    #[test]
    fn routines_match_the_reference() {
        let _ = Q8Flavor::X86;
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (t, f16_at) in [
            (GgmlType::Q4_0, &[0usize][..]),
            (GgmlType::IQ4_NL, &[0][..]),
            (GgmlType::Q4_K, &[0, 2][..]),
            (GgmlType::MXFP4, &[][..]),
        ] {
            let Some(f) = dot_fn(t, crate::target::Tier::host()) else {
                eprintln!("no AVX2 routine for {} on this host", t.name());
                continue;
            };
            for blocks in [1usize, 2, 5] {
                let n = blocks * 256;
                for _ in 0..30 {
                    let nb = n / t.block_size();
                    let mut w: Vec<u8> = (0..nb * t.type_size())
                        .map(|_| rng(&mut seed) as u8)
                        .collect();
                    for b in 0..nb {
                        for &o in f16_at {
                            let v = half::f16::from_f32(
                                (rng(&mut seed) % 1000) as f32 / 20000.0 + 1e-3,
                            );
                            w[b * t.type_size() + o..][..2].copy_from_slice(&v.to_le_bytes());
                        }
                        if t == GgmlType::MXFP4 {
                            w[b * t.type_size()] = e8m0_scale(&mut seed);
                        }
                    }
                    let x: Vec<f32> = (0..n)
                        .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    if let Some(f8) = dot8_fn(t, crate::target::Tier::host()) {
                        // Eight different rows: this one with its blocks rotated by i.
                        let ts = t.type_size();
                        let many: Vec<Vec<u8>> = (0..8)
                            .map(|i| {
                                let mut r = w.clone();
                                r.rotate_left((i % nb) * ts);
                                r
                            })
                            .collect();
                        let rows: [&[u8]; 8] = std::array::from_fn(|i| &many[i][..]);
                        let (_, act) = repack_quantize_activations(t, &x, RepackKernel::Gemv)
                            .expect("quantizes");
                        // SAFETY: chosen for this host by `dot8_fn`; whole rows.
                        let got = unsafe { f8(&rows, &act) };
                        for (i, g) in got.iter().enumerate() {
                            let want = dot_plain(t, rows[i], &act, RepackKernel::Gemv);
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{} row {i}: {g} vs {want}",
                                t.name()
                            );
                        }
                    }
                    for k in [RepackKernel::Gemv, RepackKernel::Gemm] {
                        let (_, act) = repack_quantize_activations(t, &x, k).expect("quantizes");
                        // SAFETY: chosen for this host by `dot_fn`; whole rows of equal length.
                        let got = unsafe { f(&w, &act, k) };
                        let want = dot_plain(t, &w, &act, k);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {k:?}: {got} vs {want}",
                            t.name()
                        );
                    }
                }
            }
        }
    }

    /// The four-column forms give, per row and column, `ir::ggml::RepackedRow`'s numbers.
    #[test]
    fn four_column_routines_match_the_reference() {
        let mut seed = 0x0fed_cba9_8765_4321u64;
        for t in [
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::Q4_K,
            GgmlType::MXFP4,
        ] {
            let (ts, n) = (t.type_size(), 3 * 256);
            let nb = n / t.block_size();
            for _ in 0..20 {
                let mut w: Vec<u8> = (0..8 * nb * ts).map(|_| rng(&mut seed) as u8).collect();
                for b in 0..8 * nb {
                    let offsets: &[usize] = match t {
                        GgmlType::Q4_K => &[0, 2],
                        GgmlType::MXFP4 => {
                            w[b * ts] = e8m0_scale(&mut seed);
                            &[]
                        }
                        _ => &[0],
                    };
                    for &o in offsets {
                        let v =
                            half::f16::from_f32((rng(&mut seed) % 1000) as f32 / 20000.0 + 1e-3);
                        w[b * ts + o..][..2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                let rows: [&[u8]; 8] = std::array::from_fn(|i| &w[i * nb * ts..][..nb * ts]);
                for k in [RepackKernel::Gemv, RepackKernel::Gemm] {
                    let acts: Vec<Vec<u8>> = (0..8)
                        .map(|_| {
                            let x: Vec<f32> = (0..n)
                                .map(|_| (rng(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                                .collect();
                            repack_quantize_activations(t, &x, k).expect("quantizes").1
                        })
                        .collect();
                    let a8: [&[u8]; 8] = std::array::from_fn(|c| &acts[c][..]);
                    if let (Some(f), RepackKernel::Gemm) =
                        (dot8x8_fn(t, crate::target::Tier::host()), k)
                    {
                        // SAFETY: chosen for this host; whole rows of equal length.
                        let got = unsafe { f(&rows, &a8) };
                        for c in 0..8 {
                            for i in 0..8 {
                                let want = dot_plain(t, rows[i], a8[c], k);
                                assert_eq!(
                                    got[c][i].to_bits(),
                                    want.to_bits(),
                                    "{t} {k:?} 8x8 row {i} col {c}"
                                );
                            }
                        }
                    }
                    let a: [&[u8]; 4] = std::array::from_fn(|c| &acts[c][..]);
                    if let Some(f) = dot8x4_fn(t, crate::target::Tier::host()) {
                        // SAFETY: chosen for this host; whole rows of equal length.
                        let got = unsafe { f(&rows, &a) };
                        for c in 0..4 {
                            for i in 0..8 {
                                let want = dot_plain(t, rows[i], a[c], k);
                                assert_eq!(
                                    got[c][i].to_bits(),
                                    want.to_bits(),
                                    "{t} {k:?} row {i} col {c}"
                                );
                            }
                        }
                    }
                    if let Some(f) = dot4_fn(t, crate::target::Tier::host()) {
                        // SAFETY: as above.
                        let got = unsafe { f(rows[0], &a, k) };
                        for c in 0..4 {
                            let want = dot_plain(t, rows[0], a[c], k);
                            assert_eq!(got[c].to_bits(), want.to_bits(), "{t} {k:?} col {c}");
                        }
                    }
                    if let (Some(f), RepackKernel::Gemv) =
                        (gemv4rows_fn(t, crate::target::Tier::host()), k)
                    {
                        for c in 0..4 {
                            let four: [&[u8]; 4] = std::array::from_fn(|i| rows[i + c % 2]);
                            // SAFETY: as above.
                            let got = unsafe { f(&four, a[c]) };
                            for r in 0..4 {
                                let want = dot_plain(t, four[r], a[c], k);
                                assert_eq!(
                                    got[r].to_bits(),
                                    want.to_bits(),
                                    "{t} gemv 4 rows r{r} c{c}"
                                );
                            }
                        }
                    }
                    if let Some(f) = dot4x4_fn(t, crate::target::Tier::host()) {
                        let four: [&[u8]; 4] = std::array::from_fn(|i| rows[i]);
                        // SAFETY: as above.
                        let got = unsafe { f(&four, &a, k) };
                        for c in 0..4 {
                            for r in 0..4 {
                                let want = dot_plain(t, rows[r], a[c], k);
                                assert_eq!(
                                    got[c][r].to_bits(),
                                    want.to_bits(),
                                    "{t} {k:?} 4x4 r{r} c{c}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `macs` multiply-adds per call of `f` over its best time in `reps` calls, in GMAC/s.
    fn gmacs(macs: usize, reps: usize, f: &mut dyn FnMut()) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t0 = std::time::Instant::now();
            f();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        macs as f64 / best / 1e9
    }

    /// One pass of `f` over `w` in tiles of `R` rows × `C` columns of `acts`.
    fn sweep<const R: usize, const C: usize>(
        w: &[Vec<u8>],
        acts: &[Vec<u8>],
        f: impl Fn(&[&[u8]; R], &[&[u8]; C]),
    ) {
        for r in (0..w.len()).step_by(R) {
            let ws: [&[u8]; R] = std::array::from_fn(|i| &w[r + i][..]);
            for c in (0..acts.len()).step_by(C) {
                let a: [&[u8]; C] = std::array::from_fn(|i| &acts[c + i][..]);
                f(&ws, &a);
            }
        }
    }

    /// Speed of the Q4_0 repacked-order tiles on hot data (576 × 1536 weights, 32 tokens):
    /// `cargo test --release -p codegen-cpu --lib repack_tile_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn repack_tile_speed() {
        let t = GgmlType::Q4_0;
        let (k, m, n) = (576usize, 1536usize, 32usize);
        let mut seed = 0x1234_5678u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let w: Vec<Vec<u8>> = (0..m)
            .map(|_| {
                let mut r: Vec<u8> = (0..k / 32 * 18).map(|_| rnd() as u8).collect();
                for b in r.chunks_exact_mut(18) {
                    b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
                r
            })
            .collect();
        let acts: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let mut r: Vec<u8> = (0..k / 32 * 34).map(|_| rnd() as u8 & 0x7f).collect();
                for b in r.chunks_exact_mut(34) {
                    b[..2].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
                }
                r
            })
            .collect();
        let time = |f: &mut dyn FnMut()| gmacs(m * n * k, 300, f);
        if let Some(f) = dot8x4_fn(t, crate::target::Tier::host()) {
            let g = time(&mut || {
                sweep::<8, 4>(&w, &acts, |ws, a| {
                    // SAFETY: chosen for this host; whole rows.
                    std::hint::black_box(unsafe { f(ws, a) });
                })
            });
            eprintln!("Q4_0 8x4 (AVX2): {g:.1} GMAC/s");
        }
        if let Some(f) = dot8x8_fn(t, crate::target::Tier::host()) {
            let g = time(&mut || {
                sweep::<8, 8>(&w, &acts, |ws, a| {
                    // SAFETY: chosen for this host; whole rows.
                    std::hint::black_box(unsafe { f(ws, a) });
                })
            });
            eprintln!("Q4_0 8x8 (VNNI): {g:.1} GMAC/s");
        }
        // Q4_K, K = 1536 (six super-blocks): the gemm 4 × 4 tile against the 8 × 8 one.
        let t = GgmlType::Q4_K;
        let k = 1536;
        let w: Vec<Vec<u8>> = (0..m)
            .map(|_| {
                let mut r: Vec<u8> = (0..k / 256 * 144).map(|_| rnd() as u8).collect();
                for b in r.chunks_exact_mut(144) {
                    b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                    b[2..4].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
                }
                r
            })
            .collect();
        let acts: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let mut r: Vec<u8> = (0..k / 256 * 292).map(|_| rnd() as u8 & 0x7f).collect();
                for b in r.chunks_exact_mut(292) {
                    b[..4].copy_from_slice(&0.02f32.to_le_bytes());
                }
                r
            })
            .collect();
        let time = |f: &mut dyn FnMut()| gmacs(m * n * k, 100, f);
        if let Some(f) = dot4x4_fn(t, crate::target::Tier::host()) {
            let g = time(&mut || {
                sweep::<4, 4>(&w, &acts, |ws, a| {
                    // SAFETY: chosen for this host; whole rows.
                    std::hint::black_box(unsafe { f(ws, a, RepackKernel::Gemm) });
                })
            });
            eprintln!("Q4_K gemm 4x4 (AVX2): {g:.1} GMAC/s");
        }
        if let Some(f) = dot8x8_fn(t, crate::target::Tier::host()) {
            let g = time(&mut || {
                sweep::<8, 8>(&w, &acts, |ws, a| {
                    // SAFETY: chosen for this host; whole rows.
                    std::hint::black_box(unsafe { f(ws, a) });
                })
            });
            eprintln!("Q4_K gemm 8x8 (VNNI): {g:.1} GMAC/s");
        }
    }
}
