//! A small random-weight `bert` GGUF with a WordPiece vocabulary, written deterministically:
//! the fixture that `runtime/tests/bert.rs` and `scripts/embedding-reference` run through
//! modelc and llama.cpp (`modelc synth --arch bert`).
//!
//! The file has the tensors and keys `convert_hf_to_gguf.py` writes for a BERT model
//! (`token_embd`, `token_types`, `position_embd`, `token_embd_norm`, per layer `attn_q/k/v`,
//! `attn_output`, `attn_output_norm`, `ffn_up`, `ffn_down`, `layer_output_norm`, every
//! projection with its bias; `bert.attention.causal = false`), and with
//! [`BertFixture::rerank`] a classification head (`cls`, `cls.output`) and
//! `bert.pooling_type = 4` (rank), as a cross-encoder reranker has. The vocabulary is written
//! as the converter writes a WordPiece one: word-initial pieces prefixed with `▁`,
//! continuation pieces (`##s` in the Hugging Face file) without their `##`, `[PAD]` at 0,
//! `[UNK]` `[CLS]` `[SEP]` `[MASK]` at 100..=103 (llama.cpp's defaults).
//!
//! Values come from a ChaCha8 stream per tensor keyed by the seed and the tensor's name
//! (Box–Muller normals), so a file depends only on its [`BertFixture`].

use anyhow::Context;
use ir::ggml::GgmlType;
use ir::gguf::{Array, GgufWriter, Value};
use rand::{RngCore, SeedableRng};
use std::path::Path;

/// What to write (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BertFixture {
    /// Type of the 2-D weights (projections, token and position embeddings, the head):
    /// F32, F16 or Q8_0. Norms, biases and `token_types` stay F32.
    pub weight_type: GgmlType,
    /// Whether to add the classification head and `pooling_type = 4` (rank).
    pub rerank: bool,
    /// Seed of the values.
    pub seed: u64,
}

/// `n_embd`.
pub const N_EMBD: u64 = 64;
/// `n_ff`.
pub const N_FF: u64 = 128;
/// `n_layer`.
pub const N_LAYER: u64 = 2;
/// `n_head` (heads of 16).
pub const N_HEAD: u64 = 4;
/// `n_ctx_train` (rows of `position_embd`).
pub const N_CTX_TRAIN: u64 = 128;

/// The words of the vocabulary (each also as a continuation piece is not needed: suffixes
/// below cover the examples the tests use).
const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jump", "over", "lazy", "dog", "hello", "world", "what", "is",
    "a", "cat", "sat", "on", "mat", "paris", "capital", "of", "france", "machine", "learn",
    "embed", "query", "document", "test", "this", "panda", "animal", "bear", "tree", "hi", "how",
    "are", "you", "it", "in", "china", "ding", "rank", "good",
];
const SUFFIXES: &[&str] = &["s", "ing", "ed", "er", "ly", "y", "es"];

/// The vocabulary: token texts and llama.cpp token types (1 normal, 2 unknown, 3 control,
/// 5 unused).
pub fn vocab() -> (Vec<String>, Vec<i32>) {
    let mut t: Vec<(String, i32)> = vec![("[PAD]".into(), 3)];
    t.extend((1..100).map(|i| (format!("[unused{i}]"), 5)));
    t.push(("[UNK]".into(), 2));
    t.push(("[CLS]".into(), 3));
    t.push(("[SEP]".into(), 3));
    t.push(("[MASK]".into(), 3));
    for p in ['.', ',', '!', '?', '\'', '-'] {
        t.push((format!("\u{2581}{p}"), 1));
    }
    for c in 'a'..='z' {
        t.push((format!("\u{2581}{c}"), 1));
    }
    for c in 'a'..='z' {
        t.push((c.to_string(), 1));
    }
    for w in WORDS {
        if w.len() > 1 {
            t.push((format!("\u{2581}{w}"), 1));
        }
    }
    for s in SUFFIXES {
        if s.len() > 1 {
            t.push((s.to_string(), 1));
        }
    }
    t.into_iter().unzip()
}

/// `n` normal values of standard deviation `std` (mean `mean`) for tensor `name`.
fn normals(seed: u64, name: &str, n: usize, mean: f32, std: f32) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&h.to_le_bytes());
    let mut rng = rand_chacha::ChaCha8Rng::from_seed(key);
    let unit = |w: u32| (w >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1 = 1.0 - unit(rng.next_u32());
        let u2 = unit(rng.next_u32());
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        out.push(mean + r * c);
        out.push(mean + r * s);
    }
    out.truncate(n);
    out
}

/// The bytes of `values` (rows of `ne0`) as `ty`.
fn encode(ty: GgmlType, values: &[f32]) -> anyhow::Result<Vec<u8>> {
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&x| ir::ggml::f32_to_f16(x).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => {
            let mut dst = vec![0u8; values.len() / 32 * 34];
            ir::ggml::quantize_weights(ty, values, &mut dst)
                .map_err(|e| anyhow::anyhow!("quantizing to Q8_0: {e}"))?;
            dst
        }
        other => anyhow::bail!("bert fixture: weights of type {other} (F32, F16 or Q8_0)"),
    })
}

impl BertFixture {
    /// The file's bytes.
    ///
    /// # Errors
    /// A weight type other than F32, F16 or Q8_0.
    pub fn to_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let (tokens, types) = vocab();
        let n_vocab = tokens.len() as u64;
        let mut w = GgufWriter::new();
        let u32v = |x: u64| Value::U32(x as u32);
        w.add_kv("general.architecture", Value::String("bert".into()));
        w.add_kv(
            "general.name",
            Value::String(format!(
                "modelc bert fixture{} (seed {})",
                if self.rerank { " reranker" } else { "" },
                self.seed
            )),
        );
        w.add_kv("bert.context_length", u32v(N_CTX_TRAIN));
        w.add_kv("bert.embedding_length", u32v(N_EMBD));
        w.add_kv("bert.feed_forward_length", u32v(N_FF));
        w.add_kv("bert.block_count", u32v(N_LAYER));
        w.add_kv("bert.attention.head_count", u32v(N_HEAD));
        w.add_kv("bert.attention.layer_norm_epsilon", Value::F32(1e-12));
        w.add_kv("bert.attention.causal", Value::Bool(false));
        w.add_kv("bert.pooling_type", u32v(if self.rerank { 4 } else { 1 }));
        if self.rerank {
            w.add_kv(
                "bert.classifier.output_labels",
                Value::Array(Array::String(vec!["LABEL_0".into()])),
            );
        }
        w.add_kv("tokenizer.ggml.model", Value::String("bert".into()));
        w.add_kv("tokenizer.ggml.token_type_count", Value::U32(2));
        w.add_kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
        w.add_kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        let (e, f) = (N_EMBD, N_FF);
        // (name, ne, mean, std, 2-D weight)
        let mut specs: Vec<(String, Vec<u64>, f32, f32, bool)> = vec![
            ("token_embd.weight".into(), vec![e, n_vocab], 0.0, 0.5, true),
            ("token_types.weight".into(), vec![e, 2], 0.0, 0.5, false),
            (
                "position_embd.weight".into(),
                vec![e, N_CTX_TRAIN],
                0.0,
                0.5,
                true,
            ),
            ("token_embd_norm.weight".into(), vec![e], 1.0, 0.1, false),
            ("token_embd_norm.bias".into(), vec![e], 0.0, 0.1, false),
        ];
        for il in 0..N_LAYER {
            let l = |s: &str| format!("blk.{il}.{s}");
            for p in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                specs.push((l(&format!("{p}.weight")), vec![e, e], 0.0, 0.25, true));
                specs.push((l(&format!("{p}.bias")), vec![e], 0.0, 0.1, false));
            }
            specs.push((l("attn_output_norm.weight"), vec![e], 1.0, 0.1, false));
            specs.push((l("attn_output_norm.bias"), vec![e], 0.0, 0.1, false));
            specs.push((l("ffn_up.weight"), vec![e, f], 0.0, 0.25, true));
            specs.push((l("ffn_up.bias"), vec![f], 0.0, 0.1, false));
            specs.push((l("ffn_down.weight"), vec![f, e], 0.0, 0.15, true));
            specs.push((l("ffn_down.bias"), vec![e], 0.0, 0.1, false));
            specs.push((l("layer_output_norm.weight"), vec![e], 1.0, 0.1, false));
            specs.push((l("layer_output_norm.bias"), vec![e], 0.0, 0.1, false));
        }
        if self.rerank {
            specs.push(("cls.weight".into(), vec![e, e], 0.0, 0.25, true));
            specs.push(("cls.bias".into(), vec![e], 0.0, 0.1, false));
            specs.push(("cls.output.weight".into(), vec![e, 1], 0.0, 0.5, true));
            specs.push(("cls.output.bias".into(), vec![1], 0.0, 0.1, false));
        }
        for (name, ne, mean, std, two_d) in specs {
            let n: u64 = ne.iter().product();
            let values = normals(self.seed, &name, n as usize, mean, std);
            let ty = if two_d {
                self.weight_type
            } else {
                GgmlType::F32
            };
            let data = encode(ty, &values)?;
            w.add_tensor(name.as_str(), &ne, ty, data)
                .map_err(|err| anyhow::anyhow!("{err}"))?;
        }
        w.to_bytes().map_err(|err| anyhow::anyhow!("{err}"))
    }

    /// Writes the file to `path`.
    ///
    /// # Errors
    /// As [`BertFixture::to_bytes`]; I/O errors naming `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
    }
}
