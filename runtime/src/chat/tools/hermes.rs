//! Hermes 2 Pro, also Qwen 2.5 and Qwen 3 (llama.cpp's `COMMON_CHAT_FORMAT_HERMES_2_PRO`):
//! a call is `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`, after any text.
//! Recognized by `<tool_call>` in the template. The grammar waits for `<tool_call>`.

use super::{
    call_from_object, call_object_rules, join_rules, json_at, without_partial_marker, CallGrammar,
    CallOptions, ChatMsg, Tool, ToolFormat,
};
use crate::grammar::Trigger;

/// Hermes 2 Pro's `<tool_call>` format (module doc).
pub struct Hermes2Pro;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolFormat for Hermes2Pro {
    fn name(&self) -> &'static str {
        "Hermes 2 Pro"
    }

    fn detect(&self, source: &str) -> bool {
        // GLM 4.5/4.6 also write `<tool_call>`, with their arguments as `<arg_key>` tags.
        source.contains(OPEN) && !source.contains("<arg_key>")
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let call = call_object_rules(tools, "call", "name", "arguments", &[])?;
        let root = if opts.parallel {
            "root ::= tool-call (space tool-call)*"
        } else {
            "root ::= tool-call"
        };
        let tool_call = r#"tool-call ::= "<tool_call>" space call space "</tool_call>""#;
        Ok(CallGrammar {
            gbnf: join_rules(&[root.into(), tool_call.into(), call]),
            lazy: !opts.required,
            triggers: vec![Trigger::Word(OPEN.into())],
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        let Some(first) = text.find(OPEN) else {
            msg.content = if partial {
                without_partial_marker(text, &[OPEN]).to_string()
            } else {
                text.to_string()
            };
            return msg;
        };
        let mut pos = first;
        let mut calls = Vec::new();
        let mut end_of_calls = first;
        // Calls one after another, with only whitespace between them.
        while text[pos..].starts_with(OPEN) {
            let Some((v, _, after)) = json_at(text, pos + OPEN.len()) else {
                break;
            };
            let Some(call) = call_from_object(&v, "name", "arguments") else {
                break;
            };
            let rest = &text[after..];
            let close = rest.len() - rest.trim_start().len();
            if !rest[close..].starts_with(CLOSE) {
                break;
            }
            calls.push(call);
            end_of_calls = after + close + CLOSE.len();
            let tail = &text[end_of_calls..];
            pos = end_of_calls + (tail.len() - tail.trim_start().len());
        }
        let before = &text[..first];
        if calls.is_empty() {
            // Not a call after all: text, or (while writing) possibly one still coming.
            msg.content = if partial { before } else { text }.to_string();
            return msg;
        }
        msg.tool_calls = calls;
        let after = &text[end_of_calls..];
        msg.content = if partial {
            before.to_string()
        } else {
            format!("{before}{after}").to_string()
        };
        msg
    }
}
