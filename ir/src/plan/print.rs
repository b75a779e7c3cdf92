//! The text form of a plan (`modelc graph --plan`): one line per kernel with its op (fused
//! ops joined by `+`), results and sources with shapes and where they live; and the
//! [`Summary`] `modelc compile` prints.
//!
//! ```text
//! # step n_tokens=64 n_outputs=64: 14 kernels, arena 1245184 bytes
//! k1 rms_norm+mul+mul_mat×3 Qcur-0 {256, 64} @A+0, ... = (inp_embd {256, 64} @A+65536, blk.0.attn_norm.weight {256} W, ...) [eps=1e-5]
//! ```
//!
//! Locations: `@A+OFF` an arena byte offset, `@bN+OFF` buffer N of an unplanned step, `W` a
//! weight, `KV` a KV cache (`+OFF` when the value starts inside it); ` nb=[…]` follows a
//! value that is not contiguous. The dtype is written when it is not F32.

use super::kernel::KernelOp;
use super::types::{Base, Plan, Step, Value};
use crate::graph::DType;
use std::collections::BTreeMap;
use std::fmt;

fn operand(s: &Step, v: &Value) -> String {
    let mut out = v.name.clone();
    if v.dtype != DType::F32 {
        out += &format!(" {}", v.dtype);
    }
    out += &format!(" {}", v.shape);
    let plus = |off: u64| {
        if off == 0 {
            String::new()
        } else {
            format!("+{off}")
        }
    };
    match v.base {
        Base::Arena(b) => match s.buffers.get(b.index()).and_then(|x| x.offset) {
            Some(o) => out += &format!(" @A+{}", o + v.offset),
            None => out += &format!(" @b{}{}", b.0, plus(v.offset)),
        },
        Base::Weight(_) => out += &format!(" W{}", plus(v.offset)),
        Base::Kv(_) => out += &format!(" KV{}", plus(v.offset)),
    }
    if !v.is_contiguous() {
        out += &format!(" nb={:?}", v.nb);
    }
    out
}

fn params(op: &KernelOp) -> String {
    match op {
        KernelOp::Op(o) => o.params(),
        KernelOp::RmsNormMul { eps } => format!("eps={eps:e}"),
        KernelOp::MulMat(m) => m.norm.map(|e| format!("eps={e:e}")).unwrap_or_default(),
        KernelOp::RopeKvStore(r) => crate::graph::Op::Rope(r.rope).params(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# step n_tokens={} n_outputs={}: {} kernels, arena {} bytes{}",
            self.n_tokens,
            self.n_outputs,
            self.kernels.len(),
            self.arena_bytes,
            if self.is_planned() {
                ""
            } else {
                " (not planned)"
            }
        )?;
        let val = |id: super::ValueId| match self.values.get(id.index()) {
            Some(v) => operand(self, v),
            None => format!("<bad value {}>", id.0),
        };
        for i in &self.inputs {
            writeln!(f, "input {:?}: {}", i.kind, val(i.value))?;
        }
        for (k, kernel) in self.kernels.iter().enumerate() {
            let dsts: Vec<String> = kernel.dsts.iter().map(|d| val(*d)).collect();
            let srcs: Vec<String> = kernel.srcs.iter().map(|s| val(*s)).collect();
            write!(
                f,
                "k{k} {} {} = ({})",
                kernel.op.name(),
                dsts.join(", "),
                srcs.join(", ")
            )?;
            let p = params(&kernel.op);
            if !p.is_empty() {
                write!(f, " [{p}]")?;
            }
            if let Some(t) = &kernel.target {
                write!(f, " target={t}")?;
            }
            writeln!(f)?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| val(*o)).collect();
        writeln!(f, "# outputs: {}", outs.join(", "))
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# plan: n_ctx {}, arena alignment {}, last chunk {:?}",
            self.n_ctx, self.align, self.tail
        )?;
        writeln!(
            f,
            "# weights: {} tensors, {} bytes",
            self.weights.len(),
            self.weight_bytes()
        )?;
        writeln!(
            f,
            "# KV caches: {}, {} bytes",
            self.kv.len(),
            self.kv_bytes()
        )?;
        for s in &self.steps {
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// Totals of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSummary {
    /// Tokens per ubatch.
    pub n_tokens: u32,
    /// Logit rows.
    pub n_outputs: u32,
    /// Kernels.
    pub kernels: usize,
    /// Kernels that compute more than one IR op.
    pub fused_kernels: usize,
    /// Graph nodes the kernels compute (views compute nothing and are not counted).
    pub graph_nodes: usize,
    /// Arena bytes.
    pub arena_bytes: u64,
    /// Kernels per op name, by name.
    pub by_op: BTreeMap<String, usize>,
}

/// What `modelc compile` prints: kernels, fused ops and arena bytes per step, KV and weight
/// bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// One entry per step.
    pub steps: Vec<StepSummary>,
    /// Arena bytes (largest step).
    pub arena_bytes: u64,
    /// Number of KV caches.
    pub kv_caches: usize,
    /// Bytes of all KV caches.
    pub kv_bytes: u64,
    /// KV cache rows.
    pub n_ctx: u32,
    /// Number of weight tensors.
    pub weights: usize,
    /// Bytes of all weights.
    pub weight_bytes: u64,
}

impl Plan {
    /// The totals of this plan.
    pub fn summary(&self) -> Summary {
        let steps = self
            .steps
            .iter()
            .map(|s| {
                let mut by_op = BTreeMap::new();
                for k in &s.kernels {
                    *by_op.entry(k.op.name()).or_insert(0) += 1;
                }
                StepSummary {
                    n_tokens: s.n_tokens,
                    n_outputs: s.n_outputs,
                    kernels: s.kernels.len(),
                    fused_kernels: s.kernels.iter().filter(|k| k.op.is_fused()).count(),
                    graph_nodes: s.kernels.iter().map(|k| k.nodes.len()).sum(),
                    arena_bytes: s.arena_bytes,
                    by_op,
                }
            })
            .collect();
        Summary {
            steps,
            arena_bytes: self.arena_bytes(),
            kv_caches: self.kv.len(),
            kv_bytes: self.kv_bytes(),
            n_ctx: self.n_ctx,
            weights: self.weights.len(),
            weight_bytes: self.weight_bytes(),
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(
                f,
                "ubatch {:>4} ({:>4} outputs): {:>4} kernels ({} fused) for {} graph nodes, arena {} ({} bytes)",
                s.n_tokens,
                s.n_outputs,
                s.kernels,
                s.fused_kernels,
                s.graph_nodes,
                mib(s.arena_bytes),
                s.arena_bytes
            )?;
        }
        if let Some(s) = self.steps.first() {
            let ops: Vec<String> = s.by_op.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            writeln!(f, "kernels of ubatch {}: {}", s.n_tokens, ops.join(", "))?;
        }
        writeln!(
            f,
            "arena: {} ({} bytes)",
            mib(self.arena_bytes),
            self.arena_bytes
        )?;
        writeln!(
            f,
            "KV cache: {} caches × {} cells, {} ({} bytes)",
            self.kv_caches,
            self.n_ctx,
            mib(self.kv_bytes),
            self.kv_bytes
        )?;
        writeln!(
            f,
            "weights: {} tensors, {} ({} bytes)",
            self.weights,
            mib(self.weight_bytes),
            self.weight_bytes
        )
    }
}
