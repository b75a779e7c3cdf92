//! The GGUF container: a strict reader (versions 2 and 3, split models, zero-copy tensor data
//! from a memory map) and a writer.
//!
//! Source of the format: the GGUF specification in the ggml repository (`docs/gguf.md`), and
//! llama.cpp's `gguf.cpp` / `llama-model-loader.cpp` for split models (`split.*` keys).
//! Files from model hubs are untrusted: see [`reader`] for what is checked.

mod error;
mod metadata;
pub mod reader;
mod split;
mod value;
pub mod writer;

pub use error::GgufError;
pub use metadata::Metadata;
pub use reader::{
    GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_MAX_LENGTH,
};
pub use value::{Array, Value, ValueType};
pub use writer::{create_beside, output_target, GgufWriter};

use crate::ggml::GgmlType;
use std::path::{Path, PathBuf};

/// One tensor's entry in the tensor table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorInfo {
    /// Name as stored (`blk.0.attn_q.weight`).
    pub name: String,
    /// Number of dimensions stored in the file (0..=4).
    pub n_dims: u32,
    /// Shape as ggml `ne`, innermost first; unused trailing dimensions are 1.
    pub ne: [u64; GGML_MAX_DIMS],
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data, relative to the start of its shard's data section, in bytes.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
    /// Index of the shard that holds the data (0 for single-file models).
    pub shard: usize,
}

impl TensorInfo {
    /// Number of elements (product of `ne`).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The shape without the trailing unit dimensions beyond `n_dims`.
    pub fn shape(&self) -> &[u64] {
        &self.ne[..self.n_dims as usize]
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    /// The file read into anonymous memory ([`GgufFile::read_into_memory`]): never released
    /// (its pages hold the only copy).
    Anon(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) | Backing::Anon(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

struct Shard {
    path: Option<PathBuf>,
    backing: Backing,
    data_offset: u64,
}

/// A GGUF model: the metadata and tensor table of its first (or only) file, the tensors of all
/// its shards, and the tensor data, memory-mapped (or read into memory:
/// [`GgufFile::read_into_memory`]) and exposed without copying.
pub struct GgufFile {
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    shards: Vec<Shard>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("n_shards", &self.shards.len())
            .finish()
    }
}

fn map_file(path: &Path) -> Result<memmap2::Mmap, GgufError> {
    let io = |error| GgufError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only; modelc never writes through it. A file truncated by another
    // process while mapped can still fault, as with every mmap-based loader (llama.cpp included).
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

/// The whole file at `path` read into read-only anonymous memory ([`GgufFile::read_into_memory`]), the
/// ranges read by as many threads as the machine has (the copy is bound by faulting in and
/// zeroing fresh pages, not by the page cache).
fn read_anon(path: &Path) -> Result<memmap2::Mmap, GgufError> {
    let io = |error| GgufError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = usize::try_from(file.metadata().map_err(io)?.len()).map_err(|_| {
        io(std::io::Error::other(
            "the file does not fit the address space",
        ))
    })?;
    let mut map = memmap2::MmapOptions::new()
        .len(len.max(1))
        .map_anon()
        .map_err(io)?;
    #[cfg(target_os = "linux")]
    {
        // Only a hint: without transparent huge pages the copy still works.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    read_ranges(&file, &mut map[..len]).map_err(io)?;
    map.make_read_only().map_err(io)
}

/// Fills `dst` with the file's first `dst.len()` bytes, a range per thread.
fn read_ranges(file: &std::fs::File, dst: &mut [u8]) -> std::io::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Whole 2 MiB pieces per thread, so no two threads fault in the same huge page.
    let chunk = dst.len().div_ceil(threads).next_multiple_of(2 << 20).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = dst
            .chunks_mut(chunk)
            .enumerate()
            .map(|(i, part)| s.spawn(move || read_at(file, part, (i * chunk) as u64)))
            .collect();
        parts.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a reader panicked")))
        })
    })
}

/// `dst.len()` bytes of `file` from `offset`.
fn read_at(file: &std::fs::File, dst: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, dst, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek};
        let mut f = file.try_clone()?;
        f.seek(std::io::SeekFrom::Start(offset))?;
        f.read_exact(dst)
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file. A file named `NAME-00001-of-0000N.gguf` whose
    /// `split.count` is above 1 is read together with its other shards as one model.
    ///
    /// Errors: I/O errors name the file; format errors name the byte offset and the key or
    /// tensor; split errors name the missing, extra or mismatched shard.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let first = Self::open_one(path)?;
        split::gather_shards(path, first)
    }

    /// Replaces the mapping of every shard by a copy of its file in anonymous memory
    /// (llama.cpp's `-lm none`), advised for transparent huge pages on Linux; data already in
    /// memory stays as it is. Call it before borrowing tensor data. The mapping reads nothing
    /// at open and shares its pages with the page cache; the copy costs reading the whole
    /// file, and decode of a model larger than the caches then does not depend on how the
    /// page cache holds it (measured on a 2-core VM, a file the page cache took in from disk:
    /// 1B Q4_K_M 18 → 29 tokens/s).
    ///
    /// Errors: [`GgufError::Io`] naming the file when it cannot be read, or when its length
    /// changed since it was opened (then nothing of that shard is replaced).
    pub fn read_into_memory(&mut self) -> Result<(), GgufError> {
        for s in &mut self.shards {
            let (Backing::Mmap(map), Some(path)) = (&s.backing, &s.path) else {
                continue;
            };
            let copy = read_anon(path)?;
            if copy.len() != map.len() {
                return Err(GgufError::Io {
                    path: path.clone(),
                    error: std::io::Error::other("the file changed while it was being read"),
                });
            }
            s.backing = Backing::Anon(copy);
        }
        Ok(())
    }

    /// Locks every shard's pages in RAM (`mlock`: llama.cpp's `-lm mlock` / `mmap+mlock`), so
    /// the kernel neither swaps nor evicts them. Data held as bytes ([`GgufFile::from_bytes`])
    /// is left as it is.
    ///
    /// Errors: [`GgufError::Io`] naming the file when the kernel refuses (typically the
    /// `RLIMIT_MEMLOCK` limit, `ulimit -l`).
    pub fn lock_in_memory(&self) -> Result<(), GgufError> {
        for s in &self.shards {
            let map = match &s.backing {
                Backing::Mmap(m) | Backing::Anon(m) => m,
                Backing::Owned(_) => continue,
            };
            map.lock().map_err(|error| GgufError::Io {
                path: s.path.clone().unwrap_or_default(),
                error,
            })?;
        }
        Ok(())
    }

    fn open_one(path: &Path) -> Result<GgufFile, GgufError> {
        let meta = std::fs::metadata(path).map_err(|error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        if !meta.is_file() {
            return Err(GgufError::Invalid {
                path: Some(path.to_path_buf()),
                offset: 0,
                msg: "not a regular file".into(),
            });
        }
        let backing = Backing::Mmap(map_file(path)?);
        Self::from_backing(Some(path.to_path_buf()), backing).map_err(|e| e.with_path(path))
    }

    /// Reads a GGUF file held in memory (tests, fuzzing). Split keys are not followed.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(None, Backing::Owned(bytes))
    }

    fn from_backing(path: Option<PathBuf>, backing: Backing) -> Result<GgufFile, GgufError> {
        let h = reader::parse_header(backing.bytes())?;
        Ok(GgufFile {
            version: h.version,
            alignment: h.alignment,
            metadata: h.metadata,
            tensors: h.tensors,
            shards: vec![Shard {
                path,
                backing,
                data_offset: h.data_offset,
            }],
        })
    }

    /// GGUF version of the (first) file: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata of the first file, in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// All tensors of all shards, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The data of `t`, borrowed from the memory map. `t` must come from this file's table;
    /// the bounds were checked when the file was opened.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let Some(shard) = self.shards.get(t.shard) else {
            return &[];
        };
        let start = (shard.data_offset + t.offset) as usize;
        shard
            .backing
            .bytes()
            .get(start..start + t.n_bytes as usize)
            .unwrap_or(&[])
    }

    /// Tells the kernel that this process does not need, for now, the mapped pages holding
    /// bytes `range` of shard `shard`'s file (`madvise(MADV_DONTNEED)`), so they leave the
    /// resident set: what a loader calls once it has copied (repacked) the tensors there.
    /// The range is clipped to the file and widened to whole pages; returns the length of the
    /// clipped range (0 for in-memory data from [`GgufFile::from_bytes`] or
    /// [`GgufFile::read_into_memory`], an empty range, an unknown shard, and on platforms
    /// without `madvise`).
    ///
    /// The data stays valid and unchanged: the map is private and read-only, and never
    /// written, so the kernel only drops the page-table entries; a later read of those bytes
    /// (e.g. the embedding rows `get_rows` reads in place) faults the page back in from the
    /// page cache, or the file when the cache was evicted. Borrowed slices
    /// ([`GgufFile::tensor_data`]) stay usable. llama.cpp's loader does the same with
    /// `llama_mmap::unmap_fragment` (there by unmapping the parts no tensor uses).
    ///
    /// # Errors
    /// [`GgufError::Io`] naming the file when `madvise` fails.
    pub fn release_pages(
        &self,
        shard: usize,
        range: std::ops::Range<u64>,
    ) -> Result<u64, GgufError> {
        let Some(s) = self.shards.get(shard) else {
            return Ok(0);
        };
        let Backing::Mmap(map) = &s.backing else {
            return Ok(0);
        };
        let end = range.end.min(map.len() as u64);
        if range.start >= end {
            return Ok(0);
        }
        #[cfg(unix)]
        {
            // memmap2 widens the start down to a page boundary and the kernel rounds the
            // length up to whole pages.
            let (start, len) = (range.start as usize, (end - range.start) as usize);
            // SAFETY: `MADV_DONTNEED` on a private mapping discards private (copy-on-write)
            // changes, and this map is read-only and never written, so it has none: the bytes
            // every live borrow sees are the file's, before and after (doc above).
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) }
                .map_err(|error| GgufError::Io {
                path: s.path.clone().unwrap_or_default(),
                error,
            })?;
            Ok(end - range.start)
        }
        #[cfg(not(unix))]
        {
            Ok(0)
        }
    }

    /// [`GgufFile::release_pages`] for the data of tensor `t` (from this file's table).
    ///
    /// # Errors
    /// As [`GgufFile::release_pages`].
    pub fn release_tensor_pages(&self, t: &TensorInfo) -> Result<u64, GgufError> {
        let Some(s) = self.shards.get(t.shard) else {
            return Ok(0);
        };
        let start = s.data_offset.saturating_add(t.offset);
        self.release_pages(t.shard, start..start.saturating_add(t.n_bytes))
    }

    /// [`GgufFile::release_pages`] for every byte of every shard (header included: the
    /// metadata and tensor table were copied out when the file was opened).
    ///
    /// # Errors
    /// As [`GgufFile::release_pages`].
    pub fn release_all_pages(&self) -> Result<u64, GgufError> {
        let mut n = 0;
        for (i, s) in self.shards.iter().enumerate() {
            n += self.release_pages(i, 0..s.backing.bytes().len() as u64)?;
        }
        Ok(n)
    }

    /// Total size in bytes of all shards.
    pub fn file_size(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.backing.bytes().len() as u64)
            .sum()
    }

    /// Bytes of the files held in this process's memory ([`GgufFile::read_into_memory`]); 0
    /// where they are mapped.
    pub fn bytes_in_memory(&self) -> u64 {
        self.shards
            .iter()
            .filter(|s| matches!(s.backing, Backing::Anon(_)))
            .map(|s| s.backing.bytes().len() as u64)
            .sum()
    }

    /// Number of files the model was read from.
    pub fn n_shards(&self) -> usize {
        self.shards.len()
    }

    /// Paths of the files the model was read from (empty for in-memory data).
    pub fn paths(&self) -> Vec<&Path> {
        self.shards
            .iter()
            .filter_map(|s| s.path.as_deref())
            .collect()
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata
            .get("general.architecture")
            .and_then(Value::as_str)
    }

    /// Total bytes of tensor data.
    pub fn tensor_data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}
