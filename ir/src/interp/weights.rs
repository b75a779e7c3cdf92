//! Where the interpreter finds weights: a GGUF file (zero-copy from its map), or tensors held
//! in memory (tests, pass checks).

use crate::ggml::GgmlType;
use crate::gguf::GgufFile;
use std::collections::HashMap;

/// A weight as stored: GGML type, shape (`ne`) and bytes.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Shape, innermost first.
    pub ne: [u64; 4],
    /// Data: rows of whole blocks, back to back.
    pub data: &'a [u8],
}

/// A source of named weights.
pub trait WeightSource {
    /// The weight called `name`, if present.
    fn weight(&self, name: &str) -> Option<WeightRef<'_>>;
}

impl WeightSource for GgufFile {
    fn weight(&self, name: &str) -> Option<WeightRef<'_>> {
        let t = self.tensor(name)?;
        Some(WeightRef {
            ggml_type: t.ggml_type,
            ne: t.ne,
            data: self.tensor_data(t),
        })
    }
}

/// Weights held in memory, by name.
#[derive(Clone, Debug, Default)]
pub struct MemWeights {
    map: HashMap<String, (GgmlType, [u64; 4], Vec<u8>)>,
}

impl MemWeights {
    /// No weights.
    pub fn new() -> MemWeights {
        MemWeights::default()
    }

    /// Adds (or replaces) weight `name` of type `ty` and shape `ne` with raw bytes `data`.
    pub fn insert(&mut self, name: impl Into<String>, ty: GgmlType, ne: [u64; 4], data: Vec<u8>) {
        self.map.insert(name.into(), (ty, ne, data));
    }

    /// Adds an F32 weight from values.
    pub fn insert_f32(&mut self, name: impl Into<String>, ne: [u64; 4], values: &[f32]) {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.insert(name, GgmlType::F32, ne, data);
    }
}

impl WeightSource for MemWeights {
    fn weight(&self, name: &str) -> Option<WeightRef<'_>> {
        self.map.get(name).map(|(t, ne, d)| WeightRef {
            ggml_type: *t,
            ne: *ne,
            data: d,
        })
    }
}
