//! The `modelc` command line. Each subcommand lives in its own module with a clap `Args`
//! struct and a `run` function; this file only dispatches.
//!
//! Errors print as one line on stderr (`modelc: error: ...`) and exit with status 1.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod compile;
mod gen_args;
mod inspect;
mod run;
mod runner;
mod template;
mod tokenize;

/// modelc: an ahead-of-time compiler for GGUF language models.
#[derive(Parser, Debug)]
#[command(name = "modelc", version, about)]
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
    /// Perplexity of a text, as llama-perplexity computes it.
    Perplexity(run::PerplexityArgs),
    /// Print the lowered tensor graph, one line per node.
    Graph(run::GraphArgs),
    /// Render a conversation with the model's chat template and print the prompt exactly.
    Template(template::TemplateArgs),
    /// Print the token ids (or ids and pieces) the model's tokenizer gives a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Print the text of a sequence of token ids.
    Detokenize(tokenize::DetokenizeArgs),
}

/// llama.cpp's multi-letter short flags (`-ub`, `-ctk`, `-ctv`, `-ngl`) rewritten to their
/// long forms, which clap understands.
pub(crate) fn normalize_args(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    args.map(|a| {
        let long = match a.to_str() {
            Some("-ub") => "--ubatch-size",
            Some("-ctk") => "--cache-type-k",
            Some("-ctv") => "--cache-type-v",
            Some("-ngl") => "--n-gpu-layers",
            Some("-fa") => "--flash-attn",
            _ => return a,
        };
        long.into()
    })
    .collect()
}

/// Help and version go to stdout with status 0; a bad command line gives clap's first line
/// (what was wrong) on stderr and status 1, like every other error.
pub(crate) fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or("bad command line")
        .trim_start_matches("error: ");
    eprintln!("modelc: error: {first} (see --help)");
    ExitCode::from(1)
}

pub(crate) fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modelc: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Parses the command line, runs the subcommand, and maps errors to exit status 1. An
/// executable that carries a compiled artifact runs as that model's runner instead.
pub fn main() -> ExitCode {
    match std::env::current_exe().map(|exe| crate::artifact::read_embedded(&exe)) {
        Ok(Ok(Some(artifact))) => return runner::main(artifact),
        Ok(Err(e)) => return report(Err(e)),
        _ => {}
    }
    let cli = match Cli::try_parse_from(normalize_args(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Compile(args) => compile::run(args),
        Command::Run(args) => run::run(args),
        Command::Perplexity(args) => run::perplexity(args),
        Command::Graph(args) => run::graph(args),
        Command::Template(args) => template::run(args),
        Command::Tokenize(args) => tokenize::run_tokenize(args),
        Command::Detokenize(args) => tokenize::run_detokenize(args),
    };
    report(result)
}
