//! `bert` (llama.cpp's `llama_model_bert::graph` for `LLM_ARCH_BERT`): an encoder whose
//! output is the hidden state of every token, pooled into embeddings or reranking scores by
//! the runtime (`runtime::embed`).
//!
//! ```text
//! x = norm(token_embd[tokens] + token_types[0] + position_embd[pos]) * w + b   (token_embd_norm)
//! per layer:  a = wo · attn(wq · x + bq, wk · x + bk, wv · x + bv) + bo   (no rope, non-causal)
//!             h = norm(a + x) * attn_output_norm + bias
//!             x = norm(h + down(gelu(up · h + up_b)) + down_b) * layer_output_norm + bias
//! result_embd = x
//! ```
//!
//! `norm` is `ggml_norm` (mean and variance, `attention.layer_norm_epsilon`). Token types are
//! all 0 ("sentence A"), as llama.cpp hard-codes them: row 0 of the optional `token_types`
//! (which must be F32, as `ggml_add` needs it) is added to every token. Attention is
//! non-causal when the file says `bert.attention.causal = false` (as `convert_hf_to_gguf.py`
//! writes it): every token sees the whole sequence, which must then be one ubatch. The
//! caches stand in for llama.cpp's cache-less attention: with flash attention it casts K and
//! V to F16, which an F16 cache does.

use super::Builder;
use crate::error::{Error, Result};
use ir::graph::{DType, Shape, TensorId};

/// `norm(x) * w + b` with `{prefix}.weight` and `{prefix}.bias` of `n_embd` values, named
/// `{name}` (llama.cpp's `build_norm(.., LLM_NORM, ..)`).
fn norm_wb(b: &mut Builder<'_>, x: TensorId, prefix: &str, name: &str) -> Result<TensorId> {
    let e = b.hp.n_embd as u64;
    let w = b.weight(&format!("{prefix}.weight"), &[e])?;
    let bias = b.weight(&format!("{prefix}.bias"), &[e])?;
    let n = b.g.norm(&format!("norm-{name}"), x, b.hp.f_norm_eps)?;
    let n = b.g.mul(&format!("{name}_w"), n, w)?;
    Ok(b.g.add(name, n, bias)?)
}

/// Lowers a bert model; returns `result_embd {n_embd, n_outputs}`.
///
/// # Errors
/// [`Error::Unsupported`] when asked for logits (bert has no output head), tensor errors.
pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId> {
    if !b.embeddings {
        return Err(Error::Unsupported(
            "bert is an embedding model without an output head: use `modelc embed` or `serve --embedding`/`--reranking`"
                .into(),
        ));
    }
    let hp = b.hp;
    let (e, f) = (hp.n_embd as u64, hp.n_ff as u64);
    let d = hp.n_embd_head_k as u64;
    if hp.n_embd_head_k != hp.n_embd_head_v {
        return Err(Error::Unsupported(format!(
            "bert with key heads of {} and value heads of {}",
            hp.n_embd_head_k, hp.n_embd_head_v
        )));
    }
    let gqa = hp.n_embd_k_gqa() as u64;
    let mut x = b.embed()?;
    if let Some(&(ty, ne)) = b.tensors.get("token_types.weight") {
        let types = b.weight("token_types.weight", &[e, ne[1].max(1)])?;
        if b.g.tensor(types).dtype != DType::F32 {
            return Err(Error::TensorType {
                name: "token_types.weight".into(),
                ty: format!("{} (bert's token types must be F32)", ty.name()),
            });
        }
        let row0 = b.g.view(
            "type_row0",
            types,
            Shape::new(&[e]),
            [4, 4 * e, 4 * e, 4 * e],
            0,
        )?;
        x = b.g.add("inp_embd_type", x, row0)?;
    }
    let pos_w = b.weight("position_embd.weight", &[e, hp.n_ctx_train as u64])?;
    let pos = b.g.get_rows("inp_pos_embd", pos_w, b.pos)?;
    let x0 = b.g.add("inp_embd_pos", pos, x)?;
    let mut inp = norm_wb(b, x0, "token_embd_norm", "inp_norm")?;
    let kq_scale = 1.0 / (d as f32).sqrt();
    for il in 0..hp.n_layer {
        let [q, k, v] = b.qkv_heads(inp, il, [e, gqa, gqa])?;
        let attn = b.attention(il, q, k, v, kq_scale)?;
        let mut cur = b.proj(
            attn,
            il,
            "attn_output.weight",
            Some("attn_output.bias"),
            [e, e],
            "attn_out",
        )?;
        if il == hp.n_layer - 1 {
            cur = b.select_outputs(cur, "attn_out_sel")?;
            inp = b.select_outputs(inp, "inp_sel")?;
        }
        let cur = b.g.add(&format!("attn_res-{il}"), cur, inp)?;
        let ffn_inp = norm_wb(
            b,
            cur,
            &format!("blk.{il}.attn_output_norm"),
            &format!("ffn_inp-{il}"),
        )?;
        let up = b.proj(
            ffn_inp,
            il,
            "ffn_up.weight",
            Some("ffn_up.bias"),
            [e, f],
            "ffn_up",
        )?;
        let act = b.g.gelu(&format!("ffn_gelu-{il}"), up)?;
        let down = b.proj(
            act,
            il,
            "ffn_down.weight",
            Some("ffn_down.bias"),
            [f, e],
            "ffn_out",
        )?;
        let cur = b.g.add(&format!("ffn_res-{il}"), down, ffn_inp)?;
        inp = norm_wb(
            b,
            cur,
            &format!("blk.{il}.layer_output_norm"),
            &format!("l_out-{il}"),
        )?;
    }
    Ok(inp)
}
