//! Speed measurement in llama-bench's terms (`tools/llama-bench/llama-bench.cpp`): `ppN`
//! evaluates an N-token prompt in ubatch-sized decode calls; `tgN` generates N tokens one
//! decode call at a time. Both start from a KV cache holding `d` tokens (`-d/--n-depth`,
//! default 0: an empty cache); those are evaluated once per thread count and depth, untimed,
//! and every run starts from them again (llama-bench restores a saved state; here the cache
//! is cut back to `d` positions). Each test runs once to warm up, then `reps` times; t/s is
//! reported as `mean ± stddev` of the per-run rates. The table has llama-bench's markdown
//! columns and test names (`pp512 @ d4096`), so the two can be pasted side by side.

use crate::session::Session;
use std::time::Instant;

/// One benchmark test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Prompt processing of this many tokens.
    Pp(usize),
    /// Generation of this many tokens.
    Tg(usize),
}

impl std::fmt::Display for Test {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Test::Pp(n) => write!(f, "pp{n}"),
            Test::Tg(n) => write!(f, "tg{n}"),
        }
    }
}

/// Measured rates of one (threads, depth, test) triple.
#[derive(Clone, Debug)]
pub struct Row {
    /// Threads used.
    pub threads: usize,
    /// The test.
    pub test: Test,
    /// Tokens in the KV cache before the test (llama-bench's `n_depth`).
    pub depth: usize,
    /// Tokens per second of each repetition.
    pub samples: Vec<f64>,
}

impl Row {
    /// llama-bench's test name: `pp512`, `tg64`, `pp512 @ d4096`.
    pub fn name(&self) -> String {
        if self.depth > 0 {
            format!("{} @ d{}", self.test, self.depth)
        } else {
            self.test.to_string()
        }
    }

    /// Mean and sample standard deviation of the rates.
    pub fn mean_sd(&self) -> (f64, f64) {
        let n = self.samples.len() as f64;
        let mean = self.samples.iter().sum::<f64>() / n.max(1.0);
        let var = if self.samples.len() > 1 {
            self.samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        (mean, var.sqrt())
    }
}

/// Deterministic pseudo-random token ids below `n_vocab`, as llama-bench feeds random
/// tokens.
struct Tokens {
    x: u32,
    n_vocab: u32,
}

impl Tokens {
    fn new(n_vocab: usize) -> Tokens {
        Tokens {
            x: 12345,
            n_vocab: n_vocab.max(1) as u32,
        }
    }

    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.x = self.x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (self.x >> 8) % self.n_vocab
            })
            .collect()
    }
}

/// Evaluates `tokens` at positions `pos0..` in ubatch-sized calls.
fn prompt(engine: &mut Session<'_>, tokens: &[u32], pos0: usize) -> anyhow::Result<()> {
    let ub = engine.max_ubatch().max(1);
    for (i, chunk) in tokens.chunks(ub).enumerate() {
        engine.decode(chunk, pos0 + i * ub, false)?;
    }
    Ok(())
}

/// Fills an empty cache with `depth` tokens (untimed: the state every run of a depth starts
/// from).
fn fill_depth(engine: &mut Session<'_>, depth: usize, n_vocab: usize) -> anyhow::Result<()> {
    engine.clear();
    // Other ids than the tests' own, as llama-bench's random stream moves on.
    let tokens = Tokens::new(n_vocab ^ 0x5bd1).take(depth);
    prompt(engine, &tokens, 0)
}

/// Runs `test` on `engine` once, after the `depth` positions [`fill_depth`] left (seconds
/// elapsed).
fn run_once(
    engine: &mut Session<'_>,
    test: Test,
    depth: usize,
    n_vocab: usize,
) -> anyhow::Result<f64> {
    if depth == 0 {
        engine.clear();
    } else {
        // Back to the depth's state: what the last run added is cut off, outside the timing.
        engine.truncate(0, depth);
        anyhow::ensure!(
            engine.n_past(0) == depth,
            "the KV cache holds {} positions, not the depth {depth}",
            engine.n_past(0)
        );
    }
    let mut ids = Tokens::new(n_vocab);
    let t0 = Instant::now();
    match test {
        Test::Pp(n) => prompt(engine, &ids.take(n), depth)?,
        Test::Tg(n) => {
            for (i, t) in ids.take(n).into_iter().enumerate() {
                engine.decode(&[t], depth + i, false)?;
            }
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs every test at every depth for every thread count, in llama-bench's order (threads,
/// then depth, then the tests); `make_engine(threads)` builds a session.
///
/// # Errors
/// A test and its depth that do not fit the session's context; an engine error.
pub fn run<'a>(
    make_engine: &mut dyn FnMut(usize) -> anyhow::Result<Session<'a>>,
    threads: &[usize],
    depths: &[usize],
    tests: &[Test],
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &t in threads {
        let mut engine = make_engine(t)?;
        let n_vocab = engine.n_vocab();
        for &depth in depths {
            let mut filled = depth == 0;
            for &test in tests {
                let n = match test {
                    Test::Pp(n) | Test::Tg(n) => n,
                };
                anyhow::ensure!(
                    n + depth <= engine.n_ctx(),
                    "{test} at depth {depth} needs a context of {} tokens; the engine has {}",
                    n + depth,
                    engine.n_ctx()
                );
                if !filled {
                    fill_depth(&mut engine, depth, n_vocab)?;
                    filled = true;
                }
                run_once(&mut engine, test, depth, n_vocab)?;
                let mut samples = Vec::with_capacity(reps);
                for _ in 0..reps.max(1) {
                    let secs = run_once(&mut engine, test, depth, n_vocab)?;
                    samples.push(n as f64 / secs);
                }
                rows.push(Row {
                    threads: t,
                    test,
                    depth,
                    samples,
                });
            }
        }
    }
    Ok(rows)
}

/// Sizes as llama-bench prints them (`93.81 MiB`, `134.52 M`).
pub fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// What a benchmark table describes besides its rows.
pub struct Report<'a> {
    /// llama-bench's model column (`llama 135M Q4_1`).
    pub model_desc: String,
    /// Bytes of the model's tensor data.
    pub size_bytes: u64,
    /// Parameters.
    pub n_params: u64,
    /// The backend column (`CPU`, `CPU (fast)`).
    pub backend: &'a str,
    /// Weight bytes one decode step reads ([`decode_weight_bytes`]).
    pub weight_bytes: u64,
    /// Measure the read bandwidth again ([`read_bandwidth`]).
    pub remeasure: bool,
    /// Tokens of the largest compiled step: a prompt reads the weights once per step.
    pub step_tokens: usize,
    /// llama-bench's extra columns (name, value) for settings other than its defaults
    /// (`type_k`, `type_v`, `fa`), printed before the test column.
    pub extra: Vec<(&'a str, String)>,
}

/// Weight bytes one decode step reads: every tensor's data except the token embeddings,
/// of which a step reads one row (the whole table when the output projection reuses it:
/// no `output.weight`).
pub fn decode_weight_bytes(gguf: &ir::gguf::GgufFile) -> u64 {
    let tied = gguf.tensor("output.weight").is_none();
    gguf.tensors()
        .iter()
        .filter(|t| tied || t.name != "token_embd.weight")
        .map(|t| t.n_bytes)
        .sum()
}

impl Row {
    /// Weight bytes read per token: a decode step's (`weight_bytes`) for `tg`; for `pp`, one
    /// step's shared by the `step_tokens` tokens of a compiled step.
    pub fn weight_bytes_per_token(&self, weight_bytes: u64, step_tokens: usize) -> f64 {
        match self.test {
            Test::Tg(_) => weight_bytes as f64,
            Test::Pp(n) => weight_bytes as f64 / step_tokens.min(n).max(1) as f64,
        }
    }
}

/// The machine's read bandwidth with `threads` threads, in GB/s: measured once per machine
/// ([`measure_read_bandwidth`]) and kept in `~/.cache/modelc/read-bandwidth.json`, keyed by
/// the CPU's model name and the thread count. With `remeasure` (`bench
/// --measure-bandwidth`: the first measurement ran on a busy machine) it is measured again
/// and the cache keeps the higher figure. A cache that cannot be read or written only costs
/// a new measurement.
pub fn read_bandwidth(threads: usize, remeasure: bool) -> f64 {
    let cpu = cpu_name();
    let path = std::env::var_os("HOME")
        .map(|h| std::path::PathBuf::from(h).join(".cache/modelc/read-bandwidth.json"));
    let mut cache: serde_json::Map<String, serde_json::Value> = path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let key = format!("{cpu} / {threads} threads / probe 3");
    let cached = cache
        .get(&key)
        .and_then(serde_json::Value::as_f64)
        .filter(|v| v.is_finite() && *v > 0.0);
    if let (Some(v), false) = (cached, remeasure) {
        return v;
    }
    let gbs = measure_read_bandwidth(threads).max(cached.unwrap_or(0.0));
    cache.insert(key, serde_json::json!(gbs));
    if let Some(p) = path {
        let _ = write_atomic(&p, &serde_json::to_vec_pretty(&cache).unwrap_or_default());
    }
    gbs
}

/// Writes `bytes` to `path` through a new file beside it, renamed over it.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let (mut f, tmp, dest) = ir::gguf::create_beside(path)?;
    let r = f
        .write_all(bytes)
        .and_then(|()| std::fs::rename(&tmp, &dest));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// The CPU's model name (`/proc/cpuinfo`'s `model name`), or `unknown CPU`.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Read bandwidth in GB/s: `threads` threads each summing their share of a buffer far
/// beyond the last-level cache ([`probe_bytes`]), in every form of the probe this host runs
/// ([`codegen_cpu::stream::stream_reads`]: each vector width, one to four streams), best of
/// three passes each after one that touches the pages: the best a streaming loop reaches.
pub fn measure_read_bandwidth(threads: usize) -> f64 {
    let words = vec![1u64; probe_bytes() / 8];
    let threads = threads.max(1);
    let chunk = words.len().div_ceil(threads);
    let pass = |how| {
        let t0 = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = words
                .chunks(chunk)
                .map(|part| s.spawn(move || codegen_cpu::stream::stream_sum(part, how)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        std::hint::black_box(total);
        t0.elapsed().as_secs_f64()
    };
    let forms = codegen_cpu::stream::stream_reads();
    pass(forms[0]);
    let best = forms
        .iter()
        .flat_map(|&how| (0..3).map(move |_| how))
        .map(pass)
        .fold(f64::INFINITY, f64::min);
    (words.len() * 8) as f64 / best / 1e9
}

/// The probe's buffer: four times the largest CPU cache Linux reports
/// (`/sys/devices/system/cpu/cpu0/cache/index*/size`; some machines report an L3 of
/// hundreds of MiB), at least 512 MiB, at most 4 GiB.
fn probe_bytes() -> usize {
    let largest = (0..8)
        .filter_map(|i| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size"))
                .ok()
        })
        .filter_map(|t| {
            let t = t.trim();
            let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
            let n: usize = num.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                _ => n,
            })
        })
        .max()
        .unwrap_or(0);
    largest.saturating_mul(4).clamp(512 << 20, 4 << 30)
}

/// Prints llama-bench's markdown table (the report's `extra` columns before the test
/// column, as llama-bench adds them), then the roofline table: for each row, the weight
/// bytes read per token ([`Row::weight_bytes_per_token`]), the GB/s they make at the
/// measured rate, and their share of the machine's read bandwidth at that thread count
/// ([`read_bandwidth`]).
pub fn print_table(report: &Report<'_>, rows: &[Row]) {
    let extra = &report.extra;
    let width = |name: &str, value: &str| name.len().max(value.len());
    let kv_head: String = extra
        .iter()
        .map(|(n, v)| format!(" {n:>w$} |", w = width(n, v)))
        .collect();
    let kv_rule: String = extra
        .iter()
        .map(|(n, v)| format!(" {}: |", "-".repeat(width(n, v) - 1)))
        .collect();
    println!("| model                          |       size |     params | backend    | threads |{kv_head}            test |                  t/s |");
    println!("| ------------------------------ | ---------: | ---------: | ---------- | ------: |{kv_rule} --------------: | -------------------: |");
    let kv_cells: String = extra
        .iter()
        .map(|(n, v)| format!(" {v:>w$} |", w = width(n, v)))
        .collect();
    for r in rows {
        let (m, sd) = r.mean_sd();
        println!(
            "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} |{kv_cells} {:>15} | {:>20} |",
            report.model_desc,
            human_bytes(report.size_bytes),
            format!("{:.2} M", report.n_params as f64 / 1e6),
            report.backend,
            r.threads,
            r.name(),
            format!("{m:.2} ± {sd:.2}"),
        );
    }
    if rows.is_empty() {
        return;
    }
    println!();
    println!("| threads | test | t/s | weight MiB/token | weight GB/s | read GB/s (machine) | share of read bandwidth | roof t/s |");
    println!("| ------: | ---: | --: | ---------------: | ----------: | ------------------: | ----------------------: | -------: |");
    let bw = bandwidths(report, rows);
    for r in rows {
        let x = roofline(report, r, &bw);
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.0}% | {:.1} |",
            r.threads,
            r.name(),
            x.ts,
            x.bytes_per_token / (1u64 << 20) as f64,
            x.gbs,
            x.machine_gbs,
            100.0 * x.share,
            x.roof_ts
        );
    }
    println!();
    println!("(roof t/s: the read bandwidth ÷ the weight bytes per token; a prompt is bound by arithmetic long before it)");
}

/// A row's place under the roof.
struct Roofline {
    ts: f64,
    bytes_per_token: f64,
    gbs: f64,
    machine_gbs: f64,
    share: f64,
    roof_ts: f64,
}

/// The read bandwidth at each thread count of `rows`, measured (or looked up) once each.
fn bandwidths(report: &Report<'_>, rows: &[Row]) -> Vec<(usize, f64)> {
    let mut out: Vec<(usize, f64)> = Vec::new();
    for r in rows {
        if !out.iter().any(|&(t, _)| t == r.threads) {
            out.push((r.threads, read_bandwidth(r.threads, report.remeasure)));
        }
    }
    out
}

fn roofline(report: &Report<'_>, r: &Row, bandwidths: &[(usize, f64)]) -> Roofline {
    let (ts, _) = r.mean_sd();
    let bytes_per_token = r.weight_bytes_per_token(report.weight_bytes, report.step_tokens);
    let gbs = ts * bytes_per_token / 1e9;
    let machine_gbs = bandwidths
        .iter()
        .find(|&&(t, _)| t == r.threads)
        .map_or(f64::NAN, |&(_, b)| b);
    Roofline {
        ts,
        bytes_per_token,
        gbs,
        machine_gbs,
        share: gbs / machine_gbs,
        roof_ts: machine_gbs * 1e9 / bytes_per_token,
    }
}

/// The rows as JSON, one object per row in llama-bench's `-o json` names where it has
/// them (`model_type`, `model_size`, `model_n_params`, `backends`, `n_threads`, `n_prompt`,
/// `n_gen`, `n_depth`, `avg_ts`, `stddev_ts`, `samples_ts`), `test` (the table's name,
/// `pp512 @ d4096`) and the roofline fields:
/// `weight_bytes_per_token`, `weight_gbs`, `read_bandwidth_gbs`, `roof_share` (0..1),
/// `roof_ts`.
pub fn to_json(report: &Report<'_>, rows: &[Row]) -> serde_json::Value {
    let bw = bandwidths(report, rows);
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (m, sd) = r.mean_sd();
            let x = roofline(report, r, &bw);
            let (n_prompt, n_gen) = match r.test {
                Test::Pp(n) => (n, 0),
                Test::Tg(n) => (0, n),
            };
            let mut o = serde_json::json!({
                "model_type": report.model_desc,
                "model_size": report.size_bytes,
                "model_n_params": report.n_params,
                "backends": report.backend,
                "n_threads": r.threads,
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "n_depth": r.depth,
                "n_ubatch": report.step_tokens,
                "test": r.name(),
                "avg_ts": m,
                "stddev_ts": sd,
                "samples_ts": r.samples,
                "weight_bytes_per_token": x.bytes_per_token,
                "weight_gbs": x.gbs,
                "read_bandwidth_gbs": x.machine_gbs,
                "roof_share": x.share,
                "roof_ts": x.roof_ts,
            });
            if let Some(obj) = o.as_object_mut() {
                for (k, v) in &report.extra {
                    obj.insert((*k).to_string(), serde_json::json!(v));
                }
            }
            o
        })
        .collect();
    serde_json::Value::Array(rows)
}
