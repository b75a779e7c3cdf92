//! DeepSeek R1 (llama.cpp's `COMMON_CHAT_FORMAT_DEEPSEEK_R1`): after any text, calls are
//! `<｜tool▁calls▁begin｜>` then for each `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
//! a newline, the arguments in a ```` ```json ```` block and `<｜tool▁call▁end｜>`, then
//! `<｜tool▁calls▁end｜>`. Recognized by `<｜tool▁calls▁begin｜>` in the template. The
//! reasoning (`<think>`, which the template opens itself) is split off before.

use super::{
    gbnf_literal, join_rules, json_at, without_partial_marker, CallGrammar, CallOptions, ChatMsg,
    Tool, ToolCall, ToolFormat,
};
use crate::grammar::Trigger;

/// DeepSeek R1's format (module doc).
pub struct DeepSeekR1;

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
/// Spellings of the opening marker the models write besides the real one (llama.cpp takes
/// them too).
const CALLS_BEGIN_ALT: &[&str] = &[
    "<｜tool▁calls▁begin｜>",
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const SEP: &str = "<｜tool▁sep｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";

impl ToolFormat for DeepSeekR1 {
    fn name(&self) -> &'static str {
        "DeepSeek R1"
    }

    fn detect(&self, source: &str) -> bool {
        source.contains(CALLS_BEGIN)
    }

    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String> {
        let mut parts = Vec::new();
        let mut names = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let args = format!("call{i}-args");
            parts.push(crate::grammar::json_schema::to_rules(&t.parameters, &args)?);
            let head = format!("{CALL_BEGIN}function{SEP}{}\n```json\n", t.name);
            parts.push(format!(
                "call{i} ::= {} {args} {}",
                gbnf_literal(&head),
                gbnf_literal(&format!("```{CALL_END}"))
            ));
            names.push(format!("call{i}"));
        }
        let one = format!("tool-call ::= {}", names.join(" | "));
        let calls = if opts.parallel {
            "tool-call+"
        } else {
            "tool-call"
        };
        let root = format!(
            "root ::= {} {calls} {} space",
            gbnf_literal(CALLS_BEGIN),
            gbnf_literal(CALLS_END)
        );
        parts.insert(0, one);
        parts.insert(0, root);
        if !parts
            .iter()
            .any(|p| p.lines().any(|l| l.starts_with("space ::=")))
        {
            parts.push(r#"space ::= | " " | "\n"{1,2} [ \t]{0,20}"#.into());
        }
        Ok(CallGrammar {
            gbnf: join_rules(&parts),
            lazy: !opts.required,
            triggers: CALLS_BEGIN_ALT
                .iter()
                .map(|w| Trigger::Word((*w).to_string()))
                .collect(),
        })
    }

    fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let mut msg = ChatMsg::default();
        let found = CALLS_BEGIN_ALT
            .iter()
            .filter_map(|m| text.find(m).map(|at| (at, m.len())))
            .min();
        let Some((at, len)) = found else {
            msg.content = if partial {
                without_partial_marker(text, CALLS_BEGIN_ALT).to_string()
            } else {
                text.to_string()
            };
            return msg;
        };
        let before = &text[..at];
        let mut pos = at + len;
        let mut calls = Vec::new();
        while let Some((call, end)) = one_call(text, pos) {
            calls.push(call);
            pos = end;
        }
        let rest = text[pos..].trim_start();
        let rest = rest.strip_prefix(CALLS_END).unwrap_or(rest);
        if calls.is_empty() {
            msg.content = if partial { before } else { text }.to_string();
            return msg;
        }
        msg.tool_calls = calls;
        msg.content = if partial {
            before.to_string()
        } else {
            format!("{before}{rest}")
        };
        msg
    }
}

/// One `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}```<｜tool▁call▁end｜>`
/// at `text[at..]` (after whitespace), and where it ends.
fn one_call(text: &str, at: usize) -> Option<(ToolCall, usize)> {
    let rest = text.get(at..)?.trim_start();
    let start = text.len() - rest.len();
    let rest = rest.strip_prefix(CALL_BEGIN)?;
    let rest = rest.strip_prefix("function").unwrap_or(rest);
    let rest = rest.strip_prefix(SEP)?;
    let nl = rest.find('\n')?;
    let name = rest[..nl].trim().to_string();
    let after_name = &rest[nl + 1..];
    let body = after_name.strip_prefix("```json").unwrap_or(after_name);
    let body_at = text.len() - body.len();
    let (v, _, end) = json_at(text, body_at)?;
    let tail = text[end..].trim_start();
    let tail = tail.strip_prefix("```").unwrap_or(tail).trim_start();
    let tail = tail.strip_prefix(CALL_END)?;
    let _ = start;
    Some((
        ToolCall {
            name,
            arguments: v.to_string(),
            id: String::new(),
        },
        text.len() - tail.len(),
    ))
}
