//! The CPU executor of an [`ir::plan::Plan`]: [`CompiledPlan`] compiles every kernel of every
//! step at load time, allocates the arena once, and runs a step's kernels in order on a
//! persistent thread pool. The KV caches are not its own: each step is handed the KV memory
//! of the sequence it computes (one stream laid out as [`Plan::kv_layout`] says), which the
//! runtime's session owns, clears and truncates.
//!
//! Loading ([`CompiledPlan::load`]):
//! 1. the plan is verified; the arena ([`Plan::arena_bytes`]) is allocated, zeroed; the KV
//!    layout is computed for the context asked for (at most the plan's `n_ctx`: a smaller
//!    context needs no new plan);
//! 2. each kernel is lowered (module `lower`): operands become pointers with checked extents;
//!    matmul weights are repacked into the kernels' layout ([`crate::layout`]), the
//!    embedding table is read in place from the mapped file, small f32 weights are copied;
//! 3. one Cranelift module is generated with a matmul kernel per distinct shape
//!    ([`crate::matmul::define_matmul`]) and finalized; the other kernels
//!    ([`crate::handwritten`]: norms, rope, attention, elementwise, get_rows) are plain Rust with
//!    AVX2 paths, chosen at run time.
//!
//! Running ([`CompiledPlan::step`]): the caller's token ids, positions and output rows are
//! checked and written into the arena, and the ops that read or write the KV caches are
//! pointed at the caller's stream; one job on the [`ThreadPool`] runs the ops in order on
//! every thread, each op phase cut into chunks (row groups of a matmul, tokens, heads, rows)
//! that the threads take from a shared counter (module `sync`); the logits are a slice of the
//! arena. Nothing is allocated while a step runs.
//!
//! Numerics follow llama.cpp's CPU backend on x86-64 (AVX2): activations are converted to the
//! weight type's `vec_dot_type` before each product (Q8_1 for Q4_1, Q8_0 for Q8_0 / Q4_0);
//! attention is llama.cpp's CPU flash attention (its default; [`CompiledPlan::set_flash_attn`]
//! switches to its soft_max path, `handwritten/soft_max_attn.rs`, in llama.cpp's order
//! too), both chosen by the token count of llama.cpp's ubatch ([`CompiledPlan::step_real`]) and
//! llama.cpp's thread count ([`CompiledPlan::set_llama_threads`]); norms, SiLU / SwiGLU,
//! rope, softmax and the other elementwise kernels compute what `ir::interp` computes in
//! llama.cpp mode bit for bit (see [`crate::handwritten`] and their tests).

mod lower;
mod moe;
mod mul_mat;
mod ops;
mod sync;
mod view;

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ir::graph::{DType, Input};
use ir::interp::WeightSource;
use ir::plan::{KvLayout, Plan};

use crate::generated::SumOrder;
use crate::jit::{CodegenError, Jit, JitCode};
use crate::layout::AlignedBuf;
use crate::matmul::define_matmul;
use crate::pool::ThreadPool;
use lower::{Lowerer, WeightStore};
use mul_mat::{KernelFn, MatWeight};
use ops::{Ctx, Op, Scratch};
use sync::StepSync;
use view::{Ptr, View};

/// What can go wrong loading or running a plan.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The plan does not verify, or lacks something the executor needs (names what).
    #[error("plan: {0}")]
    Plan(String),
    /// A kernel that cannot be lowered (unsupported op or type, operand shapes or layouts
    /// the CPU kernels do not take); names the step and the kernel.
    #[error("step n_tokens={n_tokens}, kernel {kernel}: {msg}")]
    Kernel {
        /// The step's ubatch size.
        n_tokens: u32,
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        msg: String,
    },
    /// Code generation failed.
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// Bad step arguments (lengths, positions, ids); names the argument.
    #[error("step input: {0}")]
    Input(String),
    /// A kernel failed while running (a panic on a thread, a row id out of range).
    #[error("step n_tokens={n_tokens}: {msg}")]
    Run {
        /// The step's ubatch size.
        n_tokens: u32,
        /// What happened.
        msg: String,
    },
    /// The thread pool could not be created.
    #[error("thread pool: {0}")]
    Threads(String),
}

/// Whether the CPU kernels read a K cache of type `k` with a V cache of type `v`: F16 or F32
/// for both, or Q8_0 for either with F16 or Q8_0 for the other (llama.cpp's `-ctk`/`-ctv`
/// types this backend implements; a quantized V also needs flash attention,
/// [`CompiledPlan::set_flash_attn`]). The one statement of it: the lowering checks plans
/// with it and the runtime derives its supported-type lists and messages from it.
pub fn kv_pair_supported(k: DType, v: DType) -> bool {
    let q8 = DType::Block(ir::ggml::GgmlType::Q8_0);
    match (k, v) {
        (a, b) if a == b => matches!(a, DType::F16 | DType::F32) || a == q8,
        (a, b) => (a == q8 && b == DType::F16) || (a == DType::F16 && b == q8),
    }
}

/// The non-weight inputs of one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepArgs<'a> {
    /// Token ids, `n_tokens` of them.
    pub tokens: &'a [i32],
    /// Positions, `n_tokens` of them, each below `n_ctx`.
    pub positions: &'a [i32],
    /// Rows of the ubatch that produce logits, `n_outputs` of them, each below `n_tokens`.
    pub output_ids: &'a [i32],
    /// The KV length: one past the last position written (1..=the context's cells).
    pub kv_len: usize,
    /// Values of [`Input::Data`] inputs by value name, each its elements in `ne` order
    /// (tests).
    pub data: &'a [(&'a str, &'a [f32])],
}

/// What loading cost and holds.
#[derive(Clone, Debug, Default)]
pub struct LoadStats {
    /// Kernels in all steps (ops after lowering).
    pub n_ops: usize,
    /// Distinct generated matmul kernels.
    pub n_matmul_kernels: usize,
    /// Seconds generating and compiling the matmul kernels with Cranelift.
    pub jit_seconds: f64,
    /// Seconds repacking weights.
    pub repack_seconds: f64,
    /// Seconds for the whole [`CompiledPlan::new`].
    pub load_seconds: f64,
    /// Bytes of repacked weight copies.
    pub repacked_bytes: usize,
    /// Arena bytes.
    pub arena_bytes: usize,
    /// Bytes of one stream of KV memory (what each sequence needs; the caller owns it).
    pub kv_bytes: usize,
    /// Scratch bytes (all threads).
    pub scratch_bytes: usize,
    /// Whether every activation quantizer uses the vectorized path (else some fell back to
    /// the scalar reference because this host lacks AVX2 or the check against it failed).
    pub fast_act_quant: bool,
}

/// Rows `start..start + len` of a multi-sequence step ([`CompiledPlan::step_runs`]) that
/// are columns `col0..col0 + len` of one llama.cpp ubatch of `n_llama` tokens of one
/// sequence: a slot's prompt chunk (`col0` 0, `len == n_llama`) or one generated token
/// (`1, 0`). The ubatch's size chooses the kernels of its rows (llama.cpp's `mul_mat`
/// dispatch by column count, its flash-attention kernel by token count), and the column
/// the kernel of a repacked weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRun {
    /// First row.
    pub start: usize,
    /// Rows.
    pub len: usize,
    /// Tokens of the ubatch.
    pub n_llama: usize,
    /// Its column of the first row.
    pub col0: usize,
}

/// Time spent in one kind of kernel ([`ir::plan::KernelOp::name`]) while profiling.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel kind (`rms_norm+mul+mul_mat×3`, `attention`, ...).
    pub kind: String,
    /// Runs of kernels of this kind.
    pub calls: u64,
    /// Wall seconds from thread 0 entering each kernel to all its chunks being done.
    pub seconds: f64,
}

/// One lowered step.
struct StepExec {
    n_tokens: u32,
    n_outputs: u32,
    /// Index of the first op of the step's suffix that only computes the logits (after
    /// llama.cpp's `get_rows(inp_out_ids)`: nothing there writes the KV cache); `ops.len()`
    /// where there is none. [`CompiledPlan::prefill_real`] stops there.
    output_tail: usize,
    ops: Vec<Op>,
    /// Kind index of each op (into `CompiledPlan::kinds`).
    kinds: Vec<usize>,
    /// Nanoseconds per op, accumulated while profiling.
    times: Vec<AtomicU64>,
    /// Runs of each op while profiling.
    counts: Vec<AtomicU64>,
    /// Index of each op's first phase in `sync`.
    phase_base: Vec<usize>,
    /// Chunk counters of every op phase.
    sync: StepSync,
    tokens: Option<View>,
    positions: Option<View>,
    output_ids: Option<View>,
    data: Vec<(String, View)>,
    outputs: Vec<View>,
    /// The logits: pointer and number of values (`n_vocab × n_outputs`).
    logits: (Ptr, usize),
}

/// How [`CompiledPlan::load`] compiles a plan.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    /// Threads a step runs on (0 is taken as 1).
    pub n_threads: usize,
    /// Summation order of the quantized matmul kernels.
    pub order: SumOrder,
    /// Cells of KV memory per sequence (the context, `-c`): 1 up to the plan's `n_ctx`;
    /// `None` for the plan's `n_ctx`.
    pub n_cells: Option<u64>,
    /// Sliding-window caches as rings sized as llama.cpp sizes its SWA cache for ubatches of
    /// this many tokens (`-ub`; [`ir::plan::Plan::kv_layout_ring`]); at least the plan's
    /// largest step. `None`: every cache holds every position.
    pub kv_ring_ubatch: Option<u32>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            n_threads: 1,
            order: SumOrder::Ggml,
            n_cells: None,
            kv_ring_ubatch: None,
        }
    }
}

/// A plan compiled for this CPU, with its arena and thread pool (module doc).
///
/// Borrows the weights (`'w`): the embedding table is read in place.
pub struct CompiledPlan<'w> {
    steps: Vec<StepExec>,
    kinds: Vec<String>,
    /// Where the caches lie in the KV memory a step is handed.
    kv_layout: KvLayout,
    // Owners of the memory the ops point into.
    _arena: AlignedBuf,
    _scratch_bufs: Vec<AlignedBuf>,
    _store: WeightStore<'w>,
    _code: Option<Arc<JitCode>>,
    scratch: Scratch,
    pool: ThreadPool,
    error: AtomicBool,
    profiling: bool,
    /// llama.cpp's flash attention (else its soft_max path).
    flash: bool,
    /// A V cache holds Q8_0 blocks (only the flash kernels read them).
    v_quantized: bool,
    /// llama.cpp's thread count, for its split-KV flash decode.
    llama_threads: usize,
    last_step: Option<usize>,
    /// The per-row KV memory of a multi-sequence step (kept to reuse its allocation).
    row_kv: Vec<Ptr>,
    stats: LoadStats,
    _w: PhantomData<&'w [u8]>,
}

// SAFETY: the raw pointers inside the ops point into buffers this value owns (or weights
// borrowed for `'w`, which are immutable; KV pointers are offsets resolved against the
// memory each step borrows); moving the value to another thread moves their
// owners with it, and `step` takes `&mut self`.
unsafe impl Send for CompiledPlan<'_> {}

impl<'w> CompiledPlan<'w> {
    /// Compiles `plan` for this CPU with weights from `weights` (a [`ir::gguf::GgufFile`]
    /// maps its file), running steps on `n_threads` threads (0 is taken as 1).
    ///
    /// # Errors
    /// [`ExecError::Plan`] if the plan does not verify or is not memory-planned;
    /// [`ExecError::Kernel`] for a kernel the CPU backend cannot run (naming it: an
    /// unsupported op or weight type, a weight missing from `weights` or of another type or
    /// shape than the plan says, operand layouts the kernels do not take);
    /// [`ExecError::Codegen`] if Cranelift fails; [`ExecError::Threads`] if threads cannot be
    /// spawned.
    pub fn new(
        plan: &Plan,
        weights: &'w dyn WeightSource,
        n_threads: usize,
    ) -> Result<CompiledPlan<'w>, ExecError> {
        Self::load(
            plan,
            weights,
            &ExecOptions {
                n_threads,
                ..ExecOptions::default()
            },
        )
    }

    /// [`CompiledPlan::new`] with quantized matmul kernels that add in `order`:
    /// [`SumOrder::Ggml`] (llama.cpp's logits bit for bit) or [`SumOrder::Block`] (faster,
    /// not bit-identical).
    ///
    /// # Errors
    /// As [`CompiledPlan::new`].
    pub fn with_sum_order(
        plan: &Plan,
        weights: &'w dyn WeightSource,
        n_threads: usize,
        order: SumOrder,
    ) -> Result<CompiledPlan<'w>, ExecError> {
        Self::load(
            plan,
            weights,
            &ExecOptions {
                n_threads,
                order,
                n_cells: None,
                kv_ring_ubatch: None,
            },
        )
    }

    /// Compiles `plan` for this CPU with weights from `weights` (a [`ir::gguf::GgufFile`]
    /// maps its file) as `opts` says.
    ///
    /// # Errors
    /// As [`CompiledPlan::new`]; [`ExecError::Plan`] for a context (`n_cells`) of 0 or past
    /// the plan's `n_ctx`.
    pub fn load(
        plan: &Plan,
        weights: &'w dyn WeightSource,
        opts: &ExecOptions,
    ) -> Result<CompiledPlan<'w>, ExecError> {
        let t_load = Instant::now();
        let n_threads = opts.n_threads.max(1);
        let order = opts.order;
        plan.verify().map_err(|e| ExecError::Plan(e.to_string()))?;
        // The kernels are the plan's choice (`select-kernels`), made for a CPU this host
        // must be able to run; a plan chosen for the other summation order, or not yet
        // chosen for (tests, older runners), is chosen for again by the same pass: for its
        // own CPU, else this host.
        let reselected;
        let plan = match crate::select::selection(plan).map_err(ExecError::Plan)? {
            Some(sel) if sel.order().map_err(ExecError::Plan)? == order => {
                sel.cpu.check_host().map_err(ExecError::Plan)?;
                plan
            }
            sel => {
                let cpu = match sel {
                    Some(sel) => sel.cpu,
                    None => crate::target::CpuTarget::host().map_err(ExecError::Plan)?,
                };
                cpu.check_host().map_err(ExecError::Plan)?;
                let mut p = plan.clone();
                crate::select::select_kernels(&mut p, &cpu, order).map_err(ExecError::Plan)?;
                reselected = p;
                &reselected
            }
        };
        if let Some(s) = plan.steps.iter().find(|s| !s.is_planned()) {
            return Err(ExecError::Plan(format!(
                "step n_tokens={} is not memory-planned",
                s.n_tokens
            )));
        }
        if plan.steps.is_empty() {
            return Err(ExecError::Plan("the plan has no steps".into()));
        }
        let too_big = |what: &str| ExecError::Plan(format!("{what} does not fit in memory"));
        let arena_bytes = usize::try_from(plan.arena_bytes())
            .map_err(|_| too_big("the arena"))?
            .max(64);
        let mut arena = AlignedBuf::zeroed(arena_bytes);
        let n_cells = opts.n_cells.unwrap_or(u64::from(plan.n_ctx));
        let kv_layout = match opts.kv_ring_ubatch {
            None => plan.kv_layout(n_cells),
            Some(ub) => {
                let largest = plan.steps.iter().map(|s| s.n_tokens).max().unwrap_or(1);
                if ub < largest {
                    return Err(ExecError::Plan(format!(
                        "KV rings sized for ubatches of {ub} tokens cannot run a step of {largest}"
                    )));
                }
                plan.kv_layout_ring(n_cells, ub)
            }
        }
        .map_err(ExecError::Plan)?;
        usize::try_from(kv_layout.stream_bytes).map_err(|_| too_big("the KV caches"))?;
        // The ops' KV pointers are offsets into a stream (resolved against the memory each
        // step is handed); each view is checked against its cache at the plan's size, and
        // a step never reaches a cell past the context (`write_inputs`, `Ctx::n_cells`).
        let mut kv_ranges = Vec::with_capacity(plan.kv.len());
        for (c, slot) in plan.kv.iter().zip(&kv_layout.caches) {
            let b = c
                .bytes()
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| too_big(&c.name))?;
            kv_ranges.push((slot.offset as usize, b));
        }
        let arena_ptr = Ptr(arena.as_mut_slice().as_mut_ptr());
        let kv_ptr = Ptr(std::ptr::null_mut());

        let mut store = WeightStore::new(weights);
        let mut low = Lowerer::new(
            plan,
            &mut store,
            arena_ptr,
            arena_bytes,
            kv_ptr,
            kv_ranges,
            n_threads,
        );
        low.order = order;
        low.kv_cells = kv_layout
            .caches
            .iter()
            .map(|c| {
                if c.is_ring(kv_layout.n_cells) {
                    c.n_cells as usize
                } else {
                    usize::MAX
                }
            })
            .collect();
        let mut kinds: Vec<String> = Vec::new();
        let mut steps = Vec::with_capacity(plan.steps.len());
        for s in &plan.steps {
            low.begin_step(s);
            let mut ops = Vec::new();
            let mut op_kinds = Vec::new();
            // The first op of the kernels that only serve the logits (a suffix of the step).
            let mut output_tail = 0;
            for k in &s.kernels {
                if !low.only_output_rows(k) {
                    output_tail = usize::MAX;
                } else if output_tail == usize::MAX {
                    output_tail = ops.len();
                }
                let name = k.op.name();
                let kind = match kinds.iter().position(|x| *x == name) {
                    Some(i) => i,
                    None => {
                        kinds.push(name);
                        kinds.len() - 1
                    }
                };
                for op in low.kernel(s, k)? {
                    ops.push(op);
                    op_kinds.push(kind);
                }
            }
            let plan_err =
                |m: String| ExecError::Plan(format!("step n_tokens={}: {m}", s.n_tokens));
            let mut input = |kind: Input| -> Result<Option<View>, ExecError> {
                match s.input(&kind) {
                    Some(id) => Ok(Some(low_view(&mut low, s, id).map_err(plan_err)?)),
                    None => Ok(None),
                }
            };
            let tokens = input(Input::Tokens)?;
            let positions = input(Input::Positions)?;
            let output_ids = input(Input::OutputIds)?;
            for v in [&tokens, &positions, &output_ids].into_iter().flatten() {
                if v.dtype != DType::I32 || !v.rows_contiguous() {
                    return Err(ExecError::Plan(format!("step n_tokens={}: token, position and output inputs must be contiguous I32", s.n_tokens)));
                }
            }
            let mut data = Vec::new();
            for i in &s.inputs {
                if i.kind == Input::Data {
                    let v = low_view(&mut low, s, i.value).map_err(plan_err)?;
                    if v.dtype != DType::F32 || !is_dense(&v) {
                        return Err(plan_err(format!(
                            "data input {} must be dense F32",
                            s.values[i.value.index()].name
                        )));
                    }
                    data.push((s.values[i.value.index()].name.clone(), v));
                }
            }
            let mut outputs = Vec::new();
            for o in &s.outputs {
                outputs.push(low_view(&mut low, s, *o).map_err(plan_err)?);
            }
            let first = outputs
                .first()
                .ok_or_else(|| plan_err("no outputs".into()))?;
            if first.dtype != DType::F32 || !is_dense(first) || first.kv != 0 {
                return Err(plan_err("the logits must be a dense F32 value".into()));
            }
            let logits = (first.ptr, first.ne.iter().product());
            let times = (0..ops.len()).map(|_| AtomicU64::new(0)).collect();
            let counts = (0..ops.len()).map(|_| AtomicU64::new(0)).collect();
            let mut phase_base = Vec::with_capacity(ops.len());
            let mut n_phases = 0;
            for op in &ops {
                phase_base.push(n_phases);
                n_phases += op.phases();
            }
            // Nothing to skip unless a suffix of logits-only kernels was found.
            let output_tail = if output_tail == usize::MAX {
                ops.len()
            } else {
                output_tail
            };
            steps.push(StepExec {
                n_tokens: s.n_tokens,
                n_outputs: s.n_outputs,
                output_tail,
                ops,
                kinds: op_kinds,
                times,
                counts,
                phase_base,
                sync: StepSync::new(n_phases, n_threads),
                tokens,
                positions,
                output_ids,
                data,
                outputs,
                logits,
            });
        }
        let needs = low.needs;
        let fast_act_quant = !low.slow_quant;
        let specs = std::mem::take(&mut low.specs);
        drop(low);

        // Generate every matmul kernel into one module.
        let t_jit = Instant::now();
        let mut code = None;
        if !specs.is_empty() {
            let mut jit = Jit::new()?;
            let mut names = Vec::with_capacity(specs.len());
            for sp in &specs {
                names.push(define_matmul(&mut jit, sp, sp.tiling_for(order))?);
            }
            let c = jit.finalize()?;
            let mut entries: Vec<KernelFn> = Vec::with_capacity(names.len());
            for name in &names {
                let addr = c.address(name).ok_or_else(|| CodegenError::Compile {
                    name: name.clone(),
                    msg: "not defined in the module".into(),
                })?;
                // SAFETY: `addr` is the entry of a function `define_matmul` generated with the
                // matmul kernel signature documented in `crate::generated` (the C ABI; weight,
                // activations, output, first and end group); the module lives in `code`.
                entries.push(unsafe { std::mem::transmute::<usize, KernelFn>(addr) });
            }
            for st in &mut steps {
                for op in &mut st.ops {
                    if let Op::MulMat(m) = op {
                        for mat in &mut m.mats {
                            if matches!(mat.weight, MatWeight::Repacked(_)) {
                                mat.entry = Some(entries[mat.spec]);
                            }
                        }
                    }
                }
            }
            code = Some(c);
        }
        let jit_seconds = t_jit.elapsed().as_secs_f64();

        // Scratch.
        let mut bufs = Vec::new();
        let mut alloc = |bytes: usize| -> Ptr {
            let mut b = AlignedBuf::zeroed(bytes.max(64));
            let p = Ptr(b.as_mut_slice().as_mut_ptr());
            bufs.push(b);
            p
        };
        let per_thread = |alloc: &mut dyn FnMut(usize) -> Ptr, bytes: usize| {
            (0..n_threads).map(|_| alloc(bytes)).collect::<Vec<_>>()
        };
        let scratch = Scratch {
            tmp: per_thread(&mut alloc, 4 * needs.tmp_floats),
            scores: per_thread(&mut alloc, 4 * needs.score_floats),
            attn: per_thread(&mut alloc, 4 * needs.attn_floats),
            act_private: per_thread(&mut alloc, needs.act_private_bytes),
            act_shared: alloc(needs.act_shared_bytes),
            epi: alloc(needs.epi_bytes),
        };
        let scratch_bytes = bufs.iter().map(|b| b.len()).sum();
        let pool = ThreadPool::new(n_threads).map_err(|e| ExecError::Threads(e.to_string()))?;
        let stats = LoadStats {
            n_ops: steps.iter().map(|s| s.ops.len()).sum(),
            n_matmul_kernels: specs.len(),
            jit_seconds,
            repack_seconds: store.repack_seconds,
            load_seconds: t_load.elapsed().as_secs_f64(),
            repacked_bytes: store.repacked_bytes,
            arena_bytes,
            kv_bytes: kv_layout.stream_bytes as usize,
            scratch_bytes,
            fast_act_quant,
        };
        Ok(CompiledPlan {
            steps,
            kinds,
            kv_layout,
            _arena: arena,
            _scratch_bufs: bufs,
            _store: store,
            _code: code,
            scratch,
            pool,
            error: AtomicBool::new(false),
            profiling: false,
            flash: true,
            v_quantized: plan
                .kv
                .iter()
                .any(|c| c.kind == ir::graph::KvKind::V && matches!(c.dtype, DType::Block(_))),
            llama_threads: n_threads,
            last_step: None,
            row_kv: Vec::new(),
            stats,
            _w: PhantomData,
        })
    }

    /// Cells of a sequence's KV memory (the context, `n_ctx`).
    pub fn n_ctx(&self) -> usize {
        self.kv_layout.n_cells as usize
    }

    /// Where the caches lie in the KV memory of one sequence: what [`CompiledPlan::step`]
    /// is handed ([`KvLayout::stream_bytes`] of it).
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv_layout
    }

    /// Threads a step runs on.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The compiled steps as `(n_tokens, n_outputs)`, in the plan's order.
    pub fn steps(&self) -> Vec<(u32, u32)> {
        self.steps
            .iter()
            .map(|s| (s.n_tokens, s.n_outputs))
            .collect()
    }

    /// What loading cost (compile and repack time) and holds.
    pub fn stats(&self) -> &LoadStats {
        &self.stats
    }

    /// Attention as llama.cpp's CPU flash attention (`true`, the default, as llama.cpp's
    /// `-fa auto` on the CPU) or as its soft_max path (`false`, `-fa off`).
    ///
    /// # Errors
    /// [`ExecError::Input`] for `false` with a Q8_0 V cache: only the flash kernels read a
    /// quantized V, as in llama.cpp (a Q8_0 K works either way).
    pub fn set_flash_attn(&mut self, on: bool) -> Result<(), ExecError> {
        if !on && self.v_quantized {
            return Err(ExecError::Input(
                "a quantized V cache (-ctv q8_0) needs flash attention, as in llama.cpp: drop -fa off"
                    .into(),
            ));
        }
        self.flash = on;
        Ok(())
    }

    /// Re-ropes cells `from..from + n` of every K cache in the KV memory `kv` of one
    /// sequence by `delta` positions: llama.cpp's K shift (`llama_kv_cache` after
    /// `llama_memory_seq_add`), for a context shift that moved those cells. Returns `false`
    /// (and changes nothing) when some K cache cannot be shifted so (a Q8_0 cache: its keys
    /// are Hadamard-rotated; a K stored without rope): the caller evaluates the positions
    /// again instead.
    ///
    /// # Errors
    /// [`ExecError::Input`] for `kv` shorter than the layout or cells past the context.
    pub fn shift_k(
        &mut self,
        kv: &mut [u8],
        from: usize,
        n: usize,
        delta: i64,
    ) -> Result<bool, ExecError> {
        if (kv.len() as u64) < self.kv_layout.stream_bytes || from + n > self.n_ctx() {
            return Err(ExecError::Input(format!(
                "K shift of cells {from}..{} in a context of {}",
                from + n,
                self.n_ctx()
            )));
        }
        let Some(step) = self.steps.first() else {
            return Ok(false);
        };
        let ropes: Vec<&ops::RopeKv> = step
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::RopeKv(r) if r.k.is_some() => Some(r),
                _ => None,
            })
            .collect();
        if ropes.len() != self.kv_layout.caches.len() / 2
            || ropes
                .iter()
                .any(|r| r.k_rope().is_none_or(|(_, c, _)| c.q8))
        {
            return Ok(false);
        }
        let kv = Ptr(kv.as_mut_ptr());
        for r in ropes {
            // SAFETY: `kv` holds a stream of this plan's layout (checked above) and the cells
            // lie in the context; the op's cache rows were lowered against this plan.
            unsafe { r.shift_k(kv, from..from + n, delta, self.flash) };
        }
        Ok(true)
    }

    /// Whether attention is llama.cpp's flash attention.
    pub fn flash_attn(&self) -> bool {
        self.flash
    }

    /// The thread count of the llama.cpp run to reproduce (default: this plan's thread
    /// count): its flash-attention decode over 512 or more (padded) cache cells cuts the
    /// cache into one chunk per thread, so the last bits of the result depend on it. 0 is
    /// taken as 1.
    pub fn set_llama_threads(&mut self, n: usize) {
        self.llama_threads = n.max(1);
    }

    /// Turns per-kernel timing on or off (off by default; on, thread 0 reads the clock
    /// around every kernel).
    pub fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    /// Time per kernel kind accumulated while profiling, largest first.
    pub fn profile(&self) -> Vec<KernelTime> {
        let mut out: Vec<KernelTime> = self
            .kinds
            .iter()
            .map(|k| KernelTime {
                kind: k.clone(),
                calls: 0,
                seconds: 0.0,
            })
            .collect();
        for s in &self.steps {
            for (i, t) in s.times.iter().enumerate() {
                let e = &mut out[s.kinds[i]];
                e.seconds += t.load(Ordering::Relaxed) as f64 * 1e-9;
                e.calls += s.counts[i].load(Ordering::Relaxed);
            }
        }
        out.retain(|k| k.calls > 0);
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        out
    }

    /// Forgets the accumulated profile.
    pub fn reset_profile(&mut self) {
        for s in &self.steps {
            for t in s.times.iter().chain(&s.counts) {
                t.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Runs the step compiled for `n_tokens` tokens and `n_outputs` logit rows on the KV
    /// memory `kv` of one sequence (at least [`KvLayout::stream_bytes`] bytes laid out as
    /// [`CompiledPlan::kv_layout`]; its cells at the step's positions are written, cells
    /// `0..kv_len` read) and returns the logits: `n_outputs` rows of `n_vocab` values (a view
    /// of the arena, valid until the next call).
    ///
    /// # Errors
    /// [`ExecError::Input`] when no such step exists, `kv` is too short, an input has the
    /// wrong length, a position is outside the context, `kv_len` is outside
    /// `1..=n_ctx` or below a position, an output row is outside the ubatch, or a data
    /// input is missing; [`ExecError::Run`] when a kernel fails (a token id outside the
    /// embedding table).
    pub fn step(
        &mut self,
        kv: &mut [u8],
        n_tokens: u32,
        n_outputs: u32,
        args: &StepArgs<'_>,
    ) -> Result<&[f32], ExecError> {
        self.step_real(
            kv,
            n_tokens,
            n_outputs,
            n_tokens as usize,
            n_tokens as usize,
            0,
            args,
        )
    }

    /// [`CompiledPlan::step`] for `n_real` real tokens padded to the step's `n_tokens` (the
    /// first `n_real` rows are real; the padding rows' attention results are zeros), which
    /// are part of (or all of) a llama.cpp ubatch of `n_llama` tokens: llama.cpp chooses its
    /// flash-attention kernel by `n_llama`, and so does this step, so a ubatch cut into
    /// compiled sizes or padded to one computes llama.cpp's numbers. The step's first token
    /// is column `llama_col0` of that ubatch: llama.cpp's matrix-product kernels (gemm or gemv
    /// for a repacked weight, the tiled K-quant kernel) are chosen by the column and the
    /// column count, and so are the row-dot kernels' orders.
    ///
    /// # Errors
    /// As [`CompiledPlan::step`]; `n_real` outside `1..=n_tokens`, `n_llama` below `n_real`.
    #[allow(clippy::too_many_arguments)]
    pub fn step_real(
        &mut self,
        kv: &mut [u8],
        n_tokens: u32,
        n_outputs: u32,
        n_real: usize,
        n_llama: usize,
        llama_col0: usize,
        args: &StepArgs<'_>,
    ) -> Result<&[f32], ExecError> {
        let si = self.run_real(
            kv, n_tokens, n_outputs, n_real, n_llama, llama_col0, args, true,
        )?;
        Ok(self.logits_of(si))
    }

    /// [`CompiledPlan::step_real`] for a part of a prompt whose logits nobody reads: the
    /// step stores its rows in the KV cache and stops before the kernels that only compute
    /// the logits (the last layer's rows after llama.cpp's `get_rows(inp_out_ids)`, the
    /// output norm and projection), as llama.cpp computes no output for a ubatch without
    /// one. The cache holds what `step_real` stores, bit for bit.
    ///
    /// # Errors
    /// As [`CompiledPlan::step_real`].
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_real(
        &mut self,
        kv: &mut [u8],
        n_tokens: u32,
        n_outputs: u32,
        n_real: usize,
        n_llama: usize,
        llama_col0: usize,
        args: &StepArgs<'_>,
    ) -> Result<(), ExecError> {
        self.run_real(
            kv, n_tokens, n_outputs, n_real, n_llama, llama_col0, args, false,
        )
        .map(|_| ())
    }

    /// [`CompiledPlan::step_real`]'s checks and run, through the logits or (`logits`
    /// false) up to the step's logits-only suffix; returns the step's index.
    #[allow(clippy::too_many_arguments)]
    fn run_real(
        &mut self,
        kv: &mut [u8],
        n_tokens: u32,
        n_outputs: u32,
        n_real: usize,
        n_llama: usize,
        llama_col0: usize,
        args: &StepArgs<'_>,
        logits: bool,
    ) -> Result<usize, ExecError> {
        self.check_kv_memory(kv)?;
        if n_real == 0 || n_real > n_tokens as usize || n_llama < llama_col0 + n_real {
            return Err(ExecError::Input(format!(
                "{n_real} real tokens in a step of {n_tokens} (a ubatch of {n_llama})"
            )));
        }
        let si = self.step_index(n_tokens, n_outputs)?;
        self.write_inputs(si, args, n_real)?;
        let ub = (n_llama, llama_col0);
        let st = &self.steps[si];
        let end = if logits { st.ops.len() } else { st.output_tail };
        self.run(si, Ptr(kv.as_mut_ptr()), None, args.kv_len, n_real, ub, end)?;
        Ok(si)
    }

    /// Refuses KV memory shorter than one sequence's.
    fn check_kv_memory(&self, kv: &[u8]) -> Result<(), ExecError> {
        if (kv.len() as u64) < self.kv_layout.stream_bytes {
            return Err(ExecError::Input(format!(
                "the KV memory has {} bytes; a sequence needs {}",
                kv.len(),
                self.kv_layout.stream_bytes
            )));
        }
        Ok(())
    }

    /// The step compiled for `n_tokens` tokens and `n_outputs` logit rows.
    fn step_index(&self, n_tokens: u32, n_outputs: u32) -> Result<usize, ExecError> {
        self.steps
            .iter()
            .position(|s| s.n_tokens == n_tokens && s.n_outputs == n_outputs)
            .ok_or_else(|| {
                ExecError::Input(format!(
                    "no step for {n_tokens} tokens and {n_outputs} outputs"
                ))
            })
    }

    /// The logits of step `si`, which just ran (it becomes the last step).
    fn logits_of(&mut self, si: usize) -> &[f32] {
        self.last_step = Some(si);
        let (p, n) = self.steps[si].logits;
        // SAFETY: the logits are `n` f32 values inside the arena (checked at lowering); the
        // borrow of `self` keeps the arena alive and unchanged until the next `step`.
        unsafe { std::slice::from_raw_parts(p.0 as *const f32, n) }
    }

    /// A step of several sequences, each a run of tokens ([`RowRun`]; a slot's prompt chunk
    /// of fewer than 64 tokens, or its one generated token): the step compiled for
    /// `n_tokens` tokens with a logit row per token, `runs[i]` (in row order, covering the
    /// rows `0..` without gaps) continuing the sequence whose KV memory is `kvs[i]` at the
    /// positions `args.positions` gives its rows (consecutive, after the sequence's
    /// past). Each row computes the numbers a [`CompiledPlan::step_real`] of its run alone
    /// computes (its cache, its causal mask, the kernels of its ubatch's size and its
    /// column); the matrix products read each weight once per run (once for all one-token
    /// runs). `args.output_ids` must list each run's last row first, in run order (the
    /// rest repeat one of them): the logit rows are computed for those only. Returns
    /// `n_tokens` logit rows, the first `runs.len()` of them real, each its run's output.
    ///
    /// # Errors
    /// As [`CompiledPlan::step`]; no run, runs that do not tile `0..n_real` in order, a run
    /// of [`flash::Q_TILE`] tokens or more, more rows than `n_tokens`, a KV memory too short.
    pub fn step_runs(
        &mut self,
        kvs: &mut [&mut [u8]],
        runs: &[RowRun],
        n_tokens: u32,
        args: &StepArgs<'_>,
    ) -> Result<&[f32], ExecError> {
        let mut next = 0;
        for r in runs {
            if r.start != next || r.len == 0 || r.len > r.n_llama || r.col0 + r.len > r.n_llama {
                return Err(ExecError::Input(format!(
                    "run {r:?} does not continue the rows at {next}"
                )));
            }
            if r.n_llama >= crate::handwritten::flash::Q_TILE {
                return Err(ExecError::Input(format!(
                    "a run of a ubatch of {} tokens: runs take fewer than {}",
                    r.n_llama,
                    crate::handwritten::flash::Q_TILE
                )));
            }
            next += r.len;
        }
        if runs.len() != kvs.len() {
            return Err(ExecError::Input(format!(
                "{} runs for {} sequences",
                runs.len(),
                kvs.len()
            )));
        }
        let n_real = runs.last().map_or(0, |r| r.start + r.len);
        if kvs.is_empty() || n_real > n_tokens as usize {
            return Err(ExecError::Input(format!(
                "{n_real} rows of {} sequences in a step of {n_tokens} tokens",
                kvs.len()
            )));
        }
        for kv in kvs.iter() {
            self.check_kv_memory(kv)?;
        }
        let mut rows = std::mem::take(&mut self.row_kv);
        rows.clear();
        for (kv, r) in kvs.iter_mut().zip(runs) {
            let p = Ptr(kv.as_mut_ptr());
            rows.extend(std::iter::repeat_n(p, r.len));
        }
        self.run_rows(rows, runs, n_real, n_tokens, args)
    }

    /// One sequence's tokens in a step compiled for `n_tokens` tokens with a logit row per
    /// token, each row its own one-token llama.cpp ubatch reading and writing the one KV
    /// memory `kv` at the position `args.positions` gives it (consecutive, after the
    /// sequence's past): the rows of a speculative draft verified in one pass over the
    /// weights, each computing the numbers [`CompiledPlan::step_real`] of that token alone
    /// computes (one-token kernels, its own padded KV length, its causal mask over the
    /// cells the earlier rows of the step wrote). `args.output_ids` must list rows
    /// `0..n_real` first. Returns `n_tokens` logit rows, the first `n_real` real.
    ///
    /// # Errors
    /// As [`CompiledPlan::step_runs`]; `n_real` of 0 or above `n_tokens`.
    pub fn step_rows_one_seq(
        &mut self,
        kv: &mut [u8],
        n_real: usize,
        n_tokens: u32,
        args: &StepArgs<'_>,
    ) -> Result<&[f32], ExecError> {
        if n_real == 0 || n_real > n_tokens as usize {
            return Err(ExecError::Input(format!(
                "{n_real} rows in a step of {n_tokens} tokens"
            )));
        }
        self.check_kv_memory(kv)?;
        let runs: Vec<RowRun> = (0..n_real)
            .map(|start| RowRun {
                start,
                len: 1,
                n_llama: 1,
                col0: 0,
            })
            .collect();
        let mut rows = std::mem::take(&mut self.row_kv);
        rows.clear();
        rows.extend(std::iter::repeat_n(Ptr(kv.as_mut_ptr()), n_real));
        self.run_rows(rows, &runs, n_real, n_tokens, args)
    }

    /// Runs the step of `n_tokens` with a logit row per token over `runs`, row `i` reading
    /// and writing the KV memory at `rows[i]` (checked by the caller).
    fn run_rows(
        &mut self,
        rows: Vec<Ptr>,
        runs: &[RowRun],
        n_real: usize,
        n_tokens: u32,
        args: &StepArgs<'_>,
    ) -> Result<&[f32], ExecError> {
        let si = match self.step_index(n_tokens, n_tokens).and_then(|si| {
            self.write_inputs(si, args, args.positions.len())
                .map(|()| si)
        }) {
            Ok(si) => si,
            Err(e) => {
                self.row_kv = rows;
                return Err(e);
            }
        };
        let all = self.steps[si].ops.len();
        let done = self.run(
            si,
            rows[0],
            Some((&rows, runs)),
            args.kv_len,
            n_real,
            (1, 0),
            all,
        );
        self.row_kv = rows;
        done?;
        Ok(self.logits_of(si))
    }

    /// Output `i` of the last step run, its elements in `ne` order (tests, debugging).
    pub fn output(&self, i: usize) -> Option<Vec<f32>> {
        let s = &self.steps[self.last_step?];
        let v = s.outputs.get(i)?;
        if v.dtype != DType::F32 {
            return None;
        }
        let ne = v.ne;
        let mut out = Vec::with_capacity(ne.iter().product());
        for r in 0..ne[1] * ne[2] * ne[3] {
            let row = v.row(r, &ne);
            for e in 0..ne[0] {
                // SAFETY: the value lies in the arena (checked at lowering).
                out.push(unsafe { *(row.add(e * v.nb[0]) as *const f32) });
            }
        }
        Some(out)
    }

    /// Checks and writes a step's inputs. The positions of the first `n_real` rows lie below
    /// `kv_len`; a padding row's may lie anywhere in the context (a model without causal
    /// attention stores its padding past the KV length, where no real token looks).
    fn write_inputs(
        &mut self,
        si: usize,
        a: &StepArgs<'_>,
        n_real: usize,
    ) -> Result<(), ExecError> {
        let s = &self.steps[si];
        let n_ctx = self.n_ctx();
        if a.kv_len == 0 || a.kv_len > n_ctx {
            return Err(ExecError::Input(format!(
                "kv_len {} is outside 1..={n_ctx}",
                a.kv_len
            )));
        }
        let ints = |what: &str,
                    v: &Option<View>,
                    vals: &[i32],
                    lo: i64,
                    hi: i64|
         -> Result<(), ExecError> {
            let Some(v) = v else { return Ok(()) };
            if vals.len() != v.ne[0] {
                return Err(ExecError::Input(format!(
                    "{what}: the step takes {}, got {}",
                    v.ne[0],
                    vals.len()
                )));
            }
            if let Some(bad) = vals.iter().find(|&&x| (x as i64) < lo || (x as i64) >= hi) {
                return Err(ExecError::Input(format!(
                    "{what}: {bad} is outside {lo}..{hi}"
                )));
            }
            for (i, x) in vals.iter().enumerate() {
                // SAFETY: the input value is `ne[0]` contiguous I32 in the arena.
                unsafe { *(v.ptr.add(4 * i) as *mut i32) = *x };
            }
            Ok(())
        };
        ints("token ids", &s.tokens, a.tokens, 0, i32::MAX as i64)?;
        let n_real = n_real.min(a.positions.len());
        if let Some(bad) = a.positions[..n_real]
            .iter()
            .find(|&&p| p as i64 >= a.kv_len as i64)
        {
            return Err(ExecError::Input(format!(
                "positions: {bad} is outside 0..{}",
                a.kv_len
            )));
        }
        ints("positions", &s.positions, a.positions, 0, n_ctx as i64)?;
        ints(
            "output rows",
            &s.output_ids,
            a.output_ids,
            0,
            s.n_tokens as i64,
        )?;
        for (name, v) in &s.data {
            let vals = a
                .data
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| *d)
                .ok_or_else(|| ExecError::Input(format!("data input {name} not given")))?;
            let n: usize = v.ne.iter().product();
            if vals.len() != n {
                return Err(ExecError::Input(format!(
                    "data input {name}: {n} values expected, got {}",
                    vals.len()
                )));
            }
            // SAFETY: a dense F32 value of `n` elements in the arena (checked at lowering).
            unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), v.ptr.0 as *mut f32, n) };
        }
        Ok(())
    }

    fn run(
        &self,
        si: usize,
        kv: Ptr,
        row_kv: Option<(&[Ptr], &[RowRun])>,
        kv_len: usize,
        n_real: usize,
        (n_llama, llama_col0): (usize, usize),
        end: usize,
    ) -> Result<(), ExecError> {
        let st = &self.steps[si];
        let sync = &st.sync;
        let scratch = &self.scratch;
        let error = &self.error;
        let profiling = self.profiling;
        let (flash, llama_threads) = (self.flash, self.llama_threads);
        let n_cells = self.n_ctx();
        sync.reset();
        error.store(false, Ordering::Relaxed);
        let failed = AtomicBool::new(false);
        let threads = self.pool.n_threads();
        self.pool.run(&|ti, _| {
            let cx = Ctx {
                ti,
                kv,
                n_cells,
                kv_len,
                scratch,
                error,
                n_real,
                n_llama,
                llama_col0,
                flash,
                llama_threads,
                threads,
                row_kv: row_kv.map(|r| r.0),
                runs: row_kv.map_or(&[], |r| r.1),
            };
            let r = catch_unwind(AssertUnwindSafe(|| {
                for (i, op) in st.ops[..end].iter().enumerate() {
                    let t0 = (profiling && ti == 0).then(Instant::now);
                    for ph in 0..op.phases() {
                        let id = st.phase_base[i] + ph;
                        let n = op.n_chunks(ph, kv_len, row_kv.map_or(0, |r| r.0.len()), threads);
                        let mut started = false;
                        let mut victim = 0;
                        while let Some(c) = sync.grab(id, ti, n, &mut victim) {
                            // SAFETY: the ops were lowered against this plan's buffers, the
                            // inputs were checked by `write_inputs`, every chunk of the
                            // previous phases is done (waited below), and `grab` hands each
                            // chunk to one thread.
                            unsafe {
                                if !started {
                                    op.thread_init(ph, &cx);
                                    started = true;
                                }
                                op.run_chunk(ph, c, &cx);
                            }
                            sync.finish(id, ti);
                        }
                        if !sync.wait(id, n) {
                            return;
                        }
                    }
                    if let Some(t0) = t0 {
                        st.times[i].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        st.counts[i].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
                sync.poison();
            }
        });
        if failed.load(Ordering::Relaxed) || sync.is_poisoned() {
            return Err(ExecError::Run {
                n_tokens: st.n_tokens,
                msg: "a kernel panicked".into(),
            });
        }
        if error.load(Ordering::Relaxed) {
            return Err(ExecError::Run {
                n_tokens: st.n_tokens,
                msg: "get_rows: a row id is outside its table (token id past the vocabulary?)"
                    .into(),
            });
        }
        Ok(())
    }
}

fn low_view(
    low: &mut Lowerer<'_, '_, '_>,
    s: &ir::plan::Step,
    id: ir::plan::ValueId,
) -> Result<View, String> {
    low.view(s, id)
}

/// Whether a view's elements lie back to back in `ne` order.
fn is_dense(v: &View) -> bool {
    let es = v.dtype.type_size() as usize;
    let mut want = es;
    for d in 0..4 {
        if v.ne[d] != 1 && v.nb[d] != want {
            return false;
        }
        want *= v.ne[d];
    }
    true
}
