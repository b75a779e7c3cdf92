//! Pass `specialize`: one graph per compiled ubatch shape.
//!
//! A plan is compiled for a few fixed ubatch sizes (default 1 for decoding and 64 for the
//! prompt; DESIGN.md principle 3): every shape in a step is then a number except the KV
//! length, and the targets put those numbers into the generated code as constants. This pass
//! asks the graph source (an architecture's lowering) for the graph of each size and checks
//! that it can be compiled: it verifies, its token and position inputs have the size's
//! length, its output-row input has the number of logit rows, and its first output is the
//! logits of those rows.
//!
//! Each size gets one logit row (generation: the runtime points it at the last real token)
//! or, with `all_logits`, one row per token (perplexity, teacher forcing, tests).
//!
//! The last chunk of a prompt is **padded**, not masked: it runs the step of the smallest
//! compiled size that holds it, with padding tokens at the following positions, and only the
//! real rows are read ([`ir::plan::schedule`] gives the rule and why padding changes no real
//! row). Masking would make the token count a runtime value in every kernel; padding keeps
//! every shape constant, and the runtime's choice of sizes bounds the wasted work.

use super::{CompileOptions, PassError};
use ir::graph::{DType, Graph, Input};
use ir::interp::{GraphRequest, GraphSource};

/// The shape a step is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepShape {
    /// Tokens per ubatch.
    pub n_tokens: u32,
    /// Rows that produce logits.
    pub n_outputs: u32,
}

/// The verified graph of each compiled shape, in increasing `(n_tokens, n_outputs)`.
///
/// # Errors
/// [`PassError::Options`] for no ubatch size, a size of 0 or above `n_ctx`, or a KV type
/// other than F16 / F32; [`PassError::Graph`] when the source fails or its graph does not
/// verify or has inputs or outputs of the wrong lengths (naming the tensor).
pub fn specialize(
    source: &dyn GraphSource,
    opts: &CompileOptions,
) -> Result<Vec<(StepShape, Graph)>, PassError> {
    let mut sizes = opts.ubatches.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() || sizes[0] == 0 {
        return Err(PassError::Options(format!(
            "ubatch sizes {:?}: need at least one, each ≥ 1",
            opts.ubatches
        )));
    }
    if let Some(&u) = sizes.iter().find(|&&u| u > opts.n_ctx) {
        return Err(PassError::Options(format!(
            "ubatch {u} is larger than n_ctx {}",
            opts.n_ctx
        )));
    }
    opts.kv_types.check().map_err(PassError::Options)?;
    if !opts.align.is_power_of_two() || opts.align < 4 {
        return Err(PassError::Options(format!(
            "arena alignment {} (a power of two ≥ 4)",
            opts.align
        )));
    }
    let mut out = Vec::with_capacity(sizes.len());
    for n_tokens in sizes {
        let shape = StepShape {
            n_tokens,
            n_outputs: if opts.all_logits { n_tokens } else { 1 },
        };
        let bad = |msg: String| PassError::Graph { n_tokens, msg };
        let req = GraphRequest {
            n_tokens,
            n_outputs: shape.n_outputs,
            n_ctx: opts.n_ctx,
            kv_types: opts.kv_types,
        };
        let g = source.build_graph(&req).map_err(bad)?;
        g.verify().map_err(|e| bad(e.to_string()))?;
        check(&g, shape).map_err(bad)?;
        out.push((shape, g));
    }
    Ok(out)
}

/// The input and output lengths of a specialized graph.
fn check(g: &Graph, shape: StepShape) -> Result<(), String> {
    let want = |kind: Input, n: u32, required: bool| -> Result<(), String> {
        match g.find_input(&kind) {
            Some(t) => {
                let t = g.tensor(t);
                if t.shape.ne[0] != n as u64 {
                    return Err(format!(
                        "input {} ({kind:?}) is {} but the step has {n}",
                        t.name, t.shape
                    ));
                }
                Ok(())
            }
            None if required => Err(format!("no {kind:?} input")),
            None => Ok(()),
        }
    };
    want(Input::Tokens, shape.n_tokens, true)?;
    want(Input::Positions, shape.n_tokens, false)?;
    want(Input::OutputIds, shape.n_outputs, false)?;
    let Some(&logits) = g.outputs.first() else {
        return Err("the graph has no output".into());
    };
    let t = g.tensor(logits);
    if t.dtype != DType::F32 || t.shape.has_kv() || t.shape.ne[1] != shape.n_outputs as u64 {
        return Err(format!(
            "first output {} is {} {}, not the logits of {} rows",
            t.name, t.shape, t.dtype, shape.n_outputs
        ));
    }
    Ok(())
}
