//! Scalar conversions between f32 and the 16-bit float formats, as ggml does them.
//!
//! - f16 → f32 is exact (`GGML_FP16_TO_FP32`).
//! - f32 → f16 rounds to nearest, ties to even (`GGML_FP32_TO_FP16`; on x86 ggml uses the F16C
//!   instruction with rounding mode 0, which is the same rounding).
//! - bf16 → f32 is exact (the 16 bits become the top half of the f32).
//! - f32 → bf16 follows ggml's `ggml_compute_fp32_to_bf16` (ggml-impl.h): NaN keeps its top 16
//!   bits with the quiet bit (0x0040) forced on; everything else rounds to nearest, ties to
//!   even, by adding `0x7fff + lsb` before truncating. Subnormals are not flushed (ggml stopped
//!   flushing them in 2024).

/// The f32 value of the IEEE half-precision number with bits `bits` (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// The bits of the IEEE half-precision number nearest to `x` (ties to even; overflow gives
/// infinity, NaN stays NaN).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// The f32 value of the bfloat16 number with bits `bits` (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The bits of the bfloat16 number nearest to `x`, exactly as ggml's `GGML_FP32_TO_BF16`
/// computes them (ties to even; NaN made quiet).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        // NaN: keep sign and payload top bits, force the quiet bit.
        return ((u >> 16) | 0x40) as u16;
    }
    // Round to nearest even; `u + 0x7fff + lsb` cannot overflow u32 for non-NaN inputs.
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// `2^(e - 128)`, half the value of the E8M0 exponent byte `e`: the scale of an MXFP4 block,
/// whose E2M1 table values are stored doubled (ggml's `GGML_E8M0_TO_FP32_HALF`, and the
/// x86 CPU backend's `ggml_table_f32_e8m0_half` built from it). Exact for every byte: 0 and
/// 1 give the subnormals 2^-128 and 2^-127, 255 gives 2^127 (no NaN).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Reads the little-endian u16 at byte `off` of `b`. Callers guarantee `off + 2 <= b.len()`.
#[inline]
pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Reads the little-endian f16 at byte `off` of `b` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16_at(b, off))
}

/// Reads the little-endian f32 at byte `off` of `b`.
#[inline]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1.0 + half an ulp of bf16: tie, lower neighbour is even -> stays 1.0.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Next tie: lower neighbour 0x3f81 is odd -> rounds up to 0x3f82.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        // Just above a tie rounds up, just below rounds down.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_7fff)), 0x3f80);
        // Negative numbers round by magnitude.
        assert_eq!(f32_to_bf16(f32::from_bits(0xbf81_8000)), 0xbf82);
        // The largest finite f32 rounds up to infinity.
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        // Subnormals are kept, not flushed.
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_0000)), 0x0001);
    }

    #[test]
    fn bf16_nan_is_made_quiet() {
        // Signalling NaN whose payload lives only in the low 16 bits: would truncate to
        // infinity without the forced quiet bit.
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::from_bits(0xff80_0001)), 0xffc0);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7fa1_2345)), 0x7fe1);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }

    #[test]
    fn f16_round_trip_and_ties() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even -> 1.0.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(70000.0), 0x7c00);
        for bits in [0x0001u16, 0x03ff, 0x0400, 0x7bff, 0x8001, 0xfbff] {
            assert_eq!(f32_to_f16(f16_to_f32(bits)), bits);
        }
    }
}
