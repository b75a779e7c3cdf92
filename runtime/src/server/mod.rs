//! The HTTP server (`modelc serve MODEL.gguf`, `./NAME serve`): llama-server's API
//! (`tools/server/`) over axum and tokio, so that OpenAI clients and llama.cpp's tools work
//! unchanged.
//!
//! ```text
//! HTTP handlers (tokio) ──Job──▶ queue (permits) ──▶ inference thread (owns the Session)
//!        ▲                                              │ one decode_batch per step,
//!        └──────────── Event channel per request ◀──────┘ all busy slots together
//! ```
//!
//! - [`slots`]: the inference thread: `-np N` slots, one sequence each, batched steps,
//!   prompt cache, cancellation of requests nobody waits for.
//! - [`webui`]: the chat page at `/` (`--no-ui`, `--path`), everything under `--api-prefix`.
//! - [`api`]: the endpoints; [`params`]: reading request fields; [`error`]: llama-server's
//!   error object; [`metrics`]: `/metrics`; [`streams`]: resumable streams
//!   (`X-Conversation-Id`, `/v1/stream`).
//!
//! The listener is up while the model loads (`/health` answers 503 `Loading model`, as
//! llama-server). SIGTERM / SIGINT stop accepting connections, cancel running requests and
//! exit with status 0.

pub mod api;
pub mod conn;
pub mod error;
pub mod flags;
pub mod grammar;
pub mod metrics;
pub mod params;
pub mod sampling;
pub mod slots;
pub mod streams;
pub mod tools;
pub mod webui;

use crate::chat::ChatTemplate;
use crate::generate::GenerateOptions;
use crate::session::Session;
use crate::tokenizer::Vocab;
use api::completion::Api;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use params::Body;
use slots::{Job, Shared};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;

/// The server's flags, with llama-server's names (`common/arg.cpp`).
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Addresses to listen on, comma-separated (`127.0.0.1,::1`).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed when listening).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Slots: requests served at once (`-np`); each gets `-c / N` positions of context
    /// (all `-c` of them with `--kv-unified`).
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: usize,
    /// One KV pool of `-c` cells for all slots (`-kvu`), as llama-server's unified cache:
    /// each slot may use the whole context, all of them together at most `-c` cells. A
    /// step that finds the pool full first drops the idle slots' caches, then fails the
    /// running requests with "Context size has been exceeded." (500). Each slot still
    /// computes in its own memory (reserved for the whole context, mapped as it is used),
    /// so its tokens stay what it would get alone.
    #[arg(long = "kv-unified", overrides_with = "no_kv_unified")]
    pub kv_unified: bool,
    /// One KV stream of `-c / N` cells per slot (`-no-kvu`, the default).
    #[arg(long = "no-kv-unified", overrides_with = "kv_unified")]
    pub no_kv_unified: bool,
    /// Requests that may wait for a free slot; more get 503.
    #[arg(long = "queue-size", default_value_t = 64)]
    pub queue_size: usize,
    /// Require this key (`Authorization: Bearer KEY` or `X-Api-Key`) on every endpoint but
    /// /health and /models.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// The model's names in responses and /v1/models, comma-separated (default: the file's
    /// name); the first in alphabetical order is its id, as llama-server.
    #[arg(long = "alias", short = 'a')]
    pub alias: Option<String>,
    /// Tags listed with the model in /v1/models, comma-separated.
    #[arg(long = "tags")]
    pub tags: Option<String>,
    /// Serve /metrics (Prometheus text).
    #[arg(long)]
    pub metrics: bool,
    /// Serve /slots (off by default, as in llama-server).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    /// Do not serve /slots (the default).
    #[arg(long = "no-slots", overrides_with = "slots")]
    pub no_slots: bool,
    /// A chat request ending with an assistant message continues it (llama-server's
    /// assistant prefill, on by default; `--no-prefill-assistant` renders it as a whole
    /// turn and adds a new assistant header after it).
    #[arg(long = "no-prefill-assistant", overrides_with = "prefill_assistant")]
    pub no_prefill_assistant: bool,
    /// Continue a final assistant message (the default).
    #[arg(long = "prefill-assistant", overrides_with = "no_prefill_assistant")]
    pub prefill_assistant: bool,
    /// `/infill` prompts put the suffix before the prefix (`--spm-infill`, the order some
    /// models were trained with).
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// Seconds a client may take to send a request's headers, each next piece of its body,
    /// or to take each piece of the answer (`-to`, llama-server's read/write timeout); past
    /// it the connection is closed. Waiting for a slot and generating do not count. Open
    /// connections are bounded too: at most `ulimit -n` less 64 (4096 at most) at once,
    /// further clients wait to be accepted until one closes.
    #[arg(long = "timeout", value_name = "N", default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long = "max-body", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Accepted for llama-server's command lines: batching is always continuous.
    #[arg(long = "cont-batching", hide = true)]
    pub cont_batching: bool,
    /// Serve the chat page at `/` (`--ui`, `--webui`: the default), from files built into
    /// the binary.
    #[arg(long = "ui", visible_alias = "webui", overrides_with = "no_ui")]
    pub ui: bool,
    /// Do not serve the chat page (`--no-ui`, `--no-webui`): `/` answers llama-server's 404.
    #[arg(long = "no-ui", visible_alias = "no-webui", overrides_with = "ui")]
    pub no_ui: bool,
    /// Serve the static files of DIR at `/` instead of the built-in page (`/` is
    /// `DIR/index.html`).
    #[arg(long = "path", value_name = "DIR")]
    pub path: Option<std::path::PathBuf>,
    /// Serve the page and every endpoint under PREFIX (`--api-prefix /v1x`: `/v1x/health`,
    /// `/v1x/v1/chat/completions`, the page at `/v1x/`), without a trailing slash.
    #[arg(
        long = "api-prefix",
        value_name = "PREFIX",
        default_value = "",
        hide_default_value = true
    )]
    pub api_prefix: String,
    /// `--jinja` / `--no-jinja`: modelc renders chat templates with Jinja.
    #[command(flatten)]
    pub jinja: crate::cli::llama_flags::JinjaArgs,
    /// llama-server's other flags ([`flags`]).
    #[command(flatten)]
    pub compat: flags::ServerCompat,
    /// `--embedding`, `--pooling`, `--embd-normalize`.
    #[command(flatten)]
    pub embed: api::embeddings::EmbedArgs,
}

impl ServerArgs {
    /// Refuses settings that cannot work (`-np 0`, an empty queue).
    ///
    /// # Errors
    /// The first such setting, naming its flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.parallel >= 1, "-np must be at least 1");
        anyhow::ensure!(self.queue_size >= 1, "--queue-size must be at least 1");
        anyhow::ensure!(self.timeout >= 1, "--timeout must be at least 1 second");
        self.compat.validate()?;
        let p = &self.api_prefix;
        anyhow::ensure!(
            p.is_empty() || (p.starts_with('/') && !p.ends_with('/')),
            "--api-prefix must start with '/' and not end with one (as /v1x), got {p:?}"
        );
        if let Some(dir) = &self.path {
            anyhow::ensure!(
                dir.is_dir(),
                "--path: static assets path not found: {}",
                dir.display()
            );
        }
        Ok(())
    }

    /// The API keys: `--api-key`'s (comma-separated, as llama-server) and
    /// `--api-key-file`'s; none: no key is asked for.
    ///
    /// # Errors
    /// `--api-key-file` unreadable.
    pub fn api_keys(&self) -> anyhow::Result<Vec<String>> {
        let mut keys: Vec<String> = self
            .api_key
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        keys.extend(self.compat.api_keys()?);
        Ok(keys)
    }

    /// The note lines of flags taken without effect ([`flags`], `--no-jinja`).
    pub fn notes(&self) {
        self.jinja.notes();
        self.compat.notes();
    }

    /// What serves the page: nothing with `--no-ui`, else `--path`'s folder, else the
    /// built-in files.
    pub fn ui(&self) -> webui::Ui {
        match &self.path {
            _ if self.no_ui && !self.ui => webui::Ui::Off,
            Some(dir) => webui::Ui::Dir(dir.clone()),
            None => webui::Ui::Builtin,
        }
    }
}

/// The server's settings besides the model.
#[derive(Clone, Debug)]
pub struct Config {
    /// The server's flags.
    pub args: ServerArgs,
    /// Generation defaults (the command line's sampler flags, `-n`, `--stop`, `-b`).
    pub defaults: GenerateOptions,
    /// `-s`: a fixed default seed; `None` draws one per request.
    pub seed: Option<u64>,
    /// When the server started (Unix seconds; `/metrics`' `Process-Start-Time-Unix`).
    pub started: u64,
    /// The command line's grammar (`--grammar`, `--json-schema`, ...) as GBNF: requests
    /// without one of their own are constrained by it.
    pub grammar: Option<String>,
    /// DRY's processed sequence breakers, per list of breakers requests used.
    pub dry_cache: std::sync::Arc<sampling::DryCache>,
    /// What serves the chat page ([`ServerArgs::ui`]).
    pub ui: webui::Ui,
    /// The API keys ([`ServerArgs::api_keys`]); empty: none asked for.
    pub api_keys: Vec<String>,
}

impl Config {
    /// The settings of `args` with generation defaults `defaults` and seed `seed`.
    pub fn new(args: &ServerArgs, defaults: GenerateOptions, seed: Option<u64>) -> Config {
        Config {
            args: args.clone(),
            defaults,
            seed,
            grammar: None,
            dry_cache: Default::default(),
            ui: args.ui(),
            // Read again by `validate`, which reports an unreadable file.
            api_keys: args.api_keys().unwrap_or_default(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// Whether /slots is served (`--slots`, not `--no-slots`).
    pub fn slots(&self) -> bool {
        self.args.slots && !self.args.no_slots
    }

    /// Requests held at most: one per slot plus the queue.
    pub fn capacity(&self) -> usize {
        self.args.parallel + self.args.queue_size
    }

    /// The generation options of a request: its fields over the server's defaults
    /// (llama-server's names: `n_predict` (else `max_tokens`, `max_completion_tokens`),
    /// `temperature`, `top_k`, `top_p`, `min_p`, `repeat_penalty`, `repeat_last_n`,
    /// `frequency_penalty`, `presence_penalty`, `seed`, `stop`, `n_probs` (chat:
    /// `logprobs` + `top_logprobs`; `/v1/completions`: `logprobs` as a number),
    /// `ignore_eos`, `cache_prompt`).
    ///
    /// # Errors
    /// 400 for a field of the wrong type or out of range.
    pub fn options(
        &self,
        body: &Body,
        api: Api,
        vocab: &Vocab,
    ) -> Result<GenerateOptions, ApiError> {
        let n_vocab = vocab.n_vocab();
        let mut o = self.defaults.clone();
        let n_predict = match body.i64("n_predict")? {
            Some(n) => Some(n),
            None => match body.i64("max_tokens")? {
                Some(n) => Some(n),
                None => body.i64("max_completion_tokens")?,
            },
        };
        if let Some(n) = n_predict {
            if !(-1..=i64::from(i32::MAX)).contains(&n) {
                let name = ["n_predict", "max_tokens", "max_completion_tokens"]
                    .into_iter()
                    .find(|k| body.get(k).is_some_and(|v| !v.is_null()))
                    .unwrap_or("n_predict");
                return Err(ApiError::invalid(format!(
                    "Field '{name}': Value must be between -1 <= value <= {}, but got {n}",
                    i32::MAX
                )));
            }
            o.n_predict = n;
        }
        // llama-server checks the limit after each token: `n_predict` 0 still generates one.
        if o.n_predict == 0 {
            o.n_predict = 1;
        }
        let s = &mut o.sampler;
        if let Some(t) = body.f32("temperature")? {
            s.temp = t.max(0.0);
        }
        if let Some(k) = body.i64("top_k")? {
            s.top_k = i32::try_from(k).unwrap_or(i32::MAX);
        }
        if let Some(p) = body.f32("top_p")? {
            s.top_p = p;
        }
        if let Some(p) = body.f32("min_p")? {
            s.min_p = p;
        }
        if let Some(p) = body.f32("repeat_penalty")? {
            if p == 0.0 {
                return Err(ApiError::invalid(
                    "\"repeat_penalty\" must not be 0 (1.0 disables it)",
                ));
            }
            s.repeat_penalty = p;
        }
        if let Some(n) = body.i64("repeat_last_n")? {
            // llama-server's hard limit (`server-schema.cpp`): 0 ..= INT32_MAX.
            if !(0..=i64::from(i32::MAX)).contains(&n) {
                return Err(ApiError::invalid(format!(
                    "Field 'repeat_last_n': Value must be between 0 <= value <= {}, but got {n}",
                    i32::MAX
                )));
            }
            s.repeat_last_n = n as i32;
        }
        if let Some(p) = body.f32("frequency_penalty")? {
            s.frequency_penalty = p;
        }
        if let Some(p) = body.f32("presence_penalty")? {
            s.presence_penalty = p;
        }
        sampling::read(body, s, &self.defaults.sampler)?;
        // llama-server's seed is a `uint32_t`: a JSON number wraps to 32 bits (-7 is
        // 4294967289), and -1 (`LLAMA_DEFAULT_SEED`, 0xFFFFFFFF) asks for the default.
        s.seed = match body.i64("seed")?.map(|n| n as u64 & 0xFFFF_FFFF) {
            Some(n) if n != 0xFFFF_FFFF => n,
            _ => self
                .seed
                .unwrap_or_else(|| u64::from(rand::random_range(0..u32::MAX))),
        };
        if body.get("stop").is_some() {
            o.stop = body.stop()?;
        }
        let n_probs = match api {
            Api::OaiChat => match body.bool("logprobs")? {
                Some(true) => Some(body.i64("top_logprobs")?.unwrap_or(20)),
                _ => {
                    if body.get("top_logprobs").is_some() {
                        return Err(ApiError::invalid(
                            "top_logprobs requires logprobs to be set to true",
                        ));
                    }
                    body.i64("n_probs")?
                }
            },
            Api::OaiCompletion => match body.get("logprobs") {
                Some(serde_json::Value::Bool(true)) => Some(1),
                Some(serde_json::Value::Bool(false)) => None,
                Some(_) => body.i64("logprobs")?,
                None => body.i64("n_probs")?,
            },
            Api::Llama | Api::Infill => body.i64("n_probs")?,
        };
        if let Some(n) = n_probs {
            o.n_probs = usize::try_from(n).unwrap_or(0).min(n_vocab);
        }
        if let Some(b) = body.bool("post_sampling_probs")? {
            o.post_sampling_probs = b;
        }
        if let Some(b) = body.bool("ignore_eos")? {
            o.ignore_eos = b;
        }
        if let Some(b) = body.bool("cache_prompt")? {
            o.cache_prompt = b;
        }
        o.logit_bias = match body.get("logit_bias") {
            None => Vec::new(),
            Some(v) => params::logit_bias(vocab, v)?,
        };
        if o.ignore_eos {
            // llama.cpp bans the end-of-generation tokens (`common_init_from_params`).
            o.logit_bias.extend(
                (0..n_vocab as u32)
                    .filter(|&t| vocab.is_eog(t))
                    .map(|t| (t, f32::NEG_INFINITY)),
            );
        }
        o.dry_breakers = self.dry_cache.get(vocab, &o.sampler);
        o.cancel = None;
        o.context_shift = None;
        o.forced = None;
        Ok(o)
    }
}

/// What the HTTP side knows of the loaded model.
pub struct Ready {
    /// The tokenizer.
    pub vocab: Arc<Vocab>,
    /// The chat template (`None`: the model has none; chat endpoints answer 501).
    pub template: Option<ChatTemplate>,
    /// The template's source, for /props.
    pub template_source: String,
    /// The model's id: the first of its aliases in alphabetical order.
    pub model_name: String,
    /// `--alias` (comma-separated), else the file's name.
    pub aliases: Vec<String>,
    /// `--tags`.
    pub tags: Vec<String>,
    /// The chat template's extra variables from the command line
    /// (`--chat-template-kwargs`, `--reasoning`); a request's `chat_template_kwargs` go
    /// over them.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The model's path.
    pub model_path: String,
    /// `general.file_type`'s name, as llama.cpp's `llama_model_ftype_name` (`Q4_1`,
    /// `Q4_K - Medium`; /props' `model_ftype`).
    pub model_ftype: String,
    /// Context of each slot.
    pub n_ctx_slot: usize,
    /// The model's training context.
    pub n_ctx_train: usize,
    /// Embedding size.
    pub n_embd: usize,
    /// Parameters.
    pub n_params: u64,
    /// Bytes of weights.
    pub size: u64,
    /// When the model was loaded (Unix seconds).
    pub created: u64,
    /// `system_fingerprint` / `build_info`: modelc's version.
    pub fingerprint: String,
}

/// What the model loader hands the inference thread: the session (one sequence per slot)
/// and what the HTTP side needs ([`Ready`]).
pub struct Loaded<'a> {
    /// The session.
    pub session: Session<'a>,
    /// What the HTTP side knows of the model.
    pub ready: Ready,
}

/// Loads the model on the inference thread and calls its argument with it; returns when
/// that call returns. (A callback, because the session borrows the model file it opens.)
pub type Loader =
    Box<dyn FnOnce(&mut dyn FnMut(Loaded<'_>)) -> anyhow::Result<()> + Send + 'static>;

/// The handlers' shared state.
#[derive(Clone)]
pub struct AppState {
    /// Settings.
    pub cfg: Arc<Config>,
    /// Set once the model is loaded.
    pub ready: Arc<OnceLock<Arc<Ready>>>,
    /// The queue to the inference thread.
    pub jobs: mpsc::UnboundedSender<Job>,
    /// One permit per request the server holds at most: slots + `--queue-size`.
    pub permits: Arc<tokio::sync::Semaphore>,
    /// What the inference thread publishes.
    pub shared: Arc<Shared>,
    /// The resumable streams (`X-Conversation-Id`).
    pub streams: Arc<streams::Streams>,
    /// The embeddings thread (`--embedding`).
    pub embed: Option<Arc<api::embeddings::EmbedService>>,
}

impl AppState {
    /// The loaded model, or 503 `Loading model`.
    ///
    /// # Errors
    /// As said.
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("Loading model"))
    }
}

/// A request body, or 413 past the size limit / 400 when it cannot be read.
///
/// # Errors
/// As said.
pub fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            let mut err = ApiError::invalid(e.body_text());
            err.status = StatusCode::PAYLOAD_TOO_LARGE;
            err
        } else {
            ApiError::invalid(e.body_text())
        }
    })
}

/// Endpoints served without an API key (llama-server's `public_endpoints`).
const PUBLIC: [&str; 4] = ["/health", "/v1/health", "/models", "/v1/models"];

/// The chat page's files first ([`webui`]: no key, served while loading, as llama-server's
/// UI assets). Then CORS as llama-server's defaults (`--cors-origins *` with credentials): the request's
/// `Origin` is allowed back on every response, and a preflight (`OPTIONS`) is answered
/// at once, before the key check (browsers send no key with it). Then 503 while loading
/// (every endpoint, as llama-server), then the API key check.
async fn gate(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    // The page's files first (as llama-server: no key, served while loading).
    let page = webui::strip_prefix(&st.cfg.args.api_prefix, req.uri().path())
        .and_then(|p| st.cfg.ui.serve(req.method(), p));
    let mut resp = if let Some(page) = page {
        page
    } else if req.method() == axum::http::Method::OPTIONS {
        let mut r = StatusCode::OK.into_response();
        let c = &st.cfg.args.compat;
        let h = r.headers_mut();
        let value = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static(if c.no_cors_credentials {
                "false"
            } else {
                "true"
            }),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            value(
                c.cors_methods
                    .as_deref()
                    .unwrap_or("GET, POST, DELETE, OPTIONS"),
            ),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            value(c.cors_headers.as_deref().unwrap_or("*")),
        );
        r
    } else if st.ready.get().is_none() {
        ApiError::unavailable("Loading model").into_response()
    } else if !authorized(&st, &req) {
        ApiError::auth().into_response()
    } else {
        next.run(req).await
    };
    if let Some(o) = allowed_origin(&st.cfg.args.compat, origin.as_ref()) {
        resp.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
    }
    resp
}

/// Whether `req` may pass: no `--api-key`, a public endpoint, or the key given as
/// `Authorization: Bearer KEY` (or `X-Api-Key: KEY`).
fn authorized(st: &AppState, req: &Request) -> bool {
    let keys = &st.cfg.api_keys;
    if keys.is_empty() {
        return true;
    }
    let path = webui::strip_prefix(&st.cfg.args.api_prefix, req.uri().path());
    if path.is_some_and(|p| PUBLIC.contains(&p)) {
        return true;
    }
    let h = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let given = h("authorization").or_else(|| h("x-api-key")).unwrap_or("");
    let given = given.strip_prefix("Bearer ").unwrap_or(given);
    keys.iter().any(|k| k == given)
}

/// The `Access-Control-Allow-Origin` answered to a request from `origin`, by llama-server's
/// rules: with `--cors-origins *` and credentials the origin itself, with `localhost` the
/// origin when its host is `localhost`, `127.0.0.1` or `::1` (else none), otherwise the
/// `--cors-origins` list as given.
fn allowed_origin(c: &flags::ServerCompat, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    let credentials = !c.no_cors_credentials;
    match c.cors_origins.as_deref().unwrap_or("*") {
        "*" if credentials => origin.cloned(),
        "localhost" => origin
            .filter(|o| o.to_str().is_ok_and(origin_is_localhost))
            .cloned(),
        list => HeaderValue::from_str(list).ok(),
    }
}

/// Whether an `Origin` (`http://host[:port]`) names the local machine.
fn origin_is_localhost(origin: &str) -> bool {
    let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

async fn not_found() -> ApiError {
    ApiError::not_found("File Not Found")
}

/// llama-server's endpoints this server does not serve (OpenAI's Responses API):
/// llama-server's 501 `not_supported_error`, so that a client learns why instead of reading
/// a 404 as a wrong URL.
async fn not_served() -> ApiError {
    ApiError::not_supported(
        "This server does not support the Responses API: modelc serves text generation only",
    )
}

/// The routes (module doc), under `--api-prefix`; the chat page is served by the gate
/// ([`webui`]).
pub fn router(st: AppState) -> Router {
    use api::{completion, embeddings, info, stream, tokens};
    let limit = st.cfg.args.max_body;
    let prefix = st.cfg.args.api_prefix.clone();
    let routes = Router::new()
        .route("/health", get(info::health))
        .route("/v1/health", get(info::health))
        .route("/models", get(info::models))
        .route("/v1/models", get(info::models))
        .route("/props", get(info::props))
        .route("/slots", get(info::slots))
        .route("/metrics", get(info::metrics))
        .route("/completion", post(completion::llama))
        .route("/completions", post(completion::llama))
        .route("/v1/completions", post(completion::oai_completion))
        .route("/chat/completions", post(completion::oai_chat))
        .route("/v1/chat/completions", post(completion::oai_chat))
        .route(
            "/chat/completions/input_tokens",
            post(completion::chat_input_tokens),
        )
        .route(
            "/v1/chat/completions/input_tokens",
            post(completion::chat_input_tokens),
        )
        .route("/infill", post(completion::infill))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/apply-template", post(tokens::apply_template))
        .route("/v1/stream", get(stream::get).delete(stream::delete))
        .route("/v1/streams/lookup", post(stream::lookup))
        .route("/embedding", post(embeddings::llama))
        .route("/embeddings", post(embeddings::llama))
        .route("/v1/embeddings", post(embeddings::oai))
        .route("/rerank", post(api::rerank::rerank))
        .route("/reranking", post(api::rerank::rerank))
        .route("/v1/rerank", post(api::rerank::rerank))
        .route("/v1/reranking", post(api::rerank::rerank))
        .route("/v1/responses", post(not_served));
    let routes = if prefix.is_empty() {
        routes
    } else {
        Router::new().nest(&prefix, routes)
    };
    routes
        .fallback(not_found)
        // A known path with another method: llama-server's 404 too (its HTTP layer matches
        // method and path together), not an empty 405.
        .method_not_allowed_fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(st.clone(), gate))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(st)
}

/// Runs the server until SIGTERM / SIGINT (module doc): binds, loads the model with
/// `load` on the inference thread, serves.
///
/// # Errors
/// An address that cannot be bound, or a model that cannot be loaded.
pub fn serve(cfg: Config, load: Loader) -> anyhow::Result<()> {
    serve_with_embeddings(cfg, load, None)
}

/// [`serve`], with `embed` (`--embedding`) loading the embedding model on a thread of its
/// own that computes `/v1/embeddings` and `/embedding` ([`api::embeddings`]).
///
/// # Errors
/// As [`serve`].
pub fn serve_with_embeddings(
    cfg: Config,
    load: Loader,
    embed: Option<api::embeddings::EmbedLoader>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve_async(cfg, load, embed))
}

async fn serve_async(
    cfg: Config,
    load: Loader,
    embed: Option<api::embeddings::EmbedLoader>,
) -> anyhow::Result<()> {
    let mut listeners = Vec::new();
    for host in cfg
        .args
        .host
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
    {
        let listener = tokio::net::TcpListener::bind((host, cfg.args.port))
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {host}:{}: {e}", cfg.args.port))?;
        eprintln!(
            "{}: listening on http://{} (loading the model)",
            crate::cli::prog(),
            listener.local_addr()?
        );
        listeners.push(listener);
    }
    anyhow::ensure!(!listeners.is_empty(), "--host: no address to listen on");
    let max_conns = conn::max_connections();
    eprintln!(
        "{}: at most {max_conns} connections open at once; one that stalls {} s sending a request or taking an answer is closed (--timeout)",
        crate::cli::prog(),
        cfg.args.timeout
    );
    let limits = ConnLimits {
        timeout: std::time::Duration::from_secs(cfg.args.timeout),
        open: Arc::new(tokio::sync::Semaphore::new(max_conns)),
    };
    let (jobs_tx, mut jobs_rx) = mpsc::unbounded_channel::<Job>();
    let permits = Arc::new(tokio::sync::Semaphore::new(cfg.capacity()));
    let (failed_tx, mut failed_rx) = mpsc::unbounded_channel::<anyhow::Error>();
    let embed = match embed {
        Some(load) => Some(api::embeddings::start(
            &cfg.args.embed,
            load,
            failed_tx.clone(),
        )?),
        None => None,
    };
    let st = AppState {
        permits,
        cfg: Arc::new(cfg),
        ready: Arc::new(OnceLock::new()),
        jobs: jobs_tx,
        shared: Arc::new(Shared::default()),
        streams: Arc::new(streams::Streams::default()),
        embed,
    };
    {
        let ready = st.ready.clone();
        let shared = st.shared.clone();
        std::thread::Builder::new()
            .name("inference".into())
            .spawn(move || {
                let mut on_loaded = |loaded: Loaded<'_>| {
                    let Loaded {
                        mut session,
                        ready: info,
                    } = loaded;
                    let vocab = info.vocab.clone();
                    eprintln!(
                        "{}: model loaded: {} slots of {} tokens; serving",
                        crate::cli::prog(),
                        session.n_seq_max(),
                        session.n_ctx()
                    );
                    let _ = ready.set(Arc::new(info));
                    slots::run(&mut session, &vocab, &mut jobs_rx, &shared);
                };
                if let Err(e) = load(&mut on_loaded) {
                    let _ = failed_tx.send(e);
                }
            })?;
    }
    let shared = st.shared.clone();
    let app = router(st);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = signal() => {
                eprintln!("{}: stopping (cancelling running requests)", crate::cli::prog());
                shared.shutdown.store(true, Ordering::Relaxed);
            }
            e = failed_rx.recv() => {
                if let Some(e) = e {
                    eprintln!("{}: error: {e:#}", crate::cli::prog());
                    std::process::exit(1);
                }
            }
        }
        let _ = stop_tx.send(true);
    });
    let mut servers = Vec::new();
    for listener in listeners {
        servers.push(tokio::spawn(accept(
            listener,
            app.clone(),
            limits.clone(),
            stop_rx.clone(),
        )));
    }
    for s in servers {
        s.await?;
    }
    Ok(())
}

/// The limits on each connection ([`conn`]): `--timeout` and the bound on open ones.
#[derive(Clone)]
struct ConnLimits {
    /// `--timeout`: for the headers, each piece of a body, each write.
    timeout: std::time::Duration,
    /// One permit per connection open at once ([`conn::max_connections`]), shared by the
    /// listeners.
    open: Arc<tokio::sync::Semaphore>,
}

/// Serves the connections of `listener` with `app` until `stop` turns true, then waits for
/// the open connections to finish (at most [`DRAIN`]). A connection is accepted only with
/// a permit of `limits.open` and is held to `limits.timeout` ([`conn`]). HTTP/1 answers
/// write header names in title case (`Access-Control-Allow-Origin`) as llama-server's do,
/// for clients that compare them exactly.
async fn accept(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnLimits,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    use tower::ServiceExt;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stop = stopped(stop);
    tokio::pin!(stop);
    let timeout = limits.timeout;
    let app = app.map_request(move |req: axum::http::Request<hyper::body::Incoming>| {
        req.map(|b| axum::body::Body::new(conn::TimeoutBody::new(b, timeout)))
    });
    loop {
        // A permit first: at the bound, new clients wait in the backlog, unaccepted.
        let permit = tokio::select! {
            p = limits.open.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else {
                    // Out of file descriptors and the like: try again shortly.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let io = hyper_util::rt::TokioIo::new(conn::WriteTimeout::new(stream, timeout));
                let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                let conn = hyper::server::conn::http1::Builder::new()
                    .title_case_headers(true)
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(timeout)
                    .serve_connection(io, svc);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// Returns once `rx` holds true (or its sender is gone).
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// How long open connections may take to finish after SIGTERM.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// SIGINT or SIGTERM.
async fn signal() {
    let int = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = int.await;
                    return;
                }
            };
        tokio::select! {
            _ = int => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = int.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body as HttpBody;
    use tower::ServiceExt;

    fn state(api_key: Option<&str>) -> AppState {
        state_with(api_key, "", false)
    }

    fn state_with(api_key: Option<&str>, api_prefix: &str, no_ui: bool) -> AppState {
        let args = ServerArgs {
            host: "127.0.0.1".into(),
            port: 0,
            parallel: 1,
            kv_unified: false,
            no_kv_unified: false,
            queue_size: 1,
            api_key: api_key.map(str::to_string),
            alias: None,
            tags: None,
            metrics: false,
            slots: false,
            no_slots: false,
            no_prefill_assistant: false,
            prefill_assistant: false,
            spm_infill: false,
            max_body: 1024,
            timeout: 600,
            cont_batching: false,
            ui: false,
            no_ui,
            path: None,
            api_prefix: api_prefix.to_string(),
            jinja: Default::default(),
            compat: Default::default(),
            embed: Default::default(),
        };
        let (jobs, _) = mpsc::unbounded_channel();
        AppState {
            cfg: Arc::new(Config::new(&args, GenerateOptions::default(), None)),
            ready: Arc::new(OnceLock::new()),
            jobs,
            permits: Arc::new(tokio::sync::Semaphore::new(2)),
            shared: Arc::new(Shared::default()),
            streams: Arc::new(streams::Streams::default()),
            embed: None,
        }
    }

    async fn call_raw(st: AppState, method: &str, path: &str) -> (StatusCode, Bytes) {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(HttpBody::empty())
            .expect("a request");
        let resp = router(st).oneshot(req).await.expect("a response");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("a body");
        (status, bytes)
    }

    async fn call(st: AppState, method: &str, path: &str) -> (StatusCode, serde_json::Value) {
        let (status, bytes) = call_raw(st, method, path).await;
        (status, serde_json::from_slice(&bytes).expect("JSON"))
    }

    /// The chat page is served while the model loads and without the API key (as
    /// llama-server's UI assets), under `--api-prefix`; not with `--no-ui`.
    #[tokio::test]
    async fn page_is_public_and_served_while_loading() {
        for (prefix, page) in [("", "/"), ("/p", "/p/"), ("/p", "/p/chat.js")] {
            let (status, body) = call_raw(state_with(Some("k"), prefix, false), "GET", page).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(!body.is_empty());
        }
        // Not the page: outside the prefix, with `--no-ui`, the API under the prefix (the
        // loading answer; runtime/tests/webui_browser.rs checks the 404s once loaded).
        for (prefix, no_ui, path) in [
            ("/p", false, "/"),
            ("", true, "/"),
            ("/p", false, "/p/props"),
        ] {
            let (status, _) = call(state_with(Some("k"), prefix, no_ui), "GET", path).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{prefix} {path}");
        }
    }

    /// While the model loads, every endpoint answers llama-server's 503 `Loading model`.
    #[tokio::test]
    async fn loading_is_503() {
        for (method, path) in [
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("POST", "/completion"),
        ] {
            let (status, body) = call(state(Some("k")), method, path).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(
                body,
                serde_json::json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
            );
        }
    }

    /// `--cors-origins localhost` allows local origins only, `*` (the default) any; a
    /// preflight names `--cors-methods`; `--api-key a,b` takes either key.
    #[tokio::test]
    async fn cors_origins_and_keys() {
        let with_origin = |st: AppState, origin: &str| {
            let req = axum::http::Request::builder()
                .method("OPTIONS")
                .uri("/completions")
                .header("Origin", origin)
                .body(HttpBody::empty())
                .expect("a request");
            async move { router(st).oneshot(req).await.expect("a response") }
        };
        let mut st = state(None);
        let mut args = st.cfg.args.clone();
        args.compat.cors_origins = Some("localhost".into());
        args.compat.cors_methods = Some("GET".into());
        st.cfg = Arc::new(Config::new(&args, GenerateOptions::default(), None));
        for (origin, allowed) in [
            ("http://localhost:8080", true),
            ("http://127.0.0.1", true),
            ("http://[::1]:3000", true),
            ("http://evil.com", false),
            ("http://localhost.evil.com", false),
        ] {
            let r = with_origin(st.clone(), origin).await;
            let got = r.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN);
            assert_eq!(got.is_some(), allowed, "{origin}");
            assert_eq!(r.headers()[header::ACCESS_CONTROL_ALLOW_METHODS], "GET");
        }
        let r = with_origin(state(None), "http://evil.com").await;
        assert_eq!(
            r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://evil.com"
        );

        let mut args = state(None).cfg.args.clone();
        args.api_key = Some("a,b".into());
        let cfg = Config::new(&args, GenerateOptions::default(), None);
        assert_eq!(cfg.api_keys, ["a", "b"]);
    }
}
