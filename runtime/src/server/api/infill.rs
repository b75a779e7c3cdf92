//! `POST /infill`: fill-in-the-middle code completion, as llama-server answers it
//! (`post_infill` in `server-context.cpp`, `format_prompt_infill` in `server-common.cpp`,
//! llama.cpp 0c1e570); editors' plugins (llama.vim, llama.vscode) call it. The request is a
//! `/completion` request whose prompt is built from `input_prefix`, `input_suffix`, the
//! optional `input_extra` chunks (other files) and `prompt` (text after the prefix); the
//! response is `/completion`'s.
//!
//! The prompt, in token order (the repo-level pattern of Qwen2.5-Coder, arXiv 2409.12186):
//! `[FIM_REP] myproject\n` (when the vocabulary has a repo token), then for each extra chunk
//! `[FIM_SEP] filename\n text` (without a separator token: a `\n\n--- snippet ---\n\n`
//! line), then `[FIM_SEP] filename\n`, then BOS (when the vocabulary adds one),
//! `[FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]` (`--spm-infill`: the suffix part
//! first). The prefix keeps its last `3·n_batch/4` tokens, the suffix its first
//! `n_batch/4 − 2 − |prompt|`, and the extra context its last `n_ctx − n_batch − 2·n_predict`
//! tokens.

use serde_json::Value;

use super::super::error::ApiError;
use super::super::params::{wrong_type, Body};
use super::completion::mixed_list;
use crate::tokenizer::{TokenId, Vocab};

/// What the prompt's size limits depend on: llama-server's `-b`, `-n` and a slot's context.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Tokens of a batch (`-b`).
    pub n_batch: usize,
    /// The server's `-n` (-1: unlimited, counted as such by llama-server's arithmetic).
    pub n_predict: i64,
    /// Positions of a slot's context.
    pub n_ctx: usize,
    /// `--spm-infill`: suffix before prefix.
    pub spm: bool,
}

/// The token prompt of an infill request `body`.
///
/// # Errors
/// 501 when the vocabulary lacks a prefix, suffix or middle token (llama-server's message,
/// naming each one missing); 400 for a missing `input_prefix` / `input_suffix`, a `prompt`
/// that is not a string, or `input_extra` that is not a list of `{"text", "filename"}`
/// objects with string values.
pub fn prompt(vocab: &Vocab, body: &Body, limits: Limits) -> Result<Vec<TokenId>, ApiError> {
    let [pre, suf, mid, _pad, rep, sep] = vocab.fim();
    let (Some(pre), Some(suf), Some(mid)) = (pre, suf, mid) else {
        let missing: String = [(pre, "prefix"), (suf, "suffix"), (mid, "middle")]
            .iter()
            .filter(|(id, _)| id.is_none())
            .map(|(_, name)| format!("{name} token is missing. "))
            .collect();
        return Err(ApiError::not_supported(format!(
            "Infill is not supported by this model: {missing}"
        )));
    };
    let text_prompt = match body.get("prompt") {
        None => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(ApiError::invalid("\"prompt\" must be a string")),
    };
    let input_prefix = body
        .get("input_prefix")
        .ok_or_else(|| ApiError::invalid("\"input_prefix\" is required"))?;
    let input_suffix = body
        .get("input_suffix")
        .ok_or_else(|| ApiError::invalid("\"input_suffix\" is required"))?;
    let extra = extra_chunks(body)?;

    let mut extra_tokens: Vec<TokenId> = Vec::new();
    if let Some(rep) = rep {
        extra_tokens.push(rep);
        extra_tokens.extend(vocab.tokenize("myproject\n", false, false));
    }
    for (filename, text) in &extra {
        match sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(vocab.tokenize(&format!("{filename}\n"), false, false));
            }
            None => extra_tokens.extend(vocab.tokenize("\n\n--- snippet ---\n\n", false, false)),
        }
        extra_tokens.extend(vocab.tokenize(text, false, false));
    }
    if let Some(sep) = sep {
        extra_tokens.push(sep);
        extra_tokens.extend(vocab.tokenize("filename\n", false, false));
    }

    let tokens_prompt = vocab.tokenize(text_prompt, false, true);
    let mut prefix = mixed(vocab, "input_prefix", input_prefix)?;
    let mut suffix = mixed(vocab, "input_suffix", input_suffix)?;
    let n_batch = limits.n_batch as i64;
    let n_prefix_take = (prefix.len() as i64).min(3 * (n_batch / 4)).max(0) as usize;
    let n_suffix_take = (suffix.len() as i64)
        .min((n_batch / 4 - (2 + tokens_prompt.len() as i64)).max(0))
        .max(0) as usize;
    let n_extra_take = (extra_tokens.len() as i64)
        .min((limits.n_ctx as i64 - n_batch - 2 * limits.n_predict).max(0))
        .max(0) as usize;
    prefix.drain(..prefix.len() - n_prefix_take);
    suffix.truncate(n_suffix_take);
    prefix.insert(0, pre);
    prefix.extend(&tokens_prompt);
    suffix.insert(0, suf);
    let (mut first, last) = if limits.spm {
        (suffix, prefix)
    } else {
        (prefix, suffix)
    };
    if vocab.add_bos() {
        if let Some(bos) = vocab.bos() {
            first.insert(0, bos);
        }
    }
    let mut out = extra_tokens[extra_tokens.len() - n_extra_take..].to_vec();
    out.extend(first);
    out.extend(last);
    out.push(mid);
    Ok(out)
}

/// `input_extra`: `(filename, text)` of each chunk (`filename` defaults to `tmp`).
fn extra_chunks(body: &Body) -> Result<Vec<(String, String)>, ApiError> {
    // `null` too is refused (llama-server checks `contains`, not its value).
    let chunks = match body.0.get("input_extra") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
            ))
        }
    };
    chunks
        .iter()
        .map(|chunk| {
            let text = match chunk.get("text") {
                Some(Value::String(t)) => t.clone(),
                _ => {
                    return Err(ApiError::invalid(
                        "extra_context chunk must contain a \"text\" field with a string value",
                    ))
                }
            };
            let filename = match chunk.get("filename") {
                None => "tmp".to_string(),
                Some(Value::String(f)) => f.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "extra_context chunk's \"filename\" field must be a string",
                    ))
                }
            };
            Ok((filename, text))
        })
        .collect()
}

/// A text or a list of texts and token ids, tokenized without special tokens and without
/// parsing them in the text (llama-server's `tokenize_mixed(…, false, false)`).
fn mixed(vocab: &Vocab, name: &str, v: &Value) -> Result<Vec<TokenId>, ApiError> {
    const EXPECTED: &str = "a string or token ids";
    match v {
        Value::String(s) => Ok(vocab.tokenize(s, false, false)),
        Value::Array(items) => mixed_list(vocab, name, items, (false, false), EXPECTED),
        other => Err(wrong_type(name, EXPECTED, other)),
    }
}
