//! Tool calls, as llama.cpp's chat layer has them (`common/chat.cpp`): each tool-calling
//! format a chat template may use is one module behind [`ToolFormat`] — how it is recognized
//! in the template's source, the grammar (and the triggers that make it lazy) that keeps a
//! call well-formed, and how the model's output is read back into content and calls. The
//! formats are tried in llama.cpp's order ([`detect`]); a template that shows none gets
//! [`generic`], llama.cpp's fallback (the model answers in JSON).
//!
//! Reasoning (`<think>`) is split off before a format reads the output
//! ([`super::reasoning`]).

pub mod deepseek_r1;
pub mod firefunction;
pub mod functionary;
pub mod generic;
pub mod hermes;
pub mod llama3;
pub mod mistral_nemo;

use crate::grammar::Trigger;
use serde_json::{json, Value};

/// One tool a request offers: its function's name, and the JSON schema of its arguments
/// (`{"type": "object"}` when the request gives none).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// `function.name`.
    pub name: String,
    /// `function.parameters`.
    pub parameters: Value,
}

/// One call the model made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text, as the model wrote them.
    pub arguments: String,
    /// The id the model gave the call (Mistral Nemo, Command R7B); empty when it gave none.
    pub id: String,
}

/// An assistant message read from the model's output (llama.cpp's `common_chat_msg`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMsg {
    /// The answer's text.
    pub content: String,
    /// The reasoning split out of it (`reasoning_content`).
    pub reasoning_content: String,
    /// The calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// `tool_choice` (OpenAI's field; llama.cpp's `common_chat_tool_choice`, and a named
/// function, which llama.cpp reads as `required` with only that tool offered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call tools or answer (`auto`, the default).
    Auto,
    /// No calls: the tools are rendered, the output is content.
    None,
    /// The model must call a tool.
    Required,
}

/// What a format's grammar is built for.
#[derive(Clone, Copy, Debug)]
pub struct CallOptions {
    /// Several calls in one answer (`parallel_tool_calls`).
    pub parallel: bool,
    /// A call is required: the grammar holds from the first token, not after a trigger.
    pub required: bool,
}

/// The grammar that keeps a format's calls well-formed.
#[derive(Clone, Debug, PartialEq)]
pub struct CallGrammar {
    /// GBNF whose `root` is the text from the trigger on (or the whole answer when not lazy).
    pub gbnf: String,
    /// Lazy: free text until one of `triggers` appears.
    pub lazy: bool,
    /// Where the grammar starts, for a lazy grammar.
    pub triggers: Vec<Trigger>,
}

/// One tool-call format (module doc).
pub trait ToolFormat: Sync {
    /// llama.cpp's name for it (`common_chat_format_name`).
    fn name(&self) -> &'static str;

    /// Whether a template's Jinja source writes calls this way.
    fn detect(&self, source: &str) -> bool;

    /// The grammar for calls to `tools` (at least one).
    ///
    /// # Errors
    /// A tool's parameters that the JSON schema converter refuses.
    fn grammar(&self, tools: &[Tool], opts: CallOptions) -> Result<CallGrammar, String>;

    /// Reads `text` (the answer after any reasoning) into content and calls. `partial`: the
    /// answer is still being written; text that may be the start of a call is held back and
    /// unfinished calls are left out, so that what is returned only grows.
    fn parse(&self, text: &str, partial: bool) -> ChatMsg;

    /// Whether its output is read this way even when the request offers no tools
    /// (Functionary's answers always start with a recipient).
    fn always(&self) -> bool {
        false
    }

    /// Changes the messages before rendering (the generic format tells the model how to
    /// answer). Most formats leave them.
    fn prepare_messages(&self, _messages: &mut Vec<Value>, _tools: &[Tool], _opts: CallOptions) {}
}

/// The formats, in llama.cpp's order of detection (its `common_chat_templates_apply_jinja`
/// of the releases with one parser per format).
pub fn formats() -> &'static [&'static dyn ToolFormat] {
    &[
        &deepseek_r1::DeepSeekR1,
        &hermes::Hermes2Pro,
        &functionary::FunctionaryV32,
        &firefunction::FireFunctionV2,
        &llama3::Llama3,
        &mistral_nemo::MistralNemo,
    ]
}

/// The format a template with Jinja `source` uses: the first of [`formats`] it shows, else
/// [`generic::Generic`].
pub fn detect(source: &str) -> &'static dyn ToolFormat {
    formats()
        .iter()
        .copied()
        .find(|f| f.detect(source))
        .unwrap_or(&generic::Generic)
}

/// The tools of a request (`tools`: OpenAI's `[{"type": "function", "function": {...}}]`).
///
/// # Errors
/// A tool that is not a function with a name, one line naming it.
pub fn parse_tools(tools: &Value) -> Result<Vec<Tool>, String> {
    let Value::Array(list) = tools else {
        return Err("\"tools\" must be an array".into());
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let f = t
                .get("function")
                .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    format!("tools[{i}]: only tools of type \"function\" are supported")
                })?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    format!("tools[{i}]: \"function.name\" must be a non-empty string")
                })?;
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(format!(
                        "tools[{i}]: \"function.parameters\" must be an object"
                    ))
                }
            };
            Ok(Tool {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"`, or `{"type": "function", "function":
/// {"name": NAME}}`, which keeps only that tool and requires a call. Returns the choice and
/// the tools left.
///
/// # Errors
/// Another value, or a name that is not among the tools.
pub fn parse_tool_choice(
    choice: Option<&Value>,
    tools: Vec<Tool>,
) -> Result<(ToolChoice, Vec<Tool>), String> {
    match choice {
        None | Some(Value::Null) => Ok((ToolChoice::Auto, tools)),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok((ToolChoice::Auto, tools)),
            "none" => Ok((ToolChoice::None, tools)),
            "required" => Ok((ToolChoice::Required, tools)),
            other => Err(format!("Invalid tool_choice: {other}")),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or("tool_choice: an object needs \"function\": {\"name\": ...}")?;
            let kept: Vec<Tool> = tools.into_iter().filter(|t| t.name == name).collect();
            if kept.is_empty() {
                return Err(format!("tool_choice: no tool named {name:?}"));
            }
            Ok((ToolChoice::Required, kept))
        }
        Some(_) => Err("tool_choice must be a string or an object".into()),
    }
}

/// OpenAI's message for `msg` (llama.cpp's `common_chat_msg::to_json_oaicompat`): `content`
/// (an empty string when there is none), `reasoning_content` when there is some,
/// `tool_calls` with the ids given (`ids[i]` for a call the model gave none).
pub fn message_json(msg: &ChatMsg, ids: &[String]) -> Value {
    let mut m = json!({"role": "assistant", "content": msg.content});
    if !msg.reasoning_content.is_empty() {
        m["reasoning_content"] = msg.reasoning_content.clone().into();
    }
    if !msg.tool_calls.is_empty() {
        m["tool_calls"] = msg
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| call_json(c, ids.get(i).map_or("", String::as_str)))
            .collect();
    }
    m
}

/// One call as OpenAI writes it, with its id (the model's, else `fallback_id`).
fn call_json(c: &ToolCall, fallback_id: &str) -> Value {
    let id = if c.id.is_empty() { fallback_id } else { &c.id };
    json!({
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
        "id": id,
    })
}

/// The text of a JSON value that starts at `text[at..]` (after whitespace), and where it
/// ends; `None` when no complete value is there.
pub fn json_at(text: &str, at: usize) -> Option<(Value, usize, usize)> {
    let rest = text.get(at..)?;
    let start = at + (rest.len() - rest.trim_start().len());
    let mut it = serde_json::Deserializer::from_str(text.get(start..)?).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Some((v, start, start + it.byte_offset())),
        _ => None,
    }
}

/// `text` with the longest suffix that is a proper prefix of one of `markers` removed: what
/// can be shown while the rest may still become a marker.
pub fn without_partial_marker<'a>(text: &'a str, markers: &[&str]) -> &'a str {
    let mut cut = text.len();
    for m in markers {
        for k in (1..m.len()).rev() {
            if !m.is_char_boundary(k) {
                continue;
            }
            if text.ends_with(&m[..k]) {
                cut = cut.min(text.len() - k);
                break;
            }
        }
    }
    &text[..cut]
}

/// A call object's fields read as OpenAI's: `name_key` (a string) and `args_key` (an object,
/// or a string holding JSON), and an optional `id`.
pub fn call_from_object(v: &Value, name_key: &str, args_key: &str) -> Option<ToolCall> {
    let name = v.get(name_key)?.as_str()?.to_string();
    let arguments = match v.get(args_key) {
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        None => "{}".to_string(),
        Some(_) => return None,
    };
    let id = match v.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    Some(ToolCall {
        name,
        arguments,
        id,
    })
}

/// GBNF rules joined, each rule once (the JSON schema converter's shared rules, such as
/// `space` and `string`, come with every schema).
pub fn join_rules(parts: &[String]) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut out = String::new();
    for line in parts.iter().flat_map(|p| p.lines()) {
        let name = line.split("::=").next().unwrap_or("").trim().to_string();
        if seen.insert(name) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A GBNF string literal for `s`.
pub fn gbnf_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rules for one JSON object per tool with the tool's name under `name_key` (a
/// constant) and its parameters under `args_key`, as rule `name` (an alternative per tool),
/// with `extra` properties (schema, required) added to each.
///
/// # Errors
/// A schema the converter refuses.
pub fn call_object_rules(
    tools: &[Tool],
    name: &str,
    name_key: &str,
    args_key: &str,
    extra: &[(&str, Value, bool)],
) -> Result<String, String> {
    let alts: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut props = serde_json::Map::new();
            props.insert(name_key.into(), json!({"const": t.name}));
            props.insert(args_key.into(), t.parameters.clone());
            let mut required = vec![json!(name_key), json!(args_key)];
            for (k, schema, req) in extra {
                props.insert((*k).to_string(), schema.clone());
                if *req {
                    required.push(json!(k));
                }
            }
            json!({"type": "object", "properties": props, "required": required})
        })
        .collect();
    let schema = if alts.len() == 1 {
        alts.into_iter().next().unwrap_or(Value::Null)
    } else {
        json!({"anyOf": alts})
    };
    crate::grammar::json_schema::to_rules(&schema, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format's grammar reads (a `root`, every rule defined), for one tool and two,
    /// with and without parallel calls, lazy or required.
    #[test]
    fn every_grammar_reads() {
        let tool = |n: &str| Tool {
            name: n.into(),
            parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}),
        };
        let all: Vec<&dyn ToolFormat> = formats()
            .iter()
            .copied()
            .chain([&generic::Generic as &dyn ToolFormat])
            .collect();
        for f in all {
            for tools in [vec![tool("a")], vec![tool("a"), tool("b")]] {
                for (parallel, required) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let g = f
                        .grammar(&tools, CallOptions { parallel, required })
                        .unwrap();
                    if let Err(e) = crate::grammar::Grammar::parse(&g.gbnf, None) {
                        panic!("{}: {e}\n{}", f.name(), g.gbnf);
                    }
                    assert!(g.lazy != required || !g.lazy, "{}", f.name());
                    crate::grammar::Triggers::new(&g.triggers).unwrap();
                }
            }
        }
    }

    #[test]
    fn partial_markers_are_held_back() {
        assert_eq!(without_partial_marker("abc<tool", &["<tool_call>"]), "abc");
        assert_eq!(without_partial_marker("abc<", &["<tool_call>"]), "abc");
        assert_eq!(without_partial_marker("abc", &["<tool_call>"]), "abc");
        assert_eq!(without_partial_marker("a<x", &["<tool_call>"]), "a<x");
    }

    #[test]
    fn tool_choice_named_keeps_one_tool() {
        let tools = vec![
            Tool {
                name: "a".into(),
                parameters: json!({}),
            },
            Tool {
                name: "b".into(),
                parameters: json!({}),
            },
        ];
        let choice = json!({"type": "function", "function": {"name": "b"}});
        let (c, kept) = parse_tool_choice(Some(&choice), tools.clone()).unwrap();
        assert_eq!(c, ToolChoice::Required);
        assert_eq!(kept.len(), 1);
        assert!(parse_tool_choice(Some(&json!("sometimes")), tools).is_err());
    }

    #[test]
    fn json_value_found_with_its_end() {
        let (v, s, e) = json_at("x  {\"a\": 1} tail", 1).unwrap();
        assert_eq!(v, json!({"a": 1}));
        assert_eq!((s, e), (3, 11));
        assert!(json_at("{\"a\": ", 0).is_none());
    }
}
