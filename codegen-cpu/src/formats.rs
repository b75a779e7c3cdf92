//! Descriptions of the weight block formats the CPU matmul kernels handle. One description per
//! format drives the repacker ([`crate::layout`]), the activation quantizer
//! ([`crate::actq`]) and the kernel generators ([`crate::generated`]) (DESIGN.md principle 1).
//!
//! Source of the block layouts: ggml's `ggml-common.h` (`block_q4_0`, `block_q4_1`,
//! `block_q8_0`): a block of 32 values is an f16 scale `d` (and for Q4_1 an f16 minimum `m`),
//! then the quants. 4-bit quants are packed two per byte: byte `j` holds value `j` in its low
//! nibble and value `j + 16` in its high nibble.

use ir::ggml::GgmlType;

/// Values per block of every format handled here (`QK4_0 = QK4_1 = QK8_0 = QK8_1 = 32`).
pub const QK: usize = 32;

/// Rows interleaved in one repacked group: one 32-bit SIMD lane holds one row.
pub const GROUP_ROWS: usize = 4;

/// Which 8-bit companion format the activations are quantized to before the dot product
/// (ggml's `vec_dot_type` of the weight type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    /// `Q8_0`: `d = amax/127` (stored as f16), 32 × i8. Companion of Q4_0 and Q8_0.
    Q8_0,
    /// `Q8_1`: as `Q8_0` plus `s = d·Σq` (stored as f16). Companion of Q4_1.
    Q8_1,
}

/// A quantized weight block format, as far as the kernels need to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantFormat {
    /// The GGML type.
    pub wtype: GgmlType,
    /// Bits per quant: 4 (two per byte, low nibble = value `j`, high = `j + 16`) or 8 (i8).
    pub bits: u8,
    /// Quants are stored unsigned with this zero point subtracted (`Q4_0`: 8), or 0.
    pub zero_point: i32,
    /// The block has an f16 minimum `m` after `d` (value = `d·q + m`; `Q4_1`).
    pub has_min: bool,
    /// The companion activation format.
    pub act: ActKind,
}

impl QuantFormat {
    /// The format description of `wtype`, if the CPU kernels handle it.
    pub fn of(wtype: GgmlType) -> Option<QuantFormat> {
        let (bits, zero_point, has_min, act) = match wtype {
            GgmlType::Q4_0 => (4, 8, false, ActKind::Q8_0),
            GgmlType::Q4_1 => (4, 0, true, ActKind::Q8_1),
            GgmlType::Q8_0 => (8, 0, false, ActKind::Q8_0),
            _ => return None,
        };
        Some(QuantFormat {
            wtype,
            bits,
            zero_point,
            has_min,
            act,
        })
    }

    /// Bytes of one source (ggml) block: `ggml_type_size`.
    pub fn src_block_bytes(&self) -> usize {
        2 + if self.has_min { 2 } else { 0 } + self.qs_bytes()
    }

    /// Byte offset of the quants in a source block.
    pub fn src_qs_offset(&self) -> usize {
        if self.has_min {
            4
        } else {
            2
        }
    }

    /// Bytes of quants per row and block (16 for 4-bit, 32 for 8-bit).
    pub fn qs_bytes(&self) -> usize {
        QK * self.bits as usize / 8
    }

    /// Byte offset of the interleaved quants in a repacked group-block: after the 4 rows'
    /// f16 `d` (8 bytes) and, for Q4_1, their f16 `m` (8 bytes).
    pub fn group_qs_offset(&self) -> usize {
        8 + if self.has_min { 8 } else { 0 }
    }

    /// Bytes of one repacked group-block: [`GROUP_ROWS`] rows × one block. See
    /// [`crate::layout`] for the layout.
    pub fn group_block_bytes(&self) -> usize {
        self.group_qs_offset() + GROUP_ROWS * self.qs_bytes()
    }
}
