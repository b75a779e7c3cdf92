//! `llama` (llama.cpp's `llm_build_llama`): pre-norm blocks with rope'd grouped-query
//! attention and a SwiGLU feed-forward; SmolLM2 is this with a tied output.
//!
//! ```text
//! x = token_embd[tokens]
//! per layer:  h = x + wo · attn(rope(wq · n), rope(wk · n), wv · n)   n = rms_norm(x) * attn_norm
//!             x = h + down(silu(gate · m) * (up · m))                  m = rms_norm(h) * ffn_norm
//! logits = output · (rms_norm(x) * output_norm)
//! ```
//!
//! Optional `attn_{q,k,v,output}.bias` tensors are added when present, as llama.cpp does;
//! an optional `rope_freqs.weight` (`{n_rot / 2}` F32: the per-dimension frequency divisors
//! `convert_hf_to_gguf.py` writes for Llama 3.1's `llama3` rope scaling) divides the rope
//! frequencies of every layer, as llama.cpp's `get_rope_factors` gives it to `ggml_rope_ext`.
//! [`Variant`] covers the two families that differ from llama only inside the attention
//! input: qwen2 (Q/K/V biases required) and qwen3 (per-head Q/K RMS norms before rope), and
//! the mixture-of-experts FFN of qwen3moe and llama with experts ([`Moe`]).

use super::{Builder, Glu};
use crate::error::{Error, Result};
use ir::graph::TensorId;

/// What distinguishes a llama-shaped family.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Variant {
    /// `attn_q.bias`, `attn_k.bias`, `attn_v.bias` must be present (qwen2).
    pub require_qkv_bias: bool,
    /// Q and K are RMS-normed per head with `attn_q_norm` / `attn_k_norm` before rope (qwen3).
    pub qk_norm: bool,
    /// An optional `rope_freqs.weight` scales the rope frequencies (llama: Llama 3.1's
    /// `llama3` scaling; llama.cpp loads it for llama, not for qwen2 / qwen3).
    pub rope_freqs: bool,
    /// The feed-forward block is a mixture of experts (qwen3moe; llama with experts).
    pub moe: Option<Moe>,
}

/// The mixture-of-experts feed-forward block of a llama-shaped family
/// ([`Builder::moe_ffn`] with a softmax router and SwiGLU experts).
#[derive(Clone, Copy, Debug)]
pub(super) struct Moe {
    /// Normalize the selected experts' weights to sum to one (`norm_w` of
    /// `build_moe_ffn`).
    pub norm_w: bool,
    /// Multiplier of the weights (`w_scale`; 0 and 1 leave them as they are).
    pub w_scale: f32,
    /// Width of one expert's FFN.
    pub n_ff_exp: u64,
}

/// Lowers a llama model; returns the logits. With `llama.expert_count` above 0 (Mixtral)
/// every FFN is a mixture of experts of width `n_ff`, the selected experts' weights
/// normalized to sum to one (llama.cpp's `llm_build_llama` with `ffn_gate_inp`).
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    let hp = b.hp;
    build_variant(
        b,
        Variant {
            rope_freqs: true,
            moe: (hp.n_expert > 0).then_some(Moe {
                norm_w: true,
                w_scale: 0.0,
                n_ff_exp: u64::from(hp.n_ff),
            }),
            ..Variant::default()
        },
    )
}

/// Lowers a llama-shaped model with the given differences; returns the logits.
pub(super) fn build_variant(b: &mut Builder<'_>, var: Variant) -> Result<TensorId> {
    let hp = b.hp;
    let (e, q_out, kv_k, kv_v) = (
        hp.n_embd as u64,
        (hp.n_embd_head_k * hp.n_head) as u64,
        hp.n_embd_k_gqa() as u64,
        hp.n_embd_v_gqa() as u64,
    );
    let kq_scale = 1.0 / (hp.n_embd_head_k as f32).sqrt();
    let freq_factors = if var.rope_freqs {
        b.weight_opt("rope_freqs.weight", &[u64::from(hp.n_rot / 2)])?
    } else {
        None
    };
    let mut x = b.embed()?;
    for il in 0..hp.n_layer {
        let mut inp_sa = x;
        let cur = b.layer_norm(x, il, "attn_norm.weight", e, "attn_norm")?;
        if var.require_qkv_bias {
            for (name, n) in [
                ("attn_q.bias", q_out),
                ("attn_k.bias", kv_k),
                ("attn_v.bias", kv_v),
            ] {
                if b.lw_opt(il, name, &[n])?.is_none() {
                    return Err(Error::MissingTensor(format!("blk.{il}.{name}")));
                }
            }
        }
        let [mut q, mut k, v] = b.qkv_heads(cur, il, [q_out, kv_k, kv_v])?;
        if var.qk_norm {
            let d = hp.n_embd_head_k as u64;
            q = b.layer_norm(q, il, "attn_q_norm.weight", d, "Qcur_normed")?;
            k = b.layer_norm(k, il, "attn_k_norm.weight", d, "Kcur_normed")?;
        }
        let q = b.rope_ff(q, il, freq_factors, "Qcur_rope")?;
        let k = b.rope_ff(k, il, freq_factors, "Kcur_rope")?;
        let attn = b.attention(il, q, k, v, kq_scale)?;
        let mut cur = b.proj(
            attn,
            il,
            "attn_output.weight",
            Some("attn_output.bias"),
            [q_out, e],
            "attn_out",
        )?;
        if il == hp.n_layer - 1 {
            cur = b.select_outputs(cur, "attn_out_sel")?;
            inp_sa = b.select_outputs(inp_sa, "inp_sa_sel")?;
        }
        let ffn_inp = b.g.add(&format!("ffn_inp-{il}"), cur, inp_sa)?;
        let cur = b.layer_norm(ffn_inp, il, "ffn_norm.weight", e, "ffn_norm")?;
        let cur = match var.moe {
            None => b.ffn(cur, il, Glu::Swiglu)?,
            Some(m) => b.moe_ffn(cur, il, m.n_ff_exp, m.norm_w, m.w_scale)?,
        };
        x = b.g.add(&format!("l_out-{il}"), cur, ffn_inp)?;
    }
    b.output(x)
}
