//! Row kernels: one block per row of `ne0` values, block reductions ([`super::COMMON`]):
//! `rms_norm` (optionally times a weight: `rms_norm+mul`), `norm`, `soft_max`, as ggml-cpu
//! computes them (`scale = 1 / sqrtf(mean + eps)`; `soft_max` multiplies by `1 / sum`),
//! summing in f32 in another order (results agree to rounding).

use super::emit::{broadcast, flt, refs};
use super::{CodegenError, Ctx, Emitted};

/// Which row op.
#[derive(Clone, Copy, Debug)]
pub enum RowOp {
    /// `x / sqrt(mean(x²) + eps)`.
    RmsNorm(f32),
    /// `(x - mean) / sqrt(var + eps)`.
    Norm(f32),
    /// `softmax(x * scale)`.
    SoftMax(f32),
}

/// Prints a row op; with `mul`, the result is multiplied by source 1 (broadcast).
///
/// # Errors
/// A value with the KV length as a dimension.
pub fn emit(ctx: &mut Ctx<'_>, op: RowOp, mul: bool) -> Result<Emitted, CodegenError> {
    let (x, dst) = (ctx.src(0)?, ctx.dst(0)?);
    if x.kv != 0 || dst.kv != 0 {
        return Err(ctx.unsupported("rows with the KV length as a dimension"));
    }
    let k = x.ne[0];
    let nt: u32 = (k.next_multiple_of(32)).min(256) as u32;
    let nw = nt / 32;
    let rows = x.n_rows();
    let idx = ["i0", "i1", "i2", "i3"];
    let ld = x.load(&idx, &mut ctx.needs);
    let mut b = format!(
        "    SHARED float red[{nw}];\n    const i32 i1 = BX % {n1}; const i32 i2 = (BX / {n1}) % {n2}; const i32 i3 = BX / {n12};\n",
        n1 = x.ne[1],
        n2 = x.ne[2],
        n12 = x.ne[1] * x.ne[2]
    );
    let loop_ = format!("for (i32 i0 = TX; i0 < {k}; i0 += {nt})");
    let y = match op {
        RowOp::RmsNorm(eps) => {
            b += &format!(
                "    float s = 0.0f;\n    {loop_} {{ const float v = {ld}; s += v * v; }}\n    \
                 s = block_sum(s, red, {nw}, TX);\n    \
                 const float scale = 1.0f / sqrtf(s / {kf} + {eps});\n",
                kf = flt(k as f32),
                eps = flt(eps)
            );
            format!("({ld}) * scale")
        }
        RowOp::Norm(eps) => {
            b += &format!(
                "    float s = 0.0f;\n    {loop_} {{ s += {ld}; }}\n    \
                 const float mean = block_sum(s, red, {nw}, TX) / {kf};\n    \
                 float s2 = 0.0f;\n    {loop_} {{ const float v = {ld} - mean; s2 += v * v; }}\n    \
                 const float scale = 1.0f / sqrtf(block_sum(s2, red, {nw}, TX) / {kf} + {eps});\n",
                kf = flt(k as f32),
                eps = flt(eps)
            );
            format!("({ld} - mean) * scale")
        }
        RowOp::SoftMax(scale) => {
            let sc = flt(scale);
            b += &format!(
                "    float m = AS_FLOAT(0xff800000u);\n    {loop_} {{ m = fmaxf(m, ({ld}) * {sc}); }}\n    \
                 m = block_max(m, red, {nw}, TX);\n    \
                 float s = 0.0f;\n    {loop_} {{ s += expf(({ld}) * {sc} - m); }}\n    \
                 const float inv = 1.0f / block_sum(s, red, {nw}, TX);\n"
            );
            format!("expf(({ld}) * {sc} - m) * inv")
        }
    };
    let y = if mul {
        let w = ctx.src(1)?;
        let iw = broadcast(&w.ne, &dst.ne);
        format!("({y}) * {}", w.load(&refs(&iw), &mut ctx.needs))
    } else {
        y
    };
    b += &format!("    {loop_} {{ {} }}\n", dst.store(&idx, &y));
    Ok(Emitted {
        text: format!("{} {{\n{b}}}\n", ctx.header(nt)),
        grid: [rows as u32, 1, 1],
        block: nt,
    })
}
