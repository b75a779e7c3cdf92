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
    /// Bytes of the data (without padding).
    n_bytes: u64,
    /// The data, or `None` when [`GgufWriter::write_streaming`] is given it later.
    data: Option<Vec<u8>>,
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

    /// Sets the data alignment (a power of two) regardless of any `general.alignment` key
    /// (llama-quantize copies the input's key but always aligns to 32 bytes).
    pub fn set_alignment(&mut self, alignment: u64) -> &mut Self {
        self.alignment = alignment;
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
        let expected = Self::tensor_bytes(&name, ne, ggml_type)?;
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
            n_bytes: expected,
            data: Some(data),
        });
        Ok(self)
    }

    /// Adds the description of a tensor whose data [`write_streaming`](Self::write_streaming)
    /// asks for when it writes the file (for files too large to hold in memory).
    ///
    /// Errors: as [`add_tensor`](Self::add_tensor) for the shape.
    pub fn add_tensor_info(
        &mut self,
        name: impl Into<String>,
        ne: &[u64],
        ggml_type: GgmlType,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        let n_bytes = Self::tensor_bytes(&name, ne, ggml_type)?;
        self.tensors.push(PendingTensor {
            name,
            ne: ne.to_vec(),
            ggml_type,
            n_bytes,
            data: None,
        });
        Ok(self)
    }

    /// Bytes of a tensor of shape `ne` and type `ggml_type`, checked.
    fn tensor_bytes(name: &str, ne: &[u64], ggml_type: GgmlType) -> Result<u64, GgufError> {
        if ne.len() > super::GGML_MAX_DIMS {
            return Err(GgufError::Write(format!(
                "tensor '{name}' has {} dimensions",
                ne.len()
            )));
        }
        let n0 = ne.first().copied().unwrap_or(1);
        let rows = ne
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d));
        ggml_type
            .row_size(n0)
            .zip(rows)
            .and_then(|(r, rows)| r.checked_mul(rows))
            .ok_or_else(|| {
                GgufError::Write(format!(
                    "tensor '{name}': ne {ne:?} does not fit {ggml_type}"
                ))
            })
    }

    /// Bytes of the file up to the tensor data: header, metadata, tensor infos and the
    /// padding to the alignment (what ggml's `gguf_get_meta_data` writes).
    ///
    /// Errors: what llama.cpp's reader would refuse and [`super::GgufFile`] refuses too: an
    /// alignment that is not a power of two, an empty or repeated metadata key, an array of
    /// arrays, a repeated tensor name or one of [`super::GGML_MAX_NAME`] bytes or more.
    /// (Tensor data are placed back to back in order, as the reader requires.)
    pub fn header_bytes(&self) -> Result<Vec<u8>, GgufError> {
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
        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = self.align(offset + t.n_bytes);
        }
        out.resize(self.align(out.len() as u64) as usize, 0);
        Ok(out)
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> Result<u64, GgufError> {
        let header = self.header_bytes()?.len() as u64;
        Ok(self
            .tensors
            .iter()
            .fold(header, |acc, t| acc + self.align(t.n_bytes)))
    }

    fn align(&self, x: u64) -> u64 {
        x.next_multiple_of(self.alignment)
    }

    /// The complete file as bytes.
    ///
    /// Errors: as [`header_bytes`](Self::header_bytes); a tensor added with
    /// [`add_tensor_info`](Self::add_tensor_info) (no data).
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = self.header_bytes()?;
        for t in &self.tensors {
            let data = t
                .data
                .as_deref()
                .ok_or_else(|| GgufError::Write(format!("tensor '{}' has no data", t.name)))?;
            out.extend_from_slice(data);
            out.resize(self.align(out.len() as u64) as usize, 0);
        }
        Ok(out)
    }

    /// The rules of [`GgufWriter::header_bytes`] beyond the alignment.
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

    /// Writes the file atomically: to a new file beside it ([`create_beside`]) first, then
    /// renamed over `path`.
    pub fn write_to_file(&self, path: &Path) -> Result<(), GgufError> {
        self.write_streaming(path, |i| {
            let t = &self.tensors[i];
            t.data
                .clone()
                .ok_or_else(|| GgufError::Write(format!("tensor '{}' has no data", t.name)))
        })
    }

    /// Writes the file atomically, asking `data(i)` for the bytes of tensor `i` (in the order
    /// added) as it goes, so only one tensor's data is in memory at a time.
    ///
    /// The file is written to a new file beside `path` ([`create_beside`]), flushed to disk
    /// and renamed over `path`; on any error (including one `data` returns, e.g. for an
    /// interruption, or a full disk) that file is removed and `path` is left as it was.
    ///
    /// Errors: I/O errors (naming `path`), the error of `data`, or data of the wrong size.
    pub fn write_streaming(
        &self,
        path: &Path,
        mut data: impl FnMut(usize) -> Result<Vec<u8>, GgufError>,
    ) -> Result<(), GgufError> {
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let header = self.header_bytes()?;
        let (f, tmp, dest) = create_beside(path).map_err(io)?;
        let result = (|| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            w.write_all(&header).map_err(io)?;
            let zeros = [0u8; 64];
            for (i, t) in self.tensors.iter().enumerate() {
                let bytes = data(i)?;
                if bytes.len() as u64 != t.n_bytes {
                    return Err(GgufError::Write(format!(
                        "tensor '{}': {} bytes given, {} expected",
                        t.name,
                        bytes.len(),
                        t.n_bytes
                    )));
                }
                w.write_all(&bytes).map_err(io)?;
                let mut pad = (self.align(t.n_bytes) - t.n_bytes) as usize;
                while pad > 0 {
                    let k = pad.min(zeros.len());
                    w.write_all(&zeros[..k]).map_err(io)?;
                    pad -= k;
                }
            }
            let f = w.into_inner().map_err(|e| io(e.into_error()))?;
            f.sync_all().map_err(io)?;
            std::fs::rename(&tmp, &dest).map_err(io)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// Where an atomic write of `path` must land: `path` itself when it is missing or a regular
/// file; through a symbolic link, the file the link names (written as llama.cpp's tools
/// write through it: the link stays); anything else (a directory, a device, a FIFO) is
/// refused, since renaming a file over it would replace it.
///
/// Errors: `InvalidInput` naming a path that is not a regular file; a link chain of more
/// than 40 links; the I/O error of reading a link.
pub fn output_target(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let mut target = path.to_path_buf();
    for _ in 0..40 {
        let meta = match std::fs::symlink_metadata(&target) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(target),
            other => other?,
        };
        if meta.file_type().is_symlink() {
            let link = std::fs::read_link(&target)?;
            target = match target.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if meta.is_file() {
            return Ok(target);
        }
        let what = if target == path {
            "not a regular file".to_string()
        } else {
            format!("leads to {}, not a regular file", target.display())
        };
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, what));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "too many levels of symbolic links",
    ))
}

/// A new, empty file for an atomic write of `path` (written, then renamed over the
/// destination, the second path returned: [`output_target`] of `path`):
/// `.NAME.PID.N.tmp` in the destination's directory, created with `O_CREAT | O_EXCL`, so it
/// never follows a symlink, never reuses an existing file (the input of the write, say) and
/// never collides with another writer; `N` counts up until a name is free. Returns the
/// file, its path and the destination.
///
/// Errors: [`output_target`]'s, and the I/O error of creating the file (a missing or
/// read-only directory, ...).
pub fn create_beside(
    path: &Path,
) -> std::io::Result<(std::fs::File, std::path::PathBuf, std::path::PathBuf)> {
    let dest = output_target(path)?;
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path has no file name",
        )
    })?;
    for n in 0u32.. {
        let tmp = dir.join(format!(
            ".{}.{}.{n}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp, dest)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
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
