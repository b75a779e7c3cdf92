//! Parsing of one GGUF file's header (GGUF spec, "File Structure"): magic, version, counts,
//! metadata key/value pairs, tensor infos, and the placement of the data section.
//!
//! Every length and count is checked against the bytes that remain *before* anything is
//! allocated, with overflow-checked arithmetic, so no input can make the reader allocate much
//! more than a small multiple of the file's own size, panic or loop for long.

use super::error::GgufError;
use super::value::{Array, Value, ValueType};
use super::{Metadata, TensorInfo};
use crate::ggml::GgmlType;
use std::collections::HashSet;

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Default alignment of tensor data when `general.alignment` is absent (GGUF spec).
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const GGML_MAX_DIMS: usize = 4;
/// Deepest nesting of arrays of arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// The parsed header of one GGUF file.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Byte offset of the data section in the file.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn invalid(offset: usize, msg: impl Into<String>) -> GgufError {
    GgufError::Invalid {
        path: None,
        offset: offset as u64,
        msg: msg.into(),
    }
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(invalid(
                self.pos,
                format!(
                    "{} needs {n} bytes but the file has {} left (truncated?)",
                    what(),
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what remains, given each element takes at least `min_size` bytes.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_size as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(invalid(
                at,
                format!(
                    "{}: count {n} cannot fit in the {} bytes left in the file",
                    what(),
                    self.remaining()
                ),
            )),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(invalid(
                at + 8 + e.valid_up_to(),
                format!("{} is not valid UTF-8", what()),
            )),
        }
    }
}

/// Parses a whole GGUF header from `buf` (the complete file).
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.array::<4>(&|| "the magic".into())?;
    if &magic != GGUF_MAGIC {
        return Err(invalid(
            0,
            format!("not a GGUF file: magic is {magic:02x?}, expected \"GGUF\""),
        ));
    }
    let version = c.u32(&|| "the version".into())?;
    if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
        return Err(invalid(
            4,
            format!(
                "this is a big-endian GGUF file (version {} byte-swapped); only little-endian files are supported",
                version.swap_bytes()
            ),
        ));
    }
    if version == 1 {
        return Err(invalid(
            4,
            "GGUF version 1 is obsolete and not supported (versions 2 and 3 are)",
        ));
    }
    if version != 2 && version != 3 {
        return Err(invalid(
            4,
            format!("unsupported GGUF version {version} (supported: 2, 3)"),
        ));
    }
    // Smallest possible tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
    let n_tensors = c.count(24, &|| "tensor count".into())?;
    // Smallest possible key/value: key length (8) + type (4) + one byte of value.
    let n_kv = c.count(13, &|| "metadata key/value count".into())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let ty_at = c.pos;
        let ty = c.u32(&|| format!("type of metadata key '{key}'"))?;
        let ty = ValueType::from_id(ty).ok_or_else(|| {
            invalid(
                ty_at,
                format!("metadata key '{key}' has unknown value type {ty}"),
            )
        })?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if metadata.get(&key).is_some() {
            return Err(invalid(key_at, format!("duplicate metadata key '{key}'")));
        }
        metadata.push(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => GGUF_DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(invalid(
                0,
                format!("general.alignment must be a non-zero power of two u32, found {v:?}"),
            ))
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info_at = c.pos;
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let nd_at = c.pos;
        let n_dims = c.u32(&|| format!("n_dims of tensor '{name}'"))? as usize;
        if n_dims > GGML_MAX_DIMS {
            return Err(invalid(
                nd_at,
                format!("tensor '{name}' has {n_dims} dimensions (at most {GGML_MAX_DIMS})"),
            ));
        }
        let mut ne = [1u64; GGML_MAX_DIMS];
        for (d, slot) in ne.iter_mut().enumerate().take(n_dims) {
            let at = c.pos;
            let v = c.u64(&|| format!("ne[{d}] of tensor '{name}'"))?;
            if v > i64::MAX as u64 {
                return Err(invalid(
                    at,
                    format!("tensor '{name}' ne[{d}] = {v} is out of range"),
                ));
            }
            *slot = v;
        }
        let ty_at = c.pos;
        let ty_id = c.u32(&|| format!("type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(ty_id).ok_or_else(|| {
            invalid(
                ty_at,
                format!("tensor '{name}' has unknown GGML type id {ty_id}"),
            )
        })?;
        let off_at = c.pos;
        let offset = c.u64(&|| format!("data offset of tensor '{name}'"))?;

        let n_elements = ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                invalid(
                    nd_at,
                    format!("tensor '{name}' element count {ne:?} overflows"),
                )
            })?;
        if ne[0] % ggml_type.block_size() as u64 != 0 {
            return Err(invalid(
                nd_at,
                format!(
                    "tensor '{name}' ne[0] = {} is not a multiple of the {} block size {}",
                    ne[0],
                    ggml_type,
                    ggml_type.block_size()
                ),
            ));
        }
        let n_bytes = (n_elements / ggml_type.block_size() as u64)
            .checked_mul(ggml_type.type_size() as u64)
            .ok_or_else(|| invalid(nd_at, format!("tensor '{name}' byte size overflows")))?;
        if offset % alignment != 0 {
            return Err(invalid(
                off_at,
                format!("tensor '{name}' data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(info_at, format!("duplicate tensor name '{name}'")));
        }
        tensors.push(TensorInfo {
            name,
            n_dims: n_dims as u32,
            ne,
            ggml_type,
            offset,
            n_bytes,
            shard: 0,
        });
    }

    let data_offset = (c.pos as u64)
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| invalid(c.pos, "data section offset overflows"))?;
    let file_len = buf.len() as u64;
    let data_len = file_len.saturating_sub(data_offset);
    if data_offset > file_len && !tensors.is_empty() {
        return Err(invalid(
            c.pos,
            format!("the data section should start at byte {data_offset} but the file ends at {file_len}"),
        ));
    }
    check_tensor_extents(&tensors, data_offset, data_len)?;

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Every tensor lies inside the data section and no two overlap (zero-size tensors are exempt).
fn check_tensor_extents(
    tensors: &[TensorInfo],
    data_offset: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|e| e > data_len) {
            return Err(invalid(
                0,
                format!(
                    "tensor '{}' data [{}, +{}) lies beyond the end of the data section ({} bytes from byte {data_offset})",
                    t.name, t.offset, t.n_bytes, data_len
                ),
            ));
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].n_bytes > w[1].offset {
            return Err(invalid(
                (data_offset + w[1].offset) as usize,
                format!(
                    "tensors '{}' and '{}' overlap in the data section",
                    w[0].name, w[1].name
                ),
            ));
        }
    }
    Ok(())
}

fn read_value(
    c: &mut Cursor<'_>,
    ty: ValueType,
    key: &str,
    depth: usize,
) -> Result<Value, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(c.array::<1>(&what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => {
            let at = c.pos;
            match c.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(invalid(
                        at,
                        format!("metadata key '{key}': bool byte is {b}, expected 0 or 1"),
                    ))
                }
            }
        }
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, GgufError> {
    let at = c.pos;
    if depth > MAX_ARRAY_DEPTH {
        return Err(invalid(
            at,
            format!("metadata key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
        ));
    }
    let what = || format!("array of metadata key '{key}'");
    let ty_id = c.u32(&what)?;
    let ty = ValueType::from_id(ty_id).ok_or_else(|| {
        invalid(
            at,
            format!("metadata key '{key}': array of unknown value type {ty_id}"),
        )
    })?;
    // Strings and arrays take at least 8 (length) and 12 (type + count) bytes per element.
    let min = match ty {
        ValueType::String => 8,
        ValueType::Array => 12,
        t => t.fixed_size().unwrap_or(1),
    };
    let n = c.count(min, &|| format!("element count of metadata key '{key}'"))?;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            const W: usize = std::mem::size_of::<$t>();
            let bytes = c.take(n * W, &what)?;
            Array::$variant(
                bytes
                    .chunks_exact(W)
                    .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or([0; W])))
                    .collect(),
            )
        }};
    }
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(n, &what)?.to_vec()),
        ValueType::I8 => Array::I8(c.take(n, &what)?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let bytes = c.take(n, &what)?;
            let mut v = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                match b {
                    0 => v.push(false),
                    1 => v.push(true),
                    _ => {
                        return Err(invalid(
                            at + 12 + i,
                            format!(
                                "metadata key '{key}': bool element {i} is {b}, expected 0 or 1"
                            ),
                        ))
                    }
                }
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of metadata key '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}
