//! The text form of a graph: one line per tensor in [`Graph::tensors`] order, an input's
//! declaration or the node computing it, like llama.cpp's eval-callback log
//! (`ggml_debug: attn_norm-0 = (f32) MUL(norm-0{576, 7}, blk.0.attn_norm.weight{576}) = {576, 7}`).
//!
//! ```text
//! input inp_tokens: I32 {7} tokens
//! input token_embd.weight: Q8_0 {576, 49152} weight
//! inp_embd = (F32) get_rows(token_embd.weight {576, 49152}, inp_tokens {7}) = {576, 7}
//! input blk.0.attn_norm.weight: F32 {576} weight
//! norm-attn_norm-0 = (F32) rms_norm(inp_embd {576, 7}) = {576, 7} [eps=1e-5]
//! attn_norm-0 = (F32) mul(norm-attn_norm-0 {576, 7}, blk.0.attn_norm.weight {576}) = {576, 7}
//! outputs: attn_norm-0
//! ```
//!
//! - `input NAME: DTYPE SHAPE KIND`, KIND one of `tokens`, `positions`, `output ids`,
//!   `weight`, `data`, `K cache of layer N`, `V cache of layer N`.
//! - `NAME = (DTYPE) OP(SRC SHAPE, …) = SHAPE [PARAMS]`: the result's dtype and shape, the
//!   op's ggml name, each source with its shape, every parameter of the op ([`Op::params`]).
//! - `outputs: NAME, …`: [`Graph::outputs`] in order.
//!
//! A source names the latest tensor of that name above its line; one that cannot be named so
//! (a shadowed name, a tensor defined further down) is written by index, `%12`. Names are
//! quoted when they are not plain words ([`crate::text::name`]). A tensor whose recorded
//! contiguity is not what its op gives ends with `contiguous=true|false` (never in a
//! verified graph). [`super::parse_graph`] reads this form back into an equal graph.

use super::graph::{Def, Graph, Node};
use super::infer::result_contiguous;
use super::op::Op;
use crate::text::{input_kind, name};
use std::collections::HashMap;
use std::fmt;

/// The contiguity the text form assumes for the result of `node` (tensor `i`), when no
/// `contiguous=` says otherwise: what the op gives its sources, or true where a source is
/// not above the node (an invalid graph).
pub(crate) fn derived_contiguous(g: &Graph, i: usize, node: &Node) -> bool {
    let Some(out) = g.tensors.get(i) else {
        return true;
    };
    let mut types = Vec::with_capacity(node.srcs.len());
    for s in &node.srcs {
        if s.index() >= i {
            return true;
        }
        types.push(g.src_type(*s));
    }
    if types.is_empty() && matches!(node.op, Op::Permute { .. }) {
        return true;
    }
    result_contiguous(&node.op, &types, out.dtype, &out.shape)
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Latest definition of each name above the current line.
        let mut latest: HashMap<&str, usize> = HashMap::new();
        let reference = |latest: &HashMap<&str, usize>, s: usize, at: usize| -> String {
            match self.tensors.get(s) {
                Some(t) if s < at && latest.get(t.name.as_str()) == Some(&s) => name(&t.name),
                _ => format!("%{s}"),
            }
        };
        for (i, t) in self.tensors.iter().enumerate() {
            match &t.def {
                Def::Input(kind) => {
                    write!(
                        f,
                        "input {}: {} {} {}",
                        name(&t.name),
                        t.dtype,
                        t.shape,
                        input_kind(kind)
                    )?;
                    if !t.contiguous {
                        f.write_str(" contiguous=false")?;
                    }
                }
                Def::Node(n) => match self.nodes.get(n.index()) {
                    Some(node) => {
                        write!(f, "{} = ({}) {}(", name(&t.name), t.dtype, node.op.name())?;
                        for (k, s) in node.srcs.iter().enumerate() {
                            if k > 0 {
                                f.write_str(", ")?;
                            }
                            f.write_str(&reference(&latest, s.index(), i))?;
                            if let Some(st) = self.tensors.get(s.index()) {
                                write!(f, " {}", st.shape)?;
                            }
                        }
                        write!(f, ") = {}", t.shape)?;
                        let params = node.op.params();
                        if !params.is_empty() {
                            write!(f, " [{params}]")?;
                        }
                        if t.contiguous != derived_contiguous(self, i, node) {
                            write!(f, " contiguous={}", t.contiguous)?;
                        }
                    }
                    None => write!(
                        f,
                        "; {} is the result of node {}, which does not exist",
                        name(&t.name),
                        n.0
                    )?,
                },
            }
            writeln!(f)?;
            latest.insert(&t.name, i);
        }
        let n = self.tensors.len();
        let outs: Vec<String> = self
            .outputs
            .iter()
            .map(|o| reference(&latest, o.index(), n))
            .collect();
        if outs.is_empty() {
            writeln!(f, "outputs:")
        } else {
            writeln!(f, "outputs: {}", outs.join(", "))
        }
    }
}
