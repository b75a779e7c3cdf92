//! One description per GGML block format (DESIGN.md principle 1: quant formats are data).
//!
//! A [`BlockFormat`] says how many values a block holds, how many bytes it takes, which fields
//! it has and where (the C structs of ggml's `ggml-common.h`), and how value `i` of a block is
//! decoded. The decoding of every quantized format listed here has the same shape:
//!
//! ```text
//! y_i = (d * s_i) * q_i            (no sub-block scale: y_i = d * q_i)
//!       [ + m                 ]    Q4_1, Q5_1: a block minimum added
//!       [ - dmin * m_i        ]    Q2_K, Q4_K, Q5_K: a quantized minimum subtracted
//! ```
//!
//! evaluated in f32 in exactly that order, which is the order of ggml's `dequantize_row_*`
//! (ggml-quants.c). `d`, `m`, `dmin` are f16 fields (f32 for Q8_K), `s_i`, `m_i` and `q_i` are
//! small integers assembled from bit fields ([`BitPiece`]) and mapped by an [`IntMap`] (an
//! offset such as -8 for Q4_0, a sign extension for int8 data, or the IQ4_NL lookup table).
//!
//! Codegen reads these tables to emit loads, shifts and masks; the fast reference dequantizer
//! in [`super::dequantize`] is tested bit-for-bit against [`BlockFormat::decode_value`], the
//! direct interpreter of this description.

use super::fp::{bf16_to_f32, f16_to_f32};
use super::GgmlType;

pub use super::layouts::KVALUES_IQ4NL;

/// How a plain (non-block) number is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarKind {
    /// IEEE binary32, little-endian (4 bytes).
    F32,
    /// IEEE binary16, little-endian (2 bytes).
    F16,
    /// bfloat16 (the top 16 bits of an f32), little-endian (2 bytes).
    BF16,
}

impl ScalarKind {
    /// Bytes one number of this kind takes.
    pub fn size(self) -> usize {
        match self {
            ScalarKind::F32 => 4,
            ScalarKind::F16 | ScalarKind::BF16 => 2,
        }
    }

    /// Decodes the number stored at the start of `b` (which must be at least
    /// [`size`](Self::size) bytes).
    pub fn read(self, b: &[u8]) -> f32 {
        match self {
            ScalarKind::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            ScalarKind::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            ScalarKind::BF16 => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        }
    }
}

/// How the packed sub-block scales of a format are arranged (see each variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubScalePacking {
    /// Q2_K `scales[16]`: one byte per 16 values; low nibble = scale, high nibble = min.
    ScaleMin4,
    /// Q3_K `scales[12]`: sixteen 6-bit scales stored with +32 bias; low 4 bits of scale j in
    /// byte `j % 8` (nibble `j / 8`), high 2 bits in byte `8 + j % 4` at bit `2 * (j / 4)`.
    Signed6Q3K,
    /// Q4_K / Q5_K `scales[12]`: eight 6-bit scales and eight 6-bit mins, unpacked by ggml's
    /// `get_scale_min_k4`: for j < 4 scale = `q[j] & 63`, min = `q[j + 4] & 63`; for j >= 4
    /// scale = `(q[j + 4] & 15) | (q[j - 4] >> 6) << 4`, min = `(q[j + 4] >> 4) | (q[j] >> 6) << 4`.
    ScaleMin6K4,
    /// Q6_K `scales[16]`: one signed byte per 16 values.
    Int8,
    /// IQ4_XS `scales_h` (u16): the top 2 bits of the 6-bit scale of each 32 values.
    High2,
    /// IQ4_XS `scales_l[4]`: the low 4 bits of the 6-bit scale of each 32 values.
    Low4,
    /// IQ3_S `scales[4]` / IQ2_XS `scales[8]`: the 4-bit scale of each 32 (IQ3_S) or 16
    /// (IQ2_XS) values, two a byte, low nibble first.
    Nibbles,
}

/// What one field of a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// The value itself (F32, F16, BF16: one value per "block").
    Value(ScalarKind),
    /// The block (super-block) scale `d`.
    Scale(ScalarKind),
    /// The block minimum `m`, added after scaling (Q4_1, Q5_1).
    Min(ScalarKind),
    /// The super-block scale of the quantized minimums `dmin`, subtracted (K-quants).
    MinScale(ScalarKind),
    /// Q8_1's `s = d * sum(qs)`, used by the Q4_1 / Q5_1 dot products.
    Sum(ScalarKind),
    /// The quants (or their low bits), `bits` per value, packed into bytes.
    Quants {
        /// Bits of each value stored in this field.
        bits: u8,
    },
    /// High bits of the quants (Q5_0/Q5_1/Q5_K `qh`, Q3_K `hmask`, Q6_K `qh`).
    HighBits {
        /// Bits of each value stored in this field.
        bits: u8,
    },
    /// Packed sub-block scales (and mins).
    SubScales(SubScalePacking),
    /// Q8_K `bsums`: i16 sum of the quants of each 16 values.
    BlockSums,
    /// Indices into a lattice grid ([`super::grids`]), `bits` of each index stored here (the
    /// low 8 bits, or the high bits kept apart: IQ3_S `qh` holds bit 8, IQ2_S `qh` bits 8 and
    /// 9), each index
    /// selecting the magnitudes of 4 or 8 values.
    GridIndex {
        /// Bits of each index stored in this field.
        bits: u8,
    },
    /// IQ3_XXS `scales_and_signs`: per 32 values a little-endian u32 holding four 7-bit
    /// [`super::grids::KSIGNS_IQ2XS`] indices (bits `7l..7l + 7`, the signs of values
    /// `8l .. 8l + 8`) and the 4-bit scale `ls` (bits 28..32; the values' scale is
    /// `d * (0.5 + ls) * 0.5`).
    ScalesAndSigns,
    /// IQ2_XXS `qs` (as u16 in ggml's struct): per 32 values 8 bytes, four
    /// [`super::grids::IQ2XXS_GRID`] indices then a u32 laid out as
    /// [`FieldKind::ScalesAndSigns`] (the values' scale is `d * (0.5 + ls) * 0.25`).
    GridIndexScalesSigns,
    /// IQ2_XS `qs` (u16 each): a 9-bit [`super::grids::IQ2XS_GRID`] index (bits 0..9) and a
    /// 7-bit [`super::grids::KSIGNS_IQ2XS`] index (bits 9..16), for 8 values each.
    GridIndexSigns,
    /// IQ1_S `qh` (u16 per 32 values): bits `3l..3l + 3` the high bits of grid index `l`,
    /// bits 12..15 the 3-bit scale, bit 15 the sign of the `±0.125` delta.
    GridHighScaleDelta,
    /// IQ1_M `qh`: per 8 values a nibble (low first): bits 0..3 the high bits of the grid
    /// index, bit 3 the sign of the `±0.125` delta.
    GridHighDelta,
    /// IQ1_M `scales` (four u16): the 3-bit scale of each 16 values (bits 0..12 of each), the
    /// f16 super-block scale `d` in their top nibbles (first u16 lowest).
    ScalesAndScale,
    /// MXFP4 `e`: the block scale as an E8M0 exponent byte; the values' scale is
    /// `2^(e - 128)` ([`super::e8m0_to_f32_half`], half of the byte's `2^(e - 127)` since the
    /// E2M1 table [`super::grids::KVALUES_MXFP4`] is stored doubled).
    E8M0Scale,
    /// Sign bits, one per value (IQ3_S `signs`: bit `v % 8` of byte `v / 8`; IQ2_S: the
    /// second half of `qs`).
    SignBits,
    /// Ternary quants packed as base-3 numbers, `per_byte` digits in a byte (TQ1_0 `qs`: 5,
    /// `qh`: 4). Digit `n` of byte `q` is `((q * 3^n mod 256) * 3) >> 8`, as ggml's
    /// `dequantize_row_tq1_0` extracts it.
    Ternary {
        /// Digits stored in each byte.
        per_byte: u8,
    },
}

/// One named field of a block: `size` bytes at byte `offset` of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    /// The member name in ggml's C struct (`d`, `m`, `dmin`, `qs`, `qh`, `scales`, ...).
    pub name: &'static str,
    /// Byte offset within the block.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// What it holds.
    pub kind: FieldKind,
}

/// One term `((i / div) % modulo) * mul` of an [`Index`], for value index `i` in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// Divisor applied to the value index.
    pub div: usize,
    /// Modulus applied after the division.
    pub modulo: usize,
    /// Multiplier of the result.
    pub mul: usize,
}

/// An integer computed from the value index `i`: `base + sum of terms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Index {
    /// Constant part.
    pub base: usize,
    /// Index-dependent terms.
    pub terms: &'static [Term],
}

impl Index {
    /// The value of this index for value `i`.
    pub fn eval(&self, i: usize) -> usize {
        // A zero divisor or modulus (never in the tables) contributes nothing instead of
        // panicking.
        self.terms.iter().fold(self.base, |acc, t| {
            let q = i.checked_div(t.div).and_then(|q| q.checked_rem(t.modulo));
            acc + q.unwrap_or(0) * t.mul
        })
    }
}

/// `width` bits taken from one byte of a field and placed at bit `at` of an integer:
/// `((field[byte(i)] >> shift(i)) & ((1 << width) - 1)) << at`, for the values
/// `values.0 <= i < values.1` of the block only (every value for most pieces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BitPiece {
    /// Name of the field the byte is read from.
    pub field: &'static str,
    /// Byte within the field.
    pub byte: Index,
    /// Right shift applied to that byte.
    pub shift: Index,
    /// Number of bits taken.
    pub width: u8,
    /// Bit position of those bits in the assembled integer.
    pub at: u8,
    /// Half-open range of value indices this piece applies to.
    pub values: (usize, usize),
}

/// How the integer assembled from [`BitPiece`]s becomes the number used in the formula.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntMap {
    /// Add a constant (`-8` for Q4_0, `-32` for the Q3_K scales, `0` for unsigned data).
    Offset(i32),
    /// The 8 bits are a two's-complement int8.
    Int8,
    /// Look the integer up in a table (IQ4_NL / IQ4_XS: [`KVALUES_IQ4NL`]).
    Table(&'static [i8]),
}

impl IntMap {
    /// Maps the raw assembled integer; `None` if a table has no entry for it.
    pub fn apply(&self, raw: u32) -> Option<i32> {
        match *self {
            IntMap::Offset(k) => Some(raw as i32 + k),
            IntMap::Int8 => Some(raw as u8 as i8 as i32),
            IntMap::Table(t) => t.get(raw as usize).map(|&v| v as i32),
        }
    }
}

/// A small integer decoded from bit fields: `map(sum of pieces)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IntCode {
    /// The bit pieces, ORed together.
    pub pieces: &'static [BitPiece],
    /// The mapping of the assembled integer.
    pub map: IntMap,
}

/// The minimum term of a quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MinTerm {
    /// No minimum: `y = D * q`.
    None,
    /// `y = D * q + m`, with `m` the named block field (Q4_1, Q5_1).
    Add {
        /// Field holding `m`.
        m: &'static str,
    },
    /// `y = D * q - dmin * m_i`, with `dmin` the named field and `m_i` a sub-block integer.
    SubtractScaled {
        /// Field holding `dmin`.
        dmin: &'static str,
        /// The quantized minimum of value `i`.
        min: IntCode,
    },
}

/// How value `i` of a quantized block is decoded: `y = (d * s_i) * q_i` then the [`MinTerm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recipe {
    /// Field holding the block scale `d` (its kind says f16 or f32).
    pub d: &'static str,
    /// The sub-block scale `s_i`, if the format has one (`D = d * s_i`; else `D = d`).
    pub sub_scale: Option<IntCode>,
    /// The quant `q_i`.
    pub quant: IntCode,
    /// The minimum term.
    pub min: MinTerm,
}

/// How the values of a block are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decode {
    /// A plain scalar per "block" of one value (F32, F16, BF16).
    Scalar(ScalarKind),
    /// A quantized block.
    Quantized(Recipe),
    /// A quantized block whose values no [`Recipe`] expresses (base-3 digits, lattice grids
    /// with sign masks): decoded by the type's routine in the reference dequantizer
    /// ([`super::dequantize`], which reproduces ggml's `dequantize_row_<type>`); the fields and
    /// the `formula` still describe the block. Backends that generate dequantization from a
    /// recipe need a routine of their own for these (the GPU printer's: codegen-cuda's
    /// `kernels::routines`).
    Routine,
}

/// The description of one GGML block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockFormat {
    /// The type described.
    pub ty: GgmlType,
    /// Values per block (equals `ty.block_size()`).
    pub block_size: usize,
    /// Bytes per block (equals `ty.type_size()`).
    pub type_size: usize,
    /// The fields, in offset order, covering the block exactly.
    pub fields: &'static [Field],
    /// How values are decoded.
    pub decode: Decode,
    /// The dequantization in one line, in ggml's notation (for documentation and dumps).
    pub formula: &'static str,
}

impl BlockFormat {
    /// The field named `name`, if the format has one.
    pub fn field(&self, name: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Decodes value `i` (`0 <= i < block_size`) of `block` (exactly `type_size` bytes) by
    /// interpreting this description directly: slow, but the definition the fast
    /// dequantizer and every generated kernel are checked against.
    ///
    /// Returns `None` if `block` has the wrong length, `i` is out of range, or the
    /// description names a field it does not have (a bug caught by the tests).
    pub fn decode_value(&self, block: &[u8], i: usize) -> Option<f32> {
        if block.len() != self.type_size || i >= self.block_size {
            return None;
        }
        match self.decode {
            Decode::Scalar(kind) => {
                let f = self.fields.first()?;
                Some(kind.read(block.get(f.offset..f.offset + f.size)?))
            }
            Decode::Quantized(r) => {
                let d = self.read_scalar(block, r.d)?;
                let q = self.eval_int(block, &r.quant, i)? as f32;
                let scale = match r.sub_scale {
                    Some(s) => d * self.eval_int(block, &s, i)? as f32,
                    None => d,
                };
                let y = scale * q;
                Some(match r.min {
                    MinTerm::None => y,
                    MinTerm::Add { m } => y + self.read_scalar(block, m)?,
                    MinTerm::SubtractScaled { dmin, min } => {
                        y - self.read_scalar(block, dmin)? * self.eval_int(block, &min, i)? as f32
                    }
                })
            }
            Decode::Routine => {
                let mut y = vec![0f32; self.block_size];
                super::dequantize(self.ty, block, &mut y).ok()?;
                y.get(i).copied()
            }
        }
    }

    /// Whether the values follow a [`Recipe`] or are plain scalars (what backends that
    /// generate their dequantization from the description can take), rather than a
    /// [`Decode::Routine`].
    pub fn has_recipe(&self) -> bool {
        !matches!(self.decode, Decode::Routine)
    }

    /// Reads the f16/f32 scalar field `name`.
    fn read_scalar(&self, block: &[u8], name: &str) -> Option<f32> {
        let f = self.field(name)?;
        let kind = match f.kind {
            FieldKind::Value(k)
            | FieldKind::Scale(k)
            | FieldKind::Min(k)
            | FieldKind::MinScale(k)
            | FieldKind::Sum(k) => k,
            _ => return None,
        };
        Some(kind.read(block.get(f.offset..f.offset + kind.size())?))
    }

    /// Assembles and maps the integer `code` for value `i`.
    pub fn eval_int(&self, block: &[u8], code: &IntCode, i: usize) -> Option<i32> {
        let mut raw = 0u32;
        for p in code.pieces {
            if i < p.values.0 || i >= p.values.1 {
                continue;
            }
            let f = self.field(p.field)?;
            let byte = p.byte.eval(i);
            if byte >= f.size {
                return None;
            }
            let b = *block.get(f.offset + byte)? as u32;
            let mask = 1u32.checked_shl(p.width as u32)?.wrapping_sub(1);
            let bits = b.checked_shr(p.shift.eval(i) as u32).unwrap_or(0) & mask;
            raw |= bits.checked_shl(p.at as u32)?;
        }
        code.map.apply(raw)
    }
}

/// The description of type `t`, or `None` for the types not described yet (the I*/F64
/// integer types and the block types of [`super::layouts`] not yet listed there).
///
/// Described: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K,
/// Q6_K, Q8_K, IQ4_NL, IQ4_XS, TQ2_0, TQ1_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, MXFP4 (and the types of the second list
/// as they are added: see [`super::layouts`]).
pub fn block_format(t: GgmlType) -> Option<&'static BlockFormat> {
    super::layouts::ALL_FORMATS.iter().find(|f| f.ty == t)
}

/// Every described format, in GGML id order.
pub fn block_formats() -> &'static [BlockFormat] {
    &super::layouts::ALL_FORMATS
}
