//! The generated GPU kernels, run on the CPU through the C++ shims (codegen-cuda's `shim`):
//! every kernel of a fixture's plan against the interpreter on the same inputs, and whole
//! models against llama.cpp's logits. The CUDA source runs as printed (the CUDA prelude and
//! the CUDA shim); the Metal source as printed under the Metal prelude and shim.

use codegen_cuda::shim::{run_step, Dialect, ShimOptions};
use codegen_cuda::{Launch, WeightTable};
use ir::gguf::GgufFile;
use ir::graph::{DType, KvTypes};
use ir::interp::{InterpOptions, WeightSource};
use ir::plan::exec::{PlanExec, StepArgs};
use ir::plan::{Base, Plan, Step, Value};
use runtime::cpu_engine::{build_plan, LogitRows};

mod synthetic;

fn fixture(name: &str, kv: KvTypes) -> (GgufFile, Plan) {
    let path = modelc_tests::shared_root().join(format!("fixtures/models/{name}.gguf"));
    model(&path, kv)
}

fn model(path: &std::path::Path, kv: KvTypes) -> (GgufFile, Plan) {
    let gguf = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let plan = plan_of(&gguf, kv);
    (gguf, plan)
}

fn plan_of(gguf: &GgufFile, kv: KvTypes) -> Plan {
    let model = compiler::load_model(gguf).expect("model lowers");
    // Steps of 16 tokens: the tiled prompt kernels (16 columns or more) and the decode ones.
    build_plan(&model, &[1, 16], 64, kv, LogitRows::Both).expect("plan")
}

/// The weight buffer of the kernel ABI: each weight's GGUF bytes at its table offset.
fn weight_bytes(plan: &Plan, table: &WeightTable, w: &dyn WeightSource) -> Vec<u8> {
    let mut out = vec![0u8; table.bytes as usize];
    for (wb, &off) in plan.weights.iter().zip(&table.offsets) {
        let r = w.weight(&wb.name).expect("weight in the file");
        out[off as usize..off as usize + r.data.len()].copy_from_slice(r.data);
    }
    out
}

/// The actual elements of arena value `v` (F32) of `step` in `arena`, in `ne` order.
fn gather(step: &Step, arena: &[u8], v: &Value) -> Vec<f32> {
    let Base::Arena(b) = v.base else {
        return Vec::new();
    };
    let base = step.buffers[b.index()].offset.expect("planned") + v.offset;
    let ne = v.shape.ne;
    let mut out = Vec::new();
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let at =
                        (base + i0 * v.nb[0] + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3]) as usize;
                    out.push(f32::from_le_bytes(
                        arena[at..at + 4].try_into().expect("4 bytes"),
                    ));
                }
            }
        }
    }
    out
}

/// Largest difference relative to the largest reference magnitude (1 if that is 0).
fn rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    got.iter()
        .zip(want)
        .map(|(a, b)| {
            if a.is_nan() != b.is_nan() {
                f32::INFINITY
            } else {
                (a - b).abs()
            }
        })
        .fold(0f32, f32::max)
        / scale
}

/// Whether kernel `name` of `source` multiplies on the tensor cores (`MMA_TF32`).
fn uses_tensor_cores(source: &str, name: &str) -> bool {
    let Some(at) = source.find(&format!("KERNEL({name},")) else {
        return false;
    };
    let body = &source[at..];
    let end = body[1..].find("\nKERNEL(").map_or(body.len(), |e| e + 1);
    body[..end].contains("MMA_TF32(")
}

/// Writes the step's integer inputs (token ids, positions, output row ids) into `arena`.
fn write_inputs(step: &Step, arena: &mut [u8], tokens: &[i32], positions: &[i32], outs: &[i32]) {
    for inp in &step.inputs {
        let v = step.value(inp.value);
        let Base::Arena(b) = v.base else { continue };
        let at = (step.buffers[b.index()].offset.expect("planned") + v.offset) as usize;
        let vals = match inp.kind {
            ir::graph::Input::Tokens => tokens,
            ir::graph::Input::Positions => positions,
            _ => outs,
        };
        for (i, x) in vals.iter().enumerate() {
            arena[at + 4 * i..at + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
    }
}

fn words_to_bytes(w: &[u32], len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    b.resize(len.max(b.len()), 0);
    b
}

/// One step of a scripted run: tokens at consecutive positions, all logits or the last.
struct Turn {
    n_tokens: u32,
    n_outputs: u32,
    pos0: i32,
}

/// The fixtures' prompt (`fixtures/reference/prompt.json`), 17 of its tokens.
const PROMPT: [i32; 17] = [
    934, 615, 253, 128, 83, 431, 663, 584, 277, 697, 630, 272, 540, 567, 604, 957, 71,
];

/// Runs the turns kernel by kernel: before each kernel the device arena is the
/// interpreter's, so each kernel is compared on exactly the inputs the interpreter's
/// kernel sees. The KV memory evolves on the device from the device's own stores.
fn each_kernel_matches(name: &str, kv_types: KvTypes, dialect: Dialect) {
    let (gguf, plan) = fixture(name, kv_types);
    each_kernel_of_plan_matches(name, &gguf, &plan, dialect);
}

fn each_kernel_of_plan_matches(name: &str, gguf: &GgufFile, plan: &Plan, dialect: Dialect) {
    let turns = [
        Turn {
            n_tokens: 16,
            n_outputs: 16,
            pos0: 0,
        },
        Turn {
            n_tokens: 1,
            n_outputs: 1,
            pos0: 16,
        },
    ];
    each_kernel_of_turns_matches(name, gguf, plan, dialect, &turns, None);
}

/// [`each_kernel_of_plan_matches`] over `turns`; with `ring`, the sliding-window caches are
/// rings sized for ubatches of `ring` tokens in the program and in the interpreter alike.
fn each_kernel_of_turns_matches(
    name: &str,
    gguf: &GgufFile,
    plan: &Plan,
    dialect: Dialect,
    turns: &[Turn],
    ring: Option<u32>,
) {
    let (prog, metal, iopts) = match ring {
        None => (
            codegen_cuda::generate(plan, &codegen_cuda::CUDA).expect("generates"),
            codegen_metal::generate(plan).expect("generates MSL"),
            InterpOptions::exact(),
        ),
        Some(ub) => (
            codegen_cuda::generate_with(plan, &codegen_cuda::CUDA, Some(ub)).expect("generates"),
            codegen_metal::generate_with(plan, Some(ub)).expect("generates MSL"),
            InterpOptions {
                kv_ring_ubatch: Some(ub),
                ..InterpOptions::exact()
            },
        ),
    };
    let wts = weight_bytes(plan, &prog.weights, gguf);
    let mut kv = vec![0u8; prog.kv_bytes as usize];
    let mut exec = PlanExec::new(plan, gguf, iopts).expect("executor");
    for turn in turns {
        let n = turn.n_tokens as usize;
        let tokens: Vec<i32> = (turn.pos0..turn.pos0 + n as i32)
            .map(|p| {
                PROMPT
                    .get(p as usize)
                    .copied()
                    .unwrap_or((p * 37 + 11) % 1000 + 3)
            })
            .collect();
        let tokens = &tokens[..];
        let positions: Vec<i32> = (turn.pos0..turn.pos0 + n as i32).collect();
        let outs: Vec<i32> = (n as i32 - turn.n_outputs as i32..n as i32).collect();
        let args = StepArgs {
            tokens,
            positions: &positions,
            output_ids: &outs,
            kv_len: (turn.pos0 as usize + n) as u64,
        };
        let si = exec
            .begin(turn.n_tokens, turn.n_outputs, &args)
            .expect("step");
        let step = &plan.steps[si];
        let (source, launches): (&str, &[Launch]) = match dialect {
            Dialect::Cuda => (&prog.steps[si].source, &prog.steps[si].launches),
            Dialect::Metal => (&metal.source, &metal.steps[si].launches),
        };
        for (k, kernel) in step.kernels.iter().enumerate() {
            let mut arena = words_to_bytes(exec.arena(), prog.arena_bytes as usize);
            run_step(
                dialect,
                source,
                &launches[k..k + 1],
                &mut arena,
                &mut kv,
                &wts,
                &ShimOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{name} k{k} {}: {e}", kernel.op.name()));
            exec.run_kernel(si, k, args.kv_len).expect("interpreter");
            for d in &kernel.dsts {
                let v = step.value(*d);
                if !matches!(v.base, Base::Arena(_)) || v.dtype != DType::F32 {
                    continue;
                }
                let want = exec.value(si, v, args.kv_len);
                let got = gather(step, &arena, v);
                let e = rel_diff(&got, &want);
                // TF32 products (codegen_cuda::kernels::matmul::tensor_core) round their
                // inputs to 10 mantissa bits: measured up to 3e-4 on the fixtures.
                let tol = if uses_tensor_cores(source, &launches[k].kernel) {
                    1.5e-3
                } else {
                    2e-4
                };
                assert!(
                    e < tol,
                    "{name} {dialect:?} step {}x{} k{k} {} ({}): relative difference {e}",
                    turn.n_tokens,
                    turn.n_outputs,
                    kernel.op.name(),
                    v.name
                );
            }
        }
    }
}

#[test]
fn each_cuda_kernel_matches_the_interpreter() {
    for name in [
        "llama-sep-F32",
        "llama-sep-Q4_0",
        "llama-sep-Q4_K",
        "llama-sep-IQ4_XS",
        "qwen2-Q8_0",
        "qwen3-Q4_K",
        "gemma3-Q8_0",
        "phi3-Q4_K",
    ] {
        each_kernel_matches(name, KvTypes::F16, Dialect::Cuda);
    }
}

/// The tensor-core prompt kernel's other shapes, through the CUDA shim, each kernel
/// against the interpreter: 72-token prompts (64-column tiles, the second one mostly past
/// the last token) on two fixtures, and a model whose weights have rows in multiples of 32
/// (n_embd 96, one KV head of 32: two warps along the rows) and of 16 only (n_ff 112: one
/// warp along the rows, four along the columns).
#[test]
fn tensor_core_tiles_of_every_shape_match_the_interpreter() {
    let turns = [
        Turn {
            n_tokens: 72,
            n_outputs: 72,
            pos0: 0,
        },
        Turn {
            n_tokens: 1,
            n_outputs: 1,
            pos0: 72,
        },
    ];
    let plan72 = |gguf: &GgufFile| {
        let model = compiler::load_model(gguf).expect("model lowers");
        build_plan(&model, &[1, 72], 128, KvTypes::F16, LogitRows::Both).expect("plan")
    };
    for name in ["llama-sep-Q4_K", "gemma3-Q8_0"] {
        let (gguf, _) = fixture(name, KvTypes::F16);
        let plan = plan72(&gguf);
        each_kernel_of_turns_matches(name, &gguf, &plan, Dialect::Cuda, &turns, None);
    }
    let path = std::env::temp_dir().join(format!("modelc-odd-rows-{}.gguf", std::process::id()));
    let shape = runtime::synth::Shape {
        n_embd: 96,
        n_layer: 1,
        n_ff: 112,
        n_head: 3,
        n_head_kv: 1,
        ..runtime::synth::Shape::preset("1b").expect("preset")
    };
    let vocab =
        GgufFile::open(modelc_tests::shared_root().join("fixtures/models/llama-sep-F32.gguf"))
            .expect("fixture opens");
    let ftype = runtime::quantize::FileType::parse("Q8_0").expect("a type");
    runtime::synth::Synth::new(&shape, vocab.metadata(), ftype, 3)
        .expect("a shape")
        .write(&path, 1, &std::sync::atomic::AtomicBool::new(false), |_| ())
        .expect("synth writes the model");
    let gguf = GgufFile::open(&path).expect("model opens");
    let _ = std::fs::remove_file(&path);
    let plan = plan72(&gguf);
    let prog = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("generates");
    for wr in [4, 2, 1] {
        assert!(
            prog.steps
                .iter()
                .any(|s| s.source.contains(&format!("const i32 wr = warp % {wr};"))),
            "no tensor-core kernel with {wr} warps along the rows"
        );
    }
    each_kernel_of_turns_matches(
        "n_embd 96, n_ff 112",
        &gguf,
        &plan,
        Dialect::Cuda,
        &turns,
        None,
    );
}

/// SmolLM2 and Gemma 3 270M at their real shapes (SmolLM2: n_embd 576, 49152 output rows;
/// Gemma: a K-quant mix, sliding-window layers, GELU): a prompt step and a decode step, all
/// launches in one run each, against the interpreter's logits. (Kernel by kernel the
/// weights would cross to the shim once per kernel: minutes.)
#[test]
fn real_models_match_the_interpreter() {
    for path in [modelc_tests::smollm2(), modelc_tests::gemma3()]
        .into_iter()
        .flatten()
    {
        let (gguf, plan) = model(&path, KvTypes::F16);
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let prog = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("generates");
        let wts = weight_bytes(&plan, &prog.weights, &gguf);
        let mut kv = vec![0u8; prog.kv_bytes as usize];
        let mut exec = PlanExec::new(&plan, &gguf, InterpOptions::exact()).expect("executor");
        for (n, pos0) in [(16usize, 0i32), (1, 16)] {
            let tokens = &PROMPT[pos0 as usize..pos0 as usize + n];
            let positions: Vec<i32> = (pos0..pos0 + n as i32).collect();
            let args = StepArgs {
                tokens,
                positions: &positions,
                output_ids: &[n as i32 - 1],
                kv_len: (pos0 as usize + n) as u64,
            };
            let want = exec.run(n as u32, 1, &args).expect("interpreter");
            let si = plan
                .steps
                .iter()
                .position(|s| s.n_tokens == n as u32 && s.n_outputs == 1)
                .expect("step");
            let step = &plan.steps[si];
            let mut arena = vec![0u8; prog.arena_bytes as usize];
            write_inputs(step, &mut arena, tokens, &positions, &[n as i32 - 1]);
            let launches = &prog.steps[si].launches;
            run_step(
                Dialect::Cuda,
                &prog.steps[si].source,
                launches,
                &mut arena,
                &mut kv,
                &wts,
                &ShimOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = gather(step, &arena, step.value(step.outputs[0]));
            let e = rel_diff(&got, &want[0]);
            eprintln!("{name} step {n}x1: relative logit difference {e:.2e}");
            // Measured: SmolLM2 7.6e-4 (prompt) and 3.4e-4 (decode), Gemma 3 2.3e-3 and
            // 2.5e-3 (18 layers). The prompt's products are TF32 on the tensor cores (inputs
            // rounded to 10 mantissa bits; with the f32 tiles they were 1e-4 and 1.2e-3),
            // and the decode reads the KV cache they wrote; every kernel alone is within
            // 2e-4 of the interpreter on the fixtures, the TF32 products within 3e-4.
            assert!(e < 5e-3, "{name} step {n}x1: relative logit difference {e}");
        }
    }
}

/// The weight types no fixture has (the I-quants, TQ1_0, MXFP4: [`synthetic::ROUTINE_TYPES`])
/// in one synthetic model ([`synthetic::mixed_routine_model`]): every kernel of the decode
/// step and of the 16-token prompt step (the tiled kernel) against the interpreter, through
/// the CUDA and the Metal shim.
#[test]
fn each_kernel_of_the_routine_types_matches_the_interpreter() {
    let gguf = synthetic::mixed_routine_model();
    let plan = plan_of(&gguf, KvTypes::F16);
    for dialect in [Dialect::Cuda, Dialect::Metal] {
        each_kernel_of_plan_matches(
            "llama-sep-F32 with IQ/TQ1_0/MXFP4 weights",
            &gguf,
            &plan,
            dialect,
        );
    }
}

/// Each dequantizer the GPU printer has (every type `has_dequantizer` accepts, the
/// routines of the I-quants, TQ1_0 and MXFP4 among them), run through the shim in both
/// dialects: a kernel per type decodes random valid blocks, one value a thread; the values
/// equal `ir`'s reference dequantizer's (ggml's `dequantize_row_*`) bit for bit.
#[test]
fn every_gpu_dequantizer_matches_ir_bit_for_bit() {
    use codegen_cuda::kernels::dequant::{fn_name, has_dequantizer};
    use ir::ggml::GgmlType;
    let types: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| has_dequantizer(t))
        .collect();
    for t in synthetic::ROUTINE_TYPES {
        assert!(types.contains(&t), "no GPU dequantizer for {}", t.name());
    }
    const VALUES: usize = 2048;
    let mut rng = synthetic::Rng(16);
    let mut wts = Vec::new();
    let mut want: Vec<f32> = Vec::new();
    let mut kernels = Vec::new();
    let mut launches = Vec::new();
    let mut needs = std::collections::BTreeSet::new();
    for &t in &types {
        let fmt = ir::ggml::block_format(t).expect("described");
        let n_blocks = VALUES / fmt.block_size;
        let blocks = synthetic::random_blocks(fmt, n_blocks, synthetic::WIDE, &mut rng);
        let mut y = vec![0f32; VALUES];
        ir::ggml::dequantize(t, &blocks, &mut y).expect("ir dequantizes");
        let name = format!("dq_test_{}", t.name());
        kernels.push(format!(
            "KERNEL({name}, 128) {{
    const i32 v = BX * 128 + TX;
                 *(GMEM float*)(arena + ops.at[1] + 4 * (u64)v) =              {}(wts + ops.at[0] + (u64)(v / {bs}) * {ts}u, v % {bs});
}}
",
            fn_name(t),
            bs = fmt.block_size,
            ts = fmt.type_size
        ));
        needs.insert(t.id());
        launches.push(Launch {
            kernel: name,
            plan_kernel: 0,
            grid: [(VALUES / 128) as u32, 1, 1],
            block: 128,
            operands: vec![wts.len() as u64, 4 * want.len() as u64],
        });
        wts.extend(&blocks);
        // The next type's blocks at an even offset, as a weight row's are.
        wts.resize(wts.len().next_multiple_of(256), 0);
        want.extend(y);
    }
    for (dialect, prelude) in [
        (Dialect::Cuda, codegen_cuda::CUDA_PRELUDE),
        (Dialect::Metal, codegen_metal::METAL_PRELUDE),
    ] {
        let source = codegen_cuda::kernels::assemble("dequantizers", prelude, &needs, &kernels)
            .expect("assembles");
        if dialect == Dialect::Metal {
            let lint = codegen_metal::lint(&source);
            assert!(lint.is_empty(), "{}", lint.join("; "));
        }
        let mut arena = vec![0u8; 4 * want.len()];
        run_step(
            dialect,
            &source,
            &launches,
            &mut arena,
            &mut [],
            &wts,
            &ShimOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{dialect:?}: {e}"));
        for (k, &t) in types.iter().enumerate() {
            let range = k * VALUES..(k + 1) * VALUES;
            let got: Vec<u32> = arena[4 * range.start..4 * range.end]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            for (i, (g, w)) in got.iter().zip(&want[range]).enumerate() {
                assert!(
                    *g == w.to_bits(),
                    "{dialect:?} {}: value {} of block {}: {} (bits {g:#010x}), ir gives {w} ({:#010x})",
                    t.name(),
                    i % t.block_size(),
                    i / t.block_size(),
                    f32::from_bits(*g),
                    w.to_bits()
                );
            }
        }
    }
}

#[test]
fn kernels_of_other_kv_caches_match_the_interpreter() {
    use ir::ggml::GgmlType;
    // A Q8_0 cache brings the Hadamard rotations and the Q8_0 store; F32 the plain store.
    let q8 = KvTypes::same(DType::Block(GgmlType::Q8_0));
    each_kernel_matches("llama-sep-Q8_0", q8, Dialect::Cuda);
    each_kernel_matches("qwen3-F32", KvTypes::same(DType::F32), Dialect::Cuda);
}

/// Sliding-window rings past their end (the gemma3 fixture, window 8, at `-c 512` with
/// rings of 256 cells): a 64-token prompt at positions 200..264 stores 256.. at cells 0..
/// and its queries from 256 on see the ring's end then its start (two ranges in cell
/// order); a decode at 259 sees cells 252..256 and 0..4. Every kernel (the KV stores at
/// `pos % 256`, attention over the wrapped ring) against the interpreter's rings, with F16
/// caches in CUDA and Q8_0 caches in Metal.
#[test]
fn each_kernel_past_a_sliding_window_ring_matches_the_interpreter() {
    use ir::ggml::GgmlType;
    let path = modelc_tests::shared_root().join("fixtures/models/gemma3-Q8_0.gguf");
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    assert_eq!(model.hparams.n_swa, 8);
    let turns = [
        Turn {
            n_tokens: 64,
            n_outputs: 1,
            pos0: 200,
        },
        Turn {
            n_tokens: 1,
            n_outputs: 1,
            pos0: 259,
        },
    ];
    let q8 = KvTypes::same(DType::Block(GgmlType::Q8_0));
    for (kv, dialect) in [(KvTypes::F16, Dialect::Cuda), (q8, Dialect::Metal)] {
        let plan = build_plan(&model, &[1, 64], 512, kv, LogitRows::Last).expect("plan");
        let (_, layout) = codegen_cuda::kernels::layout(&plan, Some(64)).expect("layout");
        let rings: Vec<u64> = layout
            .caches
            .iter()
            .filter(|c| c.is_ring(512))
            .map(|c| c.n_cells)
            .collect();
        assert!(
            !rings.is_empty() && rings.iter().all(|&c| c == 256),
            "{rings:?}"
        );
        each_kernel_of_turns_matches("gemma3-Q8_0 ring", &gguf, &plan, dialect, &turns, Some(64));
    }
}

#[test]
fn each_metal_kernel_matches_the_interpreter() {
    for name in ["llama-sep-Q4_1", "gemma3-Q4_K", "qwen2-Q4_K"] {
        each_kernel_matches(name, KvTypes::F16, Dialect::Metal);
    }
}

/// llama.cpp's logits for the fixtures' 32-token prompt, one row of `n_vocab` per token,
/// with the spread llama.cpp's own modes show (flash attention on vs off, f32 vs f16 KV).
fn llama_cpp_logits(name: &str) -> (Vec<i32>, Vec<f32>, f32) {
    let dir = modelc_tests::shared_root().join("fixtures/reference");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join(format!("{name}.json"))).expect("reference json"),
    )
    .expect("json");
    let prompt: Vec<i32> = meta["prompt"]
        .as_array()
        .expect("prompt")
        .iter()
        .map(|v| v.as_i64().expect("id") as i32)
        .collect();
    let obs = &meta["observed"];
    let spread = [
        "flash_on_vs_off_batch_max_abs_diff",
        "kv_f32_vs_f16_batch_max_abs_diff",
    ]
    .iter()
    .map(|k| obs[k].as_f64().unwrap_or(0.0) as f32)
    .fold(0f32, f32::max);
    let bytes = std::fs::read(dir.join(format!("{name}.batch.f32"))).expect("logits");
    let logits = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    (prompt, logits, spread)
}

/// A whole model through the shim: the 32-token prompt as two steps of 16 with every
/// logit row, all launches of a step in one run, against llama.cpp's logits.
fn whole_model_matches_llama_cpp(name: &str, dialect: Dialect) {
    let (gguf, plan) = fixture(name, KvTypes::F16);
    let prog = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("generates");
    let metal = codegen_metal::generate(&plan).expect("generates MSL");
    let wts = weight_bytes(&plan, &prog.weights, &gguf);
    let mut kv = vec![0u8; prog.kv_bytes as usize];
    let (prompt, want, spread) = llama_cpp_logits(name);
    let si = plan
        .steps
        .iter()
        .position(|s| s.n_tokens == 16 && s.n_outputs == 16)
        .expect("step of 16 with all logits");
    let step = &plan.steps[si];
    let (source, launches): (&str, &[Launch]) = match dialect {
        Dialect::Cuda => (&prog.steps[si].source, &prog.steps[si].launches),
        Dialect::Metal => (&metal.source, &metal.steps[si].launches),
    };
    let logits_v = step.value(step.outputs[0]);
    let n_vocab = logits_v.shape.ne[0] as usize;
    let mut got = Vec::new();
    let mut arena = vec![0u8; prog.arena_bytes as usize];
    for chunk in 0..prompt.len() / 16 {
        let tokens = &prompt[chunk * 16..chunk * 16 + 16];
        let positions: Vec<i32> = (chunk as i32 * 16..chunk as i32 * 16 + 16).collect();
        write_inputs(
            step,
            &mut arena,
            tokens,
            &positions,
            &(0..16).collect::<Vec<i32>>(),
        );
        run_step(
            dialect,
            source,
            launches,
            &mut arena,
            &mut kv,
            &wts,
            &ShimOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        got.extend(gather(step, &arena, logits_v));
    }
    assert_eq!(got.len(), want.len(), "{name}: {n_vocab} logits per token");
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let tol = 1.5 * spread + 0.01;
    eprintln!("{name} {dialect:?}: max |logit - llama.cpp| {worst:.4} (tolerance {tol:.4})");
    assert!(
        worst <= tol,
        "{name} {dialect:?}: logits differ from llama.cpp's by up to {worst} (tolerance {tol})"
    );
}

#[test]
fn whole_models_through_the_cuda_shim_match_llama_cpp() {
    for name in [
        "llama-sep-Q4_0",
        "llama-tied-Q4_K",
        "qwen2-Q8_0",
        "gemma3-Q4_K",
        "phi3-Q8_0",
    ] {
        whole_model_matches_llama_cpp(name, Dialect::Cuda);
    }
}

#[test]
fn a_whole_model_through_the_metal_shim_matches_llama_cpp() {
    whole_model_matches_llama_cpp("qwen3-Q4_K", Dialect::Metal);
}

/// Every kernel of a prompt step (a decode step runs the same code with one column), built with ThreadSanitizer and run on OS
/// threads: no data race between the threads of a block (a forgotten barrier is caught:
/// codegen-cuda's shim tests keep that negative case).
#[test]
fn no_kernel_races_under_thread_sanitizer() {
    let (gguf, plan) = fixture(
        "llama-sep-Q4_K",
        KvTypes::same(DType::Block(ir::ggml::GgmlType::Q8_0)),
    );
    let metal = codegen_metal::generate(&plan).expect("generates MSL");
    let wts = weight_bytes(&plan, &metal.weights, &gguf);
    let mut kv = vec![0u8; metal.kv_bytes as usize];
    let opts = ShimOptions {
        tsan: true,
        ..ShimOptions::default()
    };
    for (n_tokens, n_outputs) in [(16, 16)] {
        let si = plan
            .steps
            .iter()
            .position(|s| s.n_tokens == n_tokens && s.n_outputs == n_outputs)
            .expect("step");
        let mut arena = vec![0u8; metal.arena_bytes as usize];
        run_step(
            Dialect::Metal,
            &metal.source,
            &metal.steps[si].launches,
            &mut arena,
            &mut kv,
            &wts,
            &opts,
        )
        .unwrap_or_else(|e| panic!("step {n_tokens}x{n_outputs}: {e}"));
    }
}
