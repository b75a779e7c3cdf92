//! Hyperparameters of a model, read from its GGUF metadata as llama.cpp's
//! `llama_model::load_hparams` (llama-model.cpp) reads them.
//!
//! Keys are `{arch}.*` where `arch` is `general.architecture`. What is derived and how:
//!
//! | field | key | when absent |
//! | --- | --- | --- |
//! | `n_ctx_train` | `{arch}.context_length` | error |
//! | `n_embd` | `{arch}.embedding_length` | error |
//! | `n_layer` | `{arch}.block_count` | error |
//! | `n_ff` | `{arch}.feed_forward_length` (number, or per-layer array of equal values) | error |
//! | `n_head` | `{arch}.attention.head_count` (likewise) | error |
//! | `n_head_kv` | `{arch}.attention.head_count_kv` (likewise) | `n_head` |
//! | `n_embd_head_k` / `_v` | `{arch}.attention.key_length` / `value_length` | `n_embd / n_head` |
//! | `n_rot` | `{arch}.rope.dimension_count` | `n_embd_head_k` (llama: must equal it) |
//! | `n_vocab` | `{arch}.vocab_size` | length of `tokenizer.ggml.tokens`; error if neither |
//! | `rope_freq_base` | `{arch}.rope.freq_base` | 10000 |
//! | `rope_scaling_type` | `{arch}.rope.scaling.type` (none, linear, yarn, longrope) | linear |
//! | `rope_freq_scale` | 1 / `{arch}.rope.scaling.factor` (or `rope.scale_linear`); 1 for type none | 1 |
//! | `n_ctx_orig_yarn` | `{arch}.rope.scaling.original_context_length` | `n_ctx_train` |
//! | `rope_attn_factor` | `{arch}.rope.scaling.attn_factor` | 1 |
//! | `f_norm_rms_eps` | `{arch}.attention.layer_norm_rms_epsilon` | error (bert: unused, 0) |
//! | `f_norm_eps` | `{arch}.attention.layer_norm_epsilon` | bert: error; others 0 (unused) |
//! | `causal_attn` | `{arch}.attention.causal` | true |
//! | `n_cls_out` | length of `{arch}.classifier.output_labels` | 1 |
//! | `n_swa`, `swa_layers` | gemma3: `{arch}.attention.sliding_window` (required) and `sliding_window_pattern` (period n: layer il is local when `il % n < n - 1`; or a per-layer bool array) | gemma3 period 6 |
//! | `rope_freq_base_swa` | `{arch}.rope.freq_base_swa` | gemma3: 10000; others: `rope_freq_base` |
//! | softcapping | `{arch}.attn_logit_softcapping`, `{arch}.final_logit_softcapping` | none |
//! | `tied_output` | — | true when the tensor `output.weight` is absent |
//! | `n_expert` | `{arch}.expert_count` (at most 1024, llama.cpp's `LLAMA_MAX_EXPERTS`) | 0 (dense) |
//! | `n_expert_used` | `{arch}.expert_used_count` (number, or per-layer array of equal values; 1..=`n_expert` with experts) | 0 |
//! | `n_ff_exp` | `{arch}.expert_feed_forward_length` | 0 (the architecture's default: qwen3moe `n_ff / n_expert_used`) |
//!
//! The rope type (llama.cpp's `llama_model_rope_type`) is per architecture: llama NORM;
//! qwen2, qwen3, phi3, gemma3 NEOX. phi3's sliding window is ignored, as llama.cpp does.

use crate::arch::Arch;
use crate::error::{Error, Result};
use ir::gguf::{GgufFile, Metadata, Value};
use ir::graph::RopeMode;

/// How rope positions are scaled (`rope.scaling.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum RopeScaling {
    /// `none`: no scaling (freq_scale forced to 1).
    None,
    /// `linear` (the default): positions multiplied by freq_scale.
    Linear,
    /// `yarn`: YaRN (ext_factor 1).
    Yarn,
    /// `longrope`: per-pair frequency factors (phi3 `rope_factors_*` tensors).
    LongRope,
}

/// The hyperparameters of a model (see the module doc for where each comes from). Field
/// names are llama.cpp's `llama_hparams` names.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HParams {
    /// The architecture.
    pub arch: Arch,
    /// `general.name`, if present.
    pub name: Option<String>,
    /// Training context length.
    pub n_ctx_train: u32,
    /// Embedding width.
    pub n_embd: u32,
    /// Number of blocks.
    pub n_layer: u32,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads (grouped-query attention when below `n_head`).
    pub n_head_kv: u32,
    /// Feed-forward width.
    pub n_ff: u32,
    /// Size of a key head.
    pub n_embd_head_k: u32,
    /// Size of a value head.
    pub n_embd_head_v: u32,
    /// Rotated values per head.
    pub n_rot: u32,
    /// Vocabulary size.
    pub n_vocab: u32,
    /// Rope pairing.
    pub rope_type: RopeMode,
    /// Rope base.
    pub rope_freq_base: f32,
    /// Rope position scale (1 / scaling factor).
    pub rope_freq_scale: f32,
    /// Rope scaling type.
    pub rope_scaling_type: RopeScaling,
    /// YaRN's original context.
    pub n_ctx_orig_yarn: u32,
    /// Rope magnitude factor.
    pub rope_attn_factor: f32,
    /// YaRN extrapolation mix: 1 for YaRN scaling, else 0 (llama.cpp's context default).
    pub yarn_ext_factor: f32,
    /// YaRN beta_fast (llama.cpp default 32).
    pub yarn_beta_fast: f32,
    /// YaRN beta_slow (llama.cpp default 1).
    pub yarn_beta_slow: f32,
    /// Rope base of sliding-window layers.
    pub rope_freq_base_swa: f32,
    /// Rope scale of sliding-window layers.
    pub rope_freq_scale_swa: f32,
    /// RMS norm epsilon.
    pub f_norm_rms_eps: f32,
    /// Layer norm epsilon (`ggml_norm`: bert's norms with bias).
    pub f_norm_eps: f32,
    /// Whether a token attends only to the tokens before it (`attention.causal`; encoders
    /// such as bert write false: every token sees the whole sequence).
    pub causal_attn: bool,
    /// Outputs of a classification head (`classifier.output_labels`; rerankers have 1).
    pub n_cls_out: u32,
    /// Sliding window size (0: none).
    pub n_swa: u32,
    /// Per layer: whether it uses the sliding window.
    pub swa_layers: Vec<bool>,
    /// Attention logit soft-cap.
    pub f_attn_logit_softcapping: Option<f32>,
    /// Final logit soft-cap.
    pub f_final_logit_softcapping: Option<f32>,
    /// Query scale applied before attention instead of `kq_scale` (gemma3: 1/sqrt(head)).
    pub f_attention_scale: Option<f32>,
    /// Output projection tied to `token_embd.weight` (no `output.weight`).
    pub tied_output: bool,
    /// Experts per mixture-of-experts layer (0: dense).
    pub n_expert: u32,
    /// Experts each token is routed to.
    pub n_expert_used: u32,
    /// Feed-forward width of one expert (0: not given).
    pub n_ff_exp: u32,
}

/// Typed access to `{arch}.*` keys with errors that name the key.
struct Keys<'a> {
    md: &'a Metadata,
    arch: &'a str,
}

impl<'a> Keys<'a> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{}", self.arch, suffix)
    }

    fn bad(key: &str, e: impl std::fmt::Display) -> Error {
        Error::BadKey {
            key: key.to_string(),
            msg: e.to_string(),
        }
    }

    fn u32_opt(&self, suffix: &str) -> Result<Option<u32>> {
        let k = self.key(suffix);
        self.md.get_u32(&k).map_err(|e| Self::bad(&k, e))
    }

    fn u32_req(&self, suffix: &str) -> Result<u32> {
        self.u32_opt(suffix)?
            .ok_or_else(|| Error::MissingKey(self.key(suffix)))
    }

    fn f32_opt(&self, suffix: &str) -> Result<Option<f32>> {
        let k = self.key(suffix);
        self.md.get_f32(&k).map_err(|e| Self::bad(&k, e))
    }

    /// A number, or a per-layer array whose values are all equal (llama.cpp's
    /// `get_key_or_arr`; differing per-layer values are not supported).
    fn u32_or_arr(&self, suffix: &str, n_layer: u32) -> Result<Option<u32>> {
        let k = self.key(suffix);
        match self.md.get(&k) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                let v = a
                    .to_i64s()
                    .ok_or_else(|| Self::bad(&k, "expected integers"))?;
                if v.len() != n_layer as usize {
                    return Err(Self::bad(
                        &k,
                        format!("array of {} values for {n_layer} layers", v.len()),
                    ));
                }
                let first = *v.first().ok_or_else(|| Self::bad(&k, "empty array"))?;
                if v.iter().any(|&x| x != first) {
                    return Err(Error::Unsupported(format!("{k}: per-layer values differ")));
                }
                u32::try_from(first)
                    .map(Some)
                    .map_err(|_| Self::bad(&k, format!("{first} is out of range")))
            }
            Some(v) => v
                .as_u32()
                .map(Some)
                .ok_or_else(|| Self::bad(&k, "expected an integer")),
        }
    }
}

fn positive(key: String, v: u32) -> Result<u32> {
    if v == 0 {
        return Err(Error::BadKey {
            key,
            msg: "must be positive".into(),
        });
    }
    Ok(v)
}

/// Largest layer count accepted (llama.cpp's `LLAMA_MAX_LAYERS`).
const MAX_LAYERS: u32 = 512;

/// Largest expert count accepted (llama.cpp's `LLAMA_MAX_EXPERTS`).
const MAX_EXPERTS: u32 = 1024;

impl HParams {
    /// Reads the hyperparameters of `gguf` (see the module doc).
    ///
    /// # Errors
    /// [`Error::NoArch`], [`Error::UnsupportedArch`]; [`Error::MissingKey`] naming a required
    /// key; [`Error::BadKey`] for a key of the wrong type or an impossible value (zero sizes,
    /// `n_head` not a multiple of `n_head_kv`, `n_rot` larger than a head or odd).
    pub fn from_gguf(gguf: &GgufFile) -> Result<HParams> {
        let md = gguf.metadata();
        let arch_name = md
            .get_str("general.architecture")
            .map_err(|e| Keys::bad("general.architecture", e))?
            .ok_or(Error::NoArch)?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| Error::UnsupportedArch(arch_name.to_string()))?;
        let k = Keys {
            md,
            arch: arch_name,
        };
        let name = md
            .get_str("general.name")
            .ok()
            .flatten()
            .map(str::to_string);

        let n_ctx_train = positive(k.key("context_length"), k.u32_req("context_length")?)?;
        let n_embd = positive(k.key("embedding_length"), k.u32_req("embedding_length")?)?;
        let n_layer = positive(k.key("block_count"), k.u32_req("block_count")?)?;
        if n_layer > MAX_LAYERS {
            return Err(Error::BadKey {
                key: k.key("block_count"),
                msg: format!("{n_layer} layers exceed {MAX_LAYERS}"),
            });
        }
        // Experts (llama.cpp reads these for every architecture, absent meaning dense).
        let n_expert = k.u32_opt("expert_count")?.unwrap_or(0);
        let n_expert_used = k.u32_or_arr("expert_used_count", n_layer)?.unwrap_or(0);
        let n_ff_exp = k.u32_opt("expert_feed_forward_length")?.unwrap_or(0);
        if n_expert > MAX_EXPERTS {
            return Err(Error::BadKey {
                key: k.key("expert_count"),
                msg: format!("{n_expert} experts exceed {MAX_EXPERTS}"),
            });
        }
        if n_expert_used > n_expert || (n_expert > 0 && n_expert_used == 0) {
            return Err(Error::BadKey {
                key: k.key("expert_used_count"),
                msg: format!("{n_expert_used} experts used of {n_expert}: expected 1..={n_expert}"),
            });
        }
        if arch.is_moe() && n_expert == 0 {
            return Err(Error::MissingKey(k.key("expert_count")));
        }
        // A mixture-of-experts model may give only the experts' width.
        let n_ff = match k.u32_or_arr("feed_forward_length", n_layer)? {
            Some(n) => n,
            None if arch.is_moe() => 0,
            None => return Err(Error::MissingKey(k.key("feed_forward_length"))),
        };
        let n_ff = if arch.is_moe() {
            n_ff
        } else {
            positive(k.key("feed_forward_length"), n_ff)?
        };
        let n_head = k
            .u32_or_arr("attention.head_count", n_layer)?
            .ok_or_else(|| Error::MissingKey(k.key("attention.head_count")))?;
        let n_head = positive(k.key("attention.head_count"), n_head)?;
        let n_head_kv = positive(
            k.key("attention.head_count_kv"),
            k.u32_or_arr("attention.head_count_kv", n_layer)?
                .unwrap_or(n_head),
        )?;
        if n_head % n_head_kv != 0 {
            return Err(Error::BadKey {
                key: k.key("attention.head_count_kv"),
                msg: format!("n_head {n_head} is not a multiple of n_head_kv {n_head_kv}"),
            });
        }
        let n_embd_head_k = positive(
            k.key("attention.key_length"),
            k.u32_opt("attention.key_length")?
                .unwrap_or(n_embd / n_head),
        )?;
        let n_embd_head_v = positive(
            k.key("attention.value_length"),
            k.u32_opt("attention.value_length")?
                .unwrap_or(n_embd / n_head),
        )?;
        let n_rot = k.u32_opt("rope.dimension_count")?.unwrap_or(n_embd_head_k);
        if n_rot == 0 || n_rot % 2 != 0 || n_rot > n_embd_head_k {
            return Err(Error::BadKey {
                key: k.key("rope.dimension_count"),
                msg: format!("n_rot {n_rot} must be even, positive and at most the head size {n_embd_head_k}"),
            });
        }
        if arch == Arch::Llama && n_rot != n_embd_head_k {
            return Err(Error::BadKey {
                key: k.key("rope.dimension_count"),
                msg: format!("invalid n_rot: {n_rot}, expected {n_embd_head_k}"),
            });
        }
        // The tokenizer's size where the file has one, as llama.cpp takes it
        // (`vocab.n_tokens()` shapes `token_embd`): a `vocab_size` key that disagrees does
        // not hide a tokenizer cut short (its tokens past the list would have no text).
        let tokens = md
            .get_array("tokenizer.ggml.tokens")
            .map_err(|e| Keys::bad("tokenizer.ggml.tokens", e))?
            .map(|a| a.len() as u32);
        let n_vocab = match tokens {
            Some(n) => n,
            None => k.u32_opt("vocab_size")?.ok_or_else(|| {
                Error::MissingKey(format!("{arch_name}.vocab_size (or tokenizer.ggml.tokens)"))
            })?,
        };
        let n_vocab = positive(k.key("vocab_size"), n_vocab)?;

        // Rope.
        let rope_freq_base = k.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
        let scaling_key = k.key("rope.scaling.type");
        let rope_scaling_type = match md
            .get_str(&scaling_key)
            .map_err(|e| Keys::bad(&scaling_key, e))?
        {
            None | Some("linear") => RopeScaling::Linear,
            Some("none") => RopeScaling::None,
            Some("yarn") => RopeScaling::Yarn,
            Some("longrope") => RopeScaling::LongRope,
            Some(other) => {
                return Err(Keys::bad(
                    &scaling_key,
                    format!("unknown rope scaling type '{other}'"),
                ))
            }
        };
        let factor = match k.f32_opt("rope.scaling.factor")? {
            Some(f) => f,
            None => k.f32_opt("rope.scale_linear")?.unwrap_or(0.0),
        };
        let mut rope_freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        if rope_scaling_type == RopeScaling::None {
            rope_freq_scale = 1.0;
        }
        let n_ctx_orig_yarn = k
            .u32_opt("rope.scaling.original_context_length")?
            .unwrap_or(n_ctx_train);
        let rope_attn_factor = k.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let yarn_ext_factor = if rope_scaling_type == RopeScaling::Yarn {
            1.0
        } else {
            0.0
        };

        let eps_key = k.key("attention.layer_norm_rms_epsilon");
        let f_norm_rms_eps = match k.f32_opt("attention.layer_norm_rms_epsilon")? {
            Some(e) => e,
            None if arch == Arch::Bert => 0.0,
            None => return Err(Error::MissingKey(eps_key)),
        };
        let f_norm_eps = match k.f32_opt("attention.layer_norm_epsilon")? {
            Some(e) => e,
            None if arch == Arch::Bert => {
                return Err(Error::MissingKey(k.key("attention.layer_norm_epsilon")))
            }
            None => 0.0,
        };
        let causal_key = k.key("attention.causal");
        let causal_attn = match md.get(&causal_key) {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(Keys::bad(&causal_key, "expected a bool")),
        };
        let labels_key = k.key("classifier.output_labels");
        let n_cls_out = match md.get(&labels_key) {
            None => 1,
            Some(Value::Array(a)) if a.len() > 0 => a.len() as u32,
            Some(_) => return Err(Keys::bad(&labels_key, "expected a non-empty array")),
        };

        // Sliding window.
        let mut n_swa = 0;
        let mut swa_layers = vec![false; n_layer as usize];
        let mut rope_freq_base_swa = rope_freq_base;
        let mut rope_freq_scale_swa = rope_freq_scale;
        let mut f_attention_scale = None;
        match arch {
            Arch::Gemma3 => {
                n_swa = k
                    .u32_opt("attention.sliding_window")?
                    .ok_or_else(|| Error::MissingKey(k.key("attention.sliding_window")))?;
                let pk = k.key("attention.sliding_window_pattern");
                match md.get(&pk) {
                    None => set_swa_pattern(&mut swa_layers, 6),
                    Some(Value::Array(a)) => {
                        let v = a
                            .to_i64s()
                            .ok_or_else(|| Keys::bad(&pk, "expected a number or a bool array"))?;
                        if v.len() != n_layer as usize {
                            return Err(Keys::bad(
                                &pk,
                                format!("{} values for {n_layer} layers", v.len()),
                            ));
                        }
                        for (l, x) in swa_layers.iter_mut().zip(v) {
                            *l = x != 0;
                        }
                    }
                    Some(v) => set_swa_pattern(
                        &mut swa_layers,
                        v.as_u32()
                            .ok_or_else(|| Keys::bad(&pk, "expected an integer"))?,
                    ),
                }
                rope_freq_base_swa = k.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0);
                rope_freq_scale_swa = 1.0;
                f_attention_scale = Some(if n_layer == 62 {
                    1.0 / ((n_embd / n_head) as f32).sqrt()
                } else {
                    1.0 / (n_embd_head_k as f32).sqrt()
                });
            }
            Arch::Phi3 => {
                // llama.cpp disables phi3's sliding window (ggml-org/llama.cpp#13676).
            }
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Bert | Arch::Qwen3Moe | Arch::Olmoe => {
            }
        }
        if n_swa == 0 {
            swa_layers.iter_mut().for_each(|l| *l = false);
        }
        let softcap =
            |suffix: &str| -> Result<Option<f32>> { Ok(k.f32_opt(suffix)?.filter(|&c| c != 0.0)) };

        Ok(HParams {
            arch,
            name,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            n_embd_head_k,
            n_embd_head_v,
            n_rot,
            n_vocab,
            rope_type: arch.rope_type(),
            rope_freq_base,
            rope_freq_scale,
            rope_scaling_type,
            n_ctx_orig_yarn,
            rope_attn_factor,
            yarn_ext_factor,
            yarn_beta_fast: 32.0,
            yarn_beta_slow: 1.0,
            rope_freq_base_swa,
            rope_freq_scale_swa,
            f_norm_rms_eps,
            f_norm_eps,
            causal_attn,
            n_cls_out,
            n_swa,
            swa_layers,
            f_attn_logit_softcapping: softcap("attn_logit_softcapping")?,
            f_final_logit_softcapping: softcap("final_logit_softcapping")?,
            f_attention_scale,
            tied_output: gguf.tensor("output.weight").is_none(),
            n_expert,
            n_expert_used,
            n_ff_exp,
        })
    }

    /// Width of all key heads together (`n_embd_head_k * n_head_kv`).
    pub fn n_embd_k_gqa(&self) -> u32 {
        self.n_embd_head_k * self.n_head_kv
    }

    /// Width of all value heads together (`n_embd_head_v * n_head_kv`).
    pub fn n_embd_v_gqa(&self) -> u32 {
        self.n_embd_head_v * self.n_head_kv
    }

    /// Whether layer `il` uses the sliding window.
    pub fn is_swa(&self, il: u32) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il as usize).copied().unwrap_or(false)
    }
}

/// llama.cpp's `set_swa_pattern(n)`: layer `il` is local when `il % n < n - 1` (every n-th
/// layer is global); `n == 0` makes every layer local.
fn set_swa_pattern(layers: &mut [bool], n: u32) {
    for (il, l) in layers.iter_mut().enumerate() {
        *l = n == 0 || (il as u32 % n) < n - 1;
    }
}
