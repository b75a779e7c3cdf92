//! Kernels chosen for every CPU level compute the same logits (`select-kernels`,
//! `--cpu`): each fixture model's plan, its kernels chosen for each level this host runs
//! (plain Rust, AVX2, AVX-512, VNNI, VBMI, AMX), gives bit for bit the logits of the host's
//! own level, for the 32-token prompt as one batch and one token at a time, in the exact
//! order (llama.cpp's numbers). A level a CPU lacks is refused when the plan is loaded.

use codegen_cpu::select::{mat_kernels, select_kernels, MatFamily};
use codegen_cpu::target::{Arch, CpuTarget, Tier};
use codegen_cpu::SumOrder;
use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::session::Session;

/// Batch logits (all rows) and one-token-at-a-time logits of `prompt`.
fn run(engine: CpuEngine<'_>, prompt: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut s = Session::single(engine).expect("session");
    let batch = s.decode(prompt, 0, true).expect("batch").to_vec();
    s.clear();
    let mut step = Vec::new();
    for (i, &t) in prompt.iter().enumerate() {
        step.extend_from_slice(s.decode(&[t], i, false).expect("step"));
    }
    (batch, step)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_level_computes_the_host_levels_logits() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let host = CpuTarget::host().expect("a host with kernels");
    let levels: Vec<Tier> = Tier::ALL.into_iter().filter(|&t| t <= host.tier).collect();
    let prompt: Vec<u32> = (0..32).map(|i| (i * 37 + 5) % 1000).collect();
    for name in [
        "llama-sep-F32",
        "llama-sep-F16",
        "llama-sep-BF16",
        "llama-sep-Q8_0",
        "llama-sep-Q4_0",
        "llama-sep-Q4_1",
        "llama-sep-Q5_0",
        "llama-sep-Q5_1",
        "llama-sep-Q2_K",
        "llama-sep-Q3_K",
        "llama-sep-Q4_K",
        "llama-sep-Q5_K",
        "llama-sep-Q6_K",
        "llama-sep-IQ4_NL",
        "llama-sep-IQ4_XS",
        "gemma3-Q8_0",
    ] {
        let gguf = GgufFile::open(models.join(format!("{name}.gguf"))).expect("fixture opens");
        let model = compiler::load_model(&gguf).expect("lowers");
        let plan = build_plan(&model, &[1, 64], 256, KvTypes::F16, LogitRows::Both).expect("plan");
        let mut want = None;
        for &tier in levels.iter().rev() {
            let cpu = CpuTarget {
                tier,
                ..host.clone()
            };
            let mut p = plan.clone();
            select_kernels(&mut p, &cpu, SumOrder::Ggml).expect("selects");
            let engine = CpuEngine::new(&gguf, p, 2).expect("loads");
            let got = run(engine, &prompt);
            let got = (bits(&got.0), bits(&got.1));
            match &want {
                None => want = Some(got),
                Some(w) => assert!(
                    *w == got,
                    "{name}: kernels for {} differ from the host's ({})",
                    tier.name(),
                    host.tier.name()
                ),
            }
        }
        eprintln!("{name}: {} levels equal", levels.len());
    }
}

/// The plan says which routines run: a plain-level plan takes no hand-written vector
/// routine where the host's level would (Q4_1 decode: the generated kernel instead of the
/// four-row routine), and a level above the host's is refused at load.
#[test]
fn the_plan_decides_and_the_host_is_checked() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let gguf = GgufFile::open(models.join("llama-sep-Q4_1.gguf")).expect("fixture opens");
    let model = compiler::load_model(&gguf).expect("lowers");
    let plan = build_plan(&model, &[1], 256, KvTypes::F16, LogitRows::Last).expect("plan");
    let host = CpuTarget::host().expect("host");
    let families = |tier| {
        let mut p = plan.clone();
        let cpu = CpuTarget {
            tier,
            ..host.clone()
        };
        select_kernels(&mut p, &cpu, SumOrder::Ggml).expect("selects");
        p.steps[0]
            .kernels
            .iter()
            .filter(|k| k.target.is_some())
            .flat_map(|k| mat_kernels(k).expect("chosen"))
            .map(|m| m.family)
            .collect::<Vec<_>>()
    };
    assert!(families(Tier::Plain).contains(&MatFamily::Generated));
    if host.tier >= Tier::Avx2 {
        assert!(!families(Tier::Avx2).contains(&MatFamily::Generated));
    }
    // Another architecture's plan is refused (and, on a host below AMX, an AMX plan).
    let foreign = match host.arch {
        Arch::X86_64 => "armv8-a",
        Arch::Aarch64 => "x86-64",
    };
    let mut refused = vec![foreign];
    if host.tier < Tier::Amx && host.arch == Arch::X86_64 {
        refused.push("sapphirerapids");
    }
    for name in refused {
        let mut p = plan.clone();
        let cpu = CpuTarget::named(name).expect("known");
        select_kernels(&mut p, &cpu, SumOrder::Ggml).expect("selects");
        let e = CpuEngine::new(&gguf, p, 1).err().expect("refused");
        assert!(format!("{e:#}").contains("--cpu native"), "{name}: {e:#}");
    }
}
