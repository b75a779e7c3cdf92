//! A chat request's tools, as llama-server takes them (`oaicompat_chat_params_parse`,
//! `common_chat_templates_apply`): `tools`, `tool_choice` and `parallel_tool_calls` read;
//! the messages made ready for a template that renders calls and their results (arguments
//! as objects, no null content beside calls); the format of the model's template
//! ([`crate::chat::tools::detect`]) and the grammar it gives calls, lazy unless a call is
//! required.

use super::error::ApiError;
use super::params::{wrong_type, Body};
use crate::chat::tools::{self, CallGrammar, CallOptions, Tool, ToolChoice, ToolFormat};
use serde_json::Value;

/// What a chat request asks of tools.
#[derive(Clone)]
pub struct ToolPlan {
    /// The template's format.
    pub format: &'static dyn ToolFormat,
    /// The tools calls may name (all, or the one `tool_choice` names).
    pub tools: Vec<Tool>,
    /// The request's `tools`, as given, for the template.
    pub raw: Value,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default false, as llama-server).
    pub parallel: bool,
}

impl std::fmt::Debug for ToolPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolPlan")
            .field("format", &self.format.name())
            .field("tools", &self.tools)
            .field("choice", &self.choice)
            .field("parallel", &self.parallel)
            .finish()
    }
}

impl ToolPlan {
    /// The request's tools for a template with Jinja `source`; `None` when it offers none.
    ///
    /// # Errors
    /// 400 for malformed `tools`, `tool_choice` or `parallel_tool_calls`.
    pub fn from_request(body: &Body, source: &str) -> Result<Option<ToolPlan>, ApiError> {
        let raw = match body.get("tools") {
            None => return Ok(None),
            Some(Value::Array(a)) if a.is_empty() => return Ok(None),
            Some(v @ Value::Array(_)) => v.clone(),
            Some(v) => return Err(wrong_type("tools", "an array", v)),
        };
        let list = tools::parse_tools(&raw).map_err(ApiError::invalid)?;
        let (choice, list) =
            tools::parse_tool_choice(body.get("tool_choice"), list).map_err(ApiError::invalid)?;
        Ok(Some(ToolPlan {
            format: tools::detect(source),
            tools: list,
            raw,
            choice,
            parallel: body.bool("parallel_tool_calls")?.unwrap_or(false),
        }))
    }

    /// Whether calls are read from the output (not with `tool_choice: none`).
    pub fn calls_allowed(&self) -> bool {
        self.choice != ToolChoice::None
    }

    fn options(&self) -> CallOptions {
        CallOptions {
            parallel: self.parallel,
            required: self.choice == ToolChoice::Required,
        }
    }

    /// The grammar for the calls; `None` with `tool_choice: none`.
    ///
    /// # Errors
    /// 400 for a tool whose parameters the schema converter refuses.
    pub fn grammar(&self) -> Result<Option<CallGrammar>, ApiError> {
        if !self.calls_allowed() {
            return Ok(None);
        }
        self.format
            .grammar(&self.tools, self.options())
            .map(Some)
            .map_err(|e| ApiError::invalid(format!("tools: {e}")))
    }

    /// The messages changed as the format asks (the generic format's instructions).
    pub fn prepare(&self, messages: &mut Vec<Value>) {
        if self.calls_allowed() {
            self.format
                .prepare_messages(messages, &self.tools, self.options());
        }
    }
}

/// Messages made ready for templates that render calls (llama.cpp's
/// `workaround::func_args_not_string` and `requires_non_null_content`): each call's
/// `arguments` string that holds a JSON object becomes that object, and an assistant
/// message with calls and null content gets an empty one.
pub fn calls_for_template(messages: &mut [Value]) {
    for m in messages {
        let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) else {
            continue;
        };
        for c in calls.iter_mut() {
            let Some(f) = c.get_mut("function").and_then(Value::as_object_mut) else {
                continue;
            };
            if let Some(Value::String(s)) = f.get("arguments") {
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                    f.insert("arguments".into(), v);
                }
            }
        }
        if m.get("content").is_none_or(Value::is_null) {
            m["content"] = Value::String(String::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn call_arguments_become_objects() {
        let mut m = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
        ]})];
        calls_for_template(&mut m);
        assert_eq!(m[0]["content"], "");
        assert_eq!(
            m[0]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
    }
}
