//! The `modelc` command line. Each subcommand lives in its own module with a clap `Args`
//! struct and a `run` function; this file only dispatches.
//!
//! Errors print as one line on stderr (`modelc: error: ...`) and exit with status 1.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench;
mod compile;
mod embed;
mod gen_args;
mod inspect;
pub(crate) mod llama_flags;
mod quantize;
mod run;
mod runner;
mod sampler_args;
mod serve;
mod synth;
mod template;
mod tokenize;

/// modelc: an ahead-of-time compiler for GGUF language models.
#[derive(Parser, Debug)]
#[command(name = "modelc", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print what a GGUF file holds: architecture, hyperparameters, tokenizer, tensors.
    Inspect(inspect::InspectArgs),
    /// Compile a model into a standalone runner.
    Compile(compile::CompileArgs),
    /// Generate text from a model (compiled in memory, or with the reference interpreter).
    #[command(allow_negative_numbers = true)]
    Run(run::RunArgs),
    /// Chat with a model, compiled in memory (the runner's `-cnv` mode).
    #[command(allow_negative_numbers = true)]
    Repl(run::RunArgs),
    /// Perplexity of a text, as llama-perplexity computes it (and KL divergence from a
    /// base model's saved log-probabilities: --kl-divergence-base, --kl-divergence).
    #[command(
        allow_negative_numbers = true,
        mut_arg("n_ctx", |a| a
            .default_value("512")
            .help("Context size in tokens, the chunk size (0: the model's training context)"))
    )]
    Perplexity(run::PerplexityArgs),
    /// Measure speed (compiled in memory): llama-bench's table, the weight bytes per token
    /// and the share of the machine's read bandwidth.
    #[command(allow_negative_numbers = true)]
    Bench(bench::BenchArgs),
    /// Quantize a model as llama-quantize does, byte for byte (INPUT OUTPUT TYPE [NTHREADS]).
    #[command(
        override_usage = "modelc quantize [OPTIONS] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]"
    )]
    Quantize(quantize::QuantizeArgs),
    /// Write a random-weight llama GGUF of a given shape (default 1B) with SmolLM2's
    /// tokenizer, quantized as `modelc quantize` does: a model to measure speed on.
    Synth(synth::SynthArgs),
    /// Serve the model over HTTP with llama-server's API (OpenAI-compatible), `-np` slots.
    #[command(allow_negative_numbers = true)]
    Serve(Box<serve::ServeArgs>),
    /// Embeddings of a text, printed as llama-embedding prints them (`--pooling`,
    /// `--embd-normalize`, `--embd-output-format`).
    #[command(allow_negative_numbers = true)]
    Embed(embed::EmbedArgs),
    /// Print the lowered tensor graph, one line per tensor (a text form that parses back).
    Graph(run::GraphArgs),
    /// Render a conversation with the model's chat template and print the prompt exactly.
    Template(template::TemplateArgs),
    /// Print the token ids (or ids and pieces) the model's tokenizer gives a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Print the text of a sequence of token ids.
    Detokenize(tokenize::DetokenizeArgs),
}

/// llama.cpp's multi-letter short flags and the long forms they are rewritten to
/// ([`normalize_args`]).
const MULTI_LETTER_FLAGS: [(&str, &str); 14] = [
    ("--usage", "--help"),
    ("-np", "--parallel"),
    ("-lm", "--load-mode"),
    ("-kvu", "--kv-unified"),
    ("-no-kvu", "--no-kv-unified"),
    ("-ub", "--ubatch-size"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ngl", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-sys", "--system-prompt"),
    ("-st", "--single-turn"),
];

/// [`MULTI_LETTER_FLAGS`] and the short forms of llama.cpp's common flags
/// ([`llama_flags::SHORT_FORMS`]).
fn all_short_forms() -> impl Iterator<Item = (&'static str, &'static str)> {
    MULTI_LETTER_FLAGS
        .into_iter()
        .chain(llama_flags::SHORT_FORMS)
}

/// llama.cpp's multi-letter short flags (`-ub`, `-ctk`, `-ctv`, `-ngl`, `-fa`) rewritten to
/// their long forms, which clap understands (also `-ctk=q8_0`, which clap would read as
/// `-c tk=q8_0`).
pub(crate) fn normalize_args(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    args.map(|a| {
        let Some(s) = a.to_str() else { return a };
        for (short, long) in all_short_forms() {
            if s == short {
                return long.into();
            }
            if let Some(value) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={value}").into();
            }
        }
        a
    })
    .collect()
}

/// The subcommands whose first positional argument is the GGUF model: there llama.cpp's
/// `-m MODEL` / `--model MODEL` is taken as that argument ([`model_flag_to_positional`]).
const MODEL_FIRST: [&str; 12] = [
    "run",
    "embed",
    "repl",
    "perplexity",
    "bench",
    "serve",
    "compile",
    "inspect",
    "graph",
    "template",
    "tokenize",
    "detokenize",
];

/// llama.cpp's `-m MODEL` (also `--model MODEL`, `-m=MODEL`, `--model=MODEL`) in a
/// [`MODEL_FIRST`] subcommand moved to just after the subcommand's name, where its
/// positional model goes: `modelc run -m M.gguf -p hi` is `modelc run M.gguf -p hi`. Other
/// command lines are returned as they are.
pub(crate) fn model_flag_to_positional(
    mut args: Vec<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let Some(sub) = args.get(1).and_then(|a| a.to_str()) else {
        return args;
    };
    if !MODEL_FIRST.contains(&sub) {
        return args;
    }
    let mut i = 2;
    while i < args.len() {
        let Some(a) = args[i].to_str() else {
            i += 1;
            continue;
        };
        if a == "--" {
            break;
        }
        let joined = ["-m=", "--model="]
            .iter()
            .find_map(|p| a.strip_prefix(p))
            .map(std::ffi::OsString::from);
        let (model, taken) = match (a, joined) {
            (_, Some(m)) => (Some(m), 1),
            ("-m" | "--model", None) if i + 1 < args.len() => (Some(args[i + 1].clone()), 2),
            _ => (None, 0),
        };
        if let Some(m) = model {
            args.drain(i..i + taken);
            args.insert(2, m);
        }
        i += 1;
    }
    args
}

/// `message` (clap's error line) with the long flags [`normalize_args`] wrote put back as
/// the short ones the user typed (`'--n-gpu-layers'` → `'-ngl'`), where the user typed only
/// the short one.
fn restore_typed_flags(message: &str, typed: &[std::ffi::OsString]) -> String {
    let mut m = message.to_string();
    for (short, long) in all_short_forms() {
        let has = |f: &str| typed.iter().any(|a| a.to_str() == Some(f));
        if has(short) && !has(long) {
            // clap quotes a flag as '--long' or '--long <VALUE>'.
            m = m
                .replace(&format!("'{long}'"), &format!("'{short}'"))
                .replace(&format!("'{long} "), &format!("'{short} "));
        }
    }
    m
}

/// Help and version go to stdout with status 0; help shown because no subcommand was given
/// (`modelc` alone) goes to stderr with status 2, as clap has it; a bad command line gives
/// clap's first line (what was wrong, naming the flags as `typed`, the arguments before
/// [`normalize_args`]) on stderr and status 1, like every other error, or a reason where it
/// names a llama.cpp flag for a feature modelc lacks ([`llama_flags::refusal`]).
pub(crate) fn usage_error(e: clap::Error, typed: &[std::ffi::OsString]) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // clap prints this help on stderr; its own exit status is 2.
            let _ = e.print();
            return ExitCode::from(2);
        }
        ErrorKind::UnknownArgument => {
            if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
                let flag = arg.split(['=', ' ']).next().unwrap_or(arg);
                if let Some(why) = llama_flags::refusal(flag) {
                    let flag = restore_typed_flags(&format!("'{flag}'"), typed);
                    eprintln!(
                        "{}: error: {}: {why}",
                        crate::cli::prog(),
                        flag.trim_matches('\'')
                    );
                    return ExitCode::from(1);
                }
            }
        }
        _ => {}
    }
    let text = e.to_string();
    let mut first = text
        .lines()
        .next()
        .unwrap_or("bad command line")
        .trim_start_matches("error: ")
        .to_string();
    // clap lists missing arguments on the lines after the first: name them on it.
    if e.kind() == ErrorKind::MissingRequiredArgument {
        use clap::error::{ContextKind, ContextValue};
        if let Some(ContextValue::Strings(missing)) = e.get(ContextKind::InvalidArg) {
            first = format!("{} {}", first.trim_end_matches(':'), missing.join(", "));
        }
    }
    let first = restore_typed_flags(&first, typed);
    eprintln!("{}: error: {first} (see --help)", crate::cli::prog());
    ExitCode::from(1)
}

/// Whether `a` and `b` name the same existing file, also through links
/// (`std::filesystem::equivalent`: same device and inode on Unix).
pub(crate) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return a.dev() == b.dev() && a.ino() == b.ino();
        }
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The name messages start with: the program's file name as it was run (`modelc`, or a
/// compiled runner's name: `smol`), as C tools print `argv[0]`; "modelc" when there is
/// none.
pub fn prog() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::env::args_os()
            .next()
            .and_then(|a| {
                std::path::Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "modelc".into())
    })
}

/// Exit status 1 after one line on stderr; an error from a closed stdout (the reader of a
/// pipe went away) ends quietly with the status a SIGPIPE death gives (141), as the
/// commands that print with `print!` do.
pub(crate) fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let broken_pipe = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::from(141);
            }
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{}: error: {e:#}", prog());
            ExitCode::from(1)
        }
    }
}

/// Parses `args` as `P` with llama.cpp's rule for a flag given twice: the last value wins
/// (clap refuses a repeat by default; flags that collect values, such as `--stop`, still
/// collect them).
///
/// # Errors
/// What clap reports (usage errors, `--help`, `--version`).
pub(crate) fn parse_last_wins<P: clap::Parser>(
    args: Vec<std::ffi::OsString>,
) -> Result<P, clap::Error> {
    fn last_wins(c: clap::Command) -> clap::Command {
        c.args_override_self(true).mut_subcommands(last_wins)
    }
    let mut args = args;
    // llama.cpp reads `_` as `-` in long flags (`--backend_sampling`): an unknown flag
    // with `_` is tried again with dashes, once per argument at most.
    for _ in 0..=args.len() {
        let e = match last_wins(P::command()).try_get_matches_from(args.clone()) {
            Ok(matches) => return P::from_arg_matches(&matches),
            Err(e) => e,
        };
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        let unknown = match (e.kind(), e.get(ContextKind::InvalidArg)) {
            (ErrorKind::UnknownArgument, Some(ContextValue::String(a))) => a.clone(),
            _ => return Err(e),
        };
        let name = unknown
            .split(['=', ' '])
            .next()
            .unwrap_or(&unknown)
            .to_string();
        if !name.starts_with("--") || !name.contains('_') {
            return Err(e);
        }
        let Some(i) = args.iter().position(|a| {
            a.to_str()
                .is_some_and(|a| a == name || a.starts_with(&format!("{name}=")))
        }) else {
            return Err(e);
        };
        let fixed = args[i]
            .to_str()
            .map(|a| match a.split_once('=') {
                Some((f, v)) => format!("{}={v}", f.replace('_', "-")),
                None => a.replace('_', "-"),
            })
            .unwrap_or_default();
        args[i] = fixed.into();
    }
    Err(clap::Error::new(clap::error::ErrorKind::UnknownArgument))
}

/// Parses the command line, runs the subcommand, and maps errors to exit status 1. An
/// executable that carries a compiled artifact runs as that model's runner instead.
pub fn main() -> ExitCode {
    match std::env::current_exe().map(|exe| crate::artifact::read_embedded(&exe)) {
        Ok(Ok(Some(artifact))) => return runner::main(artifact),
        Ok(Err(e)) => return report(Err(e)),
        _ => {}
    }
    let typed: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = model_flag_to_positional(normalize_args(typed.iter().cloned()));
    let cli = match parse_last_wins::<Cli>(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &typed),
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Compile(args) => compile::run(args),
        Command::Run(args) => run::run(args),
        Command::Repl(mut args) => {
            args.gen.conversation = true;
            run::run(args)
        }
        Command::Perplexity(args) => run::perplexity(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Graph(args) => run::graph(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Template(args) => template::run(args),
        Command::Tokenize(args) => tokenize::run_tokenize(args),
        Command::Embed(args) => embed::run(args),
        Command::Detokenize(args) => tokenize::run_detokenize(args),
    };
    report(result)
}

#[cfg(test)]
mod tests {
    /// `modelc`'s command line and every subcommand's are well formed (clap's checks: no
    /// flag defined twice, as a flattened struct can bring).
    #[test]
    fn command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// Every flag llama-server takes (`tests/data/llama-server-flags.txt`: the names of
    /// each option of `LLAMA_EXAMPLE_SERVER` and the common ones in llama.cpp's
    /// `common/arg.cpp`, one option a line) is either taken by `modelc serve` (after the
    /// short forms are rewritten) or refused with a reason, never "unexpected argument".
    #[test]
    fn every_llama_server_flag_is_taken_or_refused() {
        use clap::CommandFactory;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/llama-server-flags.txt"
        );
        let text = std::fs::read_to_string(path).expect("the flag list");
        let cli = super::Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve").clone();
        let taken = |flag: &str| {
            if let Some(long) = flag.strip_prefix("--") {
                serve.get_arguments().any(|a| {
                    a.get_long() == Some(long)
                        || a.get_all_aliases().is_some_and(|v| v.contains(&long))
                })
            } else {
                let mut c = flag.chars().skip(1);
                match (c.next(), c.next()) {
                    (Some(ch), None) => serve.get_arguments().any(|a| a.get_short() == Some(ch)),
                    _ => false,
                }
            }
        };
        let mut bad = Vec::new();
        let mut n = 0;
        for flag in text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
        {
            n += 1;
            // Help, version and the model are clap's and `model_flag_to_positional`'s.
            if ["-h", "--help", "--usage", "--version", "-m", "--model"].contains(&flag) {
                continue;
            }
            let long = super::all_short_forms()
                .find(|(s, _)| *s == flag)
                .map_or(flag, |(_, l)| l);
            if !taken(long) && super::llama_flags::refusal(long).is_none() {
                bad.push(flag.to_string());
            }
        }
        assert!(n > 300, "{n} flags read");
        assert!(
            bad.is_empty(),
            "neither taken nor refused: {}",
            bad.join(" ")
        );
    }

    /// llama.cpp's spellings parse: `--usage` is help, `_` in a long flag is `-`, and a
    /// llama-server command line as its test suite writes it starts `modelc serve`.
    #[test]
    fn llama_server_command_lines_parse() {
        let parse = |line: &str| {
            let args = line.split_whitespace().map(std::ffi::OsString::from);
            super::parse_last_wins::<super::Cli>(super::model_flag_to_positional(
                super::normalize_args(args),
            ))
        };
        let e = parse("modelc serve --usage").expect_err("help");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let line = "modelc serve --port 8080 --temp 0.8 --seed 42 --host 127.0.0.1 --offline \
            -m m.gguf --batch-size 32 --threads 2 --n-gpu-layers 99 --cont-batching --metrics \
            --kv-unified --slots --alias a --ctx-size 512 --parallel 2 -ctk q8_0 -fa on \
            --n-predict 64 --verbose --context-shift --api-key k --no-ui --no-jinja \
            --reasoning off --no-mmproj --no-cache-idle-slots --backend_sampling -to 30 \
            --cors-origins localhost --no-models-autoload --swa-full --sleep-idle-seconds 5 \
            --cache-ram 0 --chat-template-kwargs {} --no-cache-prompt -rea on";
        let cli = parse(line).unwrap_or_else(|e| panic!("{e}"));
        let super::Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(a.server.timeout, 30);
        assert!(a.server.compat.backend_sampling && a.server.compat.offline);
        assert_eq!(a.server.compat.reasoning.as_deref(), Some("on"));
        assert!(!a.server.compat.cache_prompt());
        assert_eq!(
            a.server.compat.template_kwargs().expect("kwargs")["enable_thinking"],
            serde_json::json!(true)
        );
        // Refused, with a reason.
        for flag in ["--lora x", "-ctkd q8_0", "-td 2", "--tools all"] {
            let e = parse(&format!("modelc serve m.gguf {flag}")).expect_err(flag);
            assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{flag}");
            let first = flag.split(' ').next().unwrap_or(flag);
            let long = super::all_short_forms()
                .find(|(s, _)| *s == first)
                .map_or(first, |(_, l)| l);
            assert!(super::llama_flags::refusal(long).is_some(), "{flag}");
        }
    }
}
