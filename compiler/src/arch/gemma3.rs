//! `gemma3` (llama.cpp's `llm_build_gemma3_iswa`).
//!
//! ```text
//! x = token_embd[tokens] * sqrt(n_embd)
//! per layer:  q = rope(rms_norm_head(wq · n) * attn_q_norm) * f_attention_scale
//!             k = rope(rms_norm_head(wk · n) * attn_k_norm),  v = wv · n,   n = rms_norm(x) * attn_norm
//!             h = x + rms_norm(wo · attn(q, k, v)) * post_attention_norm   (kq_scale 1)
//!             x = h + rms_norm(down(gelu(gate · m) * (up · m))) * post_ffw_norm,  m = rms_norm(h) * ffn_norm
//! logits = token_embd · (rms_norm(x) * output_norm)   (tied unless output.weight exists)
//! ```
//!
//! Sliding-window layers ([`crate::HParams::is_swa`]) attend to the last `n_swa` positions
//! and use `rope_freq_base_swa`; the others attend to everything with `rope_freq_base`.

use super::{Builder, Glu};
use crate::error::Result;
use ir::graph::TensorId;

/// Lowers a gemma3 model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    let hp = b.hp;
    let (e, d_k, q_out) = (
        hp.n_embd as u64,
        hp.n_embd_head_k as u64,
        (hp.n_embd_head_k * hp.n_head) as u64,
    );
    let (kv_k, kv_v) = (hp.n_embd_k_gqa() as u64, hp.n_embd_v_gqa() as u64);
    let q_scale = hp
        .f_attention_scale
        .unwrap_or(1.0 / (hp.n_embd_head_k as f32).sqrt());
    let emb = b.embed()?;
    let mut x = b.g.scale("inp_scaled", emb, (hp.n_embd as f32).sqrt())?;
    for il in 0..hp.n_layer {
        let cur = b.layer_norm(x, il, "attn_norm.weight", e, "attn_norm")?;
        let q = b.proj(cur, il, "attn_q.weight", None, [e, q_out], "Qcur")?;
        let k = b.proj(cur, il, "attn_k.weight", None, [e, kv_k], "Kcur")?;
        let v = b.proj(cur, il, "attn_v.weight", None, [e, kv_v], "Vcur")?;
        let q = b.heads(q, hp.n_embd_head_k, hp.n_head, &format!("Qcur_3d-{il}"))?;
        let k = b.heads(k, hp.n_embd_head_k, hp.n_head_kv, &format!("Kcur_3d-{il}"))?;
        let v = b.heads(v, hp.n_embd_head_v, hp.n_head_kv, &format!("Vcur_3d-{il}"))?;
        let q = b.layer_norm(q, il, "attn_q_norm.weight", d_k, "Qcur_normed")?;
        let q = b.rope(q, il, "Qcur_rope")?;
        let k = b.layer_norm(k, il, "attn_k_norm.weight", d_k, "Kcur_normed")?;
        let k = b.rope(k, il, "Kcur_rope")?;
        let q = b.g.scale(&format!("Qcur_scaled-{il}"), q, q_scale)?;
        let attn = b.attention(il, q, k, v, 1.0)?;
        let cur = b.proj(attn, il, "attn_output.weight", None, [q_out, e], "attn_out")?;
        let mut cur = b.layer_norm(cur, il, "post_attention_norm.weight", e, "attn_post_norm")?;
        let mut inp = x;
        if il == hp.n_layer - 1 {
            cur = b.select_outputs(cur, "attn_out_sel")?;
            inp = b.select_outputs(inp, "inp_sel")?;
        }
        let sa_out = b.g.add(&format!("sa_out-{il}"), cur, inp)?;
        let cur = b.layer_norm(sa_out, il, "ffn_norm.weight", e, "ffn_norm")?;
        let cur = b.ffn(cur, il, Glu::Geglu)?;
        let cur = b.layer_norm(cur, il, "post_ffw_norm.weight", e, "ffn_post_norm")?;
        x = b.g.add(&format!("l_out-{il}"), cur, sa_out)?;
    }
    b.output(x)
}
