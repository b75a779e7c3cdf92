//! The chat page (llama-server's web UI, `tools/server/server-http.cpp`): served at
//! `{--api-prefix}/` unless `--no-ui`, from files built into the binary (`webui/`: plain
//! HTML, CSS and JavaScript written for modelc; nothing is fetched from the network), or
//! the static files of `--path DIR` instead.
//!
//! As llama-server, the page's files need no API key (the page asks for one and sends it
//! with its API requests) and are served while the model loads (the page waits for it).

use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use std::path::{Component, Path, PathBuf};

/// One built-in file: its name under the prefix, content type, bytes.
struct Asset {
    name: &'static str,
    mime: &'static str,
    body: &'static [u8],
}

/// The built-in page. `index.html` is also served at `/`.
const ASSETS: [Asset; 3] = [
    Asset {
        name: "index.html",
        mime: "text/html; charset=utf-8",
        body: include_bytes!("webui/index.html"),
    },
    Asset {
        name: "chat.css",
        mime: "text/css; charset=utf-8",
        body: include_bytes!("webui/chat.css"),
    },
    Asset {
        name: "chat.js",
        mime: "text/javascript; charset=utf-8",
        body: include_bytes!("webui/chat.js"),
    },
];

/// Served at `/sw.js` whatever serves the page (unless `--path` has its own): a service
/// worker that removes itself, for browsers that kept llama-server's web UI's worker for this
/// address (llama-server answers the same when its UI is off or replaced).
const SW_REMOVE: Asset = Asset {
    name: "sw.js",
    mime: "text/javascript; charset=utf-8",
    body: include_bytes!("webui/sw.js"),
};

/// Bytes the built-in page adds to the binary.
pub fn size() -> usize {
    ASSETS
        .iter()
        .chain([&SW_REMOVE])
        .map(|a| a.body.len())
        .sum()
}

/// What serves the page: the built-in files, a folder (`--path`), or nothing (`--no-ui`).
#[derive(Clone, Debug)]
pub enum Ui {
    /// `--no-ui`: `/` answers llama-server's 404 `File Not Found`.
    Off,
    /// The files built into the binary.
    Builtin,
    /// `--path DIR`: the files under DIR (`/` is `DIR/index.html`).
    Dir(PathBuf),
}

/// `path` relative to `prefix` (`/v1x/chat.js` under `/v1x` is `/chat.js`); `None` outside it.
pub fn strip_prefix<'a>(prefix: &str, path: &'a str) -> Option<&'a str> {
    let rest = path.strip_prefix(prefix)?;
    rest.starts_with('/').then_some(rest)
}

impl Ui {
    /// The answer to `GET path` (`HEAD` too; `path` without the prefix) when it is one of
    /// the page's files: with `--path`, any file under DIR. Those need no key and are
    /// served while the model loads.
    pub fn serve(&self, method: &Method, path: &str) -> Option<Response> {
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        let page = match self {
            Ui::Off => None,
            Ui::Builtin => {
                let name = if path == "/" {
                    "index.html"
                } else {
                    path.get(1..)?
                };
                ASSETS
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| file_response(a.mime, a.body.to_vec()))
            }
            Ui::Dir(dir) => resolve(dir, path).and_then(|file| {
                let body = std::fs::read(&file).ok()?;
                Some(file_response(mime(&file), body))
            }),
        };
        page.or_else(|| {
            (path == "/sw.js").then(|| file_response(SW_REMOVE.mime, SW_REMOVE.body.to_vec()))
        })
    }
}

/// The file under `dir` that `path` names (`/` and folders: their `index.html`); `None` for
/// a path with `..`, a missing file, or one outside `dir` through a link.
fn resolve(dir: &Path, path: &str) -> Option<PathBuf> {
    let path = percent_decode(path)?;
    let rel = Path::new(path.trim_start_matches('/'));
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let mut file = dir.join(rel);
    if file.is_dir() {
        file.push("index.html");
    }
    let real = file.canonicalize().ok()?;
    let root = dir.canonicalize().ok()?;
    (real.starts_with(&root) && real.is_file()).then_some(real)
}

/// `path` with its `%XX` escapes decoded (`None`: a bad escape, or not UTF-8).
fn percent_decode(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A content type from a file's extension (the web's common ones; else bytes).
fn mime(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" | "webmanifest" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "ico" => "image/x-icon",
        "wasm" => "application/wasm",
        "txt" => "text/plain; charset=utf-8",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

fn file_response(mime: &'static str, body: Vec<u8>) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    // Revalidated on every load, so that a new binary's page is picked up at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in page stays small (the bound: under 1 MB in the binary).
    #[test]
    fn small() {
        assert!(size() < 1 << 20, "{} bytes", size());
    }

    /// `--path` serves files under its folder and nothing outside it.
    #[test]
    fn dir_stays_inside() {
        let tmp = std::env::temp_dir().join(format!("modelc-webui-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("www/sub")).expect("mkdir");
        std::fs::write(tmp.join("www/index.html"), "<p>hi</p>").expect("write");
        std::fs::write(tmp.join("www/sub/a.js"), "1").expect("write");
        std::fs::write(tmp.join("secret.txt"), "no").expect("write");
        let ui = Ui::Dir(tmp.join("www"));
        let page = |p: &str| ui.serve(&Method::GET, p).is_some();
        assert!(page("/"));
        assert!(page("/sub/a.js"));
        assert!(!page("/../secret.txt"));
        assert!(!page("/sub/../../secret.txt"));
        assert!(!page("/missing.js"));
        assert!(!page("/%2e%2e/secret.txt"));
        assert!(!page("/sub%2f..%2f..%2fsecret.txt"));
        assert!(page("/sub%2fa.js"));
        assert!(!page("/%zz"));
        let r = ui.serve(&Method::GET, "/sub/a.js").expect("served");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert!(ui.serve(&Method::POST, "/").is_none());
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn prefix() {
        assert_eq!(strip_prefix("/v1x", "/v1x/chat.js"), Some("/chat.js"));
        assert_eq!(strip_prefix("/v1x", "/v1xy/chat.js"), None);
        assert_eq!(strip_prefix("", "/chat.js"), Some("/chat.js"));
        assert!(Ui::Builtin.serve(&Method::GET, "/chat.js").is_some());
        assert!(Ui::Builtin.serve(&Method::GET, "/").is_some());
        assert!(Ui::Builtin.serve(&Method::GET, "/health").is_none());
        assert!(Ui::Off.serve(&Method::GET, "/").is_none());
        assert!(Ui::Off.serve(&Method::GET, "/sw.js").is_some());
    }
}
