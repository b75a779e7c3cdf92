//! Quantizers for the activation companion formats of llama.cpp's CPU matrix products
//! (`vec_dot_type`: Q8_0, Q8_1, Q8_K, F16, BF16, F32), bit-exact with ggml.
//!
//! ggml has one reference quantizer per format (`quantize_row_q8_0_ref` ... in
//! ggml-quants.c), but the CPU backend's `from_float` for Q8_0 and Q8_1 is SIMD code whose
//! rounding differs from the reference on exact ties and, on x86, in how the inverse scale
//! is computed. The three behaviours are [`Q8Flavor`]s; Q8_K, F16 and BF16 have one behaviour
//! everywhere.

use super::error::{check_lengths, BlockDataError};
use super::fp::{f32_to_bf16, f32_to_f16};
use super::{GgmlType, QK_K};

/// Which of ggml's Q8_0 / Q8_1 activation quantizers to reproduce.
///
/// All three compute `amax = max |x|` over the 32 values and store `d = amax / 127` as f16.
/// They differ in the multiplier and the rounding of `x * id`:
///
/// | flavor | `id` | rounding of `x * id` | ggml source |
/// | --- | --- | --- | --- |
/// | `Reference` | `d != 0 ? 1 / d : 0` | `roundf`: ties away from zero | `quantize_row_q8_0_ref` (ggml-quants.c); the generic CPU path |
/// | `X86` | `amax != 0 ? 127 / amax : 0` | ties to even (`_mm256_round_ps`) | `quantize_row_q8_0` in ggml-cpu/arch/x86/quants.c (AVX, AVX2, AVX-512 builds) |
/// | `Arm` | `d != 0 ? 1 / d : 0` | ties to even (`vcvtnq_s32_f32`) | `quantize_row_q8_0` in ggml-cpu/arch/arm/quants.c (NEON builds) |
///
/// Q8_1 differs the same way; its `s` is `f16(d * sum(qs))` in every flavor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Q8Flavor {
    /// ggml's reference quantizer (used when no SIMD path exists).
    #[default]
    Reference,
    /// llama.cpp built for x86-64 with AVX/AVX2 (what produced `shared/fixtures/reference/`).
    X86,
    /// llama.cpp built for ARM with NEON (Apple silicon, most aarch64 servers).
    Arm,
}

impl Q8Flavor {
    /// The flavor llama.cpp uses on the machine this code runs on: `X86` on x86-64 (assuming
    /// llama.cpp was built with AVX, as every distributed build is), `Arm` on aarch64,
    /// `Reference` elsewhere.
    pub fn native() -> Q8Flavor {
        if cfg!(target_arch = "x86_64") {
            Q8Flavor::X86
        } else if cfg!(target_arch = "aarch64") {
            Q8Flavor::Arm
        } else {
            Q8Flavor::Reference
        }
    }

    /// `(d, id)` for a block whose largest magnitude is `amax`.
    #[inline]
    fn scales(self, amax: f32) -> (f32, f32) {
        let d = amax / 127.0;
        let id = match self {
            Q8Flavor::X86 => {
                if amax != 0.0 {
                    127.0 / amax
                } else {
                    0.0
                }
            }
            Q8Flavor::Reference | Q8Flavor::Arm => {
                if d != 0.0 {
                    1.0 / d
                } else {
                    0.0
                }
            }
        };
        (d, id)
    }

    /// Rounds `v` to an integer the way this flavor does (then saturates to i8, as the
    /// conversions in ggml do for in-range values).
    #[inline]
    fn round(self, v: f32) -> i8 {
        match self {
            Q8Flavor::Reference => v.round() as i8,
            Q8Flavor::X86 | Q8Flavor::Arm => round_ties_even(v) as i8,
        }
    }
}

/// Quantizes `src` to `dst` as type `t`, for the activation types of the CPU dot products:
/// F32 (a little-endian copy), F16, BF16, Q8_0, Q8_1 (both per `flavor`) and Q8_K.
///
/// # Errors
/// [`BlockDataError::Unsupported`] for any other type (weight formats are not quantized
/// here); [`BlockDataError::PartialBlock`] / [`BlockDataError::ByteLength`] if `src.len()` is
/// not whole blocks or `dst.len()` is not their byte size.
pub fn quantize(
    t: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    flavor: Q8Flavor,
) -> Result<(), BlockDataError> {
    match t {
        GgmlType::F32 => {
            check_lengths(t, "dst", src.len(), dst.len())?;
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
            Ok(())
        }
        GgmlType::F16 => quantize_f16(src, dst),
        GgmlType::BF16 => quantize_bf16(src, dst),
        GgmlType::Q8_0 => quantize_q8_0_with(src, dst, flavor),
        GgmlType::Q8_1 => quantize_q8_1_with(src, dst, flavor),
        GgmlType::Q8_K => quantize_q8_k(src, dst),
        _ => Err(BlockDataError::Unsupported {
            op: "quantize",
            ty: t,
        }),
    }
}

/// F32 → F16, round to nearest even (ggml's `GGML_FP32_TO_FP16`, F16C on x86).
///
/// # Errors
/// [`BlockDataError::ByteLength`] unless `dst.len() == 2 * src.len()`.
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::F16, "dst", src.len(), dst.len())?;
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
    }
    Ok(())
}

/// F32 → BF16 as ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaN made quiet.
///
/// # Errors
/// [`BlockDataError::ByteLength`] unless `dst.len() == 2 * src.len()`.
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::BF16, "dst", src.len(), dst.len())?;
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
    Ok(())
}

/// F32 → Q8_0 with ggml's reference quantizer (`quantize_row_q8_0_ref`); see
/// [`quantize_q8_0_with`].
///
/// # Errors
/// As [`quantize_q8_0_with`].
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    quantize_q8_0_with(src, dst, Q8Flavor::Reference)
}

/// F32 → Q8_0 (`d` f16 @0, `qs[32]` int8 @2): per 32 values `d = amax / 127`,
/// `qs = round(x * id)` as [`Q8Flavor`] says.
///
/// # Errors
/// [`BlockDataError::PartialBlock`] if `src.len()` is not a multiple of 32;
/// [`BlockDataError::ByteLength`] unless `dst.len() == src.len() / 32 * 34`.
pub fn quantize_q8_0_with(
    src: &[f32],
    dst: &mut [u8],
    flavor: Q8Flavor,
) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::Q8_0, "dst", src.len(), dst.len())?;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let (d, id) = flavor.scales(abs_max(x));
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, &v) in b[2..].iter_mut().zip(x) {
            *o = flavor.round(v * id) as u8;
        }
    }
    Ok(())
}

/// F32 → Q8_1 with ggml's reference quantizer (`quantize_row_q8_1_ref`); see
/// [`quantize_q8_1_with`].
///
/// # Errors
/// As [`quantize_q8_1_with`].
pub fn quantize_q8_1(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    quantize_q8_1_with(src, dst, Q8Flavor::Reference)
}

/// F32 → Q8_1 (`d` f16 @0, `s` f16 @2, `qs[32]` int8 @4): as Q8_0, plus
/// `s = f16(sum(qs) * d)` (the integer sum converted to f32, times the f32 `d` before its
/// rounding to f16).
///
/// # Errors
/// [`BlockDataError::PartialBlock`] if `src.len()` is not a multiple of 32;
/// [`BlockDataError::ByteLength`] unless `dst.len() == src.len() / 32 * 36`.
pub fn quantize_q8_1_with(
    src: &[f32],
    dst: &mut [u8],
    flavor: Q8Flavor,
) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::Q8_1, "dst", src.len(), dst.len())?;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(36)) {
        let (d, id) = flavor.scales(abs_max(x));
        let mut sum = 0i32;
        for (o, &v) in b[4..].iter_mut().zip(x) {
            let q = flavor.round(v * id);
            sum += q as i32;
            *o = q as u8;
        }
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
    }
    Ok(())
}

/// F32 → Q8_K (`d` f32 @0, `qs[256]` int8 @4, `bsums[16]` i16 @260), as ggml's
/// `quantize_row_q8_K_ref` (which every CPU backend uses):
///
/// - `max` is the value of largest magnitude, sign included (the first one on ties);
/// - if it is 0 the block is `d = 0` with zero quants and zero `bsums` (ggml leaves `bsums`
///   unwritten there; with `d = 0` they do not affect any dot product);
/// - else `iscale = -127 / max`, `qs = min(127, nearest_int(iscale * x))` with ties to
///   even, `d = 1 / iscale` (so `d` is negative when `max` is positive), and `bsums[j]` is
///   the sum of `qs[16 j .. 16 j + 16]`.
///
/// # Errors
/// [`BlockDataError::PartialBlock`] if `src.len()` is not a multiple of 256;
/// [`BlockDataError::ByteLength`] unless `dst.len() == src.len() / 256 * 292`.
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::Q8_K, "dst", src.len(), dst.len())?;
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(292)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b[0..4].copy_from_slice(&0.0f32.to_le_bytes());
            b[4..292].fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in b[4..260].iter_mut().zip(x) {
            *o = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = b[4 + 16 * j..4 + 16 * j + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
    Ok(())
}

/// ggml's `nearest_int` (ggml-quants.c): round to nearest, ties to even, for
/// `|x| <= 4194303` (it adds 1.5 * 2^23 and reads the mantissa; same result as
/// `round_ties_even` in that range).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    round_ties_even(x) as i32
}

/// `x.round_ties_even()`, by ggml's own trick where `|x| < 2^22`: adding `1.5 · 2^23`
/// leaves no fraction bits, so the addition rounds to an integer (ties to even), and
/// subtracting it again is exact. Same results everywhere; without SSE4.1 at compile time
/// `round_ties_even` is a call to libm's `rintf`, which made up 5% of a prompt's time.
#[inline]
fn round_ties_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    if x.abs() < 4_194_304.0 {
        (x + MAGIC) - MAGIC
    } else {
        x.round_ties_even()
    }
}

/// Largest absolute value of `x` (0 for an empty slice). NaN inputs give some quantized
/// block without panicking; ggml's flavors disagree among themselves there.
#[inline]
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

#[cfg(test)]
mod tests {
    /// The magic-number rounding is `round_ties_even` for every value around the ties and
    /// the edges of its range (sign of zero aside: both give an integer-valued zero).
    #[test]
    fn round_ties_even_matches_std() {
        let mut values = vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 127.5, -128.5, 0.0, -0.0];
        values.extend([
            4_194_303.5f32,
            -4_194_303.5,
            4_194_304.0,
            8_388_609.0,
            1e30,
            -1e30,
        ]);
        values.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.00137));
        values.extend((0..2_000).map(|i| i as f32 * 0.5 - 500.0));
        for v in values {
            let got = super::round_ties_even(v);
            assert_eq!(got, v.round_ties_even(), "{v}");
        }
        assert!(super::round_ties_even(f32::NAN).is_nan());
        assert_eq!(super::round_ties_even(f32::INFINITY), f32::INFINITY);
    }
}
