//! The reference interpreter: executes any [`crate::graph::Graph`] in f32, the oracle every
//! pass and backend is checked against (DESIGN.md principle 2).
//!
//! - Weights are read in place from a [`WeightSource`] (a GGUF file's map) and dequantized
//!   with the exact reference dequantizer ([`crate::ggml::dequantize`]).
//! - The KV caches are persistent state (F16 by default, as llama.cpp, or F32), kept by the
//!   [`Interpreter`] across runs; ubatches of any size, any positions.
//! - [`InterpOptions::exact`] computes with f32 activations throughout (the KV cache keeps
//!   its own type). [`InterpOptions::llama_cpp`] reproduces llama.cpp's CPU backend on x86-64:
//!   activations converted to the weight type's companion format (Q8_0 / Q8_1 / Q8_K, F16,
//!   BF16) before each product with a weight; flash attention (or, with it off, Q and the
//!   softmax probabilities rounded to f16); GELU from ggml's f16 table; and, where known, the
//!   operation order of ggml's AVX2 kernels and of GCC's fused multiply-adds (`avx2`, `flash`
//!   modules). With it the interpreter gives llama.cpp's logits bit for bit on the shared
//!   fixtures (F32, F16, BF16, Q8_0, Q4_1 weights; llama, qwen2, qwen3, gemma3, phi3) and on
//!   SmolLM2 Q4_1; `shared/fixtures/README.md` explains why the roundings matter.
//! - [`Session`] is the token-level API: `eval(tokens, pos0, outputs) -> logits`.
//!
//! Kernels are plain loops written in the order ggml-cpu computes (sums of squares and
//! exponentials in f64); the hot loops have AVX/AVX2 versions that perform the same
//! operations; mat-muls split rows over threads with `std::thread::scope`, each output
//! computed by one thread, so results do not depend on the thread count.

mod attention;
pub(crate) mod avx2;
mod elementwise;
mod exec;
mod flash;
mod layout;
mod matmul;
pub mod moe;
mod qdot;
mod rope;
mod session;
mod weights;

pub use exec::{Inputs, Interpreter, KvState};
pub use session::{GraphRequest, GraphSource, Logits, Outputs, Session, SessionOptions};
pub use weights::{MemWeights, WeightRef, WeightSource};

use crate::ggml::Q8Flavor;
use crate::graph::GraphError;

/// How the interpreter rounds (see the module doc) and how many threads it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpOptions {
    /// Convert activations to the weight type's `vec_dot_type` before each product with an
    /// F16, BF16 or quantized operand, and use ggml's reference dot products
    /// (`ggml_compute_forward_mul_mat`).
    pub matmul_rounding: bool,
    /// Round Q to f16 before the scores and the softmax probabilities to f16 before the
    /// product with V (llama.cpp without flash attention).
    pub attn_f16: bool,
    /// Reproduce llama.cpp's CPU flash attention (f16 Q, online softmax, f16 V accumulator;
    /// the tiled and split-KV variants where ggml uses them); takes precedence over
    /// `attn_f16`. llama.cpp enables flash attention by default (`flash_attn_type` auto)
    /// where the backend supports it, as the CPU does; `shared/fixtures/` was made with it off.
    pub flash_attn: bool,
    /// Evaluate GELU from ggml's f16 table (`GGML_GELU_FP16`).
    pub gelu_f16: bool,
    /// Follow the operation order of llama.cpp's x86-64 AVX2/FMA kernels where it is known
    /// (the quantized products of every block type as llama.cpp's x86 `mul_mat` chooses its
    /// kernel — `ggml::vec_dot_avx2_mul_mat`, the repacked kernels of `ggml::RepackedRow` —,
    /// the vectorized `expf` of SiLU and softmax, f16 dot products in attention) instead of
    /// ggml's scalar reference order.
    pub avx2_order: bool,
    /// Which Q8_0 / Q8_1 activation quantizer to reproduce.
    pub q8_flavor: Q8Flavor,
    /// Threads for mat-muls and attention.
    pub n_threads: usize,
    /// Threads llama.cpp runs with, for the one computation whose result depends on it: its
    /// flash-attention decode over 512 or more cache cells cuts the cache into one chunk per
    /// thread. The references in `shared/` were made with 2.
    pub llama_threads: usize,
    /// Sliding-window caches as rings sized to the window, as llama.cpp sizes its SWA cache
    /// for ubatches of at most this many tokens ([`crate::plan::swa_cells`]):
    /// position `p` stored in cell `p % cells`, attention over the cells in cell order
    /// ([`crate::graph::AttnParams::visible_cells`]). `None`: every cache holds every
    /// position in its own cell. The memory stays allocated at full size either way.
    pub kv_ring_ubatch: Option<u32>,
}

impl InterpOptions {
    /// No rounding beyond the KV cache's own type: f32 activations throughout.
    pub fn exact() -> InterpOptions {
        InterpOptions {
            matmul_rounding: false,
            attn_f16: false,
            flash_attn: false,
            gelu_f16: false,
            avx2_order: false,
            q8_flavor: Q8Flavor::native(),
            n_threads: default_threads(),
            llama_threads: 2,
            kv_ring_ubatch: None,
        }
    }

    /// Every rounding llama.cpp's CPU backend does with its default settings (flash attention
    /// on), with this machine's Q8 flavor.
    pub fn llama_cpp() -> InterpOptions {
        InterpOptions {
            matmul_rounding: true,
            attn_f16: true,
            gelu_f16: true,
            avx2_order: true,
            flash_attn: true,
            ..InterpOptions::exact()
        }
    }
}

impl InterpOptions {
    /// llama.cpp's roundings ([`InterpOptions::llama_cpp`]) in ggml's scalar reference order:
    /// no x86 operation order, so the result of every row depends only on that row and the
    /// cache, never on the ubatch's size (llama.cpp's kernels switch with it: tinyBLAS from two
    /// columns, tiled flash attention from 64 tokens, split-KV decode from 512 cells). For
    /// comparing programs that batch differently (a plan that pads ubatches, a backend);
    /// [`InterpOptions::llama_cpp`] for llama.cpp's exact numbers.
    pub fn rounded() -> InterpOptions {
        InterpOptions {
            avx2_order: false,
            ..InterpOptions::llama_cpp()
        }
    }
}

impl Default for InterpOptions {
    /// [`InterpOptions::llama_cpp`]: the interpreter reproduces llama.cpp's numbers.
    fn default() -> InterpOptions {
        InterpOptions::llama_cpp()
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What went wrong while interpreting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// The graph does not verify.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A weight input with no tensor of that name in the source.
    #[error("weight {0} is not in the model")]
    MissingWeight(String),
    /// A weight whose type or shape differs from what the graph says.
    #[error("weight {name}: the graph expects {graph}, the model has {found}")]
    WeightMismatch {
        /// Tensor name.
        name: String,
        /// What the graph says.
        graph: String,
        /// What the source holds.
        found: String,
    },
    /// Inputs that do not fit the graph (lengths, KV length, positions).
    #[error("input: {0}")]
    Input(String),
    /// A node that could not be computed (e.g. a token id outside the embedding table).
    #[error("{op} {node}: {msg}")]
    Node {
        /// Result name.
        node: String,
        /// Op name.
        op: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// The graph source failed to build a graph.
    #[error("building the graph: {0}")]
    Build(String),
}

/// The interpreter's llama.cpp arithmetic (the `avx2`, `flash`, `elementwise` and `rope`
/// modules with [`InterpOptions::llama_cpp`]), exposed for backends that must compute the
/// same numbers bit for bit and for their tests. Each function is the interpreter's own
/// routine (scalar code, not meant for hot loops); the backends' fast kernels are checked
/// against these and must not call them (the oracle stays independent of what it checks).
/// The few definitions both sides share (ggml's vectorized `expf`, its softmax sum, the rope
/// angles) are in [`crate::ggml::cpu_math`].
pub mod llama_cpu {
    use super::attention::{attention as attn, AttnArgs, AttnCfg, AttnMode};
    use super::layout::Lay;
    use crate::graph::{AttnParams, RopeParams, Shape};

    /// `ggml_vec_swiglu_f32` / `ggml_vec_silu_f32` on one row: ggml's vectorized SiLU for
    /// the values in whole groups of 8, its scalar SiLU for the rest; times `g` when given.
    pub fn silu_row(x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
        super::avx2::silu_row(x, g, y)
    }

    /// `ggml_rms_norm` of one row (sum of squares in f64, in order).
    pub fn rms_norm_row(x: &[f32], y: &mut [f32], eps: f32) {
        super::elementwise::rms_norm_row(x, y, eps)
    }

    /// `ggml_norm` of one row.
    pub fn norm_row(x: &[f32], y: &mut [f32], eps: f32) {
        super::elementwise::norm_row(x, y, eps)
    }

    /// `ggml_soft_max_ext` without mask of one row, in llama.cpp's x86 numbers
    /// (`ggml_v_expf` in groups of 8).
    pub fn soft_max_row(x: &[f32], y: &mut [f32], scale: f32) {
        super::elementwise::soft_max_row_x86(x, y, scale)
    }

    /// GELU from ggml's f16 table.
    pub fn gelu_f16(x: f32) -> f32 {
        super::elementwise::gelu_f16_table(x)
    }

    /// Rope of dense `x {d, n_head, n_tokens}` (`ne` = those three), one position per token,
    /// with GCC's fused multiply-adds (as the interpreter in llama.cpp mode).
    pub fn rope(
        x: &[f32],
        ne: [usize; 3],
        pos: &[i32],
        freq_factors: Option<&[f32]>,
        p: &RopeParams,
    ) -> Vec<f32> {
        let lay = Lay::of(&Shape::new(&ne.map(|n| n as u64)), 0);
        super::rope::rope(x, &lay, pos, freq_factors, p, true)
    }

    /// Sizes of one [`attention`] evaluation.
    #[derive(Clone, Copy, Debug)]
    pub struct AttnDims {
        /// Key (and query) head size.
        pub d_k: usize,
        /// Value head size.
        pub d_v: usize,
        /// Query heads.
        pub n_head: usize,
        /// KV heads (divides `n_head`).
        pub n_head_kv: usize,
        /// Tokens of the ubatch (llama.cpp's `n_tokens`: chooses the kernel).
        pub n_tokens: usize,
        /// KV length (cells `0..n_kv` of the cache are read).
        pub n_kv: usize,
        /// KV cache size in cells (bounds the padded KV length).
        pub n_ctx: usize,
        /// The caches' types (`k` and `v` hold their values, dequantized for Q8_0).
        pub kv_types: crate::graph::KvTypes,
    }

    /// Attention as the interpreter computes it in llama.cpp mode: `flash` = llama.cpp's CPU
    /// flash attention (with `llama_threads` for its split-KV decode), else its soft_max
    /// path. `q {d_k, n_head, n_tokens}` dense; `k {d_k, n_head_kv, n_kv}` and
    /// `v {d_v, n_head_kv, n_kv}` dense (values as the cache holds them); one position per
    /// token. Returns `{d_v, n_head, n_tokens}` dense.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: &AttnDims,
        pos: &[i32],
        params: &AttnParams,
        flash: bool,
        llama_threads: usize,
    ) -> Vec<f32> {
        let d = dims;
        let kv = |w: usize| {
            Lay::of(
                &Shape::new(&[w as u64, d.n_head_kv as u64, d.n_ctx as u64]).with_kv_dim(2),
                d.n_kv as u64,
            )
        };
        let args = AttnArgs {
            q,
            lq: Lay::of(
                &Shape::new(&[d.d_k as u64, d.n_head as u64, d.n_tokens as u64]),
                0,
            ),
            k,
            lk: kv(d.d_k),
            v,
            lv: kv(d.d_v),
            k_type: d.kv_types.k,
            v_type: d.kv_types.v,
            pos,
            out: Lay::of(
                &Shape::new(&[d.d_v as u64, d.n_head as u64, d.n_tokens as u64]),
                0,
            ),
        };
        let cfg = AttnCfg {
            mode: if flash {
                AttnMode::Flash
            } else {
                AttnMode::F16
            },
            avx2: true,
            n_ctx: d.n_ctx,
            llama_threads,
            n_threads: 1,
            flavor: crate::ggml::Q8Flavor::X86,
        };
        attn(&args, params, &cfg)
    }
}
