//! NVRTC compiles a hand-written kernel in the ABI vocabulary to sm_80 / sm_90 CUBINs and
//! PTX without spills, and a syntax error names its kernel with NVRTC's log.
//!
//! Needs NVRTC: `scripts/fetch-nvrtc` installs it into `~/.cache/modelc/nvrtc`. Without it the
//! tests skip (`modelc_tests::skip`), unless `MODELC_REQUIRE_NVRTC=1` or `CI=true`, where they
//! fail (`scripts/test` runs `scripts/fetch-nvrtc` first).

use codegen_cuda::nvrtc::{compile_step, locate, NvrtcError, NvrtcOptions};
use codegen_cuda::{Launch, StepProgram, CUDA_PRELUDE};

/// Options for the default architectures, or `None` (after saying why) when NVRTC is absent
/// and not required.
fn options() -> Option<NvrtcOptions> {
    match NvrtcOptions::new() {
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

/// A block-wide f16 → f32 sum of 128 values per block: shared memory, barriers, shuffles.
const SUM_KERNEL: &str = r#"
FN float warp_sum(float v) {
    UNROLL
    for (i32 m = 16; m > 0; m >>= 1) {
        v += SHFL_XOR(v, m);
    }
    return v;
}

KERNEL(k0_x, 128) {
    SHARED float part[4];
    const GMEM u16* src = (const GMEM u16*)(wts + 256);
    GMEM float* dst = (GMEM float*)(arena + 64);
    float v = F16_TO_F32(src[BX * 128 + TX]);
    v = warp_sum(v);
    if ((TX & 31) == 0) {
        part[TX >> 5] = v;
    }
    SYNC();
    if (TX == 0) {
        dst[BX] = part[0] + part[1] + part[2] + part[3];
    }
}

KERNEL(k1_y, 64) {
    GMEM float* dst = (GMEM float*)(arena + 64);
    if (TX == 0 && BX == 0) {
        dst[0] = AS_FLOAT(AS_UINT(dst[0]) | 1u);
    }
}
"#;

fn step(body: &str) -> StepProgram {
    StepProgram {
        n_tokens: 1,
        n_outputs: 1,
        source: format!("{CUDA_PRELUDE}\n{body}"),
        launches: vec![
            Launch {
                kernel: "k0_x".into(),
                plan_kernel: 0,
                grid: [4, 1, 1],
                block: 128,
                operands: Vec::new(),
            },
            Launch {
                kernel: "k1_y".into(),
                plan_kernel: 1,
                grid: [1, 1, 1],
                block: 64,
                operands: Vec::new(),
            },
        ],
    }
}

#[test]
fn compiles_the_vocabulary_without_spills() {
    let Some(opts) = options() else { return };
    let nv = locate().expect("located");
    eprintln!(
        "NVRTC {}.{} from {:?}, headers {}",
        nv.version.0,
        nv.version.1,
        nv.lib,
        nv.include_dir.display()
    );
    let c = compile_step(&step(SUM_KERNEL), &opts).unwrap_or_else(|e| panic!("{e}"));
    let archs: Vec<&str> = c.cubins.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(archs, ["sm_80", "sm_90"]);
    for (arch, bin) in &c.cubins {
        // A CUBIN is an ELF file.
        assert!(bin.starts_with(b"\x7fELF"), "{arch}: not an ELF CUBIN");
    }
    assert!(c.ptx.contains(".target sm_80"), "PTX for compute_80");
    assert!(c.ptx.contains(".entry k0_x") && c.ptx.contains(".entry k1_y"));
    for arch in ["sm_80", "sm_90"] {
        for (k, plan_kernel) in [("k0_x", 0), ("k1_y", 1)] {
            let r = c
                .kernels
                .iter()
                .find(|r| r.kernel == k && r.arch == arch)
                .unwrap_or_else(|| panic!("no ptxas report for {k} on {arch}: {:?}", c.kernels));
            assert_eq!(r.plan_kernel, Some(plan_kernel));
            assert!(r.registers > 0, "{r:?}");
            eprintln!("{r:?}");
        }
        let k0 = c
            .kernels
            .iter()
            .find(|r| r.kernel == "k0_x" && r.arch == arch)
            .expect("checked above");
        assert_eq!(k0.shared_bytes, 16, "{k0:?}");
    }
    assert!(c.spills().is_empty(), "{:?}", c.spills());
}

#[test]
fn a_syntax_error_names_its_kernel_with_the_log() {
    let Some(opts) = options() else { return };
    let broken = SUM_KERNEL.replace("dst[0] = AS_FLOAT", "dst[0] = AS_FLOAT(");
    let e = compile_step(&step(&broken), &opts).expect_err("a syntax error");
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    match &e {
        NvrtcError::Compile(f) => {
            assert_eq!(f.step, "step-1x1.cu");
            assert_eq!(f.kernel.as_deref(), Some("k1_y"));
            assert_eq!(f.plan_kernel, Some(1));
            assert!(f.log.contains("error"), "{}", f.log);
        }
        other => panic!("not a compile error: {other:?}"),
    }
    assert!(msg.contains("kernel k1_y (plan kernel 1)"), "{msg}");
    assert!(msg.contains("error"), "{msg}");

    // An error in a helper before any kernel is placed there.
    let broken = SUM_KERNEL.replace("return v;", "return v");
    let e = compile_step(&step(&broken), &opts).expect_err("a syntax error");
    assert!(e.to_string().contains("the prelude and helpers"), "{e}");
}
