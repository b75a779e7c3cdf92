//! The `modelc` command line. Each subcommand lives in its own module with a clap `Args`
//! struct and a `run` function; this file only dispatches.
//!
//! Errors print as one line on stderr (`modelc: error: ...`) and exit with status 1.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod gen_args;
mod inspect;
mod run;
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
    /// Generate text from a model (compiled in memory, or with the reference interpreter).
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

/// Parses the command line, runs the subcommand, and maps errors to exit status 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Run(args) => run::run(args),
        Command::Perplexity(args) => run::perplexity(args),
        Command::Graph(args) => run::graph(args),
        Command::Template(args) => template::run(args),
        Command::Tokenize(args) => tokenize::run_tokenize(args),
        Command::Detokenize(args) => tokenize::run_detokenize(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modelc: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
