//! The GPU kernel printer on every fixture: each plan generates, deterministically.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, LogitRows};

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
        let a = codegen_cuda::generate(&plan, codegen_cuda::CUDA_PRELUDE)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let b = codegen_cuda::generate(&plan, codegen_cuda::CUDA_PRELUDE).expect("again");
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

/// The generated source of a few kernels, checked in (`tests/golden/`): a change to the
/// printer shows up as a diff of readable CUDA C. `MODELC_BLESS=1` rewrites the files.
#[test]
fn golden_kernels() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
    let path = modelc_tests::shared_root().join("fixtures/models/llama-sep-Q4_0.gguf");
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let prog = codegen_cuda::generate(&plan, codegen_cuda::CUDA_PRELUDE).expect("generates");
    let step = prog
        .steps
        .iter()
        .find(|s| s.n_tokens == 8)
        .expect("ubatch 8");
    // The kernels of layer 0 (norm + q/k/v, rope + KV store, attention, output + residual,
    // norm + gate/up + SwiGLU, down + residual) and the token lookup.
    let mut bless = std::env::var_os("MODELC_BLESS").is_some();
    for k in &step.launches[..7] {
        let start = step
            .source
            .find(&format!("// plan kernel k{}:", k.plan_kernel))
            .expect("kernel comment");
        let end = step.source[start..]
            .find("\n\n")
            .map_or(step.source.len(), |e| start + e + 1);
        // A rope kernel's helper function comes right before its comment.
        let helper = step.source[..start]
            .rfind(&format!("FN float {}_rope", k.kernel))
            .unwrap_or(start);
        let text = &step.source[helper..end];
        let file = root.join(format!("{}.cu", k.kernel));
        if bless {
            std::fs::create_dir_all(&root).expect("golden dir");
            std::fs::write(&file, text).expect("bless");
            continue;
        }
        let want = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            bless = false;
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
        let cuda = codegen_cuda::generate(&plan, codegen_cuda::CUDA_PRELUDE)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(cuda.steps.len(), plan.steps.len());
        let metal =
            codegen_metal::generate(&plan).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lint = codegen_metal::lint(&metal.source);
        assert!(lint.is_empty(), "{}: {}", path.display(), lint.join("; "));
    }
}

/// The Metal source of every fixture passes the lint (constructs the CPU shim accepts and
/// Metal would not).
#[test]
fn fixture_metal_sources_pass_the_lint() {
    for path in fixtures() {
        let gguf = GgufFile::open(&path).expect("fixture opens");
        let model = compiler::load_model(&gguf).expect("model lowers");
        let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Both).expect("plan");
        let metal = codegen_metal::generate(&plan).expect("generates");
        let lint = codegen_metal::lint(&metal.source);
        assert!(
            lint.is_empty(),
            "{}: {}",
            path.display(),
            lint[..lint.len().min(5)].join("; ")
        );
    }
}
