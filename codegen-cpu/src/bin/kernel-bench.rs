//! Benchmark of the generated matmul kernels on SmolLM2-135M's shapes (Q4_1 layers, Q8_0
//! output), random weights.
//!
//! ```text
//! cargo run --release -p codegen-cpu --bin kernel-bench -- [--threads 1,2] [--reps N]
//!     [--only bandwidth|shapes|decode|pp|rows] [--tiling TOKENS,UNROLL[,GROUPS]] [--order ggml|block] [--types Q4_1,Q8_0,...]
//!     [--rows-shape K,M] [--rows-tokens N] [--rows-copies N] [--rows-decode-copies N] [--rows-batched]
//! ```
//!
//! Prints one table row per kernel, shape and thread count: µs per call (median of batches),
//! GB/s of repacked weight bytes read, and GMAC/s; then a "decode token" sweep (30 layers ×
//! {q,k,v,o,gate,up,down} + output, distinct weights so they come from DRAM as in a real
//! step) and a prompt sweep (ubatch 64, output for the last token only, as llama-bench's pp).
//! `rows`: the row-dot kernels ([`codegen_cpu::rows`]) of every other block type at decode
//! shapes (one token), GB/s of weight bytes streamed (weights larger than the caches, so
//! they come from DRAM as in a real step); `--rows-shape K,M` sets the weight shape (default
//! SmolLM2's FFN down, {1536, 576}: its 64 copies still fit a large L3; a 1B model's
//! {2048, 5632} shows what DRAM gives). Their prompt table takes `--rows-tokens` tokens
//! (default 64; 8 is an 8-slot server's decode step, whose columns take the same kernels
//! where the type's order does not depend on llama.cpp's column count) over
//! `--rows-copies` copies of the weight cycled (default 1: hot in the caches); with
//! `--rows-batched` each token is its own one-column product (a batched decode step of
//! that many sequences: llama.cpp's one-column kernel, whatever the type); with
//! `--order block`, the block-order tiles of `--kernels fast` (the types that have them).
//! `--rows-decode-copies N` sets the decode table's copies (default 64; 1 keeps a small
//! weight in the caches: the kernel's arithmetic alone).

use std::time::Instant;

use codegen_cpu::{
    compile_matmul_with, repack, MatmulKernel, MatmulSpec, RepackedWeight, SumOrder, ThreadPool,
    Tiling,
};
use ir::ggml::GgmlType;

const N_LAYER: usize = 30;
const N_EMBD: usize = 576;
const N_KV: usize = 192;
const N_FF: usize = 1536;
const N_VOCAB: usize = 49152;

struct Args {
    threads: Vec<usize>,
    reps: usize,
    only: Option<String>,
    tiling: Option<Tiling>,
    order: SumOrder,
    types: Vec<GgmlType>,
    /// Whether `--types` was given (the row-dot benchmarks then take only those types).
    types_given: bool,
    disasm: Option<MatmulSpec>,
    /// The weight `{K, M}` of the `rows` benchmarks (decode copies and the prompt shape).
    rows_shape: (usize, usize),
    /// Tokens of the `rows` prompt table.
    rows_tokens: usize,
    /// Weight copies the `rows` prompt table cycles through.
    rows_copies: usize,
    /// Weight copies the `rows` decode table cycles through (64: from DRAM; 1: hot in the
    /// caches, the kernel's own speed).
    rows_decode_copies: usize,
    /// Whether the `rows` prompt table's tokens are one-column products each.
    rows_batched: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: vec![1, 2],
        reps: 21,
        only: None,
        tiling: None,
        order: SumOrder::Ggml,
        types: vec![
            GgmlType::Q4_1,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::F16,
        ],
        disasm: None,
        types_given: false,
        rows_shape: (N_FF.next_multiple_of(256), N_EMBD),
        rows_tokens: 64,
        rows_copies: 1,
        rows_decode_copies: 64,
        rows_batched: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--threads" | "-t" => {
                a.threads = val()?
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--threads: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--reps" => a.reps = val()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--only" => {
                let v = val()?;
                if !["bandwidth", "shapes", "decode", "pp", "rows"].contains(&v.as_str()) {
                    return Err(format!(
                        "--only {v}: one of bandwidth, shapes, decode, pp, rows"
                    ));
                }
                a.only = Some(v);
            }
            "--tiling" => {
                let v = val()?;
                let p: Vec<usize> = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--tiling: {e}")))
                    .collect::<Result<_, _>>()?;
                if p.len() != 2 && p.len() != 3 {
                    return Err("--tiling TOKENS,UNROLL[,GROUPS]".into());
                }
                a.tiling = Some(Tiling {
                    tokens: p[0],
                    unroll: p[1],
                    groups: p.get(2).copied().unwrap_or(1),
                    order: SumOrder::Ggml,
                });
            }
            "--order" => {
                a.order = match val()?.as_str() {
                    "ggml" => SumOrder::Ggml,
                    "block" => SumOrder::Block,
                    o => return Err(format!("--order {o}: ggml or block")),
                }
            }
            "--types" => {
                a.types = val()?
                    .split(',')
                    .map(|s| GgmlType::from_name(s).ok_or_else(|| format!("unknown type {s}")))
                    .collect::<Result<_, _>>()?;
                a.types_given = true;
            }
            "--disasm" => {
                let v = val()?;
                let p: Vec<&str> = v.split(',').collect();
                let num = |s: &str| s.parse::<usize>().map_err(|e| format!("--disasm: {e}"));
                if p.len() != 4 {
                    return Err("--disasm TYPE,K,M,N".into());
                }
                a.disasm = Some(MatmulSpec {
                    wtype: GgmlType::from_name(p[0]).ok_or_else(|| format!("unknown type {}", p[0]))?,
                    k: num(p[1])?,
                    m: num(p[2])?,
                    n: num(p[3])?,
                });
            }
            "--rows-shape" => {
                let v = val()?;
                let p: Vec<usize> = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--rows-shape: {e}")))
                    .collect::<Result<_, _>>()?;
                match p[..] {
                    // 64 copies of the weight are held in memory at once.
                    [k, m] if k > 0 && m > 0 && k.saturating_mul(m) <= 1 << 28 => {
                        a.rows_shape = (k, m)
                    }
                    _ => return Err("--rows-shape K,M (both above 0, K·M at most 2^28)".into()),
                }
            }
            "--rows-tokens" | "--rows-copies" | "--rows-decode-copies" => {
                let n: usize = val()?
                    .parse()
                    .map_err(|e| format!("{flag}: {e}"))
                    .and_then(|n| match n {
                        1..=4096 => Ok(n),
                        _ => Err(format!("{flag}: 1 to 4096")),
                    })?;
                match flag.as_str() {
                    "--rows-tokens" => a.rows_tokens = n,
                    "--rows-copies" => a.rows_copies = n,
                    _ => a.rows_decode_copies = n,
                }
            }
            "--rows-batched" => a.rows_batched = true,
            "-h" | "--help" => {
                return Err("usage: kernel-bench [--threads 1,2] [--reps N] [--only bandwidth|shapes|decode|pp|rows] [--tiling T,U[,G]] [--order ggml|block] [--types Q4_1,...] [--disasm TYPE,K,M,N] [--rows-shape K,M] [--rows-tokens N] [--rows-copies N] [--rows-decode-copies N] [--rows-batched]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn random_weight(t: GgmlType, k: usize, m: usize, rng: &mut Rng) -> RepackedWeight {
    let row = t.row_size(k as u64).unwrap_or(0) as usize;
    let mut data = vec![0u8; row * m];
    for b in data.iter_mut() {
        *b = rng.next() as u8;
    }
    // keep f16 scales finite: set every block's first bytes to a small f16
    if t.is_quantized() {
        let has_min = t == GgmlType::Q4_1;
        for blk in data.chunks_exact_mut(t.type_size()) {
            blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if has_min {
                blk[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_le_bytes());
            }
        }
    } else if t == GgmlType::F16 {
        for c in data.chunks_exact_mut(2) {
            c.copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    match repack(t, k, m, &data) {
        Ok(w) => w,
        Err(e) => panic!("repack {t} {k}x{m}: {e}"),
    }
}

fn kernel(spec: &MatmulSpec, tiling: Option<Tiling>, order: SumOrder) -> MatmulKernel {
    let r = match tiling {
        Some(t) => compile_matmul_with(spec, Tiling { order, ..t }),
        None => compile_matmul_with(spec, spec.tiling_for(order)),
    };
    match r {
        Ok(k) => k,
        Err(e) => panic!("compile {spec}: {e}"),
    }
}

/// Times of one call: median and minimum over the batches, in seconds.
#[derive(Clone, Copy)]
struct Timing {
    median: f64,
    min: f64,
}

/// Median and minimum over `reps` batches of the time of one `f()`; a batch runs long
/// enough (≥ 0.5 ms) to be timed. The machine is shared and noisy: the minimum is the closest
/// to the uncontended speed, the median to what a user sees.
fn time_it(reps: usize, mut f: impl FnMut()) -> Timing {
    f();
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().as_secs_f64().max(1e-7);
    let per_batch = ((5e-4 / once).ceil() as usize).clamp(1, 10_000);
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        samples.push(t.elapsed().as_secs_f64() / per_batch as f64);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Timing {
        median: samples[samples.len() / 2],
        min: samples[0],
    }
}

/// `k · n` activation values in [-1, 1), the same for every benchmark.
fn bench_activations(k: usize, n: usize) -> Vec<f32> {
    (0..k * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn bench_shapes(a: &Args, pools: &[ThreadPool]) {
    println!("| kernel | shape {{K, M}} x N | tiling | threads | µs/call (median) | µs/call (min) | GB/s (min) | GMAC/s (min) | compile ms |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut shapes: Vec<(GgmlType, usize, usize)> = Vec::new();
    for &t in &a.types {
        for &(k, m) in &[
            (N_EMBD, N_EMBD),
            (N_EMBD, N_KV),
            (N_EMBD, N_FF),
            (N_FF, N_EMBD),
        ] {
            shapes.push((t, k, m));
        }
    }
    if a.types.contains(&GgmlType::Q8_0) {
        shapes.push((GgmlType::Q8_0, N_EMBD, N_VOCAB));
    }
    // larger than L3 (32 MiB): streams from DRAM on every call, like decode does
    if a.types.contains(&GgmlType::Q4_1) {
        shapes.push((GgmlType::Q4_1, N_EMBD, 3 * N_VOCAB));
    }
    for (t, k, m) in shapes {
        let w = random_weight(t, k, m, &mut rng);
        for n in [1usize, 64] {
            if m > N_VOCAB && n > 1 {
                continue;
            }
            let spec = MatmulSpec { wtype: t, k, m, n };
            let t0 = Instant::now();
            let kern = kernel(&spec, a.tiling, a.order);
            let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
            let x = bench_activations(k, n);
            let mut act = vec![0u8; kern.act_bytes()];
            if let Err(e) = kern.prepare(&x, &mut act) {
                panic!("prepare: {e}");
            }
            let mut out = vec![0.0f32; m * n];
            if m == N_KV {
                // activation preparation does not depend on m: time it once per (type, k, n)
                let p = time_it(a.reps, || {
                    if let Err(e) = kern.prepare(&x, &mut act) {
                        panic!("prepare: {e}");
                    }
                });
                println!(
                    "| {} prepare (quantize activations) | {{{k}}} x {n} | - | 1 | {:.1} | {:.1} | - | - | - |",
                    t.name(),
                    p.median * 1e6,
                    p.min * 1e6
                );
            }
            for pool in pools {
                let s = time_it(a.reps, || {
                    if let Err(e) = kern.run(pool, &w, &act, &mut out) {
                        panic!("run: {e}");
                    }
                });
                println!(
                    "| {} | {{{k}, {m}}} x {n} | t{}u{}g{} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    t.name(),
                    kern.tiling().tokens,
                    kern.tiling().unroll,
                    kern.tiling().groups,
                    pool.n_threads(),
                    s.median * 1e6,
                    s.min * 1e6,
                    w.bytes() as f64 / s.min / 1e9,
                    (k * m * n) as f64 / s.min / 1e9,
                    compile_ms
                );
            }
        }
    }
}

/// The row-dot kernels per block type at decode shapes (module doc).
fn bench_rows(a: &Args, pools: &[ThreadPool], roof: &[f64]) {
    use codegen_cpu::rows::RowsMatmul;
    println!("| type | weight {{K, M}} x copies | path | threads | µs/call (median) | GB/s (best) | share of read bandwidth |");
    println!("|---|---|---|---|---|---|---|");
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for t in GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| codegen_cpu::rows::supports(t))
        .filter(|t| !a.types_given || a.types.contains(t))
    {
        // 64 copies (the default) cycled so that every call reads weights no cache holds
        // (for a small shape a large L3 may still hold them all).
        let ((k, m), copies) = (a.rows_shape, a.rows_decode_copies);
        let kern = match RowsMatmul::new(t, k, m, 1) {
            Ok(kern) => kern,
            Err(e) => {
                eprintln!("kernel-bench: {} {{{k}, {m}}}: {e}", t.name());
                continue;
            }
        };
        let ws: Vec<Vec<u8>> = (0..copies)
            .map(|_| {
                let mut w: Vec<u8> = (0..kern.weight_bytes())
                    .map(|_| rng.next() as u8 & 0x3f)
                    .collect();
                moderate_exponents(t, &mut w);
                w
            })
            .collect();
        let mut act = vec![0u8; kern.act_bytes()];
        if let Err(e) = kern.prepare(&bench_activations(k, 1), &mut act) {
            panic!("prepare: {e}");
        }
        let mut out = vec![0f32; m];
        for (pi, pool) in pools.iter().enumerate() {
            let mut i = 0;
            let s = time_it(a.reps, || {
                i = (i + 1) % copies;
                if let Err(e) = kern.run(pool, &ws[i], &act, &mut out) {
                    panic!("run: {e}");
                }
            });
            let gbs = kern.weight_bytes() as f64 / s.min / 1e9;
            let share = roof
                .get(pi)
                .map_or(String::from("-"), |r| format!("{:.0}%", 100.0 * gbs / r));
            println!(
                "| {} | {{{k}, {m}}} x {copies} | {}{} | {} | {:.1} | {:.1} | {share} |",
                t.name(),
                if kern.simd() { "AVX2" } else { "plain" },
                if kern.exact() {
                    ", exact"
                } else {
                    ", scalar order"
                },
                pool.n_threads(),
                s.median * 1e6,
                gbs,
            );
        }
    }
}

/// Sets the E8M0 scale bytes of `t`'s blocks in `w` (MXFP4's `e`) to 120..128, a scale of
/// 2^-8 .. 1 as in real weights, and makes F32 / BF16 weights values in [-1, 1): the masked
/// random bytes would make scales and values subnormal floats, which run far slower (F32
/// and BF16 measured 3.4 GMAC/s where they make 50).
fn moderate_exponents(t: GgmlType, w: &mut [u8]) {
    let value = |byte: u8| (byte & 0x3f) as f32 / 32.0 - 1.0;
    match t {
        GgmlType::F32 => {
            for v in w.chunks_exact_mut(4) {
                v.copy_from_slice(&value(v[0]).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for v in w.chunks_exact_mut(2) {
                v.copy_from_slice(&half::bf16::from_f32(value(v[0])).to_le_bytes());
            }
        }
        _ => {}
    }
    let Some(f) = ir::ggml::block_format(t) else {
        return;
    };
    for field in f.fields {
        if field.kind == ir::ggml::FieldKind::E8M0Scale {
            for (i, blk) in w.chunks_exact_mut(f.type_size).enumerate() {
                blk[field.offset] = 120 + (i % 8) as u8;
            }
        }
    }
}

/// The row-dot kernels at a prompt shape: one FFN-down-like weight (hot after the first
/// call, or `--rows-copies` of them cycled), `--rows-tokens` tokens (64), as a plan's chunk
/// computes them; GMAC/s of multiply-adds.
fn bench_rows_pp(a: &Args, pools: &[ThreadPool]) {
    use codegen_cpu::rows::RowsMatmul;
    println!("| type | weight {{K, M}} x tokens | threads | µs/call (median) | GMAC/s (best) |");
    println!("|---|---|---|---|---|");
    let mut rng = Rng(0x1f83_d9ab_fb41_bd6b);
    let ((k, m), n) = (a.rows_shape, a.rows_tokens);
    for t in GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| codegen_cpu::rows::supports(t))
        .filter(|t| !a.types_given || a.types.contains(t))
    {
        let Ok(kern) = RowsMatmul::new(t, k, m, n) else {
            continue;
        };
        let kern = if a.rows_batched { kern.batched() } else { kern };
        let kern = match a.order {
            SumOrder::Ggml => kern,
            SumOrder::Block => match kern.block_order() {
                Some(kern) => kern,
                None => continue,
            },
        };
        let copies = a.rows_copies;
        // The copies are held at once: refuse more than 4 GiB of them.
        let Some(bytes) = kern
            .weight_bytes()
            .checked_mul(copies)
            .filter(|&b| b <= 1 << 32)
        else {
            println!(
                "| {} | {{{k}, {m}}} x {n} | skipped: {copies} copies exceed 4 GiB | | |",
                t.name()
            );
            continue;
        };
        let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8 & 0x3f).collect();
        moderate_exponents(t, &mut w);
        let mut act = vec![0u8; kern.act_bytes()];
        if let Err(e) = kern.prepare(&bench_activations(k, n), &mut act) {
            panic!("prepare: {e}");
        }
        let mut out = vec![0f32; m * n];
        let wb = kern.weight_bytes();
        let mut i = 0;
        for pool in pools {
            let s = time_it(a.reps, || {
                i = (i + 1) % copies;
                let w = &w[i * wb..(i + 1) * wb];
                if let Err(e) = kern.run(pool, w, &act, &mut out) {
                    panic!("run: {e}");
                }
            });
            let gmacs = (k * m * n) as f64 / s.min / 1e9;
            println!(
                "| {} | {{{k}, {m}}} x {n} | {} | {:.1} | {:.2} |",
                t.name(),
                pool.n_threads(),
                s.median * 1e6,
                gmacs,
            );
        }
    }
}

struct Layer {
    w: Vec<RepackedWeight>, // q k v o gate up down
}

/// One full step over all layers' matmuls for `n` tokens plus the output matmul for
/// `n_out` tokens; activations are re-quantized where a real step would (once per distinct
/// input: attn input, attn output, ffn input, ffn hidden).
fn bench_sweep(a: &Args, pools: &[ThreadPool], roof: &[f64], n: usize, label: &str) {
    let mut rng = Rng(12345);
    let lt = GgmlType::Q4_1;
    let layers: Vec<Layer> = (0..N_LAYER)
        .map(|_| Layer {
            w: vec![
                random_weight(lt, N_EMBD, N_EMBD, &mut rng),
                random_weight(lt, N_EMBD, N_KV, &mut rng),
                random_weight(lt, N_EMBD, N_KV, &mut rng),
                random_weight(lt, N_EMBD, N_EMBD, &mut rng),
                random_weight(lt, N_EMBD, N_FF, &mut rng),
                random_weight(lt, N_EMBD, N_FF, &mut rng),
                random_weight(lt, N_FF, N_EMBD, &mut rng),
            ],
        })
        .collect();
    let output = random_weight(GgmlType::Q8_0, N_EMBD, N_VOCAB, &mut rng);
    let spec = |k, m, nn| MatmulSpec {
        wtype: lt,
        k,
        m,
        n: nn,
    };
    let kq = kernel(&spec(N_EMBD, N_EMBD, n), a.tiling, a.order);
    let kkv = kernel(&spec(N_EMBD, N_KV, n), a.tiling, a.order);
    let kff = kernel(&spec(N_EMBD, N_FF, n), a.tiling, a.order);
    let kdown = kernel(&spec(N_FF, N_EMBD, n), a.tiling, a.order);
    let kout = kernel(
        &MatmulSpec {
            wtype: GgmlType::Q8_0,
            k: N_EMBD,
            m: N_VOCAB,
            n: 1,
        },
        None,
        a.order,
    );
    let x_embd: Vec<f32> = (0..N_EMBD * n)
        .map(|i| ((i * 31) % 200) as f32 / 100.0 - 1.0)
        .collect();
    let x_ff: Vec<f32> = (0..N_FF * n)
        .map(|i| ((i * 17) % 300) as f32 / 150.0 - 1.0)
        .collect();
    let mut act_embd = vec![0u8; kq.act_bytes()];
    let mut act_ff = vec![0u8; kdown.act_bytes()];
    let mut act_out = vec![0u8; kout.act_bytes()];
    let mut o_embd = vec![0.0f32; N_EMBD * n];
    let mut o_kv = vec![0.0f32; N_KV * n];
    let mut o_ff = vec![0.0f32; N_FF * n];
    let mut o_vocab = vec![0.0f32; N_VOCAB];
    let total_bytes: usize = layers
        .iter()
        .flat_map(|l| l.w.iter().map(|w| w.bytes()))
        .sum::<usize>()
        + output.bytes();
    for (pi, pool) in pools.iter().enumerate() {
        let mut step = || -> Result<(), codegen_cpu::CodegenError> {
            for l in &layers {
                kq.prepare(&x_embd, &mut act_embd)?;
                kq.run(pool, &l.w[0], &act_embd, &mut o_embd)?;
                kkv.run(pool, &l.w[1], &act_embd, &mut o_kv)?;
                kkv.run(pool, &l.w[2], &act_embd, &mut o_kv)?;
                kq.prepare(&x_embd, &mut act_embd)?;
                kq.run(pool, &l.w[3], &act_embd, &mut o_embd)?;
                kff.prepare(&x_embd, &mut act_embd)?;
                kff.run(pool, &l.w[4], &act_embd, &mut o_ff)?;
                kff.run(pool, &l.w[5], &act_embd, &mut o_ff)?;
                kdown.prepare(&x_ff, &mut act_ff)?;
                kdown.run(pool, &l.w[6], &act_ff, &mut o_embd)?;
            }
            kout.prepare(&x_embd[..N_EMBD], &mut act_out)?;
            kout.run(pool, &output, &act_out, &mut o_vocab)?;
            Ok(())
        };
        let s = time_it(a.reps, || {
            if let Err(e) = step() {
                panic!("sweep: {e}");
            }
        });
        let gbs = total_bytes as f64 / s.min / 1e9;
        println!(
            "| {label} | {} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1} | {:.2} |",
            pool.n_threads(),
            s.median * 1e3,
            s.min * 1e3,
            n as f64 / s.median,
            n as f64 / s.min,
            gbs,
            gbs / roof[pi]
        );
    }
}

/// Read bandwidth of plain Rust code summing a 128 MiB buffer (beyond any cache), split over
/// the pool's threads: the roofline the decode kernels are measured against (always run:
/// the machine is shared, so the roof is measured next to the kernels). Returns the best
/// GB/s per pool.
fn bench_bandwidth(a: &Args, pools: &[ThreadPool]) -> Vec<f64> {
    let mut best = Vec::new();
    let words: Vec<u64> = (0..(128usize << 20) / 8).map(|i| i as u64).collect();
    println!("| memory read | form | threads | GB/s (median) | GB/s (best) |");
    println!("|---|---|---|---|---|");
    for pool in pools {
        let mut top = 0f64;
        for how in codegen_cpu::stream::stream_reads() {
            let sink = std::sync::atomic::AtomicU64::new(0);
            let s = time_it(a.reps.min(5), || {
                pool.run(&|ti, nt| {
                    let chunk = words.len().div_ceil(nt);
                    let part =
                        &words[(ti * chunk).min(words.len())..((ti + 1) * chunk).min(words.len())];
                    sink.fetch_add(
                        codegen_cpu::stream::stream_sum(part, how),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                })
            });
            let bytes = (words.len() * 8) as f64;
            top = top.max(bytes / s.min / 1e9);
            println!(
                "| 128 MiB | {how} | {} | {:.1} | {:.1} |",
                pool.n_threads(),
                bytes / s.median / 1e9,
                bytes / s.min / 1e9
            );
            std::hint::black_box(sink.load(std::sync::atomic::Ordering::Relaxed));
        }
        best.push(top);
    }
    println!();
    println!("| thread pool | threads | µs per empty run (median) | µs (best) |");
    println!("|---|---|---|---|");
    for pool in pools {
        let s = time_it(a.reps, || pool.run(&|_, _| {}));
        println!(
            "| run(empty job) | {} | {:.2} | {:.2} |",
            pool.n_threads(),
            s.median * 1e6,
            s.min * 1e6
        );
    }
    println!();
    best
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Some(spec) = a.disasm {
        let tiling = a.tiling.map_or(spec.tiling_for(a.order), |t| Tiling {
            order: a.order,
            ..t
        });
        match codegen_cpu::matmul::disassemble_matmul(&spec, tiling) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("{e}"),
        }
        return;
    }
    println!(
        "host features: {}",
        codegen_cpu::jit::HostFeatures::detect()
    );
    let pools: Vec<ThreadPool> = a
        .threads
        .iter()
        .map(|&t| match ThreadPool::new(t) {
            Ok(p) => p,
            Err(e) => panic!("thread pool: {e}"),
        })
        .collect();
    let only = a.only.as_deref();
    let roof = bench_bandwidth(&a, &pools);
    if only.is_none() || only == Some("rows") {
        bench_rows(&a, &pools, &roof);
        println!();
        bench_rows_pp(&a, &pools);
        println!();
    }
    if only.is_none() || only == Some("shapes") {
        bench_shapes(&a, &pools);
        println!();
    }
    if only.is_none() || only == Some("decode") || only == Some("pp") {
        println!("| sweep (matmuls only) | threads | ms/step (median) | ms/step (min) | tokens/s (median) | tokens/s (best) | GB/s (best) | share of read bandwidth |");
        println!("|---|---|---|---|---|---|---|---|");
        if only != Some("pp") {
            bench_sweep(
                &a,
                &pools,
                &roof,
                1,
                "decode token (30 x 7 Q4_1 + output Q8_0)",
            );
        }
        if only != Some("decode") {
            bench_sweep(&a, &pools, &roof, 64, "prompt ubatch 64 (+ output for 1)");
        }
    }
}
