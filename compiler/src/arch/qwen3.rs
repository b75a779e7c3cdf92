//! `qwen3` (llama.cpp's `llm_build_qwen3`): llama without biases, with per-head RMS norms of
//! Q and K (`attn_q_norm`, `attn_k_norm`, one weight per head value) before rope; neox rope.

use super::llama::{build_variant, Variant};
use super::Builder;
use crate::error::Result;
use ir::graph::TensorId;

/// Lowers a qwen3 model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    build_variant(
        b,
        Variant {
            rope_freqs: false,
            require_qkv_bias: false,
            qk_norm: true,
            moe: None,
        },
    )
}
