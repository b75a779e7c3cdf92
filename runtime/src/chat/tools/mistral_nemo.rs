//! Mistral Nemo (llama.cpp's `COMMON_CHAT_FORMAT_MISTRAL_NEMO`): calls are
//! `[TOOL_CALLS][{"name": NAME, "arguments": {...}, "id": "123456789"}, ...]` after any
//! text, the id nine letters or digits. Recognized by `[TOOL_CALLS]` in the template; the
//! grammar waits for it.

use super::{
    call_from_object, call_object_rules, join_rules, json_at, without_partial_marker, CallGrammar,
    CallOptions, ChatMsg, Tool, ToolFormat,
};
use crate::grammar::Trigger;
use serde_json::{json, Value};

/// Mistral Nemo's `[TOOL_CALLS]` format (module doc).
pub struct MistralNemo;

const OPEN: &str = "[TOOL_CALLS]";

impl ToolFormat for MistralNemo {
    fn name(&self) -> &'static str {
        "Mistral Nemo"
    }

    fn detect(&self, source: &str) -> bool {
        source.contains(OPEN)
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let id = json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"});
        let call = call_object_rules(tools, "call", "name", "arguments", &[("id", id, true)])?;
        let root = if opts.parallel {
            r#"root ::= "[TOOL_CALLS]" "[" space call ("," space call)* "]""#
        } else {
            r#"root ::= "[TOOL_CALLS]" "[" space call "]""#
        };
        Ok(CallGrammar {
            gbnf: join_rules(&[root.into(), call]),
            lazy: !opts.required,
            triggers: vec![Trigger::Word(OPEN.into())],
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        let Some(at) = text.find(OPEN) else {
            msg.content = if partial {
                without_partial_marker(text, &[OPEN]).to_string()
            } else {
                text.to_string()
            };
            return msg;
        };
        let before = &text[..at];
        let calls = json_at(text, at + OPEN.len()).and_then(|(v, _, end)| {
            let Value::Array(items) = v else { return None };
            let calls: Option<Vec<_>> = items
                .iter()
                .map(|c| call_from_object(c, "name", "arguments"))
                .collect();
            Some((calls?, end))
        });
        match calls {
            Some((calls, end)) => {
                msg.tool_calls = calls;
                msg.content = if partial {
                    before.to_string()
                } else {
                    format!("{before}{}", &text[end..])
                };
            }
            None => msg.content = if partial { before } else { text }.to_string(),
        }
        msg
    }
}
