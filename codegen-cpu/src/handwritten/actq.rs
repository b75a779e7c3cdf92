//! The activation quantizer: f32 rows to the 8-bit blocks of [`crate::actq`] before every
//! quantized matmul. This is the one production implementation: the executor's fused
//! matmuls and [`crate::matmul::MatmulKernel::prepare`] both call [`FastQuant`].
//!
//! - On x86-64 hosts with AVX2 + FMA + F16C: [`block_avx2`], hand-written with `std::arch`,
//!   about 20 times faster than the scalar reference (which rounds through a libm call per
//!   value).
//! - Elsewhere (other architectures, older x86 CPUs): the scalar reference
//!   [`crate::actq::quantize_act`] itself, the portable fallback. It is also the test oracle
//!   this module is checked against, byte for byte.
//!
//! The layout belongs to [`crate::actq`] (its module doc). Because that layout may change
//! with the kernels, [`FastQuant::new`] checks the AVX2 path byte for byte against
//! `quantize_act` on test rows before using it, and falls back to `quantize_act` when the
//! check fails (the executor reports that in its `LoadStats`).
//!
//! Values (as ggml's AVX2 `quantize_row_q8_0` / `q8_1`): per block of 32, `amax = max|x|`,
//! `d = amax / 127`, `id = 127 / amax` (0 for an all-zero block), `q = round_half_even(x·id)`
//! (`vcvtps2dq` in the default rounding mode), `d` stored f16-rounded, Q8_1's `s = f16(d·Σq)`,
//! a zero-point format's `z·Σq`. Both paths give the same bytes for finite inputs; inputs
//! with NaN or infinities may quantize differently (both are garbage then).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::has_avx2;
use crate::actq::{act_row_bytes, quantize_act};
#[cfg(target_arch = "x86_64")]
use crate::actq::{ACT_AUX_OFFSET, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
#[cfg(target_arch = "x86_64")]
use crate::formats::ActKind;
use crate::formats::{QuantFormat, QK};

/// The activation quantizer for one format: the AVX2 path when the host has it and it
/// passed its self-check, else the scalar reference (module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastQuant {
    fmt: QuantFormat,
    fast: bool,
}

impl FastQuant {
    /// The quantizer for `fmt`: the AVX2 path when the host has it and it reproduces
    /// `quantize_act` on test rows exactly, else the reference.
    pub fn new(fmt: QuantFormat) -> FastQuant {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut q = FastQuant { fmt, fast: false };
        #[cfg(target_arch = "x86_64")]
        if has_avx2() && ACT_QS_OFFSET + 8 * 16 == ACT_BLOCK_BYTES {
            q.fast = true;
            q.fast = q.agrees();
        }
        q
    }

    /// The format.
    pub fn format(&self) -> &QuantFormat {
        &self.fmt
    }

    /// Whether the AVX2 path is in use (else the scalar reference).
    pub fn is_fast(&self) -> bool {
        self.fast
    }

    /// Whether the AVX2 path gives the reference's bytes on test rows.
    #[cfg(target_arch = "x86_64")]
    fn agrees(&self) -> bool {
        let k = 8 * QK;
        let mut x = Vec::with_capacity(k);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..k {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            // Mixed scales, an all-zero block, exact ties (x·id = n + 0.5) and extremes.
            let v = match i / QK {
                0 => 0.0,
                1 => (i % 9) as f32 - 4.0 + 0.5,
                2 => (u - 0.5) * 1e-3,
                3 => (u - 0.5) * 2e4,
                _ => (u - 0.5) * 6.0,
            };
            x.push(v);
        }
        x[3 * QK + 5] = 127.0;
        let mut want = vec![0u8; act_row_bytes(k)];
        let mut got = vec![0u8; act_row_bytes(k)];
        if quantize_act(&self.fmt, k, 1, &x, &mut want).is_err() {
            return false;
        }
        // SAFETY: `x` holds `k` values and `got` one prepared row of `k`.
        unsafe { self.row(x.as_ptr(), got.as_mut_ptr(), k) };
        want == got
    }

    /// Quantizes one row of `k` values (a multiple of 32) into `act_row_bytes(k)` bytes.
    ///
    /// # Safety
    /// `x` valid for `k` reads, `out` for `act_row_bytes(k)` writes; no overlap.
    pub unsafe fn row(&self, x: *const f32, out: *mut u8, k: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.fast {
            let aux_z = match self.fmt.act {
                ActKind::Q8_1 => None,
                ActKind::Q8_0 => Some(self.fmt.zero_point),
            };
            for b in 0..k / QK {
                block_avx2(x.add(b * QK), out.add(b * ACT_BLOCK_BYTES), aux_z);
            }
            return;
        }
        let xs = std::slice::from_raw_parts(x, k);
        let os = std::slice::from_raw_parts_mut(out, act_row_bytes(k));
        // Sizes match by construction; the reference only fails on wrong sizes.
        let _ = quantize_act(&self.fmt, k, 1, xs, os);
    }

    /// Quantizes `x` (whole rows of `k` values, `k` a multiple of 32) into `out`
    /// (`act_row_bytes(k)` bytes per row). Returns `false`, writing nothing, when `k` is not a
    /// positive multiple of 32 or the lengths do not match.
    pub fn rows(&self, x: &[f32], out: &mut [u8], k: usize) -> bool {
        let arb = act_row_bytes(k);
        if k == 0 || !k.is_multiple_of(QK) || !x.len().is_multiple_of(k) {
            return false;
        }
        if x.len() / k * arb != out.len() {
            return false;
        }
        for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(arb)) {
            // SAFETY: `xr` holds `k` values and `or` `act_row_bytes(k)` bytes; distinct
            // borrows do not overlap.
            unsafe { self.row(xr.as_ptr(), or.as_mut_ptr(), k) };
        }
        true
    }
}

/// One block of 32 values (see the module doc); `zero_point` `None` means Q8_1.
///
/// # Safety
/// The host must have AVX2, FMA and F16C; `x` valid for 32 reads, `out` for
/// [`ACT_BLOCK_BYTES`] writes; no overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2(x: *const f32, out: *mut u8, zero_point: Option<i32>) {
    let v = [
        _mm256_loadu_ps(x),
        _mm256_loadu_ps(x.add(8)),
        _mm256_loadu_ps(x.add(16)),
        _mm256_loadu_ps(x.add(24)),
    ];
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mul = _mm256_set1_ps(id);
    let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], mul)));
    // Σq in i32.
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
    let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b10_11_00_01>(s4));
    let sum = _mm_cvtsi128_si32(s4);
    // Pack to i8 in order: packs work within 128-bit lanes, so undo the interleave.
    let p16a = _mm256_packs_epi32(q[0], q[1]);
    let p16b = _mm256_packs_epi32(q[2], q[3]);
    let p8 = _mm256_packs_epi16(p16a, p16b);
    let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let lo = _mm256_castsi256_si128(p8);
    let hi = _mm256_extracti128_si256::<1>(p8);
    let qs = out.add(ACT_QS_OFFSET) as *mut __m128i;
    _mm_storeu_si128(qs, _mm_shuffle_epi32::<0x00>(lo));
    _mm_storeu_si128(qs.add(1), _mm_shuffle_epi32::<0x55>(lo));
    _mm_storeu_si128(qs.add(2), _mm_shuffle_epi32::<0xAA>(lo));
    _mm_storeu_si128(qs.add(3), _mm_shuffle_epi32::<0xFF>(lo));
    _mm_storeu_si128(qs.add(4), _mm_shuffle_epi32::<0x00>(hi));
    _mm_storeu_si128(qs.add(5), _mm_shuffle_epi32::<0x55>(hi));
    _mm_storeu_si128(qs.add(6), _mm_shuffle_epi32::<0xAA>(hi));
    _mm_storeu_si128(qs.add(7), _mm_shuffle_epi32::<0xFF>(hi));
    let f16r = |f: f32| {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
            _mm_set_ss(f),
        )))
    };
    _mm_storeu_ps(out as *mut f32, _mm_set1_ps(f16r(d)));
    let aux = match zero_point {
        None => _mm_castps_si128(_mm_set1_ps(f16r(d * sum as f32))),
        Some(z) => _mm_set1_epi32(z.wrapping_mul(sum)),
    };
    _mm_storeu_si128(out.add(ACT_AUX_OFFSET) as *mut __m128i, aux);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::GgmlType;

    /// On an AVX2 host the vector path is taken for every format and reproduces the
    /// reference on rows of SmolLM2's widths (a layout change in `actq` shows up here);
    /// elsewhere the reference itself runs.
    #[test]
    fn vector_path_matches_reference() {
        let mut s = 12345u64;
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let fmt = QuantFormat::of(t).expect("format");
            let q = FastQuant::new(fmt);
            #[cfg(target_arch = "x86_64")]
            assert!(
                q.is_fast() || !has_avx2(),
                "{}: the vector quantizer disagrees with actq",
                t.name()
            );
            for k in [576, 1536] {
                let x: Vec<f32> = (0..k)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
                    })
                    .collect();
                let mut want = vec![0u8; act_row_bytes(k)];
                let mut got = vec![0u8; act_row_bytes(k)];
                quantize_act(&fmt, k, 1, &x, &mut want).expect("reference");
                // SAFETY: sizes as required.
                unsafe { q.row(x.as_ptr(), got.as_mut_ptr(), k) };
                assert!(want == got, "{} k={k}", t.name());
                // Two rows at once through the safe entry.
                let x2 = [&x[..], &x[..]].concat();
                let mut got2 = vec![0u8; 2 * act_row_bytes(k)];
                assert!(q.rows(&x2, &mut got2, k));
                assert!(got2[..want.len()] == want[..] && got2[want.len()..] == want[..]);
                assert!(!q.rows(&x2, &mut got2[1..], k), "wrong output length");
            }
        }
    }
}
