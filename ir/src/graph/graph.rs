//! The graph: tensors (inputs and node results), nodes in execution order, outputs; and the
//! builder methods that type each node as it is added.

use super::dtype::DType;
use super::infer::{infer, result_contiguous, SrcType};
use super::op::{AttnParams, Op, RopeParams};
use super::shape::{Shape, MAX_DIMS};
use super::GraphError;
use serde::{Deserialize, Serialize};

/// Index of a tensor in [`Graph::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorId(pub u32);

/// Index of a node in [`Graph::nodes`] (nodes are stored in execution order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl TensorId {
    /// The index as usize.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    /// The index as usize.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which of the two caches of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvKind {
    /// Keys.
    K,
    /// Values.
    V,
}

/// What feeds a graph input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Input {
    /// The ubatch's token ids, `I32 {n_tokens}` (llama.cpp's `inp_tokens`).
    Tokens,
    /// The position of each token, `I32 {n_tokens}` (`inp_pos`).
    Positions,
    /// Which rows of the ubatch produce logits, `I32 {n_outputs}` (`inp_out_ids`).
    OutputIds,
    /// A weight: the GGUF tensor named like this tensor, read in place (never copied).
    Weight,
    /// The K or V cache of a layer: persistent state, `{n_embd_gqa, n_ctx}` F16 or F32.
    KvCache {
        /// Layer index.
        layer: u32,
        /// Keys or values.
        kind: KvKind,
    },
    /// Any other tensor supplied by the caller by name (tests, pass checks).
    Data,
}

/// Where a tensor comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Def {
    /// A graph input.
    Input(Input),
    /// The result of a node.
    Node(NodeId),
}

/// One tensor of the graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    /// Name: the GGUF name for weights; llama.cpp's callback names for results
    /// (`attn_norm-0`, `Qcur-0`, `result_output`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (ggml `ne`).
    pub shape: Shape,
    /// Whether the elements lie back to back in `ne` order (false for some views).
    pub contiguous: bool,
    /// Input or node result.
    pub def: Def,
}

/// One operation: `out = op(srcs...)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Sources, in the op's order.
    pub srcs: Vec<TensorId>,
    /// The result tensor.
    pub out: TensorId,
}

/// A typed tensor graph for one ubatch size: inputs (tokens, positions, weights, KV caches),
/// nodes in execution order, and the outputs (the logits).
///
/// Every node's sources are defined before it, so `nodes` is a valid execution order. Build
/// with [`Graph::new`] and the op methods (each checks its sources and returns the typed
/// result), check with [`Graph::verify`], print with `Display`, store with serde
/// ([`Graph::from_json`] verifies what it reads).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// All tensors; inputs and results.
    pub tensors: Vec<Tensor>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Result tensors the caller reads (the logits first).
    pub outputs: Vec<TensorId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The tensor `id`. Panics if `id` is not from this graph.
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    /// The type of tensor `id` as the shape rules see it.
    pub fn src_type(&self, id: TensorId) -> SrcType {
        let t = self.tensor(id);
        SrcType {
            dtype: t.dtype,
            shape: t.shape,
            contiguous: t.contiguous,
        }
    }

    /// The first input of kind `kind`, if any.
    pub fn find_input(&self, kind: &Input) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| matches!(&t.def, Def::Input(k) if k == kind))
            .map(|i| TensorId(i as u32))
    }

    /// The tensor named `name`, if any (the first one).
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| TensorId(i as u32))
    }

    fn push_tensor(&mut self, t: Tensor) -> TensorId {
        self.tensors.push(t);
        TensorId(self.tensors.len() as u32 - 1)
    }

    /// Adds an input tensor.
    pub fn input(
        &mut self,
        name: impl Into<String>,
        kind: Input,
        dtype: DType,
        shape: Shape,
    ) -> TensorId {
        self.push_tensor(Tensor {
            name: name.into(),
            dtype,
            shape,
            contiguous: true,
            def: Def::Input(kind),
        })
    }

    /// The weight input for GGUF tensor `name`, added on first use (a tied matrix used twice
    /// is one input).
    pub fn weight(&mut self, name: &str, dtype: DType, shape: Shape) -> TensorId {
        let existing = self
            .tensors
            .iter()
            .position(|t| t.name == name && matches!(t.def, Def::Input(Input::Weight)));
        match existing {
            Some(i) => TensorId(i as u32),
            None => self.input(name, Input::Weight, dtype, shape),
        }
    }

    /// Appends `out = op(srcs)` named `name`, typed by the op's shape rules.
    ///
    /// # Errors
    /// [`GraphError::Op`] naming the node, the op and the source shapes when the sources do
    /// not fit the op; [`GraphError::Structure`] for an id not in this graph.
    pub fn op(
        &mut self,
        name: impl Into<String>,
        op: Op,
        srcs: &[TensorId],
    ) -> Result<TensorId, GraphError> {
        let name = name.into();
        let mut types = Vec::with_capacity(srcs.len());
        for &s in srcs {
            if s.index() >= self.tensors.len() {
                return Err(GraphError::Structure(format!(
                    "node {name}: source {s:?} is not in the graph"
                )));
            }
            types.push(self.src_type(s));
        }
        let (dtype, shape) = infer(&op, &types).map_err(|msg| GraphError::Op {
            node: name.clone(),
            op: op.name(),
            msg,
        })?;
        let contiguous = result_contiguous(&op, &types, dtype, &shape);
        let node = NodeId(self.nodes.len() as u32);
        let out = self.push_tensor(Tensor {
            name,
            dtype,
            shape,
            contiguous,
            def: Def::Node(node),
        });
        self.nodes.push(Node {
            op,
            srcs: srcs.to_vec(),
            out,
        });
        Ok(out)
    }

    /// Marks `t` as a graph output.
    pub fn mark_output(&mut self, t: TensorId) {
        self.outputs.push(t);
    }

    /// Whether any tensor has the symbolic KV dimension.
    pub fn has_kv_dims(&self) -> bool {
        self.tensors.iter().any(|t| t.shape.has_kv())
    }

    /// Reads a graph from JSON and verifies it.
    ///
    /// # Errors
    /// [`GraphError::Serde`] for malformed JSON, or what [`Graph::verify`] finds.
    pub fn from_json(s: &str) -> Result<Graph, GraphError> {
        let g: Graph = serde_json::from_str(s).map_err(|e| GraphError::Serde(e.to_string()))?;
        g.verify()?;
        Ok(g)
    }

    /// The graph as JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Builder shorthands, one per op, named after the ggml functions they stand for.
#[allow(missing_docs)]
impl Graph {
    pub fn get_rows(
        &mut self,
        name: &str,
        table: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::GetRows, &[table, ids])
    }
    pub fn rms_norm(&mut self, name: &str, x: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.op(name, Op::RmsNorm { eps }, &[x])
    }
    pub fn norm(&mut self, name: &str, x: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.op(name, Op::Norm { eps }, &[x])
    }
    pub fn add(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.op(name, Op::Add, &[a, b])
    }
    pub fn mul(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.op(name, Op::Mul, &[a, b])
    }
    pub fn argsort_top_k(
        &mut self,
        name: &str,
        x: TensorId,
        k: u32,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::TopK { k }, &[x])
    }
    pub fn moe_weights(
        &mut self,
        name: &str,
        probs: TensorId,
        ids: TensorId,
        norm: bool,
        scale: f32,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::MoeWeights { norm, scale }, &[probs, ids])
    }
    pub fn mul_mat_id(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::MulMatId, &[a, b, ids])
    }
    pub fn moe_sum(
        &mut self,
        name: &str,
        experts: TensorId,
        weights: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::MoeSum, &[experts, weights])
    }
    pub fn hadamard(&mut self, name: &str, x: TensorId, n: u32) -> Result<TensorId, GraphError> {
        self.op(name, Op::Hadamard { n }, &[x])
    }
    pub fn scale(&mut self, name: &str, x: TensorId, s: f32) -> Result<TensorId, GraphError> {
        self.op(name, Op::Scale { s }, &[x])
    }
    pub fn mul_mat(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::MulMat, &[a, b])
    }
    pub fn rope(
        &mut self,
        name: &str,
        x: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId, GraphError> {
        match freq_factors {
            Some(f) => self.op(name, Op::Rope(p), &[x, pos, f]),
            None => self.op(name, Op::Rope(p), &[x, pos]),
        }
    }
    /// The sliding window of the attention reading each KV cache input (the input's tensor
    /// index → window), found by following each windowed [`Op::Attention`]'s K and V back
    /// through views and the cache store (their source 0) to the cache.
    pub fn cache_windows(&self) -> std::collections::HashMap<usize, u32> {
        let mut out = std::collections::HashMap::new();
        for n in &self.nodes {
            let Op::Attention(p) = &n.op else { continue };
            let Some(w) = p.window else { continue };
            for &src in n.srcs.iter().skip(1).take(2) {
                let mut t = src.index();
                for _ in 0..self.tensors.len() {
                    match &self.tensors[t].def {
                        Def::Input(Input::KvCache { .. }) => {
                            out.insert(t, w);
                            break;
                        }
                        Def::Node(id) => {
                            let m = &self.nodes[id.index()];
                            match (&m.op, m.srcs.first()) {
                                (
                                    Op::View { .. }
                                    | Op::Permute { .. }
                                    | Op::Reshape { .. }
                                    | Op::KvStore,
                                    Some(s),
                                ) => t = s.index(),
                                _ => break,
                            }
                        }
                        Def::Input(_) => break,
                    }
                }
            }
        }
        out
    }

    pub fn kv_store(
        &mut self,
        name: &str,
        cache: TensorId,
        cur: TensorId,
        pos: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::KvStore, &[cache, cur, pos])
    }
    pub fn attention(
        &mut self,
        name: &str,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        pos: TensorId,
        p: AttnParams,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::Attention(p), &[q, k, v, pos])
    }
    pub fn soft_max(
        &mut self,
        name: &str,
        x: TensorId,
        scale: f32,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::SoftMax { scale }, &[x])
    }
    pub fn silu(&mut self, name: &str, x: TensorId) -> Result<TensorId, GraphError> {
        self.op(name, Op::Silu, &[x])
    }
    pub fn gelu(&mut self, name: &str, x: TensorId) -> Result<TensorId, GraphError> {
        self.op(name, Op::Gelu, &[x])
    }
    pub fn softcap(&mut self, name: &str, x: TensorId, cap: f32) -> Result<TensorId, GraphError> {
        self.op(name, Op::SoftCap { cap }, &[x])
    }
    pub fn swiglu(
        &mut self,
        name: &str,
        gate: TensorId,
        up: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::Swiglu, &[gate, up])
    }
    pub fn geglu(
        &mut self,
        name: &str,
        gate: TensorId,
        up: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::Geglu, &[gate, up])
    }
    pub fn reshape(&mut self, name: &str, x: TensorId, ne: &[u64]) -> Result<TensorId, GraphError> {
        if ne.len() > MAX_DIMS {
            return Err(GraphError::Structure(format!(
                "reshape {name}: {} dims",
                ne.len()
            )));
        }
        self.op(
            name,
            Op::Reshape {
                ne: Shape::new(ne).ne,
            },
            &[x],
        )
    }
    pub fn view(
        &mut self,
        name: &str,
        x: TensorId,
        shape: Shape,
        nb: [u64; MAX_DIMS],
        offset: u64,
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::View { shape, nb, offset }, &[x])
    }
    pub fn permute(
        &mut self,
        name: &str,
        x: TensorId,
        axes: [u8; MAX_DIMS],
    ) -> Result<TensorId, GraphError> {
        self.op(name, Op::Permute { axes }, &[x])
    }
    pub fn cont(&mut self, name: &str, x: TensorId) -> Result<TensorId, GraphError> {
        self.op(name, Op::Cont, &[x])
    }
}
