//! The GGML tensor type table: every type id GGML defines, with its name, block size and
//! bytes per block.
//!
//! Source of the ids and sizes: ggml's `ggml.h` (`enum ggml_type`) and the block structs in
//! `ggml-common.h`. Ids 4, 5 (Q4_2, Q4_3), 31–33 (the old Q4_0_N_M repacks) and 36–38 (the
//! IQ4_NL_N_M repacks) were removed from GGML and are rejected as unknown.

use serde::{Deserialize, Serialize};

/// Values per super-block of the K-quants and most IQ types (`QK_K` in ggml).
pub const QK_K: usize = 256;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $blck:expr, $size:expr; )*) => {
        /// A GGML tensor element type, as stored in a GGUF tensor info (`ggml_type`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $( #[doc = concat!("`GGML_TYPE_", $name, "` (id ", stringify!($id), ")")] $variant = $id, )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[ $( GgmlType::$variant, )* ];

            /// The type with GGML id `id`, or `None` for an unknown or removed id.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// The GGML type id.
            pub fn id(self) -> u32 {
                self as u32
            }

            /// The name as GGML spells it (`"Q4_K"`, `"F32"`, `"IQ4_NL"`).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Number of values in one block (1 for the plain scalar types).
            pub fn block_size(self) -> usize {
                match self { $( GgmlType::$variant => $blck, )* }
            }

            /// Bytes of one block (`ggml_type_size`).
            pub fn type_size(self) -> usize {
                match self { $( GgmlType::$variant => $size, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", QK_K, 84;
    Q3_K = 11, "Q3_K", QK_K, 110;
    Q4_K = 12, "Q4_K", QK_K, 144;
    Q5_K = 13, "Q5_K", QK_K, 176;
    Q6_K = 14, "Q6_K", QK_K, 210;
    Q8_K = 15, "Q8_K", QK_K, 292;
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 66;
    IQ2_XS = 17, "IQ2_XS", QK_K, 74;
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 98;
    IQ1_S = 19, "IQ1_S", QK_K, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", QK_K, 110;
    IQ2_S = 22, "IQ2_S", QK_K, 82;
    IQ4_XS = 23, "IQ4_XS", QK_K, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", QK_K, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", QK_K, 54;
    TQ2_0 = 35, "TQ2_0", QK_K, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
}

impl GgmlType {
    /// The type named `name` (case-insensitive, as GGML spells it), if any.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether values of this type are stored in blocks with shared scales (every quantized type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes needed for a row of `n` values, or `None` when `n` is not a multiple of the
    /// block size (ggml's `ggml_row_size`, checked).
    pub fn row_size(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn row_sizes() {
        assert_eq!(GgmlType::Q4_0.row_size(576), Some(18 * 18));
        assert_eq!(GgmlType::Q4_K.row_size(576), None);
        assert_eq!(GgmlType::F32.row_size(3), Some(12));
    }
}
