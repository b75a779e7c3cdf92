//! The text form of a graph: one line per node, like llama.cpp's eval-callback log
//! (`ggml_debug: attn_norm-0 = (f32) MUL(norm-0{576, 7}, blk.0.attn_norm.weight{576}) = {576, 7}`).
//!
//! ```text
//! # inputs
//! inp_tokens: I32 {7} tokens
//! blk.0.attn_q.weight: Q4_1 {576, 576} weight
//! # nodes
//! attn_norm-0 = (F32) mul(norm-0 {576, 7}, blk.0.attn_norm.weight {576}) = {576, 7}
//! # outputs: result_output
//! ```

use super::graph::{Def, Graph, Input};
use std::fmt;

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# inputs")?;
        for t in &self.tensors {
            if let Def::Input(kind) = &t.def {
                let k = match kind {
                    Input::Tokens => "tokens".to_string(),
                    Input::Positions => "positions".to_string(),
                    Input::OutputIds => "output ids".to_string(),
                    Input::Weight => "weight".to_string(),
                    Input::KvCache { layer, kind } => format!("{kind:?} cache of layer {layer}"),
                    Input::Data => "data".to_string(),
                };
                writeln!(f, "{}: {} {} {}", t.name, t.dtype, t.shape, k)?;
            }
        }
        writeln!(f, "# nodes")?;
        for node in &self.nodes {
            let out = self.tensor(node.out);
            write!(f, "{} = ({}) {}(", out.name, out.dtype, node.op.name())?;
            for (i, s) in node.srcs.iter().enumerate() {
                let st = self.tensor(*s);
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{} {}", st.name, st.shape)?;
            }
            write!(f, ") = {}", out.shape)?;
            let params = node.op.params();
            if !params.is_empty() {
                write!(f, " [{params}]")?;
            }
            writeln!(f)?;
        }
        let names: Vec<&str> = self
            .outputs
            .iter()
            .map(|o| self.tensor(*o).name.as_str())
            .collect();
        writeln!(f, "# outputs: {}", names.join(", "))
    }
}
