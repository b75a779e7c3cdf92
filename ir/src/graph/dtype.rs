//! Element types of IR tensors.

use crate::ggml::GgmlType;
use serde::{Deserialize, Serialize};

/// The element type of an IR tensor: the plain types activations use, or a GGML block type
/// (weights only).
///
/// Serialized as the GGML type name (`"F32"`, `"Q4_K"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (KV cache, F16 weights).
    F16,
    /// bfloat16 (BF16 weights).
    BF16,
    /// 32-bit signed integer (token ids, positions, row indices).
    I32,
    /// A quantized GGML block type (`Q4_0` ... `IQ4_XS`): weights, and Q8_0 KV caches
    /// ([`KvTypes`]); stored in rows of whole blocks.
    Block(GgmlType),
}

impl DType {
    /// The IR type of a GGML tensor type, or `None` for GGML types the IR has no use for
    /// (I8, I16, I64, F64).
    pub fn from_ggml(t: GgmlType) -> Option<DType> {
        match t {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            GgmlType::I32 => Some(DType::I32),
            GgmlType::I8 | GgmlType::I16 | GgmlType::I64 | GgmlType::F64 => None,
            t => Some(DType::Block(t)),
        }
    }

    /// The GGML type with the same storage.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            DType::F32 => GgmlType::F32,
            DType::F16 => GgmlType::F16,
            DType::BF16 => GgmlType::BF16,
            DType::I32 => GgmlType::I32,
            DType::Block(t) => t,
        }
    }

    /// Values per block (1 for the plain types).
    pub fn block_size(self) -> u64 {
        self.ggml_type().block_size() as u64
    }

    /// Bytes per block (the element size for the plain types).
    pub fn type_size(self) -> u64 {
        self.ggml_type().type_size() as u64
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not whole blocks.
    pub fn row_size(self, n: u64) -> Option<u64> {
        self.ggml_type().row_size(n)
    }

    /// Whether this is one of the float types activations and caches use (F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Whether a KV cache may hold this type: F32, F16 (llama.cpp's default) or Q8_0
    /// (`-ctk q8_0`: blocks of 32 values with one f16 scale, quantized as llama.cpp's CPU
    /// backend quantizes activations).
    pub fn is_cache_type(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Block(GgmlType::Q8_0))
    }

    /// The name as GGML spells it.
    pub fn name(self) -> &'static str {
        self.ggml_type().name()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<DType> for String {
    fn from(d: DType) -> String {
        d.name().to_owned()
    }
}

impl TryFrom<String> for DType {
    type Error = String;
    fn try_from(s: String) -> Result<DType, String> {
        GgmlType::from_name(&s)
            .and_then(DType::from_ggml)
            .ok_or_else(|| format!("unknown IR dtype {s:?}"))
    }
}

/// The element types of the K and V caches: llama.cpp's `type_k` and `type_v` (`-ctk`,
/// `-ctv`), each one of the [`DType::is_cache_type`] types. F16 for both by default, as
/// llama.cpp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvTypes {
    /// Type of the K cache.
    pub k: DType,
    /// Type of the V cache.
    pub v: DType,
}

impl KvTypes {
    /// F16 K and V (llama.cpp's default).
    pub const F16: KvTypes = KvTypes::same(DType::F16);

    /// The same type for K and V.
    pub const fn same(t: DType) -> KvTypes {
        KvTypes { k: t, v: t }
    }

    /// Whether K or V is a block (quantized) type.
    pub fn is_quantized(self) -> bool {
        matches!(self.k, DType::Block(_)) || matches!(self.v, DType::Block(_))
    }

    /// An error naming the first type a KV cache cannot hold, if any.
    pub fn check(self) -> Result<(), String> {
        for (what, t) in [("K", self.k), ("V", self.v)] {
            if !t.is_cache_type() {
                return Err(format!(
                    "{what} cache type {t} is not supported (supported: f32, f16, q8_0)"
                ));
            }
        }
        Ok(())
    }
}

impl Default for KvTypes {
    fn default() -> KvTypes {
        KvTypes::F16
    }
}

impl std::fmt::Display for KvTypes {
    /// `f16` when K and V agree, else `k q8_0 / v f16`; lower case as llama.cpp's flags.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, v) = (
            self.k.name().to_ascii_lowercase(),
            self.v.name().to_ascii_lowercase(),
        );
        if k == v {
            f.write_str(&k)
        } else {
            write!(f, "k {k} / v {v}")
        }
    }
}
