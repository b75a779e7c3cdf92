//! The weight quantizers: hand-checked blocks, round trips through the dequantizer, and the
//! fixture blocks `llama-quantize` wrote (`shared/fixtures/dequant/TYPE.bin`, the first
//! blocks of `blk.0.ffn_down.weight` of `llama-sep-TYPE.gguf`) reproduced byte for byte from
//! the F32 original.

use super::*;
use crate::ggml::{dequantize, f16_to_f32};
use crate::gguf::GgufFile;

/// Deterministic values in about [-1, 1] with a few larger outliers (xorshift).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 97 == 0 {
                u * 4.0
            } else {
                u
            }
        })
        .collect()
}

fn quantized(t: GgmlType, x: &[f32]) -> Vec<u8> {
    let n = t.row_size(x.len() as u64).unwrap_or(0) as usize;
    let mut q = vec![0u8; n];
    quantize_weights(t, x, &mut q).unwrap();
    q
}

#[test]
fn q4_0_hand_checked_block() {
    // x = j - 16: max = -16, d = 2, q = trunc((j - 16) / 2 + 8.5), capped at 15.
    let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
    let q = quantized(GgmlType::Q4_0, &x);
    assert_eq!(f16_to_f32(u16::from_le_bytes([q[0], q[1]])), 2.0);
    for j in 0..16 {
        let lo = ((j as f32 - 16.0) / 2.0 + 8.5) as u8;
        let hi = (((j + 16) as f32 - 16.0) / 2.0 + 8.5).min(15.0) as u8;
        assert_eq!(q[2 + j], lo | hi << 4, "byte {j}");
    }
}

#[test]
fn all_zero_blocks() {
    for &t in WEIGHT_QUANT_TYPES.iter() {
        let x = vec![0.0f32; 256];
        let q = quantized(t, &x);
        let mut y = vec![1.0f32; 256];
        dequantize(t, &q, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{t}");
    }
}

#[test]
fn round_trips_are_close() {
    // Worst relative RMS error of a round trip per type (from the formats' bit widths).
    let bound = |t: GgmlType| match t {
        GgmlType::F32 => 0.0,
        GgmlType::F16 | GgmlType::BF16 => 0.01,
        GgmlType::Q8_0 => 0.02,
        GgmlType::Q6_K => 0.04,
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 0.08,
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q4_K
        | GgmlType::IQ4_NL
        | GgmlType::IQ4_XS
        | GgmlType::MXFP4 => 0.15,
        GgmlType::Q3_K => 0.3,
        _ => 0.6,
    };
    let x = values(4096, 7);
    let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
    for &t in WEIGHT_QUANT_TYPES.iter() {
        let q = quantized(t, &x);
        let mut y = vec![0.0f32; x.len()];
        dequantize(t, &q, &mut y).unwrap();
        let err: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
        let rel = rms(&err) / rms(&x);
        assert!(rel <= bound(t), "{t}: relative RMS error {rel}");
        // Quantizing is a function of the values only: the same bytes again.
        assert_eq!(quantized(t, &x), q, "{t}");
    }
}

#[test]
fn rejects_types_and_lengths() {
    let x = vec![0.5f32; 64];
    let mut q = vec![0u8; 64];
    assert!(matches!(
        quantize_weights(GgmlType::IQ2_XXS, &x, &mut q),
        Err(BlockDataError::Unsupported { .. })
    ));
    assert!(quantize_weights(GgmlType::Q4_K, &x, &mut q).is_err());
    assert!(quantize_weights(GgmlType::Q4_0, &x[..40], &mut q).is_err());
}

#[test]
fn llama_quantize_fixture_blocks() {
    let Some(dir) = modelc_tests::shared("fixtures") else {
        return;
    };
    let f32_model = GgufFile::open(dir.join("models/llama-sep-F32.gguf")).unwrap();
    let tensor = f32_model.tensor("blk.0.ffn_down.weight").unwrap();
    let all: Vec<f32> = f32_model
        .tensor_data(tensor)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for &t in WEIGHT_QUANT_TYPES.iter().filter(|&&t| t != GgmlType::F32) {
        // MXFP4 has no shared dequant fixture: the first 128 blocks of the tensor in the file
        // `llama-quantize --pure llama-sep-F32.gguf OUT MXFP4_MOE` writes are kept here.
        let want = if t == GgmlType::MXFP4 {
            include_bytes!("../../../tests/data/mxfp4_ffn_down.bin").to_vec()
        } else {
            std::fs::read(dir.join(format!("dequant/{}.bin", t.name().to_lowercase()))).unwrap()
        };
        let n = want.len() / t.type_size() * t.block_size();
        let got = quantized(t, &all[..n]);
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first,
            None,
            "{t}: first differing byte (block {:?})",
            first.map(|i| i / t.type_size())
        );
    }
}

#[test]
fn ggml_nearest_int_rounds_ties_to_even_in_range() {
    for v in [
        0.5f32,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        31.5,
        -32.5,
        0.0,
        -0.0,
        4_194_303.0,
    ] {
        assert_eq!(ggml_nearest_int(v), v.round_ties_even() as i32, "{v}");
    }
    for i in 0..100_000 {
        let v = (i as f32 - 50_000.0) * 0.00731;
        assert_eq!(ggml_nearest_int(v), v.round_ties_even() as i32, "{v}");
    }
}

/// The derived list is llama-quantize's types without an importance matrix: the float
/// types, the legacy and K-quants, IQ4_NL, IQ4_XS and MXFP4 (and no activation-only type).
#[test]
fn weight_quant_types_are_derived() {
    use GgmlType::*;
    let mut got: Vec<GgmlType> = WEIGHT_QUANT_TYPES.clone();
    got.sort_by_key(|t| t.name());
    let mut want = vec![
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
        MXFP4,
    ];
    want.sort_by_key(|t| t.name());
    assert_eq!(got, want);
}
