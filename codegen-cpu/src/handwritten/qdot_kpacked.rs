//! Packed 4 × 8 tiles of the K-quants in `ggml_vec_dot_*_q8_K`'s order (the AVX2 kernels
//! `ir::ggml::vec_dot_avx2` reproduces): the order llama.cpp keeps for one-column products,
//! so these serve batched decode (each of several sequences' tokens is its own one-column
//! product; a server's `-np` slots). Prompts take the tiled order's 8 × 16 tiles
//! (`qdot_repack`).
//!
//! Each 512-bit register holds two columns, eight i32 (then f32) lanes each, lane `k` of a
//! column summing the products at bytes `4k..4k+4` of every 32-value vector, each vector's
//! four-product sums scaled by its sub-block scale — ggml's lanes. The sums are exact: a
//! vector's four products by `vpdpbusd` (unsigned quants × signed activations), scaled by
//! `vpdpwssd` against the scale in the low half of each i32 lane (a four-product sum fits
//! an i16), a type's offset folded through the activations' `bsums` as ggml folds it. The
//! float steps per super-block and the final reduction are ggml's, per lane.
//! The activations of eight columns are packed once per chunk of tokens ([`pack8`]).

use ir::ggml::GgmlType;

use super::qdot::Packed4x8;

/// The packed 4 × 8 tile of `wtype` in the `vec_dot` order, on hosts with AVX-512
/// (F, VL, BW, VNNI): Q6_K (the output weight of llama-quantize's Q4_0, Q4_1, Q4_K_M and
/// Q5_K_M files, and some FFN-down / V weights of the K-quant mixes). Q4_K, whose weights
/// llama.cpp repacks, decodes in the repacked order instead (`qdot_repack`).
pub(crate) fn packed4x8_fn(wtype: GgmlType, tier: crate::target::Tier) -> Option<Packed4x8> {
    #[cfg(target_arch = "x86_64")]
    if tier.vnni() {
        let tile: super::qdot::Tile4x8Fn = match wtype {
            GgmlType::Q6_K => x86::q6_k_q8_k_4x8,
            _ => return None,
        };
        return Some(Packed4x8 {
            pack: x86::pack8,
            tile,
            tile6: None,
            block_bytes: x86::PANEL_BLOCK_BYTES,
            multiple: 1,
            widen: None,
        });
    }
    let _ = (wtype, tier);
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::qdot::x86::{f16_at, f32_at};

    /// Bytes of a Q8_K block: `d` (f32), 256 quants, 16 `bsums` (i16).
    const Q8_K_BYTES: usize = 4 + 256 + 32;
    /// Bytes of a Q6_K block: `ql[128]`, `qh[64]`, `scales[16]` (i8), `d` (f16).
    const Q6_K_BYTES: usize = 128 + 64 + 16 + 2;

    /// Panel offsets within a block ([`pack8`]): the quants, vector `v` (values
    /// `32v..32v + 32`) and column pair `p` at `QS + 64·(4v + p)` (the two columns' 32 bytes
    /// side by side).
    const QS: usize = 0;
    /// Each column pair's `d_y` in eight f32 lanes per column (`YD + 64p`).
    const YD: usize = 8 * 4 * 64;
    /// Each column pair's sixteen `bsums` (i16) side by side (`BSUMS + 64p`).
    const BSUMS: usize = YD + 4 * 64;
    /// Panel bytes per block of eight columns.
    pub(super) const PANEL_BLOCK_BYTES: usize = BSUMS + 4 * 64;

    /// Packs eight Q8_K activation rows of `nb` blocks for the tiles (`nb ·
    /// PANEL_BLOCK_BYTES` bytes at `out`): the quants and `bsums` of column pairs side by
    /// side, `d_y` spread over its eight lanes.
    ///
    /// # Safety
    /// The host has AVX-512 F/VL/BW/VNNI; rows of at least `nb` Q8_K blocks; `out` writable
    /// for `nb · PANEL_BLOCK_BYTES` bytes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(super) unsafe fn pack8(a: &[&[u8]; 8], nb: usize, out: *mut u8) {
        for b in 0..nb {
            let ob = out.add(b * PANEL_BLOCK_BYTES);
            let y = |c: usize| a[c].as_ptr().add(b * Q8_K_BYTES);
            for p in 0..4 {
                let (y0, y1) = (y(2 * p), y(2 * p + 1));
                for v in 0..8 {
                    let q = pair(y0.add(4 + 32 * v), y1.add(4 + 32 * v));
                    _mm512_storeu_si512(ob.add(QS + 64 * (4 * v + p)) as *mut __m512i, q);
                }
                let d = _mm512_mask_blend_ps(
                    0xff00,
                    _mm512_set1_ps(f32_at(y0)),
                    _mm512_set1_ps(f32_at(y1)),
                );
                _mm512_storeu_ps(ob.add(YD + 64 * p) as *mut f32, d);
                let bsums = pair(y0.add(260), y1.add(260));
                _mm512_storeu_si512(ob.add(BSUMS + 64 * p) as *mut __m512i, bsums);
            }
        }
    }

    /// `ggml_vec_dot_q6_K_q8_K` for four weight rows × eight packed columns, `out[c][r]`
    /// (`qdot::x86::q6_k_q8_k`'s numbers): per super-block and output, eight i32 lanes,
    /// lane `j` the sum over the eight 32-value vectors of each 16-value group's scale
    /// times the unsigned 6-bit quants' products at bytes `4j..4j+4`, less
    /// `32·(bsums[2j]·scale[2j] + bsums[2j+1]·scale[2j+1])`; `acc = fma(d_y·d_x, lanes,
    /// acc)`; `hsum_float_8(acc)` at the end.
    ///
    /// # Safety
    /// The host has AVX-512 F/VL/BW/VNNI; whole rows of `nb` Q6_K blocks; `panel` packed by
    /// [`pack8`] from `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(super) unsafe fn q6_k_q8_k_4x8(
        w: &[&[u8]; 4],
        panel: *const u8,
        nb: usize,
    ) -> [[f32; 4]; 8] {
        let low4 = _mm512_set1_epi8(0x0f);
        let three = _mm512_set1_epi8(3);
        let zero = _mm512_setzero_si512();
        // acc[r][p]: row r, columns 2p (lanes 0..8) and 2p + 1 (8..16).
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        for b in 0..nb {
            let pb = panel.add(b * PANEL_BLOCK_BYTES);
            for (r, accr) in acc.iter_mut().enumerate() {
                let x = w[r].as_ptr().add(b * Q6_K_BYTES);
                let (ql, qh, sc) = (x, x.add(128), x.add(192));
                let vxd = _mm512_set1_ps(f16_at(x.add(208)));
                // Scale `g` in the low half of i32 lane `g` (high half 0); the sixteen
                // scales as i16, twice (one copy per column of a pair).
                let sc8 = _mm_loadu_si128(sc as *const __m128i);
                let sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), _mm512_set1_epi32(0xffff));
                let sc16 = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(sc8));
                let mut sumi = [zero; 4];
                for half in 0..2 {
                    let l0 = bcast32(ql.add(64 * half));
                    let l1 = bcast32(ql.add(64 * half + 32));
                    let h = bcast32(qh.add(32 * half));
                    let q = [
                        _mm512_or_si512(_mm512_and_si512(l0, low4), high2::<0>(h, three)),
                        _mm512_or_si512(_mm512_and_si512(l1, low4), high2::<2>(h, three)),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(l0), low4),
                            high2::<4>(h, three),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(l1), low4),
                            high2::<6>(h, three),
                        ),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        let v = 4 * half + k;
                        // Lanes 0..4 and 8..12 take the vector's first 16-value group's
                        // scale, lanes 4..8 and 12..16 its second's.
                        let g = (2 * v) as i32;
                        let idx = _mm512_set_epi32(
                            g + 1,
                            g + 1,
                            g + 1,
                            g + 1,
                            g,
                            g,
                            g,
                            g,
                            g + 1,
                            g + 1,
                            g + 1,
                            g + 1,
                            g,
                            g,
                            g,
                            g,
                        );
                        let s = _mm512_permutexvar_epi32(idx, sc32);
                        for (p, sp) in sumi.iter_mut().enumerate() {
                            let y8 =
                                _mm512_loadu_si512(pb.add(QS + 64 * (4 * v + p)) as *const __m512i);
                            *sp = _mm512_dpwssd_epi32(*sp, _mm512_dpbusd_epi32(zero, *qk, y8), s);
                        }
                    }
                }
                for (p, sp) in sumi.iter().enumerate() {
                    let bsums = _mm512_loadu_si512(pb.add(BSUMS + 64 * p) as *const __m512i);
                    let offset = _mm512_slli_epi32::<5>(_mm512_madd_epi16(bsums, sc16));
                    let lanes = _mm512_sub_epi32(*sp, offset);
                    let d = _mm512_mul_ps(_mm512_loadu_ps(pb.add(YD + 64 * p) as *const f32), vxd);
                    accr[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), accr[p]);
                }
            }
        }
        let mut out = [[0f32; 4]; 8];
        for (r, accr) in acc.iter().enumerate() {
            for (p, ap) in accr.iter().enumerate() {
                let v = super::super::fdot::x86::hsum8_pair(*ap);
                out[2 * p][r] = v[0];
                out[2 * p + 1][r] = v[1];
            }
        }
        out
    }

    /// The 32 bytes at `lo` in the low half of a 512-bit register, the 32 at `hi` in the
    /// high half.
    #[inline(always)]
    unsafe fn pair(lo: *const u8, hi: *const u8) -> __m512i {
        let l = _mm256_loadu_si256(lo as *const __m256i);
        let h = _mm256_loadu_si256(hi as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l), h)
    }

    /// The 32 bytes at `p` in both halves of a 512-bit register (one broadcast load).
    #[inline(always)]
    unsafe fn bcast32(p: *const u8) -> __m512i {
        _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
    }

    /// `((h >> SHIFT) & 3) << 4` per byte: a Q6_K value's two high bits in place.
    #[inline(always)]
    unsafe fn high2<const SHIFT: u32>(h: __m512i, three: __m512i) -> __m512i {
        _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srli_epi16::<SHIFT>(h), three))
    }
}
