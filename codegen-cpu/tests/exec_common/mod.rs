//! Helpers of the executor tests: a small graph made into a plan by the compiler's passes,
//! run by the CPU executor and by the reference interpreter on the same random inputs.

#![allow(dead_code)]

use codegen_cpu::exec::{CompiledPlan, StepArgs};
use compiler::passes::{
    fuse_glu, fuse_norm_mul_mat, fuse_residual_add, fuse_rms_norm_mul, fuse_rope_kv_store,
    fuse_siblings, kernelize, plan_memory, CompileOptions, StepShape,
};
use ir::ggml::{f32_to_f16, GgmlType};
use ir::graph::Graph;
use ir::interp::{Inputs, InterpOptions, Interpreter, MemWeights};
use ir::plan::Plan;

/// The interpreter reproducing llama.cpp's CPU arithmetic without flash attention (what the
/// executor implements; llama.cpp's `flash_attn` off, as in the fixtures).
pub fn llama_cpp() -> InterpOptions {
    InterpOptions {
        flash_attn: false,
        ..InterpOptions::llama_cpp()
    }
}

/// KV cells of the test plans.
pub const N_CTX: u32 = 256;

/// xorshift64 random numbers.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.range(lo, hi)).collect()
    }
}

/// Random GGML data for a `{k, m}` weight of type `t` with realistic scales (as the matmul
/// tests make them).
pub fn random_weight(t: GgmlType, k: usize, m: usize, rng: &mut Rng) -> Vec<u8> {
    let row = t.row_size(k as u64).expect("whole blocks") as usize;
    let mut data = vec![0u8; row * m];
    match t {
        GgmlType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.range(-0.1, 0.1).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_f16(rng.range(-0.1, 0.1)).to_le_bytes());
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            for blk in data.chunks_exact_mut(t.type_size()) {
                for b in blk.iter_mut() {
                    *b = rng.next() as u8;
                }
                if t == GgmlType::Q8_0 {
                    for b in &mut blk[2..] {
                        if *b == 0x80 {
                            *b = 0x81;
                        }
                    }
                }
                blk[0..2].copy_from_slice(&f32_to_f16(rng.range(0.001, 0.01)).to_le_bytes());
                if t == GgmlType::Q4_1 {
                    blk[2..4].copy_from_slice(&f32_to_f16(rng.range(-0.08, 0.0)).to_le_bytes());
                }
            }
        }
        other => panic!("no random data for {}", other.name()),
    }
    data
}

/// Plan of `graphs` (one step each, `n_outputs = n_tokens`) through kernelize, the six
/// fusions and memory planning.
pub fn plan_of(graphs: &[(u32, Graph)]) -> Plan {
    plan_with_ctx(graphs, N_CTX)
}

/// [`plan_of`] with a KV cache of `n_ctx` cells.
pub fn plan_with_ctx(graphs: &[(u32, Graph)], n_ctx: u32) -> Plan {
    let opts = CompileOptions {
        ubatches: graphs.iter().map(|(n, _)| *n).collect(),
        all_logits: true,
        n_ctx,
        ..CompileOptions::default()
    };
    let gs: Vec<(StepShape, Graph)> = graphs
        .iter()
        .map(|(n, g)| {
            (
                StepShape {
                    n_tokens: *n,
                    n_outputs: *n,
                },
                g.clone(),
            )
        })
        .collect();
    let mut plan = kernelize(&gs, &opts).expect("kernelize");
    let kv = plan.kv.clone();
    for s in &mut plan.steps {
        fuse_rms_norm_mul(s, &kv);
        fuse_siblings(s, &kv);
        fuse_norm_mul_mat(s, &kv);
        fuse_glu(s, &kv);
        fuse_residual_add(s, &kv);
        fuse_rope_kv_store(s, &kv);
        plan_memory(s, plan.align);
    }
    plan.verify().expect("plan verifies");
    plan
}

/// The kernel kinds of the step for `n_tokens`.
pub fn kinds(plan: &Plan, n_tokens: u32) -> Vec<String> {
    plan.steps
        .iter()
        .find(|s| s.n_tokens == n_tokens)
        .expect("step")
        .kernels
        .iter()
        .map(|k| k.op.name())
        .collect()
}

/// Outputs of one run: the CPU executor's, then the interpreter's.
pub type RunOutputs = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// One run's inputs.
pub struct Run<'a> {
    pub n_tokens: u32,
    pub tokens: &'a [i32],
    pub positions: &'a [i32],
    pub kv_len: usize,
    pub data: &'a [(&'a str, &'a [f32])],
}

/// Runs `graphs`' plan on the CPU executor (`n_threads`) and the graphs on the interpreter
/// (`opts`), one run after the other (KV caches persist), and returns for each run the
/// outputs of both: `(cpu, interp)`.
pub fn run_both(
    graphs: &[(u32, Graph)],
    weights: &MemWeights,
    runs: &[Run<'_>],
    n_threads: usize,
    opts: InterpOptions,
) -> Vec<RunOutputs> {
    let plan = plan_of(graphs);
    let mut cpu = CompiledPlan::new(&plan, weights, n_threads).expect("plan compiles");
    // The same attention as the interpreter: flash or soft_max path, llama.cpp's threads.
    cpu.set_flash_attn(opts.flash_attn)
        .expect("this attention mode takes the plan's caches");
    cpu.set_llama_threads(opts.llama_threads);
    let mut interp = Interpreter::new(weights, opts);
    let mut kv = codegen_cpu::layout::AlignedBuf::zeroed(cpu.kv_layout().stream_bytes as usize);
    let mut out = Vec::new();
    for r in runs {
        let g = &graphs
            .iter()
            .find(|(n, _)| *n == r.n_tokens)
            .expect("graph")
            .1;
        let args = StepArgs {
            tokens: r.tokens,
            positions: r.positions,
            output_ids: &[],
            kv_len: r.kv_len,
            data: r.data,
        };
        cpu.step(kv.as_mut_slice(), r.n_tokens, r.n_tokens, &args)
            .expect("cpu step");
        let c: Vec<Vec<f32>> = (0..g.outputs.len())
            .map(|i| cpu.output(i).expect("output"))
            .collect();
        let inputs = Inputs {
            tokens: r.tokens,
            positions: r.positions,
            output_ids: &[],
            kv_len: r.kv_len as u64,
            data: r.data,
        };
        let i = interp.run(g, &inputs).expect("interpreter runs");
        out.push((c, i));
    }
    out
}

/// Largest absolute difference and largest absolute reference value.
pub fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "lengths");
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    (d, m)
}

/// Asserts `|a - b| ≤ rel · max|b|` everywhere (and that nothing is NaN).
pub fn assert_close(what: &str, a: &[f32], b: &[f32], rel: f32) {
    assert!(a.iter().all(|v| v.is_finite()), "{what}: non-finite result");
    let (d, m) = diff(a, b);
    eprintln!("{what}: max diff {d:.3e} (max |ref| {m:.3e})");
    assert!(
        d <= rel * m.max(1e-6),
        "{what}: max diff {d} exceeds {rel} × {m}"
    );
}
