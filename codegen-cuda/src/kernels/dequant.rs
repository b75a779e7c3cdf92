//! Device dequantizers printed from the one description of each GGML block format
//! ([`ir::ggml::BlockFormat`], DESIGN.md principle 1): `dq_<TYPE>(block, i)` decodes value `i`
//! of the block at `block`, as [`ir::ggml::BlockFormat::decode_value`] does, in the same f32
//! order (`(d * s_i) * q_i`, then the minimum term).
//!
//! The function is generic in `i`; kernels that call it with a constant `i` (unrolled loops)
//! get every shift, mask and byte index folded by the device compiler.
//!
//! The formats no recipe expresses ([`Decode::Routine`]) get the hand-written body of
//! [`super::routines`] instead, and the ggml lookup tables it reads. [`has_dequantizer`] is
//! the one answer to "does the GPU printer read this type", which every support check
//! (the matrix products, the runtime's supported weight types) asks.

use ir::ggml::{BitPiece, BlockFormat, Decode, FieldKind, Index, IntCode, IntMap, MinTerm};
use ir::ggml::{GgmlType, ScalarKind};
use std::fmt::Write;

/// Whether the printer has a dequantizer for `t`: a described format with a recipe or plain
/// scalars, or one with a routine of [`super::routines`]. (The GPU targets read every
/// weight type this accepts.)
pub fn has_dequantizer(t: GgmlType) -> bool {
    ir::ggml::block_format(t).is_some_and(|f| match f.decode {
        Decode::Routine => super::routines::routine(t).is_some(),
        Decode::Scalar(_) | Decode::Quantized(_) => true,
    })
}

/// The dequantizers of the GGML type ids `needs`, for a source: first the lookup tables
/// of the routines among them (each once, in order of first use), then each `dq_<TYPE>`
/// in id order.
///
/// # Errors
/// An id without a description or a dequantizer (a bug: the printer only asks for the
/// types [`has_dequantizer`] accepts).
pub fn print_all(needs: &std::collections::BTreeSet<u32>) -> Result<String, String> {
    let mut tables: Vec<&super::routines::Table> = Vec::new();
    let mut fns = String::new();
    for &id in needs {
        let f = ir::ggml::block_formats()
            .iter()
            .find(|f| f.ty.id() == id)
            .ok_or_else(|| format!("no description of GGML type {id}"))?;
        if let Some(r) = super::routines::routine(f.ty) {
            for t in r.tables {
                if !tables.iter().any(|u| u.name == t.name) {
                    tables.push(t);
                }
            }
        }
        fns += &print(f)?;
        fns += "\n";
    }
    let mut s = String::new();
    for t in tables {
        s += &t.print();
        s += "\n";
    }
    Ok(s + &fns)
}

/// The name of the dequantizer of `t` (`dq_Q4_K`).
pub fn fn_name(t: GgmlType) -> String {
    format!("dq_{}", t.name())
}

/// A C expression of the index `i` (`base + Σ ((i / div) % modulo) * mul`) for
/// `0 <= i < bs`, without the operations that do nothing over that range.
fn index_expr(ix: &Index, bs: usize) -> String {
    let mut parts = Vec::new();
    if ix.base != 0 || ix.terms.is_empty() {
        parts.push(ix.base.to_string());
    }
    for t in ix.terms {
        let mut e = if t.div == 1 {
            "i".to_string()
        } else {
            format!("(i / {})", t.div)
        };
        if bs.div_ceil(t.div.max(1)) > t.modulo {
            e = format!("({e} % {})", t.modulo);
        }
        if t.mul != 1 {
            e = format!("{e} * {}", t.mul);
        }
        parts.push(e);
    }
    parts.join(" + ")
}

/// Reads scalar field `kind` at byte `off` of the block as a `float` expression.
fn scalar(kind: ScalarKind, off: usize) -> String {
    match kind {
        ScalarKind::F32 => format!("*(const GMEM float*)(b + {off})"),
        ScalarKind::F16 => format!("F16_TO_F32(*(const GMEM u16*)(b + {off}))"),
        ScalarKind::BF16 => format!("BF16_TO_F32(*(const GMEM u16*)(b + {off}))"),
    }
}

fn piece(f: &BlockFormat, p: &BitPiece) -> Result<String, String> {
    let field = f
        .field(p.field)
        .ok_or_else(|| format!("{}: no field {}", f.ty.name(), p.field))?;
    let mask = (1u32 << p.width) - 1;
    let bs = f.block_size;
    let shift = index_expr(&p.shift, bs);
    let mut e = format!("(u32)b[{} + {}]", field.offset, index_expr(&p.byte, bs));
    if shift != "0" {
        e = format!("({e} >> ({shift}))");
    }
    e = format!("({e} & {mask}u)");
    if p.at != 0 {
        e = format!("({e} << {})", p.at);
    }
    let mut conds = Vec::new();
    if p.values.0 > 0 {
        conds.push(format!("i >= {}", p.values.0));
    }
    if p.values.1 < bs {
        conds.push(format!("i < {}", p.values.1));
    }
    Ok(if conds.is_empty() {
        e
    } else {
        format!("(({}) ? {e} : 0u)", conds.join(" && "))
    })
}

/// The integer `code` of value `i` as an `i32` expression; a table lookup reads `table`.
fn int_code(f: &BlockFormat, code: &IntCode, table: &str) -> Result<String, String> {
    let raw = code
        .pieces
        .iter()
        .map(|p| piece(f, p))
        .collect::<Result<Vec<_>, _>>()?
        .join(" | ");
    Ok(match code.map {
        IntMap::Offset(0) => format!("(i32)({raw})"),
        IntMap::Offset(k) => format!("((i32)({raw}) + ({k}))"),
        IntMap::Int8 => format!("((i32)(i8)(u8)({raw}))"),
        IntMap::Table(_) => format!("((i32){table}[{raw}])"),
    })
}

fn scalar_field(f: &BlockFormat, name: &str) -> Result<String, String> {
    let field = f
        .field(name)
        .ok_or_else(|| format!("{}: no field {name}", f.ty.name()))?;
    match field.kind {
        FieldKind::Value(k)
        | FieldKind::Scale(k)
        | FieldKind::Min(k)
        | FieldKind::MinScale(k)
        | FieldKind::Sum(k) => Ok(scalar(k, field.offset)),
        _ => Err(format!("{}: field {name} is not a number", f.ty.name())),
    }
}

/// Prints `dq_<TYPE>` for format `f`, with the lookup table it reads (if any) before it.
///
/// # Errors
/// A description naming a field it lacks (a bug in the tables, caught by the tests).
pub fn print(f: &BlockFormat) -> Result<String, String> {
    let name = fn_name(f.ty);
    let table = format!("{name}_table");
    let mut s = String::new();
    writeln!(
        s,
        "// {}: {} values in {} bytes; {}",
        f.ty.name(),
        f.block_size,
        f.type_size,
        f.formula
    )
    .ok();
    let body = match f.decode {
        Decode::Routine => {
            let r = super::routines::routine(f.ty).ok_or_else(|| {
                format!("{}: no routine to print a dequantizer from", f.ty.name())
            })?;
            writeln!(
                s,
                "// Value i of the block as ggml's {} (ggml-quants.c) computes it.",
                r.ggml
            )
            .ok();
            r.body.to_string()
        }
        Decode::Scalar(kind) => {
            let stride = kind.size();
            match kind {
                ScalarKind::F32 => format!("    return *(const GMEM float*)(b + {stride} * i);"),
                ScalarKind::F16 => {
                    format!("    return F16_TO_F32(*(const GMEM u16*)(b + {stride} * i));")
                }
                ScalarKind::BF16 => {
                    format!("    return BF16_TO_F32(*(const GMEM u16*)(b + {stride} * i));")
                }
            }
        }
        Decode::Quantized(r) => {
            let mut tables: Vec<&[i8]> = Vec::new();
            for c in [Some(r.quant), r.sub_scale]
                .into_iter()
                .flatten()
                .chain(match r.min {
                    MinTerm::SubtractScaled { min, .. } => Some(min),
                    _ => None,
                })
            {
                if let IntMap::Table(t) = c.map {
                    tables.push(t);
                }
            }
            if let Some(t) = tables.first() {
                if tables.iter().any(|o| o != t) {
                    return Err(format!("{}: more than one lookup table", f.ty.name()));
                }
                let vals = t.iter().map(|v| v.to_string()).collect::<Vec<_>>();
                writeln!(
                    s,
                    "CONSTANT i8 {table}[{}] = {{{}}};",
                    t.len(),
                    vals.join(", ")
                )
                .ok();
            }
            let mut b = String::new();
            writeln!(b, "    const float d = {};", scalar_field(f, r.d)?).ok();
            writeln!(b, "    const i32 q = {};", int_code(f, &r.quant, &table)?).ok();
            match r.sub_scale {
                Some(sc) => {
                    writeln!(b, "    const i32 sc = {};", int_code(f, &sc, &table)?).ok();
                    writeln!(b, "    const float y = (d * (float)sc) * (float)q;").ok();
                }
                None => {
                    writeln!(b, "    const float y = d * (float)q;").ok();
                }
            }
            match r.min {
                MinTerm::None => write!(b, "    return y;").ok(),
                MinTerm::Add { m } => write!(b, "    return y + {};", scalar_field(f, m)?).ok(),
                MinTerm::SubtractScaled { dmin, min } => write!(
                    b,
                    "    return y - {} * (float){};",
                    scalar_field(f, dmin)?,
                    int_code(f, &min, &table)?
                )
                .ok(),
            };
            b
        }
    };
    writeln!(s, "FN float {name}(const GMEM u8* b, i32 i) {{\n{body}\n}}").ok();
    Ok(s)
}
