//! The text form of a plan (`modelc compile --dump-after PASS`): the shared tables, then per
//! step its arena buffers, its values, and one line per kernel with its op (fused ops joined
//! by `+`), results and sources with shapes and where they live; and the [`Summary`]
//! `modelc compile` prints.
//!
//! ```text
//! plan format=1 n_ctx=256 align=64 tail=pad
//! ; weights: 2 tensors, 209664 bytes
//! weight w0 blk.0.attn_norm.weight F32 {576}
//! weight w1 blk.0.attn_q.weight Q4_1 {576, 576}
//! ; KV caches: 0, 0 bytes
//! step n_tokens=64 n_outputs=64 arena=294912
//! ; 1 kernels, arena 294912 bytes
//! buffer b0 inp_embd 147456 bytes @0
//! buffer b1 Qcur-0 147456 bytes @147456
//! value %0 inp_embd {576, 64} b0
//! value %1 blk.0.attn_norm.weight {576} w0
//! value %2 blk.0.attn_q.weight Q4_1 {576, 576} w1
//! value %3 Qcur-0 {576, 64} b1
//! input data: inp_embd {576, 64} @A+0
//! k0 rms_norm+mul+mul_mat Qcur-0 {576, 64} @A+147456 = (inp_embd {576, 64} @A+0, blk.0.attn_norm.weight {576} W, blk.0.attn_q.weight Q4_1 {576, 576} W) [eps=1e-5] nodes=[norm-0, attn_norm-0, Qcur-0]
//! output Qcur-0 {576, 64} @A+147456
//! ```
//!
//! - `plan format=F n_ctx=N align=A tail=pad`: the plan's settings.
//! - `target JSON` (right after it, when a target annotated the plan): what the kernels were
//!   chosen for ([`super::Plan::target`]).
//! - `weight wI NAME DTYPE SHAPE` and `kv kvI NAME DTYPE SHAPE K|V layer=L [window=W]`: the tables,
//!   numbered in order.
//! - `step n_tokens=N n_outputs=M arena=BYTES`, then the step's lines:
//!   - `buffer bI NAME BYTES bytes [@OFFSET]` (no offset before `plan-memory`);
//!   - `value %I NAME [DTYPE] SHAPE BASE[+OFFSET] [nb=[…]]`: BASE is `bI`, `wI` or `kvI`;
//!     `nb` is written when the strides are not the dense ones of the shape; the dtype when
//!     it is not F32;
//!   - `input KIND: OPERAND`, `output OPERAND`: the step's inputs and outputs in order;
//!   - `kI OP RESULTS = (SOURCES) [PARAMS] [name=NAME] [nodes=[…]] [target=JSON]`: a kernel.
//!     `name=` is written when the kernel's name is not its first result's, `nodes=` when
//!     they are not just that name, `target=` when a target annotated the kernel.
//! - An operand is a value, by name (`%I` when the step has several values of that name),
//!   followed by its type and place: `NAME [DTYPE] SHAPE LOC [nb=[…]]` with LOC `@A+OFF`
//!   (arena byte offset, once planned), `@bI[+OFF]` (buffer `I`, before), `W[+OFF]` (a
//!   weight) or `KV[+OFF]` (a KV cache); `nb` when the value is not contiguous. The reader
//!   checks that part against the value and accepts an operand written as its name alone.
//! - `;` starts a comment (the totals are printed as comments).
//!
//! [`super::parse_plan`] reads this form back into an equal plan.

use super::kernel::KernelOp;
use super::types::{Base, Kernel, Plan, Step, Value, ValueId};
use crate::graph::{contiguous_nb, DType, Shape, MAX_DIMS};
use crate::text::{input_kind, list, name};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// `+OFF`, or nothing for 0.
fn plus(off: u64) -> String {
    if off == 0 {
        String::new()
    } else {
        format!("+{off}")
    }
}

/// Where an operand lives, as an operand writes it: `@A+OFF`, `@bI[+OFF]`, `W[+OFF]`,
/// `KV[+OFF]`.
fn location(s: &Step, v: &Value) -> String {
    match v.base {
        Base::Arena(b) => match s
            .buffers
            .get(b.index())
            .and_then(|x| x.offset)
            .and_then(|o| o.checked_add(v.offset))
        {
            Some(o) => format!("@A+{o}"),
            None => format!("@b{}{}", b.0, plus(v.offset)),
        },
        Base::Weight(_) => format!("W{}", plus(v.offset)),
        Base::Kv(_) => format!("KV{}", plus(v.offset)),
    }
}

/// The part of an operand after its name: `[DTYPE] SHAPE LOC [nb=[…]]`.
pub(crate) fn annotation_text(
    dtype: DType,
    shape: &Shape,
    loc: &str,
    nb: Option<&[u64; MAX_DIMS]>,
) -> String {
    let mut out = String::new();
    if dtype != DType::F32 {
        out += &format!("{dtype} ");
    }
    out += &format!("{shape} {loc}");
    if let Some(nb) = nb {
        out += &format!(" nb={}", list(nb));
    }
    out
}

/// The annotation of value `v` of step `s`.
pub(crate) fn annotation(s: &Step, v: &Value) -> String {
    let nb = (!v.is_contiguous()).then_some(&v.nb);
    annotation_text(v.dtype, &v.shape, &location(s, v), nb)
}

/// Number of values of each name in a step (a name used once is written as the reference).
pub(crate) fn name_counts(s: &Step) -> HashMap<&str, usize> {
    let mut m = HashMap::new();
    for v in &s.values {
        *m.entry(v.name.as_str()).or_insert(0) += 1;
    }
    m
}

/// An operand: reference and annotation.
fn operand(s: &Step, counts: &HashMap<&str, usize>, id: ValueId) -> String {
    match s.values.get(id.index()) {
        Some(v) if counts.get(v.name.as_str()) == Some(&1) => {
            format!("{} {}", name(&v.name), annotation(s, v))
        }
        Some(v) => format!("%{} {}", id.0, annotation(s, v)),
        None => format!("%{}", id.0),
    }
}

/// The name a kernel has when its line gives no `name=`: its first result's.
pub(crate) fn default_kernel_name<'s>(s: &'s Step, k: &Kernel) -> Option<&'s str> {
    k.dsts
        .first()
        .and_then(|d| s.values.get(d.index()))
        .map(|v| v.name.as_str())
}

/// The parameters of a kernel op, as its line writes them in `[…]`.
pub(crate) fn params(op: &KernelOp) -> String {
    match op {
        KernelOp::Op(o) => o.params(),
        KernelOp::RmsNormMul { eps } => format!("eps={eps:e}"),
        KernelOp::MulMat(m) => m.norm.map(|e| format!("eps={e:e}")).unwrap_or_default(),
        KernelOp::RopeKvStore(r) => {
            let mut p = r.rope.params();
            if r.freq_factors {
                p += " freq_factors";
            }
            p
        }
    }
}

/// A sum that stops at `u64::MAX` (the printer must not panic on any plan).
fn total(bytes: impl Iterator<Item = Option<u64>>) -> u64 {
    bytes.flatten().fold(0u64, u64::saturating_add)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "step n_tokens={} n_outputs={} arena={}",
            self.n_tokens, self.n_outputs, self.arena_bytes
        )?;
        writeln!(
            f,
            "; {} kernels, arena {} bytes{}",
            self.kernels.len(),
            self.arena_bytes,
            if self.is_planned() {
                ""
            } else {
                " (not planned)"
            }
        )?;
        for (i, b) in self.buffers.iter().enumerate() {
            write!(f, "buffer b{i} {} {} bytes", name(&b.name), b.bytes)?;
            if let Some(o) = b.offset {
                write!(f, " @{o}")?;
            }
            writeln!(f)?;
        }
        for (i, v) in self.values.iter().enumerate() {
            write!(f, "value %{i} {} ", name(&v.name))?;
            if v.dtype != DType::F32 {
                write!(f, "{} ", v.dtype)?;
            }
            let base = match v.base {
                Base::Arena(b) => format!("b{}", b.0),
                Base::Weight(w) => format!("w{}", w.0),
                Base::Kv(c) => format!("kv{}", c.0),
            };
            write!(f, "{} {base}{}", v.shape, plus(v.offset))?;
            if v.nb != contiguous_nb(v.dtype, &v.shape) {
                write!(f, " nb={}", list(&v.nb))?;
            }
            writeln!(f)?;
        }
        let counts = name_counts(self);
        for i in &self.inputs {
            writeln!(
                f,
                "input {}: {}",
                input_kind(&i.kind),
                operand(self, &counts, i.value)
            )?;
        }
        for (k, kernel) in self.kernels.iter().enumerate() {
            let dsts: Vec<String> = kernel
                .dsts
                .iter()
                .map(|d| operand(self, &counts, *d))
                .collect();
            let srcs: Vec<String> = kernel
                .srcs
                .iter()
                .map(|s| operand(self, &counts, *s))
                .collect();
            write!(f, "k{k} {}", kernel.op.name())?;
            if !dsts.is_empty() {
                write!(f, " {}", dsts.join(", "))?;
            }
            write!(f, " = ({})", srcs.join(", "))?;
            let p = params(&kernel.op);
            if !p.is_empty() {
                write!(f, " [{p}]")?;
            }
            if default_kernel_name(self, kernel) != Some(kernel.name.as_str()) {
                write!(f, " name={}", name(&kernel.name))?;
            }
            if kernel.nodes.len() != 1 || kernel.nodes[0] != kernel.name {
                let nodes: Vec<String> = kernel.nodes.iter().map(|n| name(n)).collect();
                write!(f, " nodes=[{}]", nodes.join(", "))?;
            }
            if let Some(t) = &kernel.target {
                write!(f, " target={t}")?;
            }
            writeln!(f)?;
        }
        for o in &self.outputs {
            writeln!(f, "output {}", operand(self, &counts, *o))?;
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = match self.tail {
            super::TailPolicy::Pad => "pad",
        };
        writeln!(
            f,
            "plan format={} n_ctx={} align={} tail={tail}",
            self.format, self.n_ctx, self.align
        )?;
        if let Some(t) = &self.target {
            writeln!(f, "target {t}")?;
        }
        writeln!(
            f,
            "; weights: {} tensors, {} bytes",
            self.weights.len(),
            total(self.weights.iter().map(|w| w.bytes()))
        )?;
        for (i, w) in self.weights.iter().enumerate() {
            writeln!(f, "weight w{i} {} {} {}", name(&w.name), w.dtype, w.shape)?;
        }
        writeln!(
            f,
            "; KV caches: {}, {} bytes",
            self.kv.len(),
            total(self.kv.iter().map(|c| c.bytes()))
        )?;
        for (i, c) in self.kv.iter().enumerate() {
            writeln!(
                f,
                "kv kv{i} {} {} {} {:?} layer={}{}",
                name(&c.name),
                c.dtype,
                c.shape,
                c.kind,
                c.layer,
                c.window.map_or(String::new(), |w| format!(" window={w}"))
            )?;
        }
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
    /// With sliding-window caches kept as rings ([`Plan::kv_layout_ring`], the backends'
    /// default): how many caches are rings, their cells, and the bytes of all caches then.
    pub kv_rings: Option<(usize, u64, u64)>,
    /// Number of weight tensors.
    pub weights: usize,
    /// Bytes of all weights.
    pub weight_bytes: u64,
}

impl Plan {
    /// The sliding-window caches' ring figures of [`Summary::kv_rings`], if the plan has
    /// any (`None` too if the layout cannot be computed: the summary then shows full sizes).
    fn kv_rings(&self) -> Option<(usize, u64, u64)> {
        let n_ctx = u64::from(self.n_ctx);
        let ring = self.kv_layout_ring(n_ctx, self.ring_ubatch()).ok()?;
        let rings: Vec<u64> = ring
            .caches
            .iter()
            .filter(|c| c.is_ring(n_ctx))
            .map(|c| c.n_cells)
            .collect();
        let cells = *rings.first()?;
        Some((rings.len(), cells, ring.stream_bytes))
    }

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
            kv_rings: self.kv_rings(),
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
        match self.kv_rings {
            Some((rings, cells, bytes)) => writeln!(
                f,
                "KV cache: {} caches × {} cells, {rings} of them sliding-window rings of {cells} \
                 cells: {} ({bytes} bytes; --swa-full: {})",
                self.kv_caches,
                self.n_ctx,
                mib(bytes),
                mib(self.kv_bytes),
            )?,
            None => writeln!(
                f,
                "KV cache: {} caches × {} cells, {} ({} bytes)",
                self.kv_caches,
                self.n_ctx,
                mib(self.kv_bytes),
                self.kv_bytes
            )?,
        }
        writeln!(
            f,
            "weights: {} tensors, {} ({} bytes)",
            self.weights,
            mib(self.weight_bytes),
            self.weight_bytes
        )
    }
}
