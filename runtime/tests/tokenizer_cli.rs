//! `modelc tokenize` / `modelc detokenize` as a user runs them, on the fixture vocabulary
//! (`../shared/fixtures/models/llama-sep-F32.gguf`, SPM, BOS added) and SmolLM2.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn fixture() -> Option<PathBuf> {
    modelc_tests::shared("fixtures/models/llama-sep-F32.gguf")
}

fn modelc(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run modelc");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("modelc output")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn tokenize_prints_ids_on_one_line() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    // tokenize.json: "line one\nline two" -> 1 301 457 697 13 111 457 1023
    let o = modelc(&["tokenize", m, "-p", "line one\nline two"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o), "1 301 457 697 13 111 457 1023\n");
    let o = modelc(
        &["tokenize", m, "--no-bos", "-p", "line one\nline two"],
        None,
    );
    assert_eq!(stdout(&o), "301 457 697 13 111 457 1023\n");
}

#[test]
fn stdin_is_taken_exactly_including_the_trailing_newline() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    let with_nl = modelc(&["tokenize", m], Some(b"line one\n"));
    let without = modelc(&["tokenize", m], Some(b"line one"));
    assert!(with_nl.status.success());
    let (a, b) = (stdout(&with_nl), stdout(&without));
    let a: Vec<&str> = a.split_whitespace().collect();
    let b: Vec<&str> = b.split_whitespace().collect();
    assert_eq!(a.len(), b.len() + 1);
    assert_eq!(a.last(), Some(&"13"), "the newline is the last token");
}

#[test]
fn pieces_show_one_token_per_line() {
    let Some(m) = fixture() else { return };
    let o = modelc(
        &[
            "tokenize",
            m.to_str().unwrap(),
            "--pieces",
            "-p",
            "line one\nline",
        ],
        None,
    );
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1\t<s>");
    assert!(lines.contains(&"13\t\\n"), "{out}");
    assert!(lines.iter().all(|l| l
        .split_once('\t')
        .is_some_and(|(id, _)| id.parse::<u32>().is_ok())));
}

/// Input that is not UTF-8 is tokenized as llama.cpp tokenizes it, the same from standard
/// input, `-f` and `modelc run -f`, without a warning (`llama-tokenize -bf FILE --ids`:
/// this SPM vocabulary's `a FF 62` is `▁a` then the byte tokens of `FF 62`, which the lead
/// byte `FF` cuts as one symbol; SmolLM2's BPE decodes `C0 AF` as `/`, `ED A0 80` as U+D800).
#[test]
fn invalid_utf8_input_tokenizes_as_llama_cpp() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    let o = modelc(&["tokenize", m, "--no-bos"], Some(b"a\xffb"));
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(stdout(&o), "263 258 101\n");

    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let model = model.to_str().unwrap();
    let path = std::env::temp_dir().join(format!("modelc-bad-utf8-{}.txt", std::process::id()));
    std::fs::write(&path, b"x\xc0\xafy \xed\xa0\x80").unwrap();
    let f = path.to_str().unwrap();
    let tok = modelc(&["tokenize", model, "-f", f], None);
    let run = modelc(
        &["run", model, "-f", f, "-n", "1", "--temp", "0", "--json"],
        None,
    );
    let _ = std::fs::remove_file(&path);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let ids: Vec<String> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    assert_eq!(stdout(&tok), "104 31 105 48138 250 218\n");
    assert_eq!(stdout(&tok).trim(), ids.join(" "));
}

#[test]
fn detokenize_prints_the_text_exactly() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    let o = modelc(
        &["detokenize", m, "1", "301", "457,697", "13 111 457 1023"],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // llama.cpp strips the space prefix from the first token only, and BOS is that token
    assert_eq!(o.stdout, b"<s> line one\nline two");
    let o = modelc(&["detokenize", m, "301", "457", "697"], None);
    assert_eq!(o.stdout, b"line one");
    let o = modelc(
        &["detokenize", m, "--no-special", "1", "301", "457", "697"],
        None,
    );
    assert_eq!(o.stdout, b" line one");
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    for args in [
        vec!["detokenize", m, "5000"],
        vec!["detokenize", m, "-1"],
        vec!["detokenize", m, "abc"],
        vec!["tokenize", "/no/such/model.gguf", "-p", "x"],
        vec!["tokenize", env!("CARGO_MANIFEST_DIR"), "-p", "x"],
    ] {
        let o = modelc(&args, None);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("modelc: error: "), "{err}");
    }
}

/// Chat markers are parsed as their tokens by default, as llama-tokenize parses them;
/// `--no-parse-special` takes them as text.
#[test]
fn chat_markers_are_parsed_unless_no_parse_special() {
    let Some(m) = modelc_tests::smollm2() else {
        return;
    };
    let m = m.to_str().unwrap();
    let default = modelc(&["tokenize", m, "-p", "<|im_start|>user"], None);
    let special = modelc(
        &["tokenize", m, "--special", "-p", "<|im_start|>user"],
        None,
    );
    let plain = modelc(
        &[
            "tokenize",
            m,
            "--no-parse-special",
            "-p",
            "<|im_start|>user",
        ],
        None,
    );
    assert_eq!(stdout(&default), "1 4093\n");
    assert_eq!(stdout(&special), "1 4093\n");
    assert_ne!(stdout(&plain), stdout(&default));
    assert!(stdout(&plain).split(' ').count() > 2, "{}", stdout(&plain));
}

/// Generated tokens that end in an unfinished UTF-8 sequence: plain output writes its raw
/// bytes, as llama.cpp prints token pieces (SmolLM2's token 180 is the byte `E9`), where the
/// JSON content has U+FFFD.
#[test]
fn unfinished_utf8_tail_is_written_raw() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let model = model.to_str().unwrap();
    let args = [
        "run",
        model,
        "-p",
        "hi",
        "-n",
        "2",
        "--temp",
        "0",
        "--forced-tokens",
        "104 180",
    ];
    let o = modelc(&args, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"x\xe9");
    let mut json = args.to_vec();
    json.push("--json");
    let v: serde_json::Value = serde_json::from_slice(&modelc(&json, None).stdout).unwrap();
    assert_eq!(v["content"], "x\u{FFFD}");
}

/// llama.cpp's command-line rules: a flag given twice takes its last value, and a prompt
/// may begin with `-`.
#[test]
fn repeated_flags_take_the_last_value() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    let once = modelc(&["tokenize", m, "-p", "-line two"], None);
    let twice = modelc(&["tokenize", m, "-p", "line one", "-p", "-line two"], None);
    assert!(
        once.status.success(),
        "{}",
        String::from_utf8_lossy(&once.stderr)
    );
    assert!(
        twice.status.success(),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );
    assert_eq!(stdout(&once), stdout(&twice));
}
