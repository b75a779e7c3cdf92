//! The metadata key/value table of a GGUF file, with typed getters that name the key in errors.

use super::error::GgufError;
use super::value::{Array, Value};
use std::collections::HashMap;

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::KeyType {
        key: key.to_owned(),
        expected,
        found: match found {
            Value::Array(a) => format!("arr[{}]", a.elem_type().name()),
            v => v.value_type().name().to_owned(),
        },
    }
}

impl Metadata {
    /// Appends a pair; a repeated key replaces the lookup of the earlier one (the reader refuses
    /// duplicates before calling this).
    pub fn push(&mut self, key: String, value: Value) {
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// `key` as a `u32` (any integer type whose value fits); `Ok(None)` when absent.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_u32()
                    .ok_or_else(|| wrong_type(key, "an integer that fits u32", v))
            })
            .transpose()
    }

    /// `key` as an `f32` (F32, F64 or integer); `Ok(None)` when absent.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key)
            .map(|v| v.as_f32().ok_or_else(|| wrong_type(key, "a number", v)))
            .transpose()
    }

    /// `key` as a `bool`; `Ok(None)` when absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| wrong_type(key, "bool", v)))
            .transpose()
    }

    /// `key` as a string; `Ok(None)` when absent.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| wrong_type(key, "str", v)))
            .transpose()
    }

    /// `key` as an array; `Ok(None)` when absent.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| wrong_type(key, "arr", v)))
            .transpose()
    }
}
