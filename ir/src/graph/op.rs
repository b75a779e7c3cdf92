//! The operations of the IR and their parameters.
//!
//! Each op says what it computes, the shapes it takes and gives (ggml `ne`, innermost first)
//! and which ggml operator it matches; [`super::infer`] holds the shape rules and
//! [`crate::interp`] the executable definition.

use super::shape::{Shape, MAX_DIMS};
use serde::{Deserialize, Serialize};

/// How rope pairs the values of a head (`rope_type` in llama.cpp, `mode` in `ggml_rope_ext`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RopeMode {
    /// `LLAMA_ROPE_TYPE_NORM` (0): rotates adjacent pairs `(2i, 2i + 1)` (llama, SmolLM2).
    Norm,
    /// `LLAMA_ROPE_TYPE_NEOX` (2): rotates pairs `(i, i + n_rot / 2)` (qwen2, qwen3, gemma3,
    /// phi3).
    Neox,
}

/// Parameters of [`Op::Rope`], as `ggml_rope_ext` takes them.
///
/// For pair `i` (0 ≤ i < n_rot / 2) at position `p`: `theta = p * freq_base^(-2i / n_rot)`,
/// computed as ggml does (`theta_scale = freq_base^(-2 / n_rot)` multiplied in f32, one step
/// per pair), divided by the optional frequency factor of the pair, then scaled with YaRN
/// (`rope_yarn` in ggml-cpu/ops.cpp): `theta_interp = freq_scale * theta`; with `ext_factor`
/// ≠ 0 the ramp between `beta_fast` and `beta_slow` mixes in the unscaled theta and the
/// magnitude is multiplied by `1 + 0.1 ln(1 / freq_scale)`; cos and sin are multiplied by
/// `attn_factor`. Values beyond `n_rot` in a head pass through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeParams {
    /// Pairing of the rotated values.
    pub mode: RopeMode,
    /// Number of rotated values per head (`rope.dimension_count`), even, ≤ the head size.
    pub n_rot: u32,
    /// Base of the frequencies (`rope.freq_base`).
    pub freq_base: f32,
    /// Position scale (1 / `rope.scaling.factor`; 1 without scaling).
    pub freq_scale: f32,
    /// Training context of YaRN (`rope.scaling.original_context_length`, else n_ctx_train).
    pub n_ctx_orig: u32,
    /// YaRN extrapolation mix (1 for `rope.scaling.type = yarn`, else 0).
    pub ext_factor: f32,
    /// Magnitude multiplier of cos and sin (`rope.scaling.attn_factor`, default 1).
    pub attn_factor: f32,
    /// YaRN low correction dimension parameter (llama.cpp default 32).
    pub beta_fast: f32,
    /// YaRN high correction dimension parameter (llama.cpp default 1).
    pub beta_slow: f32,
}

impl RopeMode {
    /// The mode as the text form writes it: `norm` or `neox` (llama.cpp's rope type names).
    pub fn name(self) -> &'static str {
        match self {
            RopeMode::Norm => "norm",
            RopeMode::Neox => "neox",
        }
    }
}

impl RopeParams {
    /// Every parameter as `key=value`, in `ggml_rope_ext`'s order:
    /// `mode=norm n_rot=64 freq_base=10000 freq_scale=1 n_ctx_orig=8192 ext_factor=0
    /// attn_factor=1 beta_fast=32 beta_slow=1`.
    pub fn params(&self) -> String {
        format!(
            "mode={} n_rot={} freq_base={} freq_scale={} n_ctx_orig={} ext_factor={} attn_factor={} beta_fast={} beta_slow={}",
            self.mode.name(),
            self.n_rot,
            self.freq_base,
            self.freq_scale,
            self.n_ctx_orig,
            self.ext_factor,
            self.attn_factor,
            self.beta_fast,
            self.beta_slow
        )
    }
}

/// Parameters of [`Op::Attention`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttnParams {
    /// Multiplier of the scores before the softmax (`kq_scale`: usually 1/sqrt(head size)).
    pub kq_scale: f32,
    /// Logit soft-capping: scores become `cap * tanh(scores / cap)` before `kq_scale` is
    /// applied (gemma2's `attn_logit_softcapping`, as llama.cpp's `build_attn_mha` does it).
    pub softcap: Option<f32>,
    /// Sliding window: the query at position p sees keys at positions k with `p - k < window`
    /// (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`).
    pub window: Option<u32>,
    /// Causal mask: the query at position p sees keys at positions k ≤ p.
    pub causal: bool,
}

/// The cache cells one query sees, in cell order: `lo..hi` without `gap.0..gap.1`
/// ([`AttnParams::visible_cells`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisibleCells {
    /// First visible cell.
    pub lo: usize,
    /// One past the last visible cell.
    pub hi: usize,
    /// Masked cells inside `lo..hi` (empty, `(x, x)`, unless a ring has wrapped).
    pub gap: (usize, usize),
}

impl VisibleCells {
    /// Whether cell `j` (in `lo..hi`) is masked by the gap.
    #[inline(always)]
    pub fn in_gap(&self, j: usize) -> bool {
        j >= self.gap.0 && j < self.gap.1
    }

    /// The visible cells as at most two ranges, in cell order.
    pub fn ranges(&self) -> [std::ops::Range<usize>; 2] {
        if self.gap.0 < self.gap.1 {
            [self.lo..self.gap.0, self.gap.1..self.hi]
        } else {
            [self.lo..self.hi, self.hi..self.hi]
        }
    }

    /// Whether no cell is visible.
    pub fn is_empty(&self) -> bool {
        self.ranges().iter().all(|r| r.is_empty())
    }
}

impl AttnParams {
    /// The cells the query at position `pos` sees in a cache of `cells` cells that holds
    /// positions `0..kv_len` (the step's included), position `p` in cell `p % cells`.
    ///
    /// While `kv_len ≤ cells` cell `i` holds position `i`: the causal mask and the window
    /// give one range. Past that (a sliding-window cache sized to its window, as llama.cpp's
    /// `llama_kv_cache_iswa` sizes it, written by `find_slot` at `pos % cells`) the visible
    /// positions `pos - window + 1 ..= pos` lie in cell order as `0..=pos % cells` (the newest)
    /// and `(pos - window + 1) % cells..cells`: llama.cpp attends over the cells in that
    /// order, masking the others (`is_masked_swa`). A window longer than the ring is cut to
    /// the ring (the ring is sized so that it never is).
    pub fn visible_cells(&self, pos: i64, kv_len: usize, cells: usize) -> VisibleCells {
        let n_kv = kv_len.min(cells) as i64;
        if kv_len <= cells || cells == 0 {
            let hi = if self.causal {
                (pos + 1).clamp(0, n_kv)
            } else {
                n_kv
            };
            let lo = match self.window {
                Some(w) => (pos - w as i64 + 1).clamp(0, hi),
                None => 0,
            };
            return VisibleCells {
                lo: lo as usize,
                hi: hi as usize,
                gap: (hi as usize, hi as usize),
            };
        }
        let c = cells as i64;
        let hi_pos = if self.causal {
            (pos + 1).clamp(0, kv_len as i64)
        } else {
            kv_len as i64
        };
        let mut lo_pos = match self.window {
            Some(w) => (pos - w as i64 + 1).clamp(0, hi_pos),
            None => 0,
        };
        lo_pos = lo_pos.max(hi_pos - c);
        if lo_pos >= hi_pos {
            return VisibleCells {
                lo: 0,
                hi: 0,
                gap: (0, 0),
            };
        }
        let (a, b) = ((hi_pos - 1) % c + 1, lo_pos % c);
        if lo_pos / c == (hi_pos - 1) / c {
            VisibleCells {
                lo: b as usize,
                hi: a as usize,
                gap: (a as usize, a as usize),
            }
        } else {
            VisibleCells {
                lo: 0,
                hi: cells,
                gap: (a as usize, b as usize),
            }
        }
    }
}

/// One IR operation. Sources are listed in order with their shapes; `F32` is the type of
/// every activation unless said otherwise. Broadcasting follows ggml.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Row lookup (`ggml_get_rows`): `table {K, R}` (any dtype: rows are dequantized),
    /// `ids I32 {N}` → `{K, N}`: row `n` is row `ids[n]` of the table. Token embeddings and
    /// the selection of output rows.
    GetRows,
    /// RMS norm over `ne0` (`ggml_rms_norm`): `x / sqrt(mean(x²) + eps)`, sum in f64 as ggml.
    /// `x` → same shape.
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
    /// Layer norm over `ne0` without weights (`ggml_norm`): `(x - mean) / sqrt(var + eps)`.
    Norm {
        /// Added to the variance.
        eps: f32,
    },
    /// `a + b`, `b` repeated over `a` (`ggml_add`; also the bias add).
    Add,
    /// `a * b` elementwise, `b` repeated over `a` (`ggml_mul`; norm weights).
    Mul,
    /// `x * s` (`ggml_scale`).
    Scale {
        /// The multiplier.
        s: f32,
    },
    /// Matrix product in ggml's convention (`ggml_mul_mat`): `a {K, M, A2, A3}` (a weight of
    /// any dtype, or an activation) and `b {K, N, B2, B3}` → `{M, N, B2, B3}` with
    /// `out[m, n] = dot(row m of a, row n of b)`; `a` is broadcast over dims 2 and 3
    /// (`B2 % A2 == 0`; slice `i2` of `b` uses slice `i2 / (B2 / A2)` of `a`).
    MulMat,
    /// Rotary position embedding (`ggml_rope_ext`): `x {head, n_head, n_tokens}`,
    /// `pos I32 {n_tokens}` [, `freq_factors F32 {n_rot / 2}`] → shape of `x`.
    Rope(RopeParams),
    /// Writes `cur {n_embd_gqa, n_tokens}` (F32) into the cache
    /// `cache {n_embd_gqa, n_ctx}` (F32, F16 or Q8_0: rounded or quantized to it, Q8_0 as
    /// ggml-cpu's `quantize_row_q8_0` does in `ggml_set_rows`) at rows `pos I32 {n_tokens}`;
    /// the result *is* the updated cache (same buffer: [`Op::in_place_src`] is 0). Cache row
    /// `i` holds position `i`. llama.cpp: `ggml_set_rows` / `ggml_cpy` into the KV cache.
    KvStore,
    /// Attention over the KV cache, as llama.cpp's `build_attn_mha` without flash attention:
    /// `q {d_k, n_head, n_tokens}` (F32), `k {d_k, n_head_kv, n_kv}`,
    /// `v {d_v, n_head_kv, n_kv}` (cache dtype: F32, F16 or Q8_0; `n_kv` is the symbolic KV
    /// length),
    /// `pos I32 {n_tokens}` → `{d_v, n_head, n_tokens}`. Query head `h` reads KV head
    /// `h / (n_head / n_head_kv)` (grouped-query). Scores `q·k`, optional soft-cap, times
    /// `kq_scale`, masked (causal, window), softmax over the keys, weighted sum of `v`.
    Attention(AttnParams),
    /// Softmax over `ne0` of `x * scale` (`ggml_soft_max_ext` without mask).
    SoftMax {
        /// Multiplier applied before the softmax.
        scale: f32,
    },
    /// `x * sigmoid(x)` (`ggml_silu`).
    Silu,
    /// GELU, tanh approximation (`ggml_gelu`):
    /// `0.5 x (1 + tanh(sqrt(2/π) x (1 + 0.044715 x²)))`.
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// `cap * tanh(x / cap)` (final logit soft-capping, gemma2).
    SoftCap {
        /// The cap.
        cap: f32,
    },
    /// `silu(gate) * up` (`ggml_swiglu_split`): `gate`, `up` of one shape → that shape.
    Swiglu,
    /// `gelu(gate) * up` (`ggml_geglu_split`).
    Geglu,
    /// Same data, new shape (`ggml_reshape`): the source must be contiguous and hold as many
    /// elements; no symbolic dimensions.
    Reshape {
        /// The new shape.
        ne: [u64; MAX_DIMS],
    },
    /// A strided window into the source (`ggml_view_4d`): shape `shape`, byte strides `nb`,
    /// starting `offset` bytes into the source. May carry the symbolic KV dimension (a view
    /// of the first n_kv rows of a cache).
    View {
        /// Shape of the view.
        shape: Shape,
        /// Byte stride of each dimension.
        nb: [u64; MAX_DIMS],
        /// Byte offset of the first element.
        offset: u64,
    },
    /// Reorders dimensions (`ggml_permute`): source dimension `i` becomes dimension
    /// `axes[i]` of the result.
    Permute {
        /// Destination of each source dimension; a permutation of 0..4.
        axes: [u8; MAX_DIMS],
    },
    /// A contiguous copy of the source (`ggml_cont`).
    Cont,
    /// The orthonormal Walsh–Hadamard rotation of every group of `n` values along `ne0`
    /// (`llama_mul_mat_hadamard`, computed as ggml-cpu's `ggml_compute_forward_fwht`; see
    /// [`crate::ggml::fwht`]): `x` (F32, `ne0` a multiple of `n`) → same shape. llama.cpp
    /// rotates Q and K around a quantized K cache, and V and the attention output around a
    /// quantized V cache.
    Hadamard {
        /// Values per rotation (a power of two).
        n: u32,
    },
    /// The indices of the `k` largest values of each row, largest first
    /// (`ggml_argsort_top_k`: a descending `ggml_argsort` cut to `k` columns): `x F32 {N, T}`
    /// → `I32 {k, T}`. Equal values keep their index order (ggml's `std::sort` leaves the
    /// order of ties unspecified). The experts a mixture-of-experts layer routes to.
    TopK {
        /// Indices kept per row, 1 ≤ k ≤ N.
        k: u32,
    },
    /// The routing weights of the selected experts, as llama.cpp's `build_moe_ffn` computes
    /// them from the router's probabilities: `probs F32 {n_expert, T}`, `ids I32 {k, T}` →
    /// `F32 {k, T}` with `w[i, t] = probs[ids[i, t], t]` (`ggml_get_rows`); with `norm`,
    /// divided by their sum (`ggml_sum_rows`, accumulated in f64 and rounded to f32) clamped
    /// below to 6.103515625e-5 (`ggml_clamp`, `ggml_div`); then times `scale` unless it is 0
    /// or 1 (`ggml_scale`, `expert_weights_scale`).
    MoeWeights {
        /// Normalize the weights to sum to one (`expert_weights_norm`).
        norm: bool,
        /// Multiplier (`expert_weights_scale`; 0 and 1 leave the weights as they are).
        scale: f32,
    },
    /// Products with the selected experts' matrices (`ggml_mul_mat_id`):
    /// `as {K, M, n_expert}` (a weight of any dtype), `b F32 {K, B1, T}` with `B1` 1 (every
    /// slot reads the token's one row) or `k`, `ids I32 {k, T}` → `{M, k, T}` with
    /// `out[m, i, t] = dot(row m of expert ids[i, t], row i % B1 of token t of b)`. Each
    /// product is computed as one column of a `mul_mat` (ggml-cpu converts `b` to the weight
    /// type's `vec_dot_type` and calls `vec_dot` per row and slot).
    MulMatId,
    /// The weighted sum of the experts' outputs (`ggml_mul` by the weights, then the
    /// `ggml_add` chain of `build_moe_ffn`): `experts F32 {E, k, T}`, `weights F32 {k, T}` →
    /// `{E, T}` with `out[e, t] = ((x0 w0 + x1 w1) + x2 w2) + …` in f32, each product rounded
    /// before it is added, slots summed in order.
    MoeSum,
}

impl Op {
    /// The op's name as the printer and errors write it (ggml's lower-case op names).
    pub fn name(&self) -> &'static str {
        match self {
            Op::GetRows => "get_rows",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Norm { .. } => "norm",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::MulMat => "mul_mat",
            Op::Rope(_) => "rope",
            Op::KvStore => "kv_store",
            Op::Attention(_) => "attention",
            Op::SoftMax { .. } => "soft_max",
            Op::Silu => "silu",
            Op::Gelu => "gelu",
            Op::Tanh => "tanh",
            Op::SoftCap { .. } => "softcap",
            Op::Swiglu => "swiglu",
            Op::Geglu => "geglu",
            Op::Reshape { .. } => "reshape",
            Op::View { .. } => "view",
            Op::Permute { .. } => "permute",
            Op::Cont => "cont",
            Op::Hadamard { .. } => "hadamard",
            Op::TopK { .. } => "argsort_top_k",
            Op::MoeWeights { .. } => "moe_weights",
            Op::MulMatId => "mul_mat_id",
            Op::MoeSum => "moe_sum",
        }
    }

    /// Whether the result aliases its first source without computing anything (reshape,
    /// view, permute): a memory planner gives it no buffer of its own.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::Reshape { .. } | Op::View { .. } | Op::Permute { .. }
        )
    }

    /// The source whose buffer the result overwrites, if the op updates state in place
    /// ([`Op::KvStore`] updates its cache, source 0).
    pub fn in_place_src(&self) -> Option<usize> {
        match self {
            Op::KvStore => Some(0),
            _ => None,
        }
    }

    /// Allowed numbers of sources (min, max).
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::GetRows
            | Op::Add
            | Op::Mul
            | Op::MulMat
            | Op::Swiglu
            | Op::Geglu
            | Op::MoeWeights { .. }
            | Op::MoeSum => (2, 2),
            Op::MulMatId => (3, 3),
            Op::Rope(_) => (2, 3),
            Op::KvStore => (3, 3),
            Op::Attention(_) => (4, 4),
            Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::Scale { .. }
            | Op::SoftMax { .. }
            | Op::Silu
            | Op::Gelu
            | Op::Tanh
            | Op::SoftCap { .. }
            | Op::Reshape { .. }
            | Op::View { .. }
            | Op::Permute { .. }
            | Op::Cont
            | Op::Hadamard { .. }
            | Op::TopK { .. } => (1, 1),
        }
    }

    /// The op's parameters as the text form writes them, `key=value` separated by spaces
    /// (empty when it has none): every field, with `f32` values in their shortest exact
    /// form, so [`crate::graph::parse_graph`] reads back the same op. Names follow
    /// `ggml_rope_ext`'s arguments (`n_rot` is its `n_dims`).
    pub fn params(&self) -> String {
        match self {
            Op::RmsNorm { eps } | Op::Norm { eps } => format!("eps={eps:e}"),
            Op::Scale { s } => format!("s={s}"),
            Op::Hadamard { n } => format!("n={n}"),
            Op::TopK { k } => format!("k={k}"),
            Op::MoeWeights { norm, scale } => {
                format!("scale={scale}{}", if *norm { " norm" } else { "" })
            }
            Op::SoftMax { scale } => format!("scale={scale}"),
            Op::SoftCap { cap } => format!("cap={cap}"),
            Op::Rope(p) => p.params(),
            Op::Attention(a) => {
                let mut s = format!("kq_scale={}", a.kq_scale);
                if let Some(c) = a.softcap {
                    s += &format!(" softcap={c}");
                }
                if let Some(w) = a.window {
                    s += &format!(" window={w}");
                }
                if !a.causal {
                    s += " non-causal";
                }
                s
            }
            Op::Reshape { ne } => format!("ne={}", Shape { ne: *ne, kv: 0 }),
            Op::View { shape, nb, offset } => {
                format!("ne={shape} nb={} offset={offset}", crate::text::list(nb))
            }
            Op::Permute { axes } => format!("axes={}", crate::text::list(axes)),
            Op::GetRows
            | Op::Add
            | Op::Mul
            | Op::MulMat
            | Op::KvStore
            | Op::Silu
            | Op::Gelu
            | Op::Tanh
            | Op::Swiglu
            | Op::Geglu
            | Op::Cont
            | Op::MulMatId
            | Op::MoeSum => String::new(),
        }
    }
}
