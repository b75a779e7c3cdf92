//! `modelc tokenize` and `modelc detokenize`: the model's tokenizer from the command line.
//!
//! `tokenize MODEL.gguf [-p TEXT | -f FILE | stdin] [--no-bos] [--no-parse-special] [--pieces]`
//! - The text is taken exactly as given: nothing is trimmed, a trailing newline from stdin or
//!   a file is part of the text.
//! - Input that is not valid UTF-8 is converted, each byte that does not start a well-formed
//!   character becoming U+FFFD (as llama.cpp's BPE pre-tokenizer reads such bytes), with a
//!   warning on stderr.
//! - BOS / EOS are added where the model asks for them unless `--no-bos`; control-token
//!   texts such as `<|im_start|>` in the text are those tokens (llama.cpp's
//!   `parse_special`, which llama-tokenize turns on by default) unless `--no-parse-special`.
//! - Output: the ids on one line, separated by spaces. With `--pieces`, one token per line:
//!   `ID<TAB>PIECE`, the piece being what the token prints as (control tokens included),
//!   with `\n`, `\r`, `\t`, `\\` and other control characters escaped, and bytes that are not
//!   valid UTF-8 on their own (part of a character split across tokens) shown as `\xNN`.
//!
//! `detokenize MODEL.gguf IDS...` prints the text of the ids (llama.cpp `llama_detokenize`),
//! byte for byte, with nothing added (no newline). Ids may be given as separate arguments or
//! separated by spaces or commas within one. Control tokens are printed unless `--no-special`.
//! An id outside the vocabulary is an error.

use crate::tokenizer::{TokenId, Vocab};
use anyhow::Context;
use clap::Args;
use ir::gguf::GgufFile;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Arguments of `modelc tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The GGUF file whose tokenizer to use (only its metadata is read).
    pub model: PathBuf,
    /// The text to tokenize (default: read standard input).
    #[arg(
        short = 'p',
        long = "prompt",
        conflicts_with = "file",
        allow_hyphen_values = true
    )]
    pub prompt: Option<String>,
    /// Read the text from this file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Add no BOS / EOS, even where the model asks for them.
    #[arg(long)]
    pub no_bos: bool,
    /// Take special-token texts (like `<|im_start|>`) as plain text, not as those tokens
    /// (llama-tokenize's `--no-parse-special`; parsing them is the default, as there).
    #[arg(long = "no-parse-special", overrides_with = "special")]
    pub no_parse_special: bool,
    /// Parse special-token texts as those tokens (the default; kept for scripts).
    #[arg(long, overrides_with = "no_parse_special")]
    pub special: bool,
    /// Print one `ID<TAB>PIECE` line per token instead of the ids on one line.
    #[arg(long)]
    pub pieces: bool,
}

/// Arguments of `modelc detokenize`.
#[derive(Args, Debug)]
pub struct DetokenizeArgs {
    /// The GGUF file whose tokenizer to use.
    pub model: PathBuf,
    /// Token ids (separate arguments, or separated by spaces or commas).
    #[arg(required = true, allow_hyphen_values = true)]
    pub ids: Vec<String>,
    /// Print nothing for control tokens (BOS, EOS, chat markers).
    #[arg(long)]
    pub no_special: bool,
}

/// Loads the vocabulary of `path`, with the file named in errors.
/// Prints the vocabulary's load warnings (not its notes) on stderr.
pub fn load_vocab(path: &Path) -> anyhow::Result<Vocab> {
    // GgufError names the file already; flatten it to one line.
    let file = GgufFile::open(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let vocab = Vocab::from_gguf(&file)
        .map_err(|e| anyhow::anyhow!("{}: cannot load the tokenizer: {e}", path.display()))?;
    for w in vocab.warnings() {
        eprintln!("{}: warning: {w}", crate::cli::prog());
    }
    Ok(vocab)
}

/// Writes `bytes` readably: printable text as is, control characters and invalid bytes
/// escaped.
fn escape_piece(bytes: &[u8], out: &mut Vec<u8>) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                '\\' => out.extend_from_slice(b"\\\\"),
                c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                    out.extend_from_slice(format!("\\x{:02X}", c as u32).as_bytes())
                }
                c => {
                    let mut tmp = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
                }
            }
        }
        for b in chunk.invalid() {
            out.extend_from_slice(format!("\\x{b:02X}").as_bytes());
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to standard output"),
    }
}

/// Runs `modelc tokenize`.
pub fn run_tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let vocab = load_vocab(&args.model)?;
    // Bytes, not text: input that is not UTF-8 is tokenized as llama.cpp tokenizes it.
    let text: Vec<u8> = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => {
            std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read standard input")?;
            buf
        }
    };
    let ids = vocab.tokenize_bytes(&text, !args.no_bos, !args.no_parse_special);
    if !args.no_bos {
        for w in vocab.double_bos_eos(&ids) {
            eprintln!("{}: warning: {w}", crate::cli::prog());
        }
    }
    let mut out = Vec::with_capacity(ids.len() * 7);
    if args.pieces {
        for &id in &ids {
            out.extend_from_slice(format!("{id}\t").as_bytes());
            escape_piece(vocab.token_to_piece(id, true), &mut out);
            out.push(b'\n');
        }
    } else {
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(id.to_string().as_bytes());
        }
        out.push(b'\n');
    }
    write_stdout(&out)
}

/// Parses the id arguments of `detokenize` and checks them against the vocabulary.
pub fn parse_ids(args: &[String], vocab: &Vocab) -> anyhow::Result<Vec<TokenId>> {
    let mut ids = Vec::new();
    for arg in args {
        for part in arg
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|s| !s.is_empty())
        {
            let v: i64 = part
                .parse()
                .with_context(|| format!("'{part}' is not a token id"))?;
            ids.push(vocab.check_id(v)?);
        }
    }
    Ok(ids)
}

/// Runs `modelc detokenize`.
pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let vocab = load_vocab(&args.model)?;
    let ids = parse_ids(&args.ids, &vocab)?;
    write_stdout(&vocab.detokenize(&ids, !args.no_special))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_escaped_readably() {
        let mut out = Vec::new();
        escape_piece(b"a\n\t\\\x01\xf0\x9f", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\\n\\t\\\\\\x01\\xF0\\x9F"
        );
    }
}
