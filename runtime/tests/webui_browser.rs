//! The chat page (`runtime/src/server/webui/`) in a real browser: Debian's headless
//! `chromium` driven over WebDriver (plain HTTP to `chromedriver`, installed by
//! `scripts/fetch-chromium`) against `modelc serve` on SmolLM2 Q4_1.
//!
//! - The page loads with no console error, and every request it makes stays on the server
//!   (Chrome's performance log lists them all).
//! - A message typed and sent with Enter at temperature 0 (set in the page's settings)
//!   streams an answer equal to `/v1/chat/completions`' answer to the very body the page
//!   sent (read back from the performance log), with `stream` turned off.
//! - A reload keeps the conversation; screenshots at desktop and phone width, light and
//!   dark, go to `target/tmp/webui/`.
//! - Under `--api-prefix /v1x`, the page and its API live under the prefix; Stop during a
//!   long answer leaves the slot idle (`/slots`).
//! - `--no-ui`: `/` is llama-server's 404 `File Not Found`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a page may take to do one thing (load, answer, stop) before the test fails.
const PATIENCE: Duration = Duration::from_secs(180);

/// A response: status, head and body.
struct Resp {
    status: u16,
    head: String,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request (`Connection: close`) to 127.0.0.1:`port`; the whole response.
fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let body = body.map_or(String::new(), Value::to_string);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    // chromedriver keeps the connection open whatever the request says: read the head,
    // then `Content-Length` bytes (or to the end: chunked and unsized bodies).
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).expect("read") > 0,
            "{method} {path}: no answer"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok());
    let mut raw = Vec::new();
    match length {
        Some(n) => {
            raw.resize(n, 0);
            r.read_exact(&mut raw).expect("read");
        }
        None => {
            r.read_to_end(&mut raw).expect("read");
        }
    }
    let body = String::from_utf8_lossy(&raw).into_owned();
    let body = if lower.contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    };
    Resp { status, head, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `modelc serve MODEL --port 0 ARGS`, ready (`/health` under `prefix` answers 200).
fn serve(model: &Path, args: &[&str], prefix: &str) -> (Proc, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("serve")
        .arg(model)
        .args(["--port", "0", "-t", "1", "-c", "2048", "--slots"])
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start modelc serve");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let child = Proc(child);
    let mut line = String::new();
    let port = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("stderr") > 0,
            "serve exited before listening"
        );
        if let Some(rest) = line.split("http://").nth(1) {
            break rest
                .split(|c: char| !c.is_ascii_digit() && c != ':' && c != '.')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a port");
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    let t0 = Instant::now();
    while request(port, "GET", &format!("{prefix}/health"), None).status != 200 {
        assert!(t0.elapsed() < PATIENCE, "the server is not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// A headless Chromium session over WebDriver.
struct Browser {
    port: u16,
    session: String,
    _driver: Proc,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = request(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Browser {
    /// Starts `driver` and a Chromium with the flags of a machine without a network and
    /// a fresh profile, logging the console and the network.
    fn start(driver: &Path, chromium: &Path) -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("addr").port()
        };
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Proc(child);
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < PATIENCE, "chromedriver does not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile =
            std::env::temp_dir().join(format!("modelc-webui-{}-{}", std::process::id(), port));
        let _ = std::fs::remove_dir_all(&profile);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "prefs": {
                    "download.default_directory": profile.join("downloads"),
                    "download.prompt_for_download": false,
                },
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL", "performance": "ALL"},
        }}});
        let r = request(port, "POST", "/session", Some(&caps));
        assert_eq!(r.status, 200, "new session: {}", r.body);
        let session = r.json()["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        let b = Browser {
            port,
            session,
            _driver: driver,
            profile,
        };
        // What the new tab page did before the test's page is not the page's doing.
        b.go("about:blank");
        b.log("performance");
        b.log("browser");
        b
    }

    /// A WebDriver command; its `value`.
    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let r = request(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            Some(&body.unwrap_or_else(|| json!({}))),
        );
        assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        r.json()["value"].take()
    }

    fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page.
    fn js(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Waits until `script` returns something truthy; returns it.
    fn wait(&self, what: &str, script: &str) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.js(script, json!([]));
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            assert!(t0.elapsed() < PATIENCE, "waited too long for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn element(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("an element id")
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.cmd("POST", &format!("/element/{e}/click"), None);
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.cmd("POST", &format!("/element/{e}/clear"), None);
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// The log entries of `kind` (`browser`, `performance`) since the last call.
    fn log(&self, kind: &str) -> Vec<Value> {
        let v = self.cmd("POST", "/se/log", Some(json!({ "type": kind })));
        v.as_array().cloned().unwrap_or_default()
    }

    /// Waits until `dir` holds a finished download; its path.
    fn wait_for_file(&self, dir: &Path) -> PathBuf {
        let t0 = Instant::now();
        loop {
            let done = std::fs::read_dir(dir).ok().and_then(|mut d| {
                d.find_map(|e| {
                    let p = e.ok()?.path();
                    let name = p.file_name()?.to_str()?.to_string();
                    (!name.ends_with(".crdownload") && !name.starts_with('.')).then_some(p)
                })
            });
            if let Some(p) = done {
                return p;
            }
            assert!(t0.elapsed() < PATIENCE, "no download in {}", dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn screenshot(&self, file: &Path) {
        let v = self.cmd("GET", "/screenshot", None);
        let png = base64(v.as_str().expect("base64"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(file, png).expect("write the screenshot");
    }

    fn window(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        );
    }

    /// Chrome's `prefers-color-scheme` (DevTools' media emulation).
    fn color_scheme(&self, scheme: &str) {
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": {
                "features": [{"name": "prefers-color-scheme", "value": scheme}]}})),
        );
    }
}

fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .map(val)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for q in digits.chunks(4) {
        let n = q
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..q.len()]);
    }
    out
}

/// Console errors (level SEVERE) in `entries`.
fn console_errors(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e["level"] == "SEVERE")
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The requests in performance-log `entries`: (URL, method, body).
fn requests(entries: &[Value]) -> Vec<(String, String, Option<String>)> {
    entries
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e["message"].as_str()?).ok())
        .filter(|m| m["message"]["method"] == "Network.requestWillBeSent")
        .map(|m| {
            let r = &m["message"]["params"]["request"];
            (
                r["url"].as_str().unwrap_or_default().to_string(),
                r["method"].as_str().unwrap_or_default().to_string(),
                r["postData"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Fails on a request to anywhere but the server (`data:` and `blob:` URLs are local).
fn assert_local(reqs: &[(String, String, Option<String>)], port: u16) {
    let origin = format!("http://127.0.0.1:{port}/");
    for (url, ..) in reqs {
        assert!(
            url.starts_with(&origin) || url.starts_with("data:") || url.starts_with("blob:"),
            "a request left the server: {url}"
        );
    }
}

/// Script lines setting `c` to the conversation the page shows, as it keeps it
/// (`localStorage`).
const CONV: &str = "const all = JSON.parse(localStorage.getItem('modelc.conversations') || '[]');
    const id = JSON.parse(localStorage.getItem('modelc.current'));
    const c = all.find((c) => c.id === id);";

/// The messages of the conversation the page shows, as it keeps them.
fn stored(b: &Browser) -> Value {
    b.js(&format!("{CONV} return c ? c.messages : null;"), json!([]))
}

/// Messages as OpenAI's `{"role", "content"}` (without the page's speed line).
fn texts(messages: &Value) -> Value {
    let list = messages.as_array().expect("messages");
    Value::Array(
        list.iter()
            .map(|m| json!({"role": m["role"], "content": m["content"]}))
            .collect(),
    )
}

/// Whether an answer is streaming (the Stop button shows): a script expression.
const BUSY: &str = "!document.getElementById('stop').hidden";

fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui");
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir
}

struct Setup {
    model: PathBuf,
    driver: PathBuf,
    chromium: PathBuf,
}

fn setup() -> Option<Setup> {
    let model = modelc_tests::smollm2()?;
    let how = "scripts/fetch-chromium installs Debian's chromium and chromium-driver";
    let driver = on_path(&["chromedriver"]).unwrap_or_else(|| "/usr/bin/chromedriver".into());
    let driver = modelc_tests::require(driver, how)?;
    let chromium =
        on_path(&["chromium", "chromium-browser"]).unwrap_or_else(|| "/usr/bin/chromium".into());
    let chromium = modelc_tests::require(chromium, how)?;
    Some(Setup {
        model,
        driver,
        chromium,
    })
}

/// Load, settings, Enter, the streamed answer against the API's, reload, screenshots.
#[test]
fn chat_in_browser() {
    let Some(s) = setup() else { return };
    let (_srv, port) = serve(&s.model, &[], "");
    let b = Browser::start(&s.driver, &s.chromium);
    b.go(&format!("http://127.0.0.1:{port}/"));
    let info = b.wait(
        "the model's name",
        "return document.getElementById('model-info').textContent;",
    );
    assert!(
        info.as_str().is_some_and(|i| i.contains("ctx 2048")),
        "{info}"
    );

    // Temperature 0 and a bound on the answer, through the settings dialog.
    b.click("#open-settings");
    b.type_into("input[name=temperature]", "0");
    b.type_into("input[name=max_tokens]", "64");
    b.click("#settings-save");
    b.wait(
        "the settings to close",
        "return !document.getElementById('settings').open;",
    );

    b.type_into(
        "#input",
        "What is the capital of France? Answer in one sentence.\u{E007}",
    );
    b.wait(
        "the answer",
        &format!("{CONV} return c && c.messages.length === 2 && !({BUSY});"),
    );
    let kept = stored(&b);
    let answer = kept[1]["content"].as_str().expect("an answer").to_string();
    assert_eq!(
        kept[0],
        json!({"role": "user", "content": "What is the capital of France? Answer in one sentence."})
    );
    assert!(!answer.is_empty());

    let perf = b.log("performance");
    let reqs = requests(&perf);
    assert_local(&reqs, port);
    let sent: Vec<&String> = reqs
        .iter()
        .filter(|(u, m, _)| u.ends_with("/v1/chat/completions") && m == "POST")
        .filter_map(|(_, _, body)| body.as_ref())
        .collect();
    assert_eq!(sent.len(), 1, "{reqs:?}");
    let mut body: Value = serde_json::from_str(sent[0]).expect("the page sends JSON");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["temperature"], 0, "{body}");
    assert_eq!(body["max_tokens"], 64, "{body}");
    body["stream"] = json!(false);
    let whole = request(port, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert_eq!(
        answer,
        whole.json()["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );

    // What the page shows is the answer rendered: the same words.
    let shown = b.js(
        "const m = document.querySelectorAll('.msg.assistant .body'); return m[m.length - 1].textContent;",
        json!([]),
    );
    let words = |t: &str| {
        t.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(words(shown.as_str().expect("text")), words(&answer));
    // And the speed, from the answer's `timings`.
    let speed = b.js(
        "return document.querySelector('.msg.assistant .stats').textContent;",
        json!([]),
    );
    assert!(speed.as_str().is_some_and(|s| s.contains("t/s")), "{speed}");

    // A reload keeps the conversation.
    b.cmd("POST", "/refresh", None);
    b.wait(
        "the page after a reload",
        "return document.getElementById('model-info').textContent;",
    );
    assert_eq!(stored(&b), kept);
    let n = b.js(
        "return document.querySelectorAll('.msg').length;",
        json!([]),
    );
    assert_eq!(n, 2);
    let shown_again = b.js(
        "const m = document.querySelectorAll('.msg.assistant .body'); return m[m.length - 1].textContent;",
        json!([]),
    );
    assert_eq!(shown_again, shown);

    // Regenerate: at temperature 0, the same answer again.
    b.click(".msg.assistant button[title^=Answer]");
    b.wait(
        "the answer again",
        &format!("{CONV} return c && c.messages.length === 2 && !({BUSY});"),
    );
    assert_eq!(texts(&stored(&b)), texts(&kept));

    // Export writes `modelc repl`'s /save format: /load reads it back.
    b.click("#export");
    let downloads = b.profile.join("downloads");
    let file = b.wait_for_file(&downloads);
    let exported = runtime::repl::load(&file).expect("/load reads the export");
    assert_eq!(Value::Array(exported), texts(&kept));

    // Edit and resend the last user message: one question, one new answer.
    b.click(".msg.user button[title^=Edit]");
    b.type_into(
        ".msg.user textarea.edit",
        "Write a Python function that adds two numbers.\u{E007}",
    );
    b.wait(
        "the edited question's answer",
        &format!("{CONV} return c && c.messages[0].content.includes('Python') && c.messages.length === 2 && !({BUSY});"),
    );
    let edited = stored(&b);
    assert_eq!(
        edited[0]["content"],
        "Write a Python function that adds two numbers."
    );
    assert_ne!(edited[1], kept[1]);
    // Its code block is rendered as one, with the fence's text inside.
    let code = b.js(
        "return document.querySelector('.msg.assistant .code code').textContent;",
        json!([]),
    );
    let code = code.as_str().expect("a code block");
    assert!(
        !code.is_empty()
            && edited[1]["content"]
                .as_str()
                .is_some_and(|t| t.contains(code)),
        "{code:?}"
    );

    // A conversation saved by `modelc repl`'s /save imports as a new one, system prompt
    // included.
    let saved = downloads.join("saved.json");
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi"}),
        json!({"role": "assistant", "content": "Hello! **How** can I help?"}),
    ];
    runtime::repl::save(&saved, &messages).expect("save");
    let input = b.element("#import");
    b.cmd(
        "POST",
        &format!("/element/{input}/value"),
        Some(json!({"text": saved.display().to_string()})),
    );
    b.wait(
        "the imported conversation",
        &format!("{CONV} return c && c.name === 'saved';"),
    );
    assert_eq!(texts(&stored(&b)), json!(messages[1..]));
    assert_eq!(
        b.js("return document.getElementById('system').value;", json!([])),
        "Be brief."
    );
    assert_eq!(
        b.js(
            "return document.querySelector('.msg.assistant strong').textContent;",
            json!([])
        ),
        "How"
    );
    assert_eq!(
        b.js(
            "return document.querySelectorAll('#conv-list li').length;",
            json!([])
        ),
        2
    );
    // Back to the first conversation for the pictures.
    b.click("#conv-list li:nth-child(2) button.open");
    b.wait(
        "the first conversation",
        &format!("{CONV} return c && c.messages[0].content.includes('Python');"),
    );

    let dir = shots();
    b.screenshot(&dir.join("desktop.png"));
    b.color_scheme("dark");
    b.screenshot(&dir.join("desktop-dark.png"));
    b.color_scheme("light");
    b.window(390, 844);
    b.screenshot(&dir.join("phone.png"));
    // The conversations' list opens over the chat on a phone.
    let hidden = "return document.getElementById('sidebar').getBoundingClientRect().right <= 0;";
    assert_eq!(b.js(hidden, json!([])), true);
    b.click("#toggle-sidebar");
    assert_eq!(b.js(hidden, json!([])), false);
    b.screenshot(&dir.join("phone-conversations.png"));

    let errors = console_errors(&b.log("browser"));
    assert!(errors.is_empty(), "console errors: {errors:?}");
    assert_local(&requests(&b.log("performance")), port);
}

/// Under `--api-prefix /v1x`: the page and the API there (and not at `/`); Stop during a
/// long answer (`--ignore-eos`) frees the slot.
#[test]
fn prefix_and_stop() {
    let Some(s) = setup() else { return };
    let (_srv, port) = serve(&s.model, &["--api-prefix", "/v1x", "--ignore-eos"], "/v1x");
    assert_eq!(request(port, "GET", "/health", None).status, 404);
    assert_eq!(request(port, "GET", "/", None).status, 404);
    let page = request(port, "GET", "/v1x/", None);
    assert_eq!(page.status, 200);
    assert!(
        page.head
            .to_ascii_lowercase()
            .contains("content-type: text/html"),
        "{}",
        page.head
    );

    let b = Browser::start(&s.driver, &s.chromium);
    b.go(&format!("http://127.0.0.1:{port}/v1x/"));
    b.wait(
        "the model's name",
        "return document.getElementById('model-info').textContent;",
    );
    b.click("#open-settings");
    b.type_into("input[name=max_tokens]", "1900");
    b.click("#settings-save");
    b.type_into("#input", "Tell me a very long story.\u{E007}");
    // Streaming: text shows while the answer is still coming.
    b.wait(
        "a part of the answer",
        &format!(
            "const m = document.querySelectorAll('.msg.assistant .body');
                  return m.length && m[m.length - 1].textContent.length > 20 && ({BUSY});"
        ),
    );
    b.click("#stop");
    b.wait(
        "the page to stop",
        "return document.getElementById('stop').hidden;",
    );
    let t0 = Instant::now();
    loop {
        let slots = request(port, "GET", "/v1x/slots", None).json();
        let busy = slots
            .as_array()
            .expect("slots")
            .iter()
            .any(|s| s["is_processing"] == true);
        if !busy {
            break;
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "the slot is still busy after Stop: {slots}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kept = stored(&b);
    let partial = kept[1]["content"]
        .as_str()
        .expect("the partial answer kept");
    assert!(partial.len() > 20, "{partial}");
    // The slot went idle because the request was cancelled, not because the 1900 tokens
    // were all generated: its sequence (the prompt cache) holds far fewer.
    let slots = request(port, "GET", "/v1x/slots", None).json();
    let n_past = slots[0]["n_past"].as_u64().expect("n_past");
    assert!(n_past < 1000, "the answer ran on after Stop: {slots}");
    eprintln!(
        "stopped after {} bytes; the slot holds {n_past} tokens",
        partial.len()
    );
    let errors = console_errors(&b.log("browser"));
    assert!(errors.is_empty(), "console errors: {errors:?}");
    let reqs = requests(&b.log("performance"));
    assert_local(&reqs, port);
    assert!(
        reqs.iter()
            .any(|(u, ..)| u.ends_with("/v1x/v1/chat/completions")),
        "{reqs:?}"
    );
}

/// `--no-ui` (`--no-webui`): `/` is llama-server's 404; the API is as before.
#[test]
fn no_ui() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let (_srv, port) = serve(&model, &["--no-webui"], "");
    let r = request(port, "GET", "/", None);
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
    );
    assert_eq!(request(port, "GET", "/chat.js", None).status, 404);
    assert_eq!(request(port, "GET", "/props", None).json()["ui"], false);
    // A service worker that removes itself, for browsers that kept llama-server's UI's.
    let sw = request(port, "GET", "/sw.js", None);
    assert_eq!(sw.status, 200);
    assert!(sw.body.contains("unregister()"), "{}", sw.body);
}

/// `--path DIR`: DIR's files instead of the built-in page (`/` is `DIR/index.html`), nothing
/// outside DIR; the API as before.
#[test]
fn path_serves_a_folder() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui-path");
    std::fs::create_dir_all(dir.join("www")).expect("mkdir");
    std::fs::write(dir.join("www/index.html"), "<p>mine</p>").expect("write");
    std::fs::write(dir.join("www/app.js"), "1;").expect("write");
    std::fs::write(dir.join("outside.txt"), "no").expect("write");
    let www = dir.join("www");
    let (_srv, port) = serve(&model, &["--path", www.to_str().expect("a UTF-8 path")], "");
    let index = request(port, "GET", "/", None);
    assert_eq!((index.status, index.body.as_str()), (200, "<p>mine</p>"));
    let js = request(port, "GET", "/app.js", None);
    assert_eq!(js.status, 200);
    assert!(
        js.head
            .to_ascii_lowercase()
            .contains("content-type: text/javascript"),
        "{}",
        js.head
    );
    assert_eq!(request(port, "GET", "/chat.js", None).status, 404);
    assert_eq!(request(port, "GET", "/../outside.txt", None).status, 404);
    assert_eq!(
        request(port, "GET", "/%2e%2e/outside.txt", None).status,
        404
    );
    assert_eq!(request(port, "GET", "/health", None).status, 200);
}

/// `--api-key`: the page asks for the key once, keeps it, and chats with it.
#[test]
fn api_key_asked_once() {
    let Some(s) = setup() else { return };
    let (_srv, port) = serve(&s.model, &["--api-key", "sesame"], "");
    let b = Browser::start(&s.driver, &s.chromium);
    b.go(&format!("http://127.0.0.1:{port}/"));
    b.wait(
        "the key dialog",
        "return document.getElementById('key-dialog').open;",
    );
    b.type_into("#key-input", "sesame\u{E007}");
    b.wait(
        "the model's name",
        "return document.getElementById('model-info').textContent;",
    );
    b.cmd("POST", "/refresh", None);
    b.wait(
        "the model's name",
        "return document.getElementById('model-info').textContent;",
    );
    assert_eq!(
        b.js(
            "return document.getElementById('key-dialog').open;",
            json!([])
        ),
        false
    );
    b.type_into("#input", "Hi\u{E007}");
    b.wait(
        "the answer",
        &format!("{CONV} return c && c.messages.length === 2 && !({BUSY});"),
    );
    assert_eq!(
        b.js(
            "return document.getElementById('status').classList.contains('error');",
            json!([])
        ),
        false
    );
}
