//! Chat templates: the shared reference suite (`../shared/templates/`, Hugging Face
//! `apply_chat_template` outputs) byte for byte, plus the sandbox, errors and fallback.

use runtime::chat::{
    builtin_template, choose_template, ChatError, ChatTemplate, CivilTime, RenderLimits,
    RenderOptions, TemplateOrigin, CHATML_FALLBACK,
};
use serde_json::{json, Value};

mod common;
use std::path::PathBuf;

fn opts(add_generation_prompt: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt,
        now: Some(CivilTime::parse("2026-11-29T12:00:00").unwrap()),
        ..Default::default()
    }
}

/// Where two texts first differ, with a little context from each.
fn diff_summary(want: &str, got: &str) -> String {
    let at = want
        .bytes()
        .zip(got.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    // Back up to a char boundary in both.
    let mut at = at;
    while !(want.is_char_boundary(at) && got.is_char_boundary(at)) {
        at -= 1;
    }
    let from = want[..at]
        .char_indices()
        .rev()
        .nth(30)
        .map_or(0, |(i, _)| i);
    let snippet = |s: &str| {
        let end = s[at..]
            .char_indices()
            .nth(40)
            .map_or(s.len(), |(i, _)| at + i);
        format!("{:?}", &s[from..end])
    };
    format!(
        "lengths want {} got {}; first difference at byte {at}:\n      want {}\n      got  {}",
        want.len(),
        got.len(),
        snippet(want),
        snippet(got)
    )
}

#[test]
fn shared_template_suite_matches_reference() {
    let Some(dir) = modelc_tests::shared("templates") else {
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".expected.json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.expected.json in {}", dir.display());

    let (mut passed, mut failures) = (0usize, Vec::new());
    let mut max_fuel = 0u64;
    for file in &files {
        let reference: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let name = reference["template"].as_str().unwrap();
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        let bos = reference["bos_token"].as_str().unwrap();
        let eos = reference["eos_token"].as_str().unwrap();
        let now = CivilTime::parse(reference["strftime_now_date"].as_str().unwrap()).unwrap();
        let template = match ChatTemplate::new(&source, bos, eos) {
            Ok(t) => Some(t),
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                None
            }
        };
        for case in reference["cases"].as_array().unwrap() {
            let conversation = case["conversation"].as_str().unwrap();
            let add_gen = case["add_generation_prompt"].as_bool().unwrap();
            let label = format!("{name} [{conversation}, add_generation_prompt={add_gen}]");
            let Some(template) = &template else {
                continue;
            };
            let messages = reference["conversations"][conversation].as_array().unwrap();
            let options = RenderOptions {
                now: Some(now),
                ..opts(add_gen)
            };
            let got = template.render_measured(messages, &options);
            let want_ok = case["ok"].as_bool().unwrap();
            match (want_ok, got) {
                (true, Ok((text, fuel))) => {
                    max_fuel = max_fuel.max(fuel);
                    let want = case["output"].as_str().unwrap();
                    if text == want {
                        passed += 1;
                    } else {
                        failures.push(format!("{label}: {}", diff_summary(want, &text)));
                    }
                }
                (true, Err(e)) => {
                    failures.push(format!("{label}: error where reference renders: {e}"))
                }
                (false, Ok((text, _))) => failures.push(format!(
                    "{label}: rendered {} bytes where the reference fails with {}",
                    text.len(),
                    case["error"]
                )),
                (false, Err(e)) => {
                    // A template's own exception must come back with its own message.
                    let want_err = case["error"].as_str().unwrap_or_default();
                    match (want_err.strip_prefix("TemplateError: "), &e) {
                        (Some(msg), ChatError::Raised { message }) if message != msg => {
                            failures.push(format!("{label}: raised {message:?}, reference {msg:?}"))
                        }
                        (Some(msg), e @ (ChatError::Render(_) | ChatError::OutOfFuel { .. })) => {
                            failures.push(format!("{label}: {e}; reference raises {msg:?}"))
                        }
                        _ => passed += 1,
                    }
                }
            }
        }
    }
    let total = passed + failures.len();
    println!("chat template suite: {passed} of {total} cases match; most fuel used {max_fuel}");
    for f in &failures {
        println!("MISMATCH {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases differ (listed above)",
        failures.len()
    );
}

fn user(content: &str) -> Value {
    json!({"role": "user", "content": content})
}

#[test]
fn endless_loops_and_recursion_run_out_of_fuel() {
    let limits = RenderLimits {
        fuel: 200_000,
        ..Default::default()
    };
    let sources = [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        // Doubling a string 40 times would need a terabyte.
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s|length }}",
    ];
    for src in sources {
        let t = ChatTemplate::new(src, "", "").unwrap().with_limits(limits);
        let start = std::time::Instant::now();
        let err = t.render(&[user("hi")], &opts(true)).unwrap_err();
        assert!(
            matches!(err, ChatError::OutOfFuel { .. } | ChatError::Render(_)),
            "{src}: {err:?}"
        );
        assert!(
            start.elapsed().as_secs() < 5,
            "{src}: took {:?}",
            start.elapsed()
        );
    }
    // The default budget stops an endless loop too.
    let t = ChatTemplate::new(sources[0], "", "").unwrap();
    let err = t.render(&[user("hi")], &opts(true)).unwrap_err();
    assert!(matches!(err, ChatError::OutOfFuel { .. }), "{err:?}");
}

#[test]
fn huge_output_is_an_error() {
    let src = "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let err = t.render(&[user("hi")], &opts(true)).unwrap_err();
    assert!(
        matches!(err, ChatError::OutputTooLarge { limit } if limit == 1 << 20),
        "{err:?}"
    );
    // Under the limit it renders.
    let small = ChatTemplate::new(
        "{% for i in range(1000) %}{{ 'x' * 100 }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        small.render(&[user("hi")], &opts(true)).unwrap().len(),
        100_000
    );
}

#[test]
fn raising_template_gives_its_own_message() {
    let src = "{% if messages|length > 1 %}{{ raise_exception('Only ' ~ 1 ~ ' message, got ' \
               ~ messages|length) }}{% endif %}ok";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(t.render(&[user("a")], &opts(true)).unwrap(), "ok");
    let err = t.render(&[user("a"), user("b")], &opts(true)).unwrap_err();
    match err {
        ChatError::Raised { message } => assert_eq!(message, "Only 1 message, got 2"),
        other => panic!("expected Raised, got {other:?}"),
    }
    // Raised inside a macro and a loop, too.
    let nested = "{% macro check(m) %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}\
                  {% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}";
    let t = ChatTemplate::new(nested, "", "").unwrap();
    let err = t
        .render(&[json!({"role": "tool", "content": ""})], &opts(true))
        .unwrap_err();
    assert_eq!(err.to_string(), "no tools");
}

#[test]
fn no_file_access() {
    for src in [
        "{% include 'x.jinja' %}",
        "{% import '/etc/passwd' as p %}",
        "{% extends 'a' %}",
    ] {
        let err = ChatTemplate::new(src, "", "")
            .and_then(|t| t.render(&[user("hi")], &opts(true)))
            .unwrap_err();
        assert!(
            matches!(err, ChatError::Render(_) | ChatError::Syntax(_)),
            "{src}: {err:?}"
        );
    }
}

#[test]
fn fallback_is_chatml() {
    let (source, origin) = choose_template(None, None, &|_| None).unwrap();
    assert_eq!(origin, TemplateOrigin::Fallback);
    assert_eq!(source, CHATML_FALLBACK);
    let t = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
    let msgs = [
        json!({"role": "system", "content": "Be brief."}),
        user("Hi\nthere"),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}),
        json!({"role": "assistant", "content": null}),
    ];
    let want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n\
                <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n";
    assert_eq!(t.render(&msgs, &opts(false)).unwrap(), want);
    assert_eq!(
        t.render(&msgs, &opts(true)).unwrap(),
        format!("{want}<|im_start|>assistant\n")
    );
}

#[test]
fn hugging_face_context_and_filters() {
    let src = concat!(
        "{{ bos_token }}|{{ tools is defined }}|{{ tools is none }}|{{ strftime_now('%d %b %Y') }}|",
        "{{ messages[0] | tojson }}|{{ {'b': 1, 'a': [1.5, none]} | tojson(indent=2, sort_keys=true) }}|",
        "{{ 'x' | tojson(separators=(',', ':')) }}|{{ [true, none, \"it's\"] }}|",
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}",
        "{{ m.content.strip().split(' ')[-1].upper() }}{% endfor %}|",
        "{%- generation -%} gen {%- endgeneration %}|{{ enable_thinking }}|{{ eos_token }}",
    );
    let t = ChatTemplate::new(src, "<B>", "<E>").unwrap();
    let mut o = opts(true);
    o.extra.insert("enable_thinking".into(), json!(false));
    let out = t.render(&[user(" ça va? "), user("two")], &o).unwrap();
    let want = concat!(
        "<B>|False|False|29 Nov 2026|",
        r#"{"role": "user", "content": " ça va? "}|"#,
        "{\n  \"a\": [\n    1.5,\n    null\n  ],\n  \"b\": 1\n}|",
        r#""x"|[True, None, "it's"]|VA?|gen|False|<E>"#,
    );
    assert_eq!(out, want);
}

#[test]
fn bad_inputs_are_clean_errors() {
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(ChatError::Syntax(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[json!("just text")], &opts(true)),
        Err(ChatError::Input(_))
    ));
    let t = ChatTemplate::new("{{ 'a' + undefined_thing }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[user("x")], &opts(true)),
        Err(ChatError::Render(_))
    ));
}

#[test]
fn jinja2_semantics_minijinja_lacks() {
    // Jinja2's indent keeps a trailing newline; its `iterable` / `sequence` tests follow Python.
    let src = concat!(
        "[{{ '{\\n'|indent(4, first=true) }}]{{ 'a\\n\\nb'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|",
        "{{ none is iterable }}{{ 'ab' is iterable }}{{ 'ab' is sequence }}{{ {} is sequence }}|",
        "{{ 1e16 }} {{ 2.5 }} {{ {'k': [none, false]} }}",
    );
    let t = ChatTemplate::new(src, "", "").unwrap();
    let want = "[    {\n]a\n\n  b|a\n  \n  b|FalseTrueTrueTrue|1e+16 2.5 {'k': [None, False]}";
    assert_eq!(t.render(&[user("x")], &opts(true)).unwrap(), want);
}

#[test]
fn model_metadata_gives_template_and_special_texts() {
    use ir::gguf::{Array, GgufFile, GgufWriter, Value as Gv};
    use runtime::chat::template_for_model;
    let tokens: Vec<String> = ["<unk>", "<s>", "</s>", "hi"].map(String::from).to_vec();
    let build = |template: Option<&str>| {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", Gv::String("llama".into()));
        w.add_kv(
            "tokenizer.ggml.tokens",
            Gv::Array(Array::String(tokens.clone())),
        );
        w.add_kv("tokenizer.ggml.bos_token_id", Gv::U32(1));
        w.add_kv("tokenizer.ggml.eos_token_id", Gv::U32(2));
        if let Some(t) = template {
            w.add_kv("tokenizer.chat_template", Gv::String(t.into()));
            w.add_kv(
                "tokenizer.chat_template.rag",
                Gv::String("RAG{{ eos_token }}".into()),
            );
        }
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    };
    let file = build(Some(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
    ));
    let (t, origin) = template_for_model(&file, None, None).unwrap();
    assert_eq!(
        origin,
        TemplateOrigin::Metadata("tokenizer.chat_template".into())
    );
    assert_eq!(t.render(&[user("hi")], &opts(true)).unwrap(), "<s>hi</s>");
    let (t, _) = template_for_model(&file, None, Some("rag")).unwrap();
    assert_eq!(t.render(&[user("hi")], &opts(true)).unwrap(), "RAG</s>");
    assert!(template_for_model(&file, None, Some("tool_use")).is_err());
    let (t, origin) = template_for_model(&file, Some("[{{ bos_token }}]"), None).unwrap();
    assert_eq!(
        (t.render(&[], &opts(true)).unwrap().as_str(), origin),
        ("[<s>]", TemplateOrigin::User)
    );
    let (t, origin) = template_for_model(&build(None), None, None).unwrap();
    assert_eq!(origin, TemplateOrigin::Fallback);
    assert_eq!(
        t.render(&[user("hi")], &opts(true)).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// llama.cpp's rendered chat prompts in `../shared/reference/` (llama-server `/apply-template`):
/// SmolLM2's own template, and Gemma 3 (no template in its file) with the built-in `gemma`.
#[test]
fn llama_cpp_reference_chat_prompts() {
    for name in [
        "ref-SmolLM2-135M-Instruct.Q4_1.json",
        "ref-gemma-3-270m-q4_k_m.json",
    ] {
        let Some(path) = modelc_tests::shared(&format!("reference/{name}")) else {
            continue;
        };
        let reference: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let props = &reference["props"];
        let source = props["chat_template"].as_str().unwrap();
        let source = builtin_template(source).unwrap_or(source);
        let t = ChatTemplate::new(
            source,
            props["bos_token"].as_str().unwrap(),
            props["eos_token"].as_str().unwrap(),
        )
        .unwrap();
        let chat = reference["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == "chat")
            .unwrap();
        let messages = chat["messages"].as_array().unwrap();
        let want = chat["prompt"].as_str().unwrap();
        assert_eq!(t.render(messages, &opts(true)).unwrap(), want, "{name}");
    }
}

#[test]
fn gemma_builtin_merges_system_into_user() {
    let t = ChatTemplate::new(builtin_template("gemma").unwrap(), "<bos>", "<eos>").unwrap();
    let msgs = [
        json!({"role": "system", "content": " Be brief. "}),
        user("Hi "),
        json!({"role": "assistant", "content": "Hello"}),
        user("Bye"),
    ];
    let want = "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n\
                Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(t.render(&msgs, &opts(true)).unwrap(), want);
}

/// llama.cpp's built-in `llama3` and `command-r` formats, as its server test
/// `test_apply_chat_template` expects them (`tools/server/tests/unit/test_chat_completion.py`).
#[test]
fn llama3_and_command_r_builtins() {
    let msgs = [
        json!({"role": "system", "content": "You are a test."}),
        user("Hi there"),
    ];
    let render = |name: &str| {
        ChatTemplate::new(builtin_template(name).unwrap(), "<s>", "</s>")
            .unwrap()
            .render(&msgs, &opts(true))
            .unwrap()
    };
    assert_eq!(
        render("command-r"),
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    assert_eq!(
        render("llama3"),
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn template_command_prints_exactly_the_prompt() {
    use ir::gguf::{Array, GgufWriter, Value as Gv};
    let dir = std::env::temp_dir().join(format!("modelc-template-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Gv::String("llama".into()));
    let tokens = ["<s>", "</s>"].map(String::from).to_vec();
    w.add_kv("tokenizer.ggml.tokens", Gv::Array(Array::String(tokens)));
    w.add_kv("tokenizer.ggml.bos_token_id", Gv::U32(0));
    w.add_kv("tokenizer.ggml.eos_token_id", Gv::U32(1));
    let source =
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
                  {% if add_generation_prompt %}assistant:{% endif %}{{ strftime_now('%F') }}";
    w.add_kv("tokenizer.chat_template", Gv::String(source.into()));
    let model = dir.join("tiny.gguf");
    w.write_to_file(&model).unwrap();
    let messages = dir.join("messages.json");
    std::fs::write(&messages, r#"[{"role": "user", "content": "héllo\n"}]"#).unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_modelc"))
            .arg("template")
            .arg(&model)
            .arg("--messages")
            .arg(&messages)
            .args(["--now", "2026-11-29T12:00:00"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "<s>user: héllo\n\nassistant:2026-11-29"
    );
    let out = run(&["--no-generation-prompt", "--chat-template", "gemma"]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "<start_of_turn>user\nhéllo<end_of_turn>\n"
    );
    let out = run(&["--chat-template", "{{ raise_exception('no way') }}"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no way"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A template that writes `{{ bos_token }}` (Gemma's, Mistral-Nemo's) does not give two BOS
/// tokens when the tokenizer adds BOS itself: the leading BOS text is removed from the
/// render (llama.cpp's `common_chat_template_direct_apply` with `add_bos`), and a raw
/// prompt that starts with BOS text gets llama.cpp's double-BOS warning.
#[test]
fn bos_token_in_template_gives_one_bos() {
    let Some(model) = modelc_tests::gemma3() else {
        return;
    };
    let Some(tmpl) = modelc_tests::shared("templates/google-gemma-2-2b-it.jinja") else {
        return;
    };
    let gguf = ir::gguf::GgufFile::open(&model).unwrap();
    let vocab = runtime::tokenizer::Vocab::from_gguf(&gguf).unwrap();
    let source = std::fs::read_to_string(&tmpl).unwrap();
    let t = ChatTemplate::new(&source, "<bos>", "<eos>").unwrap();
    let msgs = [user("hi")];
    let text = t
        .render(&msgs, &RenderOptions::for_prompt(&vocab, true))
        .unwrap();
    assert!(text.starts_with("<start_of_turn>user\n"), "{text:?}");
    let ids = vocab.tokenize(&text, true, true);
    assert_eq!(&ids[..3], &[2, 105, 2364], "{ids:?}");
    assert!(vocab.double_bos_eos(&ids).is_empty());
    // Rendered for printing (not for the tokenizer), the text stays as the template wrote it.
    assert!(t
        .render(&msgs, &opts(true))
        .unwrap()
        .starts_with("<bos><start_of_turn>"));
    // A raw prompt with BOS text: two BOS, and a warning.
    let raw = vocab.tokenize("<bos>hi", true, true);
    assert_eq!(&raw[..2], &[2, 2]);
    assert_eq!(vocab.double_bos_eos(&raw).len(), 1);

    // End to end: `modelc run --chat` tokenizes the rendered prompt with one BOS.
    let v = common::json_output(
        common::modelc()
            .arg("run")
            .arg(&model)
            .args(["--chat", "-p", "hi", "-n", "1", "--temp", "0", "--json"])
            .arg("--chat-template-file")
            .arg(&tmpl),
    );
    let prompt: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(&prompt[..3], &[2, 105, 2364], "{prompt:?}");
}

/// An assistant message with tool calls and `"content": null` (the OpenAI shape) renders as
/// with empty content, as llama.cpp passes it, instead of failing inside the template
/// ("cannot perform a containment check"); an absent content likewise.
#[test]
fn null_content_renders_as_empty() {
    let Some(path) = modelc_tests::shared("templates/Qwen-Qwen3-0.6B.jinja") else {
        return;
    };
    let t = ChatTemplate::new(&std::fs::read_to_string(path).unwrap(), "", "<|im_end|>").unwrap();
    let call = json!([{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]);
    let conv = |content: Option<Value>| {
        let mut a = json!({"role": "assistant", "tool_calls": call});
        if let Some(c) = content {
            a["content"] = c;
        }
        vec![
            user("weather?"),
            a,
            json!({"role": "tool", "content": "sunny"}),
        ]
    };
    let want = t.render(&conv(Some(json!(""))), &opts(true)).unwrap();
    assert!(want.contains("<tool_call>"), "{want}");
    assert_eq!(
        t.render(&conv(Some(Value::Null)), &opts(true)).unwrap(),
        want
    );
    assert_eq!(t.render(&conv(None), &opts(true)).unwrap(), want);
}
