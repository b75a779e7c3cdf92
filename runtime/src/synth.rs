//! `modelc synth`: a random-weight llama-architecture GGUF of any size, for measuring speed
//! on shapes no model here has (a 1B llama on a machine that cannot fetch one) and for
//! machines that can receive only small files.
//!
//! The file has the shape of a llama as `convert_hf_to_gguf.py` writes one (`token_embd`,
//! per layer `attn_norm attn_q attn_k attn_v attn_output ffn_norm ffn_gate ffn_up ffn_down`,
//! `output_norm`, `output` unless the embeddings are tied, and `rope_freqs` for Llama 3.1's
//! `llama3` rope scaling: [`Llama3Rope`]), the tokenizer of another GGUF
//! (SmolLM2's by default: every `tokenizer.*` key is copied), and weights drawn from a normal
//! distribution of standard deviation [`WEIGHT_STD`] (norm weights 1.0), which keeps the
//! activations in the range of a trained model's: logits of a few units, no overflow.
//!
//! The values are written as F32 would hold them and quantized by `modelc quantize`'s own
//! path ([`crate::quantize::plan_tensors`], [`crate::quantize::write_from`]: the same mixes,
//! `Q4_K_M` included, the same atomic streaming write), one tensor at a time, so a 1B model
//! never needs its 4.4 GB of F32 in memory. The values of each row depend only on the seed,
//! the tensor's name and the row number (a ChaCha8 stream per tensor, positioned at the
//! row), so the file is byte-identical for a seed whatever the thread count.

use crate::quantize::{self, FileType, Options, Plan, Progress, Source, TensorPlan};
use anyhow::{bail, Context};
use ir::ggml::GgmlType;
use ir::gguf::{Metadata, TensorInfo, Value};
use rand::{RngCore, SeedableRng};
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Standard deviation of the random weights (as common initializers use: 0.02).
pub const WEIGHT_STD: f32 = 0.02;

/// The hyperparameters of a synthetic llama (llama.cpp's names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Width of the residual stream.
    pub n_embd: u64,
    /// Number of transformer blocks.
    pub n_layer: u64,
    /// Hidden width of the feed-forward network.
    pub n_ff: u64,
    /// Query heads (`n_embd` must be a multiple).
    pub n_head: u64,
    /// Key/value heads (`n_head` must be a multiple).
    pub n_head_kv: u64,
    /// The training context written as `llama.context_length`.
    pub n_ctx_train: u64,
    /// `llama.rope.freq_base`.
    pub rope_freq_base: f32,
    /// Whether the output projection reuses `token_embd` (no `output.weight`).
    pub tied_output: bool,
    /// The vocabulary size the shape is for (the tokenizer file must have it), or `None`:
    /// whatever the tokenizer file has.
    pub n_vocab: Option<u64>,
    /// Llama 3.1's rope scaling, written as `rope_freqs.weight`.
    pub rope_llama3: Option<Llama3Rope>,
    /// The architecture written ([`SynthArch`]).
    pub arch: SynthArch,
    /// Experts per layer (0: a dense FFN; the MoE architectures need some): a router
    /// `ffn_gate_inp` and `ffn_{gate,up,down}_exps` of `n_ff` per expert in place of the
    /// dense FFN, as `convert_hf_to_gguf.py` writes Mixtral, Qwen3-30B-A3B or OLMoE.
    pub n_expert: u64,
    /// Experts each token is routed to (`expert_used_count`; with `n_expert` above 0).
    pub n_expert_used: u64,
}

/// The architecture of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArch {
    /// `llama` (with experts: Mixtral).
    Llama,
    /// `qwen3moe`: per-head `attn_q_norm` / `attn_k_norm`, experts, `expert_feed_forward_length`.
    Qwen3Moe,
    /// `olmoe`: `attn_q_norm` / `attn_k_norm` over the whole projection, experts.
    Olmoe,
}

impl SynthArch {
    /// The architecture named `name` (`general.architecture`).
    ///
    /// # Errors
    /// An architecture synth does not write.
    pub fn parse(name: &str) -> anyhow::Result<SynthArch> {
        Ok(match name {
            "llama" => SynthArch::Llama,
            "qwen3moe" => SynthArch::Qwen3Moe,
            "olmoe" => SynthArch::Olmoe,
            _ => bail!("unknown architecture '{name}' (one of: llama, qwen3moe, olmoe)"),
        })
    }

    /// The GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Qwen3Moe => "qwen3moe",
            SynthArch::Olmoe => "olmoe",
        }
    }
}

/// Llama 3.1's `llama3` rope scaling (`rope_scaling` in its `config.json`). GGUF has no
/// metadata keys for it: `convert_hf_to_gguf.py` turns it into a `rope_freqs.weight`
/// tensor of `n_rot / 2` frequency divisors ([`Llama3Rope::freq_factors`]), which llama.cpp
/// passes to every layer's rope.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    /// `factor`: the divisor of the low frequencies (8 in Llama 3.1).
    pub factor: f32,
    /// `low_freq_factor` (1).
    pub low_freq_factor: f32,
    /// `high_freq_factor` (4).
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings` (8192).
    pub original_context_length: f32,
}

impl Llama3Rope {
    /// Llama 3.1's values.
    pub const LLAMA_3_1: Llama3Rope = Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context_length: 8192.0,
    };

    /// The `n_rot / 2` divisors of the rope frequencies `base^(-2i / n_rot)`, computed as
    /// `convert_hf_to_gguf.py` does (in f32): 1 for wavelengths below
    /// `original_context_length / high_freq_factor`, `factor` above
    /// `original_context_length / low_freq_factor`, and a smooth blend between.
    pub fn freq_factors(&self, base: f32, n_rot: u64) -> Vec<f32> {
        let low_wavelen = self.original_context_length / self.low_freq_factor;
        let high_wavelen = self.original_context_length / self.high_freq_factor;
        (0..n_rot / 2)
            .map(|i| {
                let freq = 1.0 / base.powf((2 * i) as f32 / n_rot as f32);
                let wavelen = std::f32::consts::TAU / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (self.original_context_length / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

impl Shape {
    /// The shapes `--preset` names: `1b` (TinyLlama 1.1B's: n_embd 2048, 22 layers, n_ff
    /// 5632, 32 heads, 4 KV heads, separate output; 1.2B parameters with SmolLM2's 49152-token
    /// vocabulary), `smollm2-135m` (576, 30 layers, 1536, 9/3 heads, tied output) and `8b`
    /// (Llama-3.1-8B's: 4096, 32 layers, 14336, 32/8 heads, separate output, rope base
    /// 500000 with `llama3` scaling, a 131072-token training context and its 128256-token
    /// vocabulary: 8.0B parameters).
    pub fn preset(name: &str) -> anyhow::Result<Shape> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "1b" | "tinyllama" => Shape {
                n_embd: 2048,
                n_layer: 22,
                n_ff: 5632,
                n_head: 32,
                n_head_kv: 4,
                n_ctx_train: 2048,
                rope_freq_base: 10000.0,
                tied_output: false,
                n_vocab: None,
                rope_llama3: None,
                arch: SynthArch::Llama,
                n_expert: 0,
                n_expert_used: 0,
            },
            "8b" | "llama-3.1-8b" => Shape {
                n_embd: 4096,
                n_layer: 32,
                n_ff: 14336,
                n_head: 32,
                n_head_kv: 8,
                n_ctx_train: 131072,
                rope_freq_base: 500000.0,
                tied_output: false,
                n_vocab: Some(128256),
                rope_llama3: Some(Llama3Rope::LLAMA_3_1),
                arch: SynthArch::Llama,
                n_expert: 0,
                n_expert_used: 0,
            },
            "smollm2-135m" | "135m" => Shape {
                n_embd: 576,
                n_layer: 30,
                n_ff: 1536,
                n_head: 9,
                n_head_kv: 3,
                n_ctx_train: 8192,
                rope_freq_base: 100000.0,
                tied_output: true,
                n_vocab: None,
                rope_llama3: None,
                arch: SynthArch::Llama,
                n_expert: 0,
                n_expert_used: 0,
            },
            _ => bail!("unknown preset '{name}' (one of: 1b, 8b, smollm2-135m)"),
        })
    }

    /// Refuses a shape llama.cpp could not load.
    ///
    /// # Errors
    /// A zero size, heads that do not divide `n_embd` or each other, or an odd head size
    /// (rope rotates pairs).
    pub fn check(&self) -> anyhow::Result<()> {
        let Shape {
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            n_ctx_train,
            ..
        } = *self;
        if [n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx_train].contains(&0) {
            bail!("every size must be above 0 (n_embd {n_embd}, n_layer {n_layer}, n_ff {n_ff}, n_head {n_head}, n_head_kv {n_head_kv})");
        }
        if !n_embd.is_multiple_of(n_head) || !(n_embd / n_head).is_multiple_of(2) {
            bail!("n_embd {n_embd} must be an even multiple of n_head {n_head} (head size n_embd / n_head, even)");
        }
        if !n_head.is_multiple_of(n_head_kv) {
            bail!("n_head {n_head} must be a multiple of n_head_kv {n_head_kv}");
        }
        let (ne, nu) = (self.n_expert, self.n_expert_used);
        if ne > 0 && (nu == 0 || nu > ne || ne > 1024 || self.rope_llama3.is_some()) {
            bail!("{nu} experts used of {ne}: expected 1..={ne} of at most 1024, without llama3 rope scaling");
        }
        if ne == 0 && self.arch != SynthArch::Llama {
            bail!("{} needs experts (--n-expert)", self.arch.name());
        }
        if self.arch == SynthArch::Olmoe && (n_head_kv != n_head || self.tied_output) {
            bail!(
                "olmoe needs n_head_kv = n_head and an output tensor (its K norm is n_embd wide)"
            );
        }
        // Larger than any released model (Llama 3.1 405B: n_embd 16384, n_ff 53248, 126
        // layers); the bound keeps one tensor's bytes within reach of memory.
        if n_embd > 1 << 16 || n_ff > 1 << 18 || n_layer > 1024 {
            bail!("n_embd {n_embd}, n_ff {n_ff} or n_layer {n_layer} is implausibly large");
        }
        Ok(())
    }

    /// The tensor table (ggml `ne`, F32, no data) for a vocabulary of `n_vocab` tokens.
    pub fn tensors(&self, n_vocab: u64) -> Vec<TensorInfo> {
        let (e, f) = (self.n_embd, self.n_ff);
        let kv = e / self.n_head * self.n_head_kv;
        let mut out = Vec::new();
        let mut add = |name: String, ne: &[u64]| {
            let mut full = [1u64; ir::gguf::GGML_MAX_DIMS];
            full[..ne.len()].copy_from_slice(ne);
            out.push(TensorInfo {
                name,
                n_dims: ne.len() as u32,
                ne: full,
                ggml_type: GgmlType::F32,
                offset: 0,
                n_bytes: 4 * ne.iter().product::<u64>(),
                shard: 0,
            });
        };
        add("token_embd.weight".into(), &[e, n_vocab]);
        for i in 0..self.n_layer {
            add(format!("blk.{i}.attn_norm.weight"), &[e]);
            add(format!("blk.{i}.attn_q.weight"), &[e, e]);
            add(format!("blk.{i}.attn_k.weight"), &[e, kv]);
            add(format!("blk.{i}.attn_v.weight"), &[e, kv]);
            add(format!("blk.{i}.attn_output.weight"), &[e, e]);
            add(format!("blk.{i}.ffn_norm.weight"), &[e]);
            match self.arch {
                SynthArch::Qwen3Moe => {
                    add(format!("blk.{i}.attn_q_norm.weight"), &[self.n_rot()]);
                    add(format!("blk.{i}.attn_k_norm.weight"), &[self.n_rot()]);
                }
                SynthArch::Olmoe => {
                    add(format!("blk.{i}.attn_q_norm.weight"), &[e]);
                    add(format!("blk.{i}.attn_k_norm.weight"), &[kv]);
                }
                SynthArch::Llama => {}
            }
            if self.n_expert > 0 {
                let n = self.n_expert;
                add(format!("blk.{i}.ffn_gate_inp.weight"), &[e, n]);
                add(format!("blk.{i}.ffn_gate_exps.weight"), &[e, f, n]);
                add(format!("blk.{i}.ffn_up_exps.weight"), &[e, f, n]);
                add(format!("blk.{i}.ffn_down_exps.weight"), &[f, e, n]);
                continue;
            }
            add(format!("blk.{i}.ffn_gate.weight"), &[e, f]);
            add(format!("blk.{i}.ffn_up.weight"), &[e, f]);
            add(format!("blk.{i}.ffn_down.weight"), &[f, e]);
        }
        add("output_norm.weight".into(), &[e]);
        if !self.tied_output {
            add("output.weight".into(), &[e, n_vocab]);
        }
        if self.rope_llama3.is_some() {
            add("rope_freqs.weight".into(), &[self.n_rot() / 2]);
        }
        out
    }

    /// Dimensions rope rotates: the head size.
    pub fn n_rot(&self) -> u64 {
        self.n_embd / self.n_head
    }
}

/// A size label as `general.size_label` spells it (`135M`, `1.2B`).
fn size_label(n_params: u64) -> String {
    if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{}M", (n_params as f64 / 1e6).round())
    }
}

/// The metadata of the synthetic model: llama.cpp's `llama.*` keys for `shape`, then every
/// `tokenizer.*` key of `vocab` in its order.
///
/// # Errors
/// `vocab` has no `tokenizer.ggml.tokens` array.
pub fn metadata(shape: &Shape, vocab: &Metadata, seed: u64) -> anyhow::Result<(Metadata, u64)> {
    let n_vocab = vocab
        .get_array("tokenizer.ggml.tokens")?
        .context("the vocabulary file has no tokenizer.ggml.tokens")?
        .len() as u64;
    if let Some(want) = shape.n_vocab {
        if want != n_vocab {
            bail!("the shape has a {want}-token vocabulary; the vocabulary file has {n_vocab} tokens (pass --vocab-from a GGUF with {want}, e.g. llama.cpp's models/ggml-vocab-llama-bpe.gguf for Llama 3's)");
        }
    }
    let n_params: u64 = shape
        .tensors(n_vocab)
        .iter()
        .map(TensorInfo::n_elements)
        .sum();
    let label = size_label(n_params);
    let mut md = Metadata::default();
    let arch = shape.arch.name();
    let mut put = |k: &str, v: Value| {
        let k = k
            .strip_prefix("llama.")
            .map_or(k.to_string(), |s| format!("{arch}.{s}"));
        md.push(k, v)
    };
    let u32v = |x: u64| Value::U32(x as u32);
    put("general.architecture", Value::String(arch.into()));
    put("general.type", Value::String("model".into()));
    put(
        "general.name",
        Value::String(format!("modelc synthetic {arch} {label} (seed {seed})")),
    );
    put("general.size_label", Value::String(label));
    put("llama.block_count", u32v(shape.n_layer));
    put("llama.context_length", u32v(shape.n_ctx_train));
    put("llama.embedding_length", u32v(shape.n_embd));
    put("llama.feed_forward_length", u32v(shape.n_ff));
    put("llama.attention.head_count", u32v(shape.n_head));
    put("llama.attention.head_count_kv", u32v(shape.n_head_kv));
    put("llama.rope.freq_base", Value::F32(shape.rope_freq_base));
    put("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    put("llama.vocab_size", u32v(n_vocab));
    put("llama.rope.dimension_count", u32v(shape.n_rot()));
    if shape.n_expert > 0 {
        put("llama.expert_count", u32v(shape.n_expert));
        put("llama.expert_used_count", u32v(shape.n_expert_used));
        if shape.arch == SynthArch::Qwen3Moe {
            put("llama.expert_feed_forward_length", u32v(shape.n_ff));
        }
    }
    for (k, v) in vocab.iter() {
        if k.starts_with("tokenizer.") {
            md.push(k.to_string(), v.clone());
        }
    }
    Ok((md, n_vocab))
}

/// The random values: norms are 1.0, `rope_freqs` the scaling's divisors, every other
/// tensor normal(0, [`WEIGHT_STD`]).
struct Random {
    seed: u64,
    /// `rope_freqs.weight`'s values, if the shape has one.
    rope_freqs: Option<Vec<f32>>,
}

impl Random {
    /// The ChaCha8 key of tensor `name`: the seed and the name (FNV-1a), so a tensor's
    /// values do not depend on the others.
    fn key(&self, name: &str) -> [u8; 32] {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&h.to_le_bytes());
        key
    }
}

impl Source for Random {
    fn unchanged(&self, _: &TensorPlan) -> Option<Vec<u8>> {
        None
    }

    fn rows(&self, t: &TensorPlan, row0: usize, out: &mut [f32]) -> Result<(), String> {
        if t.name.ends_with("_norm.weight") {
            out.fill(1.0);
            return Ok(());
        }
        if t.name == "rope_freqs.weight" {
            let f = self
                .rope_freqs
                .as_ref()
                .ok_or("rope_freqs.weight without a rope scaling")?;
            let row = f.get(row0..row0 + out.len()).ok_or("rope_freqs rows")?;
            out.copy_from_slice(row);
            return Ok(());
        }
        // One 32-bit word per value (pairs for Box–Muller), so row r starts at word
        // r * n_per_row (rounded up to a pair).
        let n_per_row = (t.ne[0] as usize).next_multiple_of(2);
        let mut rng = rand_chacha::ChaCha8Rng::from_seed(self.key(&t.name));
        rng.set_word_pos((row0 * n_per_row) as u128);
        let unit = |w: u32| (w >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
        for row in out.chunks_mut(t.ne[0] as usize) {
            for pair in 0..n_per_row / 2 {
                // Box–Muller: u1 in (0, 1], u2 in [0, 1).
                let u1 = 1.0 - unit(rng.next_u32());
                let u2 = unit(rng.next_u32());
                let r = (-2.0 * u1.ln()).sqrt() * WEIGHT_STD;
                let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
                row[2 * pair] = r * c;
                if let Some(x) = row.get_mut(2 * pair + 1) {
                    *x = r * s;
                }
            }
        }
        Ok(())
    }
}

/// A synthetic model ready to be written: its metadata and its tensors' output types.
pub struct Synth {
    metadata: Metadata,
    plan: Plan,
    seed: u64,
    rope_freqs: Option<Vec<f32>>,
}

impl Synth {
    /// A synthetic llama of `shape` with the tokenizer of `vocab` (a GGUF's metadata),
    /// quantized to `ftype` by `modelc quantize`'s mixes and rules, values drawn with `seed`.
    ///
    /// # Errors
    /// A bad shape ([`Shape::check`]), a vocabulary without `tokenizer.ggml.tokens`, a type
    /// modelc cannot quantize to.
    pub fn new(
        shape: &Shape,
        vocab: &Metadata,
        ftype: FileType,
        seed: u64,
    ) -> anyhow::Result<Synth> {
        shape.check()?;
        let (metadata, n_vocab) = metadata(shape, vocab, seed)?;
        let plan = quantize::plan_tensors(
            &metadata,
            &shape.tensors(n_vocab),
            ftype,
            &Options::default(),
        )?;
        Ok(Synth {
            metadata,
            plan,
            seed,
            rope_freqs: shape
                .rope_llama3
                .map(|r| r.freq_factors(shape.rope_freq_base, shape.n_rot())),
        })
    }

    /// The output tensors and their types.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Writes the file to `out` atomically on `n_threads` threads, calling `progress` after
    /// each tensor.
    ///
    /// # Errors
    /// I/O errors naming `out`; "interrupted" after `cancel`.
    pub fn write(
        &self,
        out: &Path,
        n_threads: usize,
        cancel: &AtomicBool,
        progress: impl FnMut(Progress<'_>),
    ) -> anyhow::Result<()> {
        quantize::write_from(
            &self.metadata,
            &Random {
                seed: self.seed,
                rope_freqs: self.rope_freqs.clone(),
            },
            &self.plan,
            out,
            n_threads,
            cancel,
            progress,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_checks() {
        let s = Shape::preset("1b").unwrap();
        s.check().unwrap();
        let n: u64 = s.tensors(49152).iter().map(TensorInfo::n_elements).sum();
        assert_eq!(size_label(n), "1.2B");
        let smol = Shape::preset("smollm2-135m").unwrap();
        let n: u64 = smol.tensors(49152).iter().map(TensorInfo::n_elements).sum();
        assert_eq!(n, 134_515_008, "SmolLM2-135M's parameter count");
        assert!(Shape::preset("7b").is_err());
        let big = Shape::preset("8b").unwrap();
        big.check().unwrap();
        let n: u64 = big.tensors(128256).iter().map(TensorInfo::n_elements).sum();
        // Llama-3.1-8B's parameters (8,030,261,248) and the 64 rope_freqs values.
        assert_eq!(n, 8_030_261_248 + 64);
        assert_eq!(size_label(n), "8.0B");
        assert!(Shape { n_head: 3, ..s }.check().is_err());
        assert!(Shape { n_head_kv: 5, ..s }.check().is_err());
        assert!(Shape { n_layer: 0, ..s }.check().is_err());
    }

    /// Llama 3.1's `rope_freqs` as `convert_hf_to_gguf.py` computes them for base 500000,
    /// head size 128 (its values, computed in Python: 1 for i < 29, then 1.2075, 1.5534,
    /// 2.0263, 2.6945, 3.6843, 5.2573, then 8).
    #[test]
    fn llama3_rope_freq_factors() {
        let f = Llama3Rope::LLAMA_3_1.freq_factors(500000.0, 128);
        assert_eq!(f.len(), 64);
        // Wavelength 2π·500000^(i/64) crosses 8192 / 4 = 2048 between i = 28 and 29 and
        // 8192 between i = 34 and 35.
        assert!(f[..29].iter().all(|&x| x == 1.0), "{f:?}");
        assert!(f[35..].iter().all(|&x| x == 8.0), "{f:?}");
        let blend = [
            1.207_483_9,
            1.553_414_6,
            2.026_313_2,
            2.694_529_7,
            3.684_252_5,
            5.257_326_6,
        ];
        for (got, want) in f[29..35].iter().zip(blend) {
            assert!((got - want).abs() < 1e-5, "{f:?}");
        }
    }

    #[test]
    fn values_are_normal_and_independent_of_the_split() {
        let t = TensorPlan {
            index: 0,
            name: "blk.0.attn_q.weight".into(),
            ne: vec![64, 100],
            from: GgmlType::F32,
            to: GgmlType::Q8_0,
            from_bytes: 0,
            to_bytes: 0,
        };
        let r = Random {
            seed: 7,
            rope_freqs: None,
        };
        let mut all = vec![0f32; 64 * 100];
        r.rows(&t, 0, &mut all).unwrap();
        let mut part = vec![0f32; 64 * 3];
        r.rows(&t, 40, &mut part).unwrap();
        assert_eq!(part, all[40 * 64..43 * 64]);
        let mean = all.iter().sum::<f32>() / all.len() as f32;
        let sd = (all.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / all.len() as f32).sqrt();
        assert!(mean.abs() < 0.002, "{mean}");
        assert!((sd - WEIGHT_STD).abs() < 0.002, "{sd}");
        let mut other = vec![0f32; 64 * 100];
        Random {
            seed: 8,
            rope_freqs: None,
        }
        .rows(&t, 0, &mut other)
        .unwrap();
        assert_ne!(all, other);
    }
}
