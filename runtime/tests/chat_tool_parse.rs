//! Tool calls and reasoning read back from a model's text (`runtime::chat::tools`,
//! `runtime::chat::reply`), against llama.cpp's own parser cases (`tests/test-chat.cpp`,
//! as data in `data/chat_parser_llama_cpp.json`): for each template of the shared suite,
//! the format detected from its source reads each input into the message llama.cpp
//! expects; the format's grammar accepts the part of the input from its trigger on (the
//! whole input for a grammar that is not lazy), as llama.cpp's test checks.

use runtime::chat::reply::{thinking_forced_open, ReasoningFormat, ReplyParser};
use runtime::chat::tools::{self, CallOptions, ToolCall};
use runtime::chat::{ChatTemplate, RenderOptions};
use runtime::grammar::{Grammar, Matcher, Rules, TokenTable, Trigger, Triggers};
use serde_json::{json, Value};
use std::sync::Arc;

mod common;

fn data() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/chat_parser_llama_cpp.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Whether the grammar accepts `text` whole.
fn grammar_accepts(gbnf: &str, text: &str) -> bool {
    let g = Grammar::parse(gbnf, None).unwrap_or_else(|e| panic!("{e}\n{gbnf}"));
    let rules = Arc::new(Rules::new(
        &g,
        Arc::new(TokenTable::from_pieces(Vec::new())),
    ));
    let mut m = Matcher::new(rules);
    text.chars()
        .all(|c| m.accept_str(c.encode_utf8(&mut [0; 4])))
        && m.can_end()
}

#[test]
fn llama_cpp_parser_cases() {
    let Some(dir) = modelc_tests::shared("templates") else {
        return;
    };
    let d = data();
    let mut failures = Vec::new();
    let cases = d["cases"].as_array().unwrap();
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let format = tools::detect(&src);
        let tool_list = tools::parse_tools(&case["tools"]).unwrap();
        let reasoning = ReasoningFormat::parse(case["reasoning_format"].as_str().unwrap()).unwrap();
        // Whether the template opens the thoughts itself: its prompt for one user message.
        let tmpl = ChatTemplate::new(&src, "<s>", "</s>").unwrap();
        let mut opts = RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        if !tool_list.is_empty() {
            opts.tools = Some(case["tools"].clone());
        }
        let prompt = tmpl
            .render(&[json!({"role": "user", "content": "Hey"})], &opts)
            .unwrap_or_default();
        let parser = ReplyParser {
            tools: (!tool_list.is_empty() || format.always()).then_some(format),
            reasoning,
            forced_open: thinking_forced_open(&prompt),
        };
        let input = case["input"].as_str().unwrap();
        let got = parser.parse(input, false);
        let e = &case["expect"];
        let want_calls: Vec<ToolCall> = e["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| ToolCall {
                name: c["name"].as_str().unwrap().into(),
                arguments: c["arguments"].as_str().unwrap().into(),
                id: c["id"].as_str().unwrap().into(),
            })
            .collect();
        let args = |c: &ToolCall| serde_json::from_str::<Value>(&c.arguments).ok();
        let calls_equal = got.tool_calls.len() == want_calls.len()
            && got.tool_calls.iter().zip(&want_calls).all(|(g, w)| {
                g.name == w.name && g.id == w.id && args(g).is_some() && args(g) == args(w)
            });
        if got.content != e["content"]
            || got.reasoning_content != e["reasoning_content"]
            || !calls_equal
        {
            failures.push(format!(
                "case {i} ({name}, {} format, line {}): {input:?}\n  got {got:?}\n  want {e}",
                format.name(),
                case["test_chat_line"]
            ));
            continue;
        }
        // The grammar accepts the call: from the trigger on, or all of it.
        if !want_calls.is_empty() {
            let g = format
                .grammar(
                    &tool_list,
                    CallOptions {
                        parallel: false,
                        required: false,
                    },
                )
                .unwrap();
            let after_reasoning = input.rfind("</think>").map_or(0, |p| p + "</think>".len());
            let text = &input[after_reasoning..];
            let from = if g.lazy {
                let words: Vec<Trigger> = g.triggers.clone();
                Triggers::new(&words).unwrap().find(text)
            } else {
                Some(0)
            };
            match from {
                Some(at) if grammar_accepts(&g.gbnf, &text[at..]) => {}
                _ => failures.push(format!(
                    "case {i} ({name}): the grammar does not accept {:?} (trigger at {from:?})\n{}",
                    text, g.gbnf
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert!(cases.len() >= 18);
}

/// Formats read partial output so that it only grows: text that may start a call is held
/// back, and a call appears once it is complete.
#[test]
fn partial_reads_only_grow() {
    let Some(dir) = modelc_tests::shared("templates") else {
        return;
    };
    let d = data();
    for case in d["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let format = tools::detect(&src);
        let tool_list = tools::parse_tools(&case["tools"]).unwrap();
        let parser = ReplyParser {
            tools: (!tool_list.is_empty() || format.always()).then_some(format),
            reasoning: ReasoningFormat::parse(case["reasoning_format"].as_str().unwrap()).unwrap(),
            forced_open: name.contains("DeepSeek-R1"),
        };
        let input = case["input"].as_str().unwrap();
        let mut prev = parser.parse("", true);
        let ends: Vec<usize> = input
            .char_indices()
            .map(|(i, _)| i)
            .skip(1)
            .chain([input.len()])
            .collect();
        for end in ends {
            let partial = end < input.len();
            let now = parser.parse(&input[..end], partial);
            assert!(
                now.content.starts_with(&prev.content),
                "{name}: content shrank at {end}: {prev:?} -> {now:?}"
            );
            assert!(
                now.reasoning_content.starts_with(&prev.reasoning_content),
                "{name}: reasoning shrank at {end}: {prev:?} -> {now:?}"
            );
            assert!(now.tool_calls.len() >= prev.tool_calls.len());
            assert_eq!(
                &now.tool_calls[..prev.tool_calls.len()],
                &prev.tool_calls[..]
            );
            prev = now;
        }
    }
}
