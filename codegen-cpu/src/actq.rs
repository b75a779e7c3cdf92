//! Quantization of f32 activations to the 8-bit companion format of a weight type, done
//! before every quantized matmul, as ggml does (`from_float` of the weight type's
//! `vec_dot_type`).
//!
//! Values match ggml's x86 AVX2 `quantize_row_q8_0` / `quantize_row_q8_1`
//! (`ggml-cpu/arch/x86/quants.c`), which is what llama.cpp runs on this project's machines:
//! per block of 32, `amax = max|x|`, `d = amax / 127`, `id = 127 / amax` (0 when `amax` is 0),
//! `q = round_half_even(x · id)` saturated to i8, `d` stored as f16, and for Q8_1
//! `s = f16(d · Σq)` (with the unrounded `d`).
//!
//! The stored layout is this crate's own (the kernels read it, nothing else does): per token
//! row, per block, [`ACT_BLOCK_BYTES`] bytes, every field *pre-broadcast* to 16 bytes so that
//! the kernels read each with one plain vector load:
//!
//! | bytes    | field |
//! |----------|-------|
//! | 0..16    | `d` as f32 (the f16-rounded value), 4 copies |
//! | 16..32   | Q8_1: `s` as f32 (f16-rounded); Q8_0 for a weight format with zero point `z` (Q4_0): `z·Σq` as i32; else 0 — 4 copies |
//! | 32..160  | the 32 quants (i8) in 8 chunks of 16 bytes: chunk `j` is values `4j..4j+4`, 4 copies |
//!
//! Why pre-broadcast: a weight vector holds 4 bytes of each of 4 rows (one row per 32-bit
//! lane, see [`crate::layout`]), so it multiplies with 4 activation bytes repeated 4 times.
//! Cranelift folds a broadcast load (`vbroadcastss m32`) only when nothing computed from it
//! is used twice, which the kernels' `pmaddwd` and loop-carried sums defeat; an unfolded
//! broadcast costs three instructions, a plain load one.

use half::f16;

use crate::formats::{ActKind, QuantFormat, QK};
use crate::jit::{CodegenError, Result};

/// Bytes of one quantized activation block (see the module doc for the layout).
pub const ACT_BLOCK_BYTES: usize = 160;

/// Byte offset of the quants in an activation block.
pub const ACT_QS_OFFSET: usize = 32;

/// Byte offset of the auxiliary field (`s` or `z·Σq`) in an activation block.
pub const ACT_AUX_OFFSET: usize = 16;

/// The quant of value `j` (0..32) of an activation block.
pub fn act_quant(block: &[u8], j: usize) -> i8 {
    block[ACT_QS_OFFSET + 16 * (j / 4) + j % 4] as i8
}

/// Bytes of one quantized activation row of `k` values (`k` a multiple of 32; saturates
/// at `usize::MAX` on overflow).
pub fn act_row_bytes(k: usize) -> usize {
    (k / QK).saturating_mul(ACT_BLOCK_BYTES)
}

/// Quantizes `x` (`{k, n}` f32, row-major: `n` rows of `k`) for weights of format `fmt` into
/// `out` (`n * act_row_bytes(k)` bytes).
///
/// Errors: [`CodegenError::Shape`] when `k` is not a multiple of 32;
/// [`CodegenError::BufferSize`] when `x` or `out` has the wrong length.
pub fn quantize_act(
    fmt: &QuantFormat,
    k: usize,
    n: usize,
    x: &[f32],
    out: &mut [u8],
) -> Result<()> {
    if !k.is_multiple_of(QK) {
        return Err(CodegenError::Shape(format!(
            "activation row of {k} values is not a multiple of {QK}"
        )));
    }
    let values = k.checked_mul(n);
    let bytes = act_row_bytes(k).checked_mul(n);
    let (Some(values), Some(bytes)) = (values, bytes) else {
        return Err(CodegenError::Shape(format!(
            "{n} activation rows of {k} values overflow"
        )));
    };
    check_len("activations (f32 values)", values, x.len())?;
    check_len("quantized activations", bytes, out.len())?;
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(ACT_BLOCK_BYTES))
    {
        quantize_block(fmt, xb, ob);
    }
    Ok(())
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(CodegenError::BufferSize {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// One block of 32 values into one [`ACT_BLOCK_BYTES`] block.
fn quantize_block(fmt: &QuantFormat, x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum: i32 = 0;
    for (j, &v) in x.iter().enumerate() {
        // `as i32` saturates (and maps NaN to 0); then saturate to i8 like `packs_epi16`.
        let q = ((v * id).round_ties_even() as i32).clamp(-128, 127);
        sum += q;
        for copy in 0..4 {
            out[ACT_QS_OFFSET + 16 * (j / 4) + 4 * copy + j % 4] = q as i8 as u8;
        }
    }
    let d_stored = f16::from_f32(d).to_f32().to_le_bytes();
    let aux: [u8; 4] = match fmt.act {
        ActKind::Q8_1 => f16::from_f32(d * sum as f32).to_f32().to_le_bytes(),
        ActKind::Q8_0 => (fmt.zero_point * sum).to_le_bytes(),
    };
    for copy in 0..4 {
        out[4 * copy..4 * copy + 4].copy_from_slice(&d_stored);
        out[ACT_AUX_OFFSET + 4 * copy..ACT_AUX_OFFSET + 4 * copy + 4].copy_from_slice(&aux);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::ggml::GgmlType;

    #[test]
    fn q8_1_block_fields() {
        let fmt = QuantFormat::of(GgmlType::Q4_1).unwrap();
        // amax = 127 makes id = 1, so the quants are the rounded inputs: ties go to even.
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
        x[0] = 2.5;
        x[1] = -3.5;
        x[2] = 0.5;
        x[31] = 127.0;
        let mut out = vec![0u8; ACT_BLOCK_BYTES];
        quantize_act(&fmt, 32, 1, &x, &mut out).unwrap();
        let d = f32::from_le_bytes(out[0..4].try_into().unwrap());
        assert_eq!(d, f16::from_f32(1.0).to_f32());
        let qs: Vec<i8> = (0..32).map(|j| act_quant(&out, j)).collect();
        assert_eq!(&qs[..4], &[2, -4, 0, -7]);
        assert_eq!(qs[31], 127);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        let s = f32::from_le_bytes(out[28..32].try_into().unwrap());
        assert_eq!(s, f16::from_f32(sum as f32).to_f32());
        assert_eq!(&out[32..36], &out[44..48], "quants are broadcast");
    }

    #[test]
    fn zero_block_and_zero_point() {
        let fmt = QuantFormat::of(GgmlType::Q4_0).unwrap();
        let mut x = vec![0.0f32; 64];
        x[40] = -2.0;
        x[41] = 1.0;
        let mut out = vec![0xAAu8; 2 * ACT_BLOCK_BYTES];
        quantize_act(&fmt, 64, 1, &x, &mut out).unwrap();
        assert!(out[..ACT_BLOCK_BYTES].iter().all(|&b| b == 0));
        let b = &out[ACT_BLOCK_BYTES..];
        let aux = i32::from_le_bytes(b[20..24].try_into().unwrap());
        // q = -127 and round(63.5) = 64
        assert_eq!(aux, 8 * (-127 + 64));
    }

    #[test]
    fn rejects_bad_sizes() {
        let fmt = QuantFormat::of(GgmlType::Q8_0).unwrap();
        let mut out = vec![0u8; ACT_BLOCK_BYTES];
        assert!(quantize_act(&fmt, 31, 1, &[0.0; 31], &mut out).is_err());
        assert!(quantize_act(&fmt, 32, 1, &[0.0; 31], &mut out).is_err());
        assert!(quantize_act(&fmt, 32, 2, &[0.0; 64], &mut out).is_err());
    }
}
