//! The CUDA backend's host side, without a GPU: its payload survives the artifact's JSON,
//! and loading refuses in one line what it cannot run (no driver or GPU, another target's
//! program, a context past the compiled one). Where a GPU is present the load goes on to the
//! device and fails on the empty code of the test's program, also in one line.
#![cfg(feature = "cuda")]

use codegen_cuda::{GpuProgram, StepProgram, WeightTable};
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::backend::cuda::{Cubin, CudaBackend, CudaBinaries, StepBinary};
use runtime::backend::{Backend, LoadOptions, LogitRows, Payload};

/// A plan of the small llama fixture and a CUDA payload around it whose steps have no code.
fn payload() -> Option<(GgufFile, Payload)> {
    let path = modelc_tests::shared("fixtures/models/llama-sep-F16.gguf")?;
    let gguf = GgufFile::open(&path).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("fixture lowers");
    let plan = runtime::cpu_engine::build_plan(&model, &[1, 4], 64, KvTypes::F16, LogitRows::Both)
        .expect("plan");
    let kv = plan.kv_layout(u64::from(plan.n_ctx)).expect("kv layout");
    let program = GpuProgram {
        steps: plan
            .steps
            .iter()
            .map(|s| StepProgram {
                n_tokens: s.n_tokens,
                n_outputs: s.n_outputs,
                source: String::new(),
                launches: Vec::new(),
            })
            .collect(),
        weights: WeightTable::new(&plan).expect("weight table"),
        kv_cells: u64::from(plan.n_ctx),
        kv_ring_ubatch: None,
        kv_bytes: kv.stream_bytes,
        arena_bytes: plan.arena_bytes(),
    };
    let binaries = CudaBinaries {
        steps: plan
            .steps
            .iter()
            .map(|_| StepBinary {
                cubins: vec![Cubin {
                    arch: "sm_90".into(),
                    data: vec![0x7f, b'E', b'L', b'F', 0, 1, 2, 255],
                }],
                ptx: String::new(),
            })
            .collect(),
        ptx_arch: 80,
    };
    let payload = Payload::Cuda {
        plan: Box::new(plan),
        program: Box::new(program),
        binaries,
    };
    Some((gguf, payload))
}

fn opts(n_ctx: usize) -> LoadOptions {
    LoadOptions {
        n_threads: 1,
        n_ctx,
        flash_attn: true,
        logits: LogitRows::Last,
        swa_full: false,
    }
}

#[test]
fn the_payload_survives_json() {
    let Some((_, p)) = payload() else { return };
    let json = serde_json::to_string(&p).expect("serializes");
    assert!(json.contains(r#""kind":"cuda""#), "tagged as cuda");
    let back: Payload = serde_json::from_str(&json).expect("parses back");
    assert_eq!(back.kind(), "cuda");
    let (
        Payload::Cuda {
            binaries: a,
            program: pa,
            ..
        },
        Payload::Cuda {
            binaries: b,
            program: pb,
            ..
        },
    ) = (&p, &back)
    else {
        panic!("not cuda payloads");
    };
    assert_eq!(a, b);
    assert_eq!(pa, pb);
    assert_eq!(back.plan().steps.len(), p.plan().steps.len());
}

#[test]
fn loading_refuses_in_one_line() {
    let Some((gguf, p)) = payload() else { return };
    let be = CudaBackend::default();
    let err = |r: anyhow::Result<Box<dyn runtime::engine::Engine + '_>>| match r {
        Ok(_) => panic!("loaded a program without code"),
        Err(e) => format!("{e:#}"),
    };
    let e = err(be.load(&p, &gguf, &opts(65)));
    assert!(e.starts_with("-c 65:"), "{e}");
    let cpu = Payload::Plan {
        plan: Box::new(p.plan().clone()),
    };
    let e = err(be.load(&cpu, &gguf, &opts(16)));
    assert!(e.contains("built for another target"), "{e}");
    let e = err(be.load(&p, &gguf, &opts(16)));
    assert!(!e.contains('\n'), "one line: {e}");
    eprintln!("{e}");
    // No GPU here (the usual case), or a GPU that refuses the test's empty code.
    assert!(
        e.contains("no NVIDIA driver/GPU found") || e.contains("CUDA:"),
        "{e}"
    );
}

#[test]
fn the_cpu_target_has_no_source_to_emit() {
    let Some((_, p)) = payload() else { return };
    let be = runtime::backend::backend(runtime::backend::Target::Cpu, &Default::default())
        .expect("cpu backend");
    let e = be.sources(p.plan()).expect_err("no source");
    assert!(e.to_string().contains("--emit-source"), "{e}");
    // The CUDA target's sources come from the kernel printer.
    match CudaBackend::default().sources(p.plan()) {
        Ok(files) => assert!(files
            .iter()
            .all(|(n, _)| n.starts_with("step-") && n.ends_with(".cu"))),
        Err(e) => assert!(e.to_string().starts_with("--target cuda:"), "{e}"),
    }
}
