//! Attention over the KV cache ([`ir::graph::Op::Attention`]): flash-style, one block of four
//! warps per (query head, token).
//!
//! Lanes hold the query's values `lane, lane + 32, ...`; each warp walks every fourth
//! visible cell, computes the score with a warp reduction, applies the soft-cap and
//! `kq_scale`, and keeps an online softmax (running maximum, sum and weighted sum of V).
//! The four warps' states merge in shared memory. The visible cells are those of the
//! interpreter's `visible`: causal up to the token's position (read from the positions
//! input: the KV length is never a kernel argument), from `pos - window + 1` with a sliding
//! window. A query that sees no cell gets zeros, as in the interpreter.
//!
//! Over sliding-window rings (K and V caches of `cells` cells, position `p` in cell
//! `p % cells`: [`ir::plan::KvLayout`]) the visible cells are those of
//! [`AttnParams::visible_cells`]: once the ring has wrapped, the newest positions in cells
//! `0..=pos % cells` then the oldest from `(pos - window + 1) % cells` to the ring's end, as
//! llama.cpp walks its SWA cache; the warps walk that cell order, the masked cells between
//! skipped.

use super::emit::flt;
use super::{CodegenError, Ctx, Emitted};
use ir::graph::{AttnParams, DType};

/// Warps per block.
const WPB: u32 = 4;

/// Prints one attention kernel.
///
/// # Errors
/// Shapes other than `q {d_k, n_head, N}`, `k {d_k, n_head_kv, n_kv}`, `v {d_v, n_head_kv,
/// n_kv}` with `n_head` a multiple of `n_head_kv`.
pub fn emit(ctx: &mut Ctx<'_>, p: &AttnParams) -> Result<Emitted, CodegenError> {
    let (q, k, v, pos, dst) = (
        ctx.src(0)?,
        ctx.src(1)?,
        ctx.src(2)?,
        ctx.src(3)?,
        ctx.dst(0)?,
    );
    let (dk, n_head, n_tok) = (q.ne[0], q.ne[1], q.ne[2]);
    let (dv, n_head_kv, n_kv) = (v.ne[0], v.ne[1], k.ne[2]);
    if k.ne[0] != dk
        || k.ne[1] != n_head_kv
        || n_head_kv == 0
        || n_head % n_head_kv != 0
        || q.ne[3] * k.ne[3] * v.ne[3] != 1
        || pos.dtype != DType::I32
    {
        return Err(ctx.unsupported("attention shapes the kernel does not take"));
    }
    let dkl = dk.div_ceil(32);
    let dvl = dv.div_ceil(32);
    let group = n_head / n_head_kv;
    let ld_pos = |t: &str| pos.load_i32(&[t, "0", "0", "0"]);
    let hi = if p.causal {
        format!("{} + 1", ld_pos("t"))
    } else {
        format!("{} + 1", ld_pos(&(n_tok - 1).to_string()))
    };
    let lo = match p.window {
        Some(w) => format!("{} - {} + 1", ld_pos("t"), w),
        None => "0".to_string(),
    };
    let ring = match (ctx.src_ring(1), ctx.src_ring(2)) {
        (None, None) => None,
        (Some(kc), Some(vc)) if kc == vc && p.causal && p.window.is_some() => Some(kc),
        _ => return Err(ctx.unsupported(
            "a ring KV cache needs causal sliding-window attention over K and V rings of one size",
        )),
    };
    // The visible cells: `lo..hi` (one range), or over a wrapped ring `lo..hi` then
    // `lo2..hi2` (AttnParams::visible_cells), walked as `nv` cells in that order.
    let (range, cell) = match (ring, p.window) {
        (Some(cells), Some(w)) => (
            format!(
                "    const i32 hp = {pos} + 1;
    i32 lp = hp - {w};
    lp = lp < 0 ? 0 : lp;
    lp = lp < hp - {cells} ? hp - {cells} : lp;
    i32 lo = 0; i32 hi = 0; i32 lo2 = 0; i32 hi2 = 0;
    if (lp < hp) {{
        const i32 ca = (hp - 1) % {cells} + 1; const i32 cb = lp % {cells};
        if (lp / {cells} == (hp - 1) / {cells}) {{ lo = cb; hi = ca; }} else {{ hi = ca; lo2 = cb; hi2 = {cells}; }}
    }}
    const i32 n1 = hi - lo;
    const i32 nv = n1 + hi2 - lo2;
",
                pos = ld_pos("t")
            ),
            "    for (i32 i = warp; i < nv; i += {WPB}) {{\n        const i32 c = i < n1 ? lo + i : lo2 + (i - n1);\n"
                .replace("{{", "{")
                .replace("{WPB}", &WPB.to_string()),
        ),
        _ => (
            format!(
                "    i32 hi = {hi};
    hi = hi > {n_kv} ? {n_kv} : hi;
    i32 lo = {lo};
    lo = lo < 0 ? 0 : (lo > hi ? hi : lo);
"
            ),
            format!("    for (i32 c = lo + warp; c < hi; c += {WPB}) {{\n"),
        ),
    };
    let qe = q.load(&["e", "h", "t", "0"], &mut ctx.needs);
    let ke = k.load(&["e", "kvh", "c", "0"], &mut ctx.needs);
    let ve = v.load(&["e", "kvh", "c", "0"], &mut ctx.needs);
    let cap = match p.softcap {
        Some(c) => format!("        s = tanhf(s * {}) * {};\n", flt(1.0 / c), flt(c)),
        None => String::new(),
    };
    let out = dst.store(&["e", "h", "t", "0"], "y");
    let b = format!(
        r#"    SHARED float sm[{WPB}];
    SHARED float sl[{WPB}];
    SHARED float sacc[{WPB} * {dv}];
    const i32 h = BX; const i32 t = BY; const i32 lane = TX % 32; const i32 warp = TX / 32;
    const i32 kvh = h / {group};
{range}    float q[{dkl}];
    UNROLL for (i32 j = 0; j < {dkl}; ++j) {{ const i32 e = lane + 32 * j; q[j] = e < {dk} ? {qe} : 0.0f; }}
    float m = AS_FLOAT(0xff800000u);
    float l = 0.0f;
    float o[{dvl}];
    UNROLL for (i32 j = 0; j < {dvl}; ++j) o[j] = 0.0f;
{cell}        float s = 0.0f;
        UNROLL for (i32 j = 0; j < {dkl}; ++j) {{ const i32 e = lane + 32 * j; if (e < {dk}) s += q[j] * {ke}; }}
        s = warp_sum(s);
{cap}        s = s * {scale};
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);
        const float pr = expf(s - mn);
        l = l * corr + pr;
        UNROLL for (i32 j = 0; j < {dvl}; ++j) {{ const i32 e = lane + 32 * j; if (e < {dv}) o[j] = o[j] * corr + pr * {ve}; }}
        m = mn;
    }}
    if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
    UNROLL for (i32 j = 0; j < {dvl}; ++j) {{ const i32 e = lane + 32 * j; if (e < {dv}) sacc[warp * {dv} + e] = o[j]; }}
    SYNC();
    if (warp != 0) return;
    float mx = sm[0];
    for (i32 w = 1; w < {WPB}; ++w) mx = fmaxf(mx, sm[w]);
    float wt[{WPB}];
    float lt = 0.0f;
    UNROLL for (i32 w = 0; w < {WPB}; ++w) {{ wt[w] = sl[w] > 0.0f ? expf(sm[w] - mx) : 0.0f; lt += sl[w] * wt[w]; }}
    for (i32 e = lane; e < {dv}; e += 32) {{
        float a = 0.0f;
        UNROLL for (i32 w = 0; w < {WPB}; ++w) a += sacc[w * {dv} + e] * wt[w];
        const float y = lt > 0.0f ? a / lt : 0.0f;
        {out}
    }}
"#,
        scale = flt(p.kq_scale),
    );
    Ok(Emitted {
        text: format!("{} {{\n{b}}}\n", ctx.header(WPB * 32)),
        grid: [n_head as u32, n_tok as u32, 1],
        block: WPB * 32,
    })
}
