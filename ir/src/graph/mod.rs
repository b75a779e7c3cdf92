//! The typed tensor IR: the graph every pass and backend speaks.
//!
//! A [`Graph`] is a list of [`Tensor`]s (graph inputs: tokens, positions, weights referring
//! to GGUF tensors by name, KV caches; and node results) and [`Node`]s in execution order,
//! each `out = op(srcs...)`. Tensors carry a [`DType`] (F32, F16, BF16, I32, or a GGML block
//! type for weights) and a [`Shape`] written as ggml's `ne`, innermost first. Dimensions are
//! fixed numbers except the KV length, the one symbolic dimension, which has an upper bound
//! (the cache size). The ops ([`Op`]) follow ggml's semantics and conventions (`mul_mat` takes
//! the weight `{K, M}` and the input `{K, N}` and gives `{M, N}`).
//!
//! For later passes: views ([`Op::is_view`]) alias their source; [`Op::KvStore`] updates its
//! cache in place ([`Op::in_place_src`]); every node result is otherwise a fresh buffer of
//! known upper-bound size, so a planner can assign arena offsets from the node order alone.
//!
//! - [`Graph::verify`] checks ids, order and every node's types; errors name the node, the op
//!   and the shapes involved.
//! - `Display` prints the text form: one line per tensor (an input's declaration or the node
//!   computing it, like llama.cpp's eval-callback log), every op parameter included;
//!   [`parse_graph`] (also `str::parse`) reads it back into an equal graph.
//! - serde: the graph serializes as plain data; [`Graph::from_json`] verifies what it reads.

mod dtype;
#[allow(clippy::module_inception)]
mod graph;
mod infer;
mod op;
mod parse;
mod print;
mod shape;
mod verify;

pub use dtype::{DType, KvTypes};
pub use graph::{Def, Graph, Input, KvKind, Node, NodeId, Tensor, TensorId};
pub use infer::{contiguous_nb, infer, SrcType};
pub use op::{AttnParams, Op, RopeMode, RopeParams, VisibleCells};
pub use parse::parse_graph;
pub(crate) use parse::{parse_op, parse_rope};
pub use shape::{Shape, MAX_DIMS};

/// What is wrong with a graph or with a node being added to it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// A node whose sources do not fit its op.
    #[error("{op} {node}: {msg}")]
    Op {
        /// Name of the node's result.
        node: String,
        /// The op's name.
        op: &'static str,
        /// What does not fit, with the shapes and dtypes involved.
        msg: String,
    },
    /// Ids out of range, use before definition, inputs of impossible types.
    #[error("graph structure: {0}")]
    Structure(String),
    /// Malformed serialized graph.
    #[error("graph JSON: {0}")]
    Serde(String),
}
