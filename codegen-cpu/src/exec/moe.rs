//! The mixture-of-experts kernels (`argsort_top_k`, `moe_weights`, `mul_mat_id`, `moe_sum`;
//! `ir::interp::moe` is their definition) and their lowering.
//!
//! `mul_mat_id` reads only the selected experts' rows: each (token, slot) pair quantizes
//! the token's activation row to the weight type's `vec_dot_type` and dots it with the
//! rows of the expert the slot selected, with the dense path's row-dot kernel
//! ([`crate::rows::RowDot`], one column: ggml-cpu's `vec_dot` order), so every weight type
//! the dense path reads is read here, with the same numbers. Work is cut into chunks of
//! (token, slot, [`ROWS`] output rows); the activation row is prepared per chunk into the
//! thread's scratch. The memory plan is unchanged: every result has its fixed shape
//! (`{M, k, T}`), the worst case of any routing.

use ir::graph::{DType, Op as IrOp};
use ir::interp::moe::moe_weights_row;
use ir::plan::{Base, Kernel, Step};

use super::lower::Lowerer;
use super::ops::{Ctx, Op};
use super::view::{Ptr, View};
use crate::rows::RowDot;
use crate::select::MatFamily;

/// Output rows per `mul_mat_id` chunk.
const ROWS: usize = 64;
/// Tokens per chunk of the row-wise MoE ops.
const TOKENS: usize = 8;

/// A lowered MoE kernel.
#[derive(Debug)]
pub(crate) enum MoeOp {
    /// `argsort_top_k`: `x {n, T}` → `ids I32 {k, T}`.
    TopK { x: View, ids: View, k: usize },
    /// `moe_weights`: `probs {n_expert, T}`, `ids {k, T}` → `{k, T}`.
    Weights {
        probs: View,
        ids: View,
        y: View,
        norm: bool,
        scale: f32,
    },
    /// `mul_mat_id`.
    MulMatId(Box<MulMatId>),
    /// `moe_sum`: `x {E, k, T}`, `w {k, T}` → `{E, T}`.
    Sum { x: View, w: View, y: View },
}

/// A lowered `mul_mat_id`.
#[derive(Debug)]
pub(crate) struct MulMatId {
    /// The experts' weight data, `n_expert` slices of `m` rows of `row_bytes`.
    w: Ptr,
    row_bytes: usize,
    n_expert: usize,
    k: usize,
    m: usize,
    dot: RowDot,
    act_bytes: usize,
    /// Columns from which llama.cpp multiplies an expert with its tiled kernel
    /// (`usize::MAX`: never).
    tiled_from: usize,
    /// `b {K, B1, T}`, `ids {n_used, T}`, `y {M, n_used, T}`.
    b: View,
    ids: View,
    y: View,
}

impl MoeOp {
    /// Chunks of the op.
    pub fn n_chunks(&self) -> usize {
        match self {
            MoeOp::TopK { x: t, .. } | MoeOp::Weights { probs: t, .. } => t.ne[1].div_ceil(TOKENS),
            MoeOp::Sum { y, .. } => y.ne[1].div_ceil(TOKENS),
            MoeOp::MulMatId(m) => m.y.ne[2] * m.y.ne[1] * m.m.div_ceil(ROWS),
        }
    }

    /// Runs chunk `c`.
    ///
    /// # Safety
    /// As [`Op::run_chunk`].
    pub unsafe fn run_chunk(&self, c: usize, cx: &Ctx<'_>) {
        let toks = |n: usize| (c * TOKENS).min(n)..((c + 1) * TOKENS).min(n);
        match self {
            MoeOp::TopK { x, ids, k } => {
                let n = x.ne[0];
                for t in toks(x.ne[1]) {
                    let row = std::slice::from_raw_parts(x.at(t, 0, 0) as *const f32, n);
                    top_k_row(row, *k, ids.at(t, 0, 0) as *mut i32);
                }
            }
            MoeOp::Weights {
                probs,
                ids,
                y,
                norm,
                scale,
            } => {
                let (k, n) = (ids.ne[0], probs.ne[0]);
                let w = std::slice::from_raw_parts_mut(cx.scratch.tmp[cx.ti].0 as *mut f32, k);
                for t in toks(ids.ne[1]) {
                    let p = probs.at(t, 0, 0) as *const f32;
                    let id = ids.at(t, 0, 0) as *const i32;
                    for (i, wi) in w.iter_mut().enumerate() {
                        let e = *id.add(i);
                        *wi = if e >= 0 && (e as usize) < n {
                            *p.add(e as usize)
                        } else {
                            cx.error.store(true, std::sync::atomic::Ordering::Relaxed);
                            0.0
                        };
                    }
                    moe_weights_row(w, *norm, *scale);
                    std::ptr::copy_nonoverlapping(w.as_ptr(), y.at(t, 0, 0) as *mut f32, k);
                }
            }
            MoeOp::Sum { x, w, y } => {
                let (e, k) = (x.ne[0], x.ne[1]);
                for t in toks(y.ne[1]) {
                    let dst = y.at(t, 0, 0) as *mut f32;
                    let wt = w.at(t, 0, 0) as *const f32;
                    for i in 0..k {
                        let wi = *wt.add(i);
                        let src = x.at(i, t, 0) as *const f32;
                        if i == 0 {
                            for j in 0..e {
                                *dst.add(j) = *src.add(j) * wi;
                            }
                        } else {
                            for j in 0..e {
                                *dst.add(j) += *src.add(j) * wi;
                            }
                        }
                    }
                }
            }
            MoeOp::MulMatId(m) => m.run_chunk(c, cx),
        }
    }
}

/// The indices of the `k` largest values of `row`, largest first, equal values in index
/// order (the interpreter's stable sort): `k` passes of a selection, without scratch.
///
/// # Safety
/// `dst` valid for `k` writes.
unsafe fn top_k_row(row: &[f32], k: usize, dst: *mut i32) {
    // `a` comes before `b`: a larger value, or an equal one at a smaller index.
    let before = |a: usize, b: usize| match row[a].total_cmp(&row[b]) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => a < b,
    };
    let mut prev: Option<usize> = None;
    for j in 0..k {
        let mut best: Option<usize> = None;
        for i in 0..row.len() {
            if prev.is_none_or(|p| before(p, i)) && best.is_none_or(|b| before(i, b)) {
                best = Some(i);
            }
        }
        let Some(b) = best else { return };
        *dst.add(j) = b as i32;
        prev = Some(b);
    }
}

impl MulMatId {
    unsafe fn run_chunk(&self, c: usize, cx: &Ctx<'_>) {
        let blocks = self.m.div_ceil(ROWS);
        let (pair, blk) = (c / blocks, c % blocks);
        let n_used = self.y.ne[1];
        let (t, i) = (pair / n_used, pair % n_used);
        let e = *(self.ids.at(t, 0, 0) as *const i32).add(i);
        if e < 0 || e as usize >= self.n_expert {
            cx.error.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let x = std::slice::from_raw_parts(self.b.at(i % self.b.ne[1], t, 0) as *const f32, self.k);
        let act = std::slice::from_raw_parts_mut(cx.scratch.act_private[cx.ti].0, self.act_bytes);
        self.dot.prepare(x, act);
        // llama.cpp's kernel for this expert depends on how many columns it has: its tiled
        // kernel from 8 for K-quants, else `vec_dot` (one column).
        // Only the real tokens count (a padded step's other rows are not llama.cpp's); a
        // llama.cpp ubatch cut into several steps is counted per step (not its numbers).
        let n_ids = self.ids.ne[0] * self.ids.ne[1].min(cx.n_real.max(1));
        let ids = std::slice::from_raw_parts(self.ids.at(0, 0, 0) as *const i32, n_ids);
        let count = ids.iter().filter(|&&x| x == e).count();
        let n_cols = if self.tiled_from <= count { count } else { 1 };
        let expert = self.w.add(e as usize * self.m * self.row_bytes);
        let dst = self.y.at(i, t, 0) as *mut f32;
        for r in blk * ROWS..((blk + 1) * ROWS).min(self.m) {
            let w = std::slice::from_raw_parts(expert.add(r * self.row_bytes), self.row_bytes);
            *dst.add(r) = self.dot.dot(w, act, 0, n_cols);
        }
    }
}

/// Lowers MoE kernel `k` (op `op`) of step `s`.
pub(crate) fn lower(
    l: &mut Lowerer<'_, '_, '_>,
    s: &Step,
    k: &Kernel,
    op: &IrOp,
) -> Result<Vec<Op>, String> {
    let (src, dst) = (&k.srcs, k.dsts[0]);
    let ids_view = |l: &mut Lowerer<'_, '_, '_>, id| -> Result<View, String> {
        let v = l.view(s, id)?;
        if v.dtype != DType::I32
            || !v.rows_contiguous()
            || v.ne[2] * v.ne[3] != 1
            || v.kv != 0
            || v.ne[1] > 1 && v.nb[1] != 4 * v.ne[0]
        {
            return Err("expert ids must be a dense I32 {k, T}".into());
        }
        Ok(v)
    };
    let two_d = |v: &View, what: &str| -> Result<(), String> {
        if v.kv != 0 || v.ne[2] * v.ne[3] != 1 {
            return Err(format!("{what} must be a 2-D value"));
        }
        Ok(())
    };
    let op = match op {
        IrOp::TopK { k } => {
            let x = l.f32_view(s, src[0])?;
            two_d(&x, "the router's probabilities")?;
            let ids = ids_view(l, dst)?;
            let k = *k as usize;
            if ids.ne[0] != k || ids.ne[1] != x.ne[1] || k > x.ne[0] {
                return Err("top-k result does not match its source".into());
            }
            MoeOp::TopK { x, ids, k }
        }
        IrOp::MoeWeights { norm, scale } => {
            let probs = l.f32_view(s, src[0])?;
            two_d(&probs, "the router's probabilities")?;
            let ids = ids_view(l, src[1])?;
            let y = l.f32_view(s, dst)?;
            if y.ne[..2] != ids.ne[..2] || probs.ne[1] != ids.ne[1] {
                return Err("weights, ids and probabilities differ in shape".into());
            }
            l.needs.tmp_floats = l.needs.tmp_floats.max(ids.ne[0]);
            MoeOp::Weights {
                probs,
                ids,
                y,
                norm: *norm,
                scale: *scale,
            }
        }
        IrOp::MoeSum => {
            let x = l.f32_view(s, src[0])?;
            let w = l.f32_view(s, src[1])?;
            let y = l.f32_view(s, dst)?;
            two_d(&w, "the weights")?;
            two_d(&y, "the sum")?;
            if x.kv != 0
                || x.ne[3] != 1
                || x.ne[1] != w.ne[0]
                || x.ne[2] != w.ne[1]
                || y.ne[0] != x.ne[0]
                || y.ne[1] != x.ne[2]
            {
                return Err("experts, weights and sum differ in shape".into());
            }
            MoeOp::Sum { x, w, y }
        }
        IrOp::MulMatId => {
            let wv = &s.values[src[0].index()];
            let Base::Weight(wid) = wv.base else {
                return Err("the experts of mul_mat_id must be a weight".into());
            };
            let t = wv.dtype.ggml_type();
            let ne = wv.shape.ne;
            if wv.offset != 0 || !wv.is_contiguous() || ne[3] != 1 {
                return Err("the experts must be a whole 3-D weight".into());
            }
            let (kk, m, n_expert) = (ne[0] as usize, ne[1] as usize, ne[2] as usize);
            let choice = crate::select::mat_kernels(k)?
                .first()
                .copied()
                .ok_or("no kernel chosen for the experts")?;
            let ne2 = [ne[0], ne[1], 1, 1];
            let dot = match choice.family {
                MatFamily::Rows => RowDot::new(t, choice.tier),
                MatFamily::Repacked => RowDot::for_weight(t, ne2, choice.tier),
                _ => None,
            }
            .map(|d| d.with_prefetch(choice.prefetch))
            .ok_or_else(|| format!("no {choice} kernel for {} experts", t.name()))?;
            let row_bytes = dot
                .row_bytes(kk)
                .ok_or("expert rows are not whole blocks")?;
            let act_bytes = dot
                .act_row_bytes(kk)
                .ok_or("activation rows are not whole blocks")?;
            let data = l.raw(wid)?;
            if data.len() != row_bytes * m * n_expert {
                return Err(format!(
                    "the experts hold {} bytes, not {}",
                    data.len(),
                    row_bytes * m * n_expert
                ));
            }
            let b = l.f32_view(s, src[1])?;
            let ids = ids_view(l, src[2])?;
            let y = l.f32_view(s, dst)?;
            if b.kv != 0 || b.ne[3] != 1 || b.ne[0] != kk || b.ne[2] != ids.ne[1] {
                return Err("b must be {K, B1, T} for the ids".into());
            }
            if y.ne[0] != m || y.ne[1] != ids.ne[0] || y.ne[2] != ids.ne[1] || y.kv != 0 {
                return Err("result must be {M, k, T}".into());
            }
            l.needs.act_private_bytes = l.needs.act_private_bytes.max(act_bytes);
            MoeOp::MulMatId(Box::new(MulMatId {
                w: Ptr(data.as_ptr() as *mut u8),
                row_bytes,
                n_expert,
                k: kk,
                m,
                dot,
                act_bytes,
                // Repacked weights: llama.cpp's gemv per column, whatever the count.
                tiled_from: (1..=64)
                    .find(|&n| {
                        ir::ggml::x86_mul_mat_kernel(t, n) == ir::ggml::X86MulMatKernel::Tiled
                    })
                    .filter(|_| !ir::ggml::repacked_by_llama_cpp(t, [ne[0], ne[1], 1, 1]))
                    .unwrap_or(usize::MAX),
                b,
                ids,
                y,
            }))
        }
        other => return Err(format!("{} is not a mixture-of-experts op", other.name())),
    };
    Ok(vec![Op::Moe(Box::new(op))])
}

#[cfg(test)]
mod tests {
    use super::top_k_row;

    /// Largest first, equal values in index order, NaN-free rows as ggml's `argsort` orders
    /// them (the interpreter's stable sort).
    #[test]
    fn top_k_orders_ties_by_index() {
        let row = [0.5f32, -1.0, 0.5, 2.0, 0.5, -3.0];
        let mut out = [0i32; 4];
        // SAFETY: `out` holds 4 values.
        unsafe { top_k_row(&row, 4, out.as_mut_ptr()) };
        assert_eq!(out, [3, 0, 2, 4]);
    }
}
