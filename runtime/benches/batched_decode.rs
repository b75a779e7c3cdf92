//! Continuous batching, as llama.cpp's `llama-batched-bench` measures it:
//! `cargo bench -p runtime --bench batched_decode [-- MODEL.gguf [THREADS]]`.
//!
//! For 1, 2, 4 and 8 parallel sequences (server slots), each holding a 64-token prompt, it
//! times decode steps that give every sequence one token ([`Session::decode_batch`]: one
//! engine call for all of them), and prints the aggregate generated tokens/s and its
//! speed-up over one sequence. The sizes are measured in alternating rounds (one step of
//! each size per round, 40 rounds) and reported as medians, so a machine whose speed drifts
//! affects every size alike. Default model: the cached SmolLM2 Q4_1; 2 threads. With
//! `MODELC_BENCH_PROFILE=1` it then prints where the largest size's steps spend their time,
//! per fused kernel (`MODELC_BENCH_PROFILE=N`, N one of the sizes: that size's steps).

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::{BatchToken, Session};
use std::time::Instant;

const SIZES: [u32; 4] = [1, 2, 4, 8];
const ROUNDS: usize = 40;
const PROMPT: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let path = match args.next() {
        Some(p) => std::path::PathBuf::from(p),
        None => match modelc_tests::smollm2() {
            Some(p) => p,
            None => {
                println!("skipped: no SmolLM2 model (scripts/fetch-model)");
                return Ok(());
            }
        },
    };
    let threads: usize = args.next().map_or(Ok(2), |t| t.parse())?;
    // Read into memory (`--no-mmap`): step times that do not depend on how the page cache
    // holds the file (README, `--no-mmap`).
    let mut gguf = GgufFile::open(&path)?;
    gguf.read_into_memory()?;
    let model = compiler::load_model(&gguf)?;
    let plan = build_plan(
        &model,
        &[1, 2, 4, 8, 64],
        512,
        KvTypes::F16,
        LogitRows::Both,
    )?;
    let mut engine = CpuEngine::new(&gguf, plan, threads)?;
    let n_seq: u32 = SIZES.iter().sum();
    let mut s = Session::new(Box::new(&mut engine), n_seq as usize)?;
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| 1000 + 7 * i).collect();
    // Sequences `first[i]..first[i] + SIZES[i]` decode together.
    let first: Vec<u32> = SIZES
        .iter()
        .scan(0, |acc, &n| {
            let f = *acc;
            *acc += n;
            Some(f)
        })
        .collect();
    for seq in 0..n_seq {
        s.eval(seq, &prompt, false)?;
    }
    let mut times = vec![Vec::with_capacity(ROUNDS); SIZES.len()];
    // The rows of every step in one vector, as the server keeps them.
    let mut rows = Vec::new();
    for round in 0..ROUNDS as u32 {
        for (i, &n) in SIZES.iter().enumerate() {
            let batch: Vec<BatchToken> = (first[i]..first[i] + n)
                .map(|seq| BatchToken {
                    token: 2000 + round,
                    seq,
                    logits: true,
                })
                .collect();
            let t0 = Instant::now();
            s.decode_batch_into(&batch, &mut rows)?;
            times[i].push(t0.elapsed().as_secs_f64());
        }
    }
    drop(s);
    if let Some(v) = std::env::var_os("MODELC_BENCH_PROFILE") {
        let i = SIZES
            .iter()
            .position(|&n| v.to_str() == Some(&n.to_string()))
            .unwrap_or(SIZES.len() - 1);
        profile_size(&mut engine, &first, i, n_seq as usize)?;
    }
    println!(
        "{} ({threads} threads, {PROMPT}-token prompts, median of {ROUNDS} alternating rounds)",
        path.display()
    );
    println!();
    println!("| sequences | ms / step | aggregate t/s | speed-up |");
    println!("| --------: | --------: | ------------: | -------: |");
    let one = median(times[0].clone());
    for (i, &n) in SIZES.iter().enumerate() {
        let t = median(times[i].clone());
        println!(
            "| {n} | {:.2} | {:.1} | {:.2}× |",
            t * 1e3,
            n as f64 / t,
            n as f64 * one / t
        );
    }
    Ok(())
}

/// Times `ROUNDS` steps of `SIZES[i]` sequences again with the engine's per-kernel profiling
/// on and prints each kernel's time: the profile of the prompts and steps less that of the
/// prompts alone.
fn profile_size(
    engine: &mut CpuEngine,
    first: &[u32],
    i: usize,
    n_seq: usize,
) -> anyhow::Result<()> {
    let n = SIZES[i];
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| 1000 + 7 * i).collect();
    let mut run = |steps: u32| -> anyhow::Result<Vec<(String, f64, u64)>> {
        engine.compiled_mut().set_profiling(true);
        engine.compiled_mut().reset_profile();
        let mut s = Session::new(Box::new(&mut *engine), n_seq)?;
        for seq in first[i]..first[i] + n {
            s.eval(seq, &prompt, false)?;
        }
        for round in 0..steps {
            let batch: Vec<BatchToken> = (first[i]..first[i] + n)
                .map(|seq| BatchToken {
                    token: 3000 + round,
                    seq,
                    logits: true,
                })
                .collect();
            s.decode_batch(&batch)?;
        }
        drop(s);
        let p = engine.compiled().profile();
        Ok(p.into_iter()
            .map(|k| (k.kind.to_string(), k.seconds, k.calls))
            .collect())
    };
    let prompts = run(0)?;
    let all = run(ROUNDS as u32)?;
    println!();
    println!("per-kernel time of {ROUNDS} steps of {n} sequences:");
    let mut total = 0.0;
    for (kind, seconds, calls) in &all {
        let (s0, c0) = prompts
            .iter()
            .find(|p| &p.0 == kind)
            .map_or((0.0, 0), |p| (p.1, p.2));
        total += seconds - s0;
        println!(
            "  {:>8.3} ms  {:>6} calls  {kind}",
            (seconds - s0) * 1e3,
            calls - c0
        );
    }
    println!("  {:>8.3} ms in all", total * 1e3);
    Ok(())
}
