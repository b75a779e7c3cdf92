//! The verifier: every id in range, every source defined before its use, every node's dtype
//! and shape what its op's rules give, inputs of sensible types, outputs valid.

use super::dtype::DType;
use super::graph::{Def, Graph, Input, NodeId};
use super::infer::{infer, result_contiguous};
use super::GraphError;

impl Graph {
    /// Checks the whole graph (see the module doc).
    ///
    /// # Errors
    /// The first problem found: [`GraphError::Op`] naming the node, op and shapes for a type
    /// mismatch; [`GraphError::Structure`] for ids, order and inputs.
    pub fn verify(&self) -> Result<(), GraphError> {
        let bad = |m: String| Err(GraphError::Structure(m));
        // Tensor definitions point at the right nodes; inputs have sensible types.
        for (i, t) in self.tensors.iter().enumerate() {
            match &t.def {
                Def::Node(n) => match self.nodes.get(n.index()) {
                    Some(node) if node.out.index() == i => {}
                    _ => {
                        return bad(format!(
                            "tensor {} claims node {:?}, which does not produce it",
                            t.name, n
                        ))
                    }
                },
                Def::Input(kind) => {
                    let ok = match kind {
                        Input::Tokens | Input::Positions | Input::OutputIds => {
                            t.dtype == DType::I32 && t.shape.rank() == 1 && !t.shape.has_kv()
                        }
                        Input::KvCache { .. } => {
                            t.dtype.is_cache_type() && t.shape.rank() <= 2 && !t.shape.has_kv()
                        }
                        Input::Weight | Input::Data => !t.shape.has_kv(),
                    };
                    if !ok {
                        return bad(format!(
                            "input {} ({kind:?}) cannot have type {} {}",
                            t.name, t.shape, t.dtype
                        ));
                    }
                    if !t.contiguous {
                        return bad(format!("input {} must be contiguous", t.name));
                    }
                }
            }
        }
        // Nodes: sources defined earlier, types as the rules give.
        for (ni, node) in self.nodes.iter().enumerate() {
            let Some(out) = self.tensors.get(node.out.index()) else {
                return bad(format!(
                    "node {ni} writes tensor {:?}, not in the graph",
                    node.out
                ));
            };
            if out.def != Def::Node(NodeId(ni as u32)) {
                return bad(format!(
                    "node {ni} writes {}, which another definition owns",
                    out.name
                ));
            }
            let mut types = Vec::with_capacity(node.srcs.len());
            for s in &node.srcs {
                let Some(st) = self.tensors.get(s.index()) else {
                    return bad(format!(
                        "node {} reads tensor {s:?}, not in the graph",
                        out.name
                    ));
                };
                if let Def::Node(src_node) = st.def {
                    if src_node.index() >= ni {
                        return bad(format!(
                            "node {} reads {} before it is computed",
                            out.name, st.name
                        ));
                    }
                }
                types.push(self.src_type(*s));
            }
            let err = |msg: String| GraphError::Op {
                node: out.name.clone(),
                op: node.op.name(),
                msg,
            };
            let (dtype, shape) = infer(&node.op, &types).map_err(err)?;
            if dtype != out.dtype || shape != out.shape {
                return Err(err(format!(
                    "result is recorded as {} {} but the sources give {} {}",
                    out.shape, out.dtype, shape, dtype
                )));
            }
            if result_contiguous(&node.op, &types, dtype, &shape) != out.contiguous {
                return Err(err("recorded contiguity is wrong".into()));
            }
        }
        for o in &self.outputs {
            if o.index() >= self.tensors.len() {
                return bad(format!("output {o:?} is not in the graph"));
            }
        }
        Ok(())
    }
}
