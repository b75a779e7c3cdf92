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
/// Longest string, in bytes, and most elements of an array llama.cpp's reader accepts
/// (`GGUF_MAX_STRING_LENGTH`, `GGUF_MAX_ARRAY_ELEMENTS`: 1 GiB, 1 Gi).
pub const GGUF_MAX_LENGTH: u64 = 1 << 30;
/// Tensor names must be shorter than this many bytes (ggml's `GGML_MAX_NAME`, which keeps
/// the terminating NUL).
pub const GGML_MAX_NAME: usize = 64;

/// GGML type ids llama.cpp 0c1e570 reads that modelc has no description of (NVFP4, Q1_0,
/// Q2_0), for the error that says modelc is stricter there.
const TYPES_ONLY_LLAMA_CPP_READS: [(u32, &str); 3] = [(40, "NVFP4"), (41, "Q1_0"), (42, "Q2_0")];

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
        if len as u64 > GGUF_MAX_LENGTH {
            return Err(invalid(
                at,
                format!("{} is {len} bytes long, more than the {GGUF_MAX_LENGTH} llama.cpp's reader accepts", what()),
            ));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(invalid(
                at + 8 + e.valid_up_to(),
                format!(
                    "{} is not valid UTF-8 (llama.cpp's reader takes any bytes here; modelc is stricter and requires UTF-8)",
                    what()
                ),
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
        if key.is_empty() {
            return Err(invalid(key_at, format!("metadata key #{i} is empty")));
        }
        let ty_at = c.pos;
        let ty = c.u32(&|| format!("type of metadata key '{key}'"))?;
        let ty = ValueType::from_id(ty).ok_or_else(|| {
            invalid(
                ty_at,
                format!("metadata key '{key}' has unknown value type {ty}"),
            )
        })?;
        let value = read_value(&mut c, ty, &key)?;
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
        if name.len() >= GGML_MAX_NAME {
            return Err(invalid(
                info_at,
                format!(
                    "the name of tensor #{i} is {} bytes long; tensor names must be shorter than {GGML_MAX_NAME} bytes (GGML_MAX_NAME)",
                    name.len()
                ),
            ));
        }
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
            let msg = match TYPES_ONLY_LLAMA_CPP_READS.iter().find(|(id, _)| *id == ty_id) {
                Some((_, type_name)) => format!(
                    "tensor '{name}' has GGML type {type_name} ({ty_id}), which llama.cpp reads but modelc does not support"
                ),
                None => format!("tensor '{name}' has unknown GGML type id {ty_id}"),
            };
            invalid(ty_at, msg)
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
    check_tensor_extents(&tensors, alignment, data_offset, data_len)?;

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// The tensors' data lie back to back in the order of the tensor infos, each at the offset
/// where the previous one's bytes, padded to the alignment, end (llama.cpp's
/// `gguf_init_from_file_impl`: "tensor '…' has offset …, expected …"; no gaps, no other
/// order), and inside the data section.
fn check_tensor_extents(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    let mut expected = 0u64;
    for t in tensors {
        // Errors name the byte in the file where the tensor's data starts.
        let at = usize::try_from(data_offset.saturating_add(t.offset)).unwrap_or(usize::MAX);
        if t.offset != expected {
            return Err(invalid(
                at,
                format!(
                    "tensor '{}' has data offset {}, expected {expected}: tensor data must follow one another in the order of the tensor infos, each padded to the alignment {alignment} (as llama.cpp requires)",
                    t.name, t.offset
                ),
            ));
        }
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|e| e > data_len) {
            return Err(invalid(
                at,
                format!(
                    "tensor '{}' needs {} bytes of data from here, but the file ends at byte {} (truncated?)",
                    t.name,
                    t.n_bytes,
                    data_offset.saturating_add(data_len)
                ),
            ));
        }
        expected = t
            .n_bytes
            .checked_next_multiple_of(alignment)
            .and_then(|padded| expected.checked_add(padded))
            .ok_or_else(|| invalid(at, format!("tensor '{}' size overflows", t.name)))?;
    }
    Ok(())
}

fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<Value, GgufError> {
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
            // Any byte, as llama.cpp reads it: not 0 is true.
            Value::Bool(c.array::<1>(&what)?[0] != 0)
        }
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str) -> Result<Array, GgufError> {
    let at = c.pos;
    let what = || format!("array of metadata key '{key}'");
    let ty_id = c.u32(&what)?;
    let ty = ValueType::from_id(ty_id).ok_or_else(|| {
        invalid(
            at,
            format!("metadata key '{key}': array of unknown value type {ty_id}"),
        )
    })?;
    if ty == ValueType::Array {
        return Err(invalid(
            at,
            format!("metadata key '{key}' is an array of arrays, which llama.cpp's reader refuses"),
        ));
    }
    // Strings and arrays take at least 8 (length) and 12 (type + count) bytes per element.
    let min = match ty {
        ValueType::String => 8,
        t => t.fixed_size().unwrap_or(1),
    };
    let n_at = c.pos;
    let n = c.count(min, &|| format!("element count of metadata key '{key}'"))?;
    if n as u64 > GGUF_MAX_LENGTH {
        return Err(invalid(
            n_at,
            format!("metadata key '{key}' has {n} elements, more than the {GGUF_MAX_LENGTH} llama.cpp's reader accepts"),
        ));
    }
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
        ValueType::Bool => Array::Bool(c.take(n, &what)?.iter().map(|&b| b != 0).collect()),
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of metadata key '{key}'"))?);
            }
            Array::String(v)
        }
        // Refused above.
        ValueType::Array => Array::Array(Vec::new()),
    })
}
