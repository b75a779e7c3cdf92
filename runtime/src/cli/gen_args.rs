//! The generation flags shared by `modelc run` and the compiled runner, with llama.cpp's
//! names (`common/arg.cpp`), and the text front end they drive: prompt → (chat template) →
//! tokens → [`crate::generate::generate`] → plain text or llama-server's JSON.

use crate::chat::{template_for_model, ChatTemplate, RenderOptions};
use crate::generate::GenerateOptions;
use crate::sampler::SamplerParams;
use crate::session::Session;
use crate::tokenizer::{TokenId, Vocab};
use anyhow::Context;
use ir::gguf::GgufFile;
use std::io::Write;
use std::path::PathBuf;

/// Prompt, sampling and output flags.
#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// The prompt. Special-token texts in it (`<|im_start|>`) are parsed as special tokens.
    #[arg(short = 'p', long = "prompt", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from this file instead.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation; a full context stops it, or is
    /// shifted with --context-shift (a conversation shifts by default); -2: until the
    /// context is full).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Prompt tokens per decode call.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048, value_parser = count, allow_negative_numbers = true)]
    pub n_batch: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, visible_alias = "temperature", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k sampling (0 disables).
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Top-p sampling (1.0 disables).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p sampling (0.0 disables).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise repeated tokens (1.0 disables).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Last n tokens the penalties consider (0 disables; negative values are refused, as
    /// llama.cpp refuses them).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i32,
    /// Frequency penalty (0.0 disables).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Presence penalty (0.0 disables).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Random seed; -1 (llama.cpp's LLAMA_DEFAULT_SEED, also 4294967295) or none: a random
    /// one, reported in the JSON output's `generation_settings.seed`.
    #[arg(short = 's', long = "seed", allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Apply the model's chat template to the prompt, as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Use this Jinja chat template instead of the model's (with --chat or a conversation).
    #[arg(long = "chat-template-file", conflicts_with = "chat_template")]
    pub chat_template_file: Option<PathBuf>,
    /// Use this chat template instead of the model's: a built-in format's name (`chatml`,
    /// `gemma`, `llama3`, `command-r`) or a Jinja template's text, as llama.cpp takes it.
    #[arg(long = "chat-template", value_name = "NAME|JINJA")]
    pub chat_template: Option<String>,
    /// Stop when the text contains this (repeatable; llama-cli's `-r` / `--reverse-prompt`);
    /// the stop text is not printed.
    #[arg(
        long = "stop",
        visible_alias = "reverse-prompt",
        short = 'r',
        value_name = "TEXT"
    )]
    pub stop: Vec<String>,
    /// Chat with the model (`-cnv`; a runner starts in it on a terminal without -p or -f):
    /// `-p` is then the first message.
    #[arg(long = "conversation", overrides_with = "no_conversation")]
    pub conversation: bool,
    /// Never chat (`-no-cnv`): a runner on a terminal without -p or -f then generates from
    /// an empty prompt, as llama-completion.
    #[arg(long = "no-conversation", overrides_with = "conversation")]
    pub no_conversation: bool,
    /// The system prompt of a conversation (`-sys`).
    #[arg(long = "system-prompt", visible_alias = "system", value_name = "TEXT")]
    pub system: Option<String>,
    /// In a conversation: answer one message and exit (`-st`).
    #[arg(long = "single-turn")]
    pub single_turn: bool,
    /// When the context fills, drop the oldest half of it (after `--keep`) and go on, as
    /// llama.cpp's `--context-shift` (off by default in plain generation, as in
    /// llama-completion at 0c1e570; on in a conversation).
    #[arg(long = "context-shift", overrides_with = "no_context_shift")]
    pub context_shift: bool,
    /// Stop when the context fills instead of shifting it (a conversation shifts by default).
    #[arg(long = "no-context-shift", overrides_with = "context_shift")]
    pub no_context_shift: bool,
    /// Prompt tokens a context shift keeps (after BOS; -1: the whole prompt), as llama.cpp's
    /// `--keep`; a conversation also keeps its system prompt.
    #[arg(long = "keep", default_value_t = 0, allow_negative_numbers = true)]
    pub keep: i64,
    /// Print one JSON object with llama-server's fields instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Report the top N log-probabilities at each generated position (JSON `probs`).
    #[arg(long = "n-probs", default_value_t = 0, value_parser = count, allow_negative_numbers = true)]
    pub n_probs: usize,
    /// Emit these token ids (space- or comma-separated) instead of sampling; probabilities are
    /// still reported.
    #[arg(long = "forced-tokens")]
    pub forced_tokens: Option<String>,
    /// Constrain generation to this GBNF grammar (llama.cpp's `--grammar`).
    #[arg(long = "grammar", value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file"])]
    pub grammar: Option<String>,
    /// Read the GBNF grammar from this file (llama.cpp's `--grammar-file`).
    #[arg(long = "grammar-file", value_name = "FILE", conflicts_with_all = ["json_schema", "json_schema_file"])]
    pub grammar_file: Option<PathBuf>,
    /// Constrain generation to JSON that this JSON schema accepts (llama.cpp's
    /// `-j/--json-schema`; `{}` is any JSON object).
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        conflicts_with = "json_schema_file"
    )]
    pub json_schema: Option<String>,
    /// Read the JSON schema from this file (llama.cpp's `--json-schema-file`).
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<PathBuf>,
    /// Typical, top-n-σ, XTC, dynamic temperature, Mirostat, DRY, the chain's order.
    #[command(flatten)]
    pub sampling: super::sampler_args::SamplerArgs,
    /// Process escape sequences (`\n`, `\r`, `\t`, `\'`, `\"`, `\\`, `\xNN`) in the
    /// prompt, `--stop` texts and DRY sequence breakers (the default, as llama.cpp's `-e`).
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take the prompt, `--stop` texts and DRY breakers as they are (llama.cpp's
    /// `--no-escape`).
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
    /// Speculative decoding (llama.cpp's `--spec-type`, comma-separated): `none` (the
    /// default), `ngram-simple` (drafts looked up in the conversation's own tokens) or
    /// `draft-simple` (drafts from the -md model, which alone also turns it on), verified in
    /// one step; the output is the same as without.
    #[arg(long = "spec-type", value_name = "none|ngram-simple|draft-simple")]
    pub spec_type: Option<String>,
    /// Draft model for speculative decoding (`-md`; llama.cpp's `--spec-draft-model`): a
    /// smaller model with the same vocabulary proposes tokens the model verifies in one step.
    #[arg(
        long = "model-draft",
        visible_alias = "spec-draft-model",
        value_name = "FNAME"
    )]
    pub model_draft: Option<PathBuf>,
    /// Tokens the draft model proposes per step at most (0 to 64).
    #[arg(long = "spec-draft-n-max", value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub spec_draft_n_max: u16,
    /// Drafts shorter than this are not verified.
    #[arg(long = "spec-draft-n-min", value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub spec_draft_n_min: u16,
    /// Drafting stops at a token the draft model gives less than this probability (among
    /// its ten most likely; 0: never).
    #[arg(
        long = "spec-draft-p-min",
        visible_alias = "draft-p-min",
        value_name = "P",
        default_value_t = 0.0
    )]
    pub spec_draft_p_min: f32,
    /// ngram-simple: length of the n-gram looked up in the history (1 to 1024).
    #[arg(long = "spec-ngram-simple-size-n", value_name = "N", default_value_t = 12, value_parser = ngram_size)]
    pub spec_ngram_simple_size_n: usize,
    /// ngram-simple: most tokens drafted after a match (1 to 1024).
    #[arg(long = "spec-ngram-simple-size-m", value_name = "N", default_value_t = 48, value_parser = ngram_size)]
    pub spec_ngram_simple_size_m: usize,
    /// ngram-simple: minimum hits (at least 1; llama.cpp's ngram-simple does not use it).
    #[arg(long = "spec-ngram-simple-min-hits", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub spec_ngram_simple_min_hits: u16,
    /// llama.cpp's output flags (`--no-display-prompt`, `--color`, `--jinja`, ...): taken,
    /// noted where they ask for output modelc does not print.
    #[command(flatten)]
    pub compat: super::llama_flags::GenCompat,
}

/// llama.cpp's `string_process_escapes` (`common/common.cpp`), on bytes: `\n`, `\r`,
/// `\t`, `\'`, `\"`, `\\` and `\x` with two hex digits become what they name; any
/// other backslash pair, and a backslash at the end, stay as they are.
pub fn process_escapes(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] != b'\\' || i + 1 == input.len() {
            out.push(input[i]);
            i += 1;
            continue;
        }
        i += 1;
        let c = input[i];
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' if i + 2 < input.len()
                && input[i + 1].is_ascii_hexdigit()
                && input[i + 2].is_ascii_hexdigit() =>
            {
                let hex = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                out.push(hex(input[i + 1]) * 16 + hex(input[i + 2]));
                i += 2;
            }
            _ => {
                out.push(b'\\');
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// Parses an n-gram size as llama.cpp bounds it: 1 to 1024.
fn ngram_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(n @ 1..=1024) => Ok(n as usize),
        _ => Err("an n-gram size is a number from 1 to 1024".into()),
    }
}

/// llama.cpp's `LLAMA_DEFAULT_SEED` (`-s -1`): draw a random seed.
pub const SEED_RANDOM: u64 = 0xFFFF_FFFF;

/// Parses `-s`: -1 (llama.cpp's `LLAMA_DEFAULT_SEED` as `common/arg.cpp` reads it) means a
/// random seed ([`SEED_RANDOM`]); other numbers from 0 up are seeds.
fn parse_seed(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(SEED_RANDOM),
        Ok(n) if n < 0 => Err("a seed is -1 (random) or a number from 0 up".into()),
        _ => s
            .trim()
            .parse::<u64>()
            .map_err(|_| "a seed is -1 (random) or a number from 0 up".into()),
    }
}

/// Parses a count flag (`-c`, `-b`, `-ub`, `--n-probs`, bench's `-p` / `-n` / `-r`): a
/// whole number from 0 up. A negative number is refused as out of range, not as "invalid
/// digit" (clap's message for a `usize`).
pub fn count(s: &str) -> Result<usize, String> {
    let t = s.trim();
    match t.parse::<i128>() {
        Ok(n) if n < 0 => Err(format!("{n} is out of range: expected a number from 0 up")),
        Ok(n) => usize::try_from(n).map_err(|_| {
            format!(
                "{n} is out of range: expected a number from 0 to {}",
                usize::MAX
            )
        }),
        Err(_) => Err("expected a whole number from 0 up".into()),
    }
}

/// The number of threads `-t` asks for, as llama.cpp reads `n_threads`: none or `<= 0` means
/// the hardware's threads ([`std::thread::available_parallelism`]). More than that is capped
/// there with one warning line on stderr, because the CPU engine's workers spin-wait: an
/// oversubscribed pool loses most of its time to descheduled spinners.
pub fn resolve_threads(requested: Option<i64>) -> usize {
    let hw = std::thread::available_parallelism().map_or(1, |n| n.get());
    match requested {
        Some(t) if t > hw as i64 => {
            eprintln!(
                "{}: warning: -t {t} is more than the {hw} hardware threads; using {hw} (the thread pool spin-waits, so extra threads only slow it down)", crate::cli::prog()
            );
            hw
        }
        Some(t) if t > 0 => t as usize,
        _ => hw,
    }
}

/// Refuses a sampler value that is not a finite number (NaN or infinite), naming its flag.
///
/// # Errors
/// As said.
pub fn check_finite(flag: &str, v: f32) -> anyhow::Result<()> {
    anyhow::ensure!(v.is_finite(), "{flag} {v}: expected a finite number");
    Ok(())
}

/// The sampler flags llama.cpp's `common/arg.cpp` takes without a check, where modelc refuses
/// NaN and infinities; the penalties, which llama.cpp checks too.
const FINITE_STRICTER: [&str; 3] = ["--temp", "--top-p", "--min-p"];

/// Refuses a `-b` of 0, as one line.
pub fn check_n_batch(n_batch: usize) -> anyhow::Result<()> {
    anyhow::ensure!(n_batch >= 1, "-b must be at least 1");
    Ok(())
}

impl GenArgs {
    /// Refuses values that cannot work (`-b 0`, `-n` below -2, a sampler value that is not
    /// a finite number, a chat template flag that cannot be read or compiled) before the
    /// model is loaded.
    ///
    /// # Errors
    /// The first such value, in one line naming its flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        check_n_batch(self.n_batch)?;
        self.speculative()?;
        self.draft_model()?;
        self.user_template()?;
        self.compat.notes();
        self.sampling.validate()?;
        anyhow::ensure!(
            self.n_predict >= -2,
            "-n {}: a number of tokens, -1 (until end of generation) or -2 (until the context is full)",
            self.n_predict
        );
        for (flag, v) in [
            ("--temp", self.temp),
            ("--top-p", self.top_p),
            ("--min-p", self.min_p),
            ("--frequency-penalty", self.frequency_penalty),
            ("--presence-penalty", self.presence_penalty),
        ] {
            if FINITE_STRICTER.contains(&flag) {
                anyhow::ensure!(
                    v.is_finite(),
                    "{flag} {v}: expected a finite number (llama.cpp would take it; modelc is stricter)"
                );
            }
            check_finite(flag, v)?;
        }
        // llama.cpp 0c1e570 (`common/arg.cpp`): "repeat-penalty must be finite and greater
        // than 0", checked as x > 0 with x and 1/x finite.
        anyhow::ensure!(
            self.repeat_penalty.is_finite()
                && self.repeat_penalty > 0.0
                && (1.0 / self.repeat_penalty).is_finite(),
            "--repeat-penalty {}: must be finite and greater than 0 (1.0 disables)",
            self.repeat_penalty
        );
        anyhow::ensure!(
            self.repeat_last_n >= 0,
            "--repeat-last-n {}: must be 0 or more (0 disables), as llama.cpp requires",
            self.repeat_last_n
        );
        Ok(())
    }

    /// The speculation `--spec-type` asks for: `None` for none (the last type named wins
    /// where several are).
    ///
    /// # Errors
    /// A type modelc does not implement or know.
    pub fn speculative(&self) -> anyhow::Result<Option<crate::speculative::NgramParams>> {
        use crate::speculative::{NgramParams, SpecType};
        let Some(types) = &self.spec_type else {
            return Ok(None);
        };
        let mut on = false;
        for name in types.split(',') {
            match SpecType::from_name(name).map_err(anyhow::Error::msg)? {
                SpecType::NgramSimple => on = true,
                SpecType::None => on = false,
                SpecType::DraftSimple => anyhow::ensure!(
                    self.model_draft.is_some(),
                    "--spec-type draft-simple needs a draft model (-md FILE)"
                ),
            }
        }
        Ok(on.then_some(NgramParams {
            size_n: self.spec_ngram_simple_size_n,
            size_m: self.spec_ngram_simple_size_m,
        }))
    }

    /// The draft model `-md` names and its settings, or `None`.
    ///
    /// # Errors
    /// A `--spec-draft-p-min` that is not a number from 0 to 1.
    pub fn draft_model(
        &self,
    ) -> anyhow::Result<Option<(&std::path::Path, crate::speculative::draft::DraftParams)>> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.spec_draft_p_min),
            "--spec-draft-p-min must be a probability from 0 to 1, not {}",
            self.spec_draft_p_min
        );
        Ok(self.model_draft.as_deref().map(|path| {
            (
                path,
                crate::speculative::draft::DraftParams {
                    n_max: usize::from(self.spec_draft_n_max),
                    n_min: usize::from(self.spec_draft_n_min),
                    p_min: self.spec_draft_p_min,
                },
            )
        }))
    }

    /// Whether generation speculates (n-gram lookup or a draft model): the session then
    /// needs steps with a logit row per token.
    ///
    /// # Errors
    /// As [`GenArgs::speculative`].
    pub fn speculates(&self) -> anyhow::Result<bool> {
        Ok(self.speculative()?.is_some() || self.model_draft.is_some())
    }

    /// The sampler settings these flags give; a random seed (`-s -1` or none) is drawn here
    /// from the OS's entropy, below [`SEED_RANDOM`], so that passing it back with `-s`
    /// repeats the run.
    pub fn sampler(&self) -> SamplerParams {
        let mut p = SamplerParams {
            // llama.cpp's `--temp` takes a negative temperature as 0 (greedy).
            temp: self.temp.max(0.0),
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: match self.seed {
                Some(s) if s != SEED_RANDOM => s,
                _ => u64::from(rand::random_range(0..u32::MAX)),
            },
            ..SamplerParams::default()
        };
        self.sampling.apply(&mut p);
        p.dry_sequence_breakers = p
            .dry_sequence_breakers
            .iter()
            .map(|b| self.unescape(b))
            .collect();
        p
    }

    /// The prompt's bytes from `-p` or `-f`, escapes processed unless `--no-escape` (as
    /// llama.cpp processes them in both) (a file need not be UTF-8: it is tokenized byte
    /// for byte as llama.cpp does, [`Vocab::tokenize_bytes`]; one trailing newline of a file
    /// is dropped, as llama.cpp's `-f` drops it).
    pub fn prompt_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let b = self.raw_prompt_bytes()?;
        Ok(if self.no_escape {
            b
        } else {
            process_escapes(&b)
        })
    }

    /// The `--stop` texts, escapes processed unless `--no-escape` (llama.cpp's antiprompts).
    pub fn stops(&self) -> Vec<String> {
        self.stop.iter().map(|t| self.unescape(t)).collect()
    }

    /// `t` with its escapes processed unless `--no-escape`.
    fn unescape(&self, t: &str) -> String {
        if self.no_escape {
            return t.to_string();
        }
        String::from_utf8_lossy(&process_escapes(t.as_bytes())).into_owned()
    }

    /// The prompt's bytes as given (`-p` or the `-f` file), before escapes.
    fn raw_prompt_bytes(&self) -> anyhow::Result<Vec<u8>> {
        match (&self.prompt, &self.file) {
            (Some(p), _) => Ok(p.clone().into_bytes()),
            (None, Some(f)) => {
                let mut b = std::fs::read(f)
                    .with_context(|| format!("reading the prompt file {}", f.display()))?;
                // llama.cpp's `-f` drops one trailing newline (common/arg.cpp).
                if b.last() == Some(&b'\n') {
                    b.pop();
                }
                Ok(b)
            }
            (None, None) => anyhow::bail!("no prompt: give one with -p TEXT or -f FILE"),
        }
    }

    /// The prompt as text, for a chat template: [`GenArgs::prompt_bytes`] with bytes that are
    /// not UTF-8 as U+FFFD.
    pub fn prompt_text(&self) -> anyhow::Result<String> {
        Ok(String::from_utf8_lossy(&self.prompt_bytes()?).into_owned())
    }

    /// The chat template these flags choose: `--chat-template-file`, `--chat-template NAME`
    /// or the model's.
    ///
    /// # Errors
    /// A file that cannot be read, an unknown name, a template that does not compile.
    pub fn template(&self, file: &GgufFile) -> anyhow::Result<ChatTemplate> {
        let user = self.user_template()?;
        let (tmpl, _) = template_for_model(file, user.as_deref(), None)?;
        Ok(tmpl)
    }

    /// The template text `--chat-template-file` or `--chat-template` gives, or `None`: read
    /// and checked whenever the flag is given, with or without `--chat`, as llama.cpp reads
    /// its flags (`modelc template` reads them the same way: [`user_template_text`]).
    ///
    /// # Errors
    /// As [`user_template_text`].
    pub fn user_template(&self) -> anyhow::Result<Option<String>> {
        user_template_text(
            self.chat_template_file.as_deref(),
            self.chat_template.as_deref(),
        )
    }

    /// The positions a context shift of plain generation keeps for a prompt of `n_prompt`
    /// tokens that begins with BOS when `bos` (llama.cpp: `--keep` plus BOS; -1 or more
    /// than the prompt: all of it), or `None` without `--context-shift`.
    pub fn shift_keep(&self, n_prompt: usize, bos: bool) -> Option<usize> {
        if !self.context_shift {
            return None;
        }
        Some(match usize::try_from(self.keep) {
            Ok(k) if k <= n_prompt => (k + usize::from(bos)).min(n_prompt),
            _ => n_prompt,
        })
    }

    /// The generation options these flags give (sampler, `-n`, `-b`, stop strings, ...).
    ///
    /// # Errors
    /// Bad `--forced-tokens`.
    pub fn generate_options(&self, vocab: &Vocab) -> anyhow::Result<GenerateOptions> {
        let sampler = self.sampler();
        Ok(GenerateOptions {
            n_predict: self.n_predict,
            dry_breakers: sampler.dry_on().then(|| {
                std::sync::Arc::new(crate::sampler::dry::DryBreakers::new(
                    vocab,
                    &sampler.dry_sequence_breakers,
                ))
            }),
            sampler,
            n_probs: self.n_probs,
            forced: self.forced(vocab)?,
            ignore_eos: self.ignore_eos,
            n_batch: self.n_batch,
            stop: self.stops(),
            grammar: self.grammar_rules(vocab)?,
            speculative: self.speculative()?,
            ..GenerateOptions::default()
        })
    }

    /// The GBNF text of `--grammar`, `--grammar-file`, `--json-schema` or
    /// `--json-schema-file` (a schema converted as llama.cpp's `json_schema_to_grammar`),
    /// or `None`.
    ///
    /// # Errors
    /// A file that cannot be read, a schema that is not JSON or cannot be converted.
    pub fn grammar_text(&self) -> anyhow::Result<Option<String>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let schema = match (&self.json_schema, &self.json_schema_file) {
            (Some(s), _) => Some(("--json-schema", s.clone())),
            (None, Some(p)) => Some(("--json-schema-file", read(p)?)),
            (None, None) => None,
        };
        if let Some((flag, text)) = schema {
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{flag}: not JSON: {e}"))?;
            let gbnf = crate::grammar::json_schema::to_grammar(&v)
                .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
            return Ok(Some(gbnf));
        }
        match (&self.grammar, &self.grammar_file) {
            (Some(g), _) => Ok(Some(g.clone())),
            (None, Some(p)) => Ok(Some(read(p)?)),
            (None, None) => Ok(None),
        }
    }

    /// The grammar of [`GenArgs::grammar_text`], read against `vocab`.
    ///
    /// # Errors
    /// As [`GenArgs::grammar_text`], and a grammar that does not parse (its line and column).
    pub fn grammar_rules(
        &self,
        vocab: &Vocab,
    ) -> anyhow::Result<Option<std::sync::Arc<crate::grammar::Rules>>> {
        let Some(text) = self.grammar_text()?.filter(|g| !g.is_empty()) else {
            return Ok(None);
        };
        let table = crate::grammar::TokenTable::shared(vocab);
        crate::grammar::compile(&text, vocab, table)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    fn forced(&self, vocab: &Vocab) -> anyhow::Result<Option<Vec<TokenId>>> {
        let Some(s) = &self.forced_tokens else {
            return Ok(None);
        };
        let ids = s
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .map(|w| {
                let id: i64 = w
                    .parse()
                    .with_context(|| format!("--forced-tokens: '{w}' is not a token id"))?;
                vocab
                    .check_id(id)
                    .map_err(|e| anyhow::anyhow!("--forced-tokens: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some(ids))
    }
}

/// The template text of `--chat-template-file FILE` (read) or `--chat-template VALUE` (Jinja
/// text, or a built-in name: [`crate::chat::user_template`]), compiled once to check it, or
/// `None` when neither is given.
///
/// # Errors
/// A file that cannot be read, an unknown name, a template that does not compile; each in
/// one line naming the flag.
pub fn user_template_text(
    file: Option<&std::path::Path>,
    value: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let (flag, text) = match (file, value) {
        (Some(p), _) => (
            format!("--chat-template-file {}", p.display()),
            std::fs::read_to_string(p)
                .with_context(|| format!("--chat-template-file: reading {}", p.display()))?,
        ),
        (None, Some(v)) => (
            "--chat-template".to_string(),
            crate::chat::user_template(v)
                .map_err(anyhow::Error::msg)?
                .to_string(),
        ),
        (None, None) => return Ok(None),
    };
    ChatTemplate::new(&text, "", "").map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    Ok(Some(text))
}

/// Tokenizes the prompt (after the chat template when `--chat`) as llama-completion does:
/// BOS where the model asks for one, special-token texts parsed.
pub fn prompt_tokens(
    args: &GenArgs,
    file: &GgufFile,
    vocab: &Vocab,
) -> anyhow::Result<Vec<TokenId>> {
    let ids = if args.chat {
        let tmpl = args.template(file)?;
        let messages = [serde_json::json!({ "role": "user", "content": args.prompt_text()? })];
        let text = tmpl.render(&messages, &RenderOptions::for_prompt(vocab, true))?;
        vocab.tokenize(&text, true, true)
    } else {
        vocab.tokenize_bytes(&args.prompt_bytes()?, true, true)
    };
    for w in vocab.double_bos_eos(&ids) {
        eprintln!("{}: warning: {w}", crate::cli::prog());
    }
    Ok(ids)
}

/// Chats with the model on `session` ([`crate::repl`]): messages from the terminal (line
/// editing) or from stdin when it is piped; `-p`/`-f` is the first message.
///
/// # Errors
/// What the conversation loop reports; exits the process with 130 after a second Ctrl-C.
pub fn run_conversation(
    args: &GenArgs,
    file: &GgufFile,
    vocab: &Vocab,
    session: &mut Session<'_>,
    drafter: Option<&mut (dyn crate::speculative::Drafter + '_)>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    anyhow::ensure!(!args.json, "--json does not apply to a conversation");
    let first = match (&args.prompt, &args.file) {
        (None, None) => None,
        _ => Some(args.prompt_text()?),
    };
    let opts = crate::repl::ChatOptions {
        generate: args.generate_options(vocab)?,
        system: args.system.clone(),
        first,
        single_turn: args.single_turn,
        context_shift: !args.no_context_shift && args.n_predict != -2,
        keep: usize::try_from(args.keep).unwrap_or(0),
    };
    // The draft's own lifetime shortened to the conversation's.
    let drafter = drafter.map(|d| d as &mut dyn crate::speculative::Drafter);
    let mut chat =
        crate::repl::Chat::new(session, vocab, args.template(file)?, opts).with_drafter(drafter);
    let terminal = std::io::stdin().is_terminal();
    let mut lines: Box<dyn crate::repl::input::Lines> = if terminal {
        Box::new(crate::repl::input::Terminal::new()?)
    } else {
        Box::new(crate::repl::input::Piped::new(std::io::stdin().lock()))
    };
    let code = crate::repl::run(&mut chat, lines.as_mut(), terminal)?;
    if code != 0 {
        std::process::exit(i32::from(code));
    }
    Ok(())
}

/// Runs one generation with these flags on `session` and prints the result (streamed text,
/// or the JSON object at the end); `drafter` is the `-md` draft model, if any.
pub fn run_generation(
    args: &GenArgs,
    file: &GgufFile,
    vocab: &Vocab,
    session: &mut Session<'_>,
    drafter: Option<&mut (dyn crate::speculative::Drafter + '_)>,
) -> anyhow::Result<()> {
    args.validate()?;
    if args.conversation {
        return run_conversation(args, file, vocab, session, drafter);
    }
    let prompt = prompt_tokens(args, file, vocab)?;
    let mut opts = args.generate_options(vocab)?;
    // llama.cpp's -n -2: until the context is full (no shift).
    opts.context_shift = if args.n_predict == -2 {
        None
    } else {
        args.shift_keep(prompt.len(), vocab.add_bos())
    };
    let seed = opts.sampler.seed;
    let stdout = std::io::stdout();
    let stream = !args.json;
    // The first error writing the streamed text stops generation before the next token, as
    // llama-completion stops at a failed write (its reader gone: `| head -c 50`, whatever
    // `-n`); it is reported after: a closed pipe ends quietly as a SIGPIPE death would,
    // anything else is an error.
    let reader_gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    opts.cancel = Some(reader_gone.clone());
    let mut write_err: Option<std::io::Error> = None;
    let mut on_text = |s: &[u8]| {
        if stream && write_err.is_none() {
            let mut out = stdout.lock();
            if let Err(e) = out.write_all(s).and_then(|()| out.flush()) {
                write_err = Some(e);
                reader_gone.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    let completion = crate::generate::generate_with_drafter(
        session,
        vocab,
        &prompt,
        &opts,
        drafter,
        &mut on_text,
    )?;
    if let Some(e) = write_err {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        anyhow::bail!("writing output: {e}");
    }
    if args.json {
        // llama-server reports the seed it used in `generation_settings.seed`.
        let mut v = serde_json::to_value(&completion)?;
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "generation_settings".into(),
                serde_json::json!({ "seed": seed }),
            );
        }
        println!("{}", serde_json::to_string(&v)?);
    } else {
        stdout
            .lock()
            .flush()
            .map_err(|e| anyhow::anyhow!("writing output: {e}"))?;
        if let Some(line) = completion.timings.draft_line() {
            eprintln!("\n{}: {line}", crate::cli::prog());
        }
        if completion.stop_type == "context" {
            eprintln!(
                "\n{}: warning: the context ({} tokens) is full; generation stopped (use -c to enlarge it)",
                crate::cli::prog(),
                session.n_ctx()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod escape_tests {
    use super::process_escapes;

    /// llama.cpp's `string_process_escapes`: the six named escapes and `\xNN`; anything
    /// else, a bad `\x` and a final backslash kept as written.
    #[test]
    fn escapes_as_llama_cpp() {
        let cases: [(&[u8], &[u8]); 8] = [
            (br"a\nb\tc\rd", b"a\nb\tc\rd"),
            (br#"\'\"\\"#, br#"'"\"#),
            (br"\x41\x7a!", b"Az!"),
            (br"\xzz", br"\xzz"),
            (br"\x4", br"\x4"),
            (br"\q", br"\q"),
            (br"end\", br"end\"),
            (br"\\n", br"\n"),
        ];
        for (input, want) in cases {
            assert_eq!(
                process_escapes(input),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
