//! Lowering from GGUF to the IR: one module per architecture, each only a lowering from
//! ([`HParams`], tensor table) to a [`Graph`] for one ubatch shape ([`GraphRequest`]).
//!
//! The building blocks every family shares live in [`Builder`]: weight lookup with
//! llama.cpp's shape checks (`create_tensor`), the token embedding, RMS norm × weight, rope
//! with the layer's base, the KV store + attention over the cache, the gated FFN and the
//! output head. An architecture module is then a short function that strings them together
//! the way its `llm_build_*` in llama.cpp does:
//!
//! - [`llama`]: norm → Q/K/V → rope → attention → residual → norm → SwiGLU FFN → residual;
//! - [`qwen2`]: llama plus Q/K/V biases;
//! - [`qwen3`]: llama plus per-head RMS norms of Q and K before rope;
//! - [`gemma3`]: scaled embeddings, Q/K norms, pre-scaled Q, post-attention and post-FFN
//!   norms, GeGLU, sliding-window layers with their own rope base;
//! - [`phi3`]: fused QKV and fused gate+up projections, split with views;
//! - [`bert`]: an encoder: token + token-type + absolute position embeddings, layer norms
//!   with bias, non-causal attention, a GELU feed-forward; it outputs hidden states only.
//! - [`qwen3moe`]: qwen3's attention, a mixture-of-experts FFN ([`Builder::moe_ffn`]);
//! - [`olmoe`]: Q/K RMS norms over the whole projection, unnormalized expert weights;
//! - llama with `expert_count` (Mixtral): [`llama`] with a mixture-of-experts FFN.
//!
//! A new family adds a module with its `build` function and a line in [`Arch`].

mod bert;
mod gemma3;
mod llama;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3moe;

use crate::error::{Error, Result};
use crate::hparams::HParams;
use ir::ggml::GgmlType;
use ir::graph::{AttnParams, DType, Graph, Input, KvKind, RopeMode, RopeParams, Shape, TensorId};
use ir::interp::GraphRequest;
use std::collections::HashMap;

/// The architectures modelc lowers (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Arch {
    /// `llama` (also SmolLM2, Mistral-style models).
    Llama,
    /// `qwen2`.
    Qwen2,
    /// `qwen3`.
    Qwen3,
    /// `gemma3`.
    Gemma3,
    /// `phi3`.
    Phi3,
    /// `bert` (BERT, MiniLM, bge: embedding and reranking encoders).
    Bert,
    /// `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B).
    Qwen3Moe,
    /// `olmoe` (OLMoE-1B-7B).
    Olmoe,
}

impl Arch {
    /// The architecture named `name` in `general.architecture`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "bert" => Arch::Bert,
            "qwen3moe" => Arch::Qwen3Moe,
            "olmoe" => Arch::Olmoe,
            _ => return None,
        })
    }

    /// Every architecture modelc lowers.
    pub const ALL: [Arch; 8] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Bert,
        Arch::Qwen3Moe,
        Arch::Olmoe,
    ];

    /// The names of [`Arch::ALL`], comma-separated (what an unsupported architecture's
    /// error lists).
    pub fn supported() -> String {
        Arch::ALL.map(Arch::name).join(", ")
    }

    /// The GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Bert => "bert",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Olmoe => "olmoe",
        }
    }

    /// Whether the model is an encoder without an output head (bert): its graphs output
    /// hidden states only ([`crate::GraphOutput::Embeddings`]), for embeddings and reranking.
    pub fn is_encoder(self) -> bool {
        self == Arch::Bert
    }

    /// The rope pairing llama.cpp uses for this architecture (`llama_model_rope_type`).
    pub fn rope_type(self) -> RopeMode {
        match self {
            // bert has no rope (llama.cpp's LLAMA_ROPE_TYPE_NONE); the value is unused.
            Arch::Llama | Arch::Bert => RopeMode::Norm,
            Arch::Qwen2
            | Arch::Qwen3
            | Arch::Gemma3
            | Arch::Phi3
            | Arch::Qwen3Moe
            | Arch::Olmoe => RopeMode::Neox,
        }
    }

    /// Whether the architecture's feed-forward blocks are mixtures of experts (it then
    /// needs `{arch}.expert_count`).
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Olmoe)
    }
}

/// Name → (type, shape) of every tensor in the file.
pub(crate) type TensorTable = HashMap<String, (GgmlType, [u64; 4])>;

/// Lowers a model for one ubatch shape.
pub(crate) fn lower(
    hp: &HParams,
    tensors: &TensorTable,
    req: &GraphRequest,
    output: crate::GraphOutput,
) -> Result<Graph> {
    if req.n_tokens == 0 || req.n_outputs > req.n_tokens || req.n_ctx == 0 {
        return Err(Error::Unsupported(format!(
            "graph request with {} tokens, {} outputs, n_ctx {}",
            req.n_tokens, req.n_outputs, req.n_ctx
        )));
    }
    req.kv_types.check().map_err(Error::Unsupported)?;
    let mut b = Builder::new(hp, tensors, *req);
    b.embeddings = output == crate::GraphOutput::Embeddings;
    let logits = match hp.arch {
        Arch::Llama => llama::build(&mut b)?,
        Arch::Qwen2 => qwen2::build(&mut b)?,
        Arch::Qwen3 => qwen3::build(&mut b)?,
        Arch::Gemma3 => gemma3::build(&mut b)?,
        Arch::Phi3 => phi3::build(&mut b)?,
        Arch::Bert => bert::build(&mut b)?,
        Arch::Qwen3Moe => qwen3moe::build(&mut b)?,
        Arch::Olmoe => olmoe::build(&mut b)?,
    };
    b.g.mark_output(logits);
    b.g.verify()?;
    Ok(b.g)
}

/// The FFN activation of a gated feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Glu {
    /// `silu(gate) * up`.
    Swiglu,
    /// `gelu(gate) * up`.
    Geglu,
}

/// Graph under construction plus the model it lowers; the shared building blocks.
pub(crate) struct Builder<'m> {
    pub g: Graph,
    pub hp: &'m HParams,
    tensors: &'m TensorTable,
    pub req: GraphRequest,
    /// `inp_tokens`, `I32 {n_tokens}`.
    pub tokens: TensorId,
    /// `inp_pos`, `I32 {n_tokens}`.
    pub pos: TensorId,
    /// `inp_out_ids`, `I32 {n_outputs}`.
    pub out_ids: TensorId,
    /// [`Builder::output`] stops at `result_norm` (embeddings) instead of the logits.
    pub embeddings: bool,
}

fn shape_str(ne: &[u64; 4]) -> String {
    Shape { ne: *ne, kv: 0 }.to_string()
}

impl<'m> Builder<'m> {
    fn new(hp: &'m HParams, tensors: &'m TensorTable, req: GraphRequest) -> Builder<'m> {
        let mut g = Graph::new();
        let n = req.n_tokens as u64;
        let tokens = g.input("inp_tokens", Input::Tokens, DType::I32, Shape::new(&[n]));
        let pos = g.input("inp_pos", Input::Positions, DType::I32, Shape::new(&[n]));
        let out_ids = g.input(
            "inp_out_ids",
            Input::OutputIds,
            DType::I32,
            Shape::new(&[req.n_outputs as u64]),
        );
        Builder {
            g,
            hp,
            tensors,
            req,
            tokens,
            pos,
            out_ids,
            embeddings: false,
        }
    }

    /// Tokens in the ubatch.
    pub fn n_tokens(&self) -> u64 {
        self.req.n_tokens as u64
    }

    /// The weight `name`, which must have shape `ne` (llama.cpp's `create_tensor`).
    pub fn weight(&mut self, name: &str, ne: &[u64]) -> Result<TensorId> {
        self.weight_opt(name, ne)?
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// The weight `name` if present (then it must have shape `ne`).
    pub fn weight_opt(&mut self, name: &str, ne: &[u64]) -> Result<Option<TensorId>> {
        let Some(&(ty, found)) = self.tensors.get(name) else {
            return Ok(None);
        };
        let want = Shape::new(ne);
        if found != want.ne {
            return Err(Error::TensorShape {
                name: name.to_string(),
                found: shape_str(&found),
                expected: want.to_string(),
            });
        }
        let dtype = DType::from_ggml(ty)
            .filter(|d| {
                *d == DType::F32
                    || ir::ggml::vec_dot_type(ty).is_some()
                    || matches!(d, DType::F16 | DType::BF16)
            })
            .ok_or_else(|| Error::TensorType {
                name: name.to_string(),
                ty: ty.name().to_string(),
            })?;
        Ok(Some(self.g.weight(name, dtype, want)))
    }

    /// Layer weight `blk.{il}.{suffix}`.
    pub fn lw(&mut self, il: u32, suffix: &str, ne: &[u64]) -> Result<TensorId> {
        self.weight(&format!("blk.{il}.{suffix}"), ne)
    }

    /// Optional layer weight `blk.{il}.{suffix}`.
    pub fn lw_opt(&mut self, il: u32, suffix: &str, ne: &[u64]) -> Result<Option<TensorId>> {
        self.weight_opt(&format!("blk.{il}.{suffix}"), ne)
    }

    /// `inp_embd = get_rows(token_embd.weight, inp_tokens)`: `{n_embd, n_tokens}`.
    pub fn embed(&mut self) -> Result<TensorId> {
        let hp = self.hp;
        let w = self.weight("token_embd.weight", &[hp.n_embd as u64, hp.n_vocab as u64])?;
        Ok(self.g.get_rows("inp_embd", w, self.tokens)?)
    }

    /// `rms_norm(x) * w`, named `name` (the norm alone is `norm-{name}`).
    pub fn rms_norm_w(&mut self, x: TensorId, w: TensorId, name: &str) -> Result<TensorId> {
        let n = self
            .g
            .rms_norm(&format!("norm-{name}"), x, self.hp.f_norm_rms_eps)?;
        Ok(self.g.mul(name, n, w)?)
    }

    /// RMS norm of `x` with layer weight `blk.{il}.{suffix}` of `n` values.
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        il: u32,
        suffix: &str,
        n: u64,
        name: &str,
    ) -> Result<TensorId> {
        let w = self.lw(il, suffix, &[n])?;
        self.rms_norm_w(x, w, &format!("{name}-{il}"))
    }

    /// The separate Q, K and V projections of layer `il` (`attn_q/k/v.weight`, optional
    /// biases) of `x {n_embd, n_tokens}`, each split into heads: `{n_embd_head, n_head(_kv),
    /// n_tokens}`. `[q_out, k_out, v_out]` are the projections' output widths.
    pub fn qkv_heads(&mut self, x: TensorId, il: u32, out: [u64; 3]) -> Result<[TensorId; 3]> {
        let hp = self.hp;
        let e = hp.n_embd as u64;
        let q = self.proj(
            x,
            il,
            "attn_q.weight",
            Some("attn_q.bias"),
            [e, out[0]],
            "Qcur",
        )?;
        let k = self.proj(
            x,
            il,
            "attn_k.weight",
            Some("attn_k.bias"),
            [e, out[1]],
            "Kcur",
        )?;
        let v = self.proj(
            x,
            il,
            "attn_v.weight",
            Some("attn_v.bias"),
            [e, out[2]],
            "Vcur",
        )?;
        Ok([
            self.heads(q, hp.n_embd_head_k, hp.n_head, &format!("Qcur_3d-{il}"))?,
            self.heads(k, hp.n_embd_head_k, hp.n_head_kv, &format!("Kcur_3d-{il}"))?,
            self.heads(v, hp.n_embd_head_v, hp.n_head_kv, &format!("Vcur_3d-{il}"))?,
        ])
    }

    /// `mul_mat(w, x)` with the layer's optional bias added, named `{name}-{il}`.
    pub fn proj(
        &mut self,
        x: TensorId,
        il: u32,
        w: &str,
        bias: Option<&str>,
        ne: [u64; 2],
        name: &str,
    ) -> Result<TensorId> {
        let wt = self.lw(il, w, &ne)?;
        let mut cur = self.g.mul_mat(&format!("{name}-{il}"), wt, x)?;
        if let Some(b) = bias {
            if let Some(bt) = self.lw_opt(il, b, &[ne[1]])? {
                cur = self.g.add(&format!("{name}_b-{il}"), cur, bt)?;
            }
        }
        Ok(cur)
    }

    /// The rope parameters of layer `il` (the sliding-window base on local layers).
    pub fn rope_params(&self, il: u32) -> RopeParams {
        let hp = self.hp;
        let swa = hp.is_swa(il);
        RopeParams {
            mode: hp.rope_type,
            n_rot: hp.n_rot,
            freq_base: if swa {
                hp.rope_freq_base_swa
            } else {
                hp.rope_freq_base
            },
            freq_scale: if swa {
                hp.rope_freq_scale_swa
            } else {
                hp.rope_freq_scale
            },
            n_ctx_orig: hp.n_ctx_orig_yarn,
            ext_factor: hp.yarn_ext_factor,
            attn_factor: hp.rope_attn_factor,
            beta_fast: hp.yarn_beta_fast,
            beta_slow: hp.yarn_beta_slow,
        }
    }

    /// Rope on `x {head, n_heads, n_tokens}` for layer `il`, named `{name}-{il}`.
    pub fn rope(&mut self, x: TensorId, il: u32, name: &str) -> Result<TensorId> {
        self.rope_ff(x, il, None, name)
    }

    /// [`Builder::rope`] with per-dimension frequency divisors `freq_factors`
    /// (`F32 {n_rot / 2}`, e.g. `rope_freqs.weight`).
    pub fn rope_ff(
        &mut self,
        x: TensorId,
        il: u32,
        freq_factors: Option<TensorId>,
        name: &str,
    ) -> Result<TensorId> {
        let p = self.rope_params(il);
        Ok(self
            .g
            .rope(&format!("{name}-{il}"), x, self.pos, freq_factors, p)?)
    }

    /// Reshapes a projection `{n_head * head, n_tokens}` to `{head, n_head, n_tokens}`.
    pub fn heads(&mut self, x: TensorId, head: u32, n_head: u32, name: &str) -> Result<TensorId> {
        let n = self.n_tokens();
        Ok(self.g.reshape(name, x, &[head as u64, n_head as u64, n])?)
    }

    /// The attention parameters of layer `il` with score scale `kq_scale`.
    pub fn attn_params(&self, il: u32, kq_scale: f32) -> AttnParams {
        let hp = self.hp;
        AttnParams {
            kq_scale,
            softcap: hp.f_attn_logit_softcapping,
            window: hp.is_swa(il).then_some(hp.n_swa),
            causal: hp.causal_attn,
        }
    }

    /// llama.cpp's `build_attn` up to (not including) the output projection: stores K and V
    /// of this ubatch in the layer's caches and attends over them. Around a quantized cache
    /// llama.cpp rotates with a Walsh–Hadamard matrix (`ir::ggml::fwht`): Q and K before a
    /// quantized K cache, V before a quantized V cache and the result after it.
    /// `q {d_k, n_head, T}`, `k {d_k, n_head_kv, T}`, `v {d_v, n_head_kv, T}` →
    /// `kqv_out-{il} {d_v * n_head, T}`.
    pub fn attention(
        &mut self,
        il: u32,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        kq_scale: f32,
    ) -> Result<TensorId> {
        let hp = self.hp;
        let (n, n_ctx) = (self.n_tokens(), self.req.n_ctx as u64);
        let kv = self.req.kv_types;
        let k_rot = matches!(kv.k, DType::Block(_))
            .then(|| ir::ggml::k_rot_size(hp.n_embd_head_k as u64))
            .flatten();
        let v_rot = matches!(kv.v, DType::Block(_))
            .then(|| ir::ggml::v_rot_size(hp.n_embd_head_v as u64))
            .flatten();
        let (mut q, mut k, mut v) = (q, k, v);
        if let Some(r) = k_rot {
            q = self.g.hadamard(&format!("Qcur_rot-{il}"), q, r as u32)?;
            k = self.g.hadamard(&format!("Kcur_rot-{il}"), k, r as u32)?;
        }
        if let Some(r) = v_rot {
            v = self.g.hadamard(&format!("Vcur_rot-{il}"), v, r as u32)?;
        }
        let mut stored = [TensorId(0); 2];
        for (i, (kind, cur, d, kv)) in [
            (KvKind::K, k, hp.n_embd_head_k, self.req.kv_types.k),
            (KvKind::V, v, hp.n_embd_head_v, self.req.kv_types.v),
        ]
        .into_iter()
        .enumerate()
        {
            let tag = if kind == KvKind::K { "k" } else { "v" };
            let gqa = (d * hp.n_head_kv) as u64;
            let cache = self.g.input(
                format!("cache_{tag}_l{il}"),
                Input::KvCache { layer: il, kind },
                kv,
                Shape::new(&[gqa, n_ctx]),
            );
            let cur = if self.g.tensor(cur).contiguous {
                cur
            } else {
                self.g.cont(&format!("{tag}cur_cont-{il}"), cur)?
            };
            let flat = self
                .g
                .reshape(&format!("{tag}cur_2d-{il}"), cur, &[gqa, n])?;
            let all = self
                .g
                .kv_store(&format!("cache_{tag}_store-{il}"), cache, flat, self.pos)?;
            // Rows of whole blocks: a quantized cache needs heads of whole blocks.
            let row = |n: u64| {
                kv.row_size(n).ok_or_else(|| {
                    Error::Unsupported(format!(
                        "a {kv} KV cache with heads of {d} values (not whole blocks of {})",
                        kv.block_size()
                    ))
                })
            };
            let (head, cell) = (row(d as u64)?, row(gqa)?);
            let shape = Shape::new(&[d as u64, hp.n_head_kv as u64, n_ctx]).with_kv_dim(2);
            stored[i] = self.g.view(
                &format!("{tag}-{il}"),
                all,
                shape,
                [kv.type_size(), head, cell, cell * n_ctx],
                0,
            )?;
        }
        let p = self.attn_params(il, kq_scale);
        let kqv = self
            .g
            .attention(&format!("kqv-{il}"), q, stored[0], stored[1], self.pos, p)?;
        let out = self.g.reshape(
            &format!("kqv_out-{il}"),
            kqv,
            &[(hp.n_embd_head_v * hp.n_head) as u64, n],
        )?;
        Ok(match v_rot {
            Some(r) => self
                .g
                .hadamard(&format!("kqv_out_rot-{il}"), out, r as u32)?,
            None => out,
        })
    }

    /// `down(glu(gate(x), up(x)))` with the layer's `ffn_gate`, `ffn_up`, `ffn_down`.
    pub fn ffn(&mut self, x: TensorId, il: u32, glu: Glu) -> Result<TensorId> {
        let hp = self.hp;
        let (e, f) = (hp.n_embd as u64, hp.n_ff as u64);
        let gate = self.proj(x, il, "ffn_gate.weight", None, [e, f], "ffn_gate")?;
        let up = self.proj(x, il, "ffn_up.weight", None, [e, f], "ffn_up")?;
        let act = match glu {
            Glu::Swiglu => self.g.swiglu(&format!("ffn_swiglu-{il}"), gate, up)?,
            Glu::Geglu => self.g.geglu(&format!("ffn_geglu-{il}"), gate, up)?,
        };
        self.proj(act, il, "ffn_down.weight", None, [f, e], "ffn_out")
    }

    /// llama.cpp's `build_moe_ffn` with a softmax router and SwiGLU experts, on
    /// `x {n_embd, n_tokens}` of layer `il`: `ffn_gate_inp {n_embd, n_expert}` gives the
    /// router's logits, their softmax the probabilities; the `n_expert_used` most probable
    /// experts' `ffn_gate_exps`, `ffn_up_exps` `{n_embd, n_ff_exp, n_expert}` and
    /// `ffn_down_exps` `{n_ff_exp, n_embd, n_expert}` run on the token, and their outputs
    /// are summed weighted by the probabilities (normalized to sum to one with `norm_w`,
    /// times `w_scale` unless it is 0 or 1). Returns `ffn_moe_out-{il} {n_embd, n_tokens}`.
    pub fn moe_ffn(
        &mut self,
        x: TensorId,
        il: u32,
        n_ff_exp: u64,
        norm_w: bool,
        w_scale: f32,
    ) -> Result<TensorId> {
        let hp = self.hp;
        let (e, ne, n) = (
            hp.n_embd as u64,
            hp.n_expert as u64,
            self.g.tensor(x).shape.ne[1],
        );
        let logits = self.proj(
            x,
            il,
            "ffn_gate_inp.weight",
            None,
            [e, ne],
            "ffn_moe_logits",
        )?;
        let probs = self
            .g
            .soft_max(&format!("ffn_moe_probs-{il}"), logits, 1.0)?;
        let ids = self
            .g
            .argsort_top_k(&format!("ffn_moe_topk-{il}"), probs, hp.n_expert_used)?;
        let weights = self.g.moe_weights(
            &format!("ffn_moe_weights_norm-{il}"),
            probs,
            ids,
            norm_w,
            w_scale,
        )?;
        let cur = self
            .g
            .reshape(&format!("ffn_moe_inp-{il}"), x, &[e, 1, n])?;
        let mm = |b: &mut Self, cur: TensorId, w: &str, ne: [u64; 2], name: &str| {
            let wt = b.lw(il, w, &[ne[0], ne[1], hp.n_expert as u64])?;
            Ok::<_, Error>(b.g.mul_mat_id(&format!("{name}-{il}"), wt, cur, ids)?)
        };
        let up = mm(self, cur, "ffn_up_exps.weight", [e, n_ff_exp], "ffn_moe_up")?;
        let gate = mm(
            self,
            cur,
            "ffn_gate_exps.weight",
            [e, n_ff_exp],
            "ffn_moe_gate",
        )?;
        let act = self.g.swiglu(&format!("ffn_moe_swiglu-{il}"), gate, up)?;
        let down = mm(
            self,
            act,
            "ffn_down_exps.weight",
            [n_ff_exp, e],
            "ffn_moe_down",
        )?;
        Ok(self
            .g
            .moe_sum(&format!("ffn_moe_out-{il}"), down, weights)?)
    }

    /// Keeps only the rows that produce logits (`inp_out_ids`), as llama.cpp does in the
    /// last layer.
    pub fn select_outputs(&mut self, x: TensorId, name: &str) -> Result<TensorId> {
        Ok(self.g.get_rows(name, x, self.out_ids)?)
    }

    /// `result_norm = rms_norm(x) * output_norm`, `result_output = mul_mat(output, ·)`
    /// (`token_embd.weight` when the output is tied), soft-capped if the model says so.
    /// With [`Builder::embeddings`], `result_norm` itself (llama.cpp's `t_embd`).
    pub fn output(&mut self, x: TensorId) -> Result<TensorId> {
        let hp = self.hp;
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let w = self.weight("output_norm.weight", &[e])?;
        let cur = self.rms_norm_w(x, w, "result_norm")?;
        if self.embeddings {
            return Ok(cur);
        }
        let out_w = if hp.tied_output {
            self.weight("token_embd.weight", &[e, v])?
        } else {
            self.weight("output.weight", &[e, v])?
        };
        let mut logits = self.g.mul_mat("result_output", out_w, cur)?;
        if let Some(cap) = hp.f_final_logit_softcapping {
            logits = self.g.softcap("result_output_softcap", logits, cap)?;
        }
        Ok(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::Arch;

    /// Every architecture is found by its name, and an unknown one's error names them all.
    #[test]
    fn names_round_trip_and_the_error_lists_them() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()), Some(a));
        }
        let e = crate::error::Error::UnsupportedArch("mamba".into()).to_string();
        assert!(
            e.contains("'mamba'") && e.contains("qwen3moe") && e.contains("olmoe"),
            "{e}"
        );
    }
}
