//! `modelc serve` end to end on SmolLM2 Q4_1, over plain HTTP/1.1 on a loopback socket:
//! llama-server's endpoints and shapes, greedy tokens equal to `modelc run --temp 0`'s,
//! parallel slots that do not change one another's tokens, and hostile clients (oversized
//! bodies, bad JSON, wrong types, prompts past the context, `n_predict` past it, a wrong
//! API key, a client that disconnects mid-stream, a full queue, SIGTERM), each followed by
//! a normal request answered with the same tokens as before.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "test-key";
const PROMPT: &str = "The capital of France is";

/// A response: status and body (de-chunked).
struct Resp {
    status: u16,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends one request (`Connection: close`) and reads the whole response.
fn request(port: u16, method: &str, path: &str, key: Option<&str>, body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}\r\n",
        body.len()
    );
    // A server that refuses a body early may close before reading it all.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        // A server that answers before reading a body it refuses may reset the connection
        // after its answer: what was read counts.
        assert!(!raw.is_empty(), "{method} {path}: no answer ({e})");
    }
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp { status, body }
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

fn post(port: u16, path: &str, body: &Value) -> Resp {
    request(port, "POST", path, Some(KEY), body.to_string().as_bytes())
}

fn get(port: u16, path: &str) -> Resp {
    request(port, "GET", path, Some(KEY), b"")
}

/// The `data:` payloads of a server-sent event stream.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

/// A running `modelc serve`, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `modelc serve MODEL --port 0 ARGS`, reads the port from its first line, checks
/// the shape of a 503 `Loading model` if /health answers one while the model loads (the
/// listener is up first), and waits until it answers 200.
fn start(model: &Path, args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("serve")
        .arg(model)
        // One thread: the tests of this file run at once, and the engine's workers
        // spin-wait, so more threads than cores only slow everything down.
        .args(["--port", "0", "-t", "1"])
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start modelc serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let port = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "serve exited before listening"
        );
        if let Some(rest) = line.split("http://").nth(1) {
            let port = rest
                .split(|c: char| !c.is_ascii_digit() && c != ':' && c != '.')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a port");
            break port;
        }
    };
    // Keep draining stderr so that the server never blocks on it.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    // SmolLM2 loads in a fraction of a second: the first answer may already be 200
    // (`server::tests` checks the loading answer deterministically).
    let first = request(port, "GET", "/health", None, b"");
    if first.status != 200 {
        assert_eq!(first.status, 503, "while loading: {}", first.body);
        assert_eq!(
            first.json(),
            json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        );
    }
    let t0 = Instant::now();
    loop {
        let r = request(port, "GET", "/health", None, b"");
        if r.status == 200 {
            assert_eq!(r.json(), json!({"status": "ok"}));
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "not ready after 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server { child, port }
}

/// `modelc run --temp 0 --json` tokens for `prompt`.
fn run_tokens(model: &Path, prompt: &str, n: usize, n_ctx: usize) -> Vec<u64> {
    let out = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("run")
        .arg(model)
        .args(["-p", prompt, "--temp", "0", "--json", "-t", "1"])
        .args(["-n", &n.to_string(), "-c", &n_ctx.to_string()])
        .output()
        .expect("modelc run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("run --json");
    ids(&v["tokens"])
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|t| t.as_u64().expect("an id"))
        .collect()
}

/// Greedy `/completion` tokens for `prompt` (the prompt cache off: the whole prompt is
/// evaluated as `modelc run` evaluates it).
fn greedy(port: u16, prompt: &str, n: usize) -> Value {
    let r = post(
        port,
        "/completion",
        &json!({"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": true, "cache_prompt": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn assert_error(r: &Resp, status: u16, kind: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], status, "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

/// Opens a streamed completion and returns the socket after the first event arrived.
fn open_stream(port: u16, body: &Value) -> TcpStream {
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = s.read(&mut buf).expect("read the stream");
        assert!(
            n > 0,
            "stream closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

/// Waits until no slot is busy (within `limit`).
fn wait_idle(port: u16, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let v = get(port, "/slots").json();
        let busy = v
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["is_processing"] == true);
        if !busy {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "slots still busy after {limit:?}: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_smollm2() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let n = 16;
    // -c 256 over 2 slots: 128 positions each, as `modelc run -c 128`.
    let n_ctx = 128;
    let expected = run_tokens(&model, PROMPT, n, n_ctx);
    let srv = start(
        &model,
        &[
            "-np",
            "2",
            "-c",
            "256",
            "--api-key",
            KEY,
            "--metrics",
            "--queue-size",
            "1",
            "--max-body",
            "65536",
            "--alias",
            "smol",
            "--slots",
        ],
    );
    let port = srv.port;

    // Models: public, named by the alias.
    let m = request(port, "GET", "/v1/models", None, b"");
    assert_eq!(m.status, 200);
    assert_eq!(m.json()["object"], "list");
    assert_eq!(m.json()["data"][0]["id"], "smol");

    // Greedy /completion = modelc run.
    let base = greedy(port, PROMPT, n);
    assert_eq!(ids(&base["tokens"]), expected, "{base}");
    assert_eq!(base["stop"], true);
    assert_eq!(base["tokens_predicted"], n);
    let text = base["content"].as_str().unwrap().to_string();

    // /tokenize and /detokenize round trip, with pieces.
    let t = post(
        port,
        "/tokenize",
        &json!({"content": PROMPT, "with_pieces": true}),
    )
    .json();
    let pieces: String = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(pieces, PROMPT);
    let tok = post(port, "/tokenize", &json!({"content": PROMPT})).json();
    let d = post(port, "/detokenize", &json!({"tokens": tok["tokens"]})).json();
    assert_eq!(d["content"], PROMPT);
    let prompt_len = tok["tokens"].as_array().unwrap().len();

    // The prompt cache: the same prompt again reuses all but its last token.
    let cached = post(
        port,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 2, "temperature": 0}),
    )
    .json();
    let again = post(
        port,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 2, "temperature": 0}),
    )
    .json();
    assert_eq!(
        again["timings"]["cache_n"],
        prompt_len - 1,
        "{again} after {cached}"
    );

    // OpenAI completion, streamed: one event per token, then [DONE]; usage at the end.
    let r = post(
        port,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let events = sse_data(&r.body);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], n);
    assert_eq!(usage["prompt_tokens"], prompt_len);
    assert_eq!(usage["total_tokens"], n + prompt_len);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // Chat, whole and streamed: the same message; usage counts the rendered prompt.
    let chat = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let whole = post(port, "/v1/chat/completions", &chat).json();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let rendered = post(port, "/apply-template", &chat).json()["prompt"]
        .as_str()
        .unwrap()
        .to_string();
    let n_rendered = post(
        port,
        "/tokenize",
        &json!({"content": rendered, "add_special": true}),
    )
    .json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(whole["usage"]["prompt_tokens"], n_rendered);
    // `n` choices: each greedy, so each the same message; usage adds their tokens.
    let mut two = chat.clone();
    two["n"] = json!(2);
    let both = post(port, "/v1/chat/completions", &two).json();
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{both}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"], whole["choices"][0]["message"]);
    }
    assert_eq!(
        both["usage"]["completion_tokens"],
        2 * whole["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // A list of prompts on an OpenAI endpoint: one response whose choices are each
    // prompt's completion in order (llama-server's `handle_completions_impl`), usage added
    // up (each prompt once).
    let one = |prompt: Value| {
        let b = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0});
        post(port, "/v1/completions", &b).json()
    };
    let (a, b) = (one(json!("Once upon a time")), one(json!([9556, 2402])));
    let listed = one(json!(["Once upon a time", [9556, 2402]]));
    let choices = listed["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(choices.len(), 2, "{listed}");
    for (i, (c, single)) in choices.iter().zip([&a, &b]).enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], single["choices"][0]["text"], "{listed}");
    }
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        let sum = a["usage"][field].as_u64().unwrap() + b["usage"][field].as_u64().unwrap();
        assert_eq!(listed["usage"][field], sum, "{field}: {listed}");
    }
    // Sampled choices: choice j draws with the seed plus j (llama-server's child tasks), so
    // each is what a one-choice request with that seed gives, and they differ.
    let sampled = |seed: i64, n: usize| {
        let mut b = chat.clone();
        b["temperature"] = json!(1.0);
        b["seed"] = json!(seed);
        b["n"] = json!(n);
        let r = post(port, "/v1/chat/completions", &b).json();
        let texts: Vec<String> = r["choices"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect();
        texts
    };
    let pair = sampled(7, 2);
    assert_eq!(pair[0], sampled(7, 1)[0]);
    assert_eq!(pair[1], sampled(8, 1)[0]);
    assert_ne!(pair[0], pair[1]);
    // A seed is a uint32_t, as llama-server's: -7 wraps to 4294967289.
    assert_eq!(sampled(-7, 1), sampled(4294967289, 1));
    // More choices than slots: llama-server's hard limit and message.
    two["n"] = json!(3);
    let r = post(port, "/v1/chat/completions", &two);
    assert_error(&r, 400, "invalid_request_error");
    assert_eq!(
        r.json()["error"]["message"],
        "Field 'n': Value must be between 1 <= value <= 2, but got 3"
    );
    let mut s = chat.clone();
    s["stream"] = json!(true);
    let r = post(port, "/v1/chat/completions", &s);
    let events = sse_data(&r.body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let deltas: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        deltas,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // n_probs: the chosen token is the most likely one under greedy decoding.
    let p = post(port, "/completion", &json!({"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 3, "cache_prompt": false})).json();
    let probs = p["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 3);
    for pos in probs {
        assert_eq!(pos["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(pos["id"], pos["top_logprobs"][0]["id"]);
    }
    // A logit bias steers the choice, not the reported probabilities: without
    // `post_sampling_probs` they are the model's (llama-server's `get_token_probabilities`).
    let steered = probs[0]["top_logprobs"][2]["id"].as_u64().unwrap();
    let b = post(port, "/completion", &json!({"prompt": PROMPT, "n_predict": 1, "temperature": 0, "n_probs": 3, "cache_prompt": false, "logit_bias": [[steered, 100.0]]})).json();
    let first = &b["completion_probabilities"][0];
    assert_eq!(first["id"], steered);
    assert_eq!(first["top_logprobs"], probs[0]["top_logprobs"]);
    assert_eq!(first["logprob"], probs[0]["top_logprobs"][2]["logprob"]);

    // Two requests at once on -np 2: each gets the tokens it gets alone.
    let other = "Once upon a time";
    let alone = ids(&greedy(port, other, n)["tokens"]);
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| ids(&greedy(port, PROMPT, n)["tokens"]));
        let b = sc.spawn(|| ids(&greedy(port, other, n)["tokens"]));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, expected);
    assert_eq!(b, alone);

    // Hostile clients; after each, a normal request gets the same tokens.
    let check = || assert_eq!(ids(&greedy(port, PROMPT, n)["tokens"]), expected);
    assert_error(
        &request(port, "POST", "/completion", Some(KEY), &vec![b' '; 70_000]),
        413,
        "invalid_request_error",
    );
    check();
    assert_error(
        &request(port, "POST", "/completion", Some(KEY), b"{\"prompt\": "),
        400,
        "invalid_request_error",
    );
    check();
    assert_error(
        &post(
            port,
            "/completion",
            &json!({"prompt": PROMPT, "n_predict": "ten"}),
        ),
        400,
        "invalid_request_error",
    );
    assert_error(
        &post(port, "/v1/chat/completions", &json!({"messages": "hi"})),
        400,
        "invalid_request_error",
    );
    assert_error(
        &post(
            port,
            "/completion",
            &json!({"prompt": PROMPT, "temperature": [1]}),
        ),
        400,
        "invalid_request_error",
    );
    check();
    let long: Vec<u32> = (0..n_ctx + 10).map(|i| 100 + i as u32 % 50).collect();
    let r = post(port, "/completion", &json!({"prompt": long}));
    assert_error(&r, 400, "exceed_context_size_error");
    assert_eq!(r.json()["error"]["n_ctx"], n_ctx);
    check();
    // n_predict past the context: stops when the slot is full.
    let near: Vec<u32> = (0..n_ctx - 8).map(|i| 100 + i as u32 % 50).collect();
    let r = post(
        port,
        "/completion",
        &json!({"prompt": near, "n_predict": 100000, "ignore_eos": true, "temperature": 0}),
    )
    .json();
    assert_eq!(r["truncated"], true, "{r}");
    assert_eq!(r["stop_type"], "limit");
    // As llama-server: stops before the decode that would fill the last cell, 7 evaluated
    // + 1 sampled.
    assert_eq!(r["tokens_predicted"], 8, "{r}");
    assert_eq!(r["tokens_cached"], n_ctx - 1, "{r}");
    check();
    assert_error(
        &request(
            port,
            "POST",
            "/completion",
            Some("wrong"),
            json!({"prompt": PROMPT}).to_string().as_bytes(),
        ),
        401,
        "authentication_error",
    );
    assert_error(
        &request(
            port,
            "POST",
            "/completion",
            None,
            json!({"prompt": PROMPT}).to_string().as_bytes(),
        ),
        401,
        "authentication_error",
    );
    assert_eq!(request(port, "GET", "/health", None, b"").status, 200);
    check();
    let metrics = get(port, "/metrics").body;
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:n_decode_total",
        "llamacpp:requests_processing",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name}")),
            "{name} missing: {metrics}"
        );
    }
    drop(srv);

    // One slot with a long context, so that a stream outlasts the checks below.
    let srv = start(
        &model,
        &[
            "-np",
            "1",
            "-c",
            "4096",
            "--api-key",
            KEY,
            "--metrics",
            "--queue-size",
            "1",
            "--slots",
        ],
    );
    let port = srv.port;
    let before = ids(&greedy(port, PROMPT, n)["tokens"]);
    let check = || assert_eq!(ids(&greedy(port, PROMPT, n)["tokens"]), before);
    // A client that disconnects mid-stream frees its slot at once.
    let long_gen = json!({"prompt": PROMPT, "n_predict": 4000, "ignore_eos": true, "stream": true});
    drop(open_stream(port, &long_gen));
    wait_idle(port, Duration::from_secs(10));
    check();
    // The slot busy and one request waiting: the next one gets 503. The stream must hold
    // the slot before the waiting request is sent (a stream's headers may come before its
    // request reaches the slot, and a one-token request taking the slot first would leave
    // the queue empty).
    let s1 = open_stream(port, &long_gen);
    let t0 = Instant::now();
    while !get(port, "/slots").body.contains("\"is_processing\":true") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the stream never took the slot"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let waiting = std::thread::spawn(move || {
        post(
            port,
            "/completion",
            &json!({"prompt": PROMPT, "n_predict": 1}),
        )
        .status
    });
    let t0 = Instant::now();
    loop {
        let m = get(port, "/metrics").body;
        if m.contains("llamacpp:requests_deferred 1") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no deferred request: {m}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let probe = post(
        port,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 1}),
    );
    if probe.status != 503 {
        panic!(
            "a request past the queue got {}: {}\nmetrics: {}\nslots: {}",
            probe.status,
            probe.body,
            get(port, "/metrics").body,
            get(port, "/slots").body
        );
    }
    assert_error(&probe, 503, "unavailable_error");
    drop(s1);
    assert_eq!(waiting.join().unwrap(), 200);
    wait_idle(port, Duration::from_secs(10));
    check();

    // SIGTERM with a request running: exits 0, promptly.
    let mut srv = srv;
    let _running = open_stream(port, &long_gen);
    let st = Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let code = loop {
        if let Some(c) = srv.child.try_wait().unwrap() {
            break c;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(code.success(), "exit status after SIGTERM: {code}");
}

/// The OpenAI Python client against `modelc serve`: models, a chat completion whole and
/// streamed (same text, usage), a text completion, a wrong key
/// (`runtime/tests/data/openai_client.py`, in the environment of
/// `scripts/fetch-server-tests`).
#[test]
fn openai_python_client() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let Some(python) = modelc_tests::require(
        home.join(".cache/modelc/venv-server/bin/python"),
        "scripts/fetch-server-tests installs it",
    ) else {
        return;
    };
    let srv = start(&model, &["-c", "512", "--api-key", KEY, "--alias", "smol"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/openai_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", srv.port))
        .args([KEY, "smol"])
        .output()
        .expect("run python");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--kv-unified`: two slots share one pool of `-c` cells. One request may use the whole
/// context (more than `-c / N`), with the tokens `modelc run -c` gives; requests that
/// together overflow the pool fail with llama-server's 500 "Context size has been
/// exceeded.", and the next request is served as before.
#[test]
fn kv_unified_pool() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let n_ctx = 64;
    let n = 48; // past the 32 cells a slot would get without the pool
    let expected = run_tokens(&model, PROMPT, n, n_ctx);
    let srv = start(&model, &["-np", "2", "-c", "64", "-kvu", "--slots"]);
    let slots = get(srv.port, "/slots").json();
    for s in slots.as_array().expect("slots") {
        assert_eq!(s["n_ctx"], n_ctx, "{slots}");
    }
    let one = greedy(srv.port, PROMPT, n);
    assert_eq!(ids(&one["tokens"]), expected);
    assert_eq!(one["timings"]["predicted_n"], n, "{one}");

    // Two requests of 48 tokens each need about 110 cells of the 64: the second arrives
    // while the first streams.
    let body = json!({"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": true, "cache_prompt": false});
    let mut first = open_stream(
        srv.port,
        &json!({"prompt": PROMPT, "n_predict": n, "stream": true, "temperature": 0, "ignore_eos": true}),
    );
    let second = post(srv.port, "/completion", &body);
    // The stream ends with a final event (`"stop":true`) or an error event.
    let mut rest = String::new();
    let mut buf = [0u8; 4096];
    while !rest.contains("\"stop\":true") && !rest.contains("\"error\"") {
        match first.read(&mut buf) {
            Ok(k) if k > 0 => rest.push_str(&String::from_utf8_lossy(&buf[..k])),
            _ => break,
        }
    }
    let exceeded = "Context size has been exceeded.";
    if second.status == 200 {
        assert_eq!(
            second.json()["timings"]["predicted_n"],
            n,
            "{}",
            second.body
        );
        assert!(rest.contains(exceeded), "neither request failed: {rest}");
    } else {
        assert_error(&second, 500, "server_error");
        assert_eq!(
            second.json()["error"]["message"],
            exceeded,
            "{}",
            second.body
        );
    }
    wait_idle(srv.port, Duration::from_secs(30));
    let again = greedy(srv.port, PROMPT, n);
    assert_eq!(ids(&again["tokens"]), expected);
}

/// `return_progress` on a streamed request: a `prompt_progress` event when the request
/// starts (nothing read yet) and after each step that read part of the prompt (`-b 8`
/// tokens a step), `processed` rising to `total`, with the prompt's timings so far under
/// `timings_per_token`; then the tokens. A second request reuses the cached prompt and
/// says so from its first event.
#[test]
fn prompt_progress() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let srv = start(&model, &["-c", "256", "-b", "8"]);
    let prompt = format!("{PROMPT} Paris. {PROMPT} Paris. {PROMPT}");
    let body = json!({"prompt": prompt, "n_predict": 2, "stream": true,
        "return_progress": true, "timings_per_token": true, "temperature": 0});
    for round in 0..2 {
        let r = post(srv.port, "/completion", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let events: Vec<Value> = sse_data(&r.body)
            .iter()
            .map(|d| serde_json::from_str(d).expect("an event"))
            .collect();
        let progress: Vec<&Value> = events
            .iter()
            .filter_map(|e| e.get("prompt_progress"))
            .collect();
        let total = progress[0]["total"].as_u64().expect("total");
        let cache = progress[0]["cache"].as_u64().expect("cache");
        assert_eq!(progress[0]["processed"], cache, "{progress:?}");
        if round == 0 {
            assert_eq!(cache, 0);
            // The start, then ceil(total / 8) steps.
            assert_eq!(progress.len() as u64, 1 + total.div_ceil(8), "{progress:?}");
        } else {
            assert_eq!(cache, total - 1, "{progress:?}");
            assert_eq!(progress.len(), 2, "{progress:?}");
        }
        for w in progress.windows(2) {
            assert_eq!(w[1]["total"], total);
            assert_eq!(w[1]["cache"], cache);
            assert!(w[1]["processed"].as_u64() > w[0]["processed"].as_u64());
        }
        assert_eq!(progress.last().unwrap()["processed"], total);
        let timings: Vec<&Value> = events
            .iter()
            .filter(|e| e.get("prompt_progress").is_some())
            .map(|e| &e["timings"])
            .collect();
        assert_eq!(timings[0]["prompt_n"], 0);
        assert_eq!(timings[0]["prompt_ms"], 0.0);
        let last = timings.last().unwrap();
        assert_eq!(last["prompt_n"].as_u64(), Some(total - cache));
        assert!(last["prompt_ms"].as_f64() > Some(0.0), "{last}");
        // The tokens follow the progress events, each with the timings so far.
        let tokens: Vec<&Value> = events
            .iter()
            .filter(|e| e["stop"] == false && e.get("prompt_progress").is_none())
            .collect();
        assert_eq!(tokens.len(), 2);
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!(t["timings"]["predicted_n"], i + 1, "{t}");
            assert_eq!(
                t["timings"]["prompt_n"].as_u64(),
                Some(total - cache),
                "{t}"
            );
        }
    }
}

/// Grammars on every completion endpoint (llama-server's `grammar`, `json_schema`,
/// `response_format`): the text follows them, a greedy `/completion` with a grammar gives
/// `modelc run --grammar`'s text, and bad grammars or schemas are 400s naming the problem.
/// The server's own `--grammar` constrains requests that bring none.
#[test]
fn serve_grammar() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let words = r#"root ::= (" " [A-Z] [a-z]+ (", " | " and")?)+ ".""#;
    let cli = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("run")
        .arg(&model)
        .args([
            "-p",
            "My three favourite fruits are",
            "-n",
            "24",
            "--temp",
            "0",
        ])
        .args(["-c", "256", "-t", "1", "--grammar", words])
        .output()
        .expect("modelc run");
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let cli_text = String::from_utf8_lossy(&cli.stdout).trim_end().to_string();
    let srv = start(
        &model,
        &[
            "-np",
            "2",
            "-c",
            "512",
            "--grammar",
            "root ::= [a-z ]{1,40}",
        ],
    );
    let port = srv.port;
    // /completion with a grammar: as `modelc run --grammar`.
    let r = post(
        port,
        "/completion",
        &json!({"prompt": "My three favourite fruits are", "n_predict": 24, "temperature": 0, "grammar": words}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"].as_str().unwrap().trim_end(), cli_text);
    // The server's --grammar when the request has none.
    let r = post(
        port,
        "/completion",
        &json!({"prompt": "Hello", "n_predict": 12, "temperature": 0}),
    );
    let c = r.json()["content"].as_str().unwrap().to_string();
    assert!(
        c.chars().all(|ch| ch.is_ascii_lowercase() || ch == ' '),
        "{c:?}"
    );
    // json_schema on /v1/completions.
    let r = post(
        port,
        "/v1/completions",
        &json!({"prompt": "The answer:", "max_tokens": 8, "temperature": 0, "json_schema": {"const": "42"}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], "\"42\"");
    // Chat with response_format json_schema: the reply is JSON of that shape.
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8}}, "required": ["name", "legs"],
        "additionalProperties": false});
    let messages = json!([{"role": "user", "content": "Describe a cat as JSON."}]);
    let r = post(
        port,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let obj: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        obj["name"].is_string() && obj["legs"].as_u64().is_some_and(|l| l <= 8),
        "{obj}"
    );
    // {"type": "json_object"}: some JSON object.
    let r = post(
        port,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6, "temperature": 0, "response_format": {"type": "json_object"}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with('{'), "{text:?}");
    // Refusals: one clear line each, llama-server's error object.
    let bad = [
        json!({"messages": messages, "grammar": "root ::= this is (not valid GBNF"}),
        json!({"messages": messages, "grammar": "root ::= \"a\"", "json_schema": {}}),
        json!({"messages": messages, "response_format": {"type": "sound"}}),
        json!({"messages": messages, "response_format": {"type": "json_object", "schema": 123}}),
        json!({"messages": messages, "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}}),
        json!({"messages": messages, "grammar": 7}),
    ];
    for b in &bad {
        let r = post(port, "/v1/chat/completions", b);
        assert_error(&r, 400, "invalid_request_error");
        assert!(
            !r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains('\n'),
            "{}",
            r.body
        );
    }
    let r = post(
        port,
        "/completion",
        &json!({"prompt": "x", "grammar": "root ::= \"a\" b"}),
    );
    assert_error(&r, 400, "invalid_request_error");
    assert!(
        r.body.contains("line 1, column 14: undefined rule 'b'"),
        "{}",
        r.body
    );
}

/// Sends `method path` with `headers` (whole lines, each ending in `\r\n`) and `body`,
/// `Connection: close`, and returns the socket to read the answer from.
fn send_raw(port: u16, method: &str, path: &str, headers: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Reads `s` until `needle` shows up in what was read (the response so far).
fn read_until(s: &mut TcpStream, needle: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// Reads the rest of `s` after `seen` and parses the whole response.
fn finish(mut s: TcpStream, mut seen: Vec<u8>) -> Resp {
    s.read_to_end(&mut seen).expect("read to the end");
    parse_response(&seen)
}

/// Resumable streams (llama-server's `X-Conversation-Id`, `GET`/`DELETE /v1/stream`): a
/// finished stream replays byte for byte from any offset; a reader that comes while the
/// generation runs follows it live to its end; a client that disconnects does not stop a
/// generation with an id (its session gets all of it); a Stop cancels the generation, ends
/// its client's stream without `[DONE]` and forgets the session (404 after, 204 always);
/// unknown ids are 404s, requests without an id or with a bad offset 400s; a
/// non-streamed request leaves no session.
#[test]
fn resumable_streams() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let srv = start(&model, &["-c", "1024", "--slots"]);
    let port = srv.port;
    // Slashes and colons, as a router's `conv::org/model:quant`.
    let id = "conv-1::ggml-org/tiny-GGUF:Q8_0";
    let qs = "conv_id=conv-1%3A%3Aggml-org%2Ftiny-GGUF%3AQ8_0";
    let header = format!("X-Conversation-Id: {id}\r\n");
    let chat = |n: u32| {
        json!({"stream": true, "max_tokens": n, "temperature": 0, "ignore_eos": true,
            "messages": [{"role": "user", "content": "Count from 1 to 1000."}]})
        .to_string()
    };

    // A finished stream replays exactly, from the start or from a byte offset.
    let s = send_raw(port, "POST", "/v1/chat/completions", &header, &chat(8));
    let whole = finish(s, Vec::new());
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert!(whole.body.ends_with("data: [DONE]\n\n"), "{}", whole.body);
    let replay = get(port, &format!("/v1/stream?{qs}&from=0"));
    assert_eq!(replay.status, 200, "{}", replay.body);
    assert_eq!(replay.body, whole.body);
    let from = get(port, &format!("/v1/stream?{qs}&from=6"));
    assert_eq!(from.body, whole.body[6..]);
    let found = post(
        port,
        "/v1/streams/lookup",
        &json!({"conversation_ids": ["conv-1", "x"]}),
    )
    .json();
    assert_eq!(found[0]["conversation_id"], id, "{found}");
    assert_eq!(found[0]["is_done"], true);
    assert_eq!(found[0]["total_bytes"], whole.body.len());
    assert_eq!(found.as_array().map(Vec::len), Some(1));

    // Unknown ids, no id, a bad offset.
    assert_error(
        &get(port, "/v1/stream?conv_id=nobody&from=0"),
        404,
        "not_found_error",
    );
    assert_error(
        &get(port, "/v1/stream?from=0"),
        400,
        "invalid_request_error",
    );
    assert_error(
        &get(port, &format!("/v1/stream?{qs}&from=x")),
        400,
        "invalid_request_error",
    );
    assert_eq!(
        request(port, "DELETE", "/v1/stream?conv_id=nobody", None, b"").status,
        204
    );

    // A reader that comes while the generation runs follows it live to the end.
    let mut s = send_raw(port, "POST", "/v1/chat/completions", &header, &chat(48));
    let seen = read_until(&mut s, "data: ");
    let follower = std::thread::spawn(move || {
        get(
            port,
            "/v1/stream?conv_id=conv-1%3A%3Aggml-org%2Ftiny-GGUF%3AQ8_0&from=0",
        )
    });
    let whole = finish(s, seen);
    let followed = follower.join().unwrap();
    assert_eq!(followed.status, 200);
    assert_eq!(followed.body, whole.body);
    assert!(whole.body.ends_with("data: [DONE]\n\n"));

    // A client that goes away: the generation runs to its end into the session.
    let mut s = send_raw(port, "POST", "/v1/chat/completions", &header, &chat(32));
    read_until(&mut s, "data: ");
    drop(s);
    wait_idle(port, Duration::from_secs(60));
    let after = get(port, &format!("/v1/stream?{qs}&from=0"));
    assert_eq!(after.status, 200);
    assert!(after.body.ends_with("data: [DONE]\n\n"), "{}", after.body);
    let contents = sse_data(&after.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| {
            v["choices"][0]["delta"]
                .get("content")
                .is_some_and(Value::is_string)
        })
        .count();
    assert!(contents > 16, "{}", after.body);

    // A Stop: the generation ends at once, its client's stream without `[DONE]`; the
    // session is gone.
    let mut s = send_raw(port, "POST", "/v1/chat/completions", &header, &chat(900));
    let seen = read_until(&mut s, "data: ");
    let stop = request(port, "DELETE", &format!("/v1/stream?{qs}"), None, b"");
    assert_eq!(stop.status, 204);
    let cut = finish(s, seen);
    assert!(!cut.body.contains("[DONE]"), "{}", cut.body);
    assert!(sse_data(&cut.body).len() < 900);
    wait_idle(port, Duration::from_secs(10));
    assert_error(
        &get(port, &format!("/v1/stream?{qs}&from=0")),
        404,
        "not_found_error",
    );

    // A non-streamed request with an id leaves no session.
    let body = json!({"prompt": PROMPT, "n_predict": 2});
    let s = send_raw(port, "POST", "/completion", &header, &body.to_string());
    assert_eq!(finish(s, Vec::new()).status, 200);
    assert_error(
        &get(port, &format!("/v1/stream?{qs}&from=0")),
        404,
        "not_found_error",
    );
}

/// Small things as llama-server does them: a chat stream with `return_progress` sends the
/// progress chunks first, then the assistant's role with the first token; streamed tokens
/// carry their ids without `return_tokens` (progress events an id 0); `n_predict` below -1
/// is a 400 naming the field, 0 still generates one token; an empty prompt string is
/// answered at once with nothing generated, an empty list of prompts is a 400.
#[test]
fn llama_server_details() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let srv = start(&model, &["-c", "256", "-b", "8"]);
    let port = srv.port;
    let events = |r: &Resp| -> Vec<Value> {
        assert_eq!(r.status, 200, "{}", r.body);
        sse_data(&r.body)
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("an event"))
            .collect()
    };
    let chat = post(
        port,
        "/v1/chat/completions",
        &json!({"stream": true, "return_progress": true, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "Name a colour."}]}),
    );
    let ev = events(&chat);
    let n_progress = ev
        .iter()
        .filter(|e| e.get("prompt_progress").is_some())
        .count();
    assert!(n_progress >= 2, "{}", chat.body);
    assert!(ev[..n_progress]
        .iter()
        .all(|e| e.get("prompt_progress").is_some()));
    let role = &ev[n_progress];
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    assert!(
        ev[n_progress + 1]["choices"][0]["delta"]["content"].is_string(),
        "{}",
        chat.body
    );

    let r = post(
        port,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 3, "stream": true, "return_progress": true}),
    );
    let ev = events(&r);
    for e in &ev {
        let tokens = e["tokens"].as_array().expect("tokens");
        if e.get("prompt_progress").is_some() {
            assert_eq!(tokens, &vec![json!(0)], "{e}");
        } else if e["stop"] == false {
            assert_eq!(tokens.len(), 1, "{e}");
        } else {
            assert!(tokens.is_empty(), "{e}");
        }
    }

    for field in ["n_predict", "max_tokens"] {
        let r = post(port, "/completion", &json!({"prompt": PROMPT, field: -2}));
        assert_error(&r, 400, "invalid_request_error");
        let msg = r.json()["error"]["message"].clone();
        assert_eq!(
            msg,
            format!("Field '{field}': Value must be between -1 <= value <= 2147483647, but got -2")
        );
    }
    let one = post(
        port,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 0}),
    )
    .json();
    assert_eq!(one["tokens_predicted"], 1, "{one}");
    assert_eq!(one["stop_type"], "limit", "{one}");

    for stream in [false, true] {
        let r = post(
            port,
            "/completion",
            &json!({"prompt": "", "n_predict": 2, "stream": stream}),
        );
        let last = if stream {
            events(&r).pop().expect("an event")
        } else {
            r.json()
        };
        assert_eq!(last["tokens_predicted"], 0, "{last}");
        assert_eq!(last["tokens_evaluated"], 0, "{last}");
        assert_eq!(last["stop_type"], "none", "{last}");
        assert_eq!(last["content"], "", "{last}");
    }
    let r = post(port, "/completion", &json!({"prompt": [], "n_predict": 2}));
    assert_error(&r, 400, "invalid_request_error");
    assert_eq!(r.json()["error"]["message"], "\"prompt\" must not be empty");

    // Chat prompts as llama-server 0c1e570 renders them (its /apply-template answers,
    // SmolLM2's template): text parts joined by a newline; a final assistant message
    // continued (the prefill: its parts joined by a blank line; an empty one adds no
    // header); `continue_final_message` on any final message; the errors.
    let head = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
                Hugging Face<|im_end|>\n<|im_start|>user\n";
    let parts = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
    let user_hi = json!({"role": "user", "content": "hi"});
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": parts}]}),
            format!("{head}Wh\nill<|im_end|>\n<|im_start|>assistant\n"),
        ),
        (
            json!({"messages": [user_hi, {"role": "assistant", "content": "Hello"}]}),
            format!("{head}hi<|im_end|>\n<|im_start|>assistant\nHello"),
        ),
        (
            json!({"messages": [user_hi, {"role": "assistant", "content": parts}]}),
            format!("{head}hi<|im_end|>\n<|im_start|>assistant\nWh\n\nill"),
        ),
        (
            json!({"messages": [user_hi, {"role": "assistant", "content": ""}]}),
            format!("{head}hi<|im_end|>\n"),
        ),
        (
            json!({"messages": [user_hi], "add_generation_prompt": false}),
            format!("{head}hi<|im_end|>\n"),
        ),
        (
            json!({"messages": [user_hi], "continue_final_message": true,
                "add_generation_prompt": false}),
            "<|im_start|>assistant\nhi".to_string(),
        ),
    ];
    for (body, want) in cases {
        let r = post(port, "/apply-template", &body);
        assert_eq!(r.json()["prompt"], want, "{body}");
    }
    // Malformed messages: llama-server's statuses and messages, in its order of checks.
    let bad = |m: Value| json!({"messages": [m]});
    let cases = [
        (
            json!({"messages": [user_hi, {"role": "assistant", "content": "a"},
                             {"role": "assistant", "content": "b"}]}),
            400,
            "Cannot have 2 or more assistant messages at the end of the list.",
        ),
        (
            json!({"messages": [user_hi, {"role": "assistant", "content": "a"}],
                "continue_final_message": true}),
            400,
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ),
        (
            bad(json!({"role": "user"})),
            400,
            "All non-assistant messages must contain 'content'",
        ),
        (
            bad(json!({"role": "assistant"})),
            400,
            "Assistant message must contain either 'content' or 'tool_calls'!",
        ),
        (
            bad(json!({"role": "user", "content": 123})),
            400,
            "Expected 'content' to be a string or an array",
        ),
        (
            bad(json!({"role": "user", "content": [{"text": "a"}]})),
            400,
            "unsupported content[].type",
        ),
        (
            bad(json!({"role": "user", "content": [{"type": "image_url"}]})),
            500,
            "image input is not supported - hint: if this is unexpected, you may need to \
             provide the mmproj",
        ),
        (
            bad(json!({"content": "hi"})),
            500,
            "Failed to parse messages: Missing 'role' in message: {\"content\":\"hi\"}",
        ),
    ];
    for (body, status, msg) in cases {
        let r = post(port, "/apply-template", &body);
        let kind = if status == 400 {
            "invalid_request_error"
        } else {
            "server_error"
        };
        assert_error(&r, status, kind);
        assert_eq!(r.json()["error"]["message"], msg, "{body}");
    }
    // A method a path does not serve: llama-server's 404, not an empty 405.
    let r = get(port, "/v1/chat/completions");
    assert_error(&r, 404, "not_found_error");
    // llama-server's endpoints this server does not serve: its 501, saying which.
    for (path, what) in [
        ("/v1/embeddings", "embeddings"),
        ("/embedding", "embeddings"),
        ("/v1/rerank", "reranking"),
        ("/v1/responses", "the Responses API"),
    ] {
        let r = post(port, path, &json!({"input": "hi"}));
        assert_error(&r, 501, "not_supported_error");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(msg.contains(what), "{path}: {msg}");
    }
    // /infill on a model without fill-in-the-middle tokens: llama-server's 501.
    let r = post(
        port,
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_error(&r, 501, "not_supported_error");
    assert_eq!(
        r.json()["error"]["message"],
        "Infill is not supported by this model: prefix token is missing. suffix token is \
         missing. middle token is missing. "
    );
    // The reply to a prefill starts with it (whole, and in the first streamed delta), and
    // goes on as a plain completion of the rendered prompt does.
    let prefill = json!({"max_tokens": 4, "temperature": 0, "messages": [
        user_hi, {"role": "assistant", "content": "Sure, here is"}]});
    let whole = post(port, "/v1/chat/completions", &prefill).json();
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let rendered = format!("{head}hi<|im_end|>\n<|im_start|>assistant\nSure, here is");
    let plain = post(
        port,
        "/completion",
        &json!({"prompt": rendered, "n_predict": 4, "temperature": 0}),
    )
    .json();
    assert_eq!(
        text,
        format!("Sure, here is{}", plain["content"].as_str().unwrap())
    );
    let mut s = prefill.clone();
    s["stream"] = json!(true);
    let ev = events(&post(port, "/v1/chat/completions", &s));
    let deltas: Vec<&str> = ev
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(deltas[0].starts_with("Sure, here is"), "{deltas:?}");
    assert_eq!(deltas.concat(), text);

    // /detokenize renders special tokens and keeps every piece as it is (llama-server's
    // `tokens_to_str`).
    let r = post(port, "/detokenize", &json!({"tokens": [1, 0, 2, 9]})).json();
    assert_eq!(
        r["content"],
        "<|im_start|><|endoftext|><|im_end|><issue_comment>"
    );
}

/// A compiled runner's `serve` refuses a context it cannot hold before it listens: the
/// error comes first, and nothing listens.
#[test]
fn runner_serve_checks_ctx_first() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("modelc-serve-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let runner = dir.join("smol");
    let out = Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(&runner)
        .args(["-c", "256"])
        .output()
        .expect("modelc compile");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&runner)
        .args(["serve", "-c", "100000", "--port", "0"])
        .output()
        .expect("run the runner");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("-c 100000"), "{err}");
    assert!(!err.contains("listening"), "{err}");
}

/// llama-server's sampler fields beyond the default chain's (typical_p, top_n_sigma, xtc_*,
/// dynatemp_*, mirostat*, dry_*, samplers): each case of
/// `tests/data/sampling_llama_cpp_chain.json` sent to `/completion` gives the text
/// llama-completion wrote with the same settings; and llama-server's limits on them.
#[test]
fn sampler_fields_are_llama_cpp_s() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let s = start(&model, &["-c", "2048"]);
    let port = s.port;
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sampling_llama_cpp_chain.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    for c in r["cases"].as_array().unwrap() {
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let mut body = json!({"prompt": c["prompt"], "cache_prompt": false});
        let mut breakers: Vec<String> = Vec::new();
        let mut rest = &args[..];
        while let Some((&flag, tail)) = rest.split_first() {
            if flag == "--ignore-eos" {
                body["ignore_eos"] = json!(true);
                rest = tail;
                continue;
            }
            let v = tail[0];
            rest = &tail[1..];
            let num = |v: &str| -> Value { serde_json::from_str(v).unwrap() };
            let (field, value) = match flag {
                "-n" => ("n_predict", num(v)),
                "-s" => ("seed", num(v)),
                "--temp" => ("temperature", num(v)),
                "--top-k" => ("top_k", num(v)),
                "--min-p" => ("min_p", num(v)),
                "--frequency-penalty" => ("frequency_penalty", num(v)),
                "--dry-penalty-last-n" => ("dry_penalty_last_n", num(v)),
                "--repeat-penalty" => ("repeat_penalty", num(v)),
                "--typical" => ("typical_p", num(v)),
                "--top-nsigma" => ("top_n_sigma", num(v)),
                "--xtc-probability" => ("xtc_probability", num(v)),
                "--xtc-threshold" => ("xtc_threshold", num(v)),
                "--dynatemp-range" => ("dynatemp_range", num(v)),
                "--dynatemp-exp" => ("dynatemp_exponent", num(v)),
                "--mirostat" => ("mirostat", num(v)),
                "--mirostat-ent" => ("mirostat_tau", num(v)),
                "--mirostat-lr" => ("mirostat_eta", num(v)),
                "--dry-multiplier" => ("dry_multiplier", num(v)),
                "--dry-base" => ("dry_base", num(v)),
                "--dry-allowed-length" => ("dry_allowed_length", num(v)),
                "--samplers" => ("samplers", json!(v.split(';').collect::<Vec<_>>())),
                "--sampler-seq" => ("samplers", json!(v)),
                "--dry-sequence-breaker" => {
                    breakers.push(v.to_string());
                    continue;
                }
                other => panic!("no field for {other}"),
            };
            body[field] = value;
        }
        if !breakers.is_empty() {
            body["dry_sequence_breakers"] = json!(breakers);
        }
        let got = post(port, "/completion", &body);
        assert_eq!(got.status, 200, "{}", got.body);
        let content = got.json()["content"].as_str().unwrap().to_string();
        assert_eq!(
            content.trim_end(),
            c["content"].as_str().unwrap().trim_end(),
            "{body}"
        );
    }
    // The settings are reported back, in llama-server's names.
    let r = post(
        port,
        "/completion",
        &json!({"prompt": "Hi", "n_predict": 1, "samplers": "kt", "dry_multiplier": 0.5, "mirostat": 9}),
    )
    .json();
    let g = &r["generation_settings"];
    assert_eq!(g["samplers"], json!(["top_k", "temperature"]), "{g}");
    assert_eq!(g["dry_multiplier"], 0.5, "{g}");
    // Soft limits clamp (mirostat 0..=2), as llama-server's.
    assert_eq!(g["mirostat"], 2, "{g}");
    // /props: the file type and which optional endpoints are on, as llama-server's.
    let props = get(port, "/props").json();
    assert_eq!(props["model_ftype"], "Q4_1", "{props}");
    assert_eq!(props["endpoint_metrics"], false, "{props}");
    assert!(props["endpoint_slots"].is_boolean(), "{props}");
    assert_eq!(props["modalities"]["video"], false, "{props}");
    assert_eq!(
        props["default_generation_settings"]["params"]["samplers"],
        json!([
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typ_p",
            "top_p",
            "min_p",
            "xtc",
            "temperature"
        ]),
        "{props}"
    );
    // A float for an integer field is cut toward zero, as llama-server's JSON library
    // converts it.
    let r = post(
        port,
        "/completion",
        &json!({"prompt": "Once upon a time", "n_predict": 3.7, "temperature": 0.0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["tokens_predicted"], 3, "{}", r.body);
    // Hard limits and bad values: llama-server's 400s.
    for (body, msg) in [
        (
            json!({"prompt": "Hi", "dry_penalty_last_n": -1}),
            "Field 'dry_penalty_last_n': Value must be between 0 <= value <= 2147483647, but got -1",
        ),
        (
            json!({"prompt": "Hi", "repeat_last_n": -1}),
            "Field 'repeat_last_n': Value must be between 0 <= value <= 2147483647, but got -1",
        ),
        (
            json!({"prompt": "Hi", "dry_sequence_breakers": []}),
            "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings",
        ),
        (
            json!({"prompt": "Hi", "samplers": ["top_k", "infill"]}),
            "Field 'samplers': the sampler 'infill' is not supported by modelc",
        ),
    ] {
        let r = post(port, "/completion", &body);
        assert_error(&r, 400, "invalid_request_error");
        assert_eq!(r.json()["error"]["message"], msg);
    }
    drop(s);
}

/// Tool calls through the OpenAI Python client (`runtime/tests/data/openai_tools.py`):
/// SmolLM2 with Qwen 2.5's template (Hermes `<tool_call>` format), calls required or named
/// so that the grammar makes them; whole and streamed the same call, `tool_choice: none`,
/// a tool result rendered back.
#[test]
fn openai_python_client_tools() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let Some(templates) = modelc_tests::shared("templates") else {
        return;
    };
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let Some(python) = modelc_tests::require(
        home.join(".cache/modelc/venv-server/bin/python"),
        "scripts/fetch-server-tests installs it",
    ) else {
        return;
    };
    let template = templates.join("Qwen-Qwen2.5-7B-Instruct.jinja");
    let template = template.to_str().unwrap();
    let srv = start(
        &model,
        &[
            "-c",
            "2048",
            "--alias",
            "smol",
            "--chat-template-file",
            template,
        ],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/openai_tools.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", srv.port))
        .arg("smol")
        .output()
        .expect("run python");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A lazy grammar (`grammar_lazy`, `grammar_triggers`): greedy, the text up to the trigger
/// is the unconstrained model's, and from the trigger on the text is the grammar's (which
/// the model would not have written).
#[test]
fn lazy_grammar_holds_after_its_trigger() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let srv = start(&model, &["-c", "512"]);
    let prompt = "Once upon a time";
    let free = greedy(srv.port, prompt, 24);
    let text = free["content"].as_str().unwrap().to_string();
    let tokens = ids(&free["tokens"]);
    let piece = |range: &[u64]| -> String {
        let r = post(srv.port, "/detokenize", &json!({ "tokens": range }));
        r.json()["content"].as_str().unwrap().to_string()
    };
    // The trigger: a whole token's text, at its first place in the output.
    let (at, word) = (4..tokens.len())
        .find_map(|k| {
            let w = piece(&tokens[k..=k]);
            let at = piece(&tokens[..k]).len();
            (w.trim().len() > 2 && text.find(&w) == Some(at)).then_some((at, w))
        })
        .expect("a trigger token in the output");
    let tail = " {\"a\": ";
    assert!(!text[at + word.len()..].starts_with(tail));
    let literal = serde_json::to_string(&word).unwrap();
    let grammar = format!("root ::= {literal} \" {{\\\"a\\\": \" [0-9] [0-9]? \"}}\"");
    let r = post(
        srv.port,
        "/completion",
        &json!({
            "prompt": prompt, "n_predict": 40, "temperature": 0, "cache_prompt": false,
            "grammar": grammar, "grammar_lazy": true,
            "grammar_triggers": [{"type": 1, "value": word}],
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let out = r.json();
    let content = out["content"].as_str().unwrap();
    assert_eq!(
        &content[..at + word.len()],
        &text[..at + word.len()],
        "{out}"
    );
    let rest = &content[at + word.len()..];
    let digits = rest
        .strip_prefix(tail)
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or_else(|| panic!("after the trigger: {rest:?}"));
    assert!(
        (1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
        "{rest:?}"
    );
    assert_eq!(out["stop_type"], "eos", "{out}");
    // Not lazy, the same grammar holds from the first token.
    let r = post(
        srv.port,
        "/completion",
        &json!({"prompt": prompt, "n_predict": 40, "temperature": 0, "grammar": grammar}),
    );
    assert_eq!(
        r.json()["content"].as_str().unwrap(),
        format!("{word}{tail}{digits}}}")
    );
}

/// Reasoning: with DeepSeek R1's template (its prompt opens `<think>`), the reply's thought
/// goes to `reasoning_content` (`--reasoning-format` auto), whole and streamed alike, or
/// stays in `content` with `"reasoning_format": "none"`; `--reasoning-budget N` closes the
/// thought after N tokens of it (N = 0: at once), the text before it the free run's.
#[test]
fn reasoning_content_and_budget() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let Some(templates) = modelc_tests::shared("templates") else {
        return;
    };
    let template = templates.join("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja");
    let template = template.to_str().unwrap();
    let chat = |port: u16, extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Why is the sky blue?"}],
            "max_tokens": 24, "temperature": 0,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(port, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r
    };
    let srv = start(&model, &["-c", "512", "--chat-template-file", template]);
    let whole = chat(srv.port, json!({})).json();
    let msg = &whole["choices"][0]["message"];
    let raw = chat(srv.port, json!({"reasoning_format": "none"})).json();
    let raw = raw["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let thought = msg["reasoning_content"].as_str().unwrap_or("");
    assert!(!thought.is_empty(), "{whole}");
    assert!(raw.contains(thought), "{raw:?} / {thought:?}");
    assert!(msg.get("reasoning_content").is_some());
    // Streamed: the same thought and content, in reasoning_content deltas.
    let r = chat(srv.port, json!({"stream": true}));
    let (mut reasoning, mut content) = (String::new(), String::new());
    for d in sse_data(&r.body) {
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        let delta = &v["choices"][0]["delta"];
        reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        content += delta["content"].as_str().unwrap_or("");
    }
    assert_eq!(reasoning, thought);
    assert_eq!(content, msg["content"].as_str().unwrap());
    drop(srv);

    let tokens = |port: u16, text: &str| {
        let r = post(port, "/tokenize", &json!({ "content": text }));
        r.json()["tokens"].as_array().unwrap().len()
    };
    let budget = start(
        &model,
        &[
            "-c",
            "512",
            "--chat-template-file",
            template,
            "--reasoning-budget",
            "5",
        ],
    );
    let out = chat(budget.port, json!({"reasoning_format": "none"})).json();
    let text = out["choices"][0]["message"]["content"].as_str().unwrap();
    let (before, _) = text
        .split_once("</think>")
        .unwrap_or_else(|| panic!("no </think> in {text:?}"));
    assert!(raw.starts_with(before), "{raw:?} / {before:?}");
    assert_eq!(tokens(budget.port, before), 5, "{before:?}");
    let split = chat(budget.port, json!({})).json();
    assert_eq!(
        split["choices"][0]["message"]["reasoning_content"]
            .as_str()
            .unwrap_or(""),
        before.trim()
    );
    drop(budget);

    let none = start(
        &model,
        &[
            "-c",
            "512",
            "--chat-template-file",
            template,
            "--reasoning-budget",
            "0",
        ],
    );
    let out = chat(none.port, json!({"reasoning_format": "none"})).json();
    let text = out["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("</think>"), "{text:?}");
}
