//! The fused matrix-product kernel of a plan ([`ir::plan::MulMatSpec`]): optional
//! `rms_norm × weight` prologue, `n_mat` products sharing one input, and an epilogue
//! (residual / bias add, SwiGLU / GeGLU).
//!
//! Two steps per call:
//!
//! 1. **prepare**: each input row is normalized (prologue) and converted to the weight type's
//!    `vec_dot_type` ([`crate::actq`]: Q8_1 for Q4_1, Q8_0 for Q4_0 / Q8_0, by the
//!    hand-written quantizer of [`crate::handwritten`]; f16 / bf16 rounding for F16 / BF16
//!    weights) — what ggml does before every quantized product. With many tokens this is a
//!    phase of its own whose chunks are blocks of tokens; with few tokens every thread
//!    prepares all of them into its own buffer before its first product chunk (cheaper than
//!    waiting for each other).
//! 2. **products**: chunks are runs of 4-row groups (of all weights together); a chunk calls
//!    the generated kernel ([`crate::generated`]) on its groups. With an epilogue, a chunk's
//!    products go to scratch and the epilogue is applied to them while they are in cache
//!    (so a residual may be overwritten in place).
//!
//! A weight whose row count `M` is not a multiple of 4 gets a kernel generated for `M`
//! rounded up (the repacked weight's last group is padded with zero rows); its products go
//! to scratch and the real rows are copied out.

use std::sync::Arc;

use half::{bf16, f16};

use super::ops::Ctx;
use super::view::{Ptr, View};
use crate::formats::GROUP_ROWS;
pub(crate) use crate::generated::KernelFn;
use crate::handwritten::actq::FastQuant;
use crate::handwritten::elementwise::{binary, glu, Binary, Glu};
use crate::handwritten::norm::rms_norm_row;
use crate::layout::RepackedWeight;
use crate::rows::RowDot;

/// Most products (rows × tokens) of a chunk with an epilogue: 64 KiB of f32 per weight, so a
/// chunk's products are still in cache when the epilogue reads them.
const CHUNK_VALUES: usize = 16384;

/// Chunks per thread a product phase aims at (enough for a preempted thread's share to be
/// picked up by the others).
const CHUNKS_PER_THREAD: usize = 8;

/// Tokens per chunk of a prepare phase.
const PREP_TOKENS: usize = 4;

/// Groups of rows a generated kernel computes per call while the next as many are
/// prefetched ([`MulMat::products`]).
const PREFETCH_GROUPS: usize = 4;

/// How input rows are prepared for the products.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Prep {
    /// Quantized to the 8-bit companion format of the weight.
    Quant(FastQuant),
    /// Kept as f32 (F32 weights).
    F32,
    /// Rounded through f16 (F16 weights: ggml converts the activations to F16).
    F16,
    /// Rounded through bf16 (BF16 weights).
    BF16,
    /// Quantized to the weight type's `vec_dot_type` in ggml's own block layout (weights
    /// multiplied by the row-dot kernels of [`crate::rows`]).
    Rows(RowDot),
}

/// Where a product's `{M, N}` result goes: token `t`'s row at `ptr + t·stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Out {
    pub ptr: Ptr,
    pub stride: usize,
}

/// One weight of the kernel.
#[derive(Debug)]
pub(crate) struct Mat {
    /// The generated kernel (set once the JIT module is finalized).
    pub entry: Option<KernelFn>,
    /// Index of its shape in the load's kernel table.
    pub spec: usize,
    /// The weight, repacked or read in place.
    pub weight: MatWeight,
    /// Rows (`M`).
    pub m: usize,
    /// `M` rounded up to a multiple of 4: the kernel's row count and output row stride.
    pub m_pad: usize,
    /// Epilogue `None`: the result `{M, N}`. Written directly by the kernel when
    /// `stride == 4·M` and `M == m_pad`, else through scratch at [`Mat::scratch`].
    pub dst: Option<Out>,
    /// Byte offset of this weight's products in the epilogue scratch.
    pub scratch: usize,
    /// Whether the weight is the language-model head (see [`MulMat::lm_head`]).
    pub lm_head: bool,
    /// Whether decode prefetches the generated kernel's groups ahead in software (the
    /// plan's choice, `crate::select::MatKernel::prefetch`).
    pub prefetch: bool,
}

/// How a product reads its weight.
#[derive(Debug)]
pub(crate) enum MatWeight {
    /// Repacked into the generated kernels' layout ([`crate::layout`]).
    Repacked(Arc<RepackedWeight>),
    /// In ggml's layout, read in place: `row_bytes` per row at `data` (the model file's
    /// mapping, borrowed for the plan's lifetime), multiplied by `dot`.
    Rows {
        dot: RowDot,
        data: Ptr,
        row_bytes: usize,
    },
}

impl Mat {
    /// Whether the kernel writes the result in place.
    fn direct(&self) -> Option<Out> {
        self.dst
            .filter(|d| self.m == self.m_pad && d.stride == 4 * self.m)
    }
}

/// What follows the products.
#[derive(Debug)]
pub(crate) enum Epi {
    /// The products are the results (each [`Mat::dst`]).
    None,
    /// `y = W·x + r`, `r` repeated over tokens when it has one row.
    Add { r: View, dst: Out },
    /// `y = act(W_0·x) · (W_1·x)`.
    Glu { f: Glu, dst: Out },
}

/// A lowered fused matmul (module doc).
#[derive(Debug)]
pub(crate) struct MulMat {
    /// Values per input row.
    pub k: usize,
    /// Tokens.
    pub n: usize,
    /// The input `{k, n}` f32 (rows contiguous).
    pub x: View,
    /// `rms_norm` prologue: epsilon and the f32 norm weight `{k}`.
    pub norm: Option<(f32, Ptr)>,
    pub prep: Prep,
    /// Bytes of one prepared input row.
    pub act_row_bytes: usize,
    /// Whether preparation is a phase of its own (shared buffer) rather than done by each
    /// thread into its own buffer.
    pub split_prep: bool,
    pub mats: Vec<Mat>,
    pub epi: Epi,
    /// Groups of 4 rows per product chunk (even, so paired-group kernels are not split).
    pub chunk_groups: usize,
    /// Whether the input holds only the rows whose logits are asked for: the
    /// language-model head (`output.weight`, or a tied `token_embd`) and the last layer's
    /// products after the output rows are selected (llama.cpp's `n_outputs` columns).
    pub lm_head: bool,
}

/// Groups per product chunk for `total` groups of `n` tokens on `n_threads` threads.
pub(crate) fn chunk_groups(total: usize, n: usize, n_threads: usize, epilogue: bool) -> usize {
    let mut g = total.div_ceil(CHUNKS_PER_THREAD * n_threads);
    if epilogue {
        g = g.min(CHUNK_VALUES / (GROUP_ROWS * n.max(1)));
    }
    g.max(2).next_multiple_of(2)
}

impl MulMat {
    /// 2 when preparation is a phase of its own, else 1.
    pub fn phases(&self) -> usize {
        1 + self.split_prep as usize
    }

    /// Groups of the product phase.
    fn total_groups(&self) -> usize {
        match self.epi {
            Epi::None => self.mats.iter().map(|m| m.m_pad / GROUP_ROWS).sum(),
            _ => self.mats[0].m_pad / GROUP_ROWS,
        }
    }

    fn is_prep(&self, ph: usize) -> bool {
        self.split_prep && ph == 0
    }

    /// Chunks of phase `ph`.
    pub fn n_chunks(&self, ph: usize) -> usize {
        if self.is_prep(ph) {
            self.n.div_ceil(PREP_TOKENS)
        } else {
            self.total_groups().div_ceil(self.chunk_groups)
        }
    }

    /// Prepares tokens `t0..t1` into `act`.
    unsafe fn prepare(&self, act: Ptr, t0: usize, t1: usize, cx: &Ctx<'_>) {
        let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
        for t in t0..t1 {
            let xr = self.x.at(t, 0, 0) as *const f32;
            let src = match self.norm {
                Some((eps, w)) => {
                    rms_norm_row(xr, w.0 as *const f32, tmp, self.k, eps);
                    tmp as *const f32
                }
                None => xr,
            };
            self.prep_row(src, act.add(t * self.act_row_bytes));
        }
    }

    /// Before a thread's first chunk of phase `ph`: its own prepared input (unsplit
    /// preparation); before its first product chunk, its packed panels of earlier inputs
    /// forgotten ([`crate::rows::new_inputs`]: chunks of this phase reuse what the first
    /// packs).
    ///
    /// # Safety
    /// See [`super::ops::Op::run_chunk`].
    pub unsafe fn thread_init(&self, ph: usize, cx: &Ctx<'_>) {
        if !self.is_prep(ph) {
            crate::rows::new_inputs();
        }
        if !self.split_prep && ph == 0 {
            self.prepare(cx.scratch.act_private[cx.ti], 0, self.n, cx);
        }
    }

    /// Runs chunk `c` of phase `ph` (module doc).
    ///
    /// # Safety
    /// See [`super::ops::Op::run_chunk`].
    pub unsafe fn run_chunk(&self, ph: usize, c: usize, cx: &Ctx<'_>) {
        if self.is_prep(ph) {
            let t0 = c * PREP_TOKENS;
            self.prepare(
                cx.scratch.act_shared,
                t0,
                (t0 + PREP_TOKENS).min(self.n),
                cx,
            );
            return;
        }
        let act = if self.split_prep {
            cx.scratch.act_shared
        } else {
            cx.scratch.act_private[cx.ti]
        };
        let act = act.0 as *const u8;
        let g0 = c * self.chunk_groups;
        let g1 = (g0 + self.chunk_groups).min(self.total_groups());
        match &self.epi {
            Epi::None => {
                let mut base = 0;
                for mat in &self.mats {
                    let gm = mat.m_pad / GROUP_ROWS;
                    let lo = g0.max(base) - base;
                    let hi = g1.min(base + gm).saturating_sub(base);
                    if lo < hi {
                        match (mat.direct(), mat.dst) {
                            (Some(d), _) => {
                                self.products(mat, act, d.ptr.0 as *mut f32, lo, hi, cx)
                            }
                            (None, Some(d)) => {
                                let s = cx.scratch.epi.f32_at(mat.scratch);
                                self.products(mat, act, s, lo, hi, cx);
                                let (r0, r1) = (lo * GROUP_ROWS, (hi * GROUP_ROWS).min(mat.m));
                                for t in 0..self.n {
                                    std::ptr::copy_nonoverlapping(
                                        s.add(t * mat.m_pad + r0),
                                        d.ptr.f32_at(t * d.stride + 4 * r0),
                                        r1.saturating_sub(r0),
                                    );
                                }
                            }
                            (None, None) => {}
                        }
                    }
                    base += gm;
                }
            }
            Epi::Add { .. } | Epi::Glu { .. } => self.with_epilogue(cx, act, g0, g1),
        }
    }

    /// Products of groups `g0..g1` into scratch, then the epilogue for their rows.
    unsafe fn with_epilogue(&self, cx: &Ctx<'_>, act: *const u8, g: usize, ge: usize) {
        let m = self.mats[0].m;
        let mp = self.mats[0].m_pad;
        let n = self.n;
        let epi = cx.scratch.epi;
        for mat in &self.mats {
            self.products(mat, act, epi.f32_at(mat.scratch), g, ge, cx);
        }
        let (r0, r1) = (g * GROUP_ROWS, (ge * GROUP_ROWS).min(m));
        if r0 >= r1 {
            return;
        }
        for t in 0..n {
            let s0 = epi.f32_at(self.mats[0].scratch + 4 * (t * mp + r0)) as *const f32;
            match &self.epi {
                Epi::Add { r, dst } => {
                    let rr = r.at(t % r.ne[1], 0, 0) as *const f32;
                    let d = dst.ptr.f32_at(t * dst.stride + 4 * r0);
                    binary(Binary::Add, s0, rr.add(r0), r1 - r0, d, r1 - r0);
                }
                Epi::Glu { f, dst } => {
                    let s1 = epi.f32_at(self.mats[1].scratch + 4 * (t * mp + r0)) as *const f32;
                    let d = dst.ptr.f32_at(t * dst.stride + 4 * r0);
                    glu(*f, s0, s1, d, r1 - r0);
                }
                Epi::None => {}
            }
        }
    }

    /// Groups `g0..g1` of `mat` for all tokens into `out` (`{m_pad, N}`, row stride
    /// `4·m_pad`). Row-dot weights compute only the step's real tokens (the padding rows of
    /// their results are left as they are: nothing reads them), each as the column of
    /// llama.cpp's `mul_mat` it is (column `llama_col0 + t` of `n_llama`; the head of a
    /// one-output step is a one-column product), which chooses llama.cpp's kernel and so
    /// the order of its sums.
    unsafe fn products(
        &self,
        mat: &Mat,
        act: *const u8,
        out: *mut f32,
        g0: usize,
        g1: usize,
        cx: &Ctx<'_>,
    ) {
        match &mat.weight {
            MatWeight::Repacked(w) => {
                let Some(entry) = mat.entry else { return };
                // A few groups per call, the next few prefetched first: the hardware
                // prefetcher alone streams decode's weights at ~55% of the read bandwidth
                // (each group is contiguous in the repacked layout).
                let base = w.data().as_ptr();
                if self.n > 2 || !mat.prefetch {
                    // Prompts reuse each group across their tokens: nothing to stream.
                    entry(base, act, out, g0 as i64, g1 as i64);
                    return;
                }
                let gb = w.data().len() / (mat.m_pad / GROUP_ROWS).max(1);
                let mut g = g0;
                while g < g1 {
                    let ge = (g + PREFETCH_GROUPS).min(g1);
                    let next = (ge + PREFETCH_GROUPS).min(g1);
                    crate::rows::prefetch(base.wrapping_add(ge * gb), (next - ge) * gb);
                    entry(base, act, out, g as i64, ge as i64);
                    g = ge;
                }
            }
            MatWeight::Rows {
                dot,
                data,
                row_bytes,
            } => {
                let arb = self.act_row_bytes;
                // The language-model head of a step with one output is llama.cpp's one-column
                // product of the last token; every other product has a column per token.
                // A multi-sequence step's rows are each the one column of its own product.
                let rows = (g0 * GROUP_ROWS, (g1 * GROUP_ROWS).min(mat.m));
                // A multi-sequence step: each run of rows is its own ubatch's columns, and
                // neighbouring one-token runs (generated tokens) share one call as
                // one-column products, each weight row read once for all of them; the
                // head's rows (one output per run) are one-column products.
                if cx.row_kv.is_some() && !self.lm_head {
                    let mut r = 0;
                    while r < cx.runs.len() && cx.runs[r].start < self.n {
                        let run = cx.runs[r];
                        let mut end = r + 1;
                        if run.n_llama == 1 {
                            while end < cx.runs.len() && cx.runs[end].n_llama == 1 {
                                end += 1;
                            }
                        }
                        let last = cx.runs[end - 1];
                        let len = (last.start + last.len).min(self.n) - run.start;
                        crate::rows::products(
                            dot,
                            data.0 as *const u8,
                            *row_bytes,
                            act.add(run.start * arb),
                            arb,
                            (len, run.col0, run.n_llama.max(1)),
                            out.add(run.start * mat.m_pad),
                            mat.m_pad,
                            rows,
                            true,
                        );
                        r = end;
                    }
                    return;
                }
                let (n, n_cols, col0) = if self.lm_head && self.n == 1 {
                    (1, 1, 0)
                } else if cx.row_kv.is_some() {
                    (cx.runs.len().min(self.n), 1, 0)
                } else {
                    (cx.n_real.min(self.n), cx.n_llama.max(1), cx.llama_col0)
                };
                crate::rows::products(
                    dot,
                    data.0 as *const u8,
                    *row_bytes,
                    act,
                    arb,
                    (n, col0, n_cols),
                    out,
                    mat.m_pad,
                    rows,
                    true,
                );
            }
        }
    }

    /// Converts one f32 row into the prepared form at `dst`.
    unsafe fn prep_row(&self, src: *const f32, dst: *mut u8) {
        let x = std::slice::from_raw_parts(src, self.k);
        match self.prep {
            Prep::Quant(q) => q.row(src, dst, self.k),
            Prep::Rows(r) => r.prepare(x, std::slice::from_raw_parts_mut(dst, self.act_row_bytes)),
            Prep::F32 => std::ptr::copy_nonoverlapping(src as *const u8, dst, 4 * self.k),
            Prep::F16 => {
                for (i, v) in x.iter().enumerate() {
                    std::ptr::write_unaligned(
                        dst.add(4 * i) as *mut f32,
                        f16::from_f32(*v).to_f32(),
                    );
                }
            }
            Prep::BF16 => {
                for (i, v) in x.iter().enumerate() {
                    let r = bf16::from_bits(ir::ggml::f32_to_bf16(*v)).to_f32();
                    std::ptr::write_unaligned(dst.add(4 * i) as *mut f32, r);
                }
            }
        }
    }
}
