//! `qwen3moe` (llama.cpp's `llama_model_qwen3moe`): qwen3's attention (per-head Q/K RMS
//! norms before neox rope, no biases) and a mixture-of-experts feed-forward block in every
//! layer: a softmax router `ffn_gate_inp`, the `n_expert_used` most probable experts'
//! SwiGLU FFNs (`ffn_{gate,up,down}_exps`), their outputs summed weighted by the router's
//! probabilities normalized to sum to one (`build_moe_ffn` with `norm_w = true`; qwen3moe
//! reads no `expert_weights_scale`). An expert's width is `expert_feed_forward_length`,
//! else `feed_forward_length / expert_used_count`, as llama.cpp takes it.

use super::llama::{build_variant, Moe, Variant};
use super::Builder;
use crate::error::Result;
use ir::graph::TensorId;

/// Lowers a qwen3moe model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    let hp = b.hp;
    let n_ff_exp = match hp.n_ff_exp {
        0 => hp.n_ff / hp.n_expert_used.max(1),
        n => n,
    };
    build_variant(
        b,
        Variant {
            rope_freqs: false,
            require_qkv_bias: false,
            qk_norm: true,
            moe: Some(Moe {
                norm_w: true,
                w_scale: 0.0,
                n_ff_exp: u64::from(n_ff_exp),
            }),
        },
    )
}
