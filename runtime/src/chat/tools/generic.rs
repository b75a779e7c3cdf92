//! llama.cpp's generic format (`COMMON_CHAT_FORMAT_GENERIC`), for templates that show no
//! known way of writing calls: the model answers in JSON, `{"tool_call": {"name": NAME,
//! "arguments": {...}}}` (with parallel calls `{"tool_calls": [...]}`) or `{"response":
//! TEXT}`, under a grammar from the first token, and a system message tells it so.

use super::{call_from_object, json_at, CallGrammar, CallOptions, ChatMsg, Tool, ToolFormat};
use serde_json::{json, Value};

/// The generic JSON format (module doc).
pub struct Generic;

/// What the system message gains (llama.cpp's words).
pub const INSTRUCTION: &str = "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to the user's request";

impl ToolFormat for Generic {
    fn name(&self) -> &'static str {
        "Generic"
    }

    fn detect(&self, _source: &str) -> bool {
        true
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let calls: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                })
            })
            .collect();
        let call = if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        };
        let tool_call = if opts.parallel {
            json!({
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                "required": ["tool_calls"],
            })
        } else {
            json!({
                "type": "object",
                "properties": {"tool_call": call},
                "required": ["tool_call"],
            })
        };
        let schema = if opts.required {
            tool_call
        } else {
            json!({"anyOf": [tool_call, {
                "type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"],
            }]})
        };
        Ok(CallGrammar {
            gbnf: crate::grammar::json_schema::to_grammar(&schema)?,
            lazy: false,
            triggers: Vec::new(),
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        if let Some((v, _, end)) = json_at(text, 0).filter(|(_, _, e)| text[*e..].trim().is_empty())
        {
            let _ = end;
            if let Some(c) = v
                .get("tool_call")
                .and_then(|c| call_from_object(c, "name", "arguments"))
            {
                msg.tool_calls.push(c);
                return msg;
            }
            if let Some(Value::Array(cs)) = v.get("tool_calls") {
                let calls: Option<Vec<_>> = cs
                    .iter()
                    .map(|c| call_from_object(c, "name", "arguments"))
                    .collect();
                if let Some(calls) = calls {
                    msg.tool_calls = calls;
                    return msg;
                }
            }
            match v.get("response") {
                Some(Value::String(s)) => {
                    msg.content = s.clone();
                    return msg;
                }
                Some(other) => {
                    msg.content = other.to_string();
                    return msg;
                }
                None => {}
            }
        }
        if partial && text.trim_start().starts_with('{') {
            return msg;
        }
        msg.content = text.to_string();
        msg
    }

    fn prepare_messages(&self, messages: &mut Vec<Value>, tools: &[Tool], _opts: CallOptions) {
        let list: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t.name, "parameters": t.parameters}))
            .collect();
        let text = format!(
            "You can call any of the following tools to satisfy the user's requests: {}\n\n{INSTRUCTION}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
        match messages.first_mut() {
            Some(m) if m.get("role").and_then(Value::as_str) == Some("system") => {
                let old = m
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                m["content"] = format!("{old}\n\n{text}").into();
            }
            _ => messages.insert(0, json!({"role": "system", "content": text})),
        }
    }
}
