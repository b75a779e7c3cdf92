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
//!
//! A *ring* layout ([`Plan::kv_layout_ring`]) gives the caches of sliding-window layers
//! ([`KvBuf::window`]) only the cells llama.cpp's `llama_kv_cache_iswa` gives its SWA cache
//! ([`swa_cells`]); position `p` then lies in cell `p % cells` (llama.cpp's `find_slot`
//! reuses a cell once the window masks it, which with one sequence fed in order is exactly
//! that cell), and attention visits the cells in cell order
//! ([`crate::graph::AttnParams::visible_cells`]).

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
    /// Cells of this cache: the stream's [`KvLayout::n_cells`], or fewer for a ring (module
    /// doc); position `p` lies in cell `p % n_cells`.
    pub n_cells: u64,
    /// The sliding window of the attention reading it ([`KvBuf::window`]).
    pub window: Option<u32>,
}

impl KvSlot {
    /// Whether this cache is a ring shorter than the context `n_ctx`.
    pub fn is_ring(&self, n_ctx: u64) -> bool {
        self.n_cells < n_ctx
    }
}

/// Cells of a sliding-window cache as llama.cpp sizes it (`llama_kv_cache_iswa`, one
/// sequence or a non-unified cache): `GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)`, here at
/// most `n_ctx` (a cache of `n_ctx` cells holds every position anyway). 1024 for Gemma 3
/// (window 512) at ubatch 512 and any `-c` from 1024 on.
pub fn swa_cells(n_ctx: u64, n_swa: u32, n_ubatch: u32) -> u64 {
    let want = n_ctx.min(u64::from(n_swa) + u64::from(n_ubatch));
    want.div_ceil(256).saturating_mul(256).min(n_ctx)
}

/// The layout of one stream of KV memory for a plan (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Cells per cache (the context of one sequence, `n_ctx`); a ring cache has fewer
    /// ([`KvSlot::n_cells`]).
    pub n_cells: u64,
    /// One slot per cache of the plan, in [`Plan::kv`] order.
    pub caches: Vec<KvSlot>,
    /// Bytes of a stream (a multiple of [`KV_ALIGN`]; at least [`KV_ALIGN`]).
    pub stream_bytes: u64,
}

impl KvLayout {
    /// The byte ranges (within a stream) of the cells holding positions `from..to` of every
    /// cache, for clearing them. `to` is capped at `n_cells`; in a ring, positions map to
    /// cells `p % cells` (all of its cells once the span is that long).
    pub fn cell_ranges(
        &self,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = std::ops::Range<u64>> + '_ {
        let to = to.min(self.n_cells);
        self.caches
            .iter()
            .filter(move |_| from < to)
            .flat_map(move |c| {
                let n = c.n_cells.max(1);
                let cell = |a: u64, b: u64| c.offset + a * c.row_bytes..c.offset + b * c.row_bytes;
                if to - from >= n {
                    [cell(0, n), cell(0, 0)]
                } else {
                    let (a, b) = (from % n, (to - 1) % n + 1);
                    if a < b {
                        [cell(a, b), cell(0, 0)]
                    } else {
                        [cell(a, n), cell(0, b)]
                    }
                }
            })
            .filter(|r| r.start < r.end)
    }

    /// Whether any cache is a ring (fewer cells than the context).
    pub fn has_ring(&self) -> bool {
        self.caches.iter().any(|c| c.is_ring(self.n_cells))
    }

    /// Whether a stream whose cells were written up to position `written` (exclusive) can
    /// be cut back to its first `n` positions and continue: every ring must still hold the
    /// `window - 1` positions before `n` that the next token attends to, i.e. no position in
    /// `n..written` shares their cells. llama.cpp's SWA cache has purged those positions
    /// then (`llama_memory_seq_pos_min` moves past `n - n_swa`), and llama-server
    /// evaluates the prompt again.
    pub fn can_truncate(&self, n: u64, written: u64) -> bool {
        n == 0
            || n >= written
            || self
                .caches
                .iter()
                .filter(|c| c.is_ring(self.n_cells))
                .all(|c| {
                    let w = u64::from(c.window.unwrap_or(u32::MAX)).min(c.n_cells);
                    // Positions n - w + 1 .. n lie in cells that n..written must not reach.
                    n + c.n_cells >= written + w - 1
                })
    }
}

/// llama.cpp's default `n_ubatch` (`-ub`), the ubatch its SWA cache is sized for.
pub const LLAMA_N_UBATCH: u32 = 512;

impl Plan {
    /// The ubatch backends size this plan's KV rings for ([`Plan::kv_layout_ring`]):
    /// llama.cpp's default [`LLAMA_N_UBATCH`] (whose SWA cache modelc reproduces cell for
    /// cell) or the plan's largest step if larger (a ring must hold the window and a whole
    /// step).
    pub fn ring_ubatch(&self) -> u32 {
        self.steps
            .iter()
            .map(|s| s.n_tokens)
            .max()
            .unwrap_or(1)
            .max(LLAMA_N_UBATCH)
    }

    /// The layout of one stream with `n_cells` cells per cache (module doc).
    ///
    /// # Errors
    /// `n_cells` of 0 or above the plan's `n_ctx` (the plan's kernels were checked for that
    /// bound), a cache whose row size is not a whole number of blocks, or a size that
    /// overflows.
    pub fn kv_layout(&self, n_cells: u64) -> Result<KvLayout, String> {
        self.layout_with(n_cells, |_| n_cells)
    }

    /// The layout of one stream with `n_cells` cells per cache, except the sliding-window
    /// caches, which get [`swa_cells`]`(n_cells, window, n_ubatch)` cells (module doc). A
    /// backend using it must store position `p` at cell `p % cells` and attend in cell order,
    /// and must not run ubatches of more than `n_ubatch` tokens.
    ///
    /// # Errors
    /// As [`Plan::kv_layout`].
    pub fn kv_layout_ring(&self, n_cells: u64, n_ubatch: u32) -> Result<KvLayout, String> {
        self.layout_with(n_cells, |c| match c.window {
            Some(w) => swa_cells(n_cells, w, n_ubatch),
            None => n_cells,
        })
    }

    fn layout_with(
        &self,
        n_cells: u64,
        cells_of: impl Fn(&KvBuf) -> u64,
    ) -> Result<KvLayout, String> {
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
            let cells = cells_of(c).clamp(1, n_cells);
            let bytes = row_bytes
                .checked_mul(cells)
                .ok_or_else(|| format!("KV cache {} does not fit in memory", c.name))?;
            caches.push(KvSlot {
                offset: end,
                row_bytes,
                n_cells: cells,
                window: c.window,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::AttnParams;

    #[test]
    fn swa_cells_as_llama_cpp() {
        // Gemma 3 270M: window 512, ubatch 512.
        assert_eq!(swa_cells(32768, 512, 512), 1024);
        assert_eq!(swa_cells(2048, 512, 512), 1024);
        assert_eq!(swa_cells(1024, 512, 512), 1024);
        assert_eq!(swa_cells(768, 512, 512), 768);
        assert_eq!(swa_cells(4096, 16, 32), 256);
        assert_eq!(swa_cells(100, 16, 32), 100);
    }

    #[test]
    fn visible_cells_of_a_wrapped_ring() {
        let p = AttnParams {
            kq_scale: 1.0,
            softcap: None,
            window: Some(4),
            causal: true,
        };
        // Not wrapped: cell = position.
        let v = p.visible_cells(5, 6, 8);
        assert_eq!((v.lo, v.hi, v.ranges()), (2, 6, [2..6, 6..6]));
        // Positions 8..=11 of a ring of 8 cells holding positions up to 11: cells 0..=3.
        let v = p.visible_cells(11, 12, 8);
        assert_eq!(v.ranges(), [0..4, 4..4]);
        // Position 9 sees 6, 7, 8, 9: cells 0..2 (8, 9) then 6..8 (6, 7), in cell order.
        let v = p.visible_cells(9, 12, 8);
        assert_eq!(v.ranges(), [0..2, 6..8]);
        assert!(v.in_gap(3) && !v.in_gap(6) && !v.in_gap(1));
        // Position 7 sees 4..=7: cells 4..8, one range.
        let v = p.visible_cells(7, 12, 8);
        assert_eq!(v.ranges(), [4..8, 8..8]);
    }

    #[test]
    fn ring_cell_ranges_wrap() {
        let l = KvLayout {
            n_cells: 32,
            caches: vec![
                KvSlot {
                    offset: 0,
                    row_bytes: 2,
                    n_cells: 32,
                    window: None,
                },
                KvSlot {
                    offset: 64,
                    row_bytes: 2,
                    n_cells: 8,
                    window: Some(4),
                },
            ],
            stream_bytes: 128,
        };
        let r: Vec<_> = l.cell_ranges(6, 10).collect();
        assert_eq!(r, vec![12..20, 76..80, 64..68]);
        let r: Vec<_> = l.cell_ranges(3, 20).collect();
        assert_eq!(r, vec![6..40, 64..80]);
        assert!(l.has_ring());
        // Written up to 20: cutting to 17 keeps 14..17 (cells 6, 7, 0), 17..20 reached
        // cells 1..4 only; cutting to 16 would need 13 (cell 5), fine; 12 needs 9 (cell 1,
        // overwritten by 17).
        assert!(l.can_truncate(17, 20) && l.can_truncate(15, 20));
        assert!(!l.can_truncate(12, 20));
        assert!(l.can_truncate(0, 20) && l.can_truncate(20, 20));
    }
}
