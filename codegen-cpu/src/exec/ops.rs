//! The lowered kernels of a step (everything but the matrix products, which live in
//! [`super::mul_mat`]) and how each splits its work over the threads.
//!
//! Every op is run by every thread of the step with its thread index; each thread computes a
//! disjoint part (rows, tokens, heads) and the step puts a barrier after every op. The
//! arithmetic is in [`crate::kernels`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ir::ggml::GgmlType;
use ir::graph::AttnParams;

use super::barrier::Barrier;
use super::mul_mat::MulMat;
use super::view::{split, Ptr, View};
use crate::kernels::attention::{attend, KvRows, ScoreParams};
use crate::kernels::elementwise::{binary, glu, soft_max_row, unary, Binary, Glu, Unary};
use crate::kernels::embed::dequant_row;
use crate::kernels::norm::{norm_row, rms_norm_row};
use crate::kernels::rope::{store_f16, store_f32, RopeTable};

/// Scratch memory of a step, sized at load time for the largest op.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// Per thread: f32 values (a normalized row, a query head, a dequantized weight row).
    pub tmp: Vec<Ptr>,
    /// Per thread: attention scores (`n_ctx` values).
    pub scores: Vec<Ptr>,
    /// Per thread: prepared activations of a matmul whose preparation is not split.
    pub act_private: Vec<Ptr>,
    /// Prepared activations shared by all threads (preparation split over tokens).
    pub act_shared: Ptr,
    /// f32 products before a matmul epilogue (`n_mat × M × N` values).
    pub epi: Ptr,
}

/// What one thread sees while running one op.
pub(crate) struct Ctx<'a> {
    /// Thread index.
    pub ti: usize,
    /// Number of threads.
    pub nt: usize,
    /// The step's KV length.
    pub kv_len: usize,
    /// The barrier between phases of an op (and between ops).
    pub barrier: &'a Barrier,
    /// Scratch buffers.
    pub scratch: &'a Scratch,
    /// Set when an op meets an index it cannot use (a row id out of range).
    pub error: &'a AtomicBool,
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
    /// Byte 0 of cache row 0.
    pub ptr: Ptr,
    /// Bytes between rows (positions).
    pub stride: usize,
    /// F16 (else F32) elements.
    pub f16: bool,
}

impl CacheRows {
    /// Stores `n` f32 values at element `elem` of row `pos`.
    ///
    /// # Safety
    /// `pos` is a row of the cache and `elem + n` fits in a row; `src` valid for `n` reads.
    unsafe fn store(&self, pos: usize, elem: usize, src: *const f32, n: usize) {
        let es = if self.f16 { 2 } else { 4 };
        let dst = self.ptr.add(pos * self.stride + elem * es);
        if self.f16 {
            store_f16(src, dst, n)
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

/// Attention over the KV cache ([`crate::kernels::attention`]).
#[derive(Debug)]
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
}

/// One lowered kernel.
#[derive(Debug)]
pub(crate) enum Op {
    GetRows(GetRows),
    MulMat(Box<MulMat>),
    RopeKv(RopeKv),
    Attention(Attention),
    Unary { x: View, y: View, f: Unary },
    Binary { a: View, b: View, y: View, f: Binary },
    Glu { g: View, u: View, y: View, f: Glu },
    Norm { x: View, w: Option<View>, y: View, rms: bool, eps: f32 },
    SoftMax { x: View, y: View, scale: f32 },
}

impl Op {
    /// Runs this thread's part of the op.
    ///
    /// # Safety
    /// The op was lowered from a verified plan against the buffers the context's pointers
    /// point into, the step inputs were checked, and every thread of the step runs the op.
    pub unsafe fn run(&self, cx: &Ctx<'_>) {
        match self {
            Op::GetRows(g) => get_rows(g, cx),
            Op::MulMat(m) => m.run(cx),
            Op::RopeKv(r) => rope_kv(r, cx),
            Op::Attention(a) => attention(a, cx),
            Op::Unary { x, y, f } => {
                let ne = y.dims(cx.kv_len);
                let (r0, r1) = split(ne[1] * ne[2] * ne[3], cx.ti, cx.nt);
                for r in r0..r1 {
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
                let (r0, r1) = split(ne[1] * ne[2] * ne[3], cx.ti, cx.nt);
                for r in r0..r1 {
                    let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
                    let brow = b.at(i1 % nb_[1], i2 % nb_[2], i3 % nb_[3]);
                    binary(*f, a.row(r, &ne) as *const f32, brow as *const f32, nb_[0], y.row(r, &ne) as *mut f32, ne[0]);
                }
            }
            Op::Glu { g, u, y, f } => {
                let ne = y.dims(cx.kv_len);
                let (r0, r1) = split(ne[1] * ne[2] * ne[3], cx.ti, cx.nt);
                for r in r0..r1 {
                    glu(*f, g.row(r, &ne) as *const f32, u.row(r, &ne) as *const f32, y.row(r, &ne) as *mut f32, ne[0]);
                }
            }
            Op::Norm { x, w, y, rms, eps } => {
                let ne = y.dims(cx.kv_len);
                let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
                let (r0, r1) = split(ne[1] * ne[2] * ne[3], cx.ti, cx.nt);
                for r in r0..r1 {
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
                let (r0, r1) = split(ne[1] * ne[2] * ne[3], cx.ti, cx.nt);
                for r in r0..r1 {
                    soft_max_row(x.row(r, &ne) as *const f32, y.row(r, &ne) as *mut f32, ne[0], *scale);
                }
            }
        }
    }
}

unsafe fn get_rows(g: &GetRows, cx: &Ctx<'_>) {
    let (i0, i1) = split(g.n, cx.ti, cx.nt);
    for i in i0..i1 {
        let id = *(g.ids.add(4 * i) as *const i32);
        let dst = g.dst.at(i, 0, 0) as *mut f32;
        let ok = match &g.table {
            Table::Weight { data, t, row_bytes, n_rows } => {
                id >= 0 && (id as usize) < *n_rows && {
                    let row = std::slice::from_raw_parts(data.add(id as usize * row_bytes) as *const u8, *row_bytes);
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

unsafe fn rope_kv(r: &RopeKv, cx: &Ctx<'_>) {
    let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
    let (t0, t1) = split(r.n_tokens, cx.ti, cx.nt);
    for t in t0..t1 {
        let pos = *(r.pos.add(4 * t) as *const i32) as usize;
        if let Some((k, cache)) = &r.k {
            let d = k.ne[0];
            for h in 0..k.ne[1] {
                let src = k.at(h, t, 0) as *const f32;
                match &r.table {
                    Some(table) => {
                        table.rotate(src, tmp, d, pos);
                        cache.store(pos, h * d, tmp, d);
                    }
                    None => cache.store(pos, h * d, src, d),
                }
            }
        }
        if let (Some((src, dst)), Some(table)) = (&r.q, &r.table) {
            for h in 0..src.ne[1] {
                table.rotate(src.at(h, t, 0) as *const f32, dst.at(h, t, 0) as *mut f32, src.ne[0], pos);
            }
        }
        if let Some((v, cache)) = &r.v {
            cache.store(pos, 0, v.at(t, 0, 0) as *const f32, v.ne[0]);
        }
    }
}

unsafe fn attention(a: &Attention, cx: &Ctx<'_>) {
    let (d_k, n_head, n_tokens) = (a.q.ne[0], a.q.ne[1], a.q.ne[2]);
    let (d_v, n_head_kv) = (a.v.ne[0], a.k.ne[1]);
    let group = (n_head / n_head_kv.max(1)).max(1);
    let n_kv = a.k.dims(cx.kv_len)[2];
    let scores = cx.scratch.scores[cx.ti].0 as *mut f32;
    let qbuf = cx.scratch.tmp[cx.ti].0 as *mut f32;
    let p = ScoreParams {
        kq_scale: a.params.kq_scale,
        softcap: a.params.softcap,
    };
    let f16 = a.k.dtype == ir::graph::DType::F16;
    let one = |t: usize, h: usize| {
        let pos = *(a.pos.add(4 * t) as *const i32) as i64;
        let hi = if a.params.causal { (pos + 1).clamp(0, n_kv as i64) } else { n_kv as i64 };
        let lo = match a.params.window {
            Some(w) => (pos - w as i64 + 1).clamp(0, hi),
            None => 0,
        };
        let kvh = h / group;
        let kv = KvRows {
            k: a.k.at(kvh, 0, 0),
            k_stride: a.k.nb[2],
            v: a.v.at(kvh, 0, 0),
            v_stride: a.v.nb[2],
            f16,
        };
        attend(
            a.q.at(h, t, 0) as *const f32,
            d_k,
            &kv,
            lo as usize,
            hi as usize,
            &p,
            scores,
            qbuf,
            a.out.at(h, t, 0) as *mut f32,
            d_v,
        );
    };
    if n_tokens >= 2 * cx.nt {
        // Later tokens see more keys: deal tokens round-robin so every thread gets a mix.
        let mut t = cx.ti;
        while t < n_tokens {
            for h in 0..n_head {
                one(t, h);
            }
            t += cx.nt;
        }
    } else {
        let (i0, i1) = split(n_tokens * n_head, cx.ti, cx.nt);
        for i in i0..i1 {
            one(i / n_head, i % n_head);
        }
    }
}
