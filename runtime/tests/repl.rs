//! `modelc repl` and a runner's `-cnv`, piped (no terminal): answers on stdout one per turn,
//! command replies on stderr, no escape codes; each turn evaluates only the new tokens;
//! `/regen`, `/clear`, `/save` and `/load` keep or restore the conversation.

mod common;

use common::{model, modelc};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const FLAGS: [&str; 8] = ["--temp", "0", "-n", "24", "-c", "512", "-t", "2"];
const FIRST: &str = "Hello, who are you?";
const SECOND: &str = "What is 2+2?";

/// Runs `cmd` with `input` on stdin.
fn piped(mut cmd: Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("writes");
    let out = child.wait_with_output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("UTF-8")
}

fn repl(m: &Path) -> Command {
    let mut c = modelc();
    c.arg("repl").arg(m).args(FLAGS);
    c
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("repl");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

#[test]
fn piped_conversation_reuses_the_cache_and_matches_the_runner() {
    let Some(m) = model() else { return };
    let input = format!("{FIRST}\n/stats\n{SECOND}\n/stats\n/regen\n/clear\n{FIRST}\n");
    let out = piped(repl(&m), &input);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !stdout.contains('\x1b') && !stderr.contains('\x1b'),
        "escape codes in piped output"
    );
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), 4, "{stdout}");

    // The first answer is the runner's `--chat` answer to the same message.
    let runner = tmp("smol");
    let c = modelc()
        .arg("compile")
        .arg(&m)
        .arg("-o")
        .arg(&runner)
        .args(["-c", "512"])
        .output()
        .expect("compiles");
    assert!(c.status.success(), "{}", text(&c.stderr));
    let chat = Command::new(&runner)
        .args(["--chat", "-p", FIRST])
        .args(FLAGS)
        .output()
        .expect("runs");
    assert_eq!(answers[0], text(&chat.stdout).trim_end(), "{stderr}");
    // After /clear the same message gets the same answer (a fresh evaluation).
    assert_eq!(answers[3], answers[0]);
    assert!(!answers[1].is_empty() && !answers[2].is_empty());

    // The second turn evaluated only what the first did not leave in the cache.
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("last turn"))
        .collect();
    assert_eq!(stats.len(), 2, "{stderr}");
    let numbers = |l: &str| -> (usize, usize) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let evaluated = w[2].parse().expect("evaluated");
        let reused = w[6].trim_start_matches('(').parse().expect("reused");
        (evaluated, reused)
    };
    let (e1, r1) = numbers(stats[0]);
    let (e2, r2) = numbers(stats[1]);
    assert_eq!(r1, 0, "{}", stats[0]);
    assert!(r2 >= e1 + 20 && e2 < 30, "second turn: {}", stats[1]);

    // The runner's conversation mode is the same loop.
    let cnv = piped(
        {
            let mut c = Command::new(&runner);
            c.arg("-cnv").args(FLAGS);
            c
        },
        &format!("{FIRST}\n"),
    );
    assert_eq!(text(&cnv.stdout).trim_end(), answers[0]);
}

#[test]
fn saved_conversation_loads_and_continues() {
    let Some(m) = model() else { return };
    let file = tmp("conversation.json");
    let _ = std::fs::remove_file(&file);
    let input = format!("{FIRST}\n/save {}\n{SECOND}\n", file.display());
    let out = piped(repl(&m), &input);
    let original: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(original.len(), 2);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("saved")).expect("JSON");
    assert_eq!(saved["messages"][0]["role"], "user");
    assert_eq!(saved["messages"][1]["role"], "assistant");
    assert_eq!(saved["messages"][1]["content"], original[0].as_str());

    let out = piped(repl(&m), &format!("/load {}\n{SECOND}\n", file.display()));
    assert_eq!(text(&out.stdout).trim_end(), original[1]);

    // Multi-line blocks are one message; bad commands are one line on stderr.
    // A failed /save keeps the conversation going; a block holding a command is a message.
    let out = piped(
        repl(&m),
        "/set temp x\n/set temp nan\n/load /nonexistent.json\n/save /tmp\n/save\n\"\"\"\nSay hi\nin one word\n\"\"\"\n\"\"\"\n/stats\n\"\"\"\n",
    );
    let err = text(&out.stderr);
    assert!(err.contains("[/set: 'x' is not a number]"), "{err}");
    assert!(
        err.contains("[/set: 'nan' is not a finite number]"),
        "{err}"
    );
    assert!(err.contains("[/load: reading /nonexistent.json"), "{err}");
    assert!(err.contains("[/save: /tmp is a directory"), "{err}");
    assert!(err.contains("[/save: needs a file name]"), "{err}");
    assert!(
        !err.contains("last turn"),
        "a block ran as a command: {err}"
    );
    assert_eq!(text(&out.stdout).lines().count(), 2);
}

/// Under a pseudo-terminal (python3's `pty`, as a person at a terminal): Ctrl-C stops a long
/// answer within 100 ms and keeps the conversation, the next message is answered, and two
/// Ctrl-Cs at an empty prompt exit with status 130.
#[test]
fn ctrl_c_under_a_terminal() {
    let Some(m) = model() else { return };
    let script = r#"
import os, pty, select, sys, time
exe, model = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(exe, [exe, "repl", model, "--temp", "0", "-n", "2000", "--ignore-eos",
                   "-c", "2048", "-t", "2"])
buf = b""
def until(pat, timeout):
    global buf
    end = time.time() + timeout
    while pat not in buf:
        r, _, _ = select.select([fd], [], [], max(0.0, end - time.time()))
        if not r:
            sys.exit("timeout waiting for %r; got %r" % (pat, buf[-400:]))
        try:
            buf += os.read(fd, 4096)
        except OSError:
            sys.exit("end of output waiting for %r; got %r" % (pat, buf[-400:]))
until(b"> ", 120)
buf = b""
os.write(fd, b"Tell me a long story about a dragon.\r")
# The echo of the line, then answer text.
while len(buf) < 160:
    r, _, _ = select.select([fd], [], [], 30)
    if not r:
        sys.exit("no answer text")
    buf += os.read(fd, 4096)
t0 = time.time()
os.write(fd, b"\x03")
until(b"[interrupted]", 5)
print("interrupt_ms %.1f" % ((time.time() - t0) * 1000))
until(b"> ", 10)
buf = b""
os.write(fd, b"/set n_predict 8\r")
until(b"> ", 10)
buf = b""
os.write(fd, b"Say hello.\r")
until(b"> ", 60)
print("answered %d" % len(buf))
os.write(fd, b"\x03")
until(b"again to exit", 5)
os.write(fd, b"\x03")
_, status = os.waitpid(pid, 0)
print("exit %d" % os.waitstatus_to_exitcode(status))
"#;
    let out = Command::new("python3")
        .args(["-c", script, env!("CARGO_BIN_EXE_modelc")])
        .arg(&m)
        .output()
        .expect("python3 runs");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ms: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("interrupt_ms "))
        .expect("interrupt time")
        .parse()
        .expect("number");
    eprintln!("Ctrl-C stopped the answer in {ms:.1} ms");
    assert!(ms < 100.0, "Ctrl-C took {ms} ms");
    assert!(stdout.contains("answered "), "{stdout}");
    assert!(stdout.contains("exit 130"), "{stdout}");
}

/// A conversation longer than the context keeps answering: the oldest messages are dropped
/// (the system prompt stays), and an answer that fills the context shifts it.
#[test]
fn full_context_shifts_instead_of_failing() {
    let Some(m) = model() else { return };
    let mut cmd = modelc();
    cmd.arg("repl")
        .arg(&m)
        .args(["--temp", "0", "-n", "48", "-c", "160", "-t", "2"])
        .args(["--system", "You are a terse assistant."]);
    let questions = [
        "Name a color.",
        "Name a fruit.",
        "Name an animal.",
        "Name a city.",
        "Name a planet.",
        "Name a tree.",
    ];
    let out = piped(cmd, &format!("{}\n/stats\n", questions.join("\n")));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        stdout.lines().count(),
        questions.len(),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("oldest messages were dropped"),
        "no shift reported: {stderr}"
    );
    let used = stderr
        .lines()
        .find_map(|l| l.strip_prefix("context: "))
        .expect("/stats context line");
    assert!(used.ends_with("/ 160 tokens"), "{used}");

    // Within one generation: -n past the context stops with a warning by default (as
    // llama-completion at 0c1e570), or shifts with --context-shift.
    let gen = [
        "-p",
        "Once upon a time",
        "-n",
        "200",
        "--temp",
        "0",
        "--ignore-eos",
    ];
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args(gen)
        .args(["-c", "96", "--json", "--context-shift"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["tokens"].as_array().map(Vec::len), Some(200));
    assert!(v["n_discarded"].as_u64().unwrap_or(0) > 0, "{v}");
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args(gen)
        .args(["-c", "96"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("is full; generation stopped"));
}

/// Greedy text across a context shift equals llama-completion's (`--context-shift -c 256`,
/// 330 tokens: one shift of 127 positions, 80 tokens after it), recorded in
/// `tests/data/context_shift_llama_cpp.json`.
#[test]
fn context_shift_text_equals_llama_cpp() {
    let Some(m) = model() else { return };
    let data =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/context_shift_llama_cpp.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&data).expect("reference")).expect("JSON");
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args(["-p", r["prompt"].as_str().expect("prompt")])
        .args(["-n", "330", "-c", "256", "--temp", "0", "-t", "2"])
        .args(["--context-shift", "--ignore-eos", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["n_discarded"], 127, "one shift of 127 positions");
    assert_eq!(
        v["content"]
            .as_str()
            .expect("content")
            .trim_end_matches('\n'),
        r["text"].as_str().expect("text")
    );
}
