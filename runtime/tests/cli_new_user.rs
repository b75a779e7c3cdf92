//! The command line as a new user coming from llama.cpp meets it, in `modelc` and in a
//! compiled runner: generation stops when stdout's reader goes away; `--chat-template` is a
//! built-in name or Jinja text, nothing else; a `--chat-template-file` is read whenever it
//! is given; `modelc template` takes OpenAI content parts as the server does; llama.cpp's
//! common flags (`-ngl`, `--mlock`, `--no-display-prompt`, ...) are taken, noted or refused
//! with a reason; help and messages say what the commands do.
//!
//! Most tests run the tiny fixture model `fixtures/models/llama-sep-Q4_0.gguf` of
//! `../shared`; the content-parts test needs SmolLM2's template (`modelc_tests::smollm2`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

mod common;

use common::{model, modelc};

/// The tiny fixture model (a recorded skip when `../shared` lacks it).
fn fixture() -> Option<PathBuf> {
    modelc_tests::shared("fixtures/models/llama-sep-Q4_0.gguf")
}

/// A runner named `smol` for the fixture, compiled once with a 32-token context.
fn runner() -> Option<&'static Path> {
    static RUNNER: OnceLock<Option<PathBuf>> = OnceLock::new();
    let model = fixture()?;
    RUNNER
        .get_or_init(|| Some(common::compile_runner(&model, "cli_new_user", 32)))
        .as_deref()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts status 1 with exactly one stderr line, from `modelc` or the runner `smol`,
/// containing each of `want`.
fn assert_one_line_error(out: &Output, want: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("modelc: error: ") || err.starts_with("smol: error: "),
        "{err}"
    );
    for w in want {
        assert!(err.contains(w), "expected '{w}' in: {err}");
    }
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "failed: {}", stderr(out));
}

/// A model path that does not exist: flags checked before the model is opened fail first.
const NO_MODEL: &str = "/nonexistent/model.gguf";

/// Runs `cmd` with stdout a pipe whose reader is already gone and returns its exit status.
/// Generation that does not stop at the failed write runs forever here (`-n -1
/// --context-shift --ignore-eos`): the wait gives up after five minutes, far past the
/// fraction of a second the command needs, so that such a failure ends instead of hanging.
fn status_with_closed_stdout(cmd: &mut Command) -> Option<i32> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still generating five minutes after its reader went away");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Generation without end (`-n -1 --context-shift --ignore-eos`) stops at the first write
/// that fails because the reader is gone, with SIGPIPE's status 141, in `modelc run` and
/// in a runner (it used to generate on for ever).
#[test]
fn generation_stops_when_the_reader_goes_away() {
    let Some(fixture) = fixture() else { return };
    let endless = [
        "-p",
        "hi",
        "-n",
        "-1",
        "--context-shift",
        "--ignore-eos",
        "-t",
        "1",
    ];
    let mut run = modelc();
    run.arg("run")
        .arg(&fixture)
        .args(endless)
        .args(["-c", "32"]);
    assert_eq!(status_with_closed_stdout(&mut run), Some(141));
    if let Some(runner) = runner() {
        let mut cmd = Command::new(runner);
        cmd.args(endless);
        assert_eq!(status_with_closed_stdout(&mut cmd), Some(141));
    }
}

/// `--chat-template` that is neither Jinja text nor a built-in name is refused naming the
/// names (it used to become the prompt's template text); Jinja text is a template.
#[test]
fn unknown_chat_template_names_are_refused() {
    let out = modelc()
        .args([
            "run",
            NO_MODEL,
            "-p",
            "hi",
            "--chat",
            "--chat-template",
            "chatmll",
        ])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        &[
            "chatmll",
            "not supported",
            "chatml, gemma, llama3, command-r",
        ],
    );
    let Some(fixture) = fixture() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_new_user_names");
    std::fs::create_dir_all(&dir).unwrap();
    let messages = dir.join("m.json");
    std::fs::write(&messages, r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    let template = |value: &str| {
        modelc()
            .arg("template")
            .arg(&fixture)
            .arg("--messages")
            .arg(&messages)
            .args(["--chat-template", value])
            .output()
            .unwrap()
    };
    assert_one_line_error(&template("chatmll"), &["not supported"]);
    let out = template("{{ messages[0].content }}!");
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hi!");
    if let Some(runner) = runner() {
        let out = Command::new(runner)
            .args(["-p", "hi", "--chat", "--chat-template", "chatmll"])
            .output()
            .unwrap();
        assert_one_line_error(&out, &["not supported"]);
    }
}

/// A `--chat-template-file` is read, and its template compiled, whenever it is given, also
/// without `--chat` (a missing one used to be ignored).
#[test]
fn chat_template_files_are_read_without_chat() {
    let out = modelc()
        .args(["run", NO_MODEL, "-p", "hi"])
        .args(["--chat-template-file", "/nonexistent/t.jinja"])
        .output()
        .unwrap();
    assert_one_line_error(&out, &["--chat-template-file", "/nonexistent/t.jinja"]);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_new_user_files");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.jinja");
    std::fs::write(&bad, "{% for m in messages %}").unwrap();
    let out = modelc()
        .args(["run", NO_MODEL, "-p", "hi", "--chat-template-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_one_line_error(&out, &["--chat-template-file"]);
    if let Some(runner) = runner() {
        let out = Command::new(runner)
            .args(["-p", "hi", "--chat-template-file", "/nonexistent/t.jinja"])
            .output()
            .unwrap();
        assert_one_line_error(&out, &["--chat-template-file", "/nonexistent/t.jinja"]);
    }
}

/// `modelc template` joins OpenAI text parts as the server's `/apply-template` does: the
/// same prompt as the plain string (SmolLM2's template used to fail adding a string to a
/// list).
#[test]
fn template_takes_openai_content_parts() {
    let Some(model) = model() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_new_user_parts");
    std::fs::create_dir_all(&dir).unwrap();
    let render = |json: &str| {
        let path = dir.join("m.json");
        std::fs::write(&path, json).unwrap();
        modelc()
            .arg("template")
            .arg(&model)
            .arg("--messages")
            .arg(&path)
            .output()
            .unwrap()
    };
    let plain = render(r#"[{"role": "user", "content": "Hi\nthere"}]"#);
    assert_ok(&plain);
    let parts = render(
        r#"[{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]"#,
    );
    assert_ok(&parts);
    assert_eq!(parts.stdout, plain.stdout);
    let image = render(
        r#"[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]"#,
    );
    assert_one_line_error(&image, &["image input is not supported"]);
}

/// llama.cpp's common flags run unchanged: the text is the same as without them, `-ngl` on
/// the CPU is one note line, `--mlock` reads the model into memory (`-lm mlock`), and flags
/// for features modelc lacks are refused with the reason, naming the flag as typed.
#[test]
fn llama_cpp_common_flags_are_taken_noted_or_refused() {
    let Some(fixture) = fixture() else { return };
    let gen = [
        "-p",
        "Once upon a time",
        "-n",
        "4",
        "--temp",
        "0",
        "-t",
        "1",
    ];
    let flags = [
        "-ngl",
        "99",
        "--no-display-prompt",
        "--log-disable",
        "--mlock",
        "--no-warmup",
        "--color",
        "-co",
        "off",
        "-tb",
        "1",
        "--jinja",
        "--no-perf",
        "-nkvo",
    ];
    let plain = modelc()
        .arg("run")
        .arg(&fixture)
        .args(gen)
        .output()
        .unwrap();
    assert_ok(&plain);
    let out = modelc()
        .arg("run")
        .arg(&fixture)
        .args(gen)
        .args(flags)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(out.stdout, plain.stdout);
    let notes: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.starts_with("modelc: note: "))
        .map(str::to_string)
        .collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("-ngl 99") && notes[0].contains("nothing to offload"));
    assert!(notes[1].contains("-tb 1"));
    // `--mlock` is `-lm mlock`: the file is read into memory (a conversation's ready line
    // says how much).
    let ready = |extra: &[&str]| {
        let out = modelc()
            .arg("run")
            .arg(&fixture)
            .args(["-cnv", "-t", "1"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_ok(&out);
        stderr(&out)
    };
    assert!(ready(&["--mlock"]).contains("model file read into memory"));
    assert!(!ready(&[]).contains("model file read into memory"));
    for (args, want) in [
        (
            &["--lora", "a.gguf"][..],
            &["--lora", "LoRA adapters are not supported"][..],
        ),
        (&["-mm", "p.gguf"][..], &["-mm:", "multimodal"][..]),
        (
            &["-td", "2"][..],
            &["-td:", "speculative-decoding setting"][..],
        ),
        (&["-i"][..], &["-i:", "-cnv"][..]),
        (&["--rope-freq-base", "1e6"][..], &["RoPE overrides"][..]),
    ] {
        let out = modelc()
            .args(["run", NO_MODEL, "-p", "hi"])
            .args(args)
            .output()
            .unwrap();
        assert_one_line_error(&out, want);
    }
    let out = modelc()
        .args(["run", NO_MODEL, "-p", "hi", "-ngl", "many"])
        .output()
        .unwrap();
    assert_one_line_error(&out, &["-ngl", "auto or all"]);
    if let Some(runner) = runner() {
        let out = Command::new(runner)
            .args(gen)
            .args([
                "-ngl",
                "99",
                "--mlock",
                "--no-display-prompt",
                "--no-warmup",
            ])
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(out.stdout, plain.stdout);
        assert!(
            stderr(&out).contains("smol: note: -ngl 99"),
            "{}",
            stderr(&out)
        );
    }
}

/// Help and messages agree with what the commands do.
#[test]
fn help_and_messages_say_what_is_done() {
    // `modelc` alone: help on stderr and clap's status 2.
    let out = modelc().output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // Help without internal names, and the description of the program rather than of the
    // crate.
    let help = |args: &[&str]| {
        let out = modelc().args(args).output().unwrap();
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    assert!(
        !top.contains("The modelc runtime") && !top.contains("parse_graph"),
        "{top}"
    );
    let run = help(&["run", "--help"]);
    assert!(!run.contains("other targets can refuse"), "{run}");
    // `-n -1` does not shift unless --context-shift says so.
    assert!(!run.contains("unless --no-context-shift"), "{run}");
    assert!(run.contains("shifted with --context-shift"), "{run}");
    // perplexity's `-c`: 512 by default, 0 the training context.
    let ppl = help(&["perplexity", "--help"]);
    let c = ppl
        .split("--ctx-size")
        .nth(1)
        .and_then(|s| s.split("\n  -").next())
        .unwrap_or("");
    assert!(c.contains("[default: 512]") && !c.contains("4096"), "{c}");
    // A negative count names the range.
    let out = modelc()
        .args(["run", NO_MODEL, "-p", "hi", "-c", "-5"])
        .output()
        .unwrap();
    assert_one_line_error(&out, &["-5 is out of range", "from 0 up"]);
    assert!(!stderr(&out).contains("invalid digit"));

    let Some(fixture) = fixture() else { return };
    // `perplexity -c 5` uses 8, as its warning says, in every line after it.
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let out = modelc()
        .arg("perplexity")
        .arg(&fixture)
        .arg("-f")
        .arg(&text)
        .args(["-c", "5", "--chunks", "2", "-t", "1"])
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("using 8 instead of -c 5") && err.contains("chunks of 8"),
        "{err}"
    );
    // bench has no `-c` to warn about, whatever its sizes.
    let out = modelc()
        .arg("bench")
        .arg(&fixture)
        .args(["-p", "4", "-n", "4", "-r", "1", "-t", "1"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(!stderr(&out).contains("-c "), "{}", stderr(&out));
    // `--backend cuda` where there is no GPU says to run on the CPU, with `run`'s flag.
    let out = modelc()
        .arg("run")
        .arg(&fixture)
        .args(["-p", "hi", "-n", "1", "--backend", "cuda"])
        .output()
        .unwrap();
    if !out.status.success() && stderr(&out).contains("no NVIDIA") {
        assert_one_line_error(&out, &["--backend cuda", "--backend cpu"]);
        assert!(!stderr(&out).contains("modelc compile"), "{}", stderr(&out));
    }
    // A runner's warnings carry its own name.
    if let Some(runner) = runner() {
        let out = Command::new(runner)
            .args(["-p", "hi", "-n", "100", "--ignore-eos", "-t", "1"])
            .output()
            .unwrap();
        assert_ok(&out);
        let err = stderr(&out);
        assert!(
            err.contains("smol: warning: the context (32 tokens) is full"),
            "{err}"
        );
        assert!(!err.contains("modelc:"), "{err}");
    }
}
