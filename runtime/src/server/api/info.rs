//! The read-only endpoints with llama-server's shapes (`tools/server/server-context.cpp`):
//! `GET /health`, `/v1/models`, `/props`, `/slots`, `/metrics`.

use crate::server::api::completion::settings_json;
use crate::server::error::ApiError;
use crate::server::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// `GET /health`: `{"status": "ok"}` (503 while loading: the state layer answers that).
pub async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /v1/models`, `/models`: the one model, in OpenAI's list shape and llama-server's
/// `models` list.
pub async fn models(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let r = st.ready()?;
    let meta = json!({
        "vocab_type": 2,
        "n_vocab": r.vocab.n_vocab(),
        "n_ctx_train": r.n_ctx_train,
        "n_embd": r.n_embd,
        "n_params": r.n_params,
        "size": r.size,
    });
    Ok(Json(json!({
        "models": [{
            "name": r.model_name,
            "model": r.model_name,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": { "parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "", "quantization_level": "" },
        }],
        "object": "list",
        "data": [{
            "id": r.model_name,
            "object": "model",
            "created": r.created,
            "owned_by": "llamacpp",
            "aliases": r.aliases,
            "tags": r.tags,
            "meta": meta,
        }],
    })))
}

/// `GET /props`: the default generation settings, the number of slots, the model's path,
/// file type, chat template and special tokens, which optional endpoints are served.
pub async fn props(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let r = st.ready()?;
    let d = &st.cfg.defaults;
    let piece = |id: Option<u32>| {
        id.map_or(String::new(), |i| {
            String::from_utf8_lossy(r.vocab.token_to_piece(i, true)).into_owned()
        })
    };
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": r.n_ctx_slot,
            "speculative": false,
            "is_processing": false,
            "params": settings_json(d, st.cfg.seed.map_or(json!(-1), |s| json!(s)), false),
        },
        "total_slots": st.cfg.args.parallel,
        "model_alias": r.model_name,
        "model_path": r.model_path,
        "model_ftype": r.model_ftype,
        "modalities": { "vision": false, "video": false, "audio": false },
        // Which optional endpoints are on (llama-server's `--slots`, `--props`, `--metrics`;
        // POST /props is not served), and whether the chat page is served (`--no-ui`).
        "endpoint_slots": st.cfg.slots(),
        "endpoint_props": false,
        "endpoint_metrics": st.cfg.args.metrics,
        "ui": !matches!(st.cfg.ui, crate::server::webui::Ui::Off),
        "cors_proxy_enabled": false,
        "chat_template": r.template_source,
        "bos_token": piece(r.vocab.bos()),
        "eos_token": piece(r.vocab.eos()),
        "build_info": r.fingerprint,
        "is_sleeping": false,
    })))
}

/// `GET /slots` (unless `--no-slots`): each slot's id, context and whether it is busy.
pub async fn slots(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    st.ready()?;
    if !st.cfg.slots() {
        return Err(ApiError::not_supported(
            "This server does not support slots endpoint.",
        ));
    }
    let views = st
        .shared
        .slots
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    Ok(Json(serde_json::to_value(views).unwrap_or(Value::Null)))
}

/// `GET /metrics` (with `--metrics`): Prometheus text.
pub async fn metrics(State(st): State<AppState>) -> Response {
    if let Err(e) = st.ready() {
        return e.into_response();
    }
    if !st.cfg.args.metrics {
        return ApiError::not_supported("This server does not support metrics endpoint.")
            .into_response();
    }
    let held = st.cfg.capacity() - st.permits.available_permits();
    let text = st
        .shared
        .metrics
        .lock()
        .map(|m| m.to_prometheus(held.saturating_sub(m.requests_processing)))
        .unwrap_or_default();
    let started = st.cfg.started.to_string();
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                started,
            ),
        ],
        text,
    )
        .into_response()
}
