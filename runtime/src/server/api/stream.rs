//! The resumable stream routes (llama-server's `server_stream_make_*_handler`):
//! `GET /v1/stream`, `DELETE /v1/stream`, `POST /v1/streams/lookup`
//! ([`crate::server::streams`] says what they do).

use crate::server::error::ApiError;
use crate::server::read_body;
use crate::server::streams::parse_offset;
use crate::server::AppState;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The `conv_id` of the query, or llama-server's 400.
fn conv_id(q: Params) -> Result<(String, HashMap<String, String>), ApiError> {
    let Ok(Query(q)) = q else {
        return Err(ApiError::invalid("Missing conversation id in path"));
    };
    match q.get("conv_id") {
        Some(id) if !id.is_empty() => Ok((id.clone(), q)),
        _ => Err(ApiError::invalid("Missing conversation id in path")),
    }
}

/// llama-server answers an unknown stream with its generic 404 (its HTTP layer replaces
/// the handler's `Stream not found or expired`).
fn unknown() -> ApiError {
    ApiError::not_found("File Not Found")
}

/// `GET /v1/stream?conv_id=ID&from=N`: the session's bytes from offset `N`, then live.
pub async fn get(State(st): State<AppState>, q: Params) -> Response {
    let (id, q) = match conv_id(q) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let Some(session) = st.streams.get(&id) else {
        return unknown().into_response();
    };
    let from = match q.get("from").filter(|f| !f.is_empty()) {
        None => 0,
        Some(f) => match parse_offset(f) {
            Some(n) => n,
            None => return ApiError::invalid("Invalid 'from' offset").into_response(),
        },
    };
    if from < session.dropped() as u64 {
        return ApiError::invalid("Stream offset lost, please restart").into_response();
    }
    // Past the end of what a `usize` can address: nothing will ever come.
    let from = usize::try_from(from).unwrap_or(usize::MAX);
    let mut resp = Body::from_stream(session.follow(from)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// `DELETE /v1/stream?conv_id=ID`: the user's Stop; 204 whether or not there was one.
pub async fn delete(State(st): State<AppState>, q: Params) -> Response {
    let id = match conv_id(q) {
        Ok((id, _)) => id,
        Err(e) => return e.into_response(),
    };
    if !st.streams.stop(&id) {
        eprintln!(
            "{}: stop of an unknown stream session (conv_id={id:?})",
            crate::cli::prog()
        );
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `POST /v1/streams/lookup` `{"conversation_ids": [...]}`: those ids' sessions.
pub async fn lookup(State(st): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match read_body(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            // llama-server's own shape here: no `code`.
            let err = json!({"error": {"message": format!("invalid body: {e}"), "type": "invalid_request_error"}});
            return (StatusCode::BAD_REQUEST, axum::Json(err)).into_response();
        }
    };
    let ids: Vec<String> = body
        .get("conversation_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let found: Vec<Value> = st
        .streams
        .lookup(&ids)
        .iter()
        .map(|s| {
            json!({
                "conversation_id": s.id,
                "is_done": s.is_done(),
                "total_bytes": s.total_bytes(),
                "started_at": s.started_at,
                "completed_at": s.completed_at(),
            })
        })
        .collect();
    axum::Json(Value::Array(found)).into_response()
}
