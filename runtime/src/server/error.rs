//! llama-server's error object (`tools/server/server-common.cpp` `format_error_response`):
//! `{"error": {"code": N, "message": "...", "type": "invalid_request_error"}}`, with the
//! HTTP status `code`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to a client: its HTTP status, llama-server's `type` and a message.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// HTTP status (also the object's `code`).
    pub status: StatusCode,
    /// llama-server's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// What went wrong, for the client.
    pub message: String,
    /// Extra fields of the error object (`n_prompt_tokens`, `n_ctx` for a prompt too long).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: serde_json::Map::new(),
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401 `authentication_error` with llama-server's message.
    pub fn auth() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Invalid API Key",
        )
    }

    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 413 `invalid_request_error`: a body over the size limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 500 `server_error`.
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 501 `not_supported_error`.
    pub fn not_supported(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
    }

    /// 503 `unavailable_error`.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
    }

    /// 400 `exceed_context_size_error`: a prompt of `n_prompt` tokens in a slot of `n_ctx`
    /// (llama-server's message and its `n_prompt_tokens`, `n_ctx` fields).
    pub fn exceeds_context(n_prompt: usize, n_ctx: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "exceed_context_size_error",
            format!(
                "request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
            ),
        );
        e.extra.insert("n_prompt_tokens".into(), n_prompt.into());
        e.extra.insert("n_ctx".into(), n_ctx.into());
        e
    }

    /// The error object (`{"code", "message", "type", ...}`), without the `error` wrapper
    /// (what a stream's error event carries inside it).
    pub fn object(&self) -> serde_json::Value {
        let mut o = serde_json::Map::new();
        o.insert("code".into(), self.status.as_u16().into());
        o.insert("message".into(), self.message.clone().into());
        o.insert("type".into(), self.kind.into());
        o.extend(self.extra.clone());
        serde_json::Value::Object(o)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.object() }))).into_response()
    }
}
