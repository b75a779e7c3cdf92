//! The fused matrix-product kernel of a plan ([`ir::plan::MulMatSpec`]): optional
//! `rms_norm × weight` prologue, `n_mat` products sharing one input, and an epilogue
//! (residual / bias add, SwiGLU / GeGLU).
//!
//! Two phases per call:
//!
//! 1. **prepare**: each input row is normalized (prologue) and converted to the weight type's
//!    `vec_dot_type` ([`crate::actq`]: Q8_1 for Q4_1, Q8_0 for Q4_0 / Q8_0; f16 / bf16
//!    rounding for F16 / BF16 weights) — what ggml does before every quantized product. With
//!    many tokens the rows are split over the threads and a barrier follows; with few tokens
//!    every thread prepares all of them into its own buffer (cheaper than a barrier).
//! 2. **products**: the 4-row groups of all weights are split over the threads; each thread
//!    calls the generated kernel ([`crate::kernels`]) on its groups. With an epilogue, a
//!    thread computes its rows in chunks into scratch and applies the epilogue to the chunk
//!    while it is in cache (so a residual may be overwritten in place).
//!
//! The last group of a weight whose row count is not a multiple of 4 is computed by a scalar
//! loop ([`MulMat::tail_dot`]) from the dequantized row.

use std::sync::Arc;

use half::{bf16, f16};

use super::ops::Ctx;
use super::view::{split, Ptr, View};
use crate::actq::{quantize_act, ACT_BLOCK_BYTES, ACT_QS_OFFSET};
use crate::formats::{QuantFormat, GROUP_ROWS, QK};
use crate::kernels::elementwise::{binary, glu, Binary, Glu};
use crate::kernels::norm::rms_norm_row;
use crate::layout::{dequantize_row, RepackedWeight};

/// A generated matmul kernel's entry (see [`crate::kernels`]): `(w, act, out, g_begin, g_end)`.
pub(crate) type KernelFn = unsafe extern "sysv64" fn(*const u8, *const u8, *mut f32, i64, i64);

/// Groups of 4 rows computed between two epilogue applications.
const CHUNK_GROUPS: usize = 16;

/// How input rows are prepared for the products.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Prep {
    /// Quantized to the 8-bit companion format of the weight.
    Quant(QuantFormat),
    /// Kept as f32 (F32 weights).
    F32,
    /// Rounded through f16 (F16 weights: ggml converts the activations to F16).
    F16,
    /// Rounded through bf16 (BF16 weights).
    BF16,
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
    /// The repacked weight.
    pub weight: Arc<RepackedWeight>,
    /// Rows (`M`).
    pub m: usize,
    /// The result, written directly by the kernel (epilogue `None`; `stride == 4·M`).
    pub dst: Option<Out>,
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
    /// Whether preparation is split over threads (shared buffer + barrier).
    pub split_prep: bool,
    pub mats: Vec<Mat>,
    pub epi: Epi,
}

impl MulMat {
    /// Runs this thread's part (module doc).
    ///
    /// # Safety
    /// See [`super::ops::Op::run`].
    pub unsafe fn run(&self, cx: &Ctx<'_>) {
        let act = if self.split_prep {
            cx.scratch.act_shared
        } else {
            cx.scratch.act_private[cx.ti]
        };
        let tmp = cx.scratch.tmp[cx.ti].0 as *mut f32;
        let (t0, t1) = if self.split_prep { split(self.n, cx.ti, cx.nt) } else { (0, self.n) };
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
        if self.split_prep && !cx.barrier.wait() {
            return;
        }
        let act = act.0 as *const u8;
        match &self.epi {
            Epi::None => {
                let total: usize = self.mats.iter().map(|m| m.m.div_ceil(GROUP_ROWS)).sum();
                let (g0, g1) = split(total, cx.ti, cx.nt);
                let mut base = 0;
                for mat in &self.mats {
                    let gm = mat.m.div_ceil(GROUP_ROWS);
                    let lo = g0.max(base) - base;
                    let hi = g1.min(base + gm).saturating_sub(base);
                    if let (true, Some(dst)) = (lo < hi, mat.dst) {
                        self.products(mat, act, dst.ptr.0 as *mut f32, lo, hi, tmp);
                    }
                    base += gm;
                }
            }
            Epi::Add { .. } | Epi::Glu { .. } => self.with_epilogue(cx, act, tmp),
        }
    }

    /// Products into scratch, chunk by chunk, each chunk followed by the epilogue.
    unsafe fn with_epilogue(&self, cx: &Ctx<'_>, act: *const u8, tmp: *mut f32) {
        let m = self.mats[0].m;
        let n = self.n;
        let (g0, g1) = split(m.div_ceil(GROUP_ROWS), cx.ti, cx.nt);
        let epi = cx.scratch.epi;
        let mut g = g0;
        while g < g1 {
            let ge = (g + CHUNK_GROUPS).min(g1);
            for (i, mat) in self.mats.iter().enumerate() {
                self.products(mat, act, epi.f32_at(4 * i * m * n), g, ge, tmp);
            }
            let (r0, r1) = (g * GROUP_ROWS, (ge * GROUP_ROWS).min(m));
            for t in 0..n {
                let s0 = epi.f32_at(4 * (t * m + r0)) as *const f32;
                match &self.epi {
                    Epi::Add { r, dst } => {
                        let rr = r.at(t % r.ne[1], 0, 0) as *const f32;
                        let d = dst.ptr.f32_at(t * dst.stride + 4 * r0);
                        binary(Binary::Add, s0, rr.add(r0), r1 - r0, d, r1 - r0);
                    }
                    Epi::Glu { f, dst } => {
                        let s1 = epi.f32_at(4 * (m * n + t * m + r0)) as *const f32;
                        let d = dst.ptr.f32_at(t * dst.stride + 4 * r0);
                        glu(*f, s0, s1, d, r1 - r0);
                    }
                    Epi::None => {}
                }
            }
            g = ge;
        }
    }

    /// Groups `g0..g1` of `mat` for all tokens into `out` (`{M, N}`, row stride `4·M`).
    unsafe fn products(&self, mat: &Mat, act: *const u8, out: *mut f32, g0: usize, g1: usize, tmp: *mut f32) {
        let full = mat.m / GROUP_ROWS;
        let fe = g1.min(full);
        if g0 < fe {
            if let Some(entry) = mat.entry {
                entry(mat.weight.data().as_ptr(), act, out, g0 as i64, fe as i64);
            }
        }
        if g1 > full && g0 <= full {
            for r in full * GROUP_ROWS..mat.m {
                for t in 0..self.n {
                    *out.add(t * mat.m + r) = self.tail_dot(mat, act, r, t, tmp);
                }
            }
        }
    }

    /// Row `r` of `mat` times prepared input row `t`, in plain f32 from the dequantized
    /// row (for the rows of a partial last group).
    unsafe fn tail_dot(&self, mat: &Mat, act: *const u8, r: usize, t: usize, tmp: *mut f32) -> f32 {
        let row = std::slice::from_raw_parts_mut(tmp, self.k);
        if dequantize_row(&mat.weight, r, row).is_err() {
            return 0.0;
        }
        let a = act.add(t * self.act_row_bytes);
        let mut acc = 0f32;
        match self.prep {
            Prep::Quant(_) => {
                for b in 0..self.k / QK {
                    let blk = a.add(b * ACT_BLOCK_BYTES);
                    let d = std::ptr::read_unaligned(blk as *const f32);
                    for j in 0..QK {
                        let q = *(blk.add(ACT_QS_OFFSET + j) as *const i8) as f32;
                        acc += row[b * QK + j] * (d * q);
                    }
                }
            }
            _ => {
                for (i, w) in row.iter().enumerate() {
                    acc += w * std::ptr::read_unaligned(a.add(4 * i) as *const f32);
                }
            }
        }
        acc
    }

    /// Converts one f32 row into the prepared form at `dst`.
    unsafe fn prep_row(&self, src: *const f32, dst: *mut u8) {
        let x = std::slice::from_raw_parts(src, self.k);
        match self.prep {
            Prep::Quant(fmt) => {
                let out = std::slice::from_raw_parts_mut(dst, self.act_row_bytes);
                // Sizes were checked when the kernel was lowered (`k` a multiple of 32,
                // `act_row_bytes` its prepared size), so this cannot fail.
                let _ = quantize_act(&fmt, self.k, 1, x, out);
            }
            Prep::F32 => std::ptr::copy_nonoverlapping(src as *const u8, dst, 4 * self.k),
            Prep::F16 => {
                for (i, v) in x.iter().enumerate() {
                    std::ptr::write_unaligned(dst.add(4 * i) as *mut f32, f16::from_f32(*v).to_f32());
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
