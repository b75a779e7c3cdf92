//! The KV memory of a session and its bookkeeping: which stream each sequence owns, which
//! tokens (positions `0..n_past`) its cells hold, and which cells were written, so that a
//! sequence can continue, be truncated to any earlier position, or be cleared.
//!
//! Each sequence (`llama_seq_id` in `llama_batch`) owns one stream of KV memory laid out as
//! [`ir::plan::KvLayout`] says, cell `i` holding position `i` (position `p` in cell
//! `p % cells` of a sliding-window ring, whose older positions get overwritten: see
//! [`ir::plan::KvLayout::can_truncate`]); streams lie back to back in
//! one allocation. This is llama.cpp's non-unified KV cache (`--kv-unified` off: one stream
//! per sequence, `llama_kv_cache` with `n_stream = n_seq_max`): a sequence's numbers do not
//! depend on what the other sequences hold.
//!
//! The memory is allocated zeroed and lazily (the OS maps pages as cells are first
//! written), and fallibly: a context that does not fit is one error line, not an abort.

use crate::tokenizer::TokenId;
use ir::plan::KvLayout;

/// A sequence id, as `llama_seq_id`: which conversation a token belongs to.
pub type SeqId = u32;

/// Alignment of the KV memory: 16 bytes, the most the system allocator's `calloc` path
/// gives (Rust's `alloc_zeroed` with a larger alignment writes every byte, which would make
/// the whole cache resident at once). Caches start at multiples of [`ir::plan::KV_ALIGN`] in it.
const MEM_ALIGN: usize = 16;

/// Zeroed bytes from the allocator (`calloc`: pages are mapped when first written),
/// aligned to [`MEM_ALIGN`], allocated fallibly.
struct ZeroedBytes {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: `ZeroedBytes` owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for ZeroedBytes {}
// SAFETY: shared access only reads through `&self`.
unsafe impl Sync for ZeroedBytes {}

impl ZeroedBytes {
    fn new(len: usize) -> Result<ZeroedBytes, String> {
        if len == 0 {
            return Ok(ZeroedBytes {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        let layout = std::alloc::Layout::from_size_align(len, MEM_ALIGN)
            .map_err(|_| format!("{len} bytes of KV memory is not a valid size"))?;
        // SAFETY: `layout` has a non-zero size.
        let p = crate::memory::fallible(|| unsafe { std::alloc::alloc_zeroed(layout) });
        let ptr = std::ptr::NonNull::new(p).ok_or_else(|| {
            format!(
                "{} for the KV cache; use a smaller -c",
                crate::memory::alloc_failure(len as u64)
            )
        })?;
        Ok(ZeroedBytes { ptr, len })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed) bytes, or is dangling with `len` 0;
        // `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ZeroedBytes {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this size and alignment.
            unsafe {
                std::alloc::dealloc(
                    self.ptr.as_ptr(),
                    std::alloc::Layout::from_size_align_unchecked(self.len, MEM_ALIGN),
                )
            }
        }
    }
}

/// One stream's bookkeeping.
#[derive(Clone, Debug, Default)]
struct Stream {
    /// The sequence that owns it.
    seq: Option<SeqId>,
    /// The tokens its cells hold: cell `i` holds `tokens[i]` at position `i`.
    tokens: Vec<TokenId>,
    /// One past the highest cell written since it was last zeroed.
    written: usize,
}

/// The KV memory of a session (module doc).
pub struct KvCache {
    layout: KvLayout,
    mem: ZeroedBytes,
    streams: Vec<Stream>,
    /// Cells all streams may hold together ([`KvCache::set_pool`]), if capped.
    pool: Option<usize>,
}

/// A call needs more cells than the shared pool has free ([`KvCache::set_pool`]):
/// llama.cpp's `llama_decode` returning 1 on a unified cache that is full, which
/// llama-server reports as "Context size has been exceeded."
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolFull {
    /// Cells the call needed.
    pub needed: usize,
    /// Cells the pool had free.
    pub free: usize,
}

impl std::fmt::Display for PoolFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "context size has been exceeded: the shared KV cache has {} free cells, the call needs {}",
            self.free, self.needed
        )
    }
}

impl std::error::Error for PoolFull {}

impl KvCache {
    /// KV memory for `n_seq_max` sequences of `layout`.
    ///
    /// # Errors
    /// `n_seq_max` of 0, a size that overflows, or an allocation that fails (naming the
    /// bytes asked for and the memory available).
    pub fn new(layout: KvLayout, n_seq_max: usize) -> anyhow::Result<KvCache> {
        anyhow::ensure!(n_seq_max >= 1, "a session needs at least one sequence");
        let bytes = usize::try_from(layout.stream_bytes)
            .ok()
            .and_then(|b| b.checked_mul(n_seq_max))
            .ok_or_else(|| anyhow::anyhow!("the KV cache does not fit in the address space"))?;
        let mem = ZeroedBytes::new(bytes).map_err(anyhow::Error::msg)?;
        Ok(KvCache {
            layout,
            mem,
            streams: vec![Stream::default(); n_seq_max],
            pool: None,
        })
    }

    /// Caps the cells all streams hold together at `cells` (`None`: each stream is bounded
    /// by its own context only). With the cap at one stream's context, the streams share
    /// one context's worth of cells as llama.cpp's unified cache (`--kv-unified`) shares
    /// its `n_ctx` cells among sequences, while each sequence keeps its own memory (so its
    /// numbers do not depend on the others).
    pub fn set_pool(&mut self, cells: Option<usize>) {
        self.pool = cells;
    }

    /// Free cells of the shared pool ([`KvCache::set_pool`]); `None` when uncapped.
    pub fn room(&self) -> Option<usize> {
        let held: usize = self.streams.iter().map(|s| s.tokens.len()).sum();
        self.pool.map(|p| p.saturating_sub(held))
    }

    /// Checks that `needed` more cells fit in the shared pool.
    ///
    /// # Errors
    /// [`PoolFull`] when they do not.
    pub fn check_room(&self, needed: usize) -> Result<(), PoolFull> {
        match self.room() {
            Some(free) if needed > free => Err(PoolFull { needed, free }),
            _ => Ok(()),
        }
    }

    /// The layout of one stream.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Sequences the cache holds at most.
    pub fn n_seq_max(&self) -> usize {
        self.streams.len()
    }

    /// Bytes of KV memory (all streams).
    pub fn bytes(&self) -> u64 {
        self.mem.len as u64
    }

    /// The stream `seq` owns, if any.
    pub fn stream_of(&self, seq: SeqId) -> Option<usize> {
        self.streams.iter().position(|s| s.seq == Some(seq))
    }

    /// The stream `seq` owns, giving it a free one if it has none.
    ///
    /// # Errors
    /// Every stream is owned by another sequence.
    pub fn stream_for(&mut self, seq: SeqId) -> anyhow::Result<usize> {
        if let Some(i) = self.stream_of(seq) {
            return Ok(i);
        }
        let free = self
            .streams
            .iter()
            .position(|s| s.seq.is_none())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no free sequence slot for sequence {seq}: the session holds {} (n_seq_max)",
                    self.streams.len()
                )
            })?;
        self.streams[free].seq = Some(seq);
        Ok(free)
    }

    /// The tokens sequence `seq` holds (position `i` holds token `i`); empty for a sequence
    /// without a stream.
    pub fn tokens(&self, seq: SeqId) -> &[TokenId] {
        self.stream_of(seq)
            .map_or(&[][..], |i| self.streams[i].tokens.as_slice())
    }

    /// Positions held by stream `i` (`n_past`).
    pub fn n_past(&self, i: usize) -> usize {
        self.streams[i].tokens.len()
    }

    /// One past the highest position stream `i` wrote since it was last zeroed (padding
    /// rows included).
    pub fn written(&self, i: usize) -> usize {
        self.streams[i].written
    }

    /// The sequence that owns stream `i`, if any.
    pub fn seq_of(&self, i: usize) -> Option<SeqId> {
        self.streams[i].seq
    }

    /// Cells written in all streams (for the memory report).
    pub fn cells_written(&self) -> usize {
        self.streams.iter().map(|s| s.written).sum()
    }

    /// Stream `i`'s memory, lent for one engine call, with its written mark.
    pub fn lend(&mut self, i: usize) -> crate::engine::KvStream<'_> {
        let b = self.layout.stream_bytes as usize;
        let written = self.streams[i].written;
        crate::engine::KvStream {
            index: i,
            mem: &mut self.mem.as_mut_slice()[i * b..(i + 1) * b],
            written,
        }
    }

    /// The memory of streams `idx`, lent together for one multi-sequence call, in the order
    /// given.
    ///
    /// # Errors
    /// A stream index given twice or out of range.
    pub fn lend_many(&mut self, idx: &[usize]) -> anyhow::Result<Vec<crate::engine::KvStream<'_>>> {
        let b = (self.layout.stream_bytes as usize).max(1);
        let mut parts: Vec<Option<&mut [u8]>> =
            self.mem.as_mut_slice().chunks_mut(b).map(Some).collect();
        parts.resize_with(self.streams.len(), || Some(Default::default()));
        idx.iter()
            .map(|&i| {
                let mem = parts
                    .get_mut(i)
                    .and_then(Option::take)
                    .ok_or_else(|| anyhow::anyhow!("KV stream {i} lent twice or out of range"))?;
                Ok(crate::engine::KvStream {
                    index: i,
                    mem,
                    written: self.streams[i].written,
                })
            })
            .collect()
    }

    /// Records what a call on stream `i` did: `tokens` appended at `n_past`, cells up to
    /// `written` written.
    pub fn commit(&mut self, i: usize, tokens: &[TokenId], written: usize) {
        let s = &mut self.streams[i];
        s.tokens.extend_from_slice(tokens);
        s.written = s.written.max(written).max(s.tokens.len());
    }

    /// Truncates stream `i` to its first `n` positions, zeroing every cell written from
    /// `n` on (so that what follows computes as on a fresh cache).
    pub fn truncate(&mut self, i: usize, n: usize) {
        let b = self.layout.stream_bytes as usize;
        let written = self.streams[i].written;
        if written > n {
            let ranges: Vec<_> = self.layout.cell_ranges(n as u64, written as u64).collect();
            let mem = &mut self.mem.as_mut_slice()[i * b..(i + 1) * b];
            for r in ranges {
                mem[r.start as usize..r.end as usize].fill(0);
            }
        }
        let s = &mut self.streams[i];
        s.tokens.truncate(n);
        s.written = s.written.min(n);
    }

    /// Context shift of stream `i`: cells `n_keep + n_discard..n_past` move down to
    /// `n_keep` (every cache, K and V), the dropped tokens leave the bookkeeping, and the
    /// cells vacated at the end are zeroed. The moved keys still carry their old positions'
    /// rotation: the engine re-ropes them ([`crate::engine::Engine::shift_k`]).
    pub fn shift(&mut self, i: usize, n_keep: usize, n_discard: usize) {
        let b = self.layout.stream_bytes as usize;
        let n_past = self.streams[i].tokens.len();
        let src = (n_keep + n_discard).min(n_past);
        let n = n_past - src;
        let mem = &mut self.mem.as_mut_slice()[i * b..(i + 1) * b];
        for c in &self.layout.caches {
            let (off, row) = (c.offset as usize, c.row_bytes as usize);
            mem.copy_within(off + src * row..off + (src + n) * row, off + n_keep * row);
        }
        let s = &mut self.streams[i];
        s.tokens.drain(n_keep..src);
        // Zero what lies past the new end, as a truncation does.
        let keep = s.tokens.len();
        self.truncate(i, keep);
    }

    /// Empties stream `i` and frees it for another sequence.
    pub fn release(&mut self, i: usize) {
        self.truncate(i, 0);
        self.streams[i].seq = None;
    }
}
