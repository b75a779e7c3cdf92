//! Functionary v3.2 (llama.cpp's `COMMON_CHAT_FORMAT_FUNCTIONARY_V3_2`): the prompt ends
//! with `>>>`; the answer is a run of parts, each a recipient, a newline and a body —
//! `all` for text to the user, else a function's name and its JSON arguments — with `>>>`
//! before every part but the first. Recognized by `>>>all` in the template. The grammar
//! waits for a tool's name at the start of the answer or after `>>>`.

use super::{
    gbnf_literal, join_rules, json_at, CallGrammar, CallOptions, ChatMsg, Tool, ToolCall,
    ToolFormat,
};
use crate::grammar::Trigger;

/// Functionary v3.2's recipient format (module doc).
pub struct FunctionaryV32;

impl ToolFormat for FunctionaryV32 {
    fn name(&self) -> &'static str {
        "Functionary v3.2"
    }

    fn detect(&self, source: &str) -> bool {
        source.contains(">>>all")
    }

    fn always(&self) -> bool {
        true
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let mut parts = Vec::new();
        let mut names = Vec::new();
        let mut triggers = Vec::new();
        let mut alternation = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let args = format!("call{i}-args");
            parts.push(crate::grammar::json_schema::to_rules(&t.parameters, &args)?);
            parts.push(format!(
                "call{i} ::= {} {args}",
                gbnf_literal(&format!("{}\n", t.name))
            ));
            names.push(format!("call{i}"));
            triggers.push(Trigger::Word(format!(">>>{}\n", t.name)));
            alternation.push(fancy_regex::escape(&t.name).into_owned());
        }
        triggers.push(Trigger::PatternFull(format!(
            r"((?:{})\n)[\s\S]*",
            alternation.join("|")
        )));
        let first = format!("tool-call ::= {}", names.join(" | "));
        let root = if opts.parallel {
            r#"root ::= tool-call (">>>" tool-call)*"#
        } else {
            "root ::= tool-call"
        };
        parts.insert(0, first);
        parts.insert(0, root.into());
        Ok(CallGrammar {
            gbnf: join_rules(&parts),
            lazy: !opts.required,
            triggers,
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        let mut pos = 0;
        loop {
            let Some(nl) = text[pos..].find('\n').map(|n| pos + n) else {
                // A recipient still being written, or text with none.
                if !partial && pos < text.len() {
                    msg.content.push_str(&text[pos..]);
                }
                break;
            };
            let recipient = text[pos..nl].trim();
            let body = nl + 1;
            if recipient == "all" {
                let end = text[body..].find(">>>").map_or(text.len(), |n| body + n);
                msg.content.push_str(&text[body..end]);
                if end == text.len() {
                    break;
                }
                pos = end + 3;
                continue;
            }
            match json_at(text, body) {
                Some((v, _, end)) => {
                    msg.tool_calls.push(ToolCall {
                        name: recipient.to_string(),
                        arguments: v.to_string(),
                        id: String::new(),
                    });
                    let rest = &text[end..];
                    let skip = rest.len() - rest.trim_start().len();
                    match rest[skip..].strip_prefix(">>>") {
                        Some(_) => pos = end + skip + 3,
                        None => {
                            if !partial {
                                msg.content.push_str(&rest[skip..]);
                            }
                            break;
                        }
                    }
                }
                None if recipient == "python" && !partial => {
                    // The python tool may take its code as is.
                    let code = &text[body..];
                    msg.tool_calls.push(ToolCall {
                        name: recipient.to_string(),
                        arguments: serde_json::json!({"code": code}).to_string(),
                        id: String::new(),
                    });
                    break;
                }
                None => {
                    if !partial {
                        msg.content.push_str(&text[pos..]);
                    }
                    break;
                }
            }
        }
        msg
    }
}
