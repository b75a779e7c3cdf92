//! The reader of the plan's text form (the module doc of `print` describes it): the text
//! `Display` writes parses back into an equal [`Plan`], and printing that gives the same
//! text again.
//!
//! The reader checks the syntax, the numbering of the tables (`w0 w1 …`, `b0 …`, `%0 …`,
//! `k0 …`), that every operand names a value of its step and, where the operand's type and
//! place are written, that they are the value's. It does not verify the plan (that is
//! [`Plan::verify`]'s job), so an unverified plan survives the round trip too.

use super::kernel::{Epilogue, KernelOp, MulMatSpec, RopeKvStoreSpec};
use super::print::{annotation, annotation_text, default_kernel_name};
use super::types::{
    Base, Buffer, BufferId, Kernel, KvBuf, KvId, Plan, Step, StepInput, TailPolicy, Value, ValueId,
    WeightBuf, WeightId,
};
use crate::graph::{contiguous_nb, parse_op, parse_rope, DType, Input, KvKind, MAX_DIMS};
use crate::text::{lines, name as quote, Cursor, Params, ParseError, Tok};
use std::collections::HashMap;

/// How a line refers to a value: `%I` or a name.
#[derive(Clone, Debug)]
enum Ref {
    Id(u32),
    Name(String),
}

/// An operand as written: the reference, the annotation (canonical text) if any, where.
#[derive(Clone, Debug)]
struct Operand {
    r: Ref,
    annotation: Option<String>,
    line: usize,
    col: usize,
}

/// A kernel line before its operands are resolved.
struct KernelDraft {
    op: KernelOp,
    dsts: Vec<Operand>,
    srcs: Vec<Operand>,
    name: Option<String>,
    nodes: Option<Vec<String>>,
    target: Option<serde_json::Value>,
    line: usize,
    col: usize,
}

/// A step being read.
struct StepDraft {
    step: Step,
    kernels: Vec<KernelDraft>,
    inputs: Vec<(Input, Operand)>,
    outputs: Vec<Operand>,
}

/// Reads a plan from its text form.
///
/// ```
/// let text = "\
/// plan format=1 n_ctx=256 align=64 tail=pad
/// ; weights: 2 tensors, 209664 bytes
/// weight w0 blk.0.attn_norm.weight F32 {576}
/// weight w1 blk.0.attn_q.weight Q4_1 {576, 576}
/// ; KV caches: 0, 0 bytes
/// step n_tokens=64 n_outputs=64 arena=294912
/// ; 1 kernels, arena 294912 bytes
/// buffer b0 inp_embd 147456 bytes @0
/// buffer b1 Qcur-0 147456 bytes @147456
/// value %0 inp_embd {576, 64} b0
/// value %1 blk.0.attn_norm.weight {576} w0
/// value %2 blk.0.attn_q.weight Q4_1 {576, 576} w1
/// value %3 Qcur-0 {576, 64} b1
/// input data: inp_embd {576, 64} @A+0
/// k0 rms_norm+mul+mul_mat Qcur-0 {576, 64} @A+147456 = (inp_embd {576, 64} @A+0, blk.0.attn_norm.weight {576} W, blk.0.attn_q.weight Q4_1 {576, 576} W) [eps=1e-5] nodes=[norm-0, attn_norm-0, Qcur-0]
/// output Qcur-0 {576, 64} @A+147456
/// ";
/// let plan = ir::plan::parse_plan(text)?;
/// plan.verify()?;
/// assert_eq!(plan.steps[0].kernels[0].nodes.len(), 3);
/// assert_eq!(plan.to_string(), text);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`ParseError`] with the line and column of the first thing that is not the text form
/// (a table entry out of order, an unknown op, a missing parameter, an operand naming no
/// value of its step or written with another type or place than its value has), saying what
/// was expected there.
pub fn parse_plan(text: &str) -> Result<Plan, ParseError> {
    let mut plan: Option<Plan> = None;
    let mut steps: Vec<StepDraft> = Vec::new();
    for (ln, line) in lines(text) {
        let mut c = Cursor::new(line, ln);
        if c.at_end() {
            continue;
        }
        let Some(p) = plan.as_mut() else {
            plan = Some(header(&mut c)?);
            continue;
        };
        let (word, col) =
            c.word("a line of the plan (weight, kv, step, buffer, value, input, kI, output)")?;
        match word {
            "target" if p.weights.is_empty() && p.kv.is_empty() && steps.is_empty() => {
                if p.target.is_some() {
                    return Err(c.err_at(col, "a second `target` line"));
                }
                let (raw, jcol) = c.rest_raw();
                let v: serde_json::Value = serde_json::from_str(raw.trim())
                    .map_err(|e| c.err_at(jcol, format!("target annotation is not JSON: {e}")))?;
                p.target = Some(v);
            }
            "weight" | "kv" if !steps.is_empty() => {
                return Err(c.err_at(col, format!("`{word}` lines come before the first step")));
            }
            "weight" => {
                label(&mut c, "w", p.weights.len())?;
                let (nm, _) = c.name("the weight's GGUF name")?;
                let dtype = c.dtype()?;
                let shape = c.shape()?;
                c.end()?;
                p.weights.push(WeightBuf {
                    name: nm,
                    dtype,
                    shape,
                });
            }
            "kv" => {
                label(&mut c, "kv", p.kv.len())?;
                let (nm, _) = c.name("the KV cache's name")?;
                let dtype = c.dtype()?;
                let shape = c.shape()?;
                let kind = match c.word("K or V")?.0 {
                    "K" => KvKind::K,
                    "V" => KvKind::V,
                    _ => return Err(c.err_at(col, "expected K or V after the cache's shape")),
                };
                let layer = c.key_int("layer")?;
                let window = if c.at_end() {
                    None
                } else {
                    Some(c.key_int("window")?)
                };
                c.end()?;
                p.kv.push(KvBuf {
                    name: nm,
                    layer,
                    kind,
                    dtype,
                    shape,
                    window,
                });
            }
            "step" => {
                let n_tokens = c.key_int("n_tokens")?;
                let n_outputs = c.key_int("n_outputs")?;
                let arena_bytes = c.key_int("arena")?;
                c.end()?;
                steps.push(StepDraft {
                    step: Step {
                        n_tokens,
                        n_outputs,
                        buffers: Vec::new(),
                        values: Vec::new(),
                        kernels: Vec::new(),
                        inputs: Vec::new(),
                        outputs: Vec::new(),
                        arena_bytes,
                    },
                    kernels: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                });
            }
            _ => {
                let Some(d) = steps.last_mut() else {
                    return Err(c.err_at(
                        col,
                        format!("expected `weight`, `kv` or `step`, found `{word}`"),
                    ));
                };
                step_line(&mut c, word, col, d)?;
            }
        }
    }
    let Some(mut plan) = plan else {
        return Err(ParseError::new(
            1,
            1,
            "expected `plan format=… n_ctx=… align=… tail=pad`, found no plan",
        ));
    };
    for d in steps {
        plan.steps.push(resolve(d)?);
    }
    Ok(plan)
}

impl std::str::FromStr for Plan {
    type Err = ParseError;
    /// [`parse_plan`].
    fn from_str(s: &str) -> Result<Plan, ParseError> {
        parse_plan(s)
    }
}

/// `plan format=F n_ctx=N align=A tail=pad`.
fn header(c: &mut Cursor<'_>) -> Result<Plan, ParseError> {
    if !c.eat_keyword("plan")? {
        return Err(c.expected("`plan format=… n_ctx=… align=… tail=pad` first"));
    }
    let format = c.key_int("format")?;
    let n_ctx = c.key_int("n_ctx")?;
    let align = c.key_int("align")?;
    c.keyword("tail")?;
    c.punct('=')?;
    let tail = match c.word("a tail policy (pad)")? {
        ("pad", _) => TailPolicy::Pad,
        (w, col) => return Err(c.err_at(col, format!("expected a tail policy (pad), found `{w}`"))),
    };
    c.end()?;
    Ok(Plan {
        format,
        n_ctx,
        align,
        tail,
        weights: Vec::new(),
        kv: Vec::new(),
        steps: Vec::new(),
        target: None,
    })
}

/// A table label that must be `{prefix}{want}`.
fn label(c: &mut Cursor<'_>, prefix: &str, want: usize) -> Result<(), ParseError> {
    let (w, col) = c.word(&format!("{prefix}{want}"))?;
    if w != format!("{prefix}{want}") {
        return Err(c.err_at(
            col,
            format!("expected {prefix}{want} (entries are numbered in order), found `{w}`"),
        ));
    }
    Ok(())
}

/// `bI`, `wI`, `kvI` with an optional `+OFF`: a value's base and offset.
fn base(w: &str) -> Option<(Base, u64)> {
    let (b, off) = match w.split_once('+') {
        Some((b, o)) => (b, o.parse::<u64>().ok()?),
        None => (w, 0),
    };
    let num = |p: &str| b.strip_prefix(p).and_then(|n| n.parse::<u32>().ok());
    let base = if let Some(n) = num("kv") {
        Base::Kv(KvId(n))
    } else if let Some(n) = num("b") {
        Base::Arena(BufferId(n))
    } else {
        Base::Weight(WeightId(num("w")?))
    };
    Some((base, off))
}

/// One line inside a step, starting with `word` (already read, at `col`).
fn step_line(
    c: &mut Cursor<'_>,
    word: &str,
    col: usize,
    d: &mut StepDraft,
) -> Result<(), ParseError> {
    let s = &mut d.step;
    match word {
        "buffer" => {
            label(c, "b", s.buffers.len())?;
            let (nm, _) = c.name("the buffer's name")?;
            let bytes = c.int("the buffer's size in bytes")?;
            c.keyword("bytes")?;
            let offset = match c.peek()?.tok {
                Tok::Word(w) if w.starts_with('@') => {
                    let (w, col) = c.word("@OFFSET")?;
                    Some(w[1..].parse::<u64>().map_err(|_| {
                        c.err_at(
                            col,
                            format!("expected an arena offset like @4096, found `{w}`"),
                        )
                    })?)
                }
                _ => None,
            };
            c.end()?;
            s.buffers.push(Buffer {
                name: nm,
                bytes,
                offset,
            });
        }
        "value" => {
            label(c, "%", s.values.len())?;
            let (nm, _) = c.name("the value's name")?;
            let dtype = if c.is_punct('{')? {
                DType::F32
            } else {
                c.dtype()?
            };
            let shape = c.shape()?;
            let (w, bcol) = c.word("the value's base (bI, wI or kvI, with +OFFSET)")?;
            let (base, offset) = base(w).ok_or_else(|| {
                c.err_at(
                    bcol,
                    format!("expected the value's base (bI, wI or kvI, with +OFFSET), found `{w}`"),
                )
            })?;
            let nb = if c.eat_keyword("nb")? {
                c.punct('=')?;
                nb_list(c)?
            } else {
                contiguous_nb(dtype, &shape)
            };
            c.end()?;
            s.values.push(Value {
                name: nm,
                dtype,
                shape,
                base,
                offset,
                nb,
            });
        }
        "input" => {
            let kind = c.input_kind()?;
            c.punct(':')?;
            let o = operand(c)?;
            c.end()?;
            d.inputs.push((kind, o));
        }
        "output" => {
            let o = operand(c)?;
            c.end()?;
            d.outputs.push(o);
        }
        w if w.starts_with('k') && w[1..].parse::<usize>().is_ok() => {
            if w[1..] != d.kernels.len().to_string() {
                return Err(c.err_at(
                    col,
                    format!(
                        "expected k{} (kernels are numbered in order), found `{w}`",
                        d.kernels.len()
                    ),
                ));
            }
            let k = kernel(c, col)?;
            d.kernels.push(k);
        }
        _ => {
            return Err(c.err_at(
                col,
                format!("expected buffer, value, input, output or a kernel (kI), found `{word}`"),
            ))
        }
    }
    Ok(())
}

/// `[a, b, c, d]`: byte strides.
fn nb_list(c: &mut Cursor<'_>) -> Result<[u64; MAX_DIMS], ParseError> {
    let col = c.col();
    let v: Vec<u64> = c.int_list("a byte stride")?;
    if v.len() != MAX_DIMS {
        return Err(c.err_at(
            col,
            format!("`nb` needs {MAX_DIMS} strides, found {}", v.len()),
        ));
    }
    Ok([v[0], v[1], v[2], v[3]])
}

/// An operand: `%I` or a name, optionally followed by `[DTYPE] SHAPE LOC [nb=[…]]`.
fn operand(c: &mut Cursor<'_>) -> Result<Operand, ParseError> {
    let t = c.peek()?;
    let r = match t.tok {
        Tok::Word(w) if w.starts_with('%') => {
            let id = w[1..].parse::<u32>().map_err(|_| {
                c.err_at(t.col, format!("expected a value id like %12, found `{w}`"))
            })?;
            c.next()?;
            Ref::Id(id)
        }
        _ => Ref::Name(c.name("a value (its name or %I)")?.0),
    };
    let annotation = match c.peek()?.tok {
        Tok::Word(_) | Tok::Punct('{') => {
            let dtype = if c.is_punct('{')? {
                DType::F32
            } else {
                c.dtype()?
            };
            let shape = c.shape()?;
            let (loc, _) = c.word("where the value lives (@A+OFF, @bI, W, KV)")?;
            let nb = if c.eat_keyword("nb")? {
                c.punct('=')?;
                Some(nb_list(c)?)
            } else {
                None
            };
            Some(annotation_text(dtype, &shape, loc, nb.as_ref()))
        }
        _ => None,
    };
    Ok(Operand {
        r,
        annotation,
        line: c.line,
        col: t.col,
    })
}

/// The rest of a kernel line after its label.
fn kernel(c: &mut Cursor<'_>, col: usize) -> Result<KernelDraft, ParseError> {
    let (op_name, op_col) = c.word("the kernel's op (mul_mat, rms_norm+mul, …)")?;
    let mut dsts = Vec::new();
    while !c.is_punct('=')? {
        if !dsts.is_empty() {
            c.punct(',')?;
        }
        dsts.push(operand(c)?);
    }
    c.punct('=')?;
    c.punct('(')?;
    let mut srcs = Vec::new();
    while !c.eat_punct(')')? {
        if !srcs.is_empty() {
            c.punct(',')?;
        }
        srcs.push(operand(c)?);
    }
    let mut params = Params::read(c)?;
    let op = kernel_op(op_name, op_col, &mut params, c.line)?;
    let name = if c.eat_keyword("name")? {
        c.punct('=')?;
        Some(c.name("the kernel's name")?.0)
    } else {
        None
    };
    let nodes = if c.eat_keyword("nodes")? {
        c.punct('=')?;
        c.punct('[')?;
        let mut v = Vec::new();
        while !c.eat_punct(']')? {
            if !v.is_empty() {
                c.punct(',')?;
            }
            v.push(c.name("a graph node's name")?.0);
        }
        Some(v)
    } else {
        None
    };
    let target = if c.eat_keyword("target")? {
        c.punct('=')?;
        let (raw, jcol) = c.rest_raw();
        let v: serde_json::Value = serde_json::from_str(raw.trim())
            .map_err(|e| c.err_at(jcol, format!("target annotation is not JSON: {e}")))?;
        Some(v)
    } else {
        None
    };
    c.end()?;
    Ok(KernelDraft {
        op,
        dsts,
        srcs,
        name,
        nodes,
        target,
        line: c.line,
        col,
    })
}

/// The kernel op named `name` ([`KernelOp::name`]) with its parameters.
fn kernel_op(
    name: &str,
    col: usize,
    p: &mut Params<'_>,
    line: usize,
) -> Result<KernelOp, ParseError> {
    let bad = |what: &str| ParseError::new(line, col, format!("`{name}`: {what}"));
    if name == "rms_norm+mul" {
        let op = KernelOp::RmsNormMul {
            eps: p.num("eps", name)?,
        };
        p.finish(name)?;
        return Ok(op);
    }
    if let Some(rest) = name.strip_prefix("rope+kv_store") {
        let (q, rest) = match rest.strip_prefix("+rope_q") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let v = match rest {
            "" => false,
            "+kv_store_v" => true,
            _ => return Err(bad("expected rope+kv_store[+rope_q][+kv_store_v]")),
        };
        let rope = parse_rope(p, name)?;
        let freq_factors = p.flag("freq_factors")?;
        p.finish(name)?;
        return Ok(KernelOp::RopeKvStore(RopeKvStoreSpec {
            rope,
            freq_factors,
            q,
            v,
        }));
    }
    if name.contains("mul_mat") && name != "mul_mat" {
        let (norm, rest) = match name.strip_prefix("rms_norm+mul+") {
            Some(r) => (true, r),
            None => (false, name),
        };
        let Some(rest) = rest.strip_prefix("mul_mat") else {
            return Err(bad(
                "expected [rms_norm+mul+]mul_mat[×N][+add|+swiglu|+geglu]",
            ));
        };
        let (n_mat, rest) = match rest.strip_prefix('×') {
            Some(r) => {
                let end = r.find('+').unwrap_or(r.len());
                let n = r[..end]
                    .parse::<u8>()
                    .map_err(|_| bad("expected the number of weights after ×"))?;
                (n, &r[end..])
            }
            None => (1, rest),
        };
        let epilogue = match rest {
            "" => Epilogue::None,
            "+add" => Epilogue::Add,
            "+swiglu" => Epilogue::Swiglu,
            "+geglu" => Epilogue::Geglu,
            _ => {
                return Err(bad(
                    "expected [rms_norm+mul+]mul_mat[×N][+add|+swiglu|+geglu]",
                ))
            }
        };
        let norm = if norm {
            Some(p.num("eps", name)?)
        } else {
            None
        };
        p.finish(name)?;
        return Ok(KernelOp::MulMat(MulMatSpec {
            norm,
            n_mat,
            epilogue,
        }));
    }
    Ok(KernelOp::Op(parse_op(name, col, p, line)?))
}

/// The step of a draft, operands resolved to value ids and checked.
fn resolve(d: StepDraft) -> Result<Step, ParseError> {
    let mut step = d.step;
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, v) in step.values.iter().enumerate() {
        by_name.entry(v.name.as_str()).or_default().push(i);
    }
    let id_of = |o: &Operand| -> Result<ValueId, ParseError> {
        let id = match &o.r {
            Ref::Id(i) => *i as usize,
            Ref::Name(n) => match by_name.get(n.as_str()).map(|v| v.as_slice()) {
                Some([i]) => *i,
                Some(several) => {
                    let ids: Vec<String> = several.iter().map(|i| format!("%{i}")).collect();
                    return Err(ParseError::new(
                        o.line,
                        o.col,
                        format!(
                            "several values are named {} ({}): write the one meant by its id",
                            quote(n),
                            ids.join(", ")
                        ),
                    ));
                }
                None => {
                    return Err(ParseError::new(
                        o.line,
                        o.col,
                        format!(
                            "no value of step n_tokens={} is named {}",
                            step.n_tokens,
                            quote(n)
                        ),
                    ))
                }
            },
        };
        if let Some(a) = &o.annotation {
            let Some(v) = step.values.get(id) else {
                return Err(ParseError::new(
                    o.line,
                    o.col,
                    format!(
                        "value %{id} does not exist (the step has {} values)",
                        step.values.len()
                    ),
                ));
            };
            let want = annotation(&step, v);
            if *a != want {
                return Err(ParseError::new(
                    o.line,
                    o.col,
                    format!(
                        "operand {} is written as `{a}` but the value is `{want}`",
                        quote(&v.name)
                    ),
                ));
            }
        }
        Ok(ValueId(id as u32))
    };
    let mut inputs = Vec::with_capacity(d.inputs.len());
    for (kind, o) in &d.inputs {
        inputs.push(StepInput {
            kind: kind.clone(),
            value: id_of(o)?,
        });
    }
    let mut outputs = Vec::with_capacity(d.outputs.len());
    for o in &d.outputs {
        outputs.push(id_of(o)?);
    }
    let mut kernels = Vec::with_capacity(d.kernels.len());
    for k in d.kernels {
        let dsts = k.dsts.iter().map(id_of).collect::<Result<Vec<_>, _>>()?;
        let srcs = k.srcs.iter().map(id_of).collect::<Result<Vec<_>, _>>()?;
        let mut kernel = Kernel {
            name: String::new(),
            op: k.op,
            srcs,
            dsts,
            nodes: Vec::new(),
            target: k.target,
        };
        kernel.name = match k.name {
            Some(n) => n,
            None => match default_kernel_name(&step, &kernel) {
                Some(n) => n.to_string(),
                None => {
                    return Err(ParseError::new(
                        k.line,
                        k.col,
                        "a kernel without results needs `name=`",
                    ))
                }
            },
        };
        kernel.nodes = k.nodes.unwrap_or_else(|| vec![kernel.name.clone()]);
        kernels.push(kernel);
    }
    step.inputs = inputs;
    step.outputs = outputs;
    step.kernels = kernels;
    Ok(step)
}
