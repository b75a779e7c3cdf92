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
//! The matrix-vector case (decode, `N = 1`) reads each weight byte once; prompts re-read the
//! row once per [`NC`] columns.

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
        if ir::ggml::block_format(t).is_none() {
            return Err(ctx.unsupported(format!("no kernels for {} weights yet", t.name())));
        }
    }
    if v.dtype == DType::I32 {
        return Err(ctx.unsupported(format!("{what}: an I32 matrix")));
    }
    Ok(())
}

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
    let rows: Vec<u64> = if glu {
        vec![mats[0].ne[1]]
    } else {
        mats.iter().map(|w| w.ne[1]).collect()
    };
    let total: u64 = rows.iter().sum();
    let nc = n.min(NC);
    let guard = n % nc != 0;

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
        let y = match epi {
            Epilogue::None => "acc[c]".to_string(),
            Epilogue::Add => {
                let rv = resid.as_ref().ok_or_else(|| ctx.unsupported("no residual"))?;
                let ir = broadcast(&rv.ne, &dst.ne);
                format!("acc[c] + {}", rv.load(&refs(&ir), &mut ctx.needs))
            }
            Epilogue::Swiglu => "(acc[c] / (1.0f + expf(-acc[c]))) * accu[c]".to_string(),
            Epilogue::Geglu => "(0.5f * acc[c] * (1.0f + tanhf(0.7978845608028654f * acc[c] * (1.0f + 0.044715f * acc[c] * acc[c])))) * accu[c]".to_string(),
        };
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
