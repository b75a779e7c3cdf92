//! Where a plan's KV caches lie in one sequence's KV memory: the one layout every backend
//! lowers against and the runtime allocates, clears and truncates (llama.cpp keeps the same
//! bookkeeping in `llama_kv_cache`; each of our sequences owns a whole stream, as llama.cpp's
//! non-unified cache gives each sequence its own, `--kv-unified` off).
//!
//! A *stream* is the KV memory of one sequence: every cache of the plan ([`Plan::kv`], one
//! per layer and K/V) for `n_cells` cells, cache after cache, each starting on a
//! [`KV_ALIGN`]-byte boundary. Cell `i` of a cache is its row `i` and holds position `i`
//! (`ggml_set_rows` at the token's position). A session holds one or more streams back to
//! back; a backend is handed the stream of the sequence a ubatch belongs to.

use super::types::{KvBuf, Plan};

/// Alignment of each cache within a stream, and of a stream, in bytes.
pub const KV_ALIGN: u64 = 64;

/// One cache's place in a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSlot {
    /// Byte offset of the cache's cell 0 from the start of the stream.
    pub offset: u64,
    /// Bytes of one cell (one row `{n_embd_gqa}` of the cache's type).
    pub row_bytes: u64,
}

/// The layout of one stream of KV memory for a plan (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Cells per cache (the context of one sequence, `n_ctx`).
    pub n_cells: u64,
    /// One slot per cache of the plan, in [`Plan::kv`] order.
    pub caches: Vec<KvSlot>,
    /// Bytes of a stream (a multiple of [`KV_ALIGN`]; at least [`KV_ALIGN`]).
    pub stream_bytes: u64,
}

impl KvLayout {
    /// The byte ranges (within a stream) of cells `from..to` of every cache, for clearing
    /// them. `to` is capped at `n_cells`.
    pub fn cell_ranges(
        &self,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = std::ops::Range<u64>> + '_ {
        let to = to.min(self.n_cells);
        self.caches
            .iter()
            .filter(move |_| from < to)
            .map(move |c| c.offset + from * c.row_bytes..c.offset + to * c.row_bytes)
    }
}

impl Plan {
    /// The layout of one stream with `n_cells` cells per cache (module doc).
    ///
    /// # Errors
    /// `n_cells` of 0 or above the plan's `n_ctx` (the plan's kernels were checked for that
    /// bound), a cache whose row size is not a whole number of blocks, or a size that
    /// overflows.
    pub fn kv_layout(&self, n_cells: u64) -> Result<KvLayout, String> {
        if n_cells == 0 || n_cells > u64::from(self.n_ctx) {
            return Err(format!(
                "a KV cache of {n_cells} cells: the plan takes 1 to {} cells",
                self.n_ctx
            ));
        }
        let mut caches = Vec::with_capacity(self.kv.len());
        let mut end = 0u64;
        for c in &self.kv {
            let row_bytes = row_bytes(c)?;
            let bytes = row_bytes
                .checked_mul(n_cells)
                .ok_or_else(|| format!("KV cache {} does not fit in memory", c.name))?;
            caches.push(KvSlot {
                offset: end,
                row_bytes,
            });
            end = end
                .checked_add(bytes)
                .and_then(|e| e.checked_next_multiple_of(KV_ALIGN))
                .ok_or_else(|| "the KV caches do not fit in memory".to_string())?;
        }
        Ok(KvLayout {
            n_cells,
            caches,
            stream_bytes: end.max(KV_ALIGN),
        })
    }
}

fn row_bytes(c: &KvBuf) -> Result<u64, String> {
    c.dtype.row_size(c.shape.ne[0]).ok_or_else(|| {
        format!(
            "KV cache {}: a row of {} {} values is not whole blocks",
            c.name, c.shape.ne[0], c.dtype
        )
    })
}
