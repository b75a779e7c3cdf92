//! The `modelc` command: see `runtime::cli`.

fn main() -> std::process::ExitCode {
    runtime::cli::main()
}
