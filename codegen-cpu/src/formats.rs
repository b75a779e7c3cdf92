//! What the CPU matmul kernels need to know of a weight block format, *derived* from its one
//! description in `ir::ggml` ([`ir::ggml::block_format`], DESIGN.md principle 1): the
//! repacker ([`crate::layout`]), the activation quantizer ([`crate::actq`]) and the kernel
//! generators ([`crate::generated`]) read a [`QuantFormat`], which [`QuantFormat::of`] builds
//! from the description and the type's `vec_dot_type`. A type gets generated kernels exactly
//! when its description has the shape they implement (a 32-value block: an f16 scale `d`
//! first, an optional f16 minimum `m` added after scaling, then one quant field of 4-bit
//! values in ggml's nibble order — byte `j` holds value `j` low and `j + 16` high — with a
//! constant offset, or of int8 values); no list of types is written here. Today that is
//! Q4_0, Q4_1 and Q8_0 (ggml-common.h's `block_q4_0`, `block_q4_1`, `block_q8_0`); every
//! other block type goes through the row-dot kernels ([`crate::rows`]).

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
    /// The kernels' view of `wtype`, derived from its `ir::ggml` description (module doc),
    /// if the generated kernels handle its shape. (Derived once per process; callers ask
    /// per call of a kernel.)
    pub fn of(wtype: GgmlType) -> Option<QuantFormat> {
        static DERIVED: std::sync::OnceLock<Vec<(GgmlType, QuantFormat)>> =
            std::sync::OnceLock::new();
        DERIVED
            .get_or_init(|| {
                GgmlType::ALL
                    .iter()
                    .filter_map(|&t| Some((t, QuantFormat::derive(t)?)))
                    .collect()
            })
            .iter()
            .find(|(t, _)| *t == wtype)
            .map(|&(_, f)| f)
    }

    /// [`QuantFormat::of`], computed from the description.
    fn derive(wtype: GgmlType) -> Option<QuantFormat> {
        use ir::ggml::{Decode, FieldKind, IntMap, MinTerm, ScalarKind};
        let f = ir::ggml::block_format(wtype)?;
        let Decode::Quantized(r) = f.decode else {
            return None;
        };
        if f.block_size != QK || r.sub_scale.is_some() {
            return None;
        }
        let f16_at = |name: &str, offset: usize, kind: fn(ScalarKind) -> FieldKind| {
            f.field(name)
                .is_some_and(|fl| fl.offset == offset && fl.kind == kind(ScalarKind::F16))
        };
        if !f16_at(r.d, 0, FieldKind::Scale) {
            return None;
        }
        let has_min = match r.min {
            MinTerm::None => false,
            MinTerm::Add { m } if f16_at(m, 2, FieldKind::Min) => true,
            _ => return None,
        };
        let [piece] = r.quant.pieces else {
            return None;
        };
        let qs = f.field(piece.field)?;
        let bits = piece.width;
        // Value i at byte (i % 16), bit 4·(i / 16) for 4-bit quants; at byte i for int8.
        let laid_out = (0..QK).all(|i| match bits {
            4 => piece.byte.eval(i) == i % 16 && piece.shift.eval(i) == 4 * (i / 16),
            8 => piece.byte.eval(i) == i && piece.shift.eval(i) == 0,
            _ => false,
        });
        let zero_point = match (bits, r.quant.map) {
            (4, IntMap::Offset(k)) => -k,
            (8, IntMap::Int8) => 0,
            _ => return None,
        };
        let qs_at = if has_min { 4 } else { 2 };
        if !laid_out
            || piece.at != 0
            || qs.offset != qs_at
            || qs.size != QK * bits as usize / 8
            || f.type_size != qs_at + qs.size
        {
            return None;
        }
        let act = match ir::ggml::vec_dot_type(wtype)? {
            GgmlType::Q8_0 => ActKind::Q8_0,
            GgmlType::Q8_1 => ActKind::Q8_1,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivation finds exactly the shapes the generated kernels implement, with the
    /// parameters of ggml-common.h's structs.
    #[test]
    fn formats_are_derived_from_the_descriptions() {
        let found: Vec<QuantFormat> = GgmlType::ALL
            .iter()
            .filter_map(|&t| QuantFormat::of(t))
            .collect();
        let want = [
            (GgmlType::Q4_0, 4, 8, false, ActKind::Q8_0, 18),
            (GgmlType::Q4_1, 4, 0, true, ActKind::Q8_1, 20),
            (GgmlType::Q8_0, 8, 0, false, ActKind::Q8_0, 34),
        ];
        assert_eq!(found.len(), want.len(), "{found:?}");
        for (f, (t, bits, zp, min, act, bytes)) in found.iter().zip(want) {
            assert_eq!(
                (f.wtype, f.bits, f.zero_point, f.has_min, f.act),
                (t, bits, zp, min, act)
            );
            assert_eq!(f.src_block_bytes(), bytes);
            assert_eq!(f.src_block_bytes(), t.type_size());
        }
    }
}
