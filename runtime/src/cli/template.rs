//! `modelc template MODEL.gguf --messages FILE.json [--no-generation-prompt]
//! [--chat-template-file FILE.jinja | --chat-template NAME|TEXT | --chat-template-variant NAME]
//! [--now TIME]`: prints the
//! prompt the model's chat template renders, exactly and with nothing added (no trailing
//! newline), so it can be compared byte for byte or piped into `modelc tokenize`.
//!
//! The messages file holds a JSON list of messages (`[{"role": "user", "content": "…"}]`), or
//! an object `{"messages": [...], "tools": [...]}` to pass tool schemas too. Rendering follows
//! Hugging Face `apply_chat_template` (see `runtime::chat::template`); a model without a
//! template uses llama.cpp's ChatML fallback (`runtime::chat::CHATML_FALLBACK`), and says so
//! on stderr.

use crate::chat::{template_for_model, CivilTime, RenderOptions, TemplateOrigin};
use anyhow::{bail, Context};
use ir::gguf::GgufFile;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `modelc template`.
#[derive(clap::Args, Debug)]
pub struct TemplateArgs {
    /// The GGUF model whose template and BOS/EOS texts are used.
    pub model: PathBuf,
    /// JSON file: a list of {role, content} messages, or {"messages": [...], "tools": [...]}.
    #[arg(long)]
    pub messages: PathBuf,
    /// Do not end the prompt with the assistant's turn header (add_generation_prompt = false).
    #[arg(long)]
    pub no_generation_prompt: bool,
    /// Use this Jinja template instead of the model's (llama.cpp's flag); the model's BOS/EOS
    /// texts are still used.
    #[arg(long, value_name = "FILE.jinja")]
    pub chat_template_file: Option<PathBuf>,
    /// A built-in format by name (chatml, gemma — llama.cpp's names) or a template text, used
    /// instead of the model's (llama.cpp's flag).
    #[arg(long, value_name = "NAME|TEXT", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Use the model's named template `tokenizer.chat_template.NAME` (e.g. tool_use).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = ["chat_template_file", "chat_template"]
    )]
    pub chat_template_variant: Option<String>,
    /// The time strftime_now sees, YYYY-MM-DD[THH:MM[:SS]] (default: the system clock, UTC).
    #[arg(long, value_name = "TIME")]
    pub now: Option<String>,
}

/// Runs `modelc template`: renders and prints the prompt.
///
/// Errors: unreadable files, a messages file that is not a list of JSON objects, a bad `--now`,
/// a template that does not compile, and every render error (a template's
/// `raise_exception(msg)` prints as `msg`).
pub fn run(args: TemplateArgs) -> anyhow::Result<()> {
    let now = match &args.now {
        Some(text) => Some(CivilTime::parse(text).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let input: serde_json::Value = {
        let bytes = std::fs::read(&args.messages)
            .with_context(|| format!("reading {}", args.messages.display()))?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not valid JSON", args.messages.display()))?
    };
    let (messages, tools) = match input {
        serde_json::Value::Array(list) => (list, None),
        serde_json::Value::Object(mut obj) => match obj.remove("messages") {
            Some(serde_json::Value::Array(list)) => (list, obj.remove("tools")),
            _ => bail!(
                "{}: the object has no \"messages\" list",
                args.messages.display()
            ),
        },
        _ => bail!(
            "{}: expected a list of messages or an object with \"messages\"",
            args.messages.display()
        ),
    };
    let user_template = super::gen_args::user_template_text(
        args.chat_template_file.as_deref(),
        args.chat_template.as_deref(),
    )?;
    let file =
        GgufFile::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?;
    let (template, origin) = template_for_model(
        &file,
        user_template.as_deref(),
        args.chat_template_variant.as_deref(),
    )?;
    if origin == TemplateOrigin::Fallback {
        eprintln!(
            "{}: the model has no chat template; using the ChatML fallback",
            crate::cli::prog()
        );
    }
    let opts = RenderOptions {
        add_generation_prompt: !args.no_generation_prompt,
        tools: tools.filter(|t| !t.is_null()),
        now,
        ..Default::default()
    };
    // OpenAI's content parts joined as the server joins them.
    let messages = crate::chat::normalize_messages(&messages)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.messages.display()))?;
    let prompt = template
        .render(&messages, &opts)
        .context("rendering the chat template")?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(prompt.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
