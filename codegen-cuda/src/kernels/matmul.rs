//! Matrix products: `mul_mat` with its fusions ([`ir::plan::MulMatSpec`]: the rms-norm
//! prologue, sibling weights sharing the input, the add / SwiGLU / GeGLU epilogue).
//!
//! A block of four warps; each warp computes one output row `m` (of the concatenated rows of
//! the sibling weights, or one row of gate and up for the GLU epilogues) for every column,
//! [`NC`] columns per pass. Lane `l` takes values `8l .. 8l + 8` of every 256 of the row:
//! it dequantizes them once (the format's `dq_` function, in f32) and multiplies them with
//! each column; the lanes' partial sums meet in a warp reduction. With a norm prologue,
//! each column's `1 / sqrt(mean(x²) + eps)` is computed first (a warp per column) and held in
//! shared memory; the input is then `(x * scale) * norm_w`, as ggml's `rms_norm` then `mul`.
//!
//! The matrix-vector case (decode, `N = 1`) reads each weight byte once. Prompts of 16
//! columns or more take tiles that dequantize each weight once per block: on a target with
//! tensor cores, [`tensor_core`]'s TF32 products (any number of columns); otherwise, for 16
//! to 64 columns, f32 tiles of 16 rows (`Tiled`). Other prompts re-read the row once per
//! [`NC`] columns.

pub mod tensor_core;

use super::emit::{broadcast, flt, refs, Val};
use super::{CodegenError, Ctx, Emitted};
use ir::graph::DType;
use ir::plan::{Epilogue, MulMatSpec};

/// Columns per pass over a row.
pub const NC: u64 = 8;
/// Warps per block.
const WPB: u32 = 4;
/// Values per lane per step along `K`.
const VPL: u64 = 8;

fn check_operand(ctx: &Ctx<'_>, v: &Val, what: &str, k: u64) -> Result<(), CodegenError> {
    if v.ne[0] != k || v.ne[2] * v.ne[3] != 1 || v.kv != 0 {
        return Err(ctx.unsupported(format!(
            "{what}: a matrix {{{}, {}, {}, {}}} (2-D, K = {k} wanted)",
            v.ne[0], v.ne[1], v.ne[2], v.ne[3]
        )));
    }
    if let DType::Block(t) = v.dtype {
        if !super::dequant::has_dequantizer(t) {
            return Err(ctx.unsupported(format!("no kernels for {} weights yet", t.name())));
        }
    }
    if v.dtype == DType::I32 {
        return Err(ctx.unsupported(format!("{what}: an I32 matrix")));
    }
    Ok(())
}

/// The result of output element `(i0, i1)` (names declared by the caller) from the products
/// `a` (and `u`, the up product of a GLU) after the epilogue.
fn epilogue(
    ctx: &mut Ctx<'_>,
    epi: Epilogue,
    a: &str,
    u: &str,
    resid: Option<&Val>,
    dst: &Val,
) -> Result<String, CodegenError> {
    Ok(match epi {
        Epilogue::None => a.to_string(),
        Epilogue::Add => {
            let rv = resid.ok_or_else(|| ctx.unsupported("no residual"))?;
            let ir = broadcast(&rv.ne, &dst.ne);
            format!("{a} + {}", rv.load(&refs(&ir), &mut ctx.needs))
        }
        Epilogue::Swiglu => format!("({a} / (1.0f + expf(-{a}))) * {u}"),
        Epilogue::Geglu => format!(
            "(0.5f * {a} * (1.0f + tanhf(0.7978845608028654f * {a} * (1.0f + 0.044715f * {a} * {a})))) * {u}"
        ),
    })
}

/// Statements declaring `mat`, the weight that the block's first row `r0` (declared by the
/// caller) falls in among sibling weights of `rows` rows each (their rows concatenated),
/// and `m0`, that row's index in its weight. Uniform per block: the callers' blocks never
/// straddle two weights.
fn which_weight(rows: &[u64]) -> String {
    let mut b = "    i32 mat = 0; i32 m0 = r0;\n".to_string();
    let mut row0 = 0u64;
    for (j, w) in rows.windows(2).enumerate() {
        row0 += w[0];
        b += &format!(
            "    if (r0 >= {row0}) {{ mat = {}; m0 = r0 - {row0}; }}\n",
            j + 1
        );
    }
    b
}

/// Rows of a tile of the tiled prompt kernel.
const TM: u64 = 16;
/// Values of `K` per tile.
const TK: u64 = 64;

/// Prints a matrix product: a fused one (`spec`) or the plain `mul_mat(a, b)` (`None`).
///
/// # Errors
/// Operands of more than two dimensions, `K` not a multiple of 8, or a weight type without
/// a description.
pub fn emit(ctx: &mut Ctx<'_>, spec: Option<MulMatSpec>) -> Result<Emitted, CodegenError> {
    let (n_mat, norm, epi) = spec.map_or((1, None, Epilogue::None), |m| {
        (m.n_mat as usize, m.norm, m.epilogue)
    });
    let x = ctx.src(if spec.is_some() { 0 } else { 1 })?;
    let first_w = if spec.is_some() {
        1 + norm.is_some() as usize
    } else {
        0
    };
    let mats: Vec<Val> = (0..n_mat)
        .map(|j| ctx.src(first_w + j))
        .collect::<Result<_, _>>()?;
    let k = x.ne[0];
    let n = x.ne[1];
    if x.dtype != DType::F32 {
        return Err(ctx.unsupported("an input that is not F32"));
    }
    check_operand(ctx, &x, "input", k)?;
    for w in &mats {
        check_operand(ctx, w, "weight", k)?;
    }
    if k % VPL != 0 {
        return Err(ctx.unsupported(format!("K = {k} is not a multiple of {VPL}")));
    }
    let glu = matches!(epi, Epilogue::Swiglu | Epilogue::Geglu);
    let dsts: Vec<Val> = (0..if glu { 1 } else { n_mat })
        .map(|j| ctx.dst(j))
        .collect::<Result<_, _>>()?;
    let resid = if epi == Epilogue::Add {
        Some(ctx.src(first_w + n_mat)?)
    } else {
        None
    };
    let nw = if let Some(_eps) = norm {
        Some(ctx.src(1)?)
    } else {
        None
    };
    if glu && mats.get(1).is_some_and(|u| u.ne[1] != mats[0].ne[1]) {
        return Err(ctx.unsupported("gate and up weights of different row counts"));
    }
    let rows: Vec<u64> = if glu {
        vec![mats[0].ne[1]]
    } else {
        mats.iter().map(|w| w.ne[1]).collect()
    };
    let total: u64 = rows.iter().sum();
    let nc = n.min(NC);
    let guard = n % nc != 0;

    let whole_blocks = mats
        .iter()
        .all(|w| w.dtype.block_size() == 1 || w.dtype.block_size() % VPL == 0);
    // Prompts on a target with tensor cores: a block per 16·WR rows and 64 columns, TF32
    // tiles (tensor_core).
    if ctx.target.tensor_cores
        && n >= tensor_core::MIN_N
        && k % tensor_core::TK == 0
        && whole_blocks
        && rows.iter().all(|r| r % tensor_core::WM == 0)
    {
        let xraw = x.load(&["k", "n", "0", "0"], &mut ctx.needs);
        let nw = match (norm, &nw) {
            (Some(eps), Some(w)) => Some((eps, w.load(&["k", "0", "0", "0"], &mut ctx.needs))),
            _ => None,
        };
        let mma = tensor_core::Mma {
            n,
            k,
            epi,
            rows: &rows,
            mats: &mats,
            dsts: &dsts,
            resid: resid.as_ref(),
            xraw: &xraw,
            norm: nw.as_ref().map(|(e, l)| (*e, l.as_str())),
        };
        return mma.emit(ctx);
    }

    let mut b = String::new();
    b += "    const i32 lane = TX % 32; const i32 warp = TX / 32;\n";
    // The input element (k, n), with the norm prologue applied.
    let mut xload = x.load(&["k", "n", "0", "0"], &mut ctx.needs);
    if let (Some(eps), Some(nw)) = (norm, &nw) {
        b += &format!(
            "    SHARED float nsc[{n}];\n    for (i32 n = warp; n < {n}; n += {WPB}) {{\n        \
             float s = 0.0f;\n        for (i32 k = lane; k < {k}; k += 32) {{ const float v = {xload}; s += v * v; }}\n        \
             s = warp_sum(s);\n        if (lane == 0) nsc[n] = 1.0f / sqrtf(s / {kf} + {eps});\n    }}\n    SYNC();\n",
            kf = flt(k as f32),
            eps = flt(eps)
        );
        xload = format!(
            "({xload} * nsc[n]) * {}",
            nw.load(&["k", "0", "0", "0"], &mut ctx.needs)
        );
    }
    // Prompts: a block per 16 rows, every column, the weight tile dequantized once into
    // shared memory (the warp-per-row kernel dequantizes a row once per 8 columns).
    // Not the GLU products yet: ptxas gave their tiled kernel an 8-byte stack frame (a
    // spill) at every width; they keep the warp-per-row kernel.
    if !glu
        && (16..=64).contains(&n)
        && n % 8 == 0
        && k % TK == 0
        && whole_blocks
        && rows.iter().all(|r| r % TM == 0)
    {
        let tiled = Tiled {
            n,
            k,
            epi,
            rows: &rows,
            mats: &mats,
            dsts: &dsts,
            resid: resid.as_ref(),
            xload: &xload,
        };
        b += &tiled.body(ctx)?;
        return Ok(Emitted {
            text: format!("{} {{\n{b}}}\n", ctx.header(WPB * 32)),
            grid: [(total / TM) as u32, 1, 1],
            block: WPB * 32,
        });
    }
    b += &format!("    const i32 gr = BX * {WPB} + warp;\n    if (gr >= {total}) return;\n");
    let mut row0 = 0u64;
    for (r, &m_rows) in rows.iter().enumerate() {
        let cond = if r + 1 == rows.len() {
            if r == 0 {
                "{".to_string()
            } else {
                "else {".to_string()
            }
        } else if r == 0 {
            format!("if (gr < {}) {{", row0 + m_rows)
        } else {
            format!("else if (gr < {}) {{", row0 + m_rows)
        };
        b += &format!("    {cond}\n        const i32 m = gr - {row0};\n");
        // The weights this row reads: one, or gate and up.
        let ws: Vec<&Val> = if glu {
            vec![&mats[0], &mats[1]]
        } else {
            vec![&mats[r]]
        };
        let accs = ["acc", "accu"];
        b += &format!("        for (i32 c0 = 0; c0 < {n}; c0 += {nc}) {{\n");
        for a in accs.iter().take(ws.len()) {
            b += &format!("            float {a}[{nc}];\n            UNROLL for (i32 c = 0; c < {nc}; ++c) {a}[c] = 0.0f;\n");
        }
        b += &format!(
            "            for (i32 k0 = lane * {VPL}; k0 < {k}; k0 += {}) {{\n",
            32 * VPL
        );
        let wn = ["w", "u"];
        for (w, name) in ws.iter().zip(wn) {
            let bs = w.dtype.block_size();
            if let (DType::Block(t), true) = (w.dtype, bs % VPL == 0) {
                // The lane's values lie in one block: its address once (the block's scale
                // loads then common), the value index from the block's start.
                ctx.needs.insert(t.id());
                let at = w.ptr(&w.byte(&["k0", "m", "0", "0"]));
                b += &format!(
                    "                const GMEM u8* {name}b = {at}; const i32 {name}i = k0 % {bs};\n                \
                     float {name}[{VPL}];\n                UNROLL for (i32 j = 0; j < {VPL}; ++j) {name}[j] = {}({name}b, {name}i + j);\n",
                    super::dequant::fn_name(t)
                );
            } else {
                let ld = w.load(&["k", "m", "0", "0"], &mut ctx.needs);
                b += &format!(
                    "                float {name}[{VPL}];\n                UNROLL for (i32 j = 0; j < {VPL}; ++j) {{ const i32 k = k0 + j; {name}[j] = {ld}; }}\n"
                );
            }
        }
        b += &format!("                UNROLL for (i32 c = 0; c < {nc}; ++c) {{\n");
        let g = if guard {
            format!("if (c0 + c < {n}) ")
        } else {
            String::new()
        };
        b += &format!(
            "                    {g}{{\n                        const i32 n = c0 + c;\n                        UNROLL for (i32 j = 0; j < {VPL}; ++j) {{\n                            const i32 k = k0 + j;\n                            const float xv = {xload};\n                            acc[c] += w[j] * xv;{}\n                        }}\n                    }}\n",
            if glu { " accu[c] += u[j] * xv;" } else { "" }
        );
        b += "                }\n            }\n";
        for a in accs.iter().take(ws.len()) {
            b += &format!(
                "            UNROLL for (i32 c = 0; c < {nc}; ++c) {a}[c] = warp_sum({a}[c]);\n"
            );
        }
        // The epilogue: lane c stores column c0 + c.
        let dst = if glu { &dsts[0] } else { &dsts[r] };
        let y = epilogue(ctx, epi, "acc[c]", "accu[c]", resid.as_ref(), dst)?;
        b += &format!(
            "            UNROLL for (i32 c = 0; c < {nc}; ++c) {{\n                if (lane == c{}) {{\n                    const i32 i0 = m; const i32 i1 = c0 + c; const i32 i2 = 0; const i32 i3 = 0;\n                    {}\n                }}\n            }}\n",
            if guard { format!(" && c0 + c < {n}") } else { String::new() },
            dst.store(&["i0", "i1", "i2", "i3"], &y)
        );
        b += "        }\n    }\n";
        row0 += m_rows;
    }
    Ok(Emitted {
        text: format!("{} {{\n{b}}}\n", ctx.header(WPB * 32)),
        grid: [total.div_ceil(u64::from(WPB)) as u32, 1, 1],
        block: WPB * 32,
    })
}

/// The tiled prompt kernel's body (after the norm prologue): block `BX` computes rows
/// `16 BX .. 16 BX + 16` of the concatenated weights for all `n` columns. Per 64 values of
/// `K`: the input tile `{64, n}` (norm applied) and the weight tile `{64, 16}` (each of the
/// 128 threads dequantizes 8 values of one row, one block address) go to shared memory;
/// thread `t` then accumulates column `t % n` of rows `(t / n) · n/8 ..` over the tile.
struct Tiled<'a> {
    n: u64,
    k: u64,
    epi: Epilogue,
    rows: &'a [u64],
    mats: &'a [Val],
    dsts: &'a [Val],
    resid: Option<&'a Val>,
    xload: &'a str,
}

/// Statements setting `{dst}[j]` (an lvalue of `j`, e.g. `ws[r * 64 + kq + j]`) to
/// `{conv}(value)` for `j < 8`: the values `k0 + kq ..` of row `m` of weight `w`, from one
/// block (the caller checked that 8-value runs do not cross blocks).
pub(super) fn dequant_run(ctx: &mut Ctx<'_>, w: &Val, dst: &str, conv: &str) -> String {
    let bs = w.dtype.block_size();
    if let DType::Block(t) = w.dtype {
        ctx.needs.insert(t.id());
        let at = w.ptr(&w.byte(&["k0 + kq", "m", "0", "0"]));
        format!(
            "{{ const GMEM u8* wb = {at}; const i32 wi = (k0 + kq) % {bs}; \
             UNROLL for (i32 j = 0; j < {VPL}; ++j) {dst} = {conv}({}(wb, wi + j)); }}",
            super::dequant::fn_name(t)
        )
    } else {
        let ld = w.load(&["k", "m", "0", "0"], &mut ctx.needs);
        format!(
            "UNROLL for (i32 j = 0; j < {VPL}; ++j) {{ const i32 k = k0 + kq + j; {dst} = {conv}({ld}); }}"
        )
    }
}

impl Tiled<'_> {
    /// Statements filling `name[r * TK + kq + j]` for `j < 8` from weight `w`, row `m`,
    /// values `k0 + kq ..`.
    fn dequant(ctx: &mut Ctx<'_>, w: &Val, name: &str) -> String {
        dequant_run(ctx, w, &format!("{name}[r * {TK} + kq + j]"), "")
    }

    fn body(&self, ctx: &mut Ctx<'_>) -> Result<String, CodegenError> {
        let (n, k) = (self.n, self.k);
        let rpt = TM * n / u64::from(WPB * 32);
        let nt = WPB * 32;
        let mut b =
            format!("    SHARED float xs[{TK} * {n}];\n    SHARED float ws[{TM} * {TK}];\n");
        b += &format!(
            "    const i32 r0 = BX * {TM}; const i32 cn = TX % {n}; const i32 g = TX / {n};\n    \
             const i32 r = TX / {tpr}; const i32 kq = (TX % {tpr}) * {VPL};\n",
            tpr = TK / VPL
        );
        b += &which_weight(self.rows);
        b += &format!(
            "    float acc[{rpt}];\n    UNROLL for (i32 q = 0; q < {rpt}; ++q) acc[q] = 0.0f;\n"
        );
        b += &format!("    for (i32 k0 = 0; k0 < {k}; k0 += {TK}) {{\n");
        b += &format!(
            "        for (i32 e = TX; e < {TK} * {n}; e += {nt}) {{ const i32 k = k0 + e % {TK}; const i32 n = e / {TK}; xs[(e % {TK}) * {n} + n] = {}; }}\n",
            self.xload
        );
        b += "        {\n            const i32 m = m0 + r;\n";
        for (j, w) in self.mats.iter().enumerate() {
            b += &format!(
                "            if (mat == {j}) {}\n",
                Self::dequant(ctx, w, "ws")
            );
        }
        b += "        }\n        SYNC();\n";
        // A tile's products are summed apart, then added to the total: the rounding of a
        // sum of 64 and of K / 64 terms instead of one of K.
        b += &format!(
            "        float acct[{rpt}];\n        UNROLL for (i32 q = 0; q < {rpt}; ++q) acct[q] = 0.0f;\n        \
             for (i32 kk = 0; kk < {TK}; ++kk) {{\n            const float xv = xs[kk * {n} + cn];\n            \
             UNROLL for (i32 q = 0; q < {rpt}; ++q) {{ acct[q] += ws[(g * {rpt} + q) * {TK} + kk] * xv; }}\n        }}\n        \
             UNROLL for (i32 q = 0; q < {rpt}; ++q) acc[q] += acct[q];\n"
        );
        b += "        SYNC();\n    }\n";
        // The epilogue: each thread stores its column of its rows.
        for (j, dst) in self.dsts.iter().enumerate() {
            let y = epilogue(ctx, self.epi, "acc[q]", "", self.resid, dst)?;
            b += &format!(
                "    if (mat == {j}) {{\n        UNROLL for (i32 q = 0; q < {rpt}; ++q) {{\n            \
                 const i32 i0 = m0 + g * {rpt} + q; const i32 i1 = cn; const i32 i2 = 0; const i32 i3 = 0;\n            {}\n        }}\n    }}\n",
                dst.store(&["i0", "i1", "i2", "i3"], &y)
            );
        }
        Ok(b)
    }
}
