//! Weight quantizers: f32 rows to the GGML block formats llama.cpp's `llama-quantize`
//! writes, bit-exact with ggml's reference routines.
//!
//! Without an importance matrix `llama-quantize` calls `ggml_quantize_chunk`, which runs the
//! reference quantizer of each type on whole rows (ggml-quants.c: `quantize_row_q4_0_ref`,
//! `quantize_row_q4_K_ref`, ..., and `quantize_row_iq4_nl_impl` for IQ4_NL / IQ4_XS). Every
//! block is quantized on its own, so rows can be split among threads freely.
//!
//! ggml builds ggml-quants.c into `ggml-base` without `-march=native` (only the CPU backend
//! gets the host's instruction set), so on x86-64 those routines run with plain SSE2
//! arithmetic: no fused multiply-adds. The code here therefore evaluates every f32
//! expression exactly in C's left-to-right order with separate multiplies and adds.
//!
//! The block layouts come from the format descriptions ([`super::block_format`]): each
//! quantizer looks up the byte range of the fields it writes (`d`, `qs`, `scales`, ...).
//!
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 (Q8_0 is [`super::quantize_q8_0`]);
//! - [`kquants`]: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and their scale searches;
//! - [`iq4`]: IQ4_NL and IQ4_XS.

mod iq4;
mod kquants;
mod legacy;

use super::error::{check_lengths, BlockDataError};
use super::fp::{f16_to_f32, f32_to_f16};
use super::GgmlType;
use std::ops::Range;

/// The types [`quantize_weights`] can produce, in [`GgmlType::ALL`] order: derived by asking
/// it for one block of zeros of each type (no list is written out).
pub static WEIGHT_QUANT_TYPES: std::sync::LazyLock<Vec<GgmlType>> =
    std::sync::LazyLock::new(|| {
        GgmlType::ALL
            .iter()
            .copied()
            .filter(|&t| {
                let (n, bytes) = (t.block_size(), t.type_size());
                n > 0 && quantize_weights(t, &vec![0.0; n], &mut vec![0u8; bytes]).is_ok()
            })
            .collect()
    });

/// Quantizes the f32 values `src` (whole blocks: one row or many rows back to back) to type
/// `t` into `dst`, as `ggml_quantize_chunk` does without an importance matrix:
///
/// - F32: a little-endian copy; F16: round to nearest even (`ggml_fp32_to_fp16_row`); BF16:
///   `ggml_fp32_to_bf16_row_ref`;
/// - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: `quantize_row_*_ref`;
/// - IQ4_NL, IQ4_XS: `quantize_iq4_nl` / `quantize_iq4_xs` (`quantize_row_iq4_nl_impl` with
///   7 extra scale tries each way and the squared values as weights);
/// - MXFP4: `quantize_mxfp4` (`quantize_row_mxfp4_ref`, which takes no importance matrix).
///
/// # Errors
/// [`BlockDataError::Unsupported`] for a type not in [`WEIGHT_QUANT_TYPES`];
/// [`BlockDataError::PartialBlock`] / [`BlockDataError::ByteLength`] if `src.len()` is not
/// whole blocks or `dst.len()` is not their byte size.
pub fn quantize_weights(t: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    let block: fn(&Fields, &[f32], &mut [u8]) = match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 => {
            return super::quantize(t, src, dst, super::Q8Flavor::Reference);
        }
        GgmlType::Q4_0 => legacy::q4_0,
        GgmlType::Q4_1 => legacy::q4_1,
        GgmlType::Q5_0 => legacy::q5_0,
        GgmlType::Q5_1 => legacy::q5_1,
        GgmlType::Q2_K => kquants::q2_k,
        GgmlType::Q3_K => kquants::q3_k,
        GgmlType::Q4_K => kquants::q4_k,
        GgmlType::Q5_K => kquants::q5_k,
        GgmlType::Q6_K => kquants::q6_k,
        GgmlType::IQ4_NL => iq4::iq4_nl,
        GgmlType::IQ4_XS => iq4::iq4_xs,
        GgmlType::MXFP4 => legacy::mxfp4,
        _ => {
            return Err(BlockDataError::Unsupported {
                op: "quantize_weights",
                ty: t,
            })
        }
    };
    check_lengths(t, "dst", src.len(), dst.len())?;
    let fields = Fields::of(t);
    for (x, b) in src
        .chunks_exact(t.block_size())
        .zip(dst.chunks_exact_mut(t.type_size()))
    {
        block(&fields, x, b);
    }
    Ok(())
}

/// The byte ranges of the fields of one block format (empty for a field it does not have),
/// looked up in the description once per [`quantize_weights`] call.
struct Fields {
    d: Range<usize>,
    e: Range<usize>,
    m: Range<usize>,
    dmin: Range<usize>,
    qs: Range<usize>,
    qh: Range<usize>,
    ql: Range<usize>,
    scales: Range<usize>,
    hmask: Range<usize>,
    scales_h: Range<usize>,
    scales_l: Range<usize>,
}

impl Fields {
    fn of(t: GgmlType) -> Fields {
        let f = |name| span(t, name);
        Fields {
            d: f("d"),
            e: f("e"),
            m: f("m"),
            dmin: f("dmin"),
            qs: f("qs"),
            qh: f("qh"),
            ql: f("ql"),
            scales: f("scales"),
            hmask: f("hmask"),
            scales_h: f("scales_h"),
            scales_l: f("scales_l"),
        }
    }
}

/// The byte range of field `name` in a block of `t`, from the format description.
///
/// Every field a quantizer here asks for is in the tables (the tests quantize every type);
/// an unknown name gives an empty range.
fn span(t: GgmlType, name: &str) -> Range<usize> {
    super::block_format(t)
        .and_then(|f| f.field(name))
        .map_or(0..0, |f| f.offset..f.offset + f.size)
}

/// Stores `v` rounded to f16 at byte `at` of `b` and returns the f32 value stored
/// (`GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))`).
#[inline]
fn put_f16(b: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f32_to_f16(v);
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    f16_to_f32(h)
}

/// ggml's `nearest_int` (ggml-quants.c) exactly as the C computes it: add 1.5 * 2^23 and
/// read the low 23 bits of the sum. Round to nearest, ties to even for `|x| <= 4194303`
/// (as [`crate::ggml::quant`]'s `nearest_int`), and ggml's wrapped value beyond, where ggml
/// asserts only in debug builds, so a weight file matches llama-quantize's for any input.
/// Integer operations only, no branch: the scale searches' loops vectorize (twice as fast as
/// a branch to `round_ties_even` per value).
#[inline]
fn ggml_nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `(amax, max)`: the largest magnitude in `x` and the value that has it (the first one on
/// ties; `(0, 0)` when all are zero). The search of every ggml quantizer with a signed scale.
#[inline]
fn signed_abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[cfg(test)]
mod tests;
