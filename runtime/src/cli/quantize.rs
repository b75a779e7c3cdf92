//! `modelc quantize [FLAGS] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]`: llama-quantize's
//! command line (tools/quantize/quantize.cpp) over [`runtime::quantize`](crate::quantize).
//!
//! Without OUTPUT the file is `ggml-model-TYPE.gguf` next to the input, as llama-quantize
//! names it. A terminal gets a progress bar per tensor on stderr and a summary; a pipe gets
//! nothing but errors. Ctrl-C stops at the next chunk and leaves no partial file.

use crate::quantize::{self, FileType, Options, Plan};
use anyhow::{bail, Context};
use ir::ggml::GgmlType;
use ir::gguf::GgufFile;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Arguments of `modelc quantize`.
#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Convert tensors that are already quantized (quality is lower than quantizing from F16/F32).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Leave output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Give every quantized tensor the type asked for (no mix rules).
    #[arg(long)]
    pub pure: bool,
    /// The GGML type of output.weight (e.g. q8_0).
    #[arg(long, value_name = "GGML_TYPE", value_parser = parse_ggml_type)]
    pub output_tensor_type: Option<GgmlType>,
    /// The GGML type of token_embd.weight.
    #[arg(long, value_name = "GGML_TYPE", value_parser = parse_ggml_type)]
    pub token_embedding_type: Option<GgmlType>,
    /// Print the type and size of each tensor and the total, without writing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]: TYPE is a llama-quantize name (Q4_K_M, Q8_0,
    /// IQ4_XS, F16, ...) or number; NTHREADS defaults to the number of CPUs.
    #[arg(num_args = 0..=4, value_name = "ARGS", allow_negative_numbers = true)]
    pub args: Vec<String>,
}

/// A GGML type by name, case-insensitive (llama-quantize's `parse_ggml_type`).
fn parse_ggml_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| format!("unknown GGML type '{s}'"))
}

/// The positional arguments, read as llama-quantize reads them: `INPUT TYPE [N]` or
/// `INPUT OUTPUT TYPE [N]`.
struct Positional {
    input: PathBuf,
    output: Option<PathBuf>,
    ftype: FileType,
    threads: Option<usize>,
}

fn positional(args: &[String], dry_run: bool) -> anyhow::Result<Positional> {
    if args.len() < 2 {
        bail!("missing arguments: modelc quantize INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS] (see --help)")
    }
    let input = PathBuf::from(&args[0]);
    let (output, ftype, rest) = match FileType::parse(&args[1]) {
        Ok(f) if args.len() <= 3 => {
            let output = (!dry_run).then(|| {
                input
                    .parent()
                    .unwrap_or(Path::new(""))
                    .join(format!("ggml-model-{}.gguf", f.name))
            });
            (output, f, &args[2..])
        }
        _ => {
            let Some(t) = args.get(2) else {
                bail!("missing quantization type (INPUT.gguf OUTPUT.gguf TYPE [NTHREADS])")
            };
            (
                Some(PathBuf::from(&args[1])),
                FileType::parse(t)?,
                &args[3..],
            )
        }
    };
    let threads = match rest.first() {
        None => None,
        Some(n) => match n.parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            Ok(_) => None,
            Err(_) => bail!("invalid thread count '{n}'"),
        },
    };
    if rest.len() > 1 {
        bail!("unexpected argument '{}'", rest[1]);
    }
    Ok(Positional {
        input,
        output,
        ftype,
        threads,
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0 / 1024.0
}

/// The tensor shape as llama.cpp prints it (`4096, 32000`).
fn shape(ne: &[u64]) -> String {
    ne.iter()
        .map(|d| format!("{d:5}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--dry-run`: one line per tensor and the totals, as llama-quantize prints them.
fn print_plan(plan: &Plan) {
    let n = plan.tensors.len();
    let (mut org, mut new) = (0u64, 0u64);
    for (i, t) in plan.tensors.iter().enumerate() {
        let head = format!(
            "[{:4}/{:4}] {:<36} - [{}], type = {:>6}, ",
            i + 1,
            n,
            t.name,
            shape(&t.ne),
            t.from.name().to_lowercase()
        );
        if t.from != t.to {
            println!(
                "{head}size = {:8.2} MiB -> {:8.2} MiB ({})",
                mib(t.from_bytes),
                mib(t.to_bytes),
                t.to.name().to_lowercase()
            );
        } else {
            println!("{head}size = {:8.3} MiB", mib(t.from_bytes));
        }
        org += t.from_bytes;
        new += t.to_bytes;
    }
    print_totals(plan, org, new, |s| println!("{s}"));
}

fn print_totals(plan: &Plan, org: u64, new: u64, out: impl Fn(String)) {
    let bpw = |b: u64| b as f64 * 8.0 / plan.n_elements.max(1) as f64;
    out(format!(
        "model size  = {:8.2} MiB ({:.2} BPW)",
        mib(org),
        bpw(org)
    ));
    out(format!(
        "quant size  = {:8.2} MiB ({:.2} BPW)",
        mib(new),
        bpw(new)
    ));
    if plan.n_fallback > 0 {
        out(format!(
            "{} of {} tensor(s) required fallback quantization",
            plan.n_fallback,
            plan.tensors.len()
        ));
    }
}

/// A progress bar over the output bytes of `plan` on a terminal's stderr (hidden when
/// stderr is not a terminal), labelled `prefix`.
pub(crate) fn progress_bar(plan: &Plan, prefix: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let total: u64 = plan.tensors.iter().map(|t| t.to_bytes).sum();
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {binary_bytes}/{binary_total_bytes} {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    b.set_prefix(prefix.to_string());
    b
}

/// Advances `bar` past the tensor `p` reports.
pub(crate) fn show_progress(bar: &indicatif::ProgressBar, p: &quantize::Progress<'_>) {
    let t = p.tensor;
    bar.set_message(format!(
        "[{}/{}] {} {} -> {} ({:.2} -> {:.2} MiB)",
        p.i + 1,
        p.n,
        t.name,
        t.from,
        t.to,
        mib(t.from_bytes),
        mib(t.to_bytes)
    ));
    bar.inc(t.to_bytes);
}

/// Sets `cancel` on Ctrl-C (a second handler cannot be installed, never in one command;
/// the work still runs, only without the clean stop).
pub(crate) fn cancel_on_ctrl_c() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    let _ = ctrlc::set_handler(move || c.store(true, Ordering::SeqCst));
    cancel
}

/// Runs `modelc quantize`.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let pos = positional(&args.args, args.dry_run)?;
    let opts = Options {
        allow_requantize: args.allow_requantize,
        leave_output_tensor: args.leave_output_tensor,
        pure: args.pure,
        output_tensor_type: args.output_tensor_type,
        token_embedding_type: args.token_embedding_type,
    };
    if let Some(out) = &pos.output {
        if !args.dry_run && super::same_file(&pos.input, out) {
            bail!(
                "input and output files are the same: '{}'",
                pos.input.display()
            );
        }
    }
    let file = GgufFile::open(&pos.input)
        .with_context(|| format!("cannot read '{}'", pos.input.display()))?;
    let plan = quantize::plan(&file, pos.ftype, &opts)
        .with_context(|| format!("'{}'", pos.input.display()))?;
    if args.dry_run {
        print_plan(&plan);
        return Ok(());
    }
    let Some(out) = pos.output else {
        bail!("no output file")
    };
    let threads = pos.threads.unwrap_or_else(quantize::default_threads);

    let cancel = cancel_on_ctrl_c();

    let terminal = std::io::stderr().is_terminal();
    let bar = progress_bar(&plan, &format!("quantizing to {}", pos.ftype.name));
    let start = std::time::Instant::now();
    let result = quantize::write(&file, &plan, &out, threads, &cancel, |p| {
        show_progress(&bar, &p)
    });
    bar.finish_and_clear();
    if cancel.load(Ordering::SeqCst) {
        bail!("interrupted; no output written");
    }
    // The error names the file already.
    result.context("cannot write the quantized model")?;
    if terminal {
        let org: u64 = plan.tensors.iter().map(|t| t.from_bytes).sum();
        let new: u64 = plan.tensors.iter().map(|t| t.to_bytes).sum();
        eprintln!(
            "wrote '{}' ({}) in {:.2} s with {threads} threads",
            out.display(),
            pos.ftype.name,
            start.elapsed().as_secs_f64()
        );
        print_totals(&plan, org, new, |s| eprintln!("{s}"));
    }
    Ok(())
}
