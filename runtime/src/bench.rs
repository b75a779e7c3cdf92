//! Speed measurement in llama-bench's terms (`tools/llama-bench/llama-bench.cpp`): `ppN`
//! evaluates an N-token prompt from an empty KV cache in ubatch-sized decode calls; `tgN`
//! generates N tokens one decode call at a time from an empty cache. Each test runs once to
//! warm up, then `reps` times; t/s is reported as `mean ± stddev` of the per-run rates.
//! The table has llama-bench's markdown columns, so the two can be pasted side by side.

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

/// Measured rates of one (threads, test) pair.
#[derive(Clone, Debug)]
pub struct Row {
    /// Threads used.
    pub threads: usize,
    /// The test.
    pub test: Test,
    /// Tokens per second of each repetition.
    pub samples: Vec<f64>,
}

impl Row {
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

/// Runs `test` on `engine` once (seconds elapsed).
fn run_once(engine: &mut Session<'_>, test: Test, n_vocab: usize) -> anyhow::Result<f64> {
    engine.clear();
    // Deterministic pseudo-random ids, as llama-bench feeds random tokens.
    let mut x: u32 = 12345;
    let mut next = || {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (x >> 8) % n_vocab as u32
    };
    let t0 = Instant::now();
    match test {
        Test::Pp(n) => {
            let tokens: Vec<u32> = (0..n).map(|_| next()).collect();
            let ub = engine.max_ubatch();
            for (i, chunk) in tokens.chunks(ub).enumerate() {
                engine.decode(chunk, i * ub, false)?;
            }
        }
        Test::Tg(n) => {
            for pos in 0..n {
                let t = next();
                engine.decode(&[t], pos, false)?;
            }
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs every test for every thread count; `make_engine(threads)` builds a session.
pub fn run<'a>(
    make_engine: &mut dyn FnMut(usize) -> anyhow::Result<Session<'a>>,
    threads: &[usize],
    tests: &[Test],
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &t in threads {
        let mut engine = make_engine(t)?;
        let n_vocab = engine.n_vocab();
        for &test in tests {
            let n = match test {
                Test::Pp(n) | Test::Tg(n) => n,
            };
            anyhow::ensure!(
                n <= engine.n_ctx(),
                "{test} needs a context of {n} tokens; the engine has {}",
                engine.n_ctx()
            );
            run_once(&mut engine, test, n_vocab)?;
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps.max(1) {
                let secs = run_once(&mut engine, test, n_vocab)?;
                samples.push(n as f64 / secs);
            }
            rows.push(Row {
                threads: t,
                test,
                samples,
            });
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

/// Prints llama-bench's markdown table, with `extra` columns (name, value) before the test
/// column as llama-bench adds them for non-default settings (`type_k`, `type_v`, `fa`), then
/// a decode-roofline table: GB/s of weights read per generated token (`weight_bytes` each)
/// next to each `tg` rate.
pub fn print_table(
    model_desc: &str,
    size_bytes: u64,
    n_params: u64,
    backend: &str,
    weight_bytes: u64,
    extra: &[(&str, String)],
    rows: &[Row],
) {
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
            model_desc,
            human_bytes(size_bytes),
            format!("{:.2} M", n_params as f64 / 1e6),
            backend,
            r.threads,
            r.test.to_string(),
            format!("{m:.2} ± {sd:.2}"),
        );
    }
    let tg: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.test, Test::Tg(_)))
        .collect();
    if !tg.is_empty() {
        println!();
        println!("| threads | test | t/s | weight GB/s |");
        println!("| ------: | ---: | --: | ----------: |");
        for r in tg {
            let (m, _) = r.mean_sd();
            println!(
                "| {} | {} | {:.2} | {:.1} |",
                r.threads,
                r.test,
                m,
                m * weight_bytes as f64 / 1e9
            );
        }
    }
}
