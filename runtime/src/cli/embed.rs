//! `modelc embed MODEL.gguf -p TEXT`: embeddings printed as `llama-embedding` prints them.
//!
//! - The prompt is split at `--embd-separator` (a newline by default) into one sequence per
//!   part; each is tokenized with BOS/EOS as the model asks and special-token texts parsed,
//!   evaluated alone (the cache cleared before each), pooled ([`crate::embed::Pooling`],
//!   `--pooling`, default the model's, else `none`) and normalised (`--embd-normalize`,
//!   default 2: Euclidean), every token's row included with `none`, as llama-embedding does.
//! - Output on stdout (logs on stderr), by `--embd-output-format`:
//!   - empty (the default): a blank line, then `embedding N: ` and the values as `%9.6f `
//!     (`%6.0f ` with `--embd-normalize 0`): with `none`, each token's first three, ` ... `
//!     and last three; otherwise all of them for one prompt, the first 16 for several, then
//!     the cosine similarity matrix when there are several prompts;
//!   - `json` / `json+`: OpenAI's list object (`json+` adds `cosineSimilarity`), values `%1.7f`;
//!   - `array`: `[[...],[...]]`; `raw`: one embedding per line, values separated by spaces;
//!
//!   and a final blank line.
//!
//! llama-embedding evaluates all prompts in one batch; here each is its own ubatch, so with
//! several prompts a value may differ from llama.cpp's in its last bits (one prompt: the same
//! numbers where the hidden state is computed exactly).

use super::run::{open_model, open_session_rows, ModelArgs};
use crate::cpu_engine::LogitRows;
use crate::embed::{cosine, normalize, Embedder, Pooling};
use crate::tokenizer::TokenId;
use clap::Args;
use std::fmt::Write as _;
use std::io::Write as _;

/// Arguments of `modelc embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to embed; each part between separators is one sequence.
    #[arg(
        short = 'p',
        long = "prompt",
        conflicts_with = "file",
        allow_hyphen_values = true
    )]
    pub prompt: Option<String>,
    /// Read the text from this file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
    /// Pooling: none, mean, cls, last (rank needs a reranker) (default: the model's
    /// `{arch}.pooling_type`, else none).
    #[arg(long = "pooling", value_parser = Pooling::from_name)]
    pub pooling: Option<Pooling>,
    /// Normalisation: -1 none, 0 max absolute (int16 range), 1 taxicab, 2 Euclidean, >2
    /// p-norm.
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
    /// Output format: empty (llama-embedding's text), array, json, json+ or raw.
    #[arg(long = "embd-output-format", default_value = "")]
    pub embd_output_format: String,
    /// What separates the prompts in the text.
    #[arg(long = "embd-separator", default_value = "\n")]
    pub embd_separator: String,
    /// Print each prompt's tokens on stderr before embedding.
    #[arg(long = "verbose-prompt")]
    pub verbose_prompt: bool,
}

/// Runs `modelc embed`.
pub fn run(args: EmbedArgs) -> anyhow::Result<()> {
    args.model.validate()?;
    anyhow::ensure!(
        args.model.backend == super::run::Backend::Cpu,
        "--backend: embeddings run on the CPU backend only"
    );
    anyhow::ensure!(
        matches!(
            args.embd_output_format.as_str(),
            "" | "array" | "json" | "json+" | "raw"
        ),
        "--embd-output-format {}: expected array, json, json+ or raw",
        args.embd_output_format
    );
    anyhow::ensure!(
        !args.embd_separator.is_empty(),
        "--embd-separator: must not be empty"
    );
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
        }
        (None, None) => anyhow::bail!("no prompt: give -p TEXT or -f FILE"),
    };
    let (gguf, model, vocab) = open_model(&args.model.model, &args.model.engine)?;
    let pooling = Pooling::resolve(args.pooling, &gguf)?;
    let model = model.with_output(compiler::GraphOutput::Embeddings);
    let session = open_session_rows(&args.model, &gguf, &model, LogitRows::All, 1)?;
    let mut embedder = Embedder::open(session, pooling, &gguf)?;
    let prompts: Vec<&str> = text.split(args.embd_separator.as_str()).collect();
    let mut inputs: Vec<Vec<TokenId>> = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let toks = vocab.tokenize(p, true, true);
        anyhow::ensure!(
            toks.len() <= embedder.n_ctx(),
            "number of tokens in input line ({}) exceeds batch size ({}), increase batch size and re-run",
            toks.len(),
            embedder.n_ctx()
        );
        let last = toks.last().copied();
        if last.is_none() || (last != vocab.sep() && last != vocab.eos()) {
            eprintln!(
                "{}: warning: last token in the prompt is not SEP or EOS",
                super::prog()
            );
        }
        if args.verbose_prompt {
            eprintln!("prompt: '{p}'\nnumber of tokens in prompt = {}", toks.len());
            for &t in &toks {
                eprintln!("{t:6} -> '{}'", vocab.token_text(t).unwrap_or(""));
            }
        }
        inputs.push(toks);
    }
    let mut embs: Vec<Vec<f32>> = Vec::new();
    for toks in &inputs {
        for row in embedder.embed(toks)? {
            embs.push(normalize(&row, args.embd_normalize));
        }
    }
    let out = format_output(
        &embs,
        &prompts,
        pooling,
        args.embd_normalize,
        &args.embd_output_format,
    );
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

/// What `llama-embedding` prints on stdout for the normalised embeddings `embs` (a row per
/// token with [`Pooling::None`], else one per prompt) of `prompts` (module doc).
pub fn format_output(
    embs: &[Vec<f32>],
    prompts: &[&str],
    pooling: Pooling,
    embd_normalize: i32,
    format: &str,
) -> String {
    let mut s = String::new();
    let value = |s: &mut String, x: f32| {
        if embd_normalize == 0 {
            let _ = write!(s, "{x:6.0} ");
        } else {
            let _ = write!(s, "{x:9.6} ");
        }
    };
    let n_prompts = prompts.len();
    if format.is_empty() {
        s.push('\n');
        if pooling == Pooling::None {
            for (j, e) in embs.iter().enumerate() {
                let _ = write!(s, "embedding {j}: ");
                let n = e.len();
                for &x in &e[..n.min(3)] {
                    value(&mut s, x);
                }
                s.push_str(" ... ");
                for &x in &e[n.saturating_sub(3)..] {
                    value(&mut s, x);
                }
                s.push('\n');
            }
        } else {
            for (j, e) in embs.iter().enumerate() {
                let _ = write!(s, "embedding {j}: ");
                let n = if n_prompts > 1 {
                    e.len().min(16)
                } else {
                    e.len()
                };
                for &x in &e[..n] {
                    value(&mut s, x);
                }
                s.push('\n');
            }
            if n_prompts > 1 {
                s.push_str("\ncosine similarity matrix:\n\n");
                for p in prompts {
                    let _ = write!(s, "{:>6} ", c_prefix(p, 6));
                }
                s.push('\n');
                for (i, a) in embs.iter().enumerate() {
                    for b in embs {
                        let _ = write!(s, "{:6.2} ", cosine(a, b));
                    }
                    s.push_str(c_prefix(prompts[i], 10));
                    s.push('\n');
                }
            }
        }
    }
    let num = |x: f32| {
        if embd_normalize == 0 {
            format!("{x:.0}")
        } else {
            format!("{x:.7}")
        }
    };
    let row = |e: &[f32]| e.iter().map(|&x| num(x)).collect::<Vec<_>>().join(",");
    match format {
        "json" | "json+" => {
            s.push_str("{\n  \"object\": \"list\",\n  \"data\": [\n");
            let items: Vec<String> = embs
                .iter()
                .enumerate()
                .map(|(j, e)| {
                    format!(
                        "    {{\n      \"object\": \"embedding\",\n      \"index\": {j},\n      \"embedding\": [{}]\n    }}",
                        row(e)
                    )
                })
                .collect();
            s.push_str(&items.join(",\n"));
            s.push_str("\n  ]");
            if format == "json+" && n_prompts > 1 {
                s.push_str(",\n  \"cosineSimilarity\": [\n");
                let rows: Vec<String> = embs
                    .iter()
                    .map(|a| {
                        let cells: Vec<String> = embs
                            .iter()
                            .map(|b| format!("{:6.2}", cosine(a, b)))
                            .collect();
                        format!("    [{} ]", cells.join(", "))
                    })
                    .collect();
                s.push_str(&rows.join(",\n"));
                s.push_str("\n  ]");
            }
            s.push_str("\n}\n");
        }
        "array" => {
            let rows: Vec<String> = embs.iter().map(|e| format!("[{}]", row(e))).collect();
            let _ = writeln!(s, "[{}]", rows.join(","));
        }
        "raw" => {
            for e in embs {
                let vals: Vec<String> = e.iter().map(|&x| num(x)).collect();
                let _ = writeln!(s, "{}", vals.join(" "));
            }
        }
        _ => {}
    }
    s.push('\n');
    s
}

/// The first `n` bytes of `p` (C's `%.Ns`), cut back to a character boundary.
fn c_prefix(p: &str, n: usize) -> &str {
    let mut end = p.len().min(n);
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    &p[..end]
}
