//! Writing GGUF files (GGUF spec, "File Structure"): header, metadata, tensor infos, and
//! tensor data placed at multiples of the alignment. Used by tests to build fixtures and by
//! `modelc quantize`.

use super::error::GgufError;
use super::value::{Array, Value};
use super::GGUF_DEFAULT_ALIGNMENT;
use crate::ggml::GgmlType;
use std::io::Write;
use std::path::Path;

struct PendingTensor {
    name: String,
    ne: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes a complete GGUF file.
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// A writer for a GGUF version 3 file with the default alignment of 32 bytes.
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: GGUF_DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Writes version `version` (2 or 3; the layouts are identical) instead of 3.
    pub fn version(mut self, version: u32) -> GgufWriter {
        self.version = version;
        self
    }

    /// Adds a metadata pair. Setting `general.alignment` (a u32) changes the data alignment.
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            if let Value::U32(a) = value {
                self.alignment = u64::from(a);
            }
        }
        self.kvs.push((key, value));
        self
    }

    /// Adds a tensor of shape `ne` (ggml order, innermost first, 1 to 4 dimensions) whose
    /// `data` is already in `ggml_type`'s layout.
    ///
    /// Errors: more than 4 dimensions, `ne[0]` not a multiple of the block size, or `data`
    /// not exactly the size the shape needs.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ne: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        if ne.len() > super::GGML_MAX_DIMS {
            return Err(GgufError::Write(format!(
                "tensor '{name}' has {} dimensions",
                ne.len()
            )));
        }
        let n0 = ne.first().copied().unwrap_or(1);
        let rows: u64 = ne.iter().skip(1).product();
        let expected = ggml_type
            .row_size(n0)
            .and_then(|r| r.checked_mul(rows))
            .ok_or_else(|| {
                GgufError::Write(format!(
                    "tensor '{name}': ne {ne:?} does not fit {ggml_type}"
                ))
            })?;
        if expected != data.len() as u64 {
            return Err(GgufError::Write(format!(
                "tensor '{name}': {ggml_type} {ne:?} needs {expected} bytes, got {}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            ne: ne.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    /// The complete file as bytes.
    ///
    /// Errors: what llama.cpp's reader would refuse and [`super::GgufFile`] refuses too: an
    /// alignment that is not a power of two, an empty or repeated metadata key, an array of
    /// arrays, a repeated tensor name or one of [`super::GGML_MAX_NAME`] bytes or more.
    /// (Tensor data are placed back to back in order, as the reader requires.)
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        if self.alignment == 0 || !self.alignment.is_power_of_two() {
            return Err(GgufError::Write(format!(
                "alignment {} is not a power of two",
                self.alignment
            )));
        }
        self.check_readable()?;
        let mut out = Vec::new();
        out.extend_from_slice(super::GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut out, v);
        }
        let align = |x: u64| x.next_multiple_of(self.alignment);
        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = align(offset + t.data.len() as u64);
        }
        out.resize(align(out.len() as u64) as usize, 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            out.resize(align(out.len() as u64) as usize, 0);
        }
        Ok(out)
    }

    /// The rules of [`GgufWriter::to_bytes`] beyond the alignment.
    fn check_readable(&self) -> Result<(), GgufError> {
        let refuse = |msg: String| Err(GgufError::Write(msg));
        let mut keys = std::collections::HashSet::new();
        for (k, v) in &self.kvs {
            if k.is_empty() {
                return refuse("an empty metadata key (llama.cpp's reader refuses it)".into());
            }
            if !keys.insert(k.as_str()) {
                return refuse(format!("metadata key '{k}' is set twice"));
            }
            if let Value::Array(Array::Array(_)) = v {
                return refuse(format!(
                    "metadata key '{k}' is an array of arrays (llama.cpp's reader refuses it)"
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for t in &self.tensors {
            if t.name.len() >= super::GGML_MAX_NAME {
                return refuse(format!(
                    "tensor name '{}' is {} bytes long; names must be shorter than {} bytes",
                    t.name,
                    t.name.len(),
                    super::GGML_MAX_NAME
                ));
            }
            if !names.insert(t.name.as_str()) {
                return refuse(format!("tensor name '{}' is used twice", t.name));
            }
        }
        Ok(())
    }

    /// Writes the file atomically: to `PATH.tmp` first, then renamed over `path`.
    pub fn write_to_file(&self, path: &Path) -> Result<(), GgufError> {
        let bytes = self.to_bytes()?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_str(out, s),
        Value::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => out.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| write_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| write_array(out, a)),
    }
}
