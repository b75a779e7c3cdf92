//! FireFunction v2 (llama.cpp's `COMMON_CHAT_FORMAT_FIREFUNCTION_V2`): calls are
//! ` functools[{"name": NAME, "arguments": {...}}, ...]` after any text. Recognized by
//! ` functools[` in the template; the grammar waits for it.

use super::{
    call_from_object, call_object_rules, join_rules, json_at, without_partial_marker, CallGrammar,
    CallOptions, ChatMsg, Tool, ToolFormat,
};
use crate::grammar::Trigger;
use serde_json::Value;

/// FireFunction v2's ` functools[` format (module doc).
pub struct FireFunctionV2;

const OPEN: &str = " functools[";

impl ToolFormat for FireFunctionV2 {
    fn name(&self) -> &'static str {
        "FireFunction v2"
    }

    fn detect(&self, source: &str) -> bool {
        source.contains(OPEN)
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let call = call_object_rules(tools, "call", "name", "arguments", &[])?;
        let root = if opts.parallel {
            r#"root ::= " functools[" space call ("," space call)* "]""#
        } else {
            r#"root ::= " functools[" space call "]""#
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
        // The list starts at the marker's `[`.
        let calls = json_at(text, at + OPEN.len() - 1).and_then(|(v, _, end)| {
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
