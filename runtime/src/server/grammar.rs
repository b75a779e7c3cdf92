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

/// A request's lazy grammar triggers (llama-server's `grammar_lazy` and `grammar_triggers`,
/// `server_grammar_trigger`): with `grammar_lazy: true`, each trigger an object
/// `{"type": T, "value": TEXT, "token": ID}` where T is 0 (a token: `token`), 1 (a word),
/// 2 (a pattern found anywhere) or 3 (a pattern matching the whole output). `None`: the
/// grammar is not lazy.
///
/// # Errors
/// 400: a field of the wrong type, an unknown trigger type, a pattern that does not compile,
/// a token outside the vocabulary.
pub fn request_triggers(
    body: &Body,
    ready: &Ready,
) -> Result<Option<Arc<grammar::Triggers>>, ApiError> {
    if !body.bool("grammar_lazy")?.unwrap_or(false) {
        return Ok(None);
    }
    let list = match body.get("grammar_triggers") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => return Err(wrong_type("grammar_triggers", "an array", v)),
    };
    let mut triggers = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let what = format!("grammar_triggers[{i}]");
        let kind = t.get("type").and_then(Value::as_i64);
        let value = t
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        triggers.push(match kind {
            Some(0) => {
                let id = t.get("token").and_then(Value::as_i64).ok_or_else(|| {
                    ApiError::invalid(format!("{what}: a token trigger needs \"token\""))
                })?;
                let id = ready
                    .vocab
                    .check_id(id)
                    .map_err(|e| ApiError::invalid(format!("{what}: {e}")))?;
                grammar::Trigger::Token(id)
            }
            Some(1) => grammar::Trigger::Word(value),
            Some(2) => grammar::Trigger::Pattern(value),
            Some(3) => grammar::Trigger::PatternFull(value),
            _ => {
                return Err(ApiError::invalid(format!(
                    "{what}: \"type\" must be 0 (token), 1 (word), 2 (pattern) or 3 (full pattern)"
                )))
            }
        });
    }
    grammar::Triggers::new(&triggers)
        .map(|t| Some(Arc::new(t)))
        .map_err(ApiError::invalid)
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
