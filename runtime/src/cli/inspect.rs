//! `modelc inspect MODEL.gguf [--json] [--metadata]`: what llama.cpp's start-up log tells about
//! a model, from the header alone (llama.cpp `llama-model-loader.cpp` and `llama-model.cpp`
//! `print_info`): architecture, file type, size, bits per weight, parameter count, the
//! hyperparameters as llama.cpp derives them, the tokenizer, the type mix and the tensor table.
//! Works on any valid GGUF, including vocab-only files and files without an architecture.

use anyhow::Context;
use ir::gguf::{Array, GgufFile, Value};
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `modelc inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The GGUF model (the first shard of a split model).
    pub model: PathBuf,
    /// Print everything as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Dump every metadata key (long arrays abbreviated).
    #[arg(long)]
    pub metadata: bool,
}

/// Name of a `general.file_type` value (llama.cpp `llama_model_ftype_name`).
pub fn file_type_name(ftype: u32) -> &'static str {
    match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        _ => "unknown, may not work",
    }
}

/// A metadata value as llama.cpp's `gguf_kv_to_str` prints it: arrays longer than
/// `max_items` are cut with `…`, strings quoted inside arrays.
pub fn value_to_string(v: &Value, max_items: usize) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => {
            let n = a.len();
            let items: Vec<String> = (0..n.min(max_items))
                .filter_map(|i| a.get(i))
                .map(|x| match x {
                    Value::String(s) => format!("{s:?}"),
                    other => value_to_string(&other, max_items),
                })
                .collect();
            let more = if n > max_items { ", …" } else { "" };
            format!(
                "arr[{},{n}] = [{}{more}]",
                a.elem_type().name(),
                items.join(", ")
            )
        }
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        Value::Bool(b) => format!("{b}"),
        other => other.as_int().map(|i| i.to_string()).unwrap_or_default(),
    }
}

fn token_text(file: &GgufFile, id: Option<u32>) -> Json {
    let Some(id) = id else { return Json::Null };
    let text = file
        .metadata()
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(Array::as_strs)
        .and_then(|t| t.get(id as usize))
        .cloned();
    json!({ "id": id, "text": text })
}

/// Everything `inspect` reports, as one JSON object (the `--json` output).
pub fn describe(file: &GgufFile, path: &std::path::Path) -> anyhow::Result<Json> {
    let md = file.metadata();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let data_bytes = file.tensor_data_bytes();
    let ftype = md.get_u32("general.file_type")?;
    let mut out = Map::new();
    out.insert("file".into(), json!(path.display().to_string()));
    out.insert("gguf_version".into(), json!(file.version()));
    out.insert("n_shards".into(), json!(file.n_shards()));
    out.insert("alignment".into(), json!(file.alignment()));
    out.insert("n_kv".into(), json!(md.len()));
    out.insert("n_tensors".into(), json!(file.tensors().len()));
    out.insert("architecture".into(), json!(file.architecture()));
    out.insert(
        "name".into(),
        json!(md.get_str("general.name").ok().flatten()),
    );
    out.insert(
        "file_type".into(),
        json!(ftype.map(|f| json!({ "id": f, "name": file_type_name(f) }))),
    );
    out.insert("file_size_bytes".into(), json!(file.file_size()));
    out.insert("tensor_data_bytes".into(), json!(data_bytes));
    out.insert("n_params".into(), json!(n_params));
    let bpw = if n_params > 0 {
        data_bytes as f64 * 8.0 / n_params as f64
    } else {
        0.0
    };
    out.insert("bits_per_weight".into(), json!(bpw));
    out.insert("hparams".into(), hparams_json(file));
    out.insert("tokenizer".into(), tokenizer_json(file)?);
    let template = md.get_str("tokenizer.chat_template").ok().flatten();
    let named: Vec<&str> = md
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("tokenizer.chat_template."))
        .collect();
    out.insert(
        "chat_template".into(),
        json!({ "present": template.is_some(), "bytes": template.map(str::len), "named": named }),
    );
    let mut mix: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = mix.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        e.2 += t.n_elements();
    }
    out.insert(
        "type_mix".into(),
        Json::Object(
            mix.iter()
                .map(|(k, (n, b, p))| {
                    (
                        k.to_string(),
                        json!({ "tensors": n, "bytes": b, "params": p }),
                    )
                })
                .collect(),
        ),
    );
    out.insert(
        "tensors".into(),
        Json::Array(
            file.tensors()
                .iter()
                .map(|t| json!({ "name": t.name, "type": t.ggml_type.name(), "ne": t.shape(), "bytes": t.n_bytes, "offset": t.offset, "shard": t.shard }))
                .collect(),
        ),
    );
    Ok(Json::Object(out))
}

fn tokenizer_json(file: &GgufFile) -> anyhow::Result<Json> {
    let md = file.metadata();
    let model = md.get_str("tokenizer.ggml.model")?;
    let n_vocab = md.get_array("tokenizer.ggml.tokens")?.map(Array::len);
    let id = |k: &str| md.get_u32(&format!("tokenizer.ggml.{k}"));
    Ok(json!({
        "model": model,
        "pre": md.get_str("tokenizer.ggml.pre")?,
        "n_vocab": n_vocab,
        "n_merges": md.get_array("tokenizer.ggml.merges")?.map(Array::len),
        "bos": token_text(file, id("bos_token_id")?),
        "eos": token_text(file, id("eos_token_id")?),
        "eot": token_text(file, id("eot_token_id")?),
        "unk": token_text(file, id("unknown_token_id")?),
        "pad": token_text(file, id("padding_token_id")?),
        "add_bos": md.get_bool("tokenizer.ggml.add_bos_token")?,
        "add_eos": md.get_bool("tokenizer.ggml.add_eos_token")?,
        "add_space_prefix": md.get_bool("tokenizer.ggml.add_space_prefix")?,
    }))
}

/// `s` with line breaks and other control characters escaped, so it prints on one line.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn fmt_json(v: &Json) -> String {
    match v {
        Json::Null => "-".into(),
        Json::String(s) => s.clone(),
        Json::Object(o) if o.contains_key("id") && o.contains_key("text") => {
            format!("{} {}", o["id"], one_line(&fmt_json(&o["text"])))
        }
        other => other.to_string(),
    }
}

fn print_text(d: &Json, file: &GgufFile, metadata: bool) {
    let s = |k: &str| fmt_json(&d[k]);
    println!("file            = {}", s("file"));
    println!(
        "format          = GGUF V{} ({} tensors, {} metadata keys, alignment {}, {} shard(s))",
        d["gguf_version"], d["n_tensors"], d["n_kv"], d["alignment"], d["n_shards"]
    );
    println!("arch            = {}", s("architecture"));
    println!("general.name    = {}", s("name"));
    let ft = &d["file_type"];
    if ft.is_object() {
        println!("file type       = {} ({})", fmt_json(&ft["name"]), ft["id"]);
    }
    let size = d["file_size_bytes"].as_u64().unwrap_or(0);
    let data = d["tensor_data_bytes"].as_u64().unwrap_or(0);
    println!(
        "file size       = {:.2} MiB ({size} bytes)",
        size as f64 / 1048576.0
    );
    let bpw = d["bits_per_weight"].as_f64().unwrap_or(0.0);
    println!(
        "tensor data     = {:.2} MiB ({bpw:.2} BPW)",
        data as f64 / 1048576.0
    );
    let n_params = d["n_params"].as_u64().unwrap_or(0);
    println!(
        "model params    = {:.2} M ({n_params})",
        n_params as f64 / 1e6
    );
    if let Json::Object(h) = &d["hparams"] {
        for (k, v) in h {
            println!("{k:<15} = {}", fmt_json(v));
        }
    }
    if let Json::Object(t) = &d["tokenizer"] {
        for (k, v) in t {
            println!("{:<15} = {}", format!("vocab {k}"), fmt_json(v));
        }
    }
    let ct = &d["chat_template"];
    println!(
        "chat template   = {}",
        if ct["present"] == true {
            format!("present ({} bytes)", ct["bytes"])
        } else {
            "none".into()
        }
    );
    if let Some(named) = ct["named"].as_array().filter(|a| !a.is_empty()) {
        println!(
            "named templates = {}",
            named.iter().map(fmt_json).collect::<Vec<_>>().join(", ")
        );
    }
    if let Json::Object(mix) = &d["type_mix"] {
        for (k, v) in mix {
            println!(
                "type {k:<10} = {} tensors, {} bytes",
                v["tensors"], v["bytes"]
            );
        }
    }
    if metadata {
        println!("\nmetadata:");
        for (i, (k, v)) in file.metadata().iter().enumerate() {
            let ty = match v {
                Value::Array(_) => "arr".to_string(),
                v => v.value_type().name().to_string(),
            };
            println!(
                "{i:5}: {ty:<4} {k:<45} = {}",
                one_line(&value_to_string(v, 8))
            );
        }
    }
    println!("\ntensors:");
    println!("{:<40} {:<8} {:<26} {:>12}", "name", "type", "ne", "bytes");
    for t in file.tensors() {
        println!(
            "{:<40} {:<8} {:<26} {:>12}",
            t.name,
            t.ggml_type,
            format!("{:?}", t.shape()),
            t.n_bytes
        );
    }
}

/// The hyperparameters as llama.cpp derives them (`compiler::HParams`, llama.cpp's
/// `print_info` names), plus the derived `n_gqa` and `n_embd_k_gqa`; or, for a file whose
/// architecture modelc cannot read (vocab-only files included), why not.
fn hparams_json(file: &GgufFile) -> Json {
    let h = match compiler::HParams::from_gguf(file) {
        Ok(h) => h,
        Err(e) => return json!({ "unavailable": e.to_string() }),
    };
    let gqa = if h.n_head_kv > 0 {
        h.n_head / h.n_head_kv
    } else {
        0
    };
    json!({
        "n_ctx_train": h.n_ctx_train,
        "n_embd": h.n_embd,
        "n_layer": h.n_layer,
        "n_head": h.n_head,
        "n_head_kv": h.n_head_kv,
        "n_rot": h.n_rot,
        "n_swa": h.n_swa,
        "n_embd_head_k": h.n_embd_head_k,
        "n_embd_head_v": h.n_embd_head_v,
        "n_gqa": gqa,
        "n_embd_k_gqa": h.n_embd_head_k * h.n_head_kv,
        "n_embd_v_gqa": h.n_embd_head_v * h.n_head_kv,
        "f_norm_rms_eps": h.f_norm_rms_eps,
        "n_ff": h.n_ff,
        "n_vocab": h.n_vocab,
        "rope_type": format!("{:?}", h.rope_type).to_lowercase(),
        "freq_base_train": h.rope_freq_base,
        "freq_scale_train": h.rope_freq_scale,
        "rope_scaling": format!("{:?}", h.rope_scaling_type).to_lowercase(),
        "f_attn_logit_softcapping": h.f_attn_logit_softcapping,
        "f_final_logit_softcapping": h.f_final_logit_softcapping,
        "tied_output": h.tied_output,
    })
}

/// Runs `modelc inspect`.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.model)?;
    let d = describe(&file, &args.model).with_context(|| format!("{}", args.model.display()))?;
    if args.json {
        let mut d = d;
        if args.metadata {
            let md: Map<String, Json> = file
                .metadata()
                .iter()
                .map(|(k, v)| (k.to_string(), json!(value_to_string(v, 8))))
                .collect();
            d["metadata"] = Json::Object(md);
        }
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print_text(&d, &file, args.metadata);
    }
    Ok(())
}
