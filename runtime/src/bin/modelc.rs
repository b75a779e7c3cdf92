//! The `modelc` command: see `runtime::cli`.

/// An allocation that fails ends the process with one line and exit status 1
/// (`runtime::memory::ReportingAlloc`), in `modelc` and in every runner.
#[global_allocator]
static ALLOC: runtime::memory::ReportingAlloc = runtime::memory::ReportingAlloc;

fn main() -> std::process::ExitCode {
    runtime::memory::ReportingAlloc::prepare();
    quiet_output_errors();
    runtime::cli::main()
}

/// `print!` panics when stdout cannot be written; make that what a command-line tool does
/// instead of a backtrace: a closed pipe (`modelc inspect … | head`) ends the process quietly
/// with the status a SIGPIPE death gives (141), any other write error (a full disk) prints
/// one line (when stderr can take it) and exits 1. Every other panic keeps the default report.
fn quiet_output_errors() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(rest) = msg
            .strip_prefix("failed printing to stdout: ")
            .or_else(|| msg.strip_prefix("failed printing to stderr: "))
        {
            if rest.contains("Broken pipe") {
                std::process::exit(141);
            }
            // Not `eprintln!`: stderr itself may be what failed (a second panic would
            // abort).
            use std::io::Write;
            let name = runtime::cli::prog();
            let _ = writeln!(std::io::stderr(), "{name}: error: writing output: {rest}");
            std::process::exit(1);
        }
        default(info);
    }));
}
