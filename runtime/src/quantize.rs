//! `modelc quantize`: llama.cpp's `llama-quantize` without an importance matrix, writing the
//! same files byte for byte.
//!
//! Three steps, as `llama_model_quantize_impl` (llama.cpp `src/llama-quant.cpp`) takes them:
//!
//! 1. [`FileType::parse`]: the mix the user asked for (`Q4_K_M`, ...; llama-quantize's
//!    names, aliases and numbers) and its default tensor type.
//! 2. [`plan`]: the tensors in llama.cpp's order (by layer number, then name) and the type
//!    each one gets: only 2-D+ weights are quantized; the mixes give some tensors
//!    (`attn_v`, `ffn_down`, `attn_output`, `output`, tied `token_embd`) more bits by layer
//!    (`llama_tensor_get_type_impl`); a row length that does not fit the type's block falls
//!    back to a smaller block type (`tensor_type_fallback`).
//! 3. [`write`]: the metadata of the input with `general.quantization_version` and
//!    `general.file_type` moved to the end, the tensor infos, and each tensor's data
//!    (copied when its type does not change, else converted to f32 and quantized by
//!    [`ir::ggml::quantize_weights`] on several threads), 32-byte aligned, through the
//!    atomic [`GgufWriter`].

use anyhow::{bail, Context};
use ir::ggml::{dequantize, quantize_weights, GgmlType, WEIGHT_QUANT_TYPES};
use ir::gguf::{GgufError, GgufFile, GgufWriter, Metadata, TensorInfo, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// `GGML_QNT_VERSION`, written as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// The alignment llama-quantize writes with (`GGUF_DEFAULT_ALIGNMENT`), whatever the input's.
const ALIGNMENT: u64 = 32;

/// One quantization mix of llama-quantize (`llama_ftype`): its name, its
/// `general.file_type` number and the tensor type most weights get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileType {
    /// The name as llama-quantize prints it (`Q4_K_M`).
    pub name: &'static str,
    /// The `llama_ftype` number, written as `general.file_type`.
    pub id: u32,
    /// The default tensor type (`llama_ftype_get_default_type`).
    pub default_type: GgmlType,
}

/// What modelc does with each of llama-quantize's type names.
enum Support {
    /// Quantized here: `(llama_ftype, default tensor type)`.
    Yes(u32, GgmlType),
    /// Needs an importance matrix (`--imatrix`), which modelc does not read yet.
    NeedsImatrix,
    /// A format whose quantizer modelc does not have yet.
    NotYet,
}

/// llama-quantize's type names (`QUANT_OPTIONS` in tools/quantize/quantize.cpp), in its
/// order; `Q3_K`, `Q4_K`, `Q5_K` are its aliases of the `_M` mixes.
const FILE_TYPES: &[(&str, Support)] = {
    use GgmlType as T;
    use Support::*;
    &[
        ("Q1_0", NotYet),
        ("Q2_0", NotYet),
        ("Q4_0", Yes(2, T::Q4_0)),
        ("Q4_1", Yes(3, T::Q4_1)),
        ("MXFP4_MOE", Yes(38, T::MXFP4)),
        ("Q5_0", Yes(8, T::Q5_0)),
        ("Q5_1", Yes(9, T::Q5_1)),
        ("IQ2_XXS", NeedsImatrix),
        ("IQ2_XS", NeedsImatrix),
        ("IQ2_S", NeedsImatrix),
        ("IQ2_M", NeedsImatrix),
        ("IQ1_S", NeedsImatrix),
        ("IQ1_M", NeedsImatrix),
        ("TQ1_0", NotYet),
        ("TQ2_0", NotYet),
        ("Q2_K", Yes(10, T::Q2_K)),
        ("Q2_K_S", NeedsImatrix),
        ("IQ3_XXS", NeedsImatrix),
        ("IQ3_S", NotYet),
        ("IQ3_M", NotYet),
        ("Q3_K", Yes(12, T::Q3_K)),
        ("IQ3_XS", NotYet),
        ("Q3_K_S", Yes(11, T::Q3_K)),
        ("Q3_K_M", Yes(12, T::Q3_K)),
        ("Q3_K_L", Yes(13, T::Q3_K)),
        ("IQ4_NL", Yes(25, T::IQ4_NL)),
        ("IQ4_XS", Yes(30, T::IQ4_XS)),
        ("Q4_K", Yes(15, T::Q4_K)),
        ("Q4_K_S", Yes(14, T::Q4_K)),
        ("Q4_K_M", Yes(15, T::Q4_K)),
        ("Q5_K", Yes(17, T::Q5_K)),
        ("Q5_K_S", Yes(16, T::Q5_K)),
        ("Q5_K_M", Yes(17, T::Q5_K)),
        ("Q6_K", Yes(18, T::Q6_K)),
        ("Q8_0", Yes(7, T::Q8_0)),
        ("F16", Yes(1, T::F16)),
        ("BF16", Yes(32, T::BF16)),
        ("F32", Yes(0, T::F32)),
        ("COPY", NotYet),
    ]
};

impl FileType {
    /// The mix named `s` (case-insensitive), or given by its `llama_ftype` number (the first
    /// name with that number), as llama-quantize's `try_parse_ftype` reads it.
    ///
    /// # Errors
    /// An unknown name; a mix that needs an importance matrix; one modelc cannot make yet.
    pub fn parse(s: &str) -> anyhow::Result<FileType> {
        let by_name = FILE_TYPES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s));
        let by_id = || {
            let id: u32 = s.parse().ok()?;
            FILE_TYPES
                .iter()
                .find(|(_, sup)| matches!(sup, Support::Yes(i, _) if *i == id))
        };
        let Some((name, support)) = by_name.or_else(by_id) else {
            bail!(
                "unknown quantization type '{s}' (one of: {})",
                FILE_TYPES
                    .iter()
                    .filter(|(_, s)| matches!(s, Support::Yes(..)))
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        match *support {
            Support::Yes(id, default_type) => Ok(FileType {
                name,
                id,
                default_type,
            }),
            Support::NeedsImatrix => bail!(
                "{name} needs an importance matrix (llama-quantize --imatrix), which modelc quantize does not support yet"
            ),
            Support::NotYet => bail!("modelc quantize cannot make {name} files yet"),
        }
    }
}

/// What the user asked for besides the mix (llama-quantize's flags).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--allow-requantize`: convert tensors that are already quantized.
    pub allow_requantize: bool,
    /// `--leave-output-tensor`: keep `output.weight` as it is.
    pub leave_output_tensor: bool,
    /// `--pure`: every quantized tensor gets the default type (no mix rules).
    pub pure: bool,
    /// `--output-tensor-type`: the type of `output.weight`.
    pub output_tensor_type: Option<GgmlType>,
    /// `--token-embedding-type`: the type of `token_embd.weight`.
    pub token_embedding_type: Option<GgmlType>,
}

/// One tensor of the output file.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// Index of the tensor in the input's tensor table.
    pub index: usize,
    /// The tensor name.
    pub name: String,
    /// The shape (ggml `ne`, innermost first), with trailing 1s dropped as ggml writes it.
    pub ne: Vec<u64>,
    /// The type in the input.
    pub from: GgmlType,
    /// The type in the output.
    pub to: GgmlType,
    /// Bytes in the input.
    pub from_bytes: u64,
    /// Bytes in the output.
    pub to_bytes: u64,
}

/// The tensors of the output file in order, with their types.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The mix.
    pub ftype: FileType,
    /// Every tensor, in llama.cpp's order.
    pub tensors: Vec<TensorPlan>,
    /// How many tensors fell back to another type because of their row length.
    pub n_fallback: usize,
    /// Total values of all tensors (for bits per weight).
    pub n_elements: u64,
}

/// The tensor roles the mixes treat differently (`tensor_category` in llama-quant.cpp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Category {
    /// `tensor_get_category`: by name, first match wins.
    fn of(name: &str) -> Category {
        let has = |s: &str| name.contains(s);
        if name == "output.weight" {
            Category::Output
        } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            Category::TokenEmbd
        } else if has("attn_qkv.weight") {
            Category::AttnQkv
        } else if has("attn_kv_b.weight") {
            Category::AttnKvB
        } else if has("attn_v.weight") {
            Category::AttnV
        } else if has("attn_k.weight") {
            Category::AttnK
        } else if has("attn_q.weight") {
            Category::AttnQ
        } else if has("attn_output.weight") {
            Category::AttnOutput
        } else if has("ffn_up") {
            Category::FfnUp
        } else if has("ffn_gate") {
            Category::FfnGate
        } else if has("ffn_down") {
            Category::FfnDown
        } else {
            Category::Other
        }
    }

    /// `category_is_attn_v`: the value projections, which the mixes give more bits.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// The layer number of a `blk.N.` tensor name (`sscanf(name, "blk.%d.")`), or -1.
fn layer_of(name: &str) -> i64 {
    let Some(rest) = name.strip_prefix("blk.") else {
        return -1;
    };
    let end = rest
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].parse().unwrap_or(-1)
}

/// `ggml_n_dims`: the shape without trailing 1s (at least one dimension).
fn trimmed_shape(t: &TensorInfo) -> Vec<u64> {
    let ne = t.shape();
    let n = ne.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    ne[..n.min(ne.len()).max(1)].to_vec()
}

/// `tensor_allows_quantization`: 2-D and larger tensors named `*weight`, except norms,
/// `output.weight` with `--leave-output-tensor`, and the small tensors llama.cpp keeps as
/// they are (expert routers, position embeddings, convolutions, RWKV and vision extras).
fn allows_quantization(name: &str, n_dims: usize, arch: &str, opts: &Options) -> bool {
    if n_dims < 2 || !name.ends_with("weight") || name.contains("_norm.weight") {
        return false;
    }
    if opts.leave_output_tensor && name == "output.weight" {
        return false;
    }
    const KEEP: &[&str] = &[
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    const KEEP_GLM5_NEXT: &[&str] = &[
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_gate",
        "indexer_compressor_ape",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ];
    if name == "position_embd.weight" || name == "token_types.weight" {
        return false;
    }
    if KEEP.iter().any(|k| name.contains(k)) {
        return false;
    }
    !(arch == "glm5-next" && KEEP_GLM5_NEXT.iter().any(|k| name.contains(k)))
}

/// The hyperparameters the mixes look at (`llama_hparams` as llama.cpp loads them).
struct Hparams {
    arch: String,
    n_layer: i64,
    n_gqa: u32,
    n_expert: u32,
    /// llama.cpp's `LLM_TYPE_70B` (a llama with 80 layers and grouped-query attention).
    is_70b: bool,
}

impl Hparams {
    fn read(md: &Metadata) -> anyhow::Result<Hparams> {
        let arch = md
            .get("general.architecture")
            .and_then(Value::as_str)
            .context("not a model: no general.architecture")?
            .to_string();
        let first_u32 = |key: &str| -> Option<u32> {
            match md.get(key)? {
                Value::Array(a) => a.get(0).and_then(|v| v.as_u32()),
                v => v.as_u32(),
            }
        };
        let n_layer = first_u32(&format!("{arch}.block_count"))
            .with_context(|| format!("not a model: no {arch}.block_count"))?;
        let n_head = first_u32(&format!("{arch}.attention.head_count")).unwrap_or(0);
        let n_head_kv = first_u32(&format!("{arch}.attention.head_count_kv")).unwrap_or(n_head);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0);
        let n_expert = first_u32(&format!("{arch}.expert_count")).unwrap_or(0);
        Ok(Hparams {
            is_70b: arch == "llama" && n_layer == 80 && n_head != n_head_kv,
            arch,
            n_layer: i64::from(n_layer),
            n_gqa,
            n_expert,
        })
    }
}

/// The counters `llama_tensor_get_type_impl` keeps while it walks the tensors.
struct MixState<'a> {
    ftype: u32,
    hp: &'a Hparams,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
    n_fallback: usize,
}

/// `llama_ftype` numbers used by the rules.
mod ft {
    pub const Q2_K: u32 = 10;
    pub const Q3_K_S: u32 = 11;
    pub const Q3_K_M: u32 = 12;
    pub const Q3_K_L: u32 = 13;
    pub const Q4_K_S: u32 = 14;
    pub const Q4_K_M: u32 = 15;
    pub const Q5_K_M: u32 = 17;
    pub const IQ4_NL: u32 = 25;
    pub const IQ4_XS: u32 = 30;
    pub const MXFP4_MOE: u32 = 38;
}

impl MixState<'_> {
    /// `use_more_bits`: the first and last eighth of the layers, and every third between.
    fn use_more_bits(i: i64, n: i64) -> bool {
        i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
    }

    /// `layer_info`: `(layer, n_layer)` of a per-layer tensor: the running count, or for
    /// mixture-of-experts models the number in the name.
    fn layer_info(&self, counter: i64, name: &str) -> anyhow::Result<(i64, i64)> {
        let n = self.hp.n_layer;
        if self.hp.n_expert > 1 {
            let i = layer_of(name);
            if !name.starts_with("blk.") || i < 0 || i >= n {
                bail!("cannot determine the layer of tensor {name} (must be in [0, {n}))");
            }
            return Ok((i, n));
        }
        Ok((counter, n))
    }

    /// `llama_tensor_get_type_impl` for the mixes modelc supports: the type of a tensor of
    /// category `cat` and shape `ne` whose default is `t`.
    fn mix_type(
        &mut self,
        mut t: GgmlType,
        name: &str,
        ne: &[u64],
        cat: Category,
        opts: &Options,
    ) -> anyhow::Result<GgmlType> {
        use GgmlType as T;
        let ne0 = ne[0];
        let f = self.ftype;
        let falcon = self.hp.arch == "falcon";
        let (n_gqa, n_expert) = (self.hp.n_gqa, self.hp.n_expert);
        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            if let Some(o) = opts.output_tensor_type {
                t = o;
            } else if f == ft::MXFP4_MOE || falcon || !ne0.is_multiple_of(t.block_size() as u64) {
                t = T::Q8_0;
            } else if t != T::Q8_0 {
                t = T::Q6_K;
            }
        } else if f == ft::MXFP4_MOE {
            // Expert tensors (3-D, more than one expert; on bailingmoe3 only the FFN ones)
            // MXFP4, everything else Q8_0.
            let ffn = matches!(cat, Category::FfnUp | Category::FfnGate | Category::FfnDown);
            let experts = ne.get(2).is_some_and(|&n| n > 1);
            t = if experts && (self.hp.arch != "bailingmoe3" || ffn) {
                T::MXFP4
            } else {
                T::Q8_0
            };
        } else if cat == Category::TokenEmbd {
            if let Some(e) = opts.token_embedding_type {
                t = e;
            }
        } else if cat.is_attn_v() {
            let wv = self.i_attention_wv;
            if f == ft::Q2_K {
                t = if n_gqa >= 4 { T::Q4_K } else { T::Q3_K };
            } else if f == ft::Q3_K_M {
                t = if wv < 2 { T::Q5_K } else { T::Q4_K };
            } else if f == ft::Q3_K_L || ((f == ft::IQ4_NL || f == ft::IQ4_XS) && n_gqa >= 4) {
                t = T::Q5_K;
            } else if (f == ft::Q4_K_M || f == ft::Q5_K_M)
                && Self::use_more_bits(wv, self.n_attention_wv)
            {
                t = T::Q6_K;
            } else if f == ft::Q4_K_S && wv < 4 {
                t = T::Q5_K;
            }
            if self.hp.is_70b && (t == T::Q3_K || t == T::Q4_K) {
                t = T::Q5_K;
            }
            if n_expert == 8 {
                t = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if n_expert == 8 {
                t = T::Q8_0;
            }
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, name)?;
            let more = Self::use_more_bits(i, n);
            if f == ft::Q2_K {
                t = T::Q3_K;
            } else if f == ft::Q3_K_M {
                t = if i < n / 16 {
                    T::Q5_K
                } else if !falcon || more {
                    T::Q4_K
                } else {
                    T::Q3_K
                };
            } else if f == ft::Q3_K_L {
                t = if falcon { T::Q4_K } else { T::Q5_K };
            } else if f == ft::Q4_K_M {
                if falcon {
                    t = if i < n / 16 {
                        T::Q6_K
                    } else if more {
                        T::Q5_K
                    } else {
                        T::Q4_K
                    };
                } else if more {
                    t = T::Q6_K;
                }
            } else if i < n / 8 && (f == ft::IQ4_NL || f == ft::IQ4_XS) {
                t = T::Q5_K;
            } else if f == ft::Q5_K_M && more {
                t = T::Q6_K;
            } else if f == ft::Q4_K_S && !falcon && i < n / 8 {
                t = T::Q5_K;
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !falcon {
                if n_expert == 8 {
                    if matches!(
                        f,
                        ft::Q2_K
                            | ft::Q3_K_S
                            | ft::Q3_K_M
                            | ft::IQ4_NL
                            | ft::Q4_K_S
                            | ft::Q4_K_M
                            | ft::IQ4_XS
                    ) {
                        t = T::Q5_K;
                    }
                } else if f == ft::Q2_K {
                    t = T::Q3_K;
                } else if f == ft::Q3_K_M {
                    t = T::Q4_K;
                } else if f == ft::Q3_K_L {
                    t = T::Q5_K;
                }
            } else if f == ft::Q3_K_L {
                t = T::Q4_K;
            }
        } else if cat == Category::FfnGate {
            self.layer_info(self.i_ffn_gate, name)?;
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.layer_info(self.i_ffn_up, name)?;
            self.i_ffn_up += 1;
        }
        Ok(t)
    }

    /// `tensor_type_fallback`: a type whose block does not divide the row length `ne0`
    /// becomes a 32-value type of about the same size, or F16 if even that does not fit.
    fn fallback(&mut self, t: GgmlType, ne0: u64) -> anyhow::Result<GgmlType> {
        use GgmlType as T;
        if ne0.is_multiple_of(t.block_size() as u64) {
            return Ok(t);
        }
        self.n_fallback += 1;
        let r = match t {
            T::IQ1_S
            | T::IQ1_M
            | T::IQ2_XXS
            | T::IQ2_XS
            | T::IQ2_S
            | T::IQ3_XXS
            | T::IQ3_S
            | T::IQ4_XS => T::IQ4_NL,
            T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
            T::Q4_K => T::Q5_0,
            T::Q5_K => T::Q5_1,
            T::Q6_K => T::Q8_0,
            t if t.block_size() <= 32 => t,
            t => bail!("no tensor type fallback is defined for type {t}"),
        };
        Ok(if !ne0.is_multiple_of(r.block_size() as u64) {
            T::F16
        } else {
            r
        })
    }
}

/// The output tensors and their types for quantizing `file` to `ftype` with `opts`, as
/// llama-quantize's preliminary pass chooses them (`llama_tensor_get_type`).
///
/// # Errors
/// The input is not a model (no `general.architecture` / block count); a tensor would need a
/// type modelc cannot quantize to (a `--output-tensor-type` such as IQ2_XXS) or a quantized
/// tensor would be requantized without `--allow-requantize`; a tensor's data is not readable
/// as its type.
pub fn plan(file: &GgufFile, ftype: FileType, opts: &Options) -> anyhow::Result<Plan> {
    plan_tensors(file.metadata(), file.tensors(), ftype, opts)
}

/// [`plan`] for a model given by its metadata and tensor table only (the tensors' data may
/// not exist yet: `modelc synth` plans a file whose values it draws as it writes).
///
/// # Errors
/// As [`plan`].
pub fn plan_tensors(
    metadata: &Metadata,
    tensors: &[TensorInfo],
    ftype: FileType,
    opts: &Options,
) -> anyhow::Result<Plan> {
    let hp = Hparams::read(metadata)?;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&tensors[a].name, &tensors[b].name);
        layer_of(a).cmp(&layer_of(b)).then_with(|| a.cmp(b))
    });
    let mut st = MixState {
        ftype: ftype.id,
        hp: &hp,
        n_attention_wv: tensors
            .iter()
            .filter(|t| Category::of(&t.name).is_attn_v())
            .count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        has_tied_embeddings: !tensors.iter().any(|t| t.name == "output.weight"),
        n_fallback: 0,
    };
    let mut out = Vec::with_capacity(order.len());
    for i in order {
        let t = &tensors[i];
        let ne = trimmed_shape(t);
        let cat = Category::of(&t.name);
        let to = if !allows_quantization(&t.name, ne.len(), &hp.arch, opts) {
            t.ggml_type
        } else if let (Some(e), Category::TokenEmbd) = (opts.token_embedding_type, cat) {
            e
        } else if let (Some(o), Category::Output) = (opts.output_tensor_type, cat) {
            o
        } else if ftype.default_type.is_quantized() {
            let mut to = ftype.default_type;
            if !opts.pure {
                to = st.mix_type(to, &t.name, &ne, cat, opts)?;
            }
            st.fallback(to, ne[0])?
        } else {
            ftype.default_type
        };
        if to != t.ggml_type {
            if !WEIGHT_QUANT_TYPES.contains(&to) {
                bail!("{}: modelc quantize cannot make {to} tensors yet", t.name);
            }
            if t.ggml_type.is_quantized() && !opts.allow_requantize {
                bail!(
                    "{}: requantizing from type {} is disabled (use --allow-requantize)",
                    t.name,
                    t.ggml_type
                );
            }
            if ir::ggml::block_format(t.ggml_type).is_none() {
                bail!("{}: cannot convert tensors of type {}", t.name, t.ggml_type);
            }
        }
        let rows: u64 = ne.iter().skip(1).product();
        let to_bytes = to
            .row_size(ne[0])
            .and_then(|r| r.checked_mul(rows))
            .with_context(|| format!("{}: {:?} does not fit {to}", t.name, ne))?;
        out.push(TensorPlan {
            index: i,
            name: t.name.clone(),
            ne,
            from: t.ggml_type,
            to,
            from_bytes: t.n_bytes,
            to_bytes,
        });
    }
    Ok(Plan {
        ftype,
        n_fallback: st.n_fallback,
        n_elements: tensors.iter().map(|t| t.n_elements()).sum(),
        tensors: out,
    })
}

/// The metadata and tensor table of the output file (no data yet): the input's keys in
/// order without `general.quantization_version`, `general.file_type` and the `split.*`
/// keys, then those two set anew (ggml's `gguf_set_val_*` moves a key to the end).
pub fn output_header(metadata: &Metadata, plan: &Plan) -> anyhow::Result<GgufWriter> {
    const REPLACED: &[&str] = &[
        "general.quantization_version",
        "general.file_type",
        "split.no",
        "split.count",
        "split.tensors.count",
    ];
    let mut w = GgufWriter::new();
    for (k, v) in metadata.iter() {
        if !REPLACED.contains(&k) {
            w.add_kv(k, v.clone());
        }
    }
    w.add_kv(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    w.add_kv("general.file_type", Value::U32(plan.ftype.id));
    w.set_alignment(ALIGNMENT);
    for t in &plan.tensors {
        w.add_tensor_info(&t.name, &t.ne, t.to)?;
    }
    Ok(w)
}

/// Progress of [`write`]: tensor `i` of `n` is done.
pub struct Progress<'a> {
    /// Index of the tensor just written (0-based).
    pub i: usize,
    /// Number of tensors.
    pub n: usize,
    /// The tensor.
    pub tensor: &'a TensorPlan,
}

/// Rows of f32 handed to one thread at a time (about llama.cpp's chunk of 16384 values).
const CHUNK_VALUES: u64 = 32 * 512;

/// Where the values of the tensors [`write_from`] writes come from: a GGUF file being
/// quantized, or `modelc synth`'s random numbers.
pub trait Source: Sync {
    /// The bytes of `t` exactly as the output holds them, when the source has them already
    /// (a tensor whose type does not change); `None` to convert it from [`Source::rows`].
    fn unchanged(&self, t: &TensorPlan) -> Option<Vec<u8>>;

    /// Writes the values of tensor `t` from row `row0` on into `out` (whole rows of
    /// `t.ne[0]` values, as f32).
    ///
    /// # Errors
    /// A message naming what could not be read (the tensor is named by the caller).
    fn rows(&self, t: &TensorPlan, row0: usize, out: &mut [f32]) -> Result<(), String>;
}

/// A GGUF file's tensors: copied when their type does not change, else dequantized
/// ([`dequantize`]; F32 read as little-endian).
impl Source for GgufFile {
    fn unchanged(&self, t: &TensorPlan) -> Option<Vec<u8>> {
        (t.from == t.to).then(|| self.tensor_data(&self.tensors()[t.index]).to_vec())
    }

    fn rows(&self, t: &TensorPlan, row0: usize, out: &mut [f32]) -> Result<(), String> {
        let src = self.tensor_data(&self.tensors()[t.index]);
        let n_per_row = t.ne[0] as usize;
        let src_row = t.from.row_size(t.ne[0]).ok_or("bad row")? as usize;
        let n_rows = out.len() / n_per_row.max(1);
        let s = src
            .get(row0 * src_row..(row0 + n_rows) * src_row)
            .ok_or("rows past the end of the data")?;
        if t.from == GgmlType::F32 {
            for (o, b) in out.iter_mut().zip(s.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        } else {
            dequantize(t.from, s, out).map_err(|e| e.to_string())
        }
    }
}

/// The bytes of `t` in the output: what [`Source::unchanged`] gives, else the values of
/// [`Source::rows`] quantized ([`quantize_weights`]) in chunks of rows on `n_threads`
/// threads (the result does not depend on the split). Stops early with an error when
/// `cancel` is set.
fn tensor_data(
    source: &dyn Source,
    t: &TensorPlan,
    n_threads: usize,
    cancel: &AtomicBool,
) -> Result<Vec<u8>, GgufError> {
    if let Some(bytes) = source.unchanged(t) {
        return Ok(bytes);
    }
    let fail = |e: String| GgufError::Write(format!("tensor '{}': {e}", t.name));
    let n_per_row = t.ne[0];
    if n_per_row == 0 || t.to_bytes == 0 {
        return Ok(Vec::new());
    }
    let dst_row =
        t.to.row_size(n_per_row)
            .ok_or_else(|| fail("bad row".into()))? as usize;
    let rows_per_chunk = CHUNK_VALUES.div_ceil(n_per_row).max(1) as usize;
    let mut dst = vec![0u8; t.to_bytes as usize];
    let n_chunks = dst.len().div_ceil(dst_row * rows_per_chunk);
    let jobs = Mutex::new(dst.chunks_mut(dst_row * rows_per_chunk).enumerate());
    let error: Mutex<Option<String>> = Mutex::new(None);
    let work = || {
        let mut f32s = Vec::new();
        loop {
            if cancel.load(Ordering::Relaxed) {
                return;
            }
            let Some((chunk, d)) = jobs.lock().ok().and_then(|mut j| j.next()) else {
                return;
            };
            f32s.resize(d.len() / dst_row * n_per_row as usize, 0.0);
            let r = source
                .rows(t, chunk * rows_per_chunk, &mut f32s)
                .and_then(|()| quantize_weights(t.to, &f32s, d).map_err(|e| e.to_string()));
            if let Err(e) = r {
                if let Ok(mut slot) = error.lock() {
                    slot.get_or_insert(e);
                }
                return;
            }
        }
    };
    // No more threads than chunks of work (a huge NTHREADS must not start threads that
    // have nothing to do: llama-quantize's chunking bounds them the same way).
    let n_threads = n_threads.clamp(1, n_chunks.max(1));
    std::thread::scope(|s| {
        for _ in 1..n_threads {
            s.spawn(work);
        }
        work();
    });
    if let Some(e) = error.into_inner().ok().flatten() {
        return Err(fail(e));
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(GgufError::Write("interrupted".into()));
    }
    validate(t, &dst).map_err(fail)?;
    Ok(dst)
}

/// `ggml_validate_row_data` for the output: no NaN or infinite f16/f32 scale or value.
fn validate(t: &TensorPlan, data: &[u8]) -> Result<(), String> {
    let Some(format) = ir::ggml::block_format(t.to) else {
        return Ok(());
    };
    use ir::ggml::FieldKind;
    for f in format.fields {
        let kind = match f.kind {
            FieldKind::Scale(k)
            | FieldKind::Min(k)
            | FieldKind::MinScale(k)
            | FieldKind::Value(k) => k,
            _ => continue,
        };
        for (i, b) in data.chunks_exact(t.to.type_size()).enumerate() {
            let v = kind.read(&b[f.offset..f.offset + kind.size()]);
            if !v.is_finite() {
                return Err(format!("non-finite value in field {} of block {i}", f.name));
            }
        }
    }
    Ok(())
}

/// Writes the quantized model to `out` (atomically: `OUT.tmp`, then renamed), calling
/// `progress` after each tensor. `n_threads` threads quantize each tensor; setting `cancel`
/// (from a Ctrl-C handler) stops at the next chunk and removes the partial file.
///
/// # Errors
/// I/O errors naming `out`; data that does not convert; "interrupted" after `cancel`.
pub fn write(
    file: &GgufFile,
    plan: &Plan,
    out: &Path,
    n_threads: usize,
    cancel: &AtomicBool,
    progress: impl FnMut(Progress<'_>),
) -> anyhow::Result<()> {
    write_from(
        file.metadata(),
        file,
        plan,
        out,
        n_threads,
        cancel,
        progress,
    )
}

/// [`write`] with the metadata of the output ([`output_header`] adds the file type) and the
/// tensors' values taken from `source`: one tensor at a time is in memory.
///
/// # Errors
/// As [`write`]; what `source` reports, naming the tensor.
pub fn write_from(
    metadata: &Metadata,
    source: &dyn Source,
    plan: &Plan,
    out: &Path,
    n_threads: usize,
    cancel: &AtomicBool,
    mut progress: impl FnMut(Progress<'_>),
) -> anyhow::Result<()> {
    let header = output_header(metadata, plan)?;
    let n = plan.tensors.len();
    header.write_streaming(out, |i| {
        if cancel.load(Ordering::Relaxed) {
            return Err(GgufError::Write("interrupted".into()));
        }
        let t = &plan.tensors[i];
        let data = tensor_data(source, t, n_threads, cancel)?;
        progress(Progress { i, n, tensor: t });
        Ok(data)
    })?;
    Ok(())
}

/// The number of threads llama-quantize uses by default (`std::thread::hardware_concurrency`).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_type_names_aliases_and_numbers() {
        let t = FileType::parse("q4_k_m").unwrap();
        assert_eq!(
            (t.name, t.id, t.default_type),
            ("Q4_K_M", 15, GgmlType::Q4_K)
        );
        assert_eq!(FileType::parse("Q4_K").unwrap().id, 15);
        assert_eq!(FileType::parse("12").unwrap().name, "Q3_K");
        assert_eq!(FileType::parse("7").unwrap().name, "Q8_0");
        assert_eq!(FileType::parse("F32").unwrap().id, 0);
        assert!(FileType::parse("Q9_9").is_err());
        let e = FileType::parse("IQ2_XXS").unwrap_err().to_string();
        assert!(e.contains("importance matrix"), "{e}");
    }

    /// `MXFP4_MOE`: expert tensors (3-D, more than one expert) MXFP4, the other weights and
    /// the output Q8_0, norms unchanged; `--pure` makes every weight MXFP4. (The dense case
    /// was compared byte for byte with llama-quantize's files of llama-sep-F32 and SmolLM2.)
    #[test]
    fn mxfp4_moe_mix() {
        let mut md = Metadata::default();
        md.push("general.architecture".into(), Value::String("llama".into()));
        md.push("llama.block_count".into(), Value::U32(1));
        md.push("llama.expert_count".into(), Value::U32(4));
        let info = |name: &str, ne: [u64; 4]| TensorInfo {
            name: name.into(),
            n_dims: ne.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1) as u32,
            ne,
            ggml_type: GgmlType::F32,
            offset: 0,
            n_bytes: ne.iter().product::<u64>() * 4,
            shard: 0,
        };
        let tensors = [
            info("token_embd.weight", [64, 100, 1, 1]),
            info("output.weight", [64, 100, 1, 1]),
            info("blk.0.attn_norm.weight", [64, 1, 1, 1]),
            info("blk.0.attn_q.weight", [64, 64, 1, 1]),
            info("blk.0.ffn_gate_inp.weight", [64, 4, 1, 1]),
            info("blk.0.ffn_up_exps.weight", [64, 128, 4, 1]),
            info("blk.0.ffn_down_exps.weight", [128, 64, 4, 1]),
        ];
        let ftype = FileType::parse("MXFP4_MOE").unwrap();
        assert_eq!((ftype.id, ftype.default_type), (38, GgmlType::MXFP4));
        let types = |opts: &Options| -> Vec<(String, GgmlType)> {
            plan_tensors(&md, &tensors, ftype, opts)
                .unwrap()
                .tensors
                .into_iter()
                .map(|t| (t.name, t.to))
                .collect()
        };
        let mix = types(&Options::default());
        let want = |name: &str, t: GgmlType| assert!(mix.contains(&(name.into(), t)), "{mix:?}");
        use GgmlType as T;
        want("token_embd.weight", T::Q8_0);
        want("output.weight", T::Q8_0);
        want("blk.0.attn_norm.weight", T::F32);
        want("blk.0.attn_q.weight", T::Q8_0);
        want("blk.0.ffn_gate_inp.weight", T::F32);
        want("blk.0.ffn_up_exps.weight", T::MXFP4);
        want("blk.0.ffn_down_exps.weight", T::MXFP4);
        let pure = types(&Options {
            pure: true,
            ..Options::default()
        });
        assert!(
            pure.contains(&("blk.0.attn_q.weight".into(), T::MXFP4)),
            "{pure:?}"
        );
        assert!(
            pure.contains(&("output.weight".into(), T::MXFP4)),
            "{pure:?}"
        );
    }

    #[test]
    fn layer_numbers_and_categories() {
        assert_eq!(layer_of("blk.12.attn_v.weight"), 12);
        assert_eq!(layer_of("token_embd.weight"), -1);
        assert_eq!(layer_of("blk.x.attn_v.weight"), -1);
        assert_eq!(Category::of("blk.0.attn_qkv.weight"), Category::AttnQkv);
        assert_eq!(Category::of("blk.0.ffn_down.weight"), Category::FfnDown);
        assert_eq!(Category::of("output.weight"), Category::Output);
        assert!(MixState::use_more_bits(0, 30));
        assert!(!MixState::use_more_bits(4, 30));
        assert!(MixState::use_more_bits(5, 30));
    }
}
