//! The grammar of a request, as llama-server reads it: `grammar` (GBNF), `json_schema`, and
//! on chat completions `response_format` (`server-common.cpp` `oaicompat_chat_params_parse`,
//! `server-schema.cpp`'s `json_schema` field, `common/chat.cpp`). A grammar or schema that
//! cannot be used is a 400 naming what is wrong.

use super::api::completion::Api;
use super::error::ApiError;
use super::params::{wrong_type, Body};
use super::{Config, Ready};
use crate::grammar::{self, json_schema, Rules, TokenTable};
use serde_json::{Map, Value};
use std::sync::Arc;

/// The grammar a request asks for (its own, else the server's `--grammar`), ready to match.
///
/// Chat completions: `grammar` and `json_schema` together are refused; `response_format`
/// `{"type": "json_object"}` (with an optional `schema`), `{"type": "json_schema",
/// "json_schema": {"schema": ...}}` and `{"type": "text"}` are taken, another type is a 400;
/// an empty schema means any JSON object. Completions: `json_schema` unless `grammar` is
/// also given.
///
/// # Errors
/// 400: a field of the wrong type, a schema the converter refuses, a grammar that does not
/// parse (its line and column).
pub fn request_grammar(
    body: &Body,
    api: Api,
    ready: &Ready,
    cfg: &Config,
) -> Result<Option<Arc<Rules>>, ApiError> {
    let user_grammar = match body.get("grammar") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()).filter(|s| !s.is_empty()),
        Some(v) => return Err(wrong_type("grammar", "a string", v)),
    };
    let schema = if api == Api::OaiChat {
        let mut schema = body.get("json_schema").cloned();
        if schema.is_some() && user_grammar.is_some() {
            return Err(ApiError::invalid("Cannot use both json_schema and grammar"));
        }
        if let Some(rf) = body.get("response_format") {
            let Value::Object(rf) = rf else {
                return Err(wrong_type("response_format", "an object", rf));
            };
            let kind = match rf.get("type") {
                None | Some(Value::Null) => "",
                Some(Value::String(s)) => s.as_str(),
                Some(v) => return Err(wrong_type("response_format.type", "a string", v)),
            };
            match kind {
                "json_object" => {
                    if rf.contains_key("schema") || schema_is_empty(schema.as_ref()) {
                        schema = Some(field_or_empty(rf, "schema"));
                    }
                }
                "json_schema" => {
                    let wrapper = field_or_empty(rf, "json_schema");
                    schema = Some(match &wrapper {
                        Value::Object(w) => field_or_empty(w, "schema"),
                        _ => Value::Object(Map::new()),
                    });
                }
                "" | "text" => {}
                other => {
                    return Err(ApiError::invalid(format!(
                        "response_format type must be one of \"text\" or \"json_object\", but got: {other}"
                    )))
                }
            }
        }
        schema
    } else if user_grammar.is_none() {
        body.get("json_schema").cloned()
    } else {
        None
    };
    let text = match schema {
        Some(mut s) => {
            if s.as_object().is_some_and(Map::is_empty) {
                s = serde_json::json!({"type": "object"});
            }
            Some(
                json_schema::to_grammar(&s)
                    .map_err(|e| ApiError::invalid(format!("\"json_schema\": {e}")))?,
            )
        }
        None => user_grammar.or_else(|| cfg.grammar.clone()),
    };
    let Some(text) = text else {
        return Ok(None);
    };
    let table = TokenTable::shared(&ready.vocab);
    grammar::compile(&text, &ready.vocab, table)
        .map(Some)
        .map_err(|e| ApiError::invalid(format!("Failed to parse grammar: {e}")))
}

/// Whether `schema` is absent or empty (nlohmann's `empty()`: null, `{}`, `[]`, `""` is not).
fn schema_is_empty(schema: Option<&Value>) -> bool {
    match schema {
        None | Some(Value::Null) => true,
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    }
}

/// `o[name]`, or `{}` when missing or null (llama.cpp's `json_value(o, name, json::object())`).
fn field_or_empty(o: &Map<String, Value>, name: &str) -> Value {
    match o.get(name) {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v) => v.clone(),
    }
}
