//! The GPU kernel printer on every fixture: each plan generates, deterministically.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, LogitRows};

mod synthetic;

fn fixtures() -> Vec<std::path::PathBuf> {
    let dir = modelc_tests::shared_root().join("fixtures/models");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures are there")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_fixture_generates_deterministically() {
    for path in fixtures() {
        let gguf = GgufFile::open(&path).expect("fixture opens");
        let model = compiler::load_model(&gguf).expect("model lowers");
        let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Both).expect("plan");
        let a = codegen_cuda::generate(&plan, &codegen_cuda::CUDA)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let b = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("again");
        assert_eq!(a, b, "{}", path.display());
        if let Ok(dir) = std::env::var("MODELC_DUMP_GPU") {
            let stem = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            for s in &a.steps {
                let f = format!("{dir}/{stem}-{}x{}.cu", s.n_tokens, s.n_outputs);
                std::fs::write(f, &s.source).expect("dump");
            }
        }
    }
}

/// The generated source of a few kernels, checked in (`tests/golden/`, `.cu` and `.metal`):
/// a change to the printer shows up as a diff of readable source. `MODELC_BLESS=1` rewrites
/// the files.
#[test]
fn golden_kernels() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
    let path = modelc_tests::shared_root().join("fixtures/models/llama-sep-Q4_0.gguf");
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let prog = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("generates");
    let si = plan
        .steps
        .iter()
        .position(|s| s.n_tokens == 8)
        .expect("ubatch 8");
    let metal = codegen_metal::generate(&plan).expect("generates MSL");
    // The kernels of layer 0 (norm + q/k/v, rope + KV store, attention, output + residual,
    // norm + gate/up + SwiGLU, down + residual) and the token lookup.
    check_golden(
        &root,
        "cu",
        &prog.steps[si].source,
        &prog.steps[si].launches[..7],
    );
    check_golden(
        &root,
        "metal",
        &metal.source,
        &metal.steps[si].launches[..3],
    );
    // The tensor-core prompt products (CUDA, 16 tokens): norm + q/k/v, output + residual,
    // norm + gate/up + SwiGLU.
    let plan = build_plan(&model, &[1, 16], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let prog = codegen_cuda::generate(&plan, &codegen_cuda::CUDA).expect("generates");
    let si = plan
        .steps
        .iter()
        .position(|s| s.n_tokens == 16)
        .expect("ubatch 16");
    let l = &prog.steps[si].launches;
    check_golden(
        &root.join("tensor_core"),
        "cu",
        &prog.steps[si].source,
        &[l[1].clone(), l[4].clone(), l[5].clone()],
    );
}

/// Compares the text of each launch's kernel in `source` (its helpers, comment and body)
/// with `root/<kernel>.<ext>`.
fn check_golden(
    root: &std::path::Path,
    ext: &str,
    source: &str,
    launches: &[codegen_cuda::Launch],
) {
    let bless = std::env::var_os("MODELC_BLESS").is_some();
    for k in launches {
        let at = source
            .find(&format!("\nKERNEL({},", k.kernel))
            .expect("kernel in the source");
        let start = source[..at]
            .rfind("\n// plan kernel ")
            .expect("kernel comment")
            + 1;
        let end = source[start..]
            .find("\n\n")
            .map_or(source.len(), |e| start + e + 1);
        // A rope kernel's helper functions come right before its comment.
        let helper = source[..start]
            .rfind(&format!("FN i32 {}_rope_pair", k.kernel))
            .unwrap_or(start);
        let text = &source[helper..end];
        let file = root.join(format!("{}.{ext}", k.kernel));
        if bless {
            std::fs::create_dir_all(root).expect("golden dir");
            std::fs::write(&file, text).expect("bless");
            continue;
        }
        let want = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with MODELC_BLESS=1 to write it)",
                file.display()
            )
        });
        assert!(
            want == text,
            "{} differs from the generated kernel; if the change is meant, rerun with MODELC_BLESS=1 and review the diff",
            file.display()
        );
    }
}

/// SmolLM2 (its mixed-type default file) and Gemma 3 generate for both dialects, with
/// the ubatch sizes `modelc compile` uses; the Metal source passes the lint.
#[test]
fn real_models_generate() {
    for path in [modelc_tests::smollm2(), modelc_tests::gemma3()]
        .into_iter()
        .flatten()
    {
        let gguf = GgufFile::open(&path).expect("model opens");
        let model = compiler::load_model(&gguf).expect("model lowers");
        let plan = build_plan(
            &model,
            &[1, 2, 4, 8, 16, 32, 64],
            4096,
            KvTypes::F16,
            LogitRows::Both,
        )
        .expect("plan");
        let cuda = codegen_cuda::generate(&plan, &codegen_cuda::CUDA)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(cuda.steps.len(), plan.steps.len());
        let metal =
            codegen_metal::generate(&plan).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lint = codegen_metal::lint(&metal.source);
        assert!(lint.is_empty(), "{}: {}", path.display(), lint.join("; "));
    }
}

/// The Metal source of every fixture, and of the synthetic model of the weight types no
/// fixture has (`synthetic::mixed_routine_model`), passes the lint (constructs the CPU shim
/// accepts and Metal would not).
#[test]
fn fixture_metal_sources_pass_the_lint() {
    let mut models: Vec<(String, GgufFile)> = fixtures()
        .into_iter()
        .map(|p| {
            let g = GgufFile::open(&p).expect("fixture opens");
            (p.display().to_string(), g)
        })
        .collect();
    models.push((
        "synthetic IQ/TQ1_0/MXFP4 model".into(),
        synthetic::mixed_routine_model(),
    ));
    for (name, gguf) in models {
        let model = compiler::load_model(&gguf).expect("model lowers");
        let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Both).expect("plan");
        let mut sources = vec![codegen_metal::generate(&plan).expect("generates").source];
        // Sliding-window rings (the gemma3 fixtures): rings of 256 cells at -c 512.
        if model.hparams.n_swa > 0 {
            let plan =
                build_plan(&model, &[1, 8], 512, KvTypes::F16, LogitRows::Last).expect("plan");
            let metal = codegen_metal::generate_with(&plan, Some(8)).expect("generates");
            assert!(metal.source.contains("% 256)"), "{name}: no ring");
            sources.push(metal.source);
        }
        for source in sources {
            let lint = codegen_metal::lint(&source);
            assert!(
                lint.is_empty(),
                "{name}: {}",
                lint[..lint.len().min(5)].join("; ")
            );
        }
    }
}

/// The GPU targets read every weight type the CPU reads: one printer's
/// `has_dequantizer`, which the runtime's supported types are derived from.
#[test]
fn gpu_targets_read_every_weight_type_the_cpu_reads() {
    let gpu = runtime::backend::gpu::support().weight_types;
    for &t in ir::ggml::GgmlType::ALL {
        if codegen_cpu::matmul_supports(t) {
            assert!(
                gpu.contains(&t),
                "the CPU reads {} weights, the GPU printer does not",
                t.name()
            );
        }
    }
    for t in synthetic::ROUTINE_TYPES {
        assert!(gpu.contains(&t), "{}", t.name());
    }
}

/// Not a check: writes one synthetic model per weight type of `synthetic::ROUTINE_TYPES`
/// (`llama-sep-F32` with every 2-D weight of that type) into `$MODELC_SYNTH_DIR` (default:
/// the temporary folder), for trying `modelc compile --target cuda|metal` by hand.
#[test]
#[ignore]
fn write_synthetic_models() {
    let dir = std::env::var_os("MODELC_SYNTH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for t in synthetic::ROUTINE_TYPES {
        let bytes = synthetic::synthetic_bytes("llama-sep-F32", |_| Some(t), 7);
        let path = dir.join(format!("llama-sep-{}.gguf", t.name()));
        std::fs::write(&path, bytes).expect("writes");
        eprintln!("{}", path.display());
    }
}

/// NVRTC options, or `None` after saying why when NVRTC is absent and not required
/// (`scripts/fetch-nvrtc` installs it; `scripts/test` runs that first, and CI requires it).
fn nvrtc() -> Option<codegen_cuda::nvrtc::NvrtcOptions> {
    match codegen_cuda::nvrtc::NvrtcOptions::new() {
        Ok(o) => Some(o),
        Err(e) => {
            let required = std::env::var("MODELC_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
                || std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(
                !required,
                "{e} (required here: MODELC_REQUIRE_NVRTC=1 or CI=true)"
            );
            modelc_tests::skip(&e.to_string());
            None
        }
    }
}

/// `text` without its comments, with the byte offsets into the three buffers (`arena + 123`, `wts + 456`,
/// `kv + 789`) and the kernel's own name made alike: kernels equal under this key differ
/// only in where their operands lie, and compile to the same code and registers.
fn code_key(text: &str, name: &str) -> String {
    let mut out: String = text
        .lines()
        .filter(|l| !l.starts_with("//"))
        .map(|l| l.replace(name, "K") + "\n")
        .collect();
    for buf in ["arena + ", "wts + ", "kv + "] {
        let mut s = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(buf) {
            s += &rest[..i + buf.len()];
            rest = rest[i + buf.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
            s += "0";
        }
        s += rest;
        out = s;
    }
    out
}

/// The distinct kernels of every step of the plans, each renamed `d<i>_<name>` (its
/// helpers with it), and the dequantizers they call.
#[derive(Default)]
struct Distinct {
    seen: std::collections::HashSet<String>,
    texts: Vec<String>,
    launches: Vec<codegen_cuda::Launch>,
    needs: std::collections::BTreeSet<u32>,
}

impl Distinct {
    fn add(&mut self, plan: &ir::plan::Plan, ring_ubatch: Option<u32>) {
        use codegen_cuda::kernels::{layout, print_step};
        let (weights, kv) = layout(plan, ring_ubatch).expect("layout");
        for s in &plan.steps {
            let p = print_step(&codegen_cuda::CUDA, plan, s, &weights, &kv, "").expect("prints");
            self.needs.extend(&p.needs);
            for t in &p.kernels {
                let l = p
                    .launches
                    .iter()
                    .find(|l| t.contains(&format!("\nKERNEL({},", l.kernel)))
                    .expect("a launch of each printed kernel");
                if self.seen.insert(code_key(t, &l.kernel)) {
                    let name = format!("d{}_{}", self.texts.len(), l.kernel);
                    self.texts.push(t.replace(&l.kernel, &name));
                    self.launches.push(codegen_cuda::Launch {
                        kernel: name,
                        ..l.clone()
                    });
                }
            }
        }
    }

    /// Compiles them in one NVRTC run and checks that ptxas reports no spill and no stack
    /// frame in any, and registers × threads within a block's register file; returns the
    /// most registers any kernel takes.
    fn compile(&self, opts: &codegen_cuda::nvrtc::NvrtcOptions) -> u32 {
        let step = codegen_cuda::StepProgram {
            n_tokens: 0,
            n_outputs: 0,
            source: codegen_cuda::kernels::assemble(
                "distinct kernels",
                codegen_cuda::CUDA_PRELUDE,
                &self.needs,
                &self.texts,
            )
            .expect("assembles"),
            launches: self.launches.clone(),
        };
        let c = codegen_cuda::nvrtc::compile_step(&step, opts).unwrap_or_else(|e| panic!("{e}"));
        let bad = c.spills();
        assert!(bad.is_empty(), "{}", bad.join("; "));
        let mut regs = 0;
        for k in &c.kernels {
            let l = step
                .launches
                .iter()
                .find(|l| l.kernel == k.kernel)
                .expect("launched");
            assert!(
                u64::from(k.registers) * u64::from(l.block) <= 65536,
                "{} takes {} registers × {} threads",
                k.kernel,
                k.registers,
                l.block
            );
            regs = regs.max(k.registers);
        }
        regs
    }
}

/// The check of the issue: every kernel of SmolLM2's, Gemma 3's, every fixture's and the
/// synthetic model's (the IQ, TQ1_0 and MXFP4 weights no fixture has) plan
/// (the decode step and prompt steps of 16 and 64; kernels that differ only in their operands' offsets
/// once; Gemma 3's also with sliding-window rings, F16 and Q8_0 caches) compiles to sm_90
/// with no spill and no stack frame. (`modelc compile --target
/// cuda` builds sm_80 too, and PTX, from the same source.)
#[test]
fn nvrtc_compiles_every_kernel_without_spills() {
    let Some(mut opts) = nvrtc() else { return };
    opts.archs = vec![90];
    opts.ptx_arch = None;
    let mut paths: Vec<_> = [modelc_tests::smollm2(), modelc_tests::gemma3()]
        .into_iter()
        .flatten()
        .collect();
    paths.extend(fixtures());
    let mut d = Distinct::default();
    let mut models: Vec<GgufFile> = paths
        .iter()
        .map(|p| GgufFile::open(p).expect("model opens"))
        .collect();
    // The weight types no fixture has, in one synthetic model.
    models.push(synthetic::mixed_routine_model());
    for gguf in models {
        let model = compiler::load_model(&gguf).expect("model lowers");
        let plan =
            build_plan(&model, &[1, 16, 64], 256, KvTypes::F16, LogitRows::Last).expect("plan");
        d.add(&plan, None);
        // Sliding-window rings (Gemma 3): the KV stores at `pos % cells` and attention over
        // a ring, with F16 and Q8_0 caches.
        if model.hparams.n_swa > 0 {
            let q8 = KvTypes::same(ir::graph::DType::Block(ir::ggml::GgmlType::Q8_0));
            for kv in [KvTypes::F16, q8] {
                let plan =
                    build_plan(&model, &[1, 16, 64], 1024, kv, LogitRows::Last).expect("plan");
                d.add(&plan, Some(64));
            }
        }
    }
    let regs = d.compile(&opts);
    eprintln!(
        "{} distinct kernels: at most {regs} registers",
        d.texts.len()
    );
}
