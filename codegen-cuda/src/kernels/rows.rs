//! Row kernels: one block per row of `ne0` values, block reductions ([`super::block_reduce`]):
//! `rms_norm` (optionally times a weight: `rms_norm+mul`), `norm`, `soft_max`, as ggml-cpu
//! computes them (`scale = 1 / sqrtf(mean + eps)`; `soft_max` multiplies by `1 / sum`),
//! summing in f32 in another order (results agree to rounding).

use super::emit::{broadcast, flt, refs};
use super::{block_reduce, CodegenError, Ctx, Emitted};

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
                 float ss;\n    {}\n    \
                 const float scale = 1.0f / sqrtf(ss / {kf} + {eps});\n",
                block_reduce("s", "ss", nw, false),
                kf = flt(k as f32),
                eps = flt(eps)
            );
            format!("({ld}) * scale")
        }
        RowOp::Norm(eps) => {
            b += &format!(
                "    float s = 0.0f;\n    {loop_} {{ s += {ld}; }}\n    \
                 float ss;\n    {}\n    const float mean = ss / {kf};\n    \
                 float s2 = 0.0f;\n    {loop_} {{ const float v = {ld} - mean; s2 += v * v; }}\n    \
                 float ss2;\n    {}\n    \
                 const float scale = 1.0f / sqrtf(ss2 / {kf} + {eps});\n",
                block_reduce("s", "ss", nw, false),
                block_reduce("s2", "ss2", nw, false),
                kf = flt(k as f32),
                eps = flt(eps)
            );
            format!("({ld} - mean) * scale")
        }
        RowOp::SoftMax(scale) => {
            let sc = flt(scale);
            b += &format!(
                "    float m0 = AS_FLOAT(0xff800000u);\n    {loop_} {{ m0 = fmaxf(m0, ({ld}) * {sc}); }}\n    \
                 float m;\n    {}\n    \
                 float s = 0.0f;\n    {loop_} {{ s += expf(({ld}) * {sc} - m); }}\n    \
                 float ss;\n    {}\n    const float inv = 1.0f / ss;\n",
                block_reduce("m0", "m", nw, true),
                block_reduce("s", "ss", nw, false)
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

/// Prints the Walsh–Hadamard rotation of every group of `n` values along `ne0`
/// (`ir::ggml::fwht`: every value times `1 / sqrt(n)`, then the butterflies
/// `(u + v, u - v)` for `len = 1, 2, 4, …`): one block per group, staged in shared memory,
/// a barrier between passes.
///
/// # Errors
/// `n` not a power of two dividing `ne0`, or a value with the KV length as a dimension.
pub fn emit_hadamard(ctx: &mut Ctx<'_>, n: u64) -> Result<Emitted, CodegenError> {
    let (x, dst) = (ctx.src(0)?, ctx.dst(0)?);
    if !n.is_power_of_two() || x.ne[0] % n != 0 || x.kv != 0 || n > 4096 {
        return Err(ctx.unsupported(format!("a Hadamard rotation of {n} over {}", x.ne[0])));
    }
    let nt = n.min(256) as u32;
    let groups = x.ne[0] / n;
    let idx = ["g * N + e", "i1", "i2", "i3"].map(|s| s.replace('N', &n.to_string()));
    let idx = super::emit::refs(&idx);
    let ld = x.load(&idx, &mut ctx.needs);
    let st = dst.store(&idx, "s[e]");
    let scale = flt(1.0 / (n as f32).sqrt());
    let b = format!(
        "    SHARED float s[{n}];\n    const i32 g = BX % {groups}; const i32 r = BX / {groups};\n    \
         const i32 i1 = r % {n1}; const i32 i2 = (r / {n1}) % {n2}; const i32 i3 = r / {n12};\n    \
         for (i32 e = TX; e < {n}; e += {nt}) s[e] = ({ld}) * {scale};\n    \
         for (i32 len = 1; len < {n}; len *= 2) {{\n        SYNC();\n        \
         for (i32 q = TX; q < {h}; q += {nt}) {{\n            \
         const i32 i = (q / len) * 2 * len + q % len;\n            \
         const float u = s[i]; const float v = s[i + len];\n            \
         s[i] = u + v; s[i + len] = u - v;\n        }}\n    }}\n    SYNC();\n    \
         for (i32 e = TX; e < {n}; e += {nt}) {{ {st} }}\n",
        n1 = x.ne[1],
        n2 = x.ne[2],
        n12 = x.ne[1] * x.ne[2],
        h = n / 2
    );
    Ok(Emitted {
        text: format!("{} {{\n{b}}}\n", ctx.header(nt)),
        grid: [(groups * x.n_rows()) as u32, 1, 1],
        block: nt,
    })
}
