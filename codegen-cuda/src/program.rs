//! What the GPU code generators make of a plan: per step one self-contained source file and
//! the launches that run it, plus where each weight lies in the device's weight buffer.
//!
//! # The kernel ABI (shared by CUDA and Metal)
//!
//! Every generated kernel takes the same three buffers, in this order, then its operands:
//!
//! | # | name    | what it holds                                                          |
//! |---|---------|------------------------------------------------------------------------|
//! | 0 | `arena` | the step's arena ([`ir::plan::Step::buffers`] at their planned offsets) |
//! | 1 | `kv`    | one sequence's KV memory, laid out as [`ir::plan::Plan::kv_layout_ring`] (or [`ir::plan::Plan::kv_layout`], [`GpuProgram::kv_ring_ubatch`]) of the plan's `n_ctx` cells |
//! | 2 | `wts`   | every weight of the plan, at the offsets of [`WeightTable`]              |
//!
//! and a fourth argument, `ops`, an [`Operands`] by value (CUDA) or in a small constant
//! buffer (Metal `[[buffer(3)]]`): the byte offset of each of the kernel's operands in its
//! buffer ([`Launch::operands`]). Shapes and strides are constants in the source; offsets
//! are not, so the kernels of every layer, which differ only in where their operands lie,
//! are one kernel in the source, compiled once and launched once per layer with that
//! layer's offsets. The one quantity known only at
//! run time, the KV length of an attention kernel, is read from the step's positions input
//! (the keys a causal query at position `p` sees end at `p`): a step is a fixed sequence of
//! launches with fixed arguments, which is what a CUDA graph captures and replays.
//!
//! A kernel runs on a grid of `grid` thread blocks (threadgroups) of `block` threads; threads
//! are grouped in SIMD groups (warps) of 32. The host writes the step's inputs (tokens,
//! positions, output ids) into the arena, runs the launches in order, and reads the outputs
//! (the logits first) back from the arena.

use serde::{Deserialize, Serialize};

/// Width of a SIMD group (a CUDA warp, an Apple simdgroup) the kernels are written for.
pub const SIMD_WIDTH: u32 = 32;

/// Operand offsets a kernel takes at most (the size of `Operands::at` in the preludes).
pub const MAX_OPERANDS: usize = 16;

/// Alignment of each weight in the device weight buffer, in bytes (cudaMalloc's alignment;
/// more than any load the kernels make).
pub const WEIGHT_ALIGN: u64 = 256;

/// One kernel launch of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The kernel's function name in the step's source (`k12_mul_mat_add`; the name of the
    /// first plan kernel with this code).
    pub kernel: String,
    /// Index of the plan kernel it computes ([`ir::plan::Step::kernels`]).
    pub plan_kernel: u32,
    /// Thread blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads per block (a multiple of [`SIMD_WIDTH`], at most 1024).
    pub block: u32,
    /// The kernel's `ops.at[i]`: byte offsets of its operands in their buffers (at most
    /// [`MAX_OPERANDS`]; the rest of the argument is zeros).
    pub operands: Vec<u64>,
}

impl Launch {
    /// The operands as the kernel's fourth argument: [`MAX_OPERANDS`] offsets, zero-padded.
    pub fn operand_array(&self) -> [u64; MAX_OPERANDS] {
        let mut a = [0u64; MAX_OPERANDS];
        for (d, s) in a.iter_mut().zip(&self.operands) {
            *d = *s;
        }
        a
    }
}

/// The program of one step (one ubatch shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepProgram {
    /// Tokens of the step ([`ir::plan::Step::n_tokens`]).
    pub n_tokens: u32,
    /// Logit rows of the step ([`ir::plan::Step::n_outputs`]).
    pub n_outputs: u32,
    /// The complete source of the step: prelude, helper functions, every kernel. Compiles on
    /// its own.
    pub source: String,
    /// The launches, in execution order.
    pub launches: Vec<Launch>,
}

/// Where each weight of the plan lies in the device weight buffer: its bytes as the GGUF
/// stores them, each at a multiple of [`WEIGHT_ALIGN`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightTable {
    /// Byte offset of weight `i` ([`ir::plan::Plan::weights`] order).
    pub offsets: Vec<u64>,
    /// Bytes of the whole buffer.
    pub bytes: u64,
}

impl WeightTable {
    /// Lays the plan's weights out back to back, each aligned.
    ///
    /// # Errors
    /// A weight whose size is not whole blocks, or a total that overflows.
    pub fn new(plan: &ir::plan::Plan) -> Result<WeightTable, String> {
        let mut offsets = Vec::with_capacity(plan.weights.len());
        let mut end = 0u64;
        for w in &plan.weights {
            let n = w
                .bytes()
                .ok_or_else(|| format!("weight {}: size is not whole blocks", w.name))?;
            offsets.push(end);
            end = end
                .checked_add(n)
                .and_then(|e| e.checked_next_multiple_of(WEIGHT_ALIGN))
                .ok_or_else(|| "the weights do not fit in memory".to_string())?;
        }
        Ok(WeightTable {
            offsets,
            bytes: end,
        })
    }
}

/// A plan's GPU program for one target dialect: the steps' sources and launches, and the
/// weight layout they were generated for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProgram {
    /// One program per step of the plan, in the plan's step order.
    pub steps: Vec<StepProgram>,
    /// Where the weights lie in `wts`.
    pub weights: WeightTable,
    /// Cells per KV cache the kernels were generated for (the plan's `n_ctx`).
    pub kv_cells: u64,
    /// The ubatch the sliding-window caches' rings were sized for
    /// ([`ir::plan::Plan::kv_layout_ring`]); `None`: every cache has `kv_cells` cells
    /// (`--swa-full`, and programs made before rings).
    #[serde(default)]
    pub kv_ring_ubatch: Option<u32>,
    /// Bytes of the KV memory (the stream bytes of that layout at `kv_cells`).
    pub kv_bytes: u64,
    /// Bytes of the arena (the largest step's).
    pub arena_bytes: u64,
}
