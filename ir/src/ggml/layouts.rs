//! The block format tables: one [`BlockFormat`] per described GGML type.
//!
//! Offsets and sizes are those of the C structs in ggml's `ggml-common.h` (`block_q4_0`, ...);
//! the bit arrangements and formulas are those of `dequantize_row_*` in `ggml-quants.c`.
//! `i` below is the index of a value within its block.

use super::format::{
    BitPiece, BlockFormat, Decode, Field, FieldKind, Index, IntCode, IntMap, MinTerm, Recipe,
    ScalarKind, SubScalePacking, Term,
};
use super::GgmlType;
use super::QK_K;

/// The 16 values of the IQ4_NL / IQ4_XS non-linear 4-bit grid (`kvalues_iq4nl` in ggml).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Every value of a block.
const ALL_VALUES: (usize, usize) = (0, usize::MAX);

/// `Index { base, terms: [((i / div) % modulo) * mul, ...] }`.
macro_rules! idx {
    ($base:expr $(; $(($d:expr, $m:expr, $k:expr)),*)?) => {
        Index { base: $base, terms: &[$($(Term { div: $d, modulo: $m, mul: $k }),*)?] }
    };
}

/// A [`BitPiece`] of `field` (for every value unless `values` is given).
macro_rules! piece {
    ($field:expr, byte: $b:expr, shift: $s:expr, width: $w:expr, at: $a:expr) => {
        piece!($field, byte: $b, shift: $s, width: $w, at: $a, values: ALL_VALUES)
    };
    ($field:expr, byte: $b:expr, shift: $s:expr, width: $w:expr, at: $a:expr, values: $v:expr) => {
        BitPiece { field: $field, byte: $b, shift: $s, width: $w, at: $a, values: $v }
    };
}

macro_rules! field {
    ($name:expr, $offset:expr, $size:expr, $kind:expr) => {
        Field {
            name: $name,
            offset: $offset,
            size: $size,
            kind: $kind,
        }
    };
}

const F16: ScalarKind = ScalarKind::F16;

/// 32 values in 16 bytes: value i in byte `i % 16`, low nibble for i < 16, high for i >= 16.
const NIBBLES_32: BitPiece =
    piece!("qs", byte: idx!(0; (1, 16, 1)), shift: idx!(0; (16, 2, 4)), width: 4, at: 0);
/// The fifth bit of Q5_0 / Q5_1: bit i of the little-endian u32 `qh`.
const QH_BIT_32: BitPiece =
    piece!("qh", byte: idx!(0; (8, 4, 1)), shift: idx!(0; (1, 8, 1)), width: 1, at: 4);
/// One int8 per value (Q8_0, Q8_1, Q8_K).
const BYTE_PER_VALUE: BitPiece =
    piece!("qs", byte: idx!(0; (1, QK_K, 1)), shift: idx!(0), width: 8, at: 0);
/// Q2_K / Q3_K low bits: 2 bits per value; within each 128 values, byte `i % 32` of that
/// half's 32 bytes, bits `2 * ((i / 32) % 4)`.
const CRUMBS_256: BitPiece = piece!("qs", byte: idx!(0; (128, 2, 32), (1, 32, 1)), shift: idx!(0; (32, 4, 2)), width: 2, at: 0);
/// Q4_K / Q5_K low bits: within each 64 values, byte `i % 32` of that chunk's 32 bytes, low
/// nibble for the first 32 values, high nibble for the next 32.
const NIBBLES_256: BitPiece = piece!("qs", byte: idx!(0; (64, 4, 32), (1, 32, 1)), shift: idx!(0; (32, 2, 4)), width: 4, at: 0);
/// Q3_K `hmask` / Q5_K `qh`: bit `i / 32` of byte `i % 32`.
const HMASK_BIT_256: BitPiece =
    piece!("hmask", byte: idx!(0; (1, 32, 1)), shift: idx!(0; (32, 8, 1)), width: 1, at: 2);
const QH_BIT_256: BitPiece =
    piece!("qh", byte: idx!(0; (1, 32, 1)), shift: idx!(0; (32, 8, 1)), width: 1, at: 4);

/// Q4_K / Q5_K scales and mins (`get_scale_min_k4`, j = i / 32).
const K4_SCALE: IntCode = IntCode {
    pieces: &[
        // j < 4: scales[j] & 63
        piece!("scales", byte: idx!(0; (32, 8, 1)), shift: idx!(0), width: 6, at: 0, values: (0, 128)),
        // j >= 4: (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4
        piece!("scales", byte: idx!(4; (32, 8, 1)), shift: idx!(0), width: 4, at: 0, values: (128, usize::MAX)),
        piece!("scales", byte: idx!(0; (32, 4, 1)), shift: idx!(6), width: 2, at: 4, values: (128, usize::MAX)),
    ],
    map: IntMap::Offset(0),
};
const K4_MIN: IntCode = IntCode {
    pieces: &[
        // j < 4: scales[j + 4] & 63
        piece!("scales", byte: idx!(4; (32, 8, 1)), shift: idx!(0), width: 6, at: 0, values: (0, 128)),
        // j >= 4: (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
        piece!("scales", byte: idx!(4; (32, 8, 1)), shift: idx!(4), width: 4, at: 0, values: (128, usize::MAX)),
        piece!("scales", byte: idx!(0; (32, 8, 1)), shift: idx!(6), width: 2, at: 4, values: (128, usize::MAX)),
    ],
    map: IntMap::Offset(0),
};

/// Every described format, in GGML id order.
pub(crate) static ALL_FORMATS: [BlockFormat; 27] = [
    BlockFormat {
        ty: GgmlType::F32,
        block_size: 1,
        type_size: 4,
        fields: &[field!("value", 0, 4, FieldKind::Value(ScalarKind::F32))],
        decode: Decode::Scalar(ScalarKind::F32),
        formula: "y = value",
    },
    BlockFormat {
        ty: GgmlType::F16,
        block_size: 1,
        type_size: 2,
        fields: &[field!("value", 0, 2, FieldKind::Value(ScalarKind::F16))],
        decode: Decode::Scalar(ScalarKind::F16),
        formula: "y = f32(value)",
    },
    BlockFormat {
        ty: GgmlType::Q4_0,
        block_size: 32,
        type_size: 18,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 16, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[NIBBLES_32],
                map: IntMap::Offset(-8),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * (nibble(i) - 8); nibble(i) = qs[i % 16] >> 4*(i / 16) & 15",
    },
    BlockFormat {
        ty: GgmlType::Q4_1,
        block_size: 32,
        type_size: 20,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("m", 2, 2, FieldKind::Min(F16)),
            field!("qs", 4, 16, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[NIBBLES_32],
                map: IntMap::Offset(0),
            },
            min: MinTerm::Add { m: "m" },
        }),
        formula: "y[i] = d * nibble(i) + m; nibble(i) = qs[i % 16] >> 4*(i / 16) & 15",
    },
    BlockFormat {
        ty: GgmlType::Q5_0,
        block_size: 32,
        type_size: 22,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qh", 2, 4, FieldKind::HighBits { bits: 1 }),
            field!("qs", 6, 16, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[NIBBLES_32, QH_BIT_32],
                map: IntMap::Offset(-16),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * ((nibble(i) | bit(qh_u32, i) << 4) - 16)",
    },
    BlockFormat {
        ty: GgmlType::Q5_1,
        block_size: 32,
        type_size: 24,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("m", 2, 2, FieldKind::Min(F16)),
            field!("qh", 4, 4, FieldKind::HighBits { bits: 1 }),
            field!("qs", 8, 16, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[NIBBLES_32, QH_BIT_32],
                map: IntMap::Offset(0),
            },
            min: MinTerm::Add { m: "m" },
        }),
        formula: "y[i] = d * (nibble(i) | bit(qh_u32, i) << 4) + m",
    },
    BlockFormat {
        ty: GgmlType::Q8_0,
        block_size: 32,
        type_size: 34,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 32, FieldKind::Quants { bits: 8 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[BYTE_PER_VALUE],
                map: IntMap::Int8,
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * (int8)qs[i]",
    },
    BlockFormat {
        ty: GgmlType::Q8_1,
        block_size: 32,
        type_size: 36,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("s", 2, 2, FieldKind::Sum(F16)),
            field!("qs", 4, 32, FieldKind::Quants { bits: 8 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[BYTE_PER_VALUE],
                map: IntMap::Int8,
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * (int8)qs[i]   (s = d * sum(qs) is only used by dot products)",
    },
    BlockFormat {
        ty: GgmlType::Q2_K,
        block_size: QK_K,
        type_size: 84,
        fields: &[
            field!(
                "scales",
                0,
                16,
                FieldKind::SubScales(SubScalePacking::ScaleMin4)
            ),
            field!("qs", 16, 64, FieldKind::Quants { bits: 2 }),
            field!("d", 80, 2, FieldKind::Scale(F16)),
            field!("dmin", 82, 2, FieldKind::MinScale(F16)),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(IntCode {
                pieces: &[
                    piece!("scales", byte: idx!(0; (16, 16, 1)), shift: idx!(0), width: 4, at: 0),
                ],
                map: IntMap::Offset(0),
            }),
            quant: IntCode {
                pieces: &[CRUMBS_256],
                map: IntMap::Offset(0),
            },
            min: MinTerm::SubtractScaled {
                dmin: "dmin",
                min: IntCode {
                    pieces: &[
                        piece!("scales", byte: idx!(0; (16, 16, 1)), shift: idx!(4), width: 4, at: 0),
                    ],
                    map: IntMap::Offset(0),
                },
            },
        }),
        formula: "y[i] = (d * (scales[i/16] & 15)) * q2(i) - dmin * (scales[i/16] >> 4)",
    },
    BlockFormat {
        ty: GgmlType::Q3_K,
        block_size: QK_K,
        type_size: 110,
        fields: &[
            field!("hmask", 0, 32, FieldKind::HighBits { bits: 1 }),
            field!("qs", 32, 64, FieldKind::Quants { bits: 2 }),
            field!(
                "scales",
                96,
                12,
                FieldKind::SubScales(SubScalePacking::Signed6Q3K)
            ),
            field!("d", 108, 2, FieldKind::Scale(F16)),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(IntCode {
                pieces: &[
                    piece!("scales", byte: idx!(0; (16, 8, 1)), shift: idx!(0; (128, 2, 4)), width: 4, at: 0),
                    piece!("scales", byte: idx!(8; (16, 4, 1)), shift: idx!(0; (64, 4, 2)), width: 2, at: 4),
                ],
                map: IntMap::Offset(-32),
            }),
            quant: IntCode {
                pieces: &[CRUMBS_256, HMASK_BIT_256],
                map: IntMap::Offset(-4),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = (d * (scale6(i/16) - 32)) * ((q2(i) | hbit(i) << 2) - 4)",
    },
    BlockFormat {
        ty: GgmlType::Q4_K,
        block_size: QK_K,
        type_size: 144,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("dmin", 2, 2, FieldKind::MinScale(F16)),
            field!(
                "scales",
                4,
                12,
                FieldKind::SubScales(SubScalePacking::ScaleMin6K4)
            ),
            field!("qs", 16, 128, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(K4_SCALE),
            quant: IntCode {
                pieces: &[NIBBLES_256],
                map: IntMap::Offset(0),
            },
            min: MinTerm::SubtractScaled {
                dmin: "dmin",
                min: K4_MIN,
            },
        }),
        formula: "y[i] = (d * sc(i/32)) * q4(i) - dmin * m(i/32); sc, m = get_scale_min_k4",
    },
    BlockFormat {
        ty: GgmlType::Q5_K,
        block_size: QK_K,
        type_size: 176,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("dmin", 2, 2, FieldKind::MinScale(F16)),
            field!(
                "scales",
                4,
                12,
                FieldKind::SubScales(SubScalePacking::ScaleMin6K4)
            ),
            field!("qh", 16, 32, FieldKind::HighBits { bits: 1 }),
            field!("qs", 48, 128, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(K4_SCALE),
            quant: IntCode {
                pieces: &[NIBBLES_256, QH_BIT_256],
                map: IntMap::Offset(0),
            },
            min: MinTerm::SubtractScaled {
                dmin: "dmin",
                min: K4_MIN,
            },
        }),
        formula: "y[i] = (d * sc(i/32)) * (q4(i) | hbit(i) << 4) - dmin * m(i/32)",
    },
    BlockFormat {
        ty: GgmlType::Q6_K,
        block_size: QK_K,
        type_size: 210,
        fields: &[
            field!("ql", 0, 128, FieldKind::Quants { bits: 4 }),
            field!("qh", 128, 64, FieldKind::HighBits { bits: 2 }),
            field!(
                "scales",
                192,
                16,
                FieldKind::SubScales(SubScalePacking::Int8)
            ),
            field!("d", 208, 2, FieldKind::Scale(F16)),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(IntCode {
                pieces: &[
                    piece!("scales", byte: idx!(0; (16, 16, 1)), shift: idx!(0), width: 8, at: 0),
                ],
                map: IntMap::Int8,
            }),
            quant: IntCode {
                pieces: &[
                    // Within each 128 values: ql byte (i % 32) + 32 * ((i / 32) % 2), nibble (i / 64) % 2.
                    piece!("ql", byte: idx!(0; (128, 2, 64), (1, 32, 1), (32, 2, 32)), shift: idx!(0; (64, 2, 4)), width: 4, at: 0),
                    // qh byte i % 32 of that half's 32 bytes, bits 2 * ((i / 32) % 4).
                    piece!("qh", byte: idx!(0; (128, 2, 32), (1, 32, 1)), shift: idx!(0; (32, 4, 2)), width: 2, at: 4),
                ],
                map: IntMap::Offset(-32),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = (d * (int8)scales[i/16]) * ((q4(i) | q2h(i) << 4) - 32)",
    },
    BlockFormat {
        ty: GgmlType::Q8_K,
        block_size: QK_K,
        type_size: 292,
        fields: &[
            field!("d", 0, 4, FieldKind::Scale(ScalarKind::F32)),
            field!("qs", 4, 256, FieldKind::Quants { bits: 8 }),
            field!("bsums", 260, 32, FieldKind::BlockSums),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[BYTE_PER_VALUE],
                map: IntMap::Int8,
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * (int8)qs[i]   (d is f32; bsums[j] = sum of qs[16j..16j+16])",
    },
    BlockFormat {
        ty: GgmlType::IQ2_XXS,
        block_size: QK_K,
        type_size: 66,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 64, FieldKind::GridIndexScalesSigns),
        ],
        decode: Decode::Routine,
        formula: "y[i] = ((d * (0.5 + ls(i/32))) * 0.25) * iq2xxs_grid[index(i/8)][i%8] * sign(i) \
                  (dequantize_row_iq2_xxs)",
    },
    BlockFormat {
        ty: GgmlType::IQ2_XS,
        block_size: QK_K,
        type_size: 74,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 64, FieldKind::GridIndexSigns),
            field!(
                "scales",
                66,
                8,
                FieldKind::SubScales(SubScalePacking::Nibbles)
            ),
        ],
        decode: Decode::Routine,
        formula:
            "y[i] = ((d * (0.5 + ls(i/16))) * 0.25) * iq2xs_grid[qs[i/8] & 511][i%8] * sign(i) \
                  (dequantize_row_iq2_xs)",
    },
    BlockFormat {
        ty: GgmlType::IQ3_XXS,
        block_size: QK_K,
        type_size: 98,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 64, FieldKind::GridIndex { bits: 8 }),
            field!("scales_and_signs", 66, 32, FieldKind::ScalesAndSigns),
        ],
        decode: Decode::Routine,
        formula: "y[i] = ((d * (0.5 + ls(i/32))) * 0.5) * iq3xxs_grid[qs[i/4]][i%4] * sign(i) \
                  (dequantize_row_iq3_xxs)",
    },
    BlockFormat {
        ty: GgmlType::IQ1_S,
        block_size: QK_K,
        type_size: 50,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 32, FieldKind::GridIndex { bits: 8 }),
            field!("qh", 34, 16, FieldKind::GridHighScaleDelta),
        ],
        decode: Decode::Routine,
        formula: "y[i] = (d * (2 * ls(i/32) + 1)) * (iq1s_grid[index(i/8)][i%8] + delta(i/32)) \
                  (dequantize_row_iq1_s)",
    },
    BlockFormat {
        ty: GgmlType::IQ4_NL,
        block_size: 32,
        type_size: 18,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 16, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[NIBBLES_32],
                map: IntMap::Table(&KVALUES_IQ4NL),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * kvalues_iq4nl[nibble(i)]",
    },
    BlockFormat {
        ty: GgmlType::IQ3_S,
        block_size: QK_K,
        type_size: 110,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 64, FieldKind::GridIndex { bits: 8 }),
            field!("qh", 66, 8, FieldKind::GridIndex { bits: 1 }),
            field!("signs", 74, 32, FieldKind::SignBits),
            field!(
                "scales",
                106,
                4,
                FieldKind::SubScales(SubScalePacking::Nibbles)
            ),
        ],
        decode: Decode::Routine,
        formula:
            "y[i] = (d * (1 + 2 * ls(i/32))) * iq3s_grid[qs[i/4] | qh bit << 8][i%4] * sign(i) \
                  (dequantize_row_iq3_s)",
    },
    BlockFormat {
        ty: GgmlType::IQ2_S,
        block_size: QK_K,
        type_size: 82,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!("qs", 2, 32, FieldKind::GridIndex { bits: 8 }),
            field!("signs", 34, 32, FieldKind::SignBits),
            field!("qh", 66, 8, FieldKind::GridIndex { bits: 2 }),
            field!(
                "scales",
                74,
                8,
                FieldKind::SubScales(SubScalePacking::Nibbles)
            ),
        ],
        decode: Decode::Routine,
        formula: "y[i] = ((d * (0.5 + ls(i/16))) * 0.25) * iq2s_grid[qs[i/8] | qh bits << 8][i%8] * sign(i) \
                  (dequantize_row_iq2_s; ggml's struct has signs as the second half of qs)",
    },
    BlockFormat {
        ty: GgmlType::IQ4_XS,
        block_size: QK_K,
        type_size: 136,
        fields: &[
            field!("d", 0, 2, FieldKind::Scale(F16)),
            field!(
                "scales_h",
                2,
                2,
                FieldKind::SubScales(SubScalePacking::High2)
            ),
            field!(
                "scales_l",
                4,
                4,
                FieldKind::SubScales(SubScalePacking::Low4)
            ),
            field!("qs", 8, 128, FieldKind::Quants { bits: 4 }),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: Some(IntCode {
                pieces: &[
                    // ls(ib) = (scales_l[ib/2] >> 4*(ib%2) & 15) | (scales_h >> 2*ib & 3) << 4, ib = i/32
                    piece!("scales_l", byte: idx!(0; (64, 4, 1)), shift: idx!(0; (32, 2, 4)), width: 4, at: 0),
                    piece!("scales_h", byte: idx!(0; (128, 2, 1)), shift: idx!(0; (32, 4, 2)), width: 2, at: 4),
                ],
                map: IntMap::Offset(-32),
            }),
            quant: IntCode {
                pieces: &[
                    piece!("qs", byte: idx!(0; (32, 8, 16), (1, 16, 1)), shift: idx!(0; (16, 2, 4)), width: 4, at: 0),
                ],
                map: IntMap::Table(&KVALUES_IQ4NL),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = (d * (ls(i/32) - 32)) * kvalues_iq4nl[q4(i)]",
    },
    BlockFormat {
        ty: GgmlType::IQ1_M,
        block_size: QK_K,
        type_size: 56,
        fields: &[
            field!("qs", 0, 32, FieldKind::GridIndex { bits: 8 }),
            field!("qh", 32, 16, FieldKind::GridHighDelta),
            field!("scales", 48, 8, FieldKind::ScalesAndScale),
        ],
        decode: Decode::Routine,
        formula: "y[i] = (d * (2 * ls(i/16) + 1)) * (iq1s_grid[index(i/8)][i%8] + delta(i/8)) \
                  (dequantize_row_iq1_m; d is spread over the scales' top nibbles)",
    },
    BlockFormat {
        ty: GgmlType::BF16,
        block_size: 1,
        type_size: 2,
        fields: &[field!("value", 0, 2, FieldKind::Value(ScalarKind::BF16))],
        decode: Decode::Scalar(ScalarKind::BF16),
        formula: "y = f32(value << 16)",
    },
    BlockFormat {
        ty: GgmlType::TQ1_0,
        block_size: QK_K,
        type_size: 54,
        fields: &[
            field!("qs", 0, 48, FieldKind::Ternary { per_byte: 5 }),
            field!("qh", 48, 4, FieldKind::Ternary { per_byte: 4 }),
            field!("d", 52, 2, FieldKind::Scale(F16)),
        ],
        decode: Decode::Routine,
        formula: "y[i] = (digit(i) - 1) * d, digit n of byte q = ((q * 3^n mod 256) * 3) >> 8; \
                  values 0..160: qs[0..32] digits 0..5, 160..240: qs[32..48] digits 0..5, \
                  240..256: qh[0..4] digits 0..4 (dequantize_row_tq1_0)",
    },
    BlockFormat {
        ty: GgmlType::TQ2_0,
        block_size: QK_K,
        type_size: 66,
        fields: &[
            field!("qs", 0, 64, FieldKind::Quants { bits: 2 }),
            field!("d", 64, 2, FieldKind::Scale(F16)),
        ],
        decode: Decode::Quantized(Recipe {
            d: "d",
            sub_scale: None,
            quant: IntCode {
                pieces: &[CRUMBS_256],
                map: IntMap::Offset(-1),
            },
            min: MinTerm::None,
        }),
        formula: "y[i] = d * (q2(i) - 1)   (q2 in Q2_K's crumb order)",
    },
    BlockFormat {
        ty: GgmlType::MXFP4,
        block_size: 32,
        type_size: 17,
        fields: &[
            field!("e", 0, 1, FieldKind::E8M0Scale),
            field!("qs", 1, 16, FieldKind::Quants { bits: 4 }),
        ],
        // No recipe: the scale is an E8M0 exponent, not an f16/f32 field (the nibbles are
        // IQ4_NL's, through another table).
        decode: Decode::Routine,
        formula: "y[i] = kvalues_mxfp4[nibble(i)] * 2^(e - 128)   (nibble(i) as IQ4_NL's; \
                  dequantize_row_mxfp4)",
    },
];
