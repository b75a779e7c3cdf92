//! `olmoe` (llama.cpp's `llama_model_olmoe`): pre-norm blocks whose Q and K projections are
//! RMS-normed over their whole width (`attn_q_norm`, `attn_k_norm` `{n_embd}`, before the
//! split into heads) ahead of neox rope, no biases, and a mixture-of-experts FFN in every
//! layer: softmax router, the `n_expert_used` most probable SwiGLU experts of width `n_ff`,
//! their outputs summed weighted by the router's probabilities as they are (`build_moe_ffn`
//! with `norm_w = false`). The output projection is its own tensor (never tied).

use super::Builder;
use crate::error::{Error, Result};
use ir::graph::TensorId;

/// Lowers an olmoe model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    let hp = b.hp;
    if hp.tied_output {
        return Err(Error::MissingTensor("output.weight".into()));
    }
    let e = hp.n_embd as u64;
    let (q_out, kv_out) = (
        (hp.n_embd_head_k * hp.n_head) as u64,
        hp.n_embd_k_gqa() as u64,
    );
    let kq_scale = 1.0 / (hp.n_embd_head_k as f32).sqrt();
    let mut x = b.embed()?;
    for il in 0..hp.n_layer {
        let mut inp_sa = x;
        let cur = b.layer_norm(x, il, "attn_norm.weight", e, "attn_norm")?;
        let q = b.proj(cur, il, "attn_q.weight", None, [e, q_out], "Qcur")?;
        let k = b.proj(cur, il, "attn_k.weight", None, [e, kv_out], "Kcur")?;
        let v = b.proj(cur, il, "attn_v.weight", None, [e, kv_out], "Vcur")?;
        let q = b.layer_norm(q, il, "attn_q_norm.weight", q_out, "Qcur_normed")?;
        let k = b.layer_norm(k, il, "attn_k_norm.weight", kv_out, "Kcur_normed")?;
        let q = b.heads(q, hp.n_embd_head_k, hp.n_head, &format!("Qcur_3d-{il}"))?;
        let k = b.heads(k, hp.n_embd_head_k, hp.n_head_kv, &format!("Kcur_3d-{il}"))?;
        let v = b.heads(v, hp.n_embd_head_v, hp.n_head_kv, &format!("Vcur_3d-{il}"))?;
        let q = b.rope(q, il, "Qcur_rope")?;
        let k = b.rope(k, il, "Kcur_rope")?;
        let attn = b.attention(il, q, k, v, kq_scale)?;
        let mut cur = b.proj(attn, il, "attn_output.weight", None, [q_out, e], "attn_out")?;
        if il == hp.n_layer - 1 {
            cur = b.select_outputs(cur, "attn_out_sel")?;
            inp_sa = b.select_outputs(inp_sa, "inp_sa_sel")?;
        }
        let ffn_inp = b.g.add(&format!("ffn_inp-{il}"), cur, inp_sa)?;
        let cur = b.layer_norm(ffn_inp, il, "ffn_norm.weight", e, "ffn_norm")?;
        let cur = b.moe_ffn(cur, il, u64::from(hp.n_ff), false, 0.0)?;
        x = b.g.add(&format!("l_out-{il}"), cur, ffn_inp)?;
    }
    b.output(x)
}
