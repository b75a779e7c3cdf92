//! The kernel printer: a plan's steps as sources in the dialect-neutral vocabulary of the
//! crate doc, under a dialect's prelude.
//!
//! Each plan kernel becomes one device kernel named `k<index>_<op>` (`k4_mul_mat_add`),
//! preceded by a comment giving the plan kernel's line (its op, results and sources), so a
//! reader of the source, or of an NVRTC error, finds the plan kernel it came from. A step's
//! source is: the prelude, the shared helpers ([`COMMON`]), the dequantizers of the types the
//! step reads ([`dequant`]), then the kernels in execution order. The output depends only on
//! the plan: printing the same plan twice gives the same bytes.
//!
//! | plan kernel | device kernel |
//! |---|---|
//! | `mul_mat` and its fusions (norm prologue, q/k/v siblings, add / GLU epilogue) | [`matmul`]: a warp per output row, lanes over `K`, up to 8 columns per pass; prompts in tiles (TF32 tensor cores where the [`Target`] has them, f32 otherwise) |
//! | `attention` | [`attention`]: a block per (head, token), warps over the keys, online softmax, merged in shared memory |
//! | `rope`, `kv_store`, `rope+kv_store…` | [`rope`]: a block per token, the roped row staged in shared memory, then stored in the cache's type |
//! | `rms_norm`, `norm`, `rms_norm+mul`, `soft_max` | [`rows`]: a block per row, block reductions |
//! | `hadamard` | [`rows`]: a block per group, butterflies in shared memory |
//! | elementwise ops, `get_rows`, `cont` | [`elementwise`]: a thread per result element |

pub mod attention;
pub mod dequant;
pub mod elementwise;
pub mod emit;
pub mod matmul;
pub mod rope;
pub mod routines;
pub mod rows;

use crate::program::{GpuProgram, Launch, StepProgram, WeightTable};
use emit::{Buf, Val};
use ir::plan::{Base, Kernel, KvLayout, Plan, Step};
use std::collections::BTreeSet;
use std::fmt::Write;

/// A plan the printer cannot generate code for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// A kernel it has no code for; names the step, the plan kernel and what is missing.
    #[error("step n_tokens={n_tokens}: kernel k{kernel} ({name}): {msg}")]
    Unsupported {
        /// The step's ubatch size.
        n_tokens: u32,
        /// Index of the plan kernel.
        kernel: usize,
        /// Its op's name.
        name: String,
        /// What is missing.
        msg: String,
    },
    /// A plan that does not hold together (no memory plan, sizes that overflow).
    #[error("{0}")]
    Plan(String),
}

/// Helpers every step's source carries, after the prelude: SIMD-group reductions (every
/// lane gets the result).
pub const COMMON: &str = r#"
FN float warp_sum(float v) {
    v += SHFL_XOR(v, 16); v += SHFL_XOR(v, 8); v += SHFL_XOR(v, 4);
    v += SHFL_XOR(v, 2); v += SHFL_XOR(v, 1);
    return v;
}
FN float warp_max(float v) {
    v = fmaxf(v, SHFL_XOR(v, 16)); v = fmaxf(v, SHFL_XOR(v, 8)); v = fmaxf(v, SHFL_XOR(v, 4));
    v = fmaxf(v, SHFL_XOR(v, 2)); v = fmaxf(v, SHFL_XOR(v, 1));
    return v;
}
"#;

/// Statements reducing `v` over the block's `nw` warps into `out` (declared by the caller),
/// with `op` (`+` for a sum, `fmaxf` for a maximum) through the kernel's shared array `red`
/// of `nw` floats; every thread gets the result. The first `SYNC` lets a kernel reuse `red`
/// right after a previous reduction. (Printed inline: a Metal helper function cannot
/// declare threadgroup memory, and pointers into it would need an address space CUDA
/// lacks.)
pub fn block_reduce(v: &str, out: &str, nw: u32, max: bool) -> String {
    let (warp, combine) = if max {
        ("warp_max", format!("{out} = fmaxf({out}, red[w]);"))
    } else {
        ("warp_sum", format!("{out} += red[w];"))
    };
    format!(
        "{{ const float r_ = {warp}({v}); SYNC(); if (TX % 32 == 0) red[TX / 32] = r_; SYNC(); \
         {out} = red[0]; for (i32 w = 1; w < {nw}; ++w) {combine} }}"
    )
}

/// What the printer may assume of a target beyond the vocabulary of the crate doc.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The dialect's prelude: every source starts with it.
    pub prelude: &'static str,
    /// Whether kernels may use the tensor-core words `TO_TF32` / `MMA_TF32` (CUDA sm_80
    /// on): prompt products then run on the tensor cores ([`matmul`]). Metal's printer
    /// leaves this off: its kernels keep the f32 tiles.
    pub tensor_cores: bool,
}

/// What one plan kernel printed to.
pub struct Emitted {
    /// The kernel's source (its comment, `KERNEL(...)` and body).
    pub text: String,
    /// Thread blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: u32,
}

/// What the printer of one kernel sees: the plan, the step, where things lie, and the
/// dequantizers it asks for.
pub struct Ctx<'p> {
    /// The plan.
    pub plan: &'p Plan,
    /// The step being printed.
    pub step: &'p Step,
    /// The target printed for.
    pub target: &'p Target,
    /// Index of the kernel being printed.
    pub index: usize,
    /// The device kernel's name.
    pub name: String,
    /// Weight offsets in `wts`.
    pub weights: &'p WeightTable,
    /// KV cache offsets in `kv`.
    pub kv: &'p KvLayout,
    /// GGML ids of the block types whose dequantizers the source must carry.
    pub needs: BTreeSet<u32>,
    /// The operands placed so far, `ops.at[i]` the offset of the `i`-th: each distinct
    /// (buffer, offset) once.
    pub operands: Vec<(Buf, u64)>,
}

impl Ctx<'_> {
    /// The kernel being printed.
    pub fn kernel(&self) -> &Kernel {
        &self.step.kernels[self.index]
    }

    /// An [`CodegenError::Unsupported`] for this kernel.
    pub fn unsupported(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            n_tokens: self.step.n_tokens,
            kernel: self.index,
            name: self.kernel().op.name(),
            msg: msg.into(),
        }
    }

    fn place(&mut self, id: ir::plan::ValueId) -> Result<Val, CodegenError> {
        let v = self
            .step
            .values
            .get(id.index())
            .ok_or_else(|| CodegenError::Plan(format!("value %{} out of range", id.0)))?;
        let (buf, base) = match v.base {
            Base::Arena(b) => {
                let off = self
                    .step
                    .buffers
                    .get(b.index())
                    .and_then(|b| b.offset)
                    .ok_or_else(|| {
                        CodegenError::Plan(format!("buffer of {} has no arena offset", v.name))
                    })?;
                (Buf::Arena, off)
            }
            Base::Weight(w) => {
                (
                    Buf::Wts,
                    *self.weights.offsets.get(w.index()).ok_or_else(|| {
                        CodegenError::Plan(format!("weight of {} unknown", v.name))
                    })?,
                )
            }
            Base::Kv(c) => (
                Buf::Kv,
                self.kv
                    .caches
                    .get(c.index())
                    .ok_or_else(|| CodegenError::Plan(format!("KV cache of {} unknown", v.name)))?
                    .offset,
            ),
        };
        let at = (buf, base + v.offset);
        let slot = match self.operands.iter().position(|o| *o == at) {
            Some(i) => i,
            None => {
                if self.operands.len() == crate::program::MAX_OPERANDS {
                    return Err(self.unsupported("more operands than a kernel takes"));
                }
                self.operands.push(at);
                self.operands.len() - 1
            }
        };
        Ok(Val::new(v, buf, base, slot))
    }

    /// Source `i` of the kernel, placed.
    pub fn src(&mut self, i: usize) -> Result<Val, CodegenError> {
        let id = *self
            .kernel()
            .srcs
            .get(i)
            .ok_or_else(|| self.unsupported(format!("no source {i}")))?;
        self.place(id)
    }

    /// Result `i` of the kernel, placed.
    pub fn dst(&mut self, i: usize) -> Result<Val, CodegenError> {
        let id = *self
            .kernel()
            .dsts
            .get(i)
            .ok_or_else(|| self.unsupported(format!("no result {i}")))?;
        self.place(id)
    }

    /// Cells of the KV cache value `id` is a view of, where that cache is a ring shorter
    /// than the context the kernels are generated for ([`KvLayout`]: position `p` in cell
    /// `p % cells`); `None` for every other value.
    pub fn ring_cells(&self, id: ir::plan::ValueId) -> Option<u64> {
        let Base::Kv(c) = self.step.values.get(id.index())?.base else {
            return None;
        };
        let slot = self.kv.caches.get(c.index())?;
        slot.is_ring(self.kv.n_cells).then_some(slot.n_cells)
    }

    /// [`Ctx::ring_cells`] of source `i`.
    pub fn src_ring(&self, i: usize) -> Option<u64> {
        self.ring_cells(*self.kernel().srcs.get(i)?)
    }

    /// [`Ctx::ring_cells`] of result `i`.
    pub fn dst_ring(&self, i: usize) -> Option<u64> {
        self.ring_cells(*self.kernel().dsts.get(i)?)
    }

    /// The step's positions input (for the KV length and the rope).
    pub fn positions(&mut self) -> Result<Val, CodegenError> {
        let id = self
            .step
            .input(&ir::graph::Input::Positions)
            .ok_or_else(|| self.unsupported("the step has no positions input"))?;
        self.place(id)
    }

    /// The comment line and `KERNEL(name, nt)` header of the kernel.
    pub fn header(&self, nt: u32) -> String {
        let k = self.kernel();
        let mut s = format!("// plan kernel k{}: {} {}", self.index, k.op.name(), k.name);
        if !k.nodes.is_empty() {
            write!(s, " (nodes {})", k.nodes.join(", ")).ok();
        }
        s.retain(|c| c != '\n');
        format!("{s}\nKERNEL({}, {nt})", self.name)
    }
}

/// The device kernel's name for plan kernel `index` with op name `op`: `k<index>_` and the
/// op's name with every non-alphanumeric run as one `_` (`mul_mat×3` → `mul_matx3`).
pub fn kernel_name(index: usize, op: &str) -> String {
    let mut s = format!("k{index}_");
    let mut last_us = true;
    for c in op.chars() {
        let c = if c == '×' { 'x' } else { c };
        if c.is_ascii_alphanumeric() {
            s.push(c);
            last_us = false;
        } else if !last_us {
            s.push('_');
            last_us = true;
        }
    }
    while s.ends_with('_') {
        s.pop();
    }
    s
}

/// Prints plan kernel `ctx.index` (dispatch on its op).
fn emit(ctx: &mut Ctx<'_>) -> Result<Emitted, CodegenError> {
    use ir::graph::Op;
    use ir::plan::KernelOp;
    let op = ctx.kernel().op.clone();
    match &op {
        KernelOp::MulMat(m) => matmul::emit(ctx, Some(*m)),
        KernelOp::Op(Op::MulMat) => matmul::emit(ctx, None),
        KernelOp::RmsNormMul { eps } => rows::emit(ctx, rows::RowOp::RmsNorm(*eps), true),
        KernelOp::Op(Op::RmsNorm { eps }) => rows::emit(ctx, rows::RowOp::RmsNorm(*eps), false),
        KernelOp::Op(Op::Norm { eps }) => rows::emit(ctx, rows::RowOp::Norm(*eps), false),
        KernelOp::Op(Op::SoftMax { scale }) => rows::emit(ctx, rows::RowOp::SoftMax(*scale), false),
        KernelOp::Op(Op::Attention(p)) => attention::emit(ctx, p),
        KernelOp::RopeKvStore(r) => rope::emit_fused(ctx, r),
        KernelOp::Op(Op::Rope(p)) => rope::emit_rope(ctx, p),
        KernelOp::Op(Op::KvStore) => rope::emit_kv_store(ctx),
        KernelOp::Op(Op::GetRows) => elementwise::emit_get_rows(ctx),
        KernelOp::Op(Op::Hadamard { n }) => rows::emit_hadamard(ctx, u64::from(*n)),
        KernelOp::Op(o) => elementwise::emit(ctx, o),
    }
}

/// The kernels of one step, before they are assembled into a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintedStep {
    /// Each distinct kernel's text (helpers, comment, `KERNEL(...)` and body, a blank
    /// line), in order of first use. Plan kernels whose code differs only in their operands'
    /// offsets share one.
    pub kernels: Vec<String>,
    /// GGML ids of the block types whose dequantizers they call.
    pub needs: BTreeSet<u32>,
    /// One launch per plan kernel, in execution order.
    pub launches: Vec<Launch>,
}

/// Prints the kernels of one step for `target`; each kernel's name starts with `prefix`
/// (empty for a source per step; the step's name where the steps share one source, as in
/// Metal).
///
/// # Errors
/// [`CodegenError`].
pub fn print_step(
    target: &Target,
    plan: &Plan,
    step: &Step,
    weights: &WeightTable,
    kv: &KvLayout,
    prefix: &str,
) -> Result<PrintedStep, CodegenError> {
    let mut needs = BTreeSet::new();
    let mut kernels = Vec::with_capacity(step.kernels.len());
    let mut launches = Vec::with_capacity(step.kernels.len());
    // The code of each kernel printed so far (comments dropped, its name made `K`) → name.
    let mut printed: std::collections::HashMap<String, String> = Default::default();
    for (i, k) in step.kernels.iter().enumerate() {
        let mut ctx = Ctx {
            plan,
            step,
            target,
            index: i,
            name: format!("{prefix}{}", kernel_name(i, &k.op.name())),
            weights,
            kv,
            needs: BTreeSet::new(),
            operands: Vec::new(),
        };
        let e = emit(&mut ctx)?;
        needs.extend(ctx.needs);
        let code: String = e
            .text
            .lines()
            .filter(|l| !l.starts_with("//"))
            .map(|l| l.replace(&ctx.name, "K") + "\n")
            .collect();
        let name = match printed.get(&code) {
            Some(n) => n.clone(),
            None => {
                printed.insert(code, ctx.name.clone());
                kernels.push(e.text + "\n");
                ctx.name.clone()
            }
        };
        launches.push(Launch {
            kernel: name,
            plan_kernel: i as u32,
            grid: e.grid,
            block: e.block,
            operands: ctx.operands.iter().map(|o| o.1).collect(),
        });
    }
    Ok(PrintedStep {
        kernels,
        needs,
        launches,
    })
}

/// A complete source: the first line `title`, the prelude, [`COMMON`], the dequantizers of
/// `needs` (and the tables they read: [`dequant::print_all`]), then the kernel texts.
///
/// # Errors
/// A type id without a description (a bug: the printer only asks for described types).
pub fn assemble(
    title: &str,
    prelude: &str,
    needs: &BTreeSet<u32>,
    kernels: &[String],
) -> Result<String, CodegenError> {
    let mut source = format!("// modelc: {title}. Generated; do not edit.\n");
    source += prelude;
    source += COMMON;
    source += "\n";
    source += &dequant::print_all(needs).map_err(CodegenError::Plan)?;
    for k in kernels {
        source += k;
    }
    Ok(source)
}

/// The layout every backend generates against: weights and the KV memory at the plan's
/// `n_ctx`, the sliding-window caches rings sized for ubatches of `ring_ubatch` tokens
/// ([`Plan::kv_layout_ring`]; `None`: full-size caches, llama.cpp's `--swa-full`).
///
/// # Errors
/// Sizes that do not fit; rings sized for a ubatch smaller than a step.
pub fn layout(
    plan: &Plan,
    ring_ubatch: Option<u32>,
) -> Result<(WeightTable, KvLayout), CodegenError> {
    let weights = WeightTable::new(plan).map_err(CodegenError::Plan)?;
    let n = u64::from(plan.n_ctx);
    let kv = match ring_ubatch {
        None => plan.kv_layout(n),
        Some(ub) => {
            let largest = plan.steps.iter().map(|s| s.n_tokens).max().unwrap_or(1);
            if ub < largest {
                return Err(CodegenError::Plan(format!(
                    "KV rings sized for ubatches of {ub} tokens cannot run a step of {largest}"
                )));
            }
            plan.kv_layout_ring(n, ub)
        }
    }
    .map_err(CodegenError::Plan)?;
    Ok((weights, kv))
}

/// Generates the program of every step of `plan` for `target` (`crate::CUDA`), one source
/// per step, its sliding-window caches rings as llama.cpp sizes its SWA cache
/// ([`Plan::ring_ubatch`]): [`generate_with`]`(plan, target, Some(plan.ring_ubatch()))`.
///
/// # Errors
/// [`CodegenError`]: an op or type without a kernel, or a plan without a memory plan.
pub fn generate(plan: &Plan, target: &Target) -> Result<GpuProgram, CodegenError> {
    generate_with(plan, target, Some(plan.ring_ubatch()))
}

/// Generates the program of every step of `plan` for `target` with the KV layout of
/// [`layout`]`(plan, ring_ubatch)`: the KV stores write position `p` at cell `p % cells` of
/// a ring and attention walks a ring's visible cells in cell order.
///
/// # Errors
/// As [`generate`]; rings sized for a ubatch smaller than a step.
pub fn generate_with(
    plan: &Plan,
    target: &Target,
    ring_ubatch: Option<u32>,
) -> Result<GpuProgram, CodegenError> {
    let (weights, kv) = layout(plan, ring_ubatch)?;
    let mut steps = Vec::with_capacity(plan.steps.len());
    for s in &plan.steps {
        let p = print_step(target, plan, s, &weights, &kv, "")?;
        let title = format!(
            "step n_tokens={} n_outputs={}, {} kernels",
            s.n_tokens,
            s.n_outputs,
            s.kernels.len()
        );
        steps.push(StepProgram {
            n_tokens: s.n_tokens,
            n_outputs: s.n_outputs,
            source: assemble(&title, target.prelude, &p.needs, &p.kernels)?,
            launches: p.launches,
        });
    }
    Ok(GpuProgram {
        steps,
        weights,
        kv_cells: u64::from(plan.n_ctx),
        kv_ring_ubatch: ring_ubatch,
        kv_bytes: kv.stream_bytes,
        arena_bytes: plan.arena_bytes(),
    })
}
