//! `modelc serve` and clients that never finish a request (llama-server's `--timeout`, its
//! read/write timeout): raw TCP clients on 127.0.0.1 that send nothing, half a request's
//! headers, half a body, or nothing after a kept-alive request are closed by the server
//! after `--timeout`; with more such clients than the server keeps open at once (its bound,
//! from `ulimit -n`), a normal request is still answered. The unit tests of
//! `server::conn` check the write timeout and the body's on tokio's paused clock.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a client waits for the server to close a stuck connection or to answer: far
/// past the `--timeout`s used here, so that only a server that never closes fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// A running `modelc serve`, killed when dropped.
struct Server {
    child: Child,
    port: u16,
    /// The bound on open connections it printed.
    max_conns: usize,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `modelc serve MODEL --port 0 -t 1 ARGS` (under `ulimit -n FDS` when given), reads
/// its port and its bound on connections from stderr, and waits until /health answers 200.
fn start(model: &Path, args: &[&str], fds: Option<u32>) -> Server {
    let mut cmd = match fds {
        Some(n) => {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                .arg(env!("CARGO_BIN_EXE_modelc"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_modelc")),
    };
    let mut child = cmd
        .arg("serve")
        .arg(model)
        .args(["--port", "0", "-t", "1"])
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start modelc serve");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let mut port = None;
    let max_conns = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("stderr") > 0,
            "serve exited before listening"
        );
        if let Some(rest) = line.split("http://").nth(1) {
            port = rest
                .split(|c: char| !c.is_ascii_digit() && c != ':' && c != '.')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok());
        }
        if let Some(rest) = line.split("at most ").nth(1) {
            break rest
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a number of connections");
        }
    };
    let port = port.expect("a port before the bound");
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    let srv = Server {
        child,
        port,
        max_conns,
    };
    for _ in 0..1200 {
        if health(port) == Some(200) {
            return srv;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not ready after 120 s");
}

/// GET /health on a new connection: its status, or `None` without an answer in
/// [`PATIENCE`].
fn health(port: u16) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(PATIENCE)).ok()?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    text.split(' ').nth(1).and_then(|c| c.parse().ok())
}

/// A client that connects and sends `sent` and nothing more.
fn stuck(port: u16, sent: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(sent).expect("send");
    s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    s
}

/// Whether the server closed `s` within [`PATIENCE`] (reading whatever it answered first):
/// end of stream or a reset, not a read that timed out.
fn closed_by_server(mut s: TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        }
    }
}

/// What stuck clients send: nothing, half the headers, the headers and half the body.
const HALVES: [&[u8]; 3] = [
    b"",
    b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl",
    b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"Hel",
];

/// Clients that stop halfway are closed after `--timeout`, and so is a kept-alive
/// connection that sends no next request; the server then answers as before.
#[test]
fn unfinished_requests_are_closed() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let srv = start(&model, &["--timeout", "1"], None);
    let mut clients: Vec<(String, TcpStream)> = HALVES
        .iter()
        .map(|h| (String::from_utf8_lossy(h).into_owned(), stuck(srv.port, h)))
        .collect();
    // A complete request on a kept-alive connection, its answer read, then nothing.
    let mut kept = stuck(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut head = [0u8; 12];
    kept.read_exact(&mut head).expect("an answer");
    assert_eq!(&head, b"HTTP/1.1 200");
    clients.push(("a kept-alive connection after its request".into(), kept));
    for (what, s) in clients {
        assert!(
            closed_by_server(s),
            "still open after {PATIENCE:?}: {what:?}"
        );
    }
    assert_eq!(health(srv.port), Some(200));
}

/// Stuck clients below the bound do not keep a normal request from being answered at once
/// (`--timeout` 600: none of them is closed meanwhile); more stuck clients than the bound
/// (under `ulimit -n 128`: 64 connections) cost the server no descriptors it needs, and
/// once `--timeout` closes them, a normal request is answered.
#[test]
fn stuck_clients_do_not_stop_the_server() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    {
        let srv = start(&model, &[], None);
        assert!(srv.max_conns >= 64, "bound {}", srv.max_conns);
        let held: Vec<TcpStream> = (0..48)
            .map(|i| stuck(srv.port, HALVES[i % HALVES.len()]))
            .collect();
        assert_eq!(health(srv.port), Some(200));
        // All still open: nothing was dropped to make room.
        for mut s in held {
            s.set_nonblocking(true).expect("nonblocking");
            let mut b = [0u8; 1];
            let r = s.read(&mut b);
            assert!(
                matches!(&r, Err(e) if e.kind() == ErrorKind::WouldBlock),
                "a stuck client was closed early: {r:?}"
            );
        }
    }
    let srv = start(&model, &["--timeout", "2"], Some(128));
    assert_eq!(srv.max_conns, 128 - 64, "ulimit -n 128 less 64 kept");
    let held: Vec<TcpStream> = (0..srv.max_conns + 16)
        .map(|i| stuck(srv.port, HALVES[1 + i % 2]))
        .collect();
    assert_eq!(
        health(srv.port),
        Some(200),
        "a normal request behind stuck ones"
    );
    for s in held {
        assert!(closed_by_server(s), "a stuck client still open");
    }
    assert_eq!(health(srv.port), Some(200));
}
