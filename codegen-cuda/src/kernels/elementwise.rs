//! Elementwise kernels and `get_rows`: one thread per element of the result, the element's
//! four indices decoded from the thread's global index, sources broadcast as ggml repeats
//! them. The formulas are the interpreter's (`ir::interp::elementwise`: ggml's `silu`,
//! tanh-form `gelu`, `cap * tanh(x / cap)`).

use super::emit::{broadcast, flt, refs, split_index};
use super::{CodegenError, Ctx, Emitted};
use ir::graph::{DType, Op};

/// Threads per block of the elementwise kernels.
const NT: u32 = 256;

/// ggml's `SQRT_2_OVER_PI` and `GELU_COEF_A` in the tanh form of GELU.
const GELU: &str =
    "0.5f * g * (1.0f + tanhf(0.7978845608028654f * g * (1.0f + 0.044715f * g * g)))";

/// The formula of `op` over the loaded operands `a` (and `b`), as a `float` expression.
fn formula(op: &Op) -> Option<String> {
    Some(match op {
        Op::Add => "a + b".into(),
        Op::Mul => "a * b".into(),
        Op::Scale { s } => format!("a * {}", flt(*s)),
        Op::Silu => "a / (1.0f + expf(-a))".into(),
        Op::Gelu => format!("({})", GELU.replace('g', "a")),
        Op::Tanh => "tanhf(a)".into(),
        Op::SoftCap { cap } => format!("tanhf(a * {}) * {}", flt(1.0 / *cap), flt(*cap)),
        Op::Swiglu => "(a / (1.0f + expf(-a))) * b".into(),
        Op::Geglu => format!("({}) * b", GELU.replace('g', "a")),
        Op::Cont => "a".into(),
        _ => return None,
    })
}

/// Prints an elementwise op (module doc).
///
/// # Errors
/// An op that is not elementwise here, a result with a runtime (KV) dimension, or one too
/// large for 32-bit indices.
pub fn emit(ctx: &mut Ctx<'_>, op: &Op) -> Result<Emitted, CodegenError> {
    let f = formula(op).ok_or_else(|| ctx.unsupported("no GPU kernel for this op yet"))?;
    let dst = ctx.dst(0)?;
    if dst.kv != 0 {
        return Err(ctx.unsupported("a result with the KV length as a dimension"));
    }
    if !matches!(dst.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(ctx.unsupported(format!("a {} result", dst.dtype.name())));
    }
    let n = dst.n_elements();
    if n >= i32::MAX as u64 {
        return Err(ctx.unsupported("more than 2^31 elements"));
    }
    let a = ctx.src(0)?;
    let mut body = format!(
        "    const i64 idx = (i64)BX * {NT} + TX;\n    if (idx >= {n}) return;\n    {}\n",
        split_index("idx", &dst.ne)
    );
    let ia = broadcast(&a.ne, &dst.ne);
    body += &format!(
        "    const float a = {};\n",
        a.load(&refs(&ia), &mut ctx.needs)
    );
    if matches!(op, Op::Add | Op::Mul | Op::Swiglu | Op::Geglu) {
        let b = ctx.src(1)?;
        let ib = broadcast(&b.ne, &dst.ne);
        body += &format!(
            "    const float b = {};\n",
            b.load(&refs(&ib), &mut ctx.needs)
        );
    }
    body += &format!(
        "    {}\n",
        dst.store(&["i0", "i1", "i2", "i3"], &format!("({f})"))
    );
    Ok(Emitted {
        text: format!("{} {{\n{body}}}\n", ctx.header(NT)),
        grid: [n.div_ceil(u64::from(NT)) as u32, 1, 1],
        block: NT,
    })
}

/// Prints `get_rows`: `table {K, R}` (any described type), `ids I32 {N}` → `{K, N}`. An id
/// outside the table reads row 0 or the last row (the runtime refuses such token ids before
/// a step runs; the clamp keeps a kernel inside its buffer whatever it is given).
///
/// # Errors
/// Tables or ids of more than two dimensions.
pub fn emit_get_rows(ctx: &mut Ctx<'_>) -> Result<Emitted, CodegenError> {
    let (table, ids, dst) = (ctx.src(0)?, ctx.src(1)?, ctx.dst(0)?);
    if table.ne[2] * table.ne[3] != 1 || dst.ne[2] * dst.ne[3] != 1 || ids.dtype != DType::I32 {
        return Err(ctx.unsupported("get_rows over more than one matrix"));
    }
    let (k, n, r) = (dst.ne[0], dst.ne[1], table.ne[1]);
    let total = k * n;
    let row = ids.load_i32(&["i1", "0", "0", "0"]);
    let x = table.load(&["i0", "row", "0", "0"], &mut ctx.needs);
    let body = format!(
        "    const i32 idx = BX * {NT} + TX;\n    if (idx >= {total}) return;\n    \
         const i32 i0 = idx % {k}; const i32 i1 = idx / {k};\n    \
         const i32 id = {row};\n    const i32 row = id < 0 ? 0 : (id > {last} ? {last} : id);\n    \
         const float x = {x};\n    {}\n",
        dst.store(&["i0", "i1", "0", "0"], "x"),
        last = r - 1
    );
    Ok(Emitted {
        text: format!("{} {{\n{body}}}\n", ctx.header(NT)),
        grid: [total.div_ceil(u64::from(NT)) as u32, 1, 1],
        block: NT,
    })
}
