//! `bench`: llama-bench's table and the decode roofline, for a runner (`NAME bench`) and for
//! `modelc bench MODEL.gguf` (compiled in memory), with the same flags and output
//! ([`crate::bench`] measures and prints).

use super::compile::EngineArgs;
use super::gen_args::resolve_threads;
use crate::backend::cpu::Kernels;
use crate::backend::{cache_type_name, BackendArgs};
use crate::bench::{self, Report, Row, Test};
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use std::path::PathBuf;

/// The flags of `bench` (llama-bench's names), shared by the runner and `modelc bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchFlags {
    /// Prompt sizes to test (`ppN`), comma-separated.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    , value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (`tgN`), comma-separated.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    , value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_gen: Vec<usize>,
    /// Depths to test at (llama-bench's `-d/--n-depth`), comma-separated: tokens already in
    /// the KV cache when each test starts (evaluated once per depth, untimed); tests at a
    /// depth above 0 are named `pp512 @ d4096`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    , value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_depth: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub reps: usize,
    /// Thread counts to test, comma-separated (<= 0: the hardware's threads; more is capped
    /// there, with a warning).
    #[arg(
        short = 't',
        long = "threads",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub threads: Option<Vec<i64>>,
    /// Print the rows as JSON (llama-bench's `-o json` field names, plus the roofline's)
    /// instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Measure the machine's read bandwidth again (it is measured once and cached in
    /// ~/.cache/modelc/read-bandwidth.json; the cache keeps the highest figure).
    #[arg(long)]
    pub measure_bandwidth: bool,
    /// KV cache types, flash attention.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The backend's own flags.
    #[command(flatten)]
    pub backend: BackendArgs,
}

impl BenchFlags {
    /// Each thread count as -t reads it (<= 0: the hardware's, more capped there with a
    /// warning); counts that end up equal are measured once.
    ///
    /// # Errors
    /// `-r 0`.
    pub fn thread_counts(&self) -> anyhow::Result<Vec<usize>> {
        anyhow::ensure!(self.reps >= 1, "-r must be at least 1");
        let mut threads: Vec<usize> = Vec::new();
        for t in self.threads.clone().unwrap_or_else(|| vec![0]) {
            let t = resolve_threads(Some(t));
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
        Ok(threads)
    }

    /// The tests in order: every `ppN`, then every `tgN` (sizes of 0 are skipped).
    pub fn tests(&self) -> Vec<Test> {
        let mut tests: Vec<Test> = self
            .n_prompt
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| Test::Pp(n))
            .collect();
        tests.extend(self.n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::Tg(n)));
        tests
    }

    /// The depths in order, each once (`-d 0,0` measures depth 0 once).
    pub fn depths(&self) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for &d in &self.n_depth {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// The context the sessions need: the longest test after the deepest depth (llama-bench's
    /// `n_prompt + n_gen + n_depth`), at least `n_ctx_max` up to the next power of two, and
    /// at least the smallest context ([`super::run::MIN_CTX`]: bench has no `-c` to warn
    /// about).
    pub fn n_ctx(&self, n_ctx_max: usize) -> usize {
        let longest = self
            .n_prompt
            .iter()
            .chain(&self.n_gen)
            .copied()
            .max()
            .unwrap_or(1);
        let max = longest + self.n_depth.iter().copied().max().unwrap_or(0);
        max.max(n_ctx_max.min(max.next_power_of_two()))
            .max(super::run::MIN_CTX)
    }

    /// Prints the tables (or JSON) for `rows` measured on `gguf` with caches `kv` and
    /// compiled steps of at most `step_tokens` tokens.
    ///
    /// # Errors
    /// A metadata value of the wrong type.
    pub fn report(
        &self,
        gguf: &GgufFile,
        kv: KvTypes,
        step_tokens: usize,
        rows: &[Row],
    ) -> anyhow::Result<()> {
        let kv_names = (cache_type_name(kv.k), cache_type_name(kv.v));
        // llama-bench's extra columns for settings other than its defaults.
        let mut extra: Vec<(&str, String)> = Vec::new();
        if kv_names.0 != "f16" || kv_names.1 != "f16" {
            extra.push(("type_k", kv_names.0.clone()));
            extra.push(("type_v", kv_names.1.clone()));
        }
        if !self.engine.flash() {
            extra.push(("fa", "0".into()));
        }
        let ftype = gguf
            .metadata()
            .get_u32("general.file_type")?
            .map_or("?", super::inspect::file_type_name);
        let report = Report {
            model_desc: format!(
                "{} {} {}",
                gguf.architecture().unwrap_or("?"),
                gguf.metadata()
                    .get_str("general.size_label")?
                    .unwrap_or("?"),
                ftype
            ),
            size_bytes: gguf.tensor_data_bytes(),
            n_params: gguf.tensors().iter().map(|t| t.n_elements()).sum(),
            backend: match self.backend.cpu.kernels() {
                Kernels::Exact => "CPU",
                Kernels::Fast => "CPU (fast)",
            },
            weight_bytes: bench::decode_weight_bytes(gguf),
            remeasure: self.measure_bandwidth,
            step_tokens,
            extra,
        };
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&bench::to_json(&report, rows))?
            );
        } else {
            bench::print_table(&report, rows);
        }
        Ok(())
    }
}

/// Arguments of `modelc bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// Largest number of tokens evaluated at once (`-ub`); the CPU backend compiles the sizes
    /// 1 and this one.
    #[arg(long = "ubatch-size", default_value_t = 64, value_parser = super::gen_args::count, allow_negative_numbers = true)]
    pub n_ubatch: usize,
    /// The benchmark's flags.
    #[command(flatten)]
    pub flags: BenchFlags,
}

/// Runs `modelc bench`: compiles the model in memory for each thread count and measures it
/// as a runner's `bench` does.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let f = &args.flags;
    let threads = f.thread_counts()?;
    let (gguf, model, _vocab) = super::run::open_model(&args.model, &f.engine)?;
    let model_args = super::run::ModelArgs {
        model: args.model.clone(),
        backend: super::run::Backend::Cpu,
        n_ctx: f.n_ctx(model.hparams.n_ctx_train as usize),
        threads: None,
        n_ubatch: args.n_ubatch,
        no_rounding: false,
        engine: f.engine.clone(),
        backend_args: f.backend.clone(),
    };
    let kv = model_args.validate()?;
    let rows = bench::run(
        &mut |t| {
            let a = super::run::ModelArgs {
                threads: Some(t as i64),
                ..model_args.clone()
            };
            super::run::open_session(&a, &gguf, &model, false)
        },
        &threads,
        &f.depths(),
        &f.tests(),
        f.reps,
    )?;
    f.report(&gguf, kv, args.n_ubatch, &rows)
}
