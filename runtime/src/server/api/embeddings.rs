//! `POST /v1/embeddings` (OpenAI's shape) and `/embedding`, `/embeddings` (llama-server's
//! own), served with `--embedding` as llama-server serves them (`handle_embeddings_impl`,
//! `send_embedding`, `format_embeddings_response_oaicompat` in tools/server).
//!
//! - Without `--embedding`: 501 `not_supported_error`, "This server does not support
//!   embeddings. Start it with `--embeddings`". OpenAI's shape with `--pooling none`: 400.
//! - `input` (or `content`, which answers in llama-server's shape): a string, token ids, a
//!   list mixing strings and ids, `{"prompt_string": ...}`, `{"content": [{"type": "text",
//!   "text": ...}, ...]}`, or a list of those (one embedding each). Texts are tokenized with
//!   BOS/EOS as the model asks and special-token texts parsed.
//! - `encoding_format`: `float` (default) or `base64` (the f32 values' little-endian bytes).
//! - `embd_normalize` (default `--embd-normalize`, 2): applied to pooled embeddings only;
//!   with `--pooling none` every token's state is returned as it is, as llama-server does.
//! - OpenAI's shape: `{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
//!   "data": [{"embedding", "index", "object": "embedding"}]}`; llama-server's:
//!   `[{"index", "embedding": [[...], ...]}]` (a row per token with `none`, else one).
//!
//! The embeddings are computed on their own thread ([`run_worker`]) over a plan whose output
//! is the hidden state ([`crate::embed`]), beside the slots that generate.

use crate::embed::{normalize, Embedder, Pooling};
use crate::server::api::completion::mixed_list;
use crate::server::error::ApiError;
use crate::server::params::{wrong_type, Body};
use crate::server::{read_body, AppState};
use crate::tokenizer::{TokenId, Vocab};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot};

/// The server's embedding flags, with llama-server's names.
#[derive(clap::Args, Debug, Clone)]
pub struct EmbedArgs {
    /// Serve embeddings (`--embeddings`): `/v1/embeddings`, `/embedding`, computed on a
    /// thread of their own beside the generating slots.
    #[arg(long = "embedding", visible_alias = "embeddings")]
    pub embedding: bool,
    /// Serve reranking (`--rerank`): `/rerank`, `/v1/rerank`; implies `--embedding` and
    /// `--pooling rank` (a model with a classification head, as llama-server).
    #[arg(long = "reranking", visible_alias = "rerank")]
    pub reranking: bool,
    /// Pooling of the token states: none, mean, cls, last (default: the model's
    /// `{arch}.pooling_type`, else none).
    #[arg(long = "pooling", value_parser = Pooling::from_name)]
    pub pooling: Option<Pooling>,
    /// Normalisation of pooled embeddings: -1 none, 0 max absolute (int16 range), 1
    /// taxicab, 2 Euclidean, >2 p-norm.
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
}

impl Default for EmbedArgs {
    fn default() -> EmbedArgs {
        EmbedArgs {
            embedding: false,
            reranking: false,
            pooling: None,
            embd_normalize: 2,
        }
    }
}

/// One request's sequences for the embeddings thread, and where its rows go (per sequence
/// the embedder's rows, not normalised; an error as one line).
pub struct EmbedJob {
    /// The sequences.
    pub inputs: Vec<Vec<TokenId>>,
    /// The reply.
    pub reply: oneshot::Sender<Result<Vec<Vec<Vec<f32>>>, String>>,
}

/// What the handlers know of the embeddings thread (`--embedding`).
pub struct EmbedService {
    /// The queue to the thread.
    pub jobs: mpsc::UnboundedSender<EmbedJob>,
    /// What the loaded embedder is, once loaded.
    pub info: OnceLock<EmbedInfo>,
    /// `--embd-normalize`.
    pub embd_normalize: i32,
}

/// The loaded embedder's settings the handlers check requests against.
#[derive(Clone, Copy, Debug)]
pub struct EmbedInfo {
    /// The pooling it applies (`--pooling`, else the model's, else none).
    pub pooling: Pooling,
    /// Tokens one input may have (a slot's context).
    pub n_ctx: usize,
    /// Tokens of one ubatch (`-ub`): the most an input may have unless pooling is `last`.
    pub n_ubatch: usize,
}

/// Loads the embedding model on the embeddings thread and calls its argument with it (a
/// callback, because the embedder borrows the model file it opens).
pub type EmbedLoader =
    Box<dyn FnOnce(&mut dyn FnMut(Embedder<'_>)) -> anyhow::Result<()> + Send + 'static>;

/// Starts the embeddings thread: `load` runs on it, then [`run_worker`]; a load that fails
/// is sent to `failed` (the server then exits with it).
///
/// # Errors
/// A thread that cannot be started.
pub fn start(
    args: &EmbedArgs,
    load: EmbedLoader,
    failed: mpsc::UnboundedSender<anyhow::Error>,
) -> anyhow::Result<Arc<EmbedService>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<EmbedJob>();
    let svc = Arc::new(EmbedService {
        jobs: tx,
        info: OnceLock::new(),
        embd_normalize: args.embd_normalize,
    });
    let shared = svc.clone();
    std::thread::Builder::new()
        .name("embeddings".into())
        .spawn(move || {
            let mut on_loaded = |mut e: Embedder<'_>| {
                let _ = shared.info.set(EmbedInfo {
                    pooling: e.pooling(),
                    n_ctx: e.n_ctx(),
                    n_ubatch: e.n_ubatch(),
                });
                eprintln!(
                    "{}: embeddings ready (pooling {})",
                    crate::cli::prog(),
                    e.pooling().name()
                );
                run_worker(&mut e, &mut rx);
            };
            if let Err(e) = load(&mut on_loaded) {
                let _ = failed.send(e.context("loading the embedding model"));
            }
        })?;
    Ok(svc)
}

/// The embeddings thread's loop: computes each job's sequences in turn until every sender is
/// gone. A job whose client has gone is skipped.
pub fn run_worker(embedder: &mut Embedder<'_>, jobs: &mut mpsc::UnboundedReceiver<EmbedJob>) {
    while let Some(job) = jobs.blocking_recv() {
        if job.reply.is_closed() {
            continue;
        }
        let res = job
            .inputs
            .iter()
            .map(|t| embedder.embed(t))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(|e| format!("{e:#}"));
        let _ = job.reply.send(res);
    }
}

/// `POST /v1/embeddings`: OpenAI's shape (module doc).
pub async fn oai(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    handle(st, body, true).await
}

/// `POST /embedding`, `/embeddings`: llama-server's shape (module doc).
pub async fn llama(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    handle(st, body, false).await
}

async fn handle(
    st: AppState,
    body: Result<Bytes, BytesRejection>,
    mut oai: bool,
) -> Result<Json<Value>, ApiError> {
    let Some(svc) = st.embed.clone() else {
        return Err(ApiError::not_supported(
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    };
    let Some(&info) = svc.info.get() else {
        return Err(ApiError::unavailable("Loading model"));
    };
    let pooling = info.pooling;
    if oai && pooling == Pooling::None {
        return Err(ApiError::invalid(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    let ready = st.ready()?;
    let body = Body::parse(&read_body(body)?)?;
    let prompt = if let Some(p) = body.get("input") {
        p
    } else if let Some(c) = body.get("content") {
        oai = false;
        c
    } else {
        return Err(ApiError::invalid(
            "\"input\" or \"content\" must be provided",
        ));
    };
    let base64 = match body.get("encoding_format") {
        None => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(Value::String(f)) if f == "float" => false,
        Some(_) => {
            return Err(ApiError::invalid(
                "The format to return the embeddings in. Can be either float or base64",
            ))
        }
    };
    let inputs = sequences(&ready.vocab, prompt)?;
    if inputs.is_empty() {
        return Err(ApiError::invalid("\"input\" must not be empty"));
    }
    if inputs.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("Input content cannot be empty"));
    }
    // llama-server evaluates an input in one ubatch (`-ub`) unless its pooling is `last`
    // (then in pieces), and within a slot's context.
    let (n_ctx, n_ubatch) = (info.n_ctx, info.n_ubatch);
    for t in &inputs {
        let n = t.len();
        if pooling != Pooling::Last && n > n_ubatch {
            return Err(ApiError::server(format!(
                "input ({n} tokens) is too large to process. increase the physical batch size (current batch size: {n_ubatch})"
            )));
        }
        if n > n_ctx {
            return Err(ApiError::server(format!(
                "input ({n} tokens) is larger than the max context size ({n_ctx} tokens). skipping"
            )));
        }
    }
    let norm = match body.i64("embd_normalize")? {
        Some(n) => i32::try_from(n)
            .map_err(|_| ApiError::invalid(format!("\"embd_normalize\": {n} is out of range")))?,
        None => svc.embd_normalize,
    };
    let n_tokens: Vec<usize> = inputs.iter().map(Vec::len).collect();
    let (tx, rx) = oneshot::channel();
    svc.jobs
        .send(EmbedJob { inputs, reply: tx })
        .map_err(|_| ApiError::unavailable("the embeddings thread has stopped"))?;
    let rows = rx
        .await
        .map_err(|_| ApiError::server("the embeddings thread has stopped"))?
        .map_err(ApiError::server)?;
    // llama-server normalises pooled embeddings only.
    let rows: Vec<Vec<Vec<f32>>> = if pooling == Pooling::None {
        rows
    } else {
        rows.into_iter()
            .map(|r| r.iter().map(|e| normalize(e, norm)).collect())
            .collect()
    };
    let floats = |e: &[f32]| -> Value { e.iter().map(|&x| json!(f64::from(x))).collect() };
    if !oai {
        let out: Vec<Value> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let emb: Vec<Value> = r.iter().map(|e| floats(e)).collect();
                json!({ "index": i, "embedding": emb })
            })
            .collect();
        return Ok(Json(Value::Array(out)));
    }
    let data: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let e = r.first().map_or(&[][..], Vec::as_slice);
            if base64 {
                let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!({
                    "embedding": base64_encode(&bytes),
                    "index": i,
                    "object": "embedding",
                    "encoding_format": "base64",
                })
            } else {
                json!({ "embedding": floats(e), "index": i, "object": "embedding" })
            }
        })
        .collect();
    let total: usize = n_tokens.iter().sum();
    Ok(Json(openai_list(
        &body,
        &ready.model_name,
        total,
        "data",
        data,
    )))
}

/// An OpenAI list response (`/v1/embeddings`, `/v1/rerank`): the request's `model` (else
/// `model_name`), `object: "list"`, the usage of `n_tokens` prompt tokens, and `items` under
/// `field`.
pub(crate) fn openai_list(
    body: &Body,
    model_name: &str,
    n_tokens: usize,
    field: &str,
    items: Vec<Value>,
) -> Value {
    let model = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => model_name.to_string(),
    };
    let mut v = json!({
        "model": model,
        "object": "list",
        "usage": { "prompt_tokens": n_tokens, "total_tokens": n_tokens },
    });
    v[field] = Value::Array(items);
    v
}

/// The sequences of `input` (llama-server's `tokenize_input_prompts` with OpenAI's content
/// parts): a list without numbers is several inputs, anything else one.
fn sequences(vocab: &Vocab, input: &Value) -> Result<Vec<Vec<TokenId>>, ApiError> {
    match input {
        Value::Array(items) if !items.iter().any(Value::is_number) => {
            items.iter().map(|p| one(vocab, p)).collect()
        }
        _ => Ok(vec![one(vocab, input)?]),
    }
}

/// One input (see [`sequences`]).
fn one(vocab: &Vocab, p: &Value) -> Result<Vec<TokenId>, ApiError> {
    const EXPECTED: &str = "a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens";
    match p {
        Value::String(s) => Ok(vocab.tokenize(s, true, true)),
        Value::Array(items) => mixed_list(vocab, "input", items, (true, true), EXPECTED),
        Value::Object(o) if o.contains_key("content") => {
            let Some(Value::Array(parts)) = o.get("content") else {
                return Err(ApiError::invalid("\"content\" must be an array"));
            };
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(t @ ("image_url" | "input_audio" | "input_video")) => {
                        return Err(ApiError::invalid(format!(
                            "{t}: this model reads text only"
                        )))
                    }
                    Some(t) => {
                        return Err(ApiError::invalid(format!(
                            "unsupported content[].type: {t}"
                        )))
                    }
                    None => return Err(ApiError::invalid("content parts need a \"type\"")),
                }
            }
            Ok(vocab.tokenize(&text, true, true))
        }
        Value::Object(o) => match o.get("prompt_string") {
            Some(Value::String(s)) if !o.contains_key("multimodal_data") => {
                Ok(vocab.tokenize(s, true, true))
            }
            Some(Value::String(_)) => Err(ApiError::invalid(
                "Multimodal data provided, but model does not support multimodal requests.",
            )),
            Some(v) => Err(wrong_type("input.prompt_string", "a string", v)),
            None => Err(wrong_type("input", EXPECTED, p)),
        },
        other => Err(wrong_type("input", EXPECTED, other)),
    }
}

/// RFC 4648 base64 with padding (what llama-server's `base64::encode` writes).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = c.iter().fold(0u32, |n, &b| (n << 8) | u32::from(b)) << (8 * (3 - c.len()));
        for i in 0..4 {
            out.push(if i <= c.len() {
                ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char
            } else {
                '='
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_encode;

    #[test]
    fn base64_of_rfc4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(raw.as_bytes()), enc);
        }
    }
}
