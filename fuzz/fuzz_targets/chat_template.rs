//! Fuzz target: random message lists rendered with the real chat templates of
//! `../shared/templates/` give a prompt or an error, never a panic or a render past the
//! limits. The first byte picks the template; the rest is cut into messages: a role byte,
//! then content (text, `null`, or absent with tool calls).

#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::chat::{ChatTemplate, RenderOptions};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/templates");
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .expect("shared/templates")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        paths.sort();
        paths
            .iter()
            .filter_map(|p| {
                let src = std::fs::read_to_string(p).ok()?;
                ChatTemplate::new(&src, "<s>", "</s>").ok()
            })
            .collect()
    })
}

fn messages(data: &[u8]) -> Vec<Value> {
    data.split(|&b| b == 0xFF)
        .filter(|c| !c.is_empty())
        .map(|chunk| {
            let role = ["system", "user", "assistant", "tool", "developer"][usize::from(chunk[0] % 5)];
            let text = String::from_utf8_lossy(&chunk[1..]).into_owned();
            match chunk[0] / 5 % 4 {
                0 => json!({"role": role, "content": text}),
                1 => json!({"role": role, "content": null, "tool_calls": [
                    {"type": "function", "function": {"name": text, "arguments": {"a": 1}}}]}),
                2 => json!({"role": role, "tool_calls": [
                    {"type": "function", "id": "abcdefghi", "function": {"name": "f", "arguments": text}}]}),
                _ => json!({"role": role, "content": [{"type": "text", "text": text}]}),
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let t = templates();
    let Some((&pick, rest)) = data.split_first() else { return };
    let tmpl = &t[usize::from(pick) % t.len()];
    let msgs = messages(rest);
    for add_generation_prompt in [false, true] {
        let opts = RenderOptions {
            add_generation_prompt,
            add_bos: pick & 1 == 1,
            ..Default::default()
        };
        let _ = tmpl.render(&msgs, &opts);
    }
});
