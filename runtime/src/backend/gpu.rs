//! The host side every GPU engine shares (CUDA's and Metal's): what the kernel ABI
//! ([`codegen_cuda::program`]) leaves to the host, written once over a small device trait.
//!
//! - [`support`]: the weight types and KV cache pairs the generated kernels read (one
//!   printer, so one answer for both dialects).
//! - [`check_program`]: a loaded program checked against its plan before a device is touched:
//!   its weight layout, KV memory, arena, launches, and where each kept step reads its inputs
//!   (tokens, positions, output ids) and writes its logits in the arena ([`Io`]).
//! - [`GpuEngine`]: the [`Engine`] over a [`GpuDevice`]: a call cut into compiled steps
//!   (`ir::plan::schedule::chunks`), each step's inputs written into the arena, its launches
//!   run, its logits read back. The engine keeps each sequence's KV memory on the device
//!   itself (its [`Engine::kv_layout`] has zero bytes, as the interpreter's does, and each
//!   cache's cells: sliding-window caches are rings unless the program was generated with
//!   full-size ones, `--swa-full`).

use super::{LoadOptions, LogitRows, Support, Target};
use crate::engine::{check_decode_args, Engine, EngineMemory, KvStream};
use anyhow::Context;
use codegen_cuda::{Launch, WeightTable};
use ir::ggml::GgmlType;
use ir::graph::{DType, Input};
use ir::interp::WeightSource;
use ir::plan::{Base, KvLayout, KvSlot, Plan, Step, ValueId};
use std::ops::Range;

/// The KV cache pairs the GPU kernels read: the one place to change when the printer
/// learns more.
pub fn kv_pair_supported(k: DType, v: DType) -> bool {
    matches!(
        (k, v),
        (DType::F16, DType::F16)
            | (DType::F32, DType::F32)
            | (DType::Block(GgmlType::Q8_0), DType::Block(GgmlType::Q8_0))
    )
}

/// What the GPU backends run: every weight type the kernel printer has a dequantizer for
/// ([`codegen_cuda::kernels::dequant::has_dequantizer`]), and the KV cache pairs of
/// [`kv_pair_supported`].
pub fn support() -> Support {
    Support {
        weight_types: GgmlType::ALL
            .iter()
            .copied()
            .filter(|&t| codegen_cuda::kernels::dequant::has_dequantizer(t))
            .collect(),
        kv_pairs: Support::kv_pairs_from(kv_pair_supported),
    }
}

/// The KV layout of one sequence of `opts.n_ctx` cells a GPU backend gives `plan`: its
/// sliding-window caches rings ([`Plan::kv_layout_ring`] at [`Plan::ring_ubatch`]) unless
/// `opts.swa_full`, as the program's kernels are generated ([`check_program`] refuses the
/// other); for the memory check and the memory report.
///
/// # Errors
/// A context the plan cannot hold.
pub fn kv_layout(plan: &Plan, opts: &LoadOptions) -> anyhow::Result<KvLayout> {
    let n = opts.n_ctx as u64;
    if opts.swa_full {
        plan.kv_layout(n)
    } else {
        plan.kv_layout_ring(n, plan.ring_ubatch())
    }
    .map_err(anyhow::Error::msg)
}

/// The name of a GPU target in messages (`CUDA`, `Metal`).
fn display_name(target: Target) -> &'static str {
    match target {
        Target::Cuda => "CUDA",
        Target::Metal => "Metal",
        Target::Cpu => "CPU",
    }
}

/// Where a step reads and writes its inputs and outputs in the arena: each a byte offset
/// and a number of elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    /// The tokens (`i32`).
    pub tokens: (usize, usize),
    /// The positions (`i32`).
    pub positions: (usize, usize),
    /// The output ids (`i32`).
    pub output_ids: (usize, usize),
    /// The logits (`f32`, `n_outputs × n_vocab`).
    pub logits: (usize, usize),
}

/// Byte offset in the arena of `id` of `step`, checked to be contiguous `dtype` of `n`
/// elements inside `arena_bytes`.
///
/// # Errors
/// A value outside the arena, unplanned, or of another type or size.
pub fn arena_at(
    step: &Step,
    id: ValueId,
    dtype: DType,
    n: usize,
    arena_bytes: u64,
    what: &str,
) -> anyhow::Result<(usize, usize)> {
    let v = step
        .values
        .get(id.index())
        .with_context(|| format!("step n_tokens={}: {what}: no value {}", step.n_tokens, id.0))?;
    let Base::Arena(b) = v.base else {
        anyhow::bail!(
            "step n_tokens={}: {what} is not in the arena",
            step.n_tokens
        );
    };
    let buf_off = step
        .buffers
        .get(b.index())
        .and_then(|b| b.offset)
        .with_context(|| {
            format!(
                "step n_tokens={}: {what}: buffer not planned",
                step.n_tokens
            )
        })?;
    let count: u64 = v.shape.ne.iter().product();
    anyhow::ensure!(
        v.dtype == dtype && v.is_contiguous() && count == n as u64,
        "step n_tokens={}: {what} must be {n} contiguous {} (it is {} of {:?})",
        step.n_tokens,
        dtype.name(),
        v.dtype.name(),
        v.shape.ne
    );
    let start = buf_off
        .checked_add(v.offset)
        .filter(|s| {
            s.checked_add(count * dtype.type_size())
                .is_some_and(|e| e <= arena_bytes)
        })
        .with_context(|| {
            format!(
                "step n_tokens={}: {what} lies outside the arena",
                step.n_tokens
            )
        })?;
    Ok((start as usize, n))
}

/// A GPU program as the host checks it, whatever its dialect: per step of the plan its
/// shape and launches, and the sizes of the three buffers of the kernel ABI.
#[derive(Clone, Copy, Debug)]
pub struct ProgramView<'a> {
    /// The target it was generated for (for messages).
    pub target: Target,
    /// Its steps, in the plan's order.
    pub steps: &'a [StepView<'a>],
    /// Where the weights lie in the weight buffer.
    pub weights: &'a WeightTable,
    /// Cells of the KV memory the kernels were generated for.
    pub kv_cells: u64,
    /// The ubatch its sliding-window rings were sized for (`None`: full-size caches).
    pub kv_ring_ubatch: Option<u32>,
    /// Bytes of one sequence's KV memory.
    pub kv_bytes: u64,
    /// Bytes of the arena.
    pub arena_bytes: u64,
}

/// One step of a [`ProgramView`].
#[derive(Clone, Copy, Debug)]
pub struct StepView<'a> {
    /// Tokens of the step.
    pub n_tokens: u32,
    /// Logit rows of the step.
    pub n_outputs: u32,
    /// Its launches, in order.
    pub launches: &'a [Launch],
}

/// A step the engine loads: its index in the plan and program, its shape and its [`Io`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepIo {
    /// Index of the step in the plan (and the program).
    pub index: usize,
    /// Tokens of the step.
    pub n_tokens: u32,
    /// Logit rows of the step.
    pub n_outputs: u32,
    /// Where its inputs and logits lie in the arena.
    pub io: Io,
}

/// What [`check_program`] found: everything a device needs to load the program.
#[derive(Debug)]
pub struct Checked<'w> {
    /// Where the caches lie in one device KV memory (the program's `kv_cells`, its
    /// sliding-window caches rings unless it was generated with full-size ones).
    pub device_kv: KvLayout,
    /// Length of a logit row.
    pub n_vocab: usize,
    /// The steps the caller's [`LoadOptions::logits`] keeps, in plan order.
    pub steps: Vec<StepIo>,
    /// Each weight's byte offset in the weight buffer and its bytes in the model file.
    pub weights: Vec<(usize, &'w [u8])>,
}

/// Checks `program` (built from `plan`) and `weights` before anything is put on a device:
/// the context asked for, the weight layout, the KV memory and arena sizes, each kept step's
/// launches (grid and block within the limits of both APIs) and inputs; then every weight
/// against the plan.
///
/// # Errors
/// A context past the compiled one, `-fa off`, `opts.swa_full` other than the KV layout the
/// kernels were generated for (rings or full-size caches), a program that does not match
/// its plan, a step that takes other inputs, a weight the source lacks or holds in another type or
/// shape; each in one line.
pub fn check_program<'w>(
    plan: &Plan,
    program: &ProgramView<'_>,
    weights: &'w dyn WeightSource,
    opts: &LoadOptions,
) -> anyhow::Result<Checked<'w>> {
    let (target, name) = (program.target.name(), display_name(program.target));
    anyhow::ensure!(
        opts.n_ctx >= 1 && opts.n_ctx as u64 <= program.kv_cells,
        "-c {}: this program was compiled for a context of at most {} (recompile with modelc compile -c {})",
        opts.n_ctx,
        program.kv_cells,
        opts.n_ctx
    );
    anyhow::ensure!(
        opts.flash_attn,
        "--target {target}: -fa off is not supported (the {name} kernels compute flash attention)"
    );
    anyhow::ensure!(
        program.steps.len() == plan.steps.len(),
        "corrupt {name} program: {} step programs for {} plan steps",
        program.steps.len(),
        plan.steps.len()
    );
    let table = WeightTable::new(plan).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        &table == program.weights,
        "corrupt {name} program: its weight layout is not the plan's"
    );
    anyhow::ensure!(
        program.kv_cells <= u64::from(plan.n_ctx),
        "corrupt {name} program: {} KV cells for a plan of n_ctx {}",
        program.kv_cells,
        plan.n_ctx
    );
    let largest = plan.steps.iter().map(|s| s.n_tokens).max().unwrap_or(1);
    let device_kv = match program.kv_ring_ubatch {
        Some(ub) => {
            anyhow::ensure!(
                ub >= largest,
                "corrupt {name} program: KV rings for ubatches of {ub} tokens, a step of {largest}"
            );
            plan.kv_layout_ring(program.kv_cells, ub)
        }
        None => plan.kv_layout(program.kv_cells),
    }
    .map_err(anyhow::Error::msg)?;
    // The kernels are generated for one layout: --swa-full is chosen when compiling.
    if let Some(c) = device_kv
        .caches
        .iter()
        .find(|c| c.is_ring(device_kv.n_cells))
        .filter(|_| opts.swa_full)
    {
        anyhow::bail!(
            "--swa-full: this program keeps its sliding-window caches as rings of {} cells (its kernels are generated for them); compile one with full-size caches with `modelc compile MODEL --target {target} --swa-full`",
            c.n_cells
        );
    }
    if program.kv_ring_ubatch.is_none() && !opts.swa_full {
        let ring = plan
            .kv_layout_ring(program.kv_cells, plan.ring_ubatch())
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            !ring.has_ring(),
            "this program was compiled with --swa-full (full-size sliding-window caches; its kernels are generated for them): run it with --swa-full, or compile it without"
        );
    }
    anyhow::ensure!(
        device_kv.stream_bytes == program.kv_bytes,
        "corrupt {name} program: {} KV bytes, the plan's layout has {}",
        program.kv_bytes,
        device_kv.stream_bytes
    );
    anyhow::ensure!(
        program.arena_bytes >= plan.arena_bytes(),
        "corrupt {name} program: an arena of {} bytes for a plan that needs {}",
        program.arena_bytes,
        plan.arena_bytes()
    );
    // The vocabulary: the rows of the first step's logits.
    let n_vocab = plan
        .steps
        .first()
        .and_then(|s| s.values.get(s.outputs.first()?.index()))
        .map(|v| v.shape.ne[0] as usize)
        .filter(|&n| n > 0)
        .with_context(|| format!("corrupt {name} program: the plan's first step has no logits"))?;
    let keep = |s: &Step| match opts.logits {
        LogitRows::Both => true,
        LogitRows::Last => s.n_outputs == 1,
        LogitRows::All => s.n_outputs == s.n_tokens,
    };
    // Inputs and outputs of the kept steps.
    let mut steps = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        if !keep(s) {
            continue;
        }
        let p = &program.steps[i];
        anyhow::ensure!(
            p.n_tokens == s.n_tokens && p.n_outputs == s.n_outputs,
            "corrupt {name} program: step {i} is {}x{}, the plan's is {}x{}",
            p.n_tokens,
            p.n_outputs,
            s.n_tokens,
            s.n_outputs
        );
        for l in p.launches {
            anyhow::ensure!(
                l.block > 0
                    && l.block <= 1024
                    && l.block % codegen_cuda::SIMD_WIDTH == 0
                    && l.grid.iter().all(|&g| g > 0)
                    && l.grid[1] <= 65535
                    && l.grid[2] <= 65535
                    && l.operands.len() <= codegen_cuda::MAX_OPERANDS,
                "corrupt {name} program: launch of {} with grid {:?} and block {}",
                l.kernel,
                l.grid,
                l.block
            );
        }
        if let Some(d) = s.inputs.iter().find(|x| x.kind == Input::Data) {
            anyhow::bail!(
                "step n_tokens={}: the {name} engine feeds tokens, positions and output ids only (data input {})",
                s.n_tokens,
                s.values.get(d.value.index()).map_or("?", |v| v.name.as_str())
            );
        }
        let input = |kind: Input, n: u32, what: &str| {
            let id = s
                .input(&kind)
                .with_context(|| format!("step n_tokens={}: no {what} input", s.n_tokens))?;
            arena_at(s, id, DType::I32, n as usize, program.arena_bytes, what)
        };
        let logits_id = *s
            .outputs
            .first()
            .with_context(|| format!("step n_tokens={}: no outputs", s.n_tokens))?;
        let io = Io {
            tokens: input(Input::Tokens, s.n_tokens, "tokens")?,
            positions: input(Input::Positions, s.n_tokens, "positions")?,
            output_ids: input(Input::OutputIds, s.n_outputs, "output ids")?,
            logits: arena_at(
                s,
                logits_id,
                DType::F32,
                s.n_outputs as usize * n_vocab,
                program.arena_bytes,
                "the logits",
            )?,
        };
        steps.push(StepIo {
            index: i,
            n_tokens: s.n_tokens,
            n_outputs: s.n_outputs,
            io,
        });
    }
    anyhow::ensure!(
        !steps.is_empty(),
        "the program has no steps that give {}",
        if opts.logits == LogitRows::All {
            "a logit row per token (recompile it)"
        } else {
            "one logit row per ubatch (recompile it)"
        }
    );
    // Every weight, checked against the plan before anything is allocated.
    let mut sources = Vec::with_capacity(plan.weights.len());
    for (w, &off) in plan.weights.iter().zip(&table.offsets) {
        let r = weights
            .weight(&w.name)
            .with_context(|| format!("the model file has no tensor {}", w.name))?;
        let bytes = w.bytes().context("weight size overflows")?;
        anyhow::ensure!(
            r.ggml_type == w.dtype.ggml_type() && r.data.len() as u64 == bytes,
            "tensor {}: the file holds {} {:?} ({} bytes), the program reads {} {:?} ({} bytes)",
            w.name,
            r.ggml_type.name(),
            r.ne,
            r.data.len(),
            w.dtype.name(),
            w.shape.ne,
            bytes
        );
        sources.push((off as usize, r.data));
    }
    Ok(Checked {
        device_kv,
        n_vocab,
        steps,
        weights: sources,
    })
}

/// What a GPU engine needs of its device: the arena's inputs and outputs, a step's
/// launches, and each sequence's KV memory. Steps are numbered as [`GpuEngine`]'s (the
/// order of [`Checked::steps`]); sequences as [`KvStream::index`].
pub trait GpuDevice {
    /// Makes sure sequence `stream` has its KV memory (zeroed when new), and whatever runs
    /// over it.
    ///
    /// # Errors
    /// What the device reports (out of memory).
    fn open_stream(&mut self, stream: usize) -> anyhow::Result<()>;

    /// Writes `values` at byte `at` of the arena (after the work already queued).
    ///
    /// # Errors
    /// A range outside the arena, or what the device reports.
    fn write_i32(&mut self, at: usize, values: &[i32]) -> anyhow::Result<()>;

    /// Runs (or queues) the launches of step `step` over the KV memory of `stream`.
    ///
    /// # Errors
    /// A stream not opened, or what the device reports.
    fn run(&mut self, stream: usize, step: usize) -> anyhow::Result<()>;

    /// Waits for the queued work and appends the `n` `f32` at byte `at` of the arena to `out`.
    ///
    /// # Errors
    /// A range outside the arena, or what the device reports (a step that failed).
    fn read_f32(&mut self, at: usize, n: usize, out: &mut Vec<f32>) -> anyhow::Result<()>;

    /// Zeroes `bytes` of the KV memory of `stream`, if it has one; a failure surfaces at
    /// the next call that runs or reads.
    fn zero_kv(&mut self, stream: usize, bytes: Range<u64>);

    /// The device memory held: weights, and arena plus KV memory.
    fn memory(&self) -> EngineMemory;
}

/// A GPU program loaded on a device: the [`Engine`] of every GPU backend (module doc).
pub struct GpuEngine<D: GpuDevice> {
    dev: D,
    steps: Vec<StepIo>,
    /// Where the caches lie in one device KV memory.
    device_kv: KvLayout,
    /// The session's view: no bytes (the KV memory is on the device).
    layout: KvLayout,
    n_vocab: usize,
    n_ctx: usize,
    last_sizes: Vec<u32>,
    all_sizes: Vec<u32>,
    logits: Vec<f32>,
}

impl<D: GpuDevice> GpuEngine<D> {
    /// The engine over `dev`, which holds the program `checked` describes, for sequences
    /// of `n_ctx` positions; opens sequence 0.
    ///
    /// # Errors
    /// What the device reports opening sequence 0.
    pub fn new(dev: D, checked: Checked<'_>, n_ctx: usize) -> anyhow::Result<GpuEngine<D>> {
        let sizes = |all: bool| -> Vec<u32> {
            let mut v: Vec<u32> = checked
                .steps
                .iter()
                .filter(|s| {
                    if all {
                        s.n_outputs == s.n_tokens
                    } else {
                        s.n_outputs == 1
                    }
                })
                .map(|s| s.n_tokens)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (last_sizes, all_sizes) = (sizes(false), sizes(true));
        // No bytes, only each cache's cells (a ring's at most the context), so that the
        // session knows which positions a ring still holds (KvLayout::can_truncate).
        let layout = KvLayout {
            n_cells: n_ctx as u64,
            caches: checked
                .device_kv
                .caches
                .iter()
                .map(|c| KvSlot {
                    offset: 0,
                    row_bytes: 0,
                    n_cells: c.n_cells.min(n_ctx as u64),
                    window: c.window,
                })
                .collect(),
            stream_bytes: 0,
        };
        let mut e = GpuEngine {
            dev,
            steps: checked.steps,
            device_kv: checked.device_kv,
            layout,
            n_vocab: checked.n_vocab,
            n_ctx,
            last_sizes,
            all_sizes,
            logits: Vec::new(),
        };
        e.dev.open_stream(0)?;
        Ok(e)
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Writes `values` at `at` (offset, count) of the arena.
    fn write(&mut self, at: (usize, usize), values: &[i32]) -> anyhow::Result<()> {
        anyhow::ensure!(
            values.len() == at.1,
            "internal: {} inputs for {}",
            values.len(),
            at.1
        );
        self.dev.write_i32(at.0, values)
    }

    /// Appends the first `rows` logit rows of step `si` to `self.logits`.
    fn read_logits(&mut self, si: usize, rows: usize) -> anyhow::Result<()> {
        let (at, n) = self.steps[si].io.logits;
        let n = (rows * self.n_vocab).min(n);
        self.dev.read_f32(at, n, &mut self.logits)
    }
}

impl<D: GpuDevice> Engine for GpuEngine<D> {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Calls are cut into compiled steps here, as the CPU engine's are.
    fn max_ubatch(&self) -> usize {
        self.last_sizes
            .iter()
            .chain(&self.all_sizes)
            .map(|&s| s as usize)
            .max()
            .unwrap_or(1)
            .max(512)
    }

    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    fn memory(&self) -> EngineMemory {
        self.dev.memory()
    }

    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        check_decode_args(self, tokens, pos0)?;
        let sizes = crate::engine::step_sizes(&self.all_sizes, &self.last_sizes, all_logits, "")?;
        let cut =
            ir::plan::schedule::chunks(sizes, pos0 as u32, tokens.len() as u32, self.n_ctx as u32)?;
        self.dev.open_stream(kv.index)?;
        self.logits.clear();
        let mut done = 0usize;
        for (ci, c) in cut.iter().enumerate() {
            let n_real = c.n_real as usize;
            let si = self
                .steps
                .iter()
                .position(|s| {
                    s.n_tokens == c.n_tokens
                        && s.n_outputs == if all_logits { c.n_tokens } else { 1 }
                })
                .context("internal: no step for a chunk")?;
            let real: Vec<i32> = tokens[done..done + n_real]
                .iter()
                .map(|&t| t as i32)
                .collect();
            let out_ids: Vec<i32> = if all_logits {
                (0..c.n_tokens as i32).collect()
            } else {
                vec![c.last_row()]
            };
            let io = self.steps[si].io;
            self.write(io.tokens, &c.tokens(&real))?;
            self.write(io.positions, &c.positions())?;
            self.write(io.output_ids, &out_ids)?;
            self.dev.run(kv.index, si)?;
            // Padding rows are stored too, at the positions after the real ones.
            kv.written = kv.written.max(c.kv_len() as usize);
            if all_logits {
                self.read_logits(si, n_real)?;
            } else if ci + 1 == cut.len() {
                self.read_logits(si, 1)?;
            }
            done += n_real;
        }
        Ok(&self.logits)
    }

    fn forget(&mut self, stream: usize, from: usize) {
        // A ring's cells past a cut hold positions the next tokens overwrite before they
        // see them (the session cuts a ring only where KvLayout::can_truncate says so):
        // only a cut to 0 clears them (clearing `from..` would take the whole ring).
        let mut kv = self.device_kv.clone();
        if from > 0 {
            kv.caches.retain(|c| !c.is_ring(kv.n_cells));
        }
        for r in kv.cell_ranges(from as u64, kv.n_cells) {
            self.dev.zero_kv(stream, r);
        }
    }
}
