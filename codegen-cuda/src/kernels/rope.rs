//! Rope and the KV store: `rope`, `kv_store`, and the fused `rope+kv_store[+rope_q][+kv_store_v]`
//! ([`ir::plan::RopeKvStoreSpec`]).
//!
//! One block per token. Each row the kernel reads is first staged in shared memory (so a
//! result may overwrite its source, as the plan allows for the rope of Q); each value is then
//! rotated with the angles of `ir::ggml::cpu_math::rope_cache` (theta multiplied by
//! `theta_scale` pair after pair in f32, frequency factors, the YaRN ramp and magnitude) and
//! stored. A cache row is stored at the token's position (modulo the cells of a
//! sliding-window ring, [`ir::plan::KvLayout`]) in the cache's type: F32, F16
//! (round to nearest even) or Q8_0 (a thread per block of 32, as ggml's
//! `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x / d)`).

use super::emit::{flt, Val};
use super::{CodegenError, Ctx, Emitted};
use ir::ggml::GgmlType;
use ir::graph::{DType, RopeMode, RopeParams};
use ir::plan::RopeKvStoreSpec;
use std::fmt::Write;

/// Threads per block.
const NT: u32 = 128;

/// Helpers `FN i32 <name>_pair(i32 d)`, the index in its head of the value value `d` is
/// rotated with (`d` itself past `n_rot`), and `FN float <name>(float xd, float xo, i32 d,
/// float pf)`, value `d` roped for position `pf` from its own value `xd` and its partner's
/// `xo`.
fn rope_fn(name: &str, p: &RopeParams, ff: Option<&Val>) -> String {
    let n_rot = p.n_rot as i64;
    let half = n_rot / 2;
    let ts = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let (pair, first, partner) = match p.mode {
        RopeMode::Norm => (
            "d / 2".to_string(),
            "(d % 2) == 0".to_string(),
            "first ? d + 1 : d - 1".to_string(),
        ),
        RopeMode::Neox => (
            format!("d % {half}"),
            format!("d < {half}"),
            format!("first ? d + {half} : d - {half}"),
        ),
    };
    let mut s = format!(
        "FN i32 {name}_pair(i32 d) {{\n    if (d >= {n_rot}) return d;\n    const bool first = {first};\n    \
         return {partner};\n}}\n\
         FN float {name}(float xd, float xo, i32 d, float pf) {{\n    if (d >= {n_rot}) return xd;\n    \
         const i32 i = {pair}; const bool first = {first};\n    \
         float theta = pf;\n    for (i32 ii = 0; ii < i; ++ii) theta *= {};\n",
        flt(ts)
    );
    match ff {
        Some(f) => {
            writeln!(
                s,
                "    const float te = theta / {};",
                f.load(&["i", "0", "0", "0"], &mut Default::default())
            )
            .ok();
        }
        None => s += "    const float te = theta;\n",
    }
    writeln!(s, "    const float ti = {} * te;", flt(p.freq_scale)).ok();
    if p.ext_factor != 0.0 {
        let [low, high] = ir::ggml::cpu_math::corr_dims(p);
        let mscale = p.attn_factor * (1.0 + 0.1 * (1.0 / p.freq_scale).ln());
        writeln!(
            s,
            "    float y = ((float)i - {}) / {};\n    y = y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);\n    \
             const float ramp = (1.0f - y) * {};\n    const float th = ti * (1.0f - ramp) + te * ramp;\n    \
             const float ms = {};",
            flt(low),
            flt((high - low).max(0.001)),
            flt(p.ext_factor),
            flt(mscale)
        )
        .ok();
    } else {
        writeln!(
            s,
            "    const float th = ti;\n    const float ms = {};",
            flt(p.attn_factor)
        )
        .ok();
    }
    s += "    const float c = cosf(th) * ms; const float sn = sinf(th) * ms;\n    \
          const float x0 = first ? xd : xo; const float x1 = first ? xo : xd;\n    \
          return first ? x0 * c - x1 * sn : x0 * sn + x1 * c;\n}\n";
    s
}

/// Statements staging the values of token `t` of `src` into shared array `name`: with
/// `heads`, `src` is `{head, n_head, N}` and the row is its `head * n_head` values;
/// otherwise `src` is `{n, N}`.
fn stage(ctx: &mut Ctx<'_>, src: &Val, name: &str, heads: bool) -> String {
    let per_head = src.ne[0];
    let n = if heads {
        src.ne[0] * src.ne[1]
    } else {
        src.ne[0]
    };
    let ld = if heads {
        // Value e is (e % head, e / head, t).
        src.load(
            &[
                &format!("e % {per_head}"),
                &format!("e / {per_head}"),
                "t",
                "0",
            ],
            &mut ctx.needs,
        )
    } else {
        // {n, N}
        src.load(&["e", "t", "0", "0"], &mut ctx.needs)
    };
    format!("    SHARED float {name}[{n}];\n    for (i32 e = TX; e < {n}; e += {NT}) {name}[e] = {ld};\n")
}

/// Statements storing shared row `row` (`n` floats) into the cell of position `p` of cache
/// `c`: row `p`, or row `p % cells` of a ring of `ring` cells (llama.cpp's `find_slot` on a
/// window-sized SWA cache).
fn store_row(
    ctx: &Ctx<'_>,
    c: &Val,
    row: &str,
    n: u64,
    ring: Option<u64>,
) -> Result<String, CodegenError> {
    let cell = match ring {
        Some(cells) => format!("(p % {cells})"),
        None => "p".to_string(),
    };
    Ok(match c.dtype {
        DType::F32 | DType::F16 => format!(
            "    for (i32 e = TX; e < {n}; e += {NT}) {{ {} }}\n",
            c.store(&["e", &cell, "0", "0"], &format!("{row}[e]"))
        ),
        DType::Block(GgmlType::Q8_0) => {
            let at = c.byte(&["b * 32", &cell, "0", "0"]);
            format!(
                "    for (i32 b = TX; b < {nb}; b += {NT}) {{\n        float amax = 0.0f;\n        \
                 for (i32 j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf({row}[b * 32 + j]));\n        \
                 const float d = amax / 127.0f; const float id = d != 0.0f ? 1.0f / d : 0.0f;\n        \
                 GMEM u8* blk = {};\n        *(GMEM u16*)blk = F32_TO_F16(d);\n        \
                 for (i32 j = 0; j < 32; ++j) blk[2 + j] = (u8)(i8)roundf({row}[b * 32 + j] * id);\n    }}\n",
                c.ptr(&at),
                nb = n / 32
            )
        }
        t => return Err(ctx.unsupported(format!("a {} KV cache", t.name()))),
    })
}

fn load_pos(pos: &Val) -> String {
    format!(
        "    const i32 p = {};\n",
        pos.load_i32(&["t", "0", "0", "0"])
    )
}

/// Prints the fused rope of K into the K cache, with the rope of Q and the store of V.
///
/// # Errors
/// A cache type the kernels do not store.
pub fn emit_fused(ctx: &mut Ctx<'_>, r: &RopeKvStoreSpec) -> Result<Emitted, CodegenError> {
    let k = ctx.src(0)?;
    let pos = ctx.src(1)?;
    let mut si = 2;
    let ff = if r.freq_factors {
        si += 1;
        Some(ctx.src(si - 1)?)
    } else {
        None
    };
    let q = if r.q {
        si += 1;
        Some(ctx.src(si - 1)?)
    } else {
        None
    };
    let v = if r.v { Some(ctx.src(si)?) } else { None };
    let kc = ctx.dst(0)?;
    let qd = if r.q { Some(ctx.dst(1)?) } else { None };
    let vc = if r.v {
        Some(ctx.dst(1 + r.q as usize)?)
    } else {
        None
    };
    let fname = format!("{}_rope", ctx.name);
    let helper = rope_fn(&fname, &r.rope, ff.as_ref());
    if let Some(f) = &ff {
        let _ = f.load(&["0", "0", "0", "0"], &mut ctx.needs);
    }
    let dk = k.ne[0];
    let nk = k.ne[0] * k.ne[1];
    let mut b = format!(
        "    const i32 t = BX;\n{}    const float pf = (float)p;\n",
        load_pos(&pos)
    );
    b += &stage(ctx, &k, "kx", true);
    if let Some(q) = &q {
        b += &stage(ctx, q, "qx", true);
    }
    if let Some(v) = &v {
        b += &stage(ctx, v, "vx", false);
    }
    b += &format!("    SHARED float kr[{nk}];\n    SYNC();\n");
    b += &format!(
        "    for (i32 e = TX; e < {nk}; e += {NT}) {{ const i32 d = e % {dk}; const i32 h0 = e - d; kr[e] = {fname}(kx[e], kx[h0 + {fname}_pair(d)], d, pf); }}\n"
    );
    if let (Some(q), Some(qd)) = (&q, &qd) {
        let nq = q.ne[0] * q.ne[1];
        let dq = q.ne[0];
        b += &format!(
            "    for (i32 e = TX; e < {nq}; e += {NT}) {{ const i32 d = e % {dq}; const i32 h0 = e - d; const float y = {fname}(qx[e], qx[h0 + {fname}_pair(d)], d, pf); {} }}\n",
            qd.store(&[&format!("e % {dq}"), &format!("e / {dq}"), "t", "0"], "y")
        );
    }
    b += "    SYNC();\n";
    b += &store_row(ctx, &kc, "kr", nk, ctx.dst_ring(0))?;
    if let (Some(v), Some(vc)) = (&v, &vc) {
        let ring = ctx.dst_ring(1 + r.q as usize);
        b += &store_row(ctx, vc, "vx", v.ne[0], ring)?;
    }
    Ok(Emitted {
        text: format!("{helper}{} {{\n{b}}}\n", ctx.header(NT)),
        grid: [k.ne[2] as u32, 1, 1],
        block: NT,
    })
}

/// Prints a plain rope: `x {head, n_head, N}`, `pos`, optional frequency factors.
///
/// # Errors
/// None beyond the plan's own.
pub fn emit_rope(ctx: &mut Ctx<'_>, p: &RopeParams) -> Result<Emitted, CodegenError> {
    let (x, pos, dst) = (ctx.src(0)?, ctx.src(1)?, ctx.dst(0)?);
    let ff = if ctx.kernel().srcs.len() > 2 {
        Some(ctx.src(2)?)
    } else {
        None
    };
    if x.ne[3] != 1 {
        return Err(ctx.unsupported("rope of a 4-D value"));
    }
    let fname = format!("{}_rope", ctx.name);
    let helper = rope_fn(&fname, p, ff.as_ref());
    if let Some(f) = &ff {
        let _ = f.load(&["0", "0", "0", "0"], &mut ctx.needs);
    }
    let (dh, n) = (x.ne[0], x.ne[0] * x.ne[1]);
    let mut b = format!(
        "    const i32 t = BX;\n{}    const float pf = (float)p;\n",
        load_pos(&pos)
    );
    b += &stage(ctx, &x, "xs", true);
    b += "    SYNC();\n";
    b += &format!(
        "    for (i32 e = TX; e < {n}; e += {NT}) {{ const i32 d = e % {dh}; const i32 h0 = e - d; const float y = {fname}(xs[e], xs[h0 + {fname}_pair(d)], d, pf); {} }}\n",
        dst.store(&[&format!("e % {dh}"), &format!("e / {dh}"), "t", "0"], "y")
    );
    Ok(Emitted {
        text: format!("{helper}{} {{\n{b}}}\n", ctx.header(NT)),
        grid: [x.ne[2] as u32, 1, 1],
        block: NT,
    })
}

/// Prints a plain KV store: sources `cache`, `cur {n, N}`, `pos {N}`; the result is the
/// cache.
///
/// # Errors
/// A cache type the kernels do not store.
pub fn emit_kv_store(ctx: &mut Ctx<'_>) -> Result<Emitted, CodegenError> {
    let (cur, pos, cache) = (ctx.src(1)?, ctx.src(2)?, ctx.dst(0)?);
    let n = cur.ne[0];
    if cur.ne[2] * cur.ne[3] != 1 {
        return Err(ctx.unsupported("a KV store of more than one row per token"));
    }
    let mut b = format!("    const i32 t = BX;\n{}", load_pos(&pos));
    b += &stage(ctx, &cur, "xs", false);
    b += "    SYNC();\n";
    b += &store_row(ctx, &cache, "xs", n, ctx.dst_ring(0))?;
    Ok(Emitted {
        text: format!("{} {{\n{b}}}\n", ctx.header(NT)),
        grid: [cur.ne[1] as u32, 1, 1],
        block: NT,
    })
}
