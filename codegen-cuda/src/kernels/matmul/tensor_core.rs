//! The prompt products on tensor cores (a target with [`super::super::Target::tensor_cores`]):
//! `mma.sync.m16n8k8` on TF32 tiles, f32 accumulation.
//!
//! A block of four warps computes `16 · WR` rows (of the concatenated sibling weights, or one
//! row of gate and up for the GLU epilogues) × `BN` columns (64; 32 for prompts of up to 32
//! tokens; 16 for up to 16 where `WR` ≥ 2); the grid is rows / (16 · WR) × ⌈n / BN⌉. `WR`
//! (4, 2 or 1) is the most that divides every weight's rows, and the warps lie `WR` along
//! the rows and `4 / WR` along the columns: warp `w` owns 16 rows × `BN · WR / 4` columns,
//! `NT` tiles of 16 × 8.
//! Per [`TK`] values of `K`:
//! - the input tile `{TK, BN}` (the norm prologue applied; zero past column `n`) and the
//!   weight tile `{TK, rows}` (each thread dequantizes runs of 8 values of one row, one
//!   block address, as the f32 tiles do) go to shared memory, rounded to TF32 once there;
//! - each warp multiplies its rows with each of its `NT` column tiles, `TK / 8` products
//!   each, A and B read straight from the padded rows (stride `LD`: the 32 lanes' loads
//!   fall in 32 distinct banks).
//!
//! The epilogue (add, SwiGLU, GeGLU) is applied to each lane's four accumulators.
//!
//! **Precision.** TF32 keeps f32's range with 10 mantissa bits: F16 and BF16 weights are
//! exact in it; other weights' dequantized values and the activations are rounded
//! (relative 2⁻¹¹), and the tensor cores accumulate the products in f32 (in an order and
//! with a rounding of their own, which the CPU shim's sequential `fmaf` does not copy). That
//! is finer than ggml's CUDA backend's prompt products (8-bit activations for quantized
//! weights, F16 ones for F16 weights). Where [`MIN_N`] is not reached (decode), the
//! warp-per-row f32 kernel runs.

use super::super::{CodegenError, Ctx, Emitted};
use super::{dequant_run, epilogue, which_weight, Val, VPL};
use ir::plan::Epilogue;

/// Columns from which a product takes the tensor cores.
pub const MIN_N: u64 = 16;
/// Rows of a warp's tile (`m16`).
pub const WM: u64 = 16;
/// Values of `K` per shared-memory tile.
pub const TK: u64 = 32;
/// Stride of a shared row of [`TK`] values: `TK + 4` puts lane `(g, t)`'s load at bank
/// `(4g + t) mod 32`, every lane its own.
const LD: u64 = TK + 4;
/// Warps per block.
const WARPS: u64 = 4;

/// A product the tensor-core kernel prints (what `matmul::emit` gathered).
pub struct Mma<'a> {
    /// Columns (tokens).
    pub n: u64,
    /// The shared dimension.
    pub k: u64,
    /// The epilogue.
    pub epi: Epilogue,
    /// Rows of each result (one entry for the GLU products: gate's rows).
    pub rows: &'a [u64],
    /// The weights (gate and up for the GLU products).
    pub mats: &'a [Val],
    /// The results.
    pub dsts: &'a [Val],
    /// The residual of the add epilogue.
    pub resid: Option<&'a Val>,
    /// The input element `(k, n)` as an expression of `k` and `n`.
    pub xraw: &'a str,
    /// The norm prologue: its epsilon and the norm weight's element `k`.
    pub norm: Option<(f32, &'a str)>,
}

impl Mma<'_> {
    /// Prints the kernel.
    ///
    /// # Errors
    /// A residual or result missing from the plan kernel.
    pub fn emit(&self, ctx: &mut Ctx<'_>) -> Result<Emitted, CodegenError> {
        let (n, k) = (self.n, self.k);
        let glu = matches!(self.epi, Epilogue::Swiglu | Epilogue::Geglu);
        let wr = [4u64, 2, 1]
            .into_iter()
            .find(|w| self.rows.iter().all(|r| r % (WM * w) == 0))
            .unwrap_or(1);
        let wc = WARPS / wr;
        let bm = WM * wr;
        // Columns per block: the fewest tiles that hold a short prompt (each warp needs a
        // tile of 8 of its own).
        let bn: u64 = match n {
            _ if n <= 16 && wc <= 2 => 16,
            _ if n <= 32 => 32,
            _ => 64,
        };
        let wn = bn / wc;
        let nt = wn / 8;
        let n_w = if glu { 2 } else { 1 };
        let total: u64 = self.rows.iter().sum();
        let guard = n % bn != 0;
        let threads = WARPS * 32;

        let mut b = String::new();
        b += &format!(
            "    const i32 lane = TX % 32; const i32 warp = TX / 32; const i32 g = lane / 4; const i32 t = lane % 4;\n    \
             const i32 r0 = BX * {bm}; const i32 c0 = BY * {bn};\n    \
             const i32 wr = warp % {wr}; const i32 wc = warp / {wr};\n"
        );
        // The input element (k, n) as the product reads it: with the norm, the column's
        // 1 / sqrt(mean(x²) + eps) (computed first for the block's columns) and the norm
        // weight applied, as ggml's rms_norm then mul.
        let xload = match self.norm {
            Some((eps, nwk)) => {
                b += &format!(
                    "    SHARED float nsc[{bn}];\n    for (i32 c = warp; c < {bn}; c += {WARPS}) {{\n        \
                     const i32 n = c0 + c;\n        float s = 0.0f;\n        \
                     if (n < {n}) {{ for (i32 k = lane; k < {k}; k += 32) {{ const float v = {x}; s += v * v; }} }}\n        \
                     s = warp_sum(s);\n        if (lane == 0) nsc[c] = 1.0f / sqrtf(s / {kf} + {eps});\n    }}\n    SYNC();\n",
                    x = self.xraw,
                    kf = super::flt(k as f32),
                    eps = super::flt(eps)
                );
                format!("({} * nsc[n - c0]) * {nwk}", self.xraw)
            }
            None => self.xraw.to_string(),
        };
        b += &format!(
            "    SHARED float xs[{bn} * {LD}];\n    SHARED float ws[{} * {LD}];\n",
            n_w * bm
        );
        // Which weight the block's rows belong to (gate's, for the GLU products).
        if glu {
            b += "    const i32 m0 = r0;\n";
        } else {
            b += &which_weight(self.rows);
        }
        for a in ["acc", "accu"].iter().take(n_w as usize) {
            b += &format!(
                "    float {a}[{nt}][4];\n    UNROLL for (i32 j = 0; j < {nt}; ++j) {{ {a}[j][0] = 0.0f; {a}[j][1] = 0.0f; {a}[j][2] = 0.0f; {a}[j][3] = 0.0f; }}\n"
            );
        }
        b += &format!("    for (i32 k0 = 0; k0 < {k}; k0 += {TK}) {{\n");
        // The input tile, column-major (a column's TK values in one row of xs).
        let x = if guard {
            format!("n < {n} ? TO_TF32({xload}) : 0.0f")
        } else {
            format!("TO_TF32({xload})")
        };
        b += &format!(
            "        for (i32 e = TX; e < {TK} * {bn}; e += {threads}) {{ const i32 c = e / {TK}; const i32 kk = e % {TK}; \
             const i32 k = k0 + kk; const i32 n = c0 + c; xs[c * {LD} + kk] = {x}; }}\n"
        );
        // The weight tile: runs of 8 values, TK / 8 to a row.
        let runs = n_w * bm * TK / VPL;
        b += &format!(
            "        for (i32 e = TX; e < {runs}; e += {threads}) {{\n            \
             const i32 r = e / {rpr}; const i32 kq = (e % {rpr}) * {VPL};\n",
            rpr = TK / VPL
        );
        let dst = format!("ws[r * {LD} + kq + j]");
        if glu {
            b += &format!(
                "            if (r < {bm}) {{ const i32 m = m0 + r; {} }}\n            else {{ const i32 m = m0 + r - {bm}; {} }}\n",
                dequant_run(ctx, &self.mats[0], &dst, "TO_TF32"),
                dequant_run(ctx, &self.mats[1], &dst, "TO_TF32")
            );
        } else {
            // Weights of one type and row layout (q, k and v, mostly; all are 2-D) share
            // one dequantizing loop, their offset picked per block: a copy per weight made
            // ptxas spill (an 8-byte stack frame at 32 to 72 registers).
            b += "            const i32 m = m0 + r;\n";
            let mut groups: Vec<Vec<usize>> = Vec::new();
            for (j, w) in self.mats.iter().enumerate() {
                let same = |g: &Vec<usize>| {
                    let f = &self.mats[g[0]];
                    (f.dtype, f.nb[0], f.nb[1], f.buf) == (w.dtype, w.nb[0], w.nb[1], w.buf)
                };
                match groups.iter_mut().find(|g| same(g)) {
                    Some(g) => g.push(j),
                    None => groups.push(vec![j]),
                }
            }
            for g in &groups {
                let mut w = self.mats[g[0]].clone();
                let cond = g
                    .iter()
                    .map(|j| format!("mat == {j}"))
                    .collect::<Vec<_>>()
                    .join(" || ");
                let mut pick = format!("ops.at[{}]", self.mats[g[g.len() - 1]].slot);
                for &j in g[..g.len() - 1].iter().rev() {
                    pick = format!("mat == {j} ? ops.at[{}] : {pick}", self.mats[j].slot);
                }
                w.at = Some("wat".into());
                b += &format!(
                    "            if ({cond}) {{ const u64 wat = {pick}; {} }}\n",
                    dequant_run(ctx, &w, &dst, "TO_TF32")
                );
            }
        }
        b += "        }\n        SYNC();\n";
        // The products: the warp's A fragment once per 8 values of K, then each column tile.
        b += &format!(
            "        UNROLL for (i32 ks = 0; ks < {TK}; ks += 8) {{\n            \
             const i32 ra = (wr * {WM} + g) * {LD} + ks + t;\n            \
             const float a[4] = {{ ws[ra], ws[ra + {r8}], ws[ra + 4], ws[ra + {r8} + 4] }};\n",
            r8 = 8 * LD
        );
        if glu {
            b += &format!(
                "            const float au[4] = {{ ws[ra + {u}], ws[ra + {u} + {r8}], ws[ra + {u} + 4], ws[ra + {u} + {r8} + 4] }};\n",
                u = bm * LD,
                r8 = 8 * LD
            );
        }
        b += &format!(
            "            UNROLL for (i32 j = 0; j < {nt}; ++j) {{\n                \
             const i32 rb = (wc * {wn} + j * 8 + g) * {LD} + ks + t;\n                \
             const float bb[2] = {{ xs[rb], xs[rb + 4] }};\n                MMA_TF32(acc[j], a, bb);{}\n            }}\n        }}\n        SYNC();\n    }}\n",
            if glu { " MMA_TF32(accu[j], au, bb);" } else { "" }
        );
        // The epilogue: lane (g, t)'s accumulators are rows g and g + 8, columns 2t and
        // 2t + 1 of each of its tiles.
        let col_guard = if guard {
            format!("if (i1 < {n}) ")
        } else {
            String::new()
        };
        for (j, dst) in self.dsts.iter().enumerate() {
            let y = epilogue(ctx, self.epi, "acc[j][e]", "accu[j][e]", self.resid, dst)?;
            let open = if glu {
                "    {\n".to_string()
            } else {
                format!("    if (mat == {j}) {{\n")
            };
            b += &format!(
                "{open}        UNROLL for (i32 j = 0; j < {nt}; ++j) UNROLL for (i32 e = 0; e < 4; ++e) {{\n            \
                 const i32 i0 = m0 + wr * {WM} + g + (e / 2) * 8; const i32 i1 = c0 + wc * {wn} + j * 8 + 2 * t + e % 2; \
                 const i32 i2 = 0; const i32 i3 = 0;\n            {col_guard}{{ {} }}\n        }}\n    }}\n",
                dst.store(&["i0", "i1", "i2", "i3"], &y)
            );
        }
        Ok(Emitted {
            text: format!("{} {{\n{b}}}\n", ctx.header(threads as u32)),
            grid: [(total / bm) as u32, n.div_ceil(bn) as u32, 1],
            block: threads as u32,
        })
    }
}
