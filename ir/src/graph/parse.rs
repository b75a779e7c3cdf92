//! The reader of the graph's text form (the module doc of `print` describes it): the text
//! `Display` writes parses back into an equal [`Graph`], and printing that gives the same
//! text again.
//!
//! The reader checks the syntax, that every name a line uses is defined above it, and that
//! the shapes written next to sources are those sources' shapes; it does not type the
//! nodes (that is [`Graph::verify`]'s job), so an unverified graph survives the round trip
//! too. Tensors are numbered in line order, nodes in the order of their lines.

use super::graph::{Def, Graph, Node, NodeId, Tensor, TensorId};
use super::op::{AttnParams, Op, RopeMode, RopeParams};
use super::print::derived_contiguous;
use super::shape::MAX_DIMS;
use crate::text::{lines, Cursor, Params, ParseError, Tok};
use std::collections::HashMap;

/// Reads a graph from its text form.
///
/// ```
/// let text = "\
/// input inp_tokens: I32 {7} tokens
/// input token_embd.weight: Q8_0 {576, 49152} weight
/// inp_embd = (F32) get_rows(token_embd.weight {576, 49152}, inp_tokens {7}) = {576, 7}
/// norm-attn_norm-0 = (F32) rms_norm(inp_embd {576, 7}) = {576, 7} [eps=1e-5]
/// input blk.0.attn_norm.weight: F32 {576} weight
/// attn_norm-0 = (F32) mul(norm-attn_norm-0 {576, 7}, blk.0.attn_norm.weight {576}) = {576, 7}
/// outputs: attn_norm-0
/// ";
/// let g = ir::graph::parse_graph(text)?;
/// g.verify()?;
/// assert_eq!((g.tensors.len(), g.nodes.len()), (6, 3));
/// assert_eq!(g.to_string(), text);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`ParseError`] with the line and column of the first thing that is not the text form
/// (an unknown op, a missing parameter, a name not defined above, a source written with
/// another shape than it has), saying what was expected there.
pub fn parse_graph(text: &str) -> Result<Graph, ParseError> {
    let mut g = Graph::new();
    let mut latest: HashMap<String, usize> = HashMap::new();
    let mut outputs_line: Option<usize> = None;
    // Shapes written next to sources that were not defined yet (`%N` pointing down).
    let mut pending: Vec<(usize, super::Shape, usize, usize)> = Vec::new();
    for (ln, line) in lines(text) {
        let mut c = Cursor::new(line, ln);
        if c.at_end() {
            continue;
        }
        let (first, second) = (c.peek()?, c.peek2()?);
        match (&first.tok, &second.tok) {
            (Tok::Word("input"), t) if *t != Tok::Punct('=') => {
                c.keyword("input")?;
                let (nm, _) = c.name("the input's name")?;
                c.punct(':')?;
                let dtype = c.dtype()?;
                let shape = c.shape()?;
                let kind = c.input_kind()?;
                let contiguous = contiguity(&mut c)?.unwrap_or(true);
                c.end()?;
                latest.insert(nm.clone(), g.tensors.len());
                g.tensors.push(Tensor {
                    name: nm,
                    dtype,
                    shape,
                    contiguous,
                    def: Def::Input(kind),
                });
            }
            (Tok::Word("outputs"), Tok::Punct(':')) => {
                if let Some(l) = outputs_line {
                    return Err(
                        c.err_at(first.col, format!("outputs are already given on line {l}"))
                    );
                }
                outputs_line = Some(ln);
                c.next()?;
                c.next()?;
                while !c.at_end() {
                    if !g.outputs.is_empty() {
                        c.punct(',')?;
                    }
                    let (id, _) = reference(&mut c, &latest, "an output's name")?;
                    g.outputs.push(TensorId(id as u32));
                }
            }
            _ => {
                let i = g.tensors.len();
                let (nm, _) =
                    c.name("a node (`NAME = (DTYPE) op(…) = SHAPE`), `input` or `outputs:`")?;
                c.punct('=')?;
                c.punct('(')?;
                let dtype = c.dtype()?;
                c.punct(')')?;
                let (op_name, op_col) = c.word("an op name (get_rows, mul_mat, rope, …)")?;
                c.punct('(')?;
                let mut srcs = Vec::new();
                while !c.eat_punct(')')? {
                    if !srcs.is_empty() {
                        c.punct(',')?;
                    }
                    let (id, col) = reference(&mut c, &latest, "a source's name")?;
                    if c.is_punct('{')? {
                        let shape = c.shape()?;
                        match g.tensors.get(id) {
                            Some(t) if t.shape != shape => {
                                return Err(c.err_at(
                                    col,
                                    format!(
                                        "source {} is written as {shape} but is {}",
                                        crate::text::name(&t.name),
                                        t.shape
                                    ),
                                ))
                            }
                            Some(_) => {}
                            None => pending.push((id, shape, ln, col)),
                        }
                    }
                    srcs.push(TensorId(id as u32));
                }
                c.punct('=')?;
                let shape = c.shape()?;
                let mut params = Params::read(&mut c)?;
                let op = parse_op(op_name, op_col, &mut params, ln)?;
                let contiguous = contiguity(&mut c)?;
                c.end()?;
                let node = Node {
                    op,
                    srcs,
                    out: TensorId(i as u32),
                };
                g.tensors.push(Tensor {
                    name: nm.clone(),
                    dtype,
                    shape,
                    contiguous: true,
                    def: Def::Node(NodeId(g.nodes.len() as u32)),
                });
                let contiguous = contiguous.unwrap_or_else(|| derived_contiguous(&g, i, &node));
                g.tensors[i].contiguous = contiguous;
                g.nodes.push(node);
                latest.insert(nm, i);
            }
        }
    }
    for (id, shape, ln, col) in pending {
        match g.tensors.get(id) {
            Some(t) if t.shape == shape => {}
            Some(t) => {
                return Err(ParseError::new(
                    ln,
                    col,
                    format!("source %{id} is written as {shape} but is {}", t.shape),
                ))
            }
            None => {
                return Err(ParseError::new(
                    ln,
                    col,
                    format!(
                        "source %{id} is written with a shape but the graph has {} tensors",
                        g.tensors.len()
                    ),
                ))
            }
        }
    }
    Ok(g)
}

impl std::str::FromStr for Graph {
    type Err = ParseError;
    /// [`parse_graph`].
    fn from_str(s: &str) -> Result<Graph, ParseError> {
        parse_graph(s)
    }
}

/// An optional `contiguous=true|false` at the end of a line.
fn contiguity(c: &mut Cursor<'_>) -> Result<Option<bool>, ParseError> {
    if !c.eat_keyword("contiguous")? {
        return Ok(None);
    }
    c.punct('=')?;
    match c.word("true or false")?.0 {
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        _ => Err(c.expected("true or false")),
    }
}

/// A tensor reference: `%N`, or a name defined above (its latest definition). Returns the
/// index and the column.
fn reference(
    c: &mut Cursor<'_>,
    latest: &HashMap<String, usize>,
    what: &str,
) -> Result<(usize, usize), ParseError> {
    let t = c.peek()?;
    if let Tok::Word(w) = t.tok {
        if let Some(num) = w.strip_prefix('%') {
            let id = num.parse::<u32>().map_err(|_| {
                c.err_at(
                    t.col,
                    format!("expected a tensor index like %12, found `{w}`"),
                )
            })?;
            c.next()?;
            return Ok((id as usize, t.col));
        }
    }
    let (nm, col) = c.name(what)?;
    match latest.get(&nm) {
        Some(&i) => Ok((i, col)),
        None => Err(c.err_at(
            col,
            format!(
                "no tensor named {} is defined above this line",
                crate::text::name(&nm)
            ),
        )),
    }
}

/// The op named `name` (as [`Op::name`] writes it) with the parameters [`Op::params`]
/// writes; `col` and `line` locate the name for errors.
pub(crate) fn parse_op(
    name: &str,
    col: usize,
    p: &mut Params<'_>,
    line: usize,
) -> Result<Op, ParseError> {
    let op = match name {
        "get_rows" => Op::GetRows,
        "rms_norm" => Op::RmsNorm {
            eps: p.num("eps", name)?,
        },
        "norm" => Op::Norm {
            eps: p.num("eps", name)?,
        },
        "add" => Op::Add,
        "mul" => Op::Mul,
        "scale" => Op::Scale {
            s: p.num("s", name)?,
        },
        "mul_mat" => Op::MulMat,
        "rope" => Op::Rope(parse_rope(p, name)?),
        "kv_store" => Op::KvStore,
        "attention" => Op::Attention(AttnParams {
            kq_scale: p.num("kq_scale", name)?,
            softcap: p.opt_num("softcap")?,
            window: p.opt_num("window")?,
            causal: !p.flag("non-causal")?,
        }),
        "soft_max" => Op::SoftMax {
            scale: p.num("scale", name)?,
        },
        "silu" => Op::Silu,
        "gelu" => Op::Gelu,
        "tanh" => Op::Tanh,
        "softcap" => Op::SoftCap {
            cap: p.num("cap", name)?,
        },
        "swiglu" => Op::Swiglu,
        "geglu" => Op::Geglu,
        "reshape" => {
            let s = p.shape("ne", name)?;
            if s.has_kv() {
                return Err(p.error(p.col, "reshape's `ne` has no symbolic (kv≤N) dimension"));
            }
            Op::Reshape { ne: s.ne }
        }
        "view" => {
            let shape = p.shape("ne", name)?;
            let nb = p.list("nb", name, MAX_DIMS)?;
            Op::View {
                shape,
                nb: [nb[0], nb[1], nb[2], nb[3]],
                offset: p.num("offset", name)?,
            }
        }
        "permute" => {
            let a = p.list("axes", name, MAX_DIMS)?;
            let mut axes = [0u8; MAX_DIMS];
            for (d, x) in a.iter().enumerate() {
                axes[d] = u8::try_from(*x).map_err(|_| {
                    p.error(p.col, format!("permute axis {x} does not fit a byte"))
                })?;
            }
            Op::Permute { axes }
        }
        "cont" => Op::Cont,
        "hadamard" => Op::Hadamard {
            n: p.num("n", name)?,
        },
        "argsort_top_k" => Op::TopK {
            k: p.num("k", name)?,
        },
        "moe_weights" => Op::MoeWeights {
            scale: p.num("scale", name)?,
            norm: p.flag("norm")?,
        },
        "mul_mat_id" => Op::MulMatId,
        "moe_sum" => Op::MoeSum,
        _ => {
            return Err(ParseError::new(
                line,
                col,
                format!("unknown op `{name}` (ops: get_rows, rms_norm, norm, add, mul, scale, mul_mat, rope, kv_store, attention, soft_max, silu, gelu, tanh, softcap, swiglu, geglu, reshape, view, permute, cont, hadamard, argsort_top_k, moe_weights, mul_mat_id, moe_sum)"),
            ))
        }
    };
    p.finish(name)?;
    Ok(op)
}

/// The rope parameters [`RopeParams::params`] writes.
pub(crate) fn parse_rope(p: &mut Params<'_>, op: &str) -> Result<RopeParams, ParseError> {
    let (mode, col) = p.text("mode", op)?;
    let mode = match mode {
        "norm" => RopeMode::Norm,
        "neox" => RopeMode::Neox,
        _ => {
            return Err(p.error(
                col,
                format!("expected `mode=norm` or `mode=neox`, found `{mode}`"),
            ))
        }
    };
    Ok(RopeParams {
        mode,
        n_rot: p.num("n_rot", op)?,
        freq_base: p.num("freq_base", op)?,
        freq_scale: p.num("freq_scale", op)?,
        n_ctx_orig: p.num("n_ctx_orig", op)?,
        ext_factor: p.num("ext_factor", op)?,
        attn_factor: p.num("attn_factor", op)?,
        beta_fast: p.num("beta_fast", op)?,
        beta_slow: p.num("beta_slow", op)?,
    })
}
