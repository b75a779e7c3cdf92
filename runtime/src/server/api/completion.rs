//! The completion endpoints with llama-server's request and response fields
//! (`tools/server/server-task.cpp`, `server-common.cpp`): llama.cpp's own `POST /completion`
//! (also `/completions`), OpenAI's `POST /v1/completions` and `POST /v1/chat/completions`,
//! each answered whole or streamed as server-sent events (the OpenAI ones end with
//! `data: [DONE]`).

use crate::chat::messages::content_text;
use crate::chat::reply::{self, Delta, ReasoningFormat, ReplyParser};
use crate::chat::tools::ChatMsg;
use crate::chat::{normalize_messages, MessageError, RenderOptions};
use crate::generate::{GenerateOptions, PositionProbs, Timings};
use crate::server::error::ApiError;
use crate::server::params::{wrong_type, Body};
use crate::server::slots::{Event, Finished, Job, Progress};
use crate::server::streams::{self, Producer, StreamSession};
use crate::server::tools::{calls_for_template, ToolPlan};
use crate::server::{read_body, AppState, Ready};
use crate::tokenizer::{TokenId, Vocab};
use axum::body::{Body as HttpBody, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Which API a completion request came through: it decides the response's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// llama.cpp's `/completion`.
    Llama,
    /// OpenAI's `/v1/completions`.
    OaiCompletion,
    /// OpenAI's `/v1/chat/completions`.
    OaiChat,
    /// llama.cpp's `/infill`: a `/completion` whose prompt is built from the code around
    /// the gap ([`super::infill`]).
    Infill,
}

/// A request ready to run, with what its response needs.
struct Request {
    /// One prompt, or several (`/completion` with a list of prompts: one result each).
    prompts: Vec<Vec<TokenId>>,
    /// `response_fields`: only these (`a/b` paths) in a `/completion` result.
    response_fields: Vec<String>,
    opts: GenerateOptions,
    stream: bool,
    /// `return_progress`: a streamed request also gets `prompt_progress` events.
    return_progress: bool,
    /// `timings_per_token`: streamed events carry the `timings` so far.
    timings_per_token: bool,
    include_usage: bool,
    return_tokens: bool,
    /// `verbose`: OpenAI results carry llama.cpp's own result as `__verbose`.
    verbose: bool,
    id_slot: Option<usize>,
    /// OpenAI's `n`: completions of each prompt, returned as that many `choices`.
    n_choices: usize,
    /// The assistant prefill a chat prompt ends with ([`ChatPrompt::prefill`]): the reply's
    /// content (and its first streamed delta) starts with it.
    prefill: String,
    /// How a chat reply is read back (reasoning, tool calls); `None` for the other APIs
    /// and with `--skip-chat-parsing`.
    reply: Option<ReplyParser>,
    id: String,
    created: u64,
}

/// `POST /completion`, `/completions`.
pub async fn llama(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, &headers, body, Api::Llama).await
}

/// `POST /infill`.
pub async fn infill(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, &headers, body, Api::Infill).await
}

/// `POST /v1/completions`.
pub async fn oai_completion(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, &headers, body, Api::OaiCompletion).await
}

/// `POST /v1/chat/completions/input_tokens` (also without `/v1`): the number of tokens
/// the chat request's prompt has, `{"input_tokens": N}`.
pub async fn chat_input_tokens(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = st.ready().and_then(|ready| {
        let body = Body::parse(&read_body(body)?)?;
        Ok(chat_prompt(&st, &ready, &body)?.0.len())
    });
    match counted {
        Ok(n) => axum::Json(json!({ "input_tokens": n })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/chat/completions`, `/chat/completions`.
pub async fn oai_chat(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, &headers, body, Api::OaiChat).await
}

/// Runs a completion request. With an `X-Conversation-Id` header its stream is kept
/// for `GET /v1/stream` ([`crate::server::streams`]).
async fn run(
    st: AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Response {
    let ready = match st.ready() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let req = match read_body(body).and_then(|b| parse(&st, &ready, &b, api)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    // An infill request is answered as `/completion` is.
    let api = match api {
        Api::Infill => Api::Llama,
        other => other,
    };
    if req.stream && req.prompts.len() > 1 {
        return ApiError::invalid("streaming several prompts in one request is not supported")
            .into_response();
    }
    // Dropped before the stream starts (any error below), it leaves no session.
    let producer = headers
        .get(streams::HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty())
        .map(|id| Producer::new(&st.streams, id));
    let mut receivers = Vec::with_capacity(req.prompts.len() * req.n_choices);
    let mut jobs = Vec::with_capacity(req.prompts.len() * req.n_choices);
    // Choice `j` of a prompt samples with the seed plus `j` (llama-server's child tasks,
    // `server_task::add_child`), so the choices differ and each repeats with its seed.
    let each = req
        .prompts
        .iter()
        .flat_map(|p| (0..req.n_choices).map(move |j| (p, j as u64)));
    for (prompt, choice) in each {
        if prompt.is_empty() {
            // llama-server answers an empty prompt at once: nothing generated.
            let (tx, rx) = mpsc::unbounded_channel();
            let _ = tx.send(Event::Done(Box::new(empty_result(req.id_slot))));
            receivers.push(rx);
            continue;
        }
        let Ok(permit) = st.permits.clone().try_acquire_owned() else {
            return ApiError::unavailable(format!(
                "the server is busy: {} requests are already waiting (--queue-size)",
                st.cfg.args.queue_size
            ))
            .into_response();
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut opts = req.opts.clone();
        opts.sampler.seed = (opts.sampler.seed + choice) & 0xFFFF_FFFF;
        jobs.push(Job {
            prompt: prompt.clone(),
            opts,
            id_slot: req.id_slot,
            events: tx,
            progress: req.stream && req.return_progress,
            permit,
        });
        receivers.push(rx);
    }
    for job in jobs {
        if st.jobs.send(job).is_err() {
            return ApiError::unavailable("the server is stopping").into_response();
        }
    }
    let req = Arc::new(req);
    if req.stream {
        match receivers.pop() {
            Some(rx) => {
                let mut resp =
                    HttpBody::from_stream(stream(ready, req, api, rx, producer)).into_response();
                let h = resp.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                resp
            }
            None => ApiError::invalid("no prompt").into_response(),
        }
    } else {
        let mut results = Vec::with_capacity(receivers.len());
        for (i, rx) in receivers.into_iter().enumerate() {
            match whole(&ready, &req, api, rx).await {
                Ok(mut v) => {
                    if let Some(o) = v.as_object_mut().filter(|o| o.contains_key("index")) {
                        o.insert("index".into(), i.into());
                    }
                    results.push(v);
                }
                Err(e) => return e.into_response(),
            }
        }
        // OpenAI's endpoints put the choices of every prompt in one response (llama-server:
        // `handle_completions_impl`); llama.cpp's `/completion` answers an array of results.
        if results.len() > 1 && api != Api::Llama {
            return axum::Json(merge_choices(results, req.n_choices)).into_response();
        }
        match (results.len(), results.pop()) {
            (1, Some(v)) => axum::Json(v).into_response(),
            (_, Some(v)) => {
                results.push(v);
                axum::Json(Value::Array(results)).into_response()
            }
            (_, None) => ApiError::invalid("no prompt").into_response(),
        }
    }
}

/// Reads a completion request (module doc): prompt or messages, then the generation fields.
fn parse(st: &AppState, ready: &Ready, bytes: &[u8], api: Api) -> Result<Request, ApiError> {
    let body = Body::parse(bytes)?;
    let vocab = &ready.vocab;
    let mut chat = None;
    let (prompts, prefill) = match api {
        Api::OaiChat => {
            let (tokens, c) = chat_prompt(st, ready, &body)?;
            let prefill = c.prefill.clone();
            chat = Some(c);
            (vec![tokens], prefill)
        }
        Api::Infill => {
            let limits = super::infill::Limits {
                n_batch: st.cfg.defaults.n_batch,
                n_predict: st.cfg.defaults.n_predict,
                n_ctx: ready.n_ctx_slot,
                spm: st.cfg.args.spm_infill,
            };
            (
                vec![super::infill::prompt(vocab, &body, limits)?],
                String::new(),
            )
        }
        _ => match body.get("prompt") {
            None => return Err(ApiError::invalid("\"prompt\" is required")),
            Some(p) => (prompt_list(vocab, p)?, String::new()),
        },
    };
    let n_ctx = ready.n_ctx_slot;
    for prompt in &prompts {
        if prompt.len() >= n_ctx {
            return Err(ApiError::exceeds_context(prompt.len(), n_ctx));
        }
    }
    let response_fields = body.strings("response_fields")?.unwrap_or_default();
    let mut opts = st.cfg.options(&body, api, vocab)?;
    opts.grammar = crate::server::grammar::request_grammar(&body, api, ready, &st.cfg)?;
    if opts.grammar.is_some() {
        opts.grammar_triggers = crate::server::grammar::request_triggers(&body, ready)?;
    }
    let reply = match &chat {
        Some(c) => reply_parser(st, &body, c, &mut opts, ready)?,
        None => None,
    };
    let stream = body.bool("stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(wrong_type("stream_options.include_usage", "a boolean", v)),
        },
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    let id_slot = match body.i64("id_slot")? {
        None | Some(-1) => None,
        Some(i) => match usize::try_from(i) {
            Ok(i) if i < st.cfg.args.parallel => Some(i),
            _ => return Err(ApiError::invalid(format!("\"id_slot\" {i}: no such slot"))),
        },
    };
    // llama-server's `n_cmpl` (alias `n`, the OpenAI field), on every endpoint: from 1 to
    // the slot count (`server-schema.cpp`: a hard limit, its message).
    let n_field = if body.get("n_cmpl").is_some() {
        "n_cmpl"
    } else {
        "n"
    };
    let n_choices = match body.i64(n_field)? {
        None => 1,
        Some(n) if (1..=st.cfg.args.parallel as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "Field '{n_field}': Value must be between 1 <= value <= {}, but got {n}",
                st.cfg.args.parallel
            )))
        }
    };
    if n_choices > 1 && stream {
        return Err(ApiError::invalid(
            "streaming several choices (\"n\" > 1) is not supported",
        ));
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Request {
        prompts,
        response_fields,
        opts,
        stream,
        return_progress: body.bool("return_progress")?.unwrap_or(false),
        timings_per_token: body.bool("timings_per_token")?.unwrap_or(false),
        include_usage,
        return_tokens: body.bool("return_tokens")?.unwrap_or(false),
        verbose: body.bool("verbose")?.unwrap_or(false),
        id_slot,
        n_choices,
        prefill,
        reply,
        id: format!("chatcmpl-{:016x}", rand::random::<u64>()),
        created,
    })
}

/// `prompt` as llama-server takes it (`tokenize_input_prompts`): a string, a list of token
/// ids, a list mixing strings and ids (BOS only before the first piece), or
/// `{"prompt_string": ...}` — one prompt; or a list of such prompts, one result each.
fn prompt_list(vocab: &Vocab, p: &Value) -> Result<Vec<Vec<TokenId>>, ApiError> {
    match p {
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::invalid("\"prompt\" must not be empty"))
        }
        Value::Array(items) if !items.iter().any(Value::is_number) => {
            items.iter().map(|item| one_prompt(vocab, item)).collect()
        }
        _ => Ok(vec![one_prompt(vocab, p)?]),
    }
}

/// One prompt (see [`prompt_list`]).
fn one_prompt(vocab: &Vocab, p: &Value) -> Result<Vec<TokenId>, ApiError> {
    const EXPECTED: &str = "a string, token ids, or a list of strings and token ids";
    match p {
        Value::String(s) => Ok(vocab.tokenize(s, true, true)),
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::not_supported(
                    "multimodal data: this server reads text only",
                ));
            }
            match o.get("prompt_string") {
                Some(Value::String(s)) => Ok(vocab.tokenize(s, true, true)),
                Some(v) => Err(wrong_type("prompt.prompt_string", "a string", v)),
                None => Err(ApiError::invalid(
                    "\"prompt\": an object prompt needs \"prompt_string\"",
                )),
            }
        }
        Value::Array(items) => mixed_list(vocab, "prompt", items, (true, true), EXPECTED),
        other => Err(wrong_type("prompt", EXPECTED, other)),
    }
}

/// A list of texts and token ids as one token sequence (llama-server's `tokenize_mixed`):
/// each text tokenized with `parse_special`, with `add_special` for the first item only;
/// each number a token id of the vocabulary. `name` and `expected` word the errors.
///
/// # Errors
/// 400 for an item that is neither, a number that is not a token id of the vocabulary.
pub(super) fn mixed_list(
    vocab: &Vocab,
    name: &str,
    items: &[Value],
    (add_special, parse_special): (bool, bool),
    expected: &str,
) -> Result<Vec<TokenId>, ApiError> {
    let mut out = Vec::new();
    for (i, v) in items.iter().enumerate() {
        match v {
            Value::String(s) => out.extend(vocab.tokenize(s, add_special && i == 0, parse_special)),
            Value::Number(_) => {
                let id = v.as_i64().ok_or_else(|| {
                    ApiError::invalid(format!("\"{name}\"[{i}] is not a token id"))
                })?;
                out.push(
                    vocab
                        .check_id(id)
                        .map_err(|e| ApiError::invalid(format!("\"{name}\"[{i}]: {e}")))?,
                );
            }
            other => return Err(wrong_type(name, expected, other)),
        }
    }
    Ok(out)
}

/// The prompt of a chat request: its `messages` rendered with the model's chat template
/// ([`render_messages`]), tokenized as `modelc run --chat` does, and the assistant prefill
/// it ends with.
fn chat_prompt(
    st: &AppState,
    ready: &Ready,
    body: &Body,
) -> Result<(Vec<TokenId>, ChatPrompt), ApiError> {
    let chat = render_messages(ready, body, !st.cfg.args.no_prefill_assistant)?;
    Ok((ready.vocab.tokenize(&chat.text, true, true), chat))
}

/// How a chat request's reply is read back, and the call grammar its tools add to `opts`
/// (lazy unless a call is required). The request's `reasoning_format` overrides
/// `--reasoning-format`.
///
/// # Errors
/// 400: tools with a grammar of the request's own (llama-server's "Cannot specify grammar
/// with tools"), an unknown reasoning format, a tool schema the converter refuses.
fn reply_parser(
    st: &AppState,
    body: &Body,
    chat: &ChatPrompt,
    opts: &mut GenerateOptions,
    ready: &Ready,
) -> Result<Option<ReplyParser>, ApiError> {
    let compat = &st.cfg.args.compat;
    if compat.skip_chat_parsing {
        return Ok(None);
    }
    let reasoning = match body.str("reasoning_format")? {
        Some(f) => ReasoningFormat::parse(f).map_err(ApiError::invalid)?,
        None => compat.reasoning_format(),
    };
    let mut tools = None;
    if let Some(plan) = &chat.tools {
        if let Some(g) = plan.grammar()? {
            if opts.grammar.is_some()
                && (body.get("grammar").is_some() || body.get("json_schema").is_some())
            {
                return Err(ApiError::invalid("Cannot specify grammar with tools"));
            }
            let table = crate::grammar::TokenTable::shared(&ready.vocab);
            let rules = crate::grammar::compile(&g.gbnf, &ready.vocab, table)
                .map_err(|e| ApiError::server(format!("the tool-call grammar: {e}")))?;
            opts.grammar = Some(rules);
            opts.grammar_triggers = if g.lazy {
                let t = crate::grammar::Triggers::new(&g.triggers).map_err(ApiError::server)?;
                Some(std::sync::Arc::new(t))
            } else {
                None
            };
        }
        if plan.calls_allowed() || plan.format.always() {
            tools = Some(plan.format);
        }
    }
    let forced_open = chat.prefill.is_empty() && reply::thinking_forced_open(&chat.text);
    if let Some(n) = compat
        .reasoning_budget
        .and_then(|n| usize::try_from(n).ok())
    {
        opts.reasoning_budget = Some(crate::reasoning_budget::ReasoningBudget {
            n,
            end: ready.vocab.tokenize(reply::THINK_END, false, true),
            forced_open,
        });
    }
    Ok(Some(ReplyParser {
        tools,
        reasoning,
        forced_open,
    }))
}

/// A chat request's prompt ([`render_messages`]).
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    /// The rendered text.
    pub text: String,
    /// The text of the final message it continues (llama-server's assistant prefill,
    /// `continue_final_message`), at the end of `text`; empty when it continues none. The
    /// reply's content starts with it, as llama-server's does.
    pub prefill: String,
    /// The request's tools (`tools`, `tool_choice`, `parallel_tool_calls`), when it has any.
    pub tools: Option<ToolPlan>,
}

/// How a chat request continues its final message (`continue_final_message`, llama.cpp's
/// `common_chat_continuation`): `true` or `"content"` continue its content;
/// `"reasoning_content"` its reasoning (which this project's templates do not render).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Continuation {
    None,
    Content,
    Reasoning,
}

/// `messages` (a list of objects) rendered with the model's chat template, as llama-server
/// renders them (`oaicompat_chat_params_parse`, `common_chat_templates_apply`): ending with
/// the assistant's header (`add_generation_prompt`, default true) — or, when the request
/// continues its final message (`continue_final_message`, or with `prefill` a final
/// assistant message: llama-server's `--prefill-assistant` default), the other messages
/// rendered, the assistant's header, and that message's content, which the model then
/// continues.
///
/// # Errors
/// 400 for missing or malformed messages, two assistant messages at the end to prefill,
/// `continue_final_message` with `add_generation_prompt`, or a template error; 501 for a
/// model without a chat template.
pub fn render_messages(ready: &Ready, body: &Body, prefill: bool) -> Result<ChatPrompt, ApiError> {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) => m,
        Some(v) => return Err(wrong_type("messages", "a list of messages", v)),
        None => return Err(ApiError::invalid("\"messages\" is required")),
    };
    // Each message checked, with its text parts joined (as `modelc template` has them).
    let mut flat = normalize_messages(messages).map_err(|e| match e {
        MessageError::Invalid(m) => ApiError::invalid(m),
        MessageError::Unsupported(m) => ApiError::server(m),
    })?;
    calls_for_template(&mut flat);
    let plan = ToolPlan::from_request(body, &ready.template_source)?;
    if let Some(p) = &plan {
        p.prepare(&mut flat);
    }
    let mut continuation = match body.get("continue_final_message") {
        Some(Value::Bool(true)) => Continuation::Content,
        Some(Value::String(s)) if s == "content" => Continuation::Content,
        Some(Value::String(s)) if s == "reasoning_content" => Continuation::Reasoning,
        _ => Continuation::None,
    };
    let mut add_generation_prompt = body.bool("add_generation_prompt")?.unwrap_or(true);
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    if continuation == Continuation::None
        && prefill
        && flat.last().and_then(role).as_deref() == Some("assistant")
    {
        if let [.., a, _] = flat.as_slice() {
            if role(a).as_deref() == Some("assistant") {
                return Err(ApiError::invalid(
                    "Cannot have 2 or more assistant messages at the end of the list.",
                ));
            }
        }
        continuation = Continuation::Content;
        add_generation_prompt = false;
    }
    if continuation != Continuation::None && add_generation_prompt {
        return Err(ApiError::invalid(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    let Some(tmpl) = ready.template.as_ref() else {
        return Err(ApiError::not_supported("this model has no chat template"));
    };
    // The command line's template variables, then the request's (`chat_template_kwargs`).
    let mut extra = ready.template_kwargs.clone();
    match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(kw)) => extra.extend(kw.clone()),
        Some(v) => return Err(wrong_type("chat_template_kwargs", "an object", v)),
    }
    let render = |msgs: &[Value], add_generation_prompt: bool| {
        let mut opts = RenderOptions::for_prompt(&ready.vocab, add_generation_prompt);
        opts.extra.extend(extra.clone());
        opts.tools = plan.as_ref().map(|p| p.raw.clone());
        tmpl.render(msgs, &opts)
            .map_err(|e| ApiError::invalid(format!("chat template: {e}")))
    };
    let Some((original, before)) = messages
        .split_last()
        .map(|(last, _)| (last, &flat[..flat.len() - 1]))
        .filter(|_| continuation != Continuation::None)
    else {
        return Ok(ChatPrompt {
            text: render(&flat, add_generation_prompt)?,
            prefill: String::new(),
            tools: plan,
        });
    };
    // The final message continued: the others rendered, then the assistant's header (what
    // the generation prompt adds to them), then its content. A message with nothing in it
    // adds neither (llama.cpp's `continue_msg.empty()`).
    let content = content_text(original.get("content"), "\n\n");
    let reasoning = content_text(original.get("reasoning_content"), "\n\n");
    let calls = original
        .get("tool_calls")
        .is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()));
    if calls {
        return Err(ApiError::invalid(
            "Cannot continue an assistant message that contains tool calls.",
        ));
    }
    let mut text = render(before, false)?;
    if content.is_empty() && reasoning.is_empty() {
        return Ok(ChatPrompt {
            text,
            prefill: String::new(),
            tools: plan,
        });
    }
    let with_header = render(before, true)?;
    let mut common = text
        .bytes()
        .zip(with_header.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !with_header.is_char_boundary(common) {
        common -= 1;
    }
    text.push_str(&with_header[common..]);
    // Reasoning continues inside reasoning markers, which no template here has; content
    // (also the `true` form when the message has content) is appended.
    let prefill = if continuation == Continuation::Reasoning {
        String::new()
    } else {
        content
    };
    text.push_str(&prefill);
    Ok(ChatPrompt {
        text,
        prefill,
        tools: plan,
    })
}

/// A non-streamed result: waits for it.
/// One OpenAI result with the `choices` of all of `results` (a request's prompts, each with
/// `n_choices` completions, prompt-major), numbered in order, and their usage added up as
/// OpenAI counts it (each prompt once; llama-server keeps the first result's usage).
fn merge_choices(results: Vec<Value>, n_choices: usize) -> Value {
    let mut it = results.into_iter();
    let Some(mut first) = it.next() else {
        return Value::Null;
    };
    let mut choices: Vec<Value> = Vec::new();
    let mut completion_tokens = 0;
    let mut prompt_tokens = 0;
    for (i, v) in std::iter::once(first.clone()).chain(it).enumerate() {
        if let Some(cs) = v["choices"].as_array() {
            choices.extend(cs.iter().cloned());
        }
        completion_tokens += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        // Each prompt counted once, however many choices it has.
        if i % n_choices.max(1) == 0 {
            prompt_tokens += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        }
    }
    for (i, c) in choices.iter_mut().enumerate() {
        c["index"] = i.into();
    }
    first["choices"] = Value::Array(choices);
    first["usage"] = json!({
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "total_tokens": completion_tokens + prompt_tokens,
    });
    first
}

async fn whole(
    ready: &Ready,
    req: &Request,
    api: Api,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Value, ApiError> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { .. } | Event::Progress(_) => {}
            Event::Error(e) => return Err(e),
            Event::Done(f) => return Ok(final_json(ready, req, api, &f)),
        }
    }
    Err(ApiError::server("the request was cancelled"))
}

/// A streamed response: one event per generated token, then the final one(s).
///
/// With a `producer` (an `X-Conversation-Id`) every byte also goes to its session: a client
/// that goes away no longer cancels the generation, which runs on into the session; a Stop
/// (`DELETE /v1/stream`) does, and ends the client's stream there (no `[DONE]`). A request
/// whose first event is an error leaves no session (llama-server answers it as a plain
/// error).
fn stream(
    ready: Arc<Ready>,
    req: Arc<Request>,
    api: Api,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut producer: Option<Producer>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let session = producer.as_ref().map(|p| p.session.clone());
        let mut client = Some(out_tx);
        let mut n_decoded = 0usize;
        // llama-server ends an OpenAI stream with `[DONE]` unless it ended with an error.
        let mut failed = false;
        let mut first = true;
        // A chat reply read as it grows: the text so far, the last read, the calls' ids.
        let mut chat_text = String::new();
        let mut chat_prev = ChatMsg::default();
        let mut call_ids: Vec<String> = Vec::new();
        loop {
            let ev = match &session {
                Some(s) => tokio::select! {
                    ev = rx.recv() => ev,
                    () = s.cancelled() => return,
                },
                None => rx.recv().await,
            };
            let Some(ev) = ev else { break };
            if std::mem::take(&mut first) && !matches!(ev, Event::Error(_)) {
                if let Some(p) = producer.as_mut() {
                    p.start();
                }
            }
            let mut events: Vec<Value> = Vec::new();
            // llama-server's chat stream opens with the assistant's role along with the
            // first token (after any prompt progress chunks).
            let opens = matches!(ev, Event::Token { .. } | Event::Done(_)) && n_decoded == 0;
            if api == Api::OaiChat && opens {
                events.push(chat_chunk(
                    &ready,
                    &req,
                    json!({"role": "assistant", "content": null}),
                    Value::Null,
                ));
            }
            match ev {
                Event::Token {
                    content,
                    token,
                    probs,
                    timings,
                } => {
                    n_decoded += 1;
                    if let (Api::OaiChat, Some(parser)) = (api, req.reply.as_ref()) {
                        chat_text.push_str(&content);
                        let now = parser.parse(&chat_text, true);
                        let mut deltas: Vec<Value> = reply::diff(&chat_prev, &now)
                            .iter()
                            .map(|d| delta_json(d, &mut call_ids))
                            .collect();
                        chat_prev = now;
                        if n_decoded == 1 && !req.prefill.is_empty() {
                            match deltas.first_mut().and_then(|d| d.get_mut("content")) {
                                Some(Value::String(c)) => c.insert_str(0, &req.prefill),
                                _ => deltas.insert(0, json!({ "content": req.prefill })),
                            }
                        }
                        // Nothing to show yet (held back): no chunk, as llama-server sends
                        // none for an empty diff — unless the token's probabilities or
                        // timings were asked for, which go out with an empty delta.
                        if deltas.is_empty() && (req.opts.n_probs > 0 || req.timings_per_token) {
                            deltas.push(json!({}));
                        }
                        for (k, delta) in deltas.into_iter().enumerate() {
                            let mut v = chat_chunk(&ready, &req, delta, Value::Null);
                            if k == 0 {
                                let p = probs.as_ref().filter(|_| req.opts.n_probs > 0);
                                if let (Some(p), Some(c)) = (
                                    p,
                                    v.pointer_mut("/choices/0").and_then(Value::as_object_mut),
                                ) {
                                    let p =
                                        probs_json(&ready.vocab, p, req.opts.post_sampling_probs);
                                    c.insert("logprobs".into(), json!({ "content": [p] }));
                                }
                                if let (true, Some(o)) = (req.timings_per_token, v.as_object_mut())
                                {
                                    o.insert("timings".into(), timings_json(&timings));
                                }
                            }
                            events.push(v);
                        }
                    } else {
                        // A continued message's text goes out with the first token, as
                        // llama-server's first content delta carries it.
                        let content = if n_decoded == 1 && !req.prefill.is_empty() {
                            format!("{}{content}", req.prefill)
                        } else {
                            content
                        };
                        let mut v = partial_json(
                            &ready,
                            &req,
                            api,
                            &content,
                            token,
                            probs.as_ref(),
                            n_decoded,
                        );
                        if let (true, Some(o)) = (req.timings_per_token, v.as_object_mut()) {
                            o.insert("timings".into(), timings_json(&timings));
                        }
                        events.push(v);
                    }
                }
                Event::Progress(p) => events.push(progress_json(&ready, &req, api, &p)),
                Event::Error(e) => {
                    failed = true;
                    events.push(json!({ "error": e.object() }));
                }
                Event::Done(f) => {
                    // Counted as opened: no second role chunk.
                    n_decoded = n_decoded.max(1);
                    let mut has_calls = false;
                    if let (Api::OaiChat, Some(parser)) = (api, req.reply.as_ref()) {
                        let last = parser.parse(&f.completion.content, false);
                        for d in reply::diff(&chat_prev, &last) {
                            let delta = delta_json(&d, &mut call_ids);
                            events.push(chat_chunk(&ready, &req, delta, Value::Null));
                        }
                        has_calls = !last.tool_calls.is_empty();
                    }
                    events.extend(final_stream_json(&ready, &req, api, &f, has_calls));
                }
            }
            for v in events {
                let bytes = Bytes::from(format!("data: {v}\n\n"));
                if !emit(&mut client, session.as_deref(), bytes).await {
                    // Dropping `rx` cancels the request.
                    return;
                }
            }
        }
        if api != Api::Llama && !failed {
            let done = Bytes::from_static(b"data: [DONE]\n\n");
            let _ = emit(&mut client, session.as_deref(), done).await;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(out_rx)
}

/// Sends `bytes` to the client (while it is there) and to the session; false when the
/// request is to stop: its client is gone and it has no session, or a Stop came.
async fn emit(
    client: &mut Option<mpsc::Sender<Result<Bytes, Infallible>>>,
    session: Option<&StreamSession>,
    bytes: Bytes,
) -> bool {
    if let Some(s) = session {
        if s.is_cancelled() {
            return false;
        }
        s.append(&bytes);
    }
    let Some(tx) = client.as_ref() else {
        return true;
    };
    let sent = match session {
        Some(s) => tokio::select! {
            r = tx.send(Ok(bytes)) => r.is_ok(),
            () = s.cancelled() => return false,
        },
        None => tx.send(Ok(bytes)).await.is_ok(),
    };
    if !sent {
        *client = None;
        return session.is_some();
    }
    true
}

/// llama-server's answer to an empty prompt (`update_slots` releases the slot at once):
/// nothing evaluated, nothing generated, `stop_type` `none`.
fn empty_result(id_slot: Option<usize>) -> Finished {
    Finished {
        completion: crate::generate::Completion {
            content: String::new(),
            tokens: Vec::new(),
            prompt_tokens: Vec::new(),
            stop_type: "none",
            stopping_word: None,
            n_discarded: 0,
            timings: Timings::default(),
            probs: None,
        },
        id_slot: id_slot.unwrap_or(0),
        truncated: false,
    }
}

/// The model's name in responses: `--alias`, else the model file's name.
fn model_name(ready: &Ready) -> &str {
    &ready.model_name
}

/// llama-server's `timings` object. Generation rates count decode steps, not tokens: the
/// first token comes from the prompt's logits (llama-server's `predicted_per_second`).
fn timings_json(t: &Timings) -> Value {
    let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let per_second = |ms: f64, n: usize| {
        if n > 0 && ms > 0.0 {
            1e3 / ms * n as f64
        } else {
            0.0
        }
    };
    let steps = t.predicted_n.saturating_sub(1);
    json!({
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_ms, t.prompt_n),
        "prompt_per_second": per_second(t.prompt_ms, t.prompt_n),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": per_token(t.predicted_ms, steps),
        "predicted_per_second": per_second(t.predicted_ms, steps),
    })
}

/// One position's probabilities as llama-server writes them (`probs_vector_to_json`):
/// `logprob` / `top_logprobs`, or with `post_sampling_probs` `prob` / `top_probs`.
fn probs_json(vocab: &Vocab, p: &PositionProbs, post: bool) -> Value {
    let bytes = |id: TokenId| vocab.token_to_piece(id, false).to_vec();
    let (key, top_key) = if post {
        ("prob", "top_probs")
    } else {
        ("logprob", "top_logprobs")
    };
    let value = |lp: f32| if post { lp.exp() } else { lp };
    let top: Vec<Value> = p
        .top_logprobs
        .iter()
        .map(|t| json!({ "id": t.id, "token": t.token, "bytes": bytes(t.id), key: value(t.logprob) }))
        .collect();
    json!({ "id": p.id, "token": p.token, "bytes": bytes(p.id), key: value(p.logprob), top_key: top })
}

/// OpenAI's `usage`.
fn usage_json(f: &Finished) -> Value {
    let c = &f.completion;
    json!({
        "completion_tokens": c.tokens.len(),
        "prompt_tokens": c.prompt_tokens.len(),
        "total_tokens": c.tokens.len() + c.prompt_tokens.len(),
        "prompt_tokens_details": { "cached_tokens": c.timings.cache_n },
    })
}

/// llama-server's `stop_type`: a full context is `limit` (with `truncated`).
fn stop_type(f: &Finished) -> &'static str {
    match f.completion.stop_type {
        "eos" => "eos",
        "word" => "word",
        "limit" | "context" => "limit",
        _ => "none",
    }
}

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token or a stop string, else
/// `length`.
fn finish_reason(f: &Finished) -> &'static str {
    match stop_type(f) {
        "eos" | "word" => "stop",
        _ => "length",
    }
}

/// A chat's `finish_reason`: `tool_calls` where it would be `stop` and the reply has calls.
fn chat_finish_reason(f: &Finished, has_calls: bool) -> &'static str {
    match finish_reason(f) {
        "stop" if has_calls => "tool_calls",
        other => other,
    }
}

/// A new tool call's id: 32 random letters and digits (llama-server's `gen_tool_call_id`).
fn tool_call_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..32)
        .map(|_| CHARS[rand::random_range(0..CHARS.len())] as char)
        .collect()
}

/// A streamed chat delta (llama-server's `server_chat_msg_diff_to_json_oaicompat`).
fn delta_json(d: &Delta, ids: &mut Vec<String>) -> Value {
    match d {
        Delta::Reasoning(t) => json!({ "reasoning_content": t }),
        Delta::Content(t) => json!({ "content": t }),
        Delta::Call { index, call } => {
            while ids.len() <= *index {
                ids.push(tool_call_id());
            }
            let id = if call.id.is_empty() {
                &ids[*index]
            } else {
                &call.id
            };
            json!({ "tool_calls": [{
                "index": index,
                "id": id,
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            }] })
        }
    }
}

/// The generation settings llama-server reports with a result and in `/props`
/// (`server-task.cpp` `task_params::to_json`): `opts` with `seed` and `stream`.
pub fn settings_json(opts: &GenerateOptions, seed: Value, stream: bool) -> Value {
    let s = &opts.sampler;
    json!({
        "seed": seed,
        "temperature": s.temp,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "typical_p": s.typical_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "dry_sequence_breakers": s.dry_sequence_breakers,
        "min_keep": s.min_keep,
        "samplers": s.samplers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "stop": opts.stop,
        "max_tokens": opts.n_predict,
        "n_predict": opts.n_predict,
        "ignore_eos": opts.ignore_eos,
        "stream": stream,
        "n_probs": opts.n_probs,
        "post_sampling_probs": opts.post_sampling_probs,
        "cache_prompt": opts.cache_prompt,
        // -inf is written as null, as llama-server's JSON library writes it.
        "logit_bias": opts.logit_bias.iter().map(|&(t, b)| json!({
            "bias": if b.is_finite() { json!(b) } else { Value::Null },
            "token": t,
        })).collect::<Vec<_>>(),
    })
}

/// The complete result in the shape of `api` (non-streamed).
fn final_json(ready: &Ready, req: &Request, api: Api, f: &Finished) -> Value {
    let c = &f.completion;
    let probs = || {
        c.probs
            .as_ref()
            .filter(|p| !p.is_empty() && req.opts.n_probs > 0)
            .map(|p| {
                p.iter()
                    .map(|x| probs_json(&ready.vocab, x, req.opts.post_sampling_probs))
                    .collect::<Vec<_>>()
            })
    };
    match api {
        Api::Llama | Api::Infill => {
            let mut v = llama_final(ready, req, f, &c.content);
            if let (Some(p), Some(o)) = (probs(), v.as_object_mut()) {
                o.insert("completion_probabilities".into(), Value::Array(p));
            }
            select_fields(v, &req.response_fields)
        }
        Api::OaiCompletion => with_verbose(
            ready,
            req,
            f,
            json!({
                "choices": [{
                    "text": c.content,
                    "index": 0,
                    "logprobs": probs().map_or(Value::Null, |p| json!({ "content": p })),
                    "finish_reason": finish_reason(f),
                }],
                "created": req.created,
                "model": model_name(ready),
                "system_fingerprint": ready.fingerprint,
                "object": "text_completion",
                "usage": usage_json(f),
                "id": req.id,
                "timings": timings_json(&c.timings),
            }),
        ),
        Api::OaiChat => {
            let (message, has_calls) = match &req.reply {
                Some(parser) => {
                    let mut msg = parser.parse(&c.content, false);
                    msg.content = format!("{}{}", req.prefill, msg.content);
                    let ids: Vec<String> = msg.tool_calls.iter().map(|_| tool_call_id()).collect();
                    (
                        crate::chat::tools::message_json(&msg, &ids),
                        !msg.tool_calls.is_empty(),
                    )
                }
                None => (
                    json!({ "role": "assistant", "content": format!("{}{}", req.prefill, c.content) }),
                    false,
                ),
            };
            let mut choice = json!({
                "finish_reason": chat_finish_reason(f, has_calls),
                "index": 0,
                "message": message,
            });
            if let (Some(p), Some(o)) = (probs(), choice.as_object_mut()) {
                o.insert("logprobs".into(), json!({ "content": p }));
            }
            with_verbose(
                ready,
                req,
                f,
                json!({
                    "choices": [choice],
                    "created": req.created,
                    "model": model_name(ready),
                    "system_fingerprint": ready.fingerprint,
                    "object": "chat.completion",
                    "usage": usage_json(f),
                    "id": req.id,
                    "timings": timings_json(&c.timings),
                }),
            )
        }
    }
}

/// `v` with llama.cpp's own result as `__verbose` when the request asked for it.
fn with_verbose(ready: &Ready, req: &Request, f: &Finished, mut v: Value) -> Value {
    if req.verbose {
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "__verbose".into(),
                llama_final(ready, req, f, &f.completion.content),
            );
        }
    }
    v
}

/// `response_fields` as llama-server applies them (`json_get_nested_values`): only the
/// fields named, each under its path (`generation_settings/n_predict`); all when none.
fn select_fields(v: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return v;
    }
    let mut out = serde_json::Map::new();
    for f in fields {
        let found = f.split('/').try_fold(&v, |cur, key| cur.get(key));
        if let Some(x) = found {
            out.insert(f.clone(), x.clone());
        }
    }
    Value::Object(out)
}

/// llama.cpp's final `/completion` object with `content`.
fn llama_final(ready: &Ready, req: &Request, f: &Finished, content: &str) -> Value {
    let c = &f.completion;
    json!({
        "index": 0,
        "content": content,
        "tokens": if req.return_tokens && !req.stream { c.tokens.clone() } else { Vec::new() },
        "id_slot": f.id_slot,
        "stop": true,
        "model": model_name(ready),
        "tokens_predicted": c.tokens.len(),
        "tokens_evaluated": c.prompt_tokens.len(),
        "generation_settings": settings_json(&req.opts, req.opts.sampler.seed.into(), req.stream),
        "prompt": ready.vocab.detokenize_lossy(&c.prompt_tokens, true),
        "has_new_line": c.content.contains('\n'),
        "truncated": f.truncated,
        "stop_type": stop_type(f),
        "stopping_word": c.stopping_word.clone().unwrap_or_default(),
        "tokens_cached": tokens_cached(c),
        "timings": timings_json(&c.timings),
    })
}

/// llama-server's `tokens_cached`: the tokens the slot's cache holds, the prompt and every
/// generated token but the last (sampled, never evaluated).
fn tokens_cached(c: &crate::generate::Completion) -> usize {
    c.prompt_tokens.len() + c.tokens.len().saturating_sub(1)
}

/// One streamed token in the shape of `api`.
fn partial_json(
    ready: &Ready,
    req: &Request,
    api: Api,
    content: &str,
    token: TokenId,
    probs: Option<&PositionProbs>,
    n_decoded: usize,
) -> Value {
    let probs = probs
        .filter(|_| req.opts.n_probs > 0)
        .map(|p| vec![probs_json(&ready.vocab, p, req.opts.post_sampling_probs)]);
    match api {
        Api::Llama | Api::Infill => {
            let mut v = json!({
                "index": 0,
                "content": content,
                // Every streamed token carries its id, `return_tokens` or not (llama-server).
                "tokens": [token],
                "stop": false,
                "id_slot": -1,
                "tokens_predicted": n_decoded,
                "tokens_evaluated": req.prompts.first().map_or(0, Vec::len),
            });
            if let (Some(p), Some(o)) = (probs, v.as_object_mut()) {
                o.insert("completion_probabilities".into(), Value::Array(p));
            }
            v
        }
        Api::OaiCompletion => json!({
            "choices": [{
                "text": content,
                "index": 0,
                "logprobs": probs.map_or(Value::Null, |p| json!({ "content": p })),
                "finish_reason": null,
            }],
            "created": req.created,
            "model": model_name(ready),
            "system_fingerprint": ready.fingerprint,
            "object": "text_completion",
            "id": req.id,
        }),
        Api::OaiChat => {
            let mut v = chat_chunk(ready, req, json!({ "content": content }), Value::Null);
            if let Some(p) = probs {
                if let Some(c) = v.pointer_mut("/choices/0").and_then(Value::as_object_mut) {
                    c.insert("logprobs".into(), json!({ "content": p }));
                }
            }
            v
        }
    }
}

/// A prompt progress event in the shape of `api` (llama-server's partial result with
/// `is_progress`: no text, `prompt_progress`, and `timings` with `timings_per_token`).
fn progress_json(ready: &Ready, req: &Request, api: Api, p: &Progress) -> Value {
    let mut v = match api {
        // llama-server's progress events carry a token id 0 (an empty token's).
        Api::Llama | Api::Infill => json!({
            "index": 0,
            "content": "",
            "tokens": [0],
            "stop": false,
            "id_slot": -1,
            "tokens_predicted": 0,
            "tokens_evaluated": p.total,
        }),
        Api::OaiCompletion => partial_json(ready, req, api, "", 0, None, 0),
        Api::OaiChat => chat_chunk(
            ready,
            req,
            json!({"role": "assistant", "content": null}),
            Value::Null,
        ),
    };
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "prompt_progress".into(),
            json!({"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms}),
        );
        if req.timings_per_token {
            o.insert("timings".into(), timings_json(&p.timings));
        }
    }
    v
}

/// A `chat.completion.chunk` with one choice.
fn chat_chunk(ready: &Ready, req: &Request, delta: Value, finish: Value) -> Value {
    json!({
        "choices": [{ "finish_reason": finish, "index": 0, "delta": delta }],
        "created": req.created,
        "id": req.id,
        "model": model_name(ready),
        "system_fingerprint": ready.fingerprint,
        "object": "chat.completion.chunk",
    })
}

/// The last events of a stream in the shape of `api`.
fn final_stream_json(
    ready: &Ready,
    req: &Request,
    api: Api,
    f: &Finished,
    has_calls: bool,
) -> Vec<Value> {
    let timings = timings_json(&f.completion.timings);
    match api {
        Api::Llama | Api::Infill => vec![llama_final(ready, req, f, "")],
        Api::OaiCompletion => {
            let mut v = json!({
                "choices": [{
                    "text": "",
                    "index": 0,
                    "logprobs": null,
                    "finish_reason": finish_reason(f),
                }],
                "created": req.created,
                "model": model_name(ready),
                "system_fingerprint": ready.fingerprint,
                "object": "text_completion",
                "id": req.id,
                "timings": timings,
            });
            if req.include_usage {
                if let Some(o) = v.as_object_mut() {
                    o.insert("usage".into(), usage_json(f));
                }
            }
            vec![v]
        }
        Api::OaiChat => {
            let finish = chat_finish_reason(f, has_calls);
            let mut out = vec![chat_chunk(ready, req, json!({}), finish.into())];
            if req.include_usage {
                out.push(json!({
                    "choices": [],
                    "created": req.created,
                    "id": req.id,
                    "model": model_name(ready),
                    "system_fingerprint": ready.fingerprint,
                    "object": "chat.completion.chunk",
                    "usage": usage_json(f),
                }));
            }
            if let Some(o) = out.last_mut().and_then(Value::as_object_mut) {
                o.insert("timings".into(), timings);
            }
            out
        }
    }
}
