//! `phi3` (llama.cpp's `llm_build_phi3`): llama-shaped blocks whose Q/K/V come from one fused
//! projection `attn_qkv` and whose gate and up come from one fused `ffn_up`, split with views.
//!
//! ```text
//! qkv = attn_qkv · n          rows [0, n_embd) Q, then n_embd_gqa rows K, then V
//! q = rope(Q) / sqrt(head)    (kq_scale 1), k = rope(K)
//! h = x + wo · attn(q, k, V)
//! gu = ffn_up · m             rows [0, n_ff) gate, [n_ff, 2 n_ff) up;  x = h + down(silu(gate) * up)
//! logits = output · (rms_norm(x) * output_norm) [+ output.bias]
//! ```
//!
//! Separate `attn_q/k/v` weights are used when `attn_qkv` is absent. LongRoPE frequency
//! factors (`rope_factors_short` / `rope_factors_long`) are applied when present, chosen by
//! the context size as llama.cpp does.

use super::Builder;
use crate::error::Result;
use ir::graph::{Shape, TensorId};

/// Lowers a phi3 model; returns the logits.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    let hp = b.hp;
    let n = b.n_tokens();
    let (e, d, f) = (hp.n_embd as u64, hp.n_embd_head_k as u64, hp.n_ff as u64);
    let gqa = hp.n_embd_k_gqa() as u64;
    let q_out = d * hp.n_head as u64;
    let factors_name = if b.req.n_ctx > hp.n_ctx_orig_yarn {
        "rope_factors_long.weight"
    } else {
        "rope_factors_short.weight"
    };
    let factors = b.weight_opt(factors_name, &[hp.n_rot as u64 / 2])?;
    let mut x = b.embed()?;
    for il in 0..hp.n_layer {
        let cur = b.layer_norm(x, il, "attn_norm.weight", e, "attn_norm")?;
        let (q, k, v) = if b
            .lw_opt(il, "attn_qkv.weight", &[e, q_out + 2 * gqa])?
            .is_some()
        {
            let qkv = b.proj(
                cur,
                il,
                "attn_qkv.weight",
                Some("attn_qkv.bias"),
                [e, q_out + 2 * gqa],
                "wqkv",
            )?;
            let row = 4 * (q_out + 2 * gqa);
            let mut part = |name: &str, heads: u32, off: u64| {
                let shape = Shape::new(&[d, heads as u64, n]);
                b.g.view(
                    &format!("{name}-{il}"),
                    qkv,
                    shape,
                    [4, 4 * d, row, row * n],
                    4 * off,
                )
            };
            let q = part("Qcur", hp.n_head, 0)?;
            let k = part("Kcur", hp.n_head_kv, q_out)?;
            let v = part("Vcur", hp.n_head_kv, q_out + gqa)?;
            (q, k, v)
        } else {
            let [q, k, v] = b.qkv_heads(cur, il, [q_out, gqa, gqa])?;
            (q, k, v)
        };
        let p = b.rope_params(il);
        let q = b.g.rope(&format!("Qcur_rope-{il}"), q, b.pos, factors, p)?;
        let k = b.g.rope(&format!("Kcur_rope-{il}"), k, b.pos, factors, p)?;
        let q =
            b.g.scale(&format!("Qcur_scaled-{il}"), q, 1.0 / (d as f32).sqrt())?;
        let attn = b.attention(il, q, k, v, 1.0)?;
        let mut cur = b.proj(
            attn,
            il,
            "attn_output.weight",
            Some("attn_output.bias"),
            [q_out, e],
            "attn_out",
        )?;
        let mut residual = x;
        if il == hp.n_layer - 1 {
            cur = b.select_outputs(cur, "attn_out_sel")?;
            residual = b.select_outputs(residual, "inp_sel")?;
        }
        let h = b.g.add(&format!("ffn_inp-{il}"), cur, residual)?;
        let cur = b.layer_norm(h, il, "ffn_norm.weight", e, "ffn_norm")?;
        let gu = b.proj(cur, il, "ffn_up.weight", None, [e, 2 * f], "ffn_up")?;
        let n_out = b.g.tensor(gu).shape.ne[1];
        let half = Shape::new(&[f, n_out]);
        let nb = [4, 8 * f, 8 * f * n_out.max(1), 8 * f * n_out.max(1)];
        let gate = b.g.view(&format!("ffn_gate-{il}"), gu, half, nb, 0)?;
        let up =
            b.g.view(&format!("ffn_up_half-{il}"), gu, half, nb, 4 * f)?;
        let act = b.g.swiglu(&format!("ffn_swiglu-{il}"), gate, up)?;
        let cur = b.proj(act, il, "ffn_down.weight", None, [f, e], "ffn_out")?;
        x = b.g.add(&format!("l_out-{il}"), cur, h)?;
    }
    let mut logits = b.output(x)?;
    if let Some(bias) = b.weight_opt("output.bias", &[hp.n_vocab as u64])? {
        logits = b.g.add("result_output_b", logits, bias)?;
    }
    Ok(logits)
}
