//! A model's chat template from its GGUF header: the template source (see [`super::source`]
//! for the order of choice) and the BOS / EOS texts it sees.
//!
//! As in llama.cpp `common_chat_templates_init` (common/chat.cpp), `bos_token` / `eos_token` are
//! the texts of the tokens `tokenizer.ggml.bos_token_id` / `eos_token_id` name in
//! `tokenizer.ggml.tokens`, and the empty string when the model has no such token. (llama.cpp
//! detokenizes the token with `special = true`; for the control tokens models use as BOS/EOS
//! that is the token text itself.)

use super::source::{choose_template, TemplateOrigin};
use super::template::{ChatError, ChatTemplate};
use ir::gguf::GgufFile;

/// The text of token `tokenizer.ggml.<which>_token_id`, or `""` when the model names none.
///
/// Errors: [`ChatError::Model`] when the id is not an integer, or names no entry of
/// `tokenizer.ggml.tokens`.
pub fn special_token_text(file: &GgufFile, which: &str) -> Result<String, ChatError> {
    let key = format!("tokenizer.ggml.{which}_token_id");
    let md = file.metadata();
    let Some(value) = md.get(&key) else {
        return Ok(String::new());
    };
    let id = value
        .as_u32()
        .ok_or_else(|| ChatError::Model(format!("{key} is not a token id: {value:?}")))?;
    let tokens = md
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .and_then(|a| a.as_strs())
        .ok_or_else(|| {
            ChatError::Model("tokenizer.ggml.tokens is missing or not a list of strings".into())
        })?;
    tokens.get(id as usize).cloned().ok_or_else(|| {
        ChatError::Model(format!(
            "{key} = {id} is past the vocabulary ({} tokens)",
            tokens.len()
        ))
    })
}

/// The chat template for a model: `user_template` when given (`--chat-template-file`),
/// else the named variant `name`, else the model's default, else the ChatML fallback; compiled
/// with the model's BOS / EOS texts.
///
/// Errors: [`ChatError::Model`] for a missing named template or bad BOS/EOS ids,
/// [`ChatError::Syntax`] when the template does not compile.
pub fn template_for_model(
    file: &GgufFile,
    user_template: Option<&str>,
    name: Option<&str>,
) -> Result<(ChatTemplate, TemplateOrigin), ChatError> {
    let md = file.metadata();
    let lookup = |key: &str| md.get(key).and_then(|v| v.as_str()).map(str::to_string);
    let (source, origin) =
        choose_template(user_template, name, &lookup).map_err(ChatError::Model)?;
    let bos = special_token_text(file, "bos")?;
    let eos = special_token_text(file, "eos")?;
    Ok((ChatTemplate::new(&source, &bos, &eos)?, origin))
}
