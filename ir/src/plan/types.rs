//! The data of a plan: the shared tables (weights, KV caches), one [`Step`] per ubatch size,
//! and inside a step the arena buffers, the typed values that view them, and the kernels.

use super::kernel::KernelOp;
use crate::graph::{contiguous_nb, DType, Input, KvKind, Shape, MAX_DIMS};
use serde::{Deserialize, Serialize};

/// Version of the plan's serialized form; [`Plan::from_json`] refuses other versions.
pub const PLAN_FORMAT: u32 = 1;

/// Default alignment of arena offsets in bytes: a cache line, and a multiple of every vector
/// width the targets load (16 B on CPU, 16 B `float4` on CUDA and Metal).
pub const DEFAULT_ALIGN: u64 = 64;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub u32);

        impl $name {
            /// The index as usize.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}

id_type!(
    /// Index of a weight in [`Plan::weights`].
    WeightId
);
id_type!(
    /// Index of a KV cache in [`Plan::kv`].
    KvId
);
id_type!(
    /// Index of an arena buffer in [`Step::buffers`].
    BufferId
);
id_type!(
    /// Index of a value in [`Step::values`].
    ValueId
);
id_type!(
    /// Index of a kernel in [`Step::kernels`] (its position in the execution order).
    KernelId
);

/// A weight the plan reads, referenced by its GGUF tensor name (the data stays in the file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightBuf {
    /// The GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Storage type as in the GGUF (a GGML block type for quantized weights).
    pub dtype: DType,
    /// Shape (ggml `ne`).
    pub shape: Shape,
}

impl WeightBuf {
    /// Bytes of the tensor data (`None` if the shape is not whole blocks or overflows).
    pub fn bytes(&self) -> Option<u64> {
        dense_bytes(self.dtype, &self.shape)
    }
}

/// One layer's K or V cache: persistent across steps, `{n_embd_gqa, n_ctx}`, row `i` holding
/// position `i` (llama.cpp's unified KV cache for one sequence).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvBuf {
    /// Name as the graph's cache input (`cache_k_l0`).
    pub name: String,
    /// Layer index.
    pub layer: u32,
    /// Keys or values.
    pub kind: KvKind,
    /// Element type (F16 by default, as llama.cpp).
    pub dtype: DType,
    /// Shape `{n_embd_gqa, n_ctx}`.
    pub shape: Shape,
    /// The sliding window of the attention that reads this cache (`None`: it attends to
    /// every position). Such a cache may be a ring of fewer cells ([`Plan::kv_layout_ring`]).
    #[serde(default)]
    pub window: Option<u32>,
}

impl KvBuf {
    /// Bytes of the cache.
    pub fn bytes(&self) -> Option<u64> {
        dense_bytes(self.dtype, &self.shape)
    }
}

/// A region of the step's arena holding one or more values over its lifetime (an
/// intermediate result, a step input, the logits; with in-place reuse, a chain of results).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// Name of the first value stored in it.
    pub name: String,
    /// Size in bytes (upper bound over the symbolic KV length).
    pub bytes: u64,
    /// Byte offset in the arena; `None` until the memory planner runs.
    pub offset: Option<u64>,
}

/// Where the bytes of a value live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Base {
    /// An arena buffer of the step.
    Arena(BufferId),
    /// A weight of the plan (read only).
    Weight(WeightId),
    /// A KV cache of the plan (persistent, updated in place by the KV store kernels).
    Kv(KvId),
}

/// A typed, strided view of bytes: what a kernel reads or writes. Graph views (reshape, view,
/// permute) become values over their source's bytes, with no kernel of their own.
///
/// Element `i` (a 4-index, innermost first) of a value of plain dtype lies at byte
/// `offset + Σ i[d] * nb[d]` of its base; for block types `i[0]` counts whole blocks of
/// `nb[0]` bytes. Dimensions flagged symbolic in `shape.kv` take the step's KV length when the
/// step runs; `shape.ne` holds their bound, and the strides do not depend on the actual length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Value {
    /// Name (the graph tensor's name: `Qcur-0`, `attn_norm-0`, `blk.0.ffn_up.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (ggml `ne`).
    pub shape: Shape,
    /// The bytes it views.
    pub base: Base,
    /// Byte offset of the first element in the base.
    pub offset: u64,
    /// Byte stride of each dimension.
    pub nb: [u64; MAX_DIMS],
}

impl Value {
    /// A contiguous value of `dtype` and `shape` at byte 0 of `base`.
    pub fn dense(name: impl Into<String>, dtype: DType, shape: Shape, base: Base) -> Value {
        Value {
            name: name.into(),
            dtype,
            shape,
            base,
            offset: 0,
            nb: contiguous_nb(dtype, &shape),
        }
    }

    /// Whether the elements lie back to back in `ne` order (at the bound).
    pub fn is_contiguous(&self) -> bool {
        let want = contiguous_nb(self.dtype, &self.shape);
        (0..MAX_DIMS).all(|d| self.shape.ne[d] == 1 || self.nb[d] == want[d])
    }

    /// One past the last byte the value can touch in its base, at the bound of the symbolic
    /// dimensions (`offset` for an empty value), or `None` on overflow or ragged blocks.
    pub fn end(&self) -> Option<u64> {
        let bs = self.dtype.block_size();
        if self.shape.ne.contains(&0) {
            return Some(self.offset);
        }
        if self.shape.ne[0] % bs != 0 {
            return None;
        }
        let mut end = (self.shape.ne[0] / bs - 1).checked_mul(self.nb[0])?;
        end = end.checked_add(self.dtype.type_size())?;
        for d in 1..MAX_DIMS {
            end = end.checked_add((self.shape.ne[d] - 1).checked_mul(self.nb[d])?)?;
        }
        end.checked_add(self.offset)
    }

    /// Whether `self` and `other` are the same elements at the same places (same base,
    /// offset, dtype, shape and strides; names may differ).
    pub fn same_view(&self, other: &Value) -> bool {
        self.base == other.base
            && self.offset == other.offset
            && self.dtype == other.dtype
            && self.shape == other.shape
            && self.nb == other.nb
    }
}

/// A step input the caller fills before the kernels run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepInput {
    /// What it holds ([`Input::Tokens`], [`Input::Positions`], [`Input::OutputIds`] or
    /// [`Input::Data`]; weights and caches are not step inputs).
    pub kind: Input,
    /// The value (an arena buffer, contiguous).
    pub value: ValueId,
}

/// One kernel: a fused op over typed values, run in list order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Name (the graph name of its main result: `Qcur-0`, `ffn_out-3`, `result_output`).
    pub name: String,
    /// What it computes ([`KernelOp`] documents its sources and results).
    pub op: KernelOp,
    /// Values read, in the op's order.
    pub srcs: Vec<ValueId>,
    /// Values written, in the op's order.
    pub dsts: Vec<ValueId>,
    /// Names of the graph nodes whose results this kernel computes, in graph order (views
    /// compute nothing and belong to no kernel).
    pub nodes: Vec<String>,
    /// Opaque annotation of a target (tile sizes, thread split, weight layout), ignored by
    /// everything target-agnostic; `None` in a plan fresh from the passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Value>,
}

/// The kernels of one ubatch size, with every shape fixed except the KV length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Tokens per ubatch this step was specialized for (`n_ubatch`).
    pub n_tokens: u32,
    /// Rows of the ubatch that produce logits (the length of the [`Input::OutputIds`] input;
    /// llama.cpp's `n_outputs`): 1 for generation, `n_tokens` to score every position.
    pub n_outputs: u32,
    /// Arena regions (inputs, intermediates, outputs).
    pub buffers: Vec<Buffer>,
    /// Every value kernels read or write.
    pub values: Vec<Value>,
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// What the caller writes before the kernels run.
    pub inputs: Vec<StepInput>,
    /// What the caller reads after they ran (the logits first).
    pub outputs: Vec<ValueId>,
    /// Bytes of arena this step needs (0 until the memory planner runs).
    pub arena_bytes: u64,
}

impl Step {
    /// The value `id`. Panics if `id` is not from this step (ids from a verified plan are).
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    /// The input value of kind `kind`, if the step has one.
    pub fn input(&self, kind: &Input) -> Option<ValueId> {
        self.inputs
            .iter()
            .find(|i| &i.kind == kind)
            .map(|i| i.value)
    }

    /// Whether the memory planner has assigned every arena buffer an offset.
    pub fn is_planned(&self) -> bool {
        self.buffers.iter().all(|b| b.offset.is_some())
    }
}

/// How a prompt longer than one ubatch, or shorter than the chosen one, is split into steps
/// (see [`super::schedule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TailPolicy {
    /// The last chunk is padded to the ubatch size: padding tokens sit at the positions after
    /// the last real token; their K/V rows land in cache rows that later tokens overwrite and
    /// that causal attention hides from every real token; their logits are ignored.
    Pad,
}

/// A compiled model: the ordered kernels for each ubatch size, with every buffer assigned.
///
/// Target-agnostic: weights are referenced by GGUF name in their file layout, every shape is
/// a number (the KV length excepted), and target specifics live only in
/// [`Kernel::target`]. Stored as JSON ([`Plan::to_json`], [`Plan::from_json`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Format version ([`PLAN_FORMAT`]).
    pub format: u32,
    /// Rows of each KV cache: the largest number of positions (`n_ctx`).
    pub n_ctx: u32,
    /// Alignment of arena offsets in bytes.
    pub align: u64,
    /// How the last chunk of a prompt is handled.
    pub tail: TailPolicy,
    /// Weights read by any step, each once.
    pub weights: Vec<WeightBuf>,
    /// KV caches, shared by all steps.
    pub kv: Vec<KvBuf>,
    /// One step per compiled shape, in increasing `(n_tokens, n_outputs)`.
    pub steps: Vec<Step>,
    /// Opaque annotation of the target the kernels were chosen for (the CPU backend's
    /// `select-kernels` pass writes the CPU and the summation order here, and each kernel's
    /// choice in [`Kernel::target`]); `None` in a plan fresh from the passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Value>,
}

impl Plan {
    /// Arena bytes for any step: the largest step's need (one arena serves all steps).
    pub fn arena_bytes(&self) -> u64 {
        self.steps.iter().map(|s| s.arena_bytes).max().unwrap_or(0)
    }

    /// Bytes of all KV caches.
    pub fn kv_bytes(&self) -> u64 {
        self.kv.iter().filter_map(KvBuf::bytes).sum()
    }

    /// Bytes of all weights read (each tensor counted once, tied matrices included).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.iter().filter_map(WeightBuf::bytes).sum()
    }

    /// The distinct ubatch sizes, increasing.
    pub fn ubatch_sizes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.steps.iter().map(|s| s.n_tokens).collect();
        v.dedup();
        v
    }

    /// The step for exactly `n_tokens` tokens and `n_outputs` logit rows, if compiled.
    pub fn step(&self, n_tokens: u32, n_outputs: u32) -> Option<&Step> {
        self.steps
            .iter()
            .find(|s| s.n_tokens == n_tokens && s.n_outputs == n_outputs)
    }

    /// The weight named `name`.
    pub fn weight(&self, name: &str) -> Option<WeightId> {
        self.weights
            .iter()
            .position(|w| w.name == name)
            .map(|i| WeightId(i as u32))
    }

    /// The plan as JSON.
    pub fn to_json(&self) -> String {
        // Plain data with string keys and finite numbers (NaN parameters never reach a plan
        // that verified): serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a plan from JSON and verifies it ([`Plan::verify`]).
    ///
    /// # Errors
    /// [`super::PlanError::Serde`] for malformed JSON or another format version, or what
    /// the verifier finds.
    pub fn from_json(s: &str) -> Result<Plan, super::PlanError> {
        let p: Plan =
            serde_json::from_str(s).map_err(|e| super::PlanError::Serde(e.to_string()))?;
        if p.format != PLAN_FORMAT {
            return Err(super::PlanError::Serde(format!(
                "plan format {} (this build reads {PLAN_FORMAT})",
                p.format
            )));
        }
        p.verify()?;
        Ok(p)
    }
}

/// Bytes of a contiguous `dtype` tensor of `shape` at its bound.
pub fn dense_bytes(dtype: DType, shape: &Shape) -> Option<u64> {
    dtype
        .row_size(shape.ne[0])?
        .checked_mul(shape.ne[1])?
        .checked_mul(shape.ne[2])?
        .checked_mul(shape.ne[3])
}
