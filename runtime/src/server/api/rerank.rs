//! `POST /rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`): relevance scores of
//! documents for a query, served with `--reranking` as llama-server serves them
//! (`post_rerank`, `format_prompt_rerank`, `format_response_rerank` in tools/server).
//!
//! - Without `--reranking`: 501 "This server does not support reranking. Start it with
//!   `--reranking`".
//! - Body: `query` (a string, required), `documents` (Jina's form) or `texts` (TEI's form): a
//!   non-empty list of strings; `top_n` (default: all); `return_text` (TEI's form only).
//! - Each document becomes one sequence: BOS if the vocabulary adds one, the query, EOS (SEP
//!   when there is no EOS) if it adds EOS, SEP if it adds SEP, the document, EOS if it adds
//!   EOS (a model's `rerank` prompt template is not applied yet). Its score is the first
//!   value of the classification head's output ([`crate::embed::ClsHead`]), unnormalised.
//! - Answer, sorted by score (highest first) and cut to `top_n`: Jina's
//!   `{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"}, "results":
//!   [{"index", "relevance_score"}]}`, or TEI's bare list `[{"index", "score"[, "text"]}]`.

use crate::embed::Pooling;
use crate::server::api::embeddings::{openai_list, EmbedJob};
use crate::server::error::ApiError;
use crate::server::params::Body;
use crate::server::{read_body, AppState};
use crate::tokenizer::{TokenId, Vocab};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The tokens of one (query, document) pair, as llama-server's `format_prompt_rerank`
/// without a rerank template (module doc).
pub fn rerank_tokens(vocab: &Vocab, query: &str, doc: &str) -> Vec<TokenId> {
    let mut out = Vec::new();
    let eos = vocab.eos().or(vocab.sep());
    if vocab.add_bos() {
        out.extend(vocab.bos());
    }
    out.extend(vocab.tokenize(query, false, false));
    if vocab.add_eos() {
        out.extend(eos);
    }
    if vocab.add_sep() {
        out.extend(vocab.sep());
    }
    out.extend(vocab.tokenize(doc, false, false));
    if vocab.add_eos() {
        out.extend(eos);
    }
    out
}

/// `POST /rerank` and its aliases (module doc).
pub async fn rerank(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let not_supported = || {
        ApiError::not_supported(
            "This server does not support reranking. Start it with `--reranking`",
        )
    };
    let Some(svc) = st.embed.clone() else {
        return Err(not_supported());
    };
    let Some(&info) = svc.info.get() else {
        return Err(ApiError::unavailable("Loading model"));
    };
    if info.pooling != Pooling::Rank {
        return Err(not_supported());
    }
    let ready = st.ready()?;
    let body = Body::parse(&read_body(body)?)?;
    let query = match body.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(ApiError::invalid("\"query\" must be a string")),
        None => return Err(ApiError::invalid("\"query\" must be provided")),
    };
    let tei = body.get("texts").is_some();
    let docs_value = body.get("documents").or_else(|| body.get("texts"));
    let documents: Vec<String> = match docs_value {
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    if documents.is_empty() {
        return Err(ApiError::invalid(
            "\"documents\" must be a non-empty string array",
        ));
    }
    let top_n = match body.i64("top_n")? {
        Some(n) => usize::try_from(n.max(0)).unwrap_or(0),
        None => documents.len(),
    };
    let return_text = tei && matches!(body.get("return_text"), Some(Value::Bool(true)));
    let inputs: Vec<Vec<TokenId>> = documents
        .iter()
        .map(|d| rerank_tokens(&ready.vocab, &query, d))
        .collect();
    for t in &inputs {
        let n = t.len();
        if n > info.n_ubatch {
            return Err(ApiError::server(format!(
                "input ({n} tokens) is too large to process. increase the physical batch size (current batch size: {})",
                info.n_ubatch
            )));
        }
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (tx, rx) = oneshot::channel();
    svc.jobs
        .send(EmbedJob { inputs, reply: tx })
        .map_err(|_| ApiError::unavailable("the embeddings thread has stopped"))?;
    let rows = rx
        .await
        .map_err(|_| ApiError::server("the embeddings thread has stopped"))?
        .map_err(ApiError::server)?;
    let label = if tei { "score" } else { "relevance_score" };
    let mut scored: Vec<(usize, f32)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                i,
                r.first().and_then(|s| s.first()).copied().unwrap_or(-1e6),
            )
        })
        .collect();
    // std::sort by descending score in llama-server; a stable sort keeps ties in order.
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(top_n);
    let results: Vec<Value> = scored
        .iter()
        .map(|&(i, s)| {
            let mut e = json!({ "index": i, label: f64::from(s) });
            if return_text {
                e["text"] = json!(documents[i]);
            }
            e
        })
        .collect();
    if tei {
        return Ok(Json(Value::Array(results)));
    }
    Ok(Json(openai_list(
        &body,
        &ready.model_name,
        n_tokens,
        "results",
        results,
    )))
}
