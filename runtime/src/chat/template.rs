//! [`ChatTemplate`]: one Jinja chat template, compiled once, rendered under Hugging Face
//! `apply_chat_template` semantics in a sandbox.
//!
//! # What a template sees (Hugging Face `transformers` `render_jinja_template`)
//!
//! - `messages`: the conversation, each message a JSON object (`role`, `content`, and whatever
//!   else the caller put there: `tool_calls`, `reasoning_content`, …); map keys keep their order.
//!   A `content` that is `null` or absent is the empty string, as llama.cpp passes it
//!   (`common_chat_msg::to_json_oaicompat`): an assistant message with only tool calls
//!   renders with empty content instead of failing on `none`.
//! - `add_generation_prompt`: bool; `bos_token`, `eos_token`: the model's token texts.
//! - `tools`, `documents`: the given JSON; undefined when not given (as the reference renders
//!   in `../shared/templates/` do: a tool-use template's `{% for tool in tools %}` then renders
//!   nothing instead of failing on `none`).
//! - Any extra variables of [`RenderOptions::extra`] (`enable_thinking`, `date_string`, …).
//! - `raise_exception(msg)`: stops rendering; the error is [`ChatError::Raised`] with `msg`.
//! - `strftime_now(fmt)`: the render's time ([`RenderOptions::now`], else the system clock as
//!   UTC) formatted by C `strftime` rules ([`CivilTime::strftime`]).
//! - The `tojson` filter: Python `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)` with those arguments (in that positional order).
//! - Printing (`{{ x }}`, `|string`) as Python's `str()`: `None`, `True`, `['a', 1]`.
//! - Python methods on strings, lists and dicts (`.strip()`, `.split()`, `.startswith()`,
//!   `.items()`, `.get()`, …) from minijinja-contrib's `pycompat`.
//! - Jinja2 environment options `trim_blocks` and `lstrip_blocks`, loop controls
//!   (`{% break %}`, `{% continue %}`), and `{% generation %}` blocks (rendered unchanged; see
//!   [`super::preprocess`]). A single trailing newline of the source is dropped (Jinja2's
//!   `keep_trailing_newline=False`). Undefined values behave like Jinja2's default `Undefined`:
//!   they print as nothing and are false, but using one in arithmetic or looking up an attribute
//!   on one is an error.
//!
//! # Sandbox
//!
//! A template is untrusted input. It cannot read files (no loader: `include`, `import` and
//! `extends` find nothing), its output is capped ([`RenderLimits::max_output_bytes`]), and its
//! work is metered with minijinja's fuel ([`RenderLimits::fuel`]): every instruction and every
//! 64 bytes of data it creates cost fuel, so an endless loop, runaway recursion or a
//! string-doubling loop ends in [`ChatError::OutOfFuel`] instead of hanging or exhausting memory.
//! Recursion depth is capped by minijinja (500 levels).

use super::preprocess::rewrite_generation_tags;
use super::pyfmt::{py_json, py_str, JsonStyle};
use super::time::CivilTime;
use minijinja::value::{from_args, Kwargs, Rest, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value};
use std::io;

/// Name under which the one template is registered in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be built or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template source is not valid Jinja (as minijinja parses it).
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`; the message is the template's own.
    #[error("{message}")]
    Raised {
        /// The text the template passed to `raise_exception`.
        message: String,
    },
    /// The rendered text grew past [`RenderLimits::max_output_bytes`].
    #[error("chat template output exceeds the limit of {limit} bytes")]
    OutputTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The template used up its work budget ([`RenderLimits::fuel`]).
    #[error(
        "chat template ran out of its work budget ({fuel} fuel): it loops too long, \
         recurses too deep or builds too much data"
    )]
    OutOfFuel {
        /// The budget that was exhausted.
        fuel: u64,
    },
    /// Any other failure while rendering (an undefined value used in an expression, a wrong
    /// argument, an unknown filter, …), with minijinja's description and template line.
    #[error("chat template failed: {0}")]
    Render(String),
    /// The messages or tools given cannot be passed to a template.
    #[error("invalid chat input: {0}")]
    Input(String),
    /// The model's metadata lacks what was asked for (a named template) or is inconsistent (a
    /// BOS/EOS id outside the vocabulary).
    #[error("{0}")]
    Model(String),
}

/// Resource limits for one render (see the module doc's Sandbox section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// Largest rendered prompt, in bytes. Default 1 MiB.
    pub max_output_bytes: usize,
    /// minijinja fuel for one render: about one unit per instruction and per 64 bytes of data
    /// created, so it bounds both time and memory (about `fuel * 64` bytes). Default 2 million
    /// (≈ 128 MB of data, well under a second); the templates of `../shared/templates/` use
    /// about 7 thousand for a 100-message conversation.
    pub fuel: u64,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            max_output_bytes: 1 << 20,
            fuel: 2_000_000,
        }
    }
}

/// Inputs of one render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End the prompt with the header that starts the assistant's turn (Hugging Face's
    /// `add_generation_prompt`; default `false` as there, `modelc template` turns it on).
    pub add_generation_prompt: bool,
    /// Tool schemas (a JSON list), passed as `tools`; `None` leaves `tools` undefined.
    pub tools: Option<serde_json::Value>,
    /// Documents for retrieval templates (a JSON list), passed as `documents`; `None` leaves
    /// `documents` undefined.
    pub documents: Option<serde_json::Value>,
    /// The time `strftime_now` formats; `None` reads the system clock (UTC).
    pub now: Option<CivilTime>,
    /// Extra template variables (Hugging Face's `**kwargs`, e.g. `enable_thinking`). They
    /// cannot replace the variables listed in the module doc.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The tokenizer will put BOS before the rendered text itself (the vocabulary's
    /// `add_bos`): a leading `bos_token` text is removed from the render, so that the prompt
    /// does not start with two BOS tokens (llama.cpp's `common_chat_template_direct_apply`
    /// with `add_bos`).
    pub add_bos: bool,
    /// Likewise for EOS: the tokenizer will append it (`add_eos`), so a trailing `eos_token`
    /// text is removed.
    pub add_eos: bool,
}

impl RenderOptions {
    /// Options for a prompt that `vocab` will tokenize with BOS / EOS added as the model asks
    /// ([`RenderOptions::add_bos`], [`RenderOptions::add_eos`]), with `add_generation_prompt`.
    pub fn for_prompt(vocab: &crate::tokenizer::Vocab, add_generation_prompt: bool) -> Self {
        RenderOptions {
            add_generation_prompt,
            add_bos: vocab.add_bos(),
            add_eos: vocab.add_eos(),
            ..Default::default()
        }
    }
}

/// One compiled chat template with the model's BOS / EOS texts.
///
/// Compile once with [`ChatTemplate::new`], render any number of times (renders are
/// independent; `&self` can be shared between threads).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    limits: RenderLimits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The error source that marks a `raise_exception` call, so it can be told apart from engine
/// errors however minijinja wraps it.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source` (a Jinja chat template, e.g. GGUF `tokenizer.chat_template`) with
    /// `bos_token` / `eos_token` as the texts of the model's BOS and EOS tokens (empty when the
    /// model has none, as llama.cpp does), and default [`RenderLimits`].
    ///
    /// Errors: [`ChatError::Syntax`] when the source does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_debug(false);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ChatError::Syntax(e.to_string()))?,
        );
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            out.write_str(&py_str(value))
                .map_err(|_| Error::from(ErrorKind::WriteFailure))
        });
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: &Value| py_str(v));
        env.add_filter("indent", indent_filter);
        // Jinja2's `sequence` test accepts anything with a length and indexing: strings and
        // dicts too.
        env.add_test("sequence", |v: &Value| {
            v.is_undefined()
                || matches!(
                    v.kind(),
                    ValueKind::Seq | ValueKind::String | ValueKind::Map
                )
        });
        // Jinja2's `iterable` test is `iter(x)` succeeding: not for `none` or numbers.
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Undefined
                    | ValueKind::String
                    | ValueKind::Seq
                    | ValueKind::Map
                    | ValueKind::Iterable
            )
        });
        env.add_function("raise_exception", raise_exception);
        let limits = RenderLimits::default();
        env.set_fuel(Some(limits.fuel));
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits,
        })
    }

    /// Replaces the resource limits.
    pub fn with_limits(mut self, limits: RenderLimits) -> ChatTemplate {
        self.env.set_fuel(Some(limits.fuel));
        self.limits = limits;
        self
    }

    /// The limits renders run under.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// The BOS text templates see as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text templates see as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders the prompt for `messages` (each a JSON object, normally `{"role", "content"}`).
    ///
    /// Errors: [`ChatError::Raised`] with the template's message when it calls
    /// `raise_exception`; [`ChatError::OutputTooLarge`] / [`ChatError::OutOfFuel`] past the
    /// limits; [`ChatError::Render`] for other template failures; [`ChatError::Input`] when a
    /// message is not a JSON object.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        self.render_measured(messages, opts).map(|(text, _)| text)
    }

    /// Like [`render`](Self::render), also returning the fuel the render used.
    pub fn render_measured(
        &self,
        messages: &[serde_json::Value],
        opts: &RenderOptions,
    ) -> Result<(String, u64), ChatError> {
        if let Some((i, m)) = messages.iter().enumerate().find(|(_, m)| !m.is_object()) {
            return Err(ChatError::Input(format!(
                "message {i} is not a JSON object: {}",
                truncate(&m.to_string(), 80)
            )));
        }
        let ctx = self.context(messages, opts);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let mut out = LimitedWriter {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            over: false,
        };
        let fuel_used = match template.render_captured_to(ctx, &mut out) {
            Ok(captured) => captured.state().fuel_levels().map_or(0, |(used, _)| used),
            Err(e) => return Err(self.classify(e, out.over)),
        };
        let mut text = String::from_utf8(out.buf)
            .map_err(|_| ChatError::Render("template produced invalid UTF-8".into()))?;
        if opts.add_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if opts.add_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok((text, fuel_used))
    }

    /// The render context (see the module doc).
    fn context(&self, messages: &[serde_json::Value], opts: &RenderOptions) -> Value {
        let now = opts.now.unwrap_or_else(CivilTime::now_utc);
        let mut ctx: indexmap::IndexMap<Value, Value> = opts
            .extra
            .iter()
            .map(|(k, v)| (Value::from(k.as_str()), json_to_value(v)))
            .collect();
        let fixed = [
            (
                "messages",
                Value::from_iter(messages.iter().map(message_value)),
            ),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
            (
                "strftime_now",
                Value::from_function(move |fmt: &str| now.strftime(fmt)),
            ),
        ];
        for (k, v) in fixed {
            ctx.insert(Value::from(k), v);
        }
        for (k, v) in [("tools", &opts.tools), ("documents", &opts.documents)] {
            match v {
                Some(v) => ctx.insert(Value::from(k), json_to_value(v)),
                None => ctx.shift_remove(&Value::from(k)),
            };
        }
        Value::from(ctx)
    }

    /// Maps a minijinja error to a [`ChatError`].
    fn classify(&self, e: Error, output_limit_hit: bool) -> ChatError {
        if let Some(message) = raised_message(&e) {
            return ChatError::Raised { message };
        }
        if output_limit_hit {
            return ChatError::OutputTooLarge {
                limit: self.limits.max_output_bytes,
            };
        }
        if e.kind() == ErrorKind::OutOfFuel {
            return ChatError::OutOfFuel {
                fuel: self.limits.fuel,
            };
        }
        ChatError::Render(describe(&e))
    }
}

/// The message of a `raise_exception` call anywhere in `e`'s source chain.
fn raised_message(e: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cur = err.source();
    }
    None
}

/// One line describing a minijinja error and its causes.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: Value) -> Result<Value, Error> {
    let text = py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

/// The `tojson` filter as Hugging Face defines it: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, arguments by position or by name.
fn tojson_filter(state: &State, value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.into_values();
    let (ensure_ascii, indent, separators, sort_keys, kwargs): (
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Kwargs,
    ) = from_args(&args)?;
    let pick = |pos: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or(pos).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().into()),
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: indent must be an integer or a string, not {}",
                        v.kind()
                    ),
                ))
            }
        },
    };
    let separators = match pick(separators, "separators")? {
        None => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => Some((
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        separators,
        sort_keys,
    };
    let text = py_json(value, &style).map_err(|m| Error::new(ErrorKind::InvalidOperation, m))?;
    state.consume_fuel(text.len() as u64 / 64)?;
    Ok(Value::from(text))
}

/// Jinja2's `indent(s, width=4, first=False, blank=False)`: indents every line but the first
/// (and the first too with `first`), leaving empty lines alone unless `blank`; `width` may be a
/// number of spaces or a string. Lines are split as Python's `str.splitlines` splits them, and a
/// trailing newline is kept (minijinja's own `indent` drops it, Jinja2's keeps it).
fn indent_filter(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.into_values();
    let (width, first, blank, kwargs): (Option<Value>, Option<bool>, Option<bool>, Kwargs) =
        from_args(&args)?;
    let width = kwargs.get::<Option<Value>>("width")?.or(width);
    let first = kwargs
        .get::<Option<bool>>("first")?
        .or(first)
        .unwrap_or(false);
    let blank = kwargs
        .get::<Option<bool>>("blank")?
        .or(blank)
        .unwrap_or(false);
    kwargs.assert_all_used()?;
    let indention = match &width {
        None => "    ".to_string(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_string(),
        Some(w) => match w.as_i64() {
            Some(n) => " ".repeat(n.clamp(0, 1024) as usize),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "indent: width must be an integer or a string, not {}",
                        w.kind()
                    ),
                ))
            }
        },
    };
    let mut text = py_str(value);
    text.push('\n'); // Jinja2 appends a newline before splitting, so a trailing one survives
    let lines = py_splitlines(&text);
    let mut out = String::with_capacity(text.len() + indention.len() * lines.len());
    if first {
        out.push_str(&indention);
    }
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank || !line.is_empty() {
                out.push_str(&indention);
            }
        }
        out.push_str(line);
    }
    Ok(Value::from(out))
}

/// Python `str.splitlines()`: splits on `\n`, `\r\n`, `\r`, `\v`, `\f`, `\x1c`–`\x1e`,
/// `\x85`, U+2028 and U+2029, without the line ends; no final empty line after a trailing end.
fn py_splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\u{b}'
                | '\u{c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        lines.push(&s[start..i]);
        start = i + c.len_utf8();
        if c == '\r' {
            if let Some(&(j, '\n')) = chars.peek() {
                start = j + 1;
                chars.next();
            }
        }
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// A JSON value as a template value; objects keep their key order, integers stay integers.
/// One message as a template sees it (module doc): `content` `null` or absent becomes `""`.
fn message_value(m: &serde_json::Value) -> Value {
    match m.as_object() {
        Some(o) if o.get("content").is_none_or(serde_json::Value::is_null) => {
            let mut o = o.clone();
            o.insert("content".into(), serde_json::Value::String(String::new()));
            json_to_value(&serde_json::Value::Object(o))
        }
        _ => json_to_value(m),
    }
}

pub(crate) fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => Value::from_iter(items.iter().map(json_to_value)),
        serde_json::Value::Object(map) => {
            let m: indexmap::IndexMap<Value, Value> = map
                .iter()
                .map(|(k, v)| (Value::from(k.as_str()), json_to_value(v)))
                .collect();
            Value::from(m)
        }
    }
}

/// An `io::Write` into memory that refuses to grow past `limit` bytes.
///
/// `over` records that a write was refused, so the render error can be told apart.
struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl io::Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.over = true;
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
