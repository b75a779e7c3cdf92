//! The lowered kernels of a step (everything but the matrix products, which live in
//! [`super::mul_mat`]) and how each cuts its work into chunks.
//!
//! An op runs in one or more phases; each phase is a number of independent chunks (rows,
//! tokens, heads, row groups) that the threads of the step take one at a time from a shared
//! counter ([`super::sync`]); the next phase starts when every chunk of this one is done.
//! So a thread the OS preempts delays only the chunk it holds, and uneven chunks (later
//! tokens see more keys) balance themselves. The arithmetic is in [`crate::handwritten`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ir::ggml::GgmlType;
use ir::graph::{AttnParams, DType, VisibleCells};

use super::mul_mat::MulMat;
use super::view::{Ptr, View};
use crate::handwritten::attention::{load_kv_f32, KvRows, ScoreParams};
use crate::handwritten::elementwise::{binary, glu, soft_max_row, unary, Binary, Glu, Unary};
use crate::handwritten::embed::dequant_row;
use crate::handwritten::flash::{self, padded_kv, FlashParams, KV_TILE, Q_TILE};
use crate::handwritten::norm::{norm_row, rms_norm_row};
use crate::handwritten::rope::{store_f16, store_f32, RopeTable};
use crate::handwritten::soft_max_attn::{attend_exact, exact_scratch, ExactQuery};

/// The Q8_0 cache type (`-ctk q8_0`, `-ctv q8_0`).
const Q8_0: DType = DType::Block(GgmlType::Q8_0);

/// Scratch memory of a step, sized at load time for the largest op.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// Per thread: f32 values (a normalized row, a query head, a dequantized weight row).
    pub tmp: Vec<Ptr>,
    /// Per thread: attention scores (`n_ctx` values).
    pub scores: Vec<Ptr>,
    /// Per thread: a KV head converted to f32 and the tile scratch of multi-token attention
    /// ([`Attention::prefill_floats`] values).
    pub attn: Vec<Ptr>,
    /// Per thread: prepared activations of a matmul whose preparation is not split.
    pub act_private: Vec<Ptr>,
    /// Prepared activations shared by all threads (preparation split over tokens).
    pub act_shared: Ptr,
    /// f32 products before a matmul epilogue (`n_mat × M × N` values).
    pub epi: Ptr,
}

/// What one thread sees while running one op.
pub(crate) struct Ctx<'a> {
    /// Thread index (selects the per-thread scratch).
    pub ti: usize,
    /// Byte 0 of the KV memory of the step's sequence: the KV views and cache rows of the
    /// ops hold offsets into it ([`View::rebase`], [`CacheRows::rebase`]).
    pub kv: Ptr,
    /// Cells of that memory per cache (the context; no cell at or past it is read).
    pub n_cells: usize,
    /// The step's KV length.
    pub kv_len: usize,
    /// Scratch buffers.
    pub scratch: &'a Scratch,
    /// Set when an op meets an index it cannot use (a row id out of range).
    pub error: &'a AtomicBool,
    /// Real tokens of the step (the first `n_real` rows; the rest pad it to its size).
    pub n_real: usize,
    /// Tokens of the llama.cpp ubatch these tokens belong to (its `n_tokens`, which chooses
    /// the flash-attention kernel; at least `n_real`).
    pub n_llama: usize,
    /// Column of that ubatch the step's first token is (its matrix products' kernels
    /// depend on it).
    pub llama_col0: usize,
    /// Attention as llama.cpp's CPU flash attention (else its soft_max path).
    pub flash: bool,
    /// llama.cpp's thread count (its split-KV flash decode cuts the cache per thread).
    pub llama_threads: usize,
    /// Threads running the step (how a decode step's attention is cut: [`Op::n_chunks`]).
    pub threads: usize,
    /// A step of several sequences ([`super::CompiledPlan::step_runs`]): byte 0 of the KV
    /// memory of real row `t`'s sequence (the padding rows store nothing). Each row
    /// computes what a step of its run alone computes: its own cache, its own positions'
    /// mask and KV length, and the kernels of its run's llama.cpp ubatch. `None`: every row
    /// is of the sequence at `kv`.
    pub row_kv: Option<&'a [Ptr]>,
    /// With [`Ctx::row_kv`]: the runs of real rows that are one llama.cpp ubatch each (a
    /// slot's prompt chunk, or one generated token), in row order and covering every real
    /// row ([`super::RowRun`]). Each run has one output row, and the step's output ids put
    /// them first, in run order: the real rows after the last layer keeps only the output
    /// rows are `runs.len()`.
    pub runs: &'a [super::RowRun],
}

/// Where `ggml_get_rows` reads.
#[derive(Debug)]
pub(crate) enum Table {
    /// A weight in its GGML layout (zero-copy from the file).
    Weight {
        data: Ptr,
        t: GgmlType,
        row_bytes: usize,
        n_rows: usize,
    },
    /// An f32 value (`{ne0, rows}`).
    F32(View),
}

/// `ggml_get_rows` with 1-D ids.
#[derive(Debug)]
pub(crate) struct GetRows {
    pub table: Table,
    /// `I32 {n}`, contiguous.
    pub ids: Ptr,
    pub n: usize,
    /// Values per row.
    pub ne0: usize,
    /// `{ne0, n}` f32.
    pub dst: View,
}

/// Rows of one KV cache written by position.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheRows {
    /// Byte 0 of cache row 0: after lowering, its offset in the sequence's KV memory
    /// (resolved by [`CacheRows::rebase`]).
    pub ptr: Ptr,
    /// Bytes between rows (positions).
    pub stride: usize,
    /// F16 (else F32) elements.
    pub f16: bool,
    /// Q8_0 blocks (then `f16` is false): values are quantized as ggml-cpu's
    /// `quantize_row_q8_0` does when llama.cpp's `ggml_set_rows` stores into a Q8_0 cache.
    pub q8: bool,
    /// Rows of a ring cache (position `p` in row `p % cells`, as llama.cpp's `find_slot`
    /// fills a window-sized SWA cache); `usize::MAX` for a cache with a row per position.
    pub cells: usize,
}

impl CacheRows {
    /// Loads `n` values at element `elem` of row `pos` as f32 (F16 or F32 caches).
    ///
    /// # Safety
    /// As [`CacheRows::store`]; not a Q8_0 cache; `dst` valid for `n` writes.
    pub unsafe fn load(&self, pos: usize, elem: usize, dst: *mut f32, n: usize) {
        let row = self.ptr.add(pos % self.cells * self.stride);
        for i in 0..n {
            *dst.add(i) = if self.f16 {
                half::f16::from_bits(std::ptr::read_unaligned(
                    row.add(2 * (elem + i)) as *const u16
                ))
                .to_f32()
            } else {
                std::ptr::read_unaligned(row.add(4 * (elem + i)) as *const f32)
            };
        }
    }

    /// These rows in the KV memory at `kv` (the lowering stores their offset in it).
    #[inline]
    pub fn rebase(&self, kv: Ptr) -> CacheRows {
        CacheRows {
            ptr: Ptr(kv.add(self.ptr.0 as usize)),
            ..*self
        }
    }

    /// Stores `n` f32 values at element `elem` of row `pos`. With `flash`, an F32 cache holds
    /// them rounded to f16: llama.cpp casts an F32 K or V to F16 before its flash kernel
    /// (`build_attn_mha`), which then reads those values.
    ///
    /// # Safety
    /// `pos % cells` is a row of the cache and `elem + n` fits in a row; `src` valid for `n` reads;
    /// for a Q8_0 cache `elem` and `n` are multiples of 32 (the lowering checks the heads).
    unsafe fn store(&self, pos: usize, elem: usize, src: *const f32, n: usize, flash: bool) {
        let pos = pos % self.cells;
        if self.q8 {
            let bs = ir::ggml::GgmlType::Q8_0.type_size();
            let dst = self.ptr.add(pos * self.stride + elem / 32 * bs);
            let src = std::slice::from_raw_parts(src, n);
            let dst = std::slice::from_raw_parts_mut(dst, n / 32 * bs);
            // Whole blocks and matching lengths by the contract above: cannot fail.
            let _ = ir::ggml::quantize_q8_0_with(src, dst, ir::ggml::Q8Flavor::native());
            return;
        }
        let es = if self.f16 { 2 } else { 4 };
        let dst = self.ptr.add(pos * self.stride + elem * es);
        if self.f16 {
            store_f16(src, dst, n)
        } else if flash {
            let dst = dst as *mut f32;
            for i in 0..n {
                *dst.add(i) = half::f16::from_f32(*src.add(i)).to_f32();
            }
        } else {
            store_f32(src, dst, n)
        }
    }
}

/// Rope of K stored into its cache, with the rope of Q and the store of V (fused
/// `rope+kv_store`), or any part of it (unfused `rope`, `kv_store`).
#[derive(Debug)]
pub(crate) struct RopeKv {
    pub n_tokens: usize,
    /// `I32 {n_tokens}` positions (checked against the cache size before the step).
    pub pos: Ptr,
    pub table: Option<Arc<RopeTable>>,
    /// `k {d, n_head_kv, N}` roped into `k_cache` rows.
    pub k: Option<(View, CacheRows)>,
    /// `q {d, n_head, N}` roped into `q_dst`.
    pub q: Option<(View, View)>,
    /// `v {n, N}` stored into rows (no rope).
    pub v: Option<(View, CacheRows)>,
}

/// Attention over the KV cache ([`crate::handwritten::attention`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attention {
    /// `{d_k, n_head, N}` f32.
    pub q: View,
    /// `{d_k, n_head_kv, n_kv}` cache view.
    pub k: View,
    /// `{d_v, n_head_kv, n_kv}` cache view.
    pub v: View,
    /// `I32 {N}`.
    pub pos: Ptr,
    /// `{d_v, n_head, N}` f32.
    pub out: View,
    pub params: AttnParams,
    /// Cells of K's and V's caches when they are rings (fewer cells than the context:
    /// [`AttnParams::visible_cells`]); `usize::MAX` otherwise.
    pub cells: usize,
}

impl Attention {
    /// Keys a converted KV head holds (row length of the transposed keys).
    pub fn ldk(&self) -> usize {
        // Whole flash-attention tiles past the last cell (the tiled kernel reads them).
        self.k.ne[2].next_multiple_of(KV_TILE) + KV_TILE
    }

    /// f32 scratch values per thread: the flash tiled kernel's transposed keys, values,
    /// accumulator and tile, or the soft_max path's query scratch, whichever is larger.
    pub fn prefill_floats(&self) -> usize {
        let (d_k, d_v, ldk) = (self.q.ne[0], self.v.ne[0], self.ldk());
        (d_k * ldk + ldk * d_v + flash::tiled_scratch(d_v)).max(exact_scratch(
            d_k,
            d_v,
            self.k.ne[2],
        ))
    }

    /// f32 scratch values per thread for a group of queries of flash attention
    /// ([`flash::query_group`]).
    pub fn query_floats(&self) -> usize {
        flash::group_scratch(self.q.ne[0], self.v.ne[0], self.k.ne[2])
    }
}

/// One lowered kernel.
#[derive(Debug)]
pub(crate) enum Op {
    GetRows(GetRows),
    MulMat(Box<MulMat>),
    RopeKv(RopeKv),
    Attention(Attention),
    Unary {
        x: View,
        y: View,
        f: Unary,
    },
    Binary {
        a: View,
        b: View,
        y: View,
        f: Binary,
    },
    Glu {
        g: View,
        u: View,
        y: View,
        f: Glu,
    },
    Norm {
        x: View,
        w: Option<View>,
        y: View,
        rms: bool,
        eps: f32,
    },
    SoftMax {
        x: View,
        y: View,
        scale: f32,
    },
    /// A mixture-of-experts kernel ([`super::moe`]).
    Moe(Box<super::moe::MoeOp>),
}

/// Rows per chunk of the row-wise ops.
const ROWS_PER_CHUNK: usize = 8;
/// Tokens per chunk of rope / KV store and of multi-token attention.
const TOKENS_PER_CHUNK: usize = 8;

/// Rows `c·ROWS_PER_CHUNK ..` of `n`.
fn rows_of(c: usize, n: usize) -> std::ops::Range<usize> {
    (c * ROWS_PER_CHUNK).min(n)..((c + 1) * ROWS_PER_CHUNK).min(n)
}

impl Op {
    /// Phases of the op (a matmul that prepares its input on all threads has two).
    pub fn phases(&self) -> usize {
        match self {
            Op::MulMat(m) => m.phases(),
            _ => 1,
        }
    }

    /// Chunks of phase `ph` for KV length `kv_len`, in a multi-sequence step of `seqs`
    /// sequences ([`Ctx::row_kv`]) or, with `seqs` 0, a one-sequence step, run by `threads`
    /// threads.
    pub fn n_chunks(&self, ph: usize, kv_len: usize, seqs: usize, threads: usize) -> usize {
        let rows = |y: &View| y.n_rows(kv_len).div_ceil(ROWS_PER_CHUNK);
        match self {
            Op::GetRows(g) => g.n.div_ceil(ROWS_PER_CHUNK),
            Op::MulMat(m) => m.n_chunks(ph),
            Op::RopeKv(r) => r.n_tokens.div_ceil(TOKENS_PER_CHUNK),
            Op::Attention(a) if seqs > 0 => a.k.ne[1] * seqs,
            Op::Attention(a) => a.n_chunks(threads),
            Op::Moe(m) => m.n_chunks(),
            Op::Unary { y, .. }
            | Op::Binary { y, .. }
            | Op::Glu { y, .. }
            | Op::Norm { y, .. }
            | Op::SoftMax { y, .. } => rows(y),
        }
    }

    /// What a thread does once before its first chunk of phase `ph` (a matmul with
    /// per-thread input preparation prepares it here).
    ///
    /// # Safety
    /// As [`Op::run_chunk`].
    pub unsafe fn thread_init(&self, ph: usize, cx: &Ctx<'_>) {
        if let Op::MulMat(m) = self {
            m.thread_init(ph, cx);
        }
    }

    /// Runs chunk `c` of phase `ph`.
    ///
    /// # Safety
    /// The op was lowered from a verified plan against the buffers the context's pointers
    /// point into, the step inputs were checked, every chunk of the previous phase (and op)
    /// is done, and no other thread runs chunk `c`.
    pub unsafe fn run_chunk(&self, ph: usize, c: usize, cx: &Ctx<'_>) {
        match self {
            Op::GetRows(g) => get_rows(g, c, cx),
            Op::MulMat(m) => m.run_chunk(ph, c, cx),
            Op::RopeKv(r) => rope_kv(r, c, cx),
            Op::Attention(a) => a.run_chunk(c, cx),
            Op::Moe(m) => m.run_chunk(c, cx),
            Op::Unary { x, y, f } => {
                let ne = y.dims(cx.kv_len);
                for r in rows_of(c, ne[1] * ne[2] * ne[3]) {
                    let (src, dst) = (x.row(r, &ne), y.row(r, &ne));
                    if x.nb[0] == 4 {
                        unary(*f, src as *const f32, dst as *mut f32, ne[0]);
                    } else {
                        for i in 0..ne[0] {
                            let v = src.add(i * x.nb[0]) as *const f32;
                            unary(*f, v, (dst as *mut f32).add(i), 1);
                        }
                    }
                }
            }
            Op::Binary { a, b, y, f } => {
                let ne = y.dims(cx.kv_len);
                let nb_ = b.dims(cx.kv_len);
                for r in rows_of(c, ne[1] * ne[2] * ne[3]) {
                    let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
                    let brow = b.at(i1 % nb_[1], i2 % nb_[2], i3 % nb_[3]);
                    binary(
                        *f,
                        a.row(r, &ne) as *const f32,
                        brow as *const f32,
                        nb_[0],
                        y.row(r, &ne) as *mut f32,
                        ne[0],
                    );
                }
            }
            Op::Glu { g, u, y, f } => {
                let ne = y.dims(cx.kv_len);
                for r in rows_of(c, ne[1] * ne[2] * ne[3]) {
                    glu(
                        *f,
                        g.row(r, &ne) as *const f32,
                        u.row(r, &ne) as *const f32,
                        y.row(r, &ne) as *mut f32,
                        ne[0],
                    );
                }
            }
            Op::Norm { x, w, y, rms, eps } => {
                let ne = y.dims(cx.kv_len);
                let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
                for r in rows_of(c, ne[1] * ne[2] * ne[3]) {
                    let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
                    let (src, dst) = (x.row(r, &ne) as *const f32, y.row(r, &ne) as *mut f32);
                    let wrow = match w {
                        Some(w) => {
                            let wn = w.dims(cx.kv_len);
                            // A weight row shorter than the row is repeated (ggml_mul): expand it.
                            let p = w.at(i1 % wn[1], i2 % wn[2], i3 % wn[3]) as *const f32;
                            if wn[0] == ne[0] {
                                p
                            } else {
                                for i in 0..ne[0] {
                                    *tmp.add(i) = *p.add(i % wn[0]);
                                }
                                tmp as *const f32
                            }
                        }
                        None => std::ptr::null(),
                    };
                    if *rms {
                        rms_norm_row(src, wrow, dst, ne[0], *eps);
                    } else {
                        norm_row(src, wrow, dst, ne[0], *eps);
                    }
                }
            }
            Op::SoftMax { x, y, scale } => {
                let ne = y.dims(cx.kv_len);
                for r in rows_of(c, ne[1] * ne[2] * ne[3]) {
                    soft_max_row(
                        x.row(r, &ne) as *const f32,
                        y.row(r, &ne) as *mut f32,
                        ne[0],
                        *scale,
                    );
                }
            }
        }
    }
}

unsafe fn get_rows(g: &GetRows, c: usize, cx: &Ctx<'_>) {
    for i in rows_of(c, g.n) {
        let id = *(g.ids.add(4 * i) as *const i32);
        let dst = g.dst.at(i, 0, 0) as *mut f32;
        let ok = match &g.table {
            Table::Weight {
                data,
                t,
                row_bytes,
                n_rows,
            } => {
                id >= 0 && (id as usize) < *n_rows && {
                    let row = std::slice::from_raw_parts(
                        data.add(id as usize * row_bytes) as *const u8,
                        *row_bytes,
                    );
                    dequant_row(*t, row, dst, g.ne0)
                }
            }
            Table::F32(v) => {
                let ok = id >= 0 && (id as usize) < v.n_rows(cx.kv_len);
                if ok {
                    let src = v.at(id as usize, 0, 0);
                    for e in 0..g.ne0 {
                        *dst.add(e) = *(src.add(e * v.nb[0]) as *const f32);
                    }
                }
                ok
            }
        };
        if !ok {
            for e in 0..g.ne0 {
                *dst.add(e) = 0.0;
            }
            cx.error.store(true, Ordering::Relaxed);
        }
    }
}

impl RopeKv {
    /// The K cache this op ropes into and the table it ropes with, if it does both.
    pub fn k_rope(&self) -> Option<(&View, &CacheRows, &RopeTable)> {
        match (&self.k, &self.table) {
            (Some((kx, cache)), Some(table)) => Some((kx, cache, table.as_ref())),
            _ => None,
        }
    }

    /// Re-ropes cells `cells` of this op's K cache in the KV memory at `kv` by `delta`
    /// positions, as llama.cpp's K shift does after `llama_memory_seq_add`
    /// (`build_rope_shift`: each cached key, read as f32, rotated by the angles of
    /// `delta`, stored back in the cache's type; an F32 cache under flash attention keeps
    /// f16-rounded values, as a step stores them). Returns `false` for an op without a K
    /// rope or with a Q8_0 cache (whose keys are also Hadamard-rotated): the caller
    /// recomputes those positions instead.
    ///
    /// # Safety
    /// `kv` is a sequence's KV memory laid out for this op's plan; `cells` lie in it.
    pub unsafe fn shift_k(
        &self,
        kv: Ptr,
        cells: std::ops::Range<usize>,
        delta: i64,
        flash: bool,
    ) -> bool {
        let Some((kx, cache, table)) = self.k_rope() else {
            return false;
        };
        if cache.q8 {
            return false;
        }
        let cache = cache.rebase(kv);
        let d = kx.ne[0];
        let mut pairs = Vec::new();
        table.pairs_at(delta, &mut pairs);
        let mut tmp = vec![0f32; d];
        for cell in cells {
            for h in 0..kx.ne[1] {
                cache.load(cell, h * d, tmp.as_mut_ptr(), d);
                table.rotate_by(tmp.as_mut_ptr(), &pairs);
                cache.store(cell, h * d, tmp.as_ptr(), d, flash);
            }
        }
        true
    }
}

unsafe fn rope_kv(r: &RopeKv, c: usize, cx: &Ctx<'_>) {
    let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
    let t0 = c * TOKENS_PER_CHUNK;
    for t in t0..(t0 + TOKENS_PER_CHUNK).min(r.n_tokens) {
        let pos = *(r.pos.add(4 * t) as *const i32) as usize;
        // The sequence's memory this row stores into (none for a padding row of a
        // multi-sequence step).
        let kv = match cx.row_kv {
            None => Some(cx.kv),
            Some(rows) => rows.get(t).copied(),
        };
        if let (Some((k, cache)), Some(kv)) = (&r.k, kv) {
            let cache = cache.rebase(kv);
            let d = k.ne[0];
            for h in 0..k.ne[1] {
                let src = k.at(h, t, 0) as *const f32;
                match &r.table {
                    Some(table) => {
                        table.rotate(src, tmp, d, pos);
                        cache.store(pos, h * d, tmp, d, cx.flash);
                    }
                    None => cache.store(pos, h * d, src, d, cx.flash),
                }
            }
        }
        if let (Some((src, dst)), Some(table)) = (&r.q, &r.table) {
            for h in 0..src.ne[1] {
                table.rotate(
                    src.at(h, t, 0) as *const f32,
                    dst.at(h, t, 0) as *mut f32,
                    src.ne[0],
                    pos,
                );
            }
        }
        if let (Some((v, cache)), Some(kv)) = (&r.v, kv) {
            cache
                .rebase(kv)
                .store(pos, 0, v.at(t, 0, 0) as *const f32, v.ne[0], cx.flash);
        }
    }
}

impl Attention {
    /// The cells the query at `pos` sees among the cache's first `n_kv` ([`Attention::cells`]:
    /// in a ring past its size, two ranges in cell order).
    fn visible(&self, pos: i64, n_kv: usize) -> VisibleCells {
        self.params.visible_cells(pos, n_kv, self.cells)
    }

    /// The KV length llama.cpp gives this cache: a ring holds at most its cells.
    fn cache_kv(&self, n_kv: usize) -> usize {
        n_kv.min(self.cells)
    }
}

impl Attention {
    /// One token: a chunk per group of the query heads of one KV head (at most
    /// [`flash::GROUP`], which read the KV rows once together; smaller groups where that
    /// leaves fewer chunks than `threads`). Many tokens: a chunk per (KV head, block of
    /// tokens), the blocks of later tokens (more keys) first.
    fn n_chunks(&self, threads: usize) -> usize {
        let (n_tokens, n_head_kv) = (self.q.ne[2], self.k.ne[1]);
        if n_tokens == 1 {
            n_head_kv.max(1) * self.decode_groups(threads).1
        } else {
            n_head_kv * n_tokens.div_ceil(TOKENS_PER_CHUNK)
        }
    }

    /// One token's split of each KV head's query heads among chunks: `(heads per chunk,
    /// chunks per KV head)`.
    fn decode_groups(&self, threads: usize) -> (usize, usize) {
        let (n_head, n_head_kv) = (self.q.ne[1], self.k.ne[1].max(1));
        let group = (n_head / n_head_kv).max(1);
        let pieces = group
            .div_ceil(flash::GROUP)
            .max(threads.div_ceil(n_head_kv))
            .min(group);
        let size = group.div_ceil(pieces);
        (size, group.div_ceil(size))
    }

    /// The queries of chunk `c` ([`Attention::n_chunks`] for `threads`): query heads and
    /// tokens `ta..tb`.
    fn chunk_queries(&self, c: usize, threads: usize) -> (std::ops::Range<usize>, usize, usize) {
        let (n_head, n_tokens, n_head_kv) = (self.q.ne[1], self.q.ne[2], self.k.ne[1]);
        let group = (n_head / n_head_kv.max(1)).max(1);
        if n_tokens == 1 {
            let (size, pieces) = self.decode_groups(threads);
            let (kvh, piece) = (c / pieces, c % pieces);
            let h0 = kvh * group + piece * size;
            (h0..(h0 + size).min((kvh + 1) * group), 0, 1)
        } else {
            let n_blocks = n_tokens.div_ceil(TOKENS_PER_CHUNK);
            let (kvh, blk) = (c % n_head_kv, n_blocks - 1 - c / n_head_kv);
            (
                kvh * group..(kvh + 1) * group,
                blk * TOKENS_PER_CHUNK,
                ((blk + 1) * TOKENS_PER_CHUNK).min(n_tokens),
            )
        }
    }

    /// Chunk `c` with llama.cpp's flash attention, or else its soft_max path
    /// ([`crate::handwritten::soft_max_attn`], one query at a time; its products depend on the size
    /// of llama.cpp's ubatch).
    unsafe fn run_chunk(&self, c: usize, cx: &Ctx<'_>) {
        if let Some(rows) = cx.row_kv {
            return self.run_rows(c, cx, rows);
        }
        let a = &Attention {
            k: self.k.rebase(cx.kv),
            v: self.v.rebase(cx.kv),
            ..*self
        };
        if cx.flash {
            return a.run_flash(c, cx);
        }
        let (d_k, n_head, n_tokens) = (a.q.ne[0], a.q.ne[1], a.q.ne[2]);
        let (d_v, n_head_kv) = (a.v.ne[0], a.k.ne[1]);
        let group = (n_head / n_head_kv.max(1)).max(1);
        let n_kv = a.k.dims(cx.kv_len)[2];
        let p = ScoreParams {
            kq_scale: a.params.kq_scale,
            softcap: a.params.softcap,
        };
        let kv = |kvh: usize, gap: (usize, usize)| KvRows {
            k: a.k.at(kvh, 0, 0),
            k_stride: a.k.nb[2],
            v: a.v.at(kvh, 0, 0),
            v_stride: a.v.nb[2],
            // K and V are one float type, or a Q8_0 K with an F16 V (the lowering checks).
            f16: a.v.dtype == DType::F16,
            k_q8: a.k.dtype == Q8_0,
            v_q8: false,
            gap,
        };
        let batch = cx.n_llama.max(cx.n_real.clamp(1, n_tokens)) >= 2;
        let scratch = cx.scratch.attn[cx.ti].0 as *mut f32;
        let (heads, ta, tb) = a.chunk_queries(c, cx.threads);
        for t in ta..tb {
            let vis = a.visible(*(a.pos.add(4 * t) as *const i32) as i64, n_kv);
            for h in heads.clone() {
                attend_exact(&ExactQuery {
                    q: a.q.at(h, t, 0) as *const f32,
                    d_k,
                    kv: &kv(h / group, vis.gap),
                    lo: vis.lo,
                    hi: vis.hi,
                    batch,
                    p: &p,
                    scratch,
                    out: a.out.at(h, t, 0) as *mut f32,
                    d_v,
                });
            }
        }
    }
}

impl Attention {
    /// The query heads `heads` of token `t`, which share the KV rows `kv` and the visible
    /// cells `lo..hi` (one KV head's), by llama.cpp's reference kernel for a ubatch of
    /// `n_llama` tokens ([`flash::query_group`], [`flash::GROUP`] at a time).
    ///
    /// # Safety
    /// As [`flash::query_group`]: `kv` rows `0..hi` valid, `scratch` the thread's score
    /// scratch.
    #[allow(clippy::too_many_arguments)]
    unsafe fn flash_heads(
        &self,
        t: usize,
        heads: std::ops::Range<usize>,
        kv: &KvRows,
        (lo, hi): (usize, usize),
        ub: (usize, usize, usize),
        p: &FlashParams,
        scratch: *mut f32,
    ) {
        let mut qs = [std::ptr::null::<f32>(); flash::GROUP];
        let mut outs = [std::ptr::null_mut::<f32>(); flash::GROUP];
        for h0 in heads.clone().step_by(flash::GROUP) {
            let part = h0..(h0 + flash::GROUP).min(heads.end);
            let n = part.len();
            for (i, h) in part.enumerate() {
                qs[i] = self.q.at(h, t, 0) as *const f32;
                outs[i] = self.out.at(h, t, 0) as *mut f32;
            }
            let (d_k, d_v) = (self.q.ne[0], self.v.ne[0]);
            flash::query_group(&qs[..n], &outs[..n], d_k, kv, (lo, hi), ub, p, scratch, d_v);
        }
    }
}

impl Attention {
    /// Chunk `c` of a multi-sequence step ([`Ctx::row_kv`]): the query heads of KV head
    /// `c % n_head_kv` of real token `c / n_head_kv`, attending over its own sequence's cache
    /// (the cells its causal mask shows, its run's tokens stored before by this step) as
    /// a token of its run's llama.cpp ubatch would (flash: the reference kernel, the KV
    /// length of a one-token ubatch padded from its own position for the split-KV path,
    /// the group's queries through [`flash::query_group`]; soft_max: the one-token or the
    /// batched path by the ubatch's size). Runs take fewer than [`Q_TILE`] tokens (the
    /// caller's contract: the tiled kernel is not here). The chunk of the last real token's
    /// last KV head also zeroes the padding rows.
    unsafe fn run_rows(&self, c: usize, cx: &Ctx<'_>, rows: &[Ptr]) {
        let (d_k, n_head, n_tokens) = (self.q.ne[0], self.q.ne[1], self.q.ne[2]);
        let (d_v, n_head_kv) = (self.v.ne[0], self.k.ne[1].max(1));
        let (t, kvh) = (c / n_head_kv, c % n_head_kv);
        if c + 1 == n_head_kv * rows.len() {
            for tp in rows.len()..n_tokens {
                for hp in 0..n_head {
                    std::slice::from_raw_parts_mut(self.out.at(hp, tp, 0) as *mut f32, d_v)
                        .fill(0.0);
                }
            }
        }
        let Some(&kv) = rows.get(t) else { return };
        // The llama.cpp ubatch of the row: its size chooses the kernel.
        let n_llama = cx
            .runs
            .iter()
            .find(|r| (r.start..r.start + r.len).contains(&t))
            .map_or(1, |r| r.n_llama);
        let (k, v) = (self.k.rebase(kv), self.v.rebase(kv));
        let group = (n_head / n_head_kv).max(1);
        let heads = kvh * group..(kvh + 1) * group;
        let pos = *(self.pos.add(4 * t) as *const i32) as i64;
        let vis = self.visible(pos, k.dims(cx.kv_len)[2]);
        let (lo, hi) = (vis.lo, vis.hi);
        let kv_rows = |f16: bool| KvRows {
            k: k.at(kvh, 0, 0),
            k_stride: k.nb[2],
            v: v.at(kvh, 0, 0),
            v_stride: v.nb[2],
            f16,
            k_q8: k.dtype == Q8_0,
            v_q8: cx.flash && v.dtype == Q8_0,
            gap: vis.gap,
        };
        if cx.flash {
            let kv = kv_rows(k.dtype == DType::F16 || v.dtype == DType::F16);
            let nek1 = padded_kv(
                self.cache_kv(pos as usize + 1),
                cx.n_cells.min(k.ne[2]).min(self.cells),
            );
            self.flash_heads(
                t,
                heads,
                &kv,
                (lo, hi),
                (n_llama, nek1, cx.llama_threads),
                &FlashParams::new(self.params.kq_scale, self.params.softcap),
                cx.scratch.scores[cx.ti].0 as *mut f32,
            );
            return;
        }
        for h in heads {
            attend_exact(&ExactQuery {
                q: self.q.at(h, t, 0) as *const f32,
                d_k,
                kv: &kv_rows(v.dtype == DType::F16),
                lo,
                hi,
                batch: n_llama >= 2,
                p: &ScoreParams {
                    kq_scale: self.params.kq_scale,
                    softcap: self.params.softcap,
                },
                scratch: cx.scratch.attn[cx.ti].0 as *mut f32,
                out: self.out.at(h, t, 0) as *mut f32,
                d_v,
            });
        }
    }

    /// Chunk `c` with llama.cpp's flash attention ([`crate::handwritten::flash`]): the kernel
    /// chosen from the token count of llama.cpp's ubatch (each query's result depends only
    /// on the kernel, not on which step computes it); rows of padding tokens are zeroed.
    unsafe fn run_flash(&self, c: usize, cx: &Ctx<'_>) {
        let a = self;
        let (d_k, n_head, n_tokens) = (a.q.ne[0], a.q.ne[1], a.q.ne[2]);
        let (d_v, n_head_kv) = (a.v.ne[0], a.k.ne[1]);
        let group = (n_head / n_head_kv.max(1)).max(1);
        // llama.cpp pads the KV length to 256 cells within the context (`-c`).
        let n_ctx = cx.n_cells.min(a.k.ne[2]).min(a.cells);
        let n_kv = a.k.dims(cx.kv_len)[2];
        let n_real = cx.n_real.clamp(1, n_tokens);
        let n_llama = cx.n_llama.max(n_real);
        let p = FlashParams::new(a.params.kq_scale, a.params.softcap);
        let pos = |t: usize| *(a.pos.add(4 * t) as *const i32) as i64;
        let vis = |t: usize| a.visible(pos(t), n_kv);
        // llama.cpp's KV length: one past the last real position (the step's, unpadded).
        let kv_real = if n_real < n_tokens {
            (0..n_real).map(|t| pos(t) + 1).max().unwrap_or(1) as usize
        } else {
            cx.kv_len
        };
        let nek1 = padded_kv(a.cache_kv(kv_real), n_ctx);
        let kv_rows = |kvh: usize, gap: (usize, usize)| KvRows {
            k: a.k.at(kvh, 0, 0),
            k_stride: a.k.nb[2],
            v: a.v.at(kvh, 0, 0),
            v_stride: a.v.nb[2],
            f16: a.k.dtype == DType::F16 || a.v.dtype == DType::F16,
            k_q8: a.k.dtype == Q8_0,
            v_q8: a.v.dtype == Q8_0,
            gap,
        };
        let plain = a.k.dtype == a.v.dtype && a.k.dtype != Q8_0;
        let scratch = cx.scratch.scores[cx.ti].0 as *mut f32;
        let (heads, ta, tb) = a.chunk_queries(c, cx.threads);
        let kvh = heads.start / group;
        for t in ta.max(n_real)..tb {
            for h in heads.clone() {
                let o = a.out.at(h, t, 0) as *mut f32;
                for d in 0..d_v {
                    *o.add(d) = 0.0;
                }
            }
        }
        let tb = tb.min(n_real);
        if ta >= tb {
            return;
        }
        if n_llama < Q_TILE || !d_v.is_multiple_of(8) || !plain {
            // A token's query heads of one KV head share their rows and visible cells.
            for t in ta..tb {
                let v = vis(t);
                a.flash_heads(
                    t,
                    heads.clone(),
                    &kv_rows(kvh, v.gap),
                    (v.lo, v.hi),
                    (n_llama, nek1, cx.llama_threads),
                    &p,
                    scratch,
                );
            }
            return;
        }
        // Tiled: the block's cells converted to f32 once, from a multiple of the KV tile.
        let j0 = (ta..tb).map(|t| vis(t).lo).min().unwrap_or(0);
        let j1 = (ta..tb).map(|t| vis(t).hi).max().unwrap_or(0);
        let t0 = j0 / KV_TILE * KV_TILE;
        let ldk = a.ldk();
        let base = cx.scratch.attn[cx.ti].0 as *mut f32;
        let (kt, vf, tile) = (base, base.add(d_k * ldk), base.add(d_k * ldk + ldk * d_v));
        if t0 < j1 {
            load_kv_f32(&kv_rows(kvh, (0, 0)), d_k, d_v, t0, j1, kt, ldk, vf);
        }
        // The chunk's queries in groups that read each converted tile once.
        // (A fixed buffer: this runs per chunk of every prompt step.)
        let mut group = [flash::TiledQuery::EMPTY; flash::TILED_GROUP];
        let mut len = 0;
        for t in ta..tb {
            let v = vis(t);
            for h in heads.clone() {
                group[len] = flash::TiledQuery {
                    q: a.q.at(h, t, 0) as *const f32,
                    lo: v.lo,
                    hi: v.hi,
                    gap: v.gap,
                    out: a.out.at(h, t, 0) as *mut f32,
                };
                len += 1;
                if len == flash::TILED_GROUP || (t + 1 == tb && h + 1 == heads.end) {
                    flash::tiled_queries(&group[..len], d_k, t0, kt, ldk, vf, &p, tile, d_v);
                    len = 0;
                }
            }
        }
    }
}
