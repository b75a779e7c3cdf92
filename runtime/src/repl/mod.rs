//! The conversation loop of `modelc repl`, of a runner's `-cnv` mode and of `modelc run
//! -cnv`: one implementation (llama-cli's conversation mode, with what its users miss).
//!
//! Each turn re-renders the conversation with the chat template and hands the tokens to
//! [`Generation`], which keeps the longest prefix the session already holds: only the new
//! message (and the template's headers around it) is evaluated. Answers stream to stdout as
//! they are generated; everything else (the banner, command replies, warnings) goes to
//! stderr, so that piped output holds only the answers. Ctrl-C stops the answer being
//! generated and keeps the conversation (the partial answer stays, marked as interrupted); a
//! second Ctrl-C at an empty prompt exits with status 130. A full context stops the answer
//! with a message instead of an error.
//!
//! Commands: see [`HELP`].

pub mod input;

use crate::chat::{ChatTemplate, RenderOptions};
use crate::generate::{prefill, Completion, GenerateOptions, Generation};
use crate::session::Session;
use crate::tokenizer::Vocab;
use anyhow::Context;
use input::{read_message, Lines, Read};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The commands, as `/help` prints them.
pub const HELP: &str = "\
/help               this text
/exit               leave (also Ctrl-D)
/clear              start a new conversation (the system prompt stays)
/regen              drop the last answer and generate it again
/system TEXT        set the system prompt (empty TEXT removes it)
/set NAME VALUE     temp, top_k, top_p, min_p, repeat_penalty, seed, n_predict
/stats              speed of the last turn, context used, memory
/save FILE          save the conversation (OpenAI messages JSON)
/load FILE          load a conversation saved with /save
/raw                toggle plain completion without the chat template
\"\"\"                 on a line of its own: start or end a multi-line message";

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// Generation settings of every answer (sampler, `-n`, stop strings, `-b`).
    pub generate: GenerateOptions,
    /// The system prompt.
    pub system: Option<String>,
    /// A first message to answer before reading any (`-p`).
    pub first: Option<String>,
    /// Answer one message and exit (`-st`).
    pub single_turn: bool,
    /// Shift the context when it fills: drop the oldest messages (the system prompt stays)
    /// and, within an answer, the oldest half of the positions after the kept ones.
    pub context_shift: bool,
    /// Tokens after the system prompt that a shift within an answer keeps (`--keep`).
    pub keep: usize,
}

/// Whether a Ctrl-C arrived, and whether an answer is being generated, shared with the
/// signal handler.
#[derive(Debug, Default)]
struct Interrupts {
    /// Set by Ctrl-C; read by the generation as its cancel flag.
    cancel: Arc<AtomicBool>,
    /// An answer is being generated.
    generating: AtomicBool,
    /// Ctrl-Cs since the last message while no answer was generated.
    idle_presses: AtomicUsize,
}

/// A conversation with the model (module doc).
pub struct Chat<'a, 'w> {
    session: &'a mut Session<'w>,
    vocab: &'a Vocab,
    template: ChatTemplate,
    opts: ChatOptions,
    /// The conversation in OpenAI's messages format (`{"role", "content"}`).
    messages: Vec<serde_json::Value>,
    /// Plain completion: the text so far, continued without the template.
    raw: Option<String>,
    last: Option<Completion>,
    interrupts: Arc<Interrupts>,
    /// The `-md` draft model, if any ([`Generation::with_drafter`]).
    drafter: Option<&'a mut (dyn crate::speculative::Drafter + 'a)>,
}

fn message(role: &str, content: &str) -> serde_json::Value {
    serde_json::json!({ "role": role, "content": content })
}

impl<'a, 'w> Chat<'a, 'w> {
    /// A conversation on sequence 0 of `session`.
    pub fn new(
        session: &'a mut Session<'w>,
        vocab: &'a Vocab,
        template: ChatTemplate,
        opts: ChatOptions,
    ) -> Chat<'a, 'w> {
        let mut c = Chat {
            session,
            vocab,
            template,
            messages: Vec::new(),
            raw: None,
            last: None,
            interrupts: Arc::new(Interrupts::default()),
            opts,
            drafter: None,
        };
        c.opts.generate.cancel = Some(c.interrupts.cancel.clone());
        c.opts.generate.cache_prompt = true;
        c.reset();
        c
    }

    /// Answers with drafts from `drafter` (the `-md` draft model) verified in one step.
    pub fn with_drafter(
        mut self,
        drafter: Option<&'a mut (dyn crate::speculative::Drafter + 'a)>,
    ) -> Self {
        self.drafter = drafter;
        self
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[serde_json::Value] {
        &self.messages
    }

    /// A new conversation: the system prompt only.
    fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.opts.system {
            self.messages.push(message("system", s));
        }
        if self.raw.is_some() {
            self.raw = Some(String::new());
        }
    }

    /// The prompt tokens of the conversation, ending with the assistant's header.
    fn prompt(&self) -> anyhow::Result<Vec<u32>> {
        match &self.raw {
            Some(t) => Ok(self.vocab.tokenize(t, true, true)),
            None => self.render_prompt(&self.messages),
        }
    }

    /// The tokens of `messages` rendered with the template, ending with the assistant's
    /// header.
    fn render_prompt(&self, messages: &[serde_json::Value]) -> anyhow::Result<Vec<u32>> {
        let text = self
            .template
            .render(messages, &RenderOptions::for_prompt(self.vocab, true))?;
        Ok(self.vocab.tokenize(&text, true, true))
    }

    /// Sends `text` as the user's message and streams the answer to `out`.
    ///
    /// # Errors
    /// A template or engine error, or a failed write to `out`.
    pub fn send(&mut self, text: &str, out: &mut dyn Write) -> anyhow::Result<()> {
        match &mut self.raw {
            Some(t) => t.push_str(text),
            None => self.messages.push(message("user", text)),
        }
        self.answer(out)
    }

    /// Generates the assistant's answer to the conversation, streaming it to `out`.
    fn answer(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        let n_ctx = self.session.n_ctx();
        let mut tokens = self.prompt()?;
        // A conversation that does not fit (with room to answer) loses its oldest messages,
        // the system prompt kept, as long as the last message remains.
        let room = (n_ctx / 4).max(1);
        let mut dropped = 0;
        while self.opts.context_shift && self.raw.is_none() && tokens.len() + room > n_ctx {
            let first = usize::from(self.messages.first().is_some_and(|m| m["role"] == "system"));
            if self.messages.len() <= first + 1 {
                break;
            }
            self.messages.remove(first);
            dropped += 1;
            tokens = self.prompt()?;
        }
        if dropped > 0 {
            eprintln!("[the context is full: the {dropped} oldest messages were dropped]");
        }
        if tokens.len() >= n_ctx {
            eprintln!(
                "[the conversation has {} tokens and the context holds {n_ctx}: /clear starts a new one, or use a larger -c]",
                tokens.len()
            );
            // The message that did not fit is not kept.
            self.undo_user();
            return Ok(());
        }
        self.opts.generate.context_shift = if self.opts.context_shift && self.raw.is_none() {
            Some(self.system_tokens()? + self.opts.keep)
        } else {
            None
        };
        self.interrupts.cancel.store(false, Ordering::Relaxed);
        self.interrupts.generating.store(true, Ordering::Relaxed);
        let result = (|| -> anyhow::Result<Completion> {
            let mut g =
                Generation::start(self.session, self.vocab, 0, &tokens, &self.opts.generate)?
                    .with_drafter(self.drafter.as_deref_mut());
            while let Some(t) = g.step()? {
                out.write_all(t.as_bytes())?;
                out.flush()?;
            }
            Ok(g.finish())
        })();
        self.interrupts.generating.store(false, Ordering::Relaxed);
        let c = match result {
            Ok(c) => c,
            Err(e) if self.interrupts.cancel.load(Ordering::Relaxed) => {
                // Cancelled while the prompt was evaluated: nothing was answered.
                self.undo_user();
                writeln!(out)?;
                eprintln!("[interrupted: {e}]");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        writeln!(out)?;
        out.flush()?;
        if c.n_discarded > 0 {
            eprintln!(
                "[the context ({n_ctx} tokens) filled: {} of the oldest positions after the system prompt were dropped]",
                c.n_discarded
            );
        }
        match c.stop_type {
            "cancelled" => eprintln!("[interrupted]"),
            "context" => eprintln!(
                "[the context ({n_ctx} tokens) is full: /clear starts a new conversation, or use a larger -c]"
            ),
            _ => {}
        }
        match &mut self.raw {
            Some(t) => t.push_str(&c.content),
            None => {
                let mut m = message("assistant", &c.content);
                if c.stop_type == "cancelled" {
                    m["interrupted"] = serde_json::Value::Bool(true);
                }
                // The ids generated, so that a loaded conversation is evaluated as it was
                // ([`Chat::replay`]); other readers ignore the field.
                m["tokens"] = serde_json::json!(c.tokens);
                self.messages.push(m);
            }
        }
        self.last = Some(c);
        Ok(())
    }

    /// Tokens of the rendered system prompt alone (BOS included), which a context shift
    /// keeps; just BOS without one.
    fn system_tokens(&self) -> anyhow::Result<usize> {
        let system: Vec<serde_json::Value> = self
            .messages
            .iter()
            .take_while(|m| m["role"] == "system")
            .cloned()
            .collect();
        if system.is_empty() {
            return Ok(usize::from(self.vocab.add_bos()));
        }
        let text = self
            .template
            .render(&system, &RenderOptions::for_prompt(self.vocab, false))?;
        Ok(self.vocab.tokenize(&text, true, true).len())
    }

    /// Drops a last user message that was not answered.
    fn undo_user(&mut self) {
        if self.messages.last().is_some_and(|m| m["role"] == "user") {
            self.messages.pop();
        }
    }

    /// Runs one command line (starting with `/`); returns `false` for `/exit`.
    ///
    /// # Errors
    /// A command that fails in a way the user must see (a file that cannot be written);
    /// bad arguments are reported on stderr and the loop goes on.
    pub fn command(&mut self, line: &str, out: &mut dyn Write) -> anyhow::Result<bool> {
        let line = line.trim();
        let (cmd, arg) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let arg = arg.trim();
        match cmd {
            "/exit" | "/quit" => return Ok(false),
            "/help" => eprintln!("{HELP}"),
            "/clear" => {
                self.reset();
                self.session.clear();
                self.last = None;
                eprintln!("[new conversation]");
            }
            "/regen" => {
                if self.raw.is_some() {
                    eprintln!("[/regen works on chat turns; leave /raw first]");
                } else if self
                    .messages
                    .last()
                    .is_some_and(|m| m["role"] == "assistant")
                {
                    self.messages.pop();
                    self.answer(out)?;
                } else {
                    eprintln!("[no answer to generate again]");
                }
            }
            "/system" => {
                self.opts.system = (!arg.is_empty()).then(|| arg.to_string());
                if self.messages.first().is_some_and(|m| m["role"] == "system") {
                    self.messages.remove(0);
                }
                if let Some(s) = &self.opts.system {
                    self.messages.insert(0, message("system", s));
                }
                eprintln!(
                    "[system prompt {}]",
                    if arg.is_empty() { "removed" } else { "set" }
                );
            }
            "/set" => match self.set(arg) {
                Ok(()) => eprintln!("[{arg}]"),
                Err(e) => eprintln!("[/set: {e}]"),
            },
            "/stats" => eprintln!("{}", self.stats()),
            "/save" => match save(Path::new(arg), &self.messages) {
                Ok(()) => eprintln!("[saved {} messages to {arg}]", self.messages.len()),
                Err(e) => eprintln!("[/save: {e:#}]"),
            },
            "/load" if arg.is_empty() => eprintln!("[/load needs a file name]"),
            "/load" => match load(Path::new(arg)) {
                Ok(m) => {
                    self.messages = m;
                    self.raw = None;
                    self.last = None;
                    self.replay()?;
                    eprintln!("[loaded {} messages from {arg}]", self.messages.len());
                }
                Err(e) => eprintln!("[/load: {e:#}]"),
            },
            "/raw" => {
                self.raw = match self.raw {
                    Some(_) => None,
                    None => Some(String::new()),
                };
                eprintln!(
                    "[{}]",
                    if self.raw.is_some() {
                        "plain completion: each message continues the text"
                    } else {
                        "chat"
                    }
                );
            }
            other => eprintln!("[unknown command {other}; /help lists them]"),
        }
        Ok(true)
    }

    /// Evaluates a loaded conversation the way it was evaluated when it was held: each
    /// turn's prompt as that turn's generation evaluated it, then the answer's generated
    /// ids one at a time (all but the last, which a generation samples and does not
    /// evaluate), so the cache, and what follows, is what it was. Answers saved without
    /// their ids are left to the next turn's prompt.
    ///
    /// # Errors
    /// A template or engine error.
    fn replay(&mut self) -> anyhow::Result<()> {
        self.session.clear();
        let opts = &self.opts.generate;
        let mut logits = Vec::new();
        for i in 0..self.messages.len() {
            let m = &self.messages[i];
            if m["role"] != "assistant" {
                continue;
            }
            let Some(ids) = m["tokens"].as_array() else {
                continue;
            };
            let ids: Vec<u32> = ids
                .iter()
                .filter_map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect();
            let prompt = self.render_prompt(&self.messages[..i])?;
            if prompt.is_empty() || prompt.len() + ids.len() >= self.session.n_ctx() {
                continue;
            }
            prefill(self.session, 0, &prompt, opts, &mut logits)?;
            for &t in ids.iter().take(ids.len().saturating_sub(1)) {
                if (t as usize) >= self.session.n_vocab() {
                    break;
                }
                self.session.eval(0, &[t], false)?;
            }
        }
        Ok(())
    }

    /// `/set NAME VALUE`.
    fn set(&mut self, arg: &str) -> anyhow::Result<()> {
        let (name, value) = arg
            .split_once(char::is_whitespace)
            .context("give a name and a value")?;
        let value = value.trim();
        let f = || -> anyhow::Result<f32> {
            let v = value
                .parse::<f32>()
                .with_context(|| format!("'{value}' is not a number"))?;
            anyhow::ensure!(v.is_finite(), "'{value}' is not a finite number");
            Ok(v)
        };
        let s = &mut self.opts.generate.sampler;
        match name {
            "temp" => s.temp = f()?,
            "top_k" => s.top_k = value.parse().context("top_k is a whole number")?,
            "top_p" => s.top_p = f()?,
            "min_p" => s.min_p = f()?,
            "repeat_penalty" => s.repeat_penalty = f()?,
            "seed" => {
                s.seed = match value.parse::<i64>() {
                    // -1, as -s -1: a random seed.
                    Ok(-1) => u64::from(rand::random_range(0..u32::MAX)),
                    _ => value
                        .parse()
                        .context("a seed is -1 (random) or a number from 0 up")?,
                }
            }
            "n_predict" => {
                let n: i64 = value.parse().context("n_predict is a whole number")?;
                anyhow::ensure!(n >= -1, "n_predict is a number of tokens, or -1");
                self.opts.generate.n_predict = n;
            }
            other => anyhow::bail!(
                "no setting '{other}' (temp, top_k, top_p, min_p, repeat_penalty, seed, n_predict)"
            ),
        }
        Ok(())
    }

    /// What `/stats` prints.
    pub fn stats(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut s = String::new();
        if let Some(c) = &self.last {
            let t = &c.timings;
            s += &format!(
                "last turn: {} prompt tokens evaluated ({} reused from the cache) at {:.1} t/s; {} tokens generated at {:.1} t/s\n",
                t.prompt_n, t.cache_n, t.prompt_per_second, t.predicted_n, t.predicted_per_second
            );
            if let Some(line) = t.draft_line() {
                s += &format!("{line}\n");
            }
        }
        let m = self.session.memory();
        s += &format!(
            "context: {} / {} tokens\nmemory: weights {:.1} MiB (copies made at load), KV cache {:.1} MiB, work buffers {:.1} MiB",
            self.session.n_past(0),
            self.session.n_ctx(),
            mib(m.engine.weights),
            mib(m.kv),
            mib(m.engine.work)
        );
        s
    }
}

/// Writes `messages` as `{"messages": [...]}` to `path` atomically (a temporary file in the
/// same folder, then a rename): what was there is never lost half-written.
///
/// # Errors
/// The file cannot be written.
pub fn save(path: &Path, messages: &[serde_json::Value]) -> anyhow::Result<()> {
    anyhow::ensure!(!path.as_os_str().is_empty(), "needs a file name");
    anyhow::ensure!(
        !path.is_dir() && !path.as_os_str().to_string_lossy().ends_with('/'),
        "{} is a directory: give a file name",
        path.display()
    );
    let json = serde_json::to_string_pretty(&serde_json::json!({ "messages": messages }))?;
    path.file_name().context("/save needs a file name")?;
    let (mut f, tmp, dest) = ir::gguf::create_beside(path)
        .map_err(|e| anyhow::anyhow!("saving {}: {e}", path.display()))?;
    let mut write = || -> std::io::Result<()> {
        f.write_all(json.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dest)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("saving {}: {e}", path.display())
    })
}

/// Reads a conversation written by [`save`] (or any `{"messages": [...]}` / bare list of
/// `{"role", "content"}` objects).
///
/// # Errors
/// The file cannot be read, is not such JSON, or a message lacks a role or text content.
pub fn load(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let list = match v.get("messages").unwrap_or(&v) {
        serde_json::Value::Array(a) => a.clone(),
        _ => anyhow::bail!("{}: expected {{\"messages\": [...]}}", path.display()),
    };
    for (i, m) in list.iter().enumerate() {
        anyhow::ensure!(
            m["role"].is_string() && m["content"].is_string(),
            "{}: message {i} needs a string role and content",
            path.display()
        );
    }
    Ok(list)
}

/// Runs the loop: reads messages and commands from `lines` until `/exit` or the end of the
/// input, streaming answers to stdout. Returns the process's exit status (130 after a
/// second Ctrl-C at an empty prompt).
///
/// # Errors
/// An engine or template error, or output that cannot be written.
pub fn run(chat: &mut Chat<'_, '_>, lines: &mut dyn Lines, terminal: bool) -> anyhow::Result<u8> {
    let interrupts = chat.interrupts.clone();
    // Ctrl-C as a signal (a pipe, or while an answer is generated: the line editor reads
    // Ctrl-C as a key at its prompt). One handler per process.
    let handler = interrupts.clone();
    let _ = ctrlc::set_handler(move || {
        if handler.generating.load(Ordering::Relaxed) {
            handler.cancel.store(true, Ordering::Relaxed);
        } else if handler.idle_presses.fetch_add(1, Ordering::Relaxed) >= 1 {
            std::process::exit(130);
        } else {
            eprintln!("\n[Ctrl-C again to exit]");
        }
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if terminal {
        eprintln!("[chat: /help for commands, \"\"\" for multi-line messages, Ctrl-C stops an answer, Ctrl-D leaves]");
    }
    if let Some(first) = chat.opts.first.take() {
        chat.send(&first, &mut out)?;
        if chat.opts.single_turn {
            return Ok(0);
        }
    }
    let prompt = if terminal { "> " } else { "" };
    loop {
        let text = match read_message(lines, prompt)? {
            Read::Eof => return Ok(0),
            Read::Interrupted => {
                if interrupts.idle_presses.fetch_add(1, Ordering::Relaxed) >= 1 {
                    return Ok(130);
                }
                eprintln!("[Ctrl-C again to exit]");
                continue;
            }
            Read::Text(t) => (t, false),
            Read::Block(t) => (t, true),
        };
        let (text, block) = text;
        interrupts.idle_presses.store(0, Ordering::Relaxed);
        if text.trim().is_empty() {
            continue;
        }
        if text.starts_with('/') && !block {
            if !chat.command(&text, &mut out)? {
                return Ok(0);
            }
            continue;
        }
        chat.send(&text, &mut out)?;
        if chat.opts.single_turn {
            return Ok(0);
        }
    }
}
