//! Llama 3.1 / 3.2 / 3.3 JSON calls (llama.cpp's `COMMON_CHAT_FORMAT_LLAMA_3_X`): the whole
//! answer is `{"name": NAME, "parameters": {...}}` (optionally with `"type": "function"`
//! first). Recognized by the `ipython` role header in the template. The grammar waits for
//! an answer that opens with such an object (a full-pattern trigger, as llama.cpp's).
//! The built-in tools' `<|python_tag|>` form is not read.

use super::{
    call_object_rules, json_at, CallGrammar, CallOptions, ChatMsg, Tool, ToolCall, ToolFormat,
};
use crate::grammar::Trigger;
use serde_json::Value;

/// Llama 3.x's JSON format (module doc).
pub struct Llama3;

impl ToolFormat for Llama3 {
    fn name(&self) -> &'static str {
        "Llama 3.x"
    }

    fn detect(&self, source: &str) -> bool {
        source.contains("<|start_header_id|>ipython<|end_header_id|>")
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let call = call_object_rules(tools, "call", "name", "parameters", &[])?;
        Ok(CallGrammar {
            gbnf: super::join_rules(&["root ::= call".into(), call]),
            lazy: !opts.required,
            triggers: vec![Trigger::PatternFull(
                r#"\s*(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*"#.into(),
            )],
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        if text.trim_start().starts_with('{') {
            if let Some((v, _, end)) = json_at(text, 0) {
                if let Some(call) = call_of(&v).filter(|_| text[end..].trim().is_empty()) {
                    msg.tool_calls.push(call);
                    return msg;
                }
            }
            if partial {
                // Perhaps a call still being written.
                return msg;
            }
        }
        msg.content = text.to_string();
        msg
    }
}

/// `{"name": ..., "parameters": {...}}` (or `"arguments"`), with an optional `"type":
/// "function"`.
fn call_of(v: &Value) -> Option<ToolCall> {
    if v.get("type").is_some_and(|t| t != "function") {
        return None;
    }
    let key = if v.get("parameters").is_some() {
        "parameters"
    } else {
        "arguments"
    };
    super::call_from_object(v, "name", key).filter(|_| v.get(key).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::{Grammar, Matcher, Rules, TokenTable};
    use std::sync::Arc;

    /// The grammar has a root and accepts the call the parser reads.
    #[test]
    fn grammar_accepts_a_call() {
        let tools = [Tool {
            name: "f".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        }];
        let g = Llama3
            .grammar(
                &tools,
                CallOptions {
                    parallel: false,
                    required: true,
                },
            )
            .unwrap();
        let parsed = Grammar::parse(&g.gbnf, None).unwrap();
        let rules = Arc::new(Rules::new(
            &parsed,
            Arc::new(TokenTable::from_pieces(Vec::new())),
        ));
        let mut m = Matcher::new(rules);
        let text = r#"{"name": "f", "parameters": {"a": 1}}"#;
        assert!(m.accept_str(text) && m.can_end(), "{}", g.gbnf);
        let msg = Llama3.parse(text, false);
        assert_eq!(msg.tool_calls[0].name, "f");
    }
}
