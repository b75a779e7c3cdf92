//! `POST /tokenize`, `/detokenize` and `/apply-template` with llama-server's fields
//! (`tools/server/server-context.cpp` `post_tokenize`, `post_detokenize`,
//! `post_apply_template`).

use crate::server::api::completion::render_messages;
use crate::server::error::ApiError;
use crate::server::params::{wrong_type, Body};
use crate::server::{read_body, AppState, Ready};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

/// The loaded model and the request's JSON body.
fn open(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(std::sync::Arc<Ready>, Body), ApiError> {
    Ok((st.ready()?, Body::parse(&read_body(body)?)?))
}

/// `POST /tokenize`: `content` (text), `add_special` (BOS/EOS as the model asks; default
/// false), `parse_special` (special-token texts as special tokens; default true),
/// `with_pieces` (each id with its piece: a string, or its bytes when not valid UTF-8) →
/// `{"tokens": [...]}`.
pub async fn tokenize(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (ready, body) = open(&st, body)?;
    let content = body.str("content")?.unwrap_or("");
    let add_special = body.bool("add_special")?.unwrap_or(false);
    let parse_special = body.bool("parse_special")?.unwrap_or(true);
    let with_pieces = body.bool("with_pieces")?.unwrap_or(false);
    let ids = ready.vocab.tokenize(content, add_special, parse_special);
    if !with_pieces {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let piece = ready.vocab.token_to_piece(id, true);
            let piece = match std::str::from_utf8(piece) {
                Ok(s) => Value::String(s.to_string()),
                Err(_) => json!(piece),
            };
            json!({ "id": id, "piece": piece })
        })
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /detokenize`: `tokens` (ids) → `{"content": text}`; an id outside the vocabulary
/// is a 400.
pub async fn detokenize(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (ready, body) = open(&st, body)?;
    let ids = match body.get("tokens") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let id = v
                    .as_i64()
                    .ok_or_else(|| wrong_type("tokens", "a list of token ids", v))?;
                ready
                    .vocab
                    .check_id(id)
                    .map_err(|e| ApiError::invalid(format!("\"tokens\"[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(wrong_type("tokens", "a list of token ids", v)),
    };
    // llama-server's `tokens_to_str`: each token's piece with special tokens rendered
    // (`common_token_to_piece`), concatenated as they are (no space stripped or cleaned up).
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| ready.vocab.token_to_piece(id, true).iter().copied())
        .collect();
    Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
}

/// `POST /apply-template`: `messages` rendered with the model's chat template as a chat
/// request's prompt ([`render_messages`]: the assistant's header, or a continued final
/// message) → `{"prompt": text}`.
pub async fn apply_template(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (ready, body) = open(&st, body)?;
    let prompt = render_messages(&ready, &body, !st.cfg.args.no_prefill_assistant)?.text;
    Ok(Json(json!({ "prompt": prompt })))
}
