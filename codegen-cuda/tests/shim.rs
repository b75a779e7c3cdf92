//! The CPU shim runs hand-written kernels of the shared vocabulary under both preludes, and
//! the results match Rust's. These tests need the host g++ (they fail, not skip, without it).

use codegen_cuda::shim::{run_step, Dialect, ShimError, ShimOptions};
use codegen_cuda::{Launch, CUDA_PRELUDE};
use codegen_metal::METAL_PRELUDE;
use std::time::{Duration, Instant};

const DIALECTS: [Dialect; 2] = [Dialect::Cuda, Dialect::Metal];

fn source(d: Dialect, kernels: &str) -> String {
    let prelude = match d {
        Dialect::Cuda => CUDA_PRELUDE,
        Dialect::Metal => METAL_PRELUDE,
    };
    format!("{prelude}\n{kernels}")
}

fn launch(kernel: &str, grid: [u32; 3], block: u32) -> Launch {
    Launch {
        kernel: kernel.into(),
        plan_kernel: 0,
        grid,
        block,
        operands: Vec::new(),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs `kernels` under `d` with default options; returns (arena, kv).
fn run(
    d: Dialect,
    kernels: &str,
    launches: &[Launch],
    arena: usize,
    kv: usize,
    wts: &[u8],
    opts: &ShimOptions,
) -> Result<(Vec<u8>, Vec<u8>), ShimError> {
    let mut a = vec![0u8; arena];
    let mut k = vec![0u8; kv];
    run_step(d, &source(d, kernels), launches, &mut a, &mut k, wts, opts)?;
    Ok((a, k))
}

fn close(got: f32, want: f32, tol: f32) -> bool {
    (got - want).abs() <= tol * (1.0 + want.abs())
}

/// Block sums of 4096 floats per block: a strided loop, a 5-step shuffle reduction per warp,
/// the warps' partial sums through shared memory and a barrier.
const REDUCE: &str = r#"
FN float warp_sum(float v) {
    UNROLL
    for (i32 m = 16; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

KERNEL(k0_sum, 128) {
    SHARED float part[4];
    const GMEM float* x = (const GMEM float*)(wts) + BX * 4096;
    float v = 0.0f;
    for (i32 i = TX; i < 4096; i += 128) v += x[i];
    v = warp_sum(v);
    if ((TX & 31) == 0) part[TX >> 5] = v;
    SYNC();
    if (TX < 32) {
        float p = TX < 4 ? part[TX] : 0.0f;
        p = warp_sum(p);
        if (TX == 0) ((GMEM float*)arena)[BX] = p;
    }
}
"#;

fn reduce_input(blocks: usize) -> Vec<f32> {
    (0..blocks * 4096)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
        .collect()
}

#[test]
fn block_reduction_with_shared_memory_and_shuffles() {
    let blocks = 64;
    let x = reduce_input(blocks);
    let want: Vec<f32> = x.chunks(4096).map(|c| c.iter().sum()).collect();
    for d in DIALECTS {
        let (a, _) = run(
            d,
            REDUCE,
            &[launch("k0_sum", [blocks as u32, 1, 1], 128)],
            blocks * 4,
            0,
            &f32_bytes(&x),
            &ShimOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let got = f32s(&a);
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(close(*g, *w, 1e-4), "{d:?} block {b}: {g} != {w}");
        }
    }
}

/// A grid-strided elementwise kernel over a 3-D grid (16 x 2 x 2 blocks of 64 threads),
/// using the float math of the vocabulary; reads its input from `wts`, adds to the arena.
const ELEMENTWISE: &str = r#"
KERNEL(k1_map, 64) {
    const i32 n = 10000;
    const GMEM float* x = (const GMEM float*)wts;
    GMEM float* y = (GMEM float*)(arena + 16);
    const i32 block = BX + 16 * (BY + 2 * BZ);
    for (i32 i = block * 64 + TX; i < n; i += 64 * 64) {
        float v = x[i];
        float r = expf(v * 0.5f) + logf(fabsf(v) + 1.0f) + tanhf(v) + sqrtf(fabsf(v))
                + fmaxf(v, 0.25f) + fminf(v, -0.25f) + roundf(v * 3.0f) + floorf(v * 3.0f)
                + cosf(v) + sinf(v) + powf(fabsf(v), 1.5f);
        y[i] += r;
    }
    if (block == 63 && TX == 63) ((GMEM u32*)arena)[0] = (u32)(BX * 100 + BY * 10 + BZ);
}
"#;

fn elementwise_ref(v: f32) -> f32 {
    (v * 0.5).exp()
        + (v.abs() + 1.0).ln()
        + v.tanh()
        + v.abs().sqrt()
        + v.max(0.25)
        + v.min(-0.25)
        + (v * 3.0).round()
        + (v * 3.0).floor()
        + v.cos()
        + v.sin()
        + v.abs().powf(1.5)
}

#[test]
fn grid_strided_elementwise_math() {
    let n = 10000;
    // Avoid exact .5 multiples of 1/3 so that round() cannot differ by the last bit.
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.001713) - 8.1).collect();
    for d in DIALECTS {
        let mut arena = vec![0u8; 16 + 4 * n];
        arena[16..].copy_from_slice(&f32_bytes(&vec![1.0; n]));
        let mut kv = vec![7u8; 3];
        run_step(
            d,
            &source(d, ELEMENTWISE),
            &[launch("k1_map", [16, 2, 2], 64)],
            &mut arena,
            &mut kv,
            &f32_bytes(&x),
            &ShimOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        assert_eq!(
            u32::from_le_bytes([arena[0], arena[1], arena[2], arena[3]]),
            1511,
            "{d:?}: block indices"
        );
        assert_eq!(kv, [7, 7, 7], "{d:?}: kv comes back as it went");
        let y = f32s(&arena[16..]);
        for i in 0..n {
            let want = 1.0 + elementwise_ref(x[i]);
            assert!(
                close(y[i], want, 1e-5),
                "{d:?} x[{i}]={}: {} != {want}",
                x[i],
                y[i]
            );
        }
    }
}

/// f16 bit patterns to f32 and back (round to nearest even), bf16 to f32, bit casts.
const CONVERT: &str = r#"
KERNEL(k2_convert, 32) {
    const i32 n = 96;
    const GMEM u16* h = (const GMEM u16*)wts;
    const GMEM float* f = (const GMEM float*)(wts + 2 * n);
    GMEM float* hf = (GMEM float*)arena;
    GMEM u16* fh = (GMEM u16*)(arena + 4 * n);
    GMEM float* bf = (GMEM float*)(arena + 6 * n);
    GMEM u32* bits = (GMEM u32*)(kv);
    for (i32 i = TX; i < n; i += 32) {
        hf[i] = F16_TO_F32(h[i]);
        fh[i] = F32_TO_F16(f[i]);
        bf[i] = BF16_TO_F32(h[i]);
        bits[i] = AS_UINT(AS_FLOAT(AS_UINT(f[i]) ^ 0x80000000u));
    }
}
"#;

#[test]
fn f16_and_bf16_conversions() {
    let n = 96;
    let h: Vec<u16> = (0..n as u16)
        .map(|i| i.wrapping_mul(683).wrapping_add(1))
        .collect();
    let mut f: Vec<f32> = (0..n).map(|i| (i as f32 - 40.0) * 0.37).collect();
    // Ties: exactly halfway between two f16 values round to the even one.
    f[0] = 1.0 + 1.0 / 2048.0; // 0x3c00 (even) not 0x3c01
    f[1] = 1.0 + 3.0 / 2048.0; // 0x3c02 (even) not 0x3c01
    f[2] = 70000.0; // overflows to +inf
    f[3] = 1e-8; // below the smallest subnormal
    let mut wts: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
    wts.extend(f32_bytes(&f));
    for d in DIALECTS {
        let (a, kv) = run(
            d,
            CONVERT,
            &[launch("k2_convert", [1, 1, 1], 32)],
            10 * n,
            4 * n,
            &wts,
            &ShimOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let hf = f32s(&a[..4 * n]);
        let bf = f32s(&a[6 * n..10 * n]);
        for i in 0..n {
            let want = half::f16::from_bits(h[i]).to_f32();
            assert!(
                hf[i] == want || (hf[i].is_nan() && want.is_nan()),
                "{d:?} f16 {:#x}: {} != {want}",
                h[i],
                hf[i]
            );
            let want = half::bf16::from_bits(h[i]).to_f32();
            assert!(
                bf[i] == want || (bf[i].is_nan() && want.is_nan()),
                "{d:?} bf16 {:#x}",
                h[i]
            );
            let got = u16::from_le_bytes([a[4 * n + 2 * i], a[4 * n + 2 * i + 1]]);
            assert_eq!(
                got,
                half::f16::from_f32(f[i]).to_bits(),
                "{d:?} f32 {}",
                f[i]
            );
            let got = u32::from_le_bytes([kv[4 * i], kv[4 * i + 1], kv[4 * i + 2], kv[4 * i + 3]]);
            assert_eq!(got, (-f[i]).to_bits(), "{d:?} bit casts");
        }
        assert_eq!(u16::from_le_bytes([a[4 * n], a[4 * n + 1]]), 0x3c00);
        assert_eq!(u16::from_le_bytes([a[4 * n + 2], a[4 * n + 3]]), 0x3c02);
    }
}

/// Every thread writes its slot of shared memory; thread 0 sums them without a barrier.
const FORGOTTEN_SYNC: &str = r#"
KERNEL(k3_racy, 64) {
    SHARED float s[64];
    s[TX] = (float)(TX + BX);
    if (TX == 0) {
        float t = 0.0f;
        for (i32 i = 0; i < 64; i++) t += s[i];
        ((GMEM float*)arena)[BX] = t;
    }
}
"#;

fn tsan() -> ShimOptions {
    ShimOptions {
        tsan: true,
        ..ShimOptions::default()
    }
}

#[test]
fn tsan_catches_a_forgotten_barrier() {
    for d in DIALECTS {
        let err = run(
            d,
            FORGOTTEN_SYNC,
            &[launch("k3_racy", [2, 1, 1], 64)],
            8,
            0,
            &[],
            &tsan(),
        )
        .expect_err("a race");
        let msg = err.to_string();
        eprintln!("{d:?}: {msg}");
        assert!(matches!(err, ShimError::Sanitizer(_)), "{d:?}: {msg}");
        assert!(msg.contains("data race"), "{d:?}: {msg}");
        assert!(msg.contains("k3_racy"), "{d:?}: {msg}");
        assert!(!msg.contains('\n'), "{d:?}: one line: {msg}");
    }
}

#[test]
fn tsan_passes_the_correct_reduction() {
    let blocks = 3;
    let x = reduce_input(blocks);
    let want: Vec<f32> = x.chunks(4096).map(|c| c.iter().sum()).collect();
    for d in DIALECTS {
        let (a, _) = run(
            d,
            REDUCE,
            &[launch("k0_sum", [blocks as u32, 1, 1], 128)],
            blocks * 4,
            0,
            &f32_bytes(&x),
            &tsan(),
        )
        .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        for (g, w) in f32s(&a).iter().zip(&want) {
            assert!(close(*g, *w, 1e-4), "{d:?}: {g} != {w}");
        }
    }
}

#[test]
fn os_threads_give_the_same_sums() {
    let blocks = 4;
    let x = reduce_input(blocks);
    let want: Vec<f32> = x.chunks(4096).map(|c| c.iter().sum()).collect();
    let opts = ShimOptions {
        os_threads: true,
        ..ShimOptions::default()
    };
    let (a, _) = run(
        Dialect::Metal,
        REDUCE,
        &[launch("k0_sum", [blocks as u32, 1, 1], 128)],
        blocks * 4,
        0,
        &f32_bytes(&x),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for (g, w) in f32s(&a).iter().zip(&want) {
        assert!(close(*g, *w, 1e-4), "{g} != {w}");
    }
}

#[test]
fn a_barrier_some_threads_skip_is_an_error() {
    let k = r#"
KERNEL(k4_diverge, 64) {
    if (TX < 32) SYNC();
    ((GMEM u32*)arena)[TX] = 1u;
}
"#;
    for d in DIALECTS {
        let err = run(
            d,
            k,
            &[launch("k4_diverge", [1, 1, 1], 64)],
            256,
            0,
            &[],
            &ShimOptions::default(),
        )
        .expect_err("divergent barrier");
        let msg = err.to_string();
        eprintln!("{d:?}: {msg}");
        assert!(matches!(err, ShimError::Run { .. }), "{d:?}: {msg}");
        assert!(
            msg.contains("k4_diverge") && msg.contains("barrier"),
            "{d:?}: {msg}"
        );
    }
}

#[test]
fn a_compile_error_is_readable() {
    let k = "KERNEL(k5_bad, 32) {\n    ((GMEM float*)arena)[TX] = no_such_thing;\n}\n";
    for d in DIALECTS {
        let err = run(
            d,
            k,
            &[launch("k5_bad", [1, 1, 1], 32)],
            128,
            0,
            &[],
            &ShimOptions::default(),
        )
        .expect_err("compile error");
        let msg = err.to_string();
        eprintln!("{d:?}: {msg}");
        assert!(matches!(err, ShimError::Compile { .. }), "{d:?}: {msg}");
        assert!(msg.contains("no_such_thing"), "{d:?}: {msg}");
        assert!(msg.contains("error:"), "{d:?}: {msg}");
        assert!(!msg.contains('\n'), "{d:?}: one line: {msg}");
    }
}

#[test]
fn launches_the_gpu_would_refuse_are_errors() {
    let bad = [
        launch("k0_sum", [1, 1, 1], 256), // more than KERNEL(k0_sum, 128)
        launch("k0_sum", [1, 1, 1], 100), // not whole warps
        launch("k0_sum", [0, 1, 1], 128), // empty grid
        launch("k0_sum(", [1, 1, 1], 128),
    ];
    for l in bad {
        let err = run(
            Dialect::Cuda,
            REDUCE,
            std::slice::from_ref(&l),
            16,
            0,
            &[],
            &ShimOptions::default(),
        )
        .expect_err("refused");
        assert!(matches!(err, ShimError::Launch { .. }), "{l:?}: {err}");
    }
}

/// A stand-in for a small model's step: 30 launches of 1024 blocks of 128 threads, each with
/// barriers and 5-step shuffle reductions. Prints the time; the target is well under 2 s.
#[test]
fn a_step_of_thirty_big_launches_is_fast() {
    let k = r#"
KERNEL(k6_norm, 128) {
    SHARED float part[4];
    GMEM float* x = (GMEM float*)arena + BX * 256;
    float v = x[TX] * x[TX] + x[TX + 128] * x[TX + 128];
    for (i32 m = 16; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    if ((TX & 31) == 0) part[TX >> 5] = v;
    SYNC();
    float s = part[0] + part[1] + part[2] + part[3];
    SYNC();
    float r = 1.0f / sqrtf(s / 256.0f + 1e-6f);
    x[TX] *= r;
    x[TX + 128] *= r;
}
"#;
    let rows = 1024;
    let x: Vec<f32> = (0..rows * 256).map(|i| (i % 13) as f32 - 6.0).collect();
    let launches = vec![launch("k6_norm", [rows as u32, 1, 1], 128); 30];
    for d in DIALECTS {
        let mut arena = f32_bytes(&x);
        let src = source(d, k);
        let opts = ShimOptions::default();
        // Compile (cached) first, then time a run.
        run_step(
            d,
            &src,
            &launches[..1],
            &mut arena.clone(),
            &mut [],
            &[],
            &opts,
        )
        .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let t = Instant::now();
        run_step(d, &src, &launches, &mut arena, &mut [], &[], &opts)
            .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let took = t.elapsed();
        eprintln!("{d:?}: 30 launches of 1024 x 128 threads in {took:?}");
        assert!(took < Duration::from_secs(10), "{d:?}: {took:?}");
        // After the first launch every row has mean square 1; later ones keep it.
        for row in f32s(&arena).chunks(256).take(4) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 256.0;
            assert!((ms - 1.0).abs() < 1e-3, "{d:?}: mean square {ms}");
        }
    }
}

#[test]
fn the_test_kernels_pass_the_metal_lint() {
    for k in [REDUCE, ELEMENTWISE, CONVERT, FORGOTTEN_SYNC] {
        assert_eq!(
            codegen_metal::lint(&source(Dialect::Metal, k)),
            Vec::<String>::new()
        );
    }
}

#[test]
fn asan_catches_an_access_past_the_arena() {
    // The last block writes one float past the arena's end.
    let k = r#"
KERNEL(k7_oob, 32) {
    GMEM float* y = (GMEM float*)arena;
    if (TX == 0) y[BX + (BX == 15 ? 1 : 0)] = 1.0f;
}
"#;
    let opts = ShimOptions {
        asan: true,
        ..ShimOptions::default()
    };
    for d in DIALECTS {
        let err = run(
            d,
            k,
            &[launch("k7_oob", [16, 1, 1], 32)],
            16 * 4,
            0,
            &[],
            &opts,
        )
        .expect_err("out of bounds");
        let msg = err.to_string();
        eprintln!("{d:?}: {msg}");
        assert!(matches!(err, ShimError::Sanitizer(_)), "{d:?}: {msg}");
        assert!(msg.contains("heap-buffer-overflow"), "{d:?}: {msg}");
        assert!(msg.contains("k7_oob"), "{d:?}: {msg}");
    }
    // In bounds, the same options run clean.
    let x = reduce_input(2);
    let (a, _) = run(
        Dialect::Cuda,
        REDUCE,
        &[launch("k0_sum", [2, 1, 1], 128)],
        8,
        0,
        &f32_bytes(&x),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let want: f32 = x[..4096].iter().sum();
    assert!(close(f32s(&a)[0], want, 1e-4));
}

#[test]
fn a_step_that_never_ends_times_out() {
    let k = r#"
KERNEL(k8_forever, 32) {
    GMEM volatile u32* y = (GMEM volatile u32*)arena;
    for (;;) y[TX] += 1u;
}
"#;
    let opts = ShimOptions {
        timeout: Duration::from_secs(1),
        ..ShimOptions::default()
    };
    let err = run(
        Dialect::Cuda,
        k,
        &[launch("k8_forever", [1, 1, 1], 32)],
        128,
        0,
        &[],
        &opts,
    )
    .expect_err("a timeout");
    assert!(matches!(err, ShimError::Timeout(_)), "{err}");
}
