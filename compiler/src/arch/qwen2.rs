//! `qwen2` (llama.cpp's `llm_build_qwen2`): llama with required Q/K/V biases, neox rope and a
//! tied output by default (`output.weight` absent).

use super::llama::{build_variant, Variant};
use super::Builder;
use crate::error::Result;
use ir::graph::TensorId;

/// Lowers a qwen2 model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    build_variant(
        b,
        Variant {
            rope_freqs: false,
            require_qkv_bias: true,
            qk_norm: false,
            moe: None,
        },
    )
}
