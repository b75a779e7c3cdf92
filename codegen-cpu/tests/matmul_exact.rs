//! Every generated quantized matmul kernel (Q4_0, Q4_1, Q8_0) gives llama.cpp's x86 AVX2
//! numbers bit for bit: each output element equals [`ir::ggml::vec_dot_avx2`] (the
//! interpreter's `avx2_order`) of the weight row and the token's activations quantized as
//! llama.cpp does on x86 (`quantize_activations(.., Q8Flavor::X86)`), compared with
//! `to_bits`. Shapes: SmolLM2-135M's (q/o, k/v, gate/up, down, and the output matrix with
//! fewer rows) and ragged ones (`m` not a multiple of 4 or 8, `n` = 1, 3, 16, 64; tilings
//! with a block remainder); heavy cases sample rows in debug builds.

use codegen_cpu::{
    compile_matmul, compile_matmul_portable, compile_matmul_with, repack, MatmulSpec, SumOrder,
    ThreadPool, Tiling,
};
use ir::ggml::{quantize_activations, vec_dot_avx2, GgmlType, Q8Flavor};

mod matmul_data;
use matmul_data::{fill_quant_blocks, random_acts, Rng};

const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// Random GGML blocks of a `{k, m}` weight; Q8_0 quants include -128 (which ggml's quantizer
/// never writes, but a file may hold).
fn random_weight(t: GgmlType, k: usize, m: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = vec![0u8; t.row_size(k as u64).unwrap() as usize * m];
    fill_quant_blocks(t, &mut data, true, rng);
    data
}

/// Compiles the kernel of `t {k, m} x n` (default tiling, or `tiling`), runs it on random
/// inputs (over two threads when `threads`) and checks every element (or, for large shapes
/// in debug builds, a spread of rows plus the last ones) bit for bit.
fn check(t: GgmlType, k: usize, m: usize, n: usize, tiling: Option<Tiling>, threads: bool) {
    check_on(t, k, m, n, tiling, threads, false)
}

/// [`check`] of the kernel made of Cranelift's portable instructions (what aarch64 runs)
/// when `portable`.
fn check_on(
    t: GgmlType,
    k: usize,
    m: usize,
    n: usize,
    tiling: Option<Tiling>,
    threads: bool,
    portable: bool,
) {
    let mut rng = Rng((k * 7919 + m * 31 + n) as u64 ^ (t as u64) << 40 | 1);
    let spec = MatmulSpec { wtype: t, k, m, n };
    let kernel = match (tiling, portable) {
        (ti, true) => compile_matmul_portable(&spec, ti.unwrap_or(spec.default_tiling())).unwrap(),
        (Some(ti), false) => compile_matmul_with(&spec, ti).unwrap(),
        (None, false) => compile_matmul(&spec).unwrap(),
    };
    let wdata = random_weight(t, k, m, &mut rng);
    let w = repack(t, k, m, &wdata).unwrap();
    let x = random_acts(k, n, &mut rng);
    let mut act = vec![0u8; kernel.act_bytes()];
    kernel.prepare(&x, &mut act).unwrap();
    let mut out = vec![f32::NAN; m * n];
    if threads {
        let pool = ThreadPool::new(2).unwrap();
        kernel.run(&pool, &w, &act, &mut out).unwrap();
    } else {
        kernel.call(&w, &act, &mut out, 0..m).unwrap();
    }
    let rb = t.row_size(k as u64).unwrap() as usize;
    let budget = if cfg!(debug_assertions) {
        4 << 20
    } else {
        64 << 20
    };
    let step = (m * n * k / budget).max(1);
    for tok in 0..n {
        let (_, aq) = quantize_activations(t, &x[tok * k..(tok + 1) * k], Q8Flavor::X86).unwrap();
        for r in (0..m).filter(|r| r % step == tok % step || r + 8 >= m) {
            let want = vec_dot_avx2(t, &wdata[r * rb..(r + 1) * rb], &aq).unwrap();
            let got = out[tok * m + r];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{spec} tiling {:?}: row {r} token {tok}: kernel {got}, llama.cpp order {want}",
                kernel.tiling()
            );
        }
    }
}

#[test]
fn smollm2_shapes_bit_exact() {
    for t in TYPES {
        for (k, m) in [
            (576, 576),
            (576, 192),
            (576, 1536),
            (1536, 576),
            (576, 4100),
        ] {
            for n in [1, 3, 16, 64] {
                check(t, k, m, n, None, false);
            }
        }
    }
}

#[test]
fn ragged_shapes_tilings_and_threads_bit_exact() {
    let tilings = [
        Tiling {
            tokens: 1,
            unroll: 1,
            groups: 1,
            order: SumOrder::Ggml,
        },
        Tiling {
            tokens: 2,
            unroll: 3,
            groups: 2,
            order: SumOrder::Ggml,
        },
        Tiling {
            tokens: 4,
            unroll: 4,
            groups: 1,
            order: SumOrder::Ggml,
        },
    ];
    for t in TYPES {
        for (k, m) in [(32, 1), (160, 23), (96, 9), (1536, 14)] {
            for n in [1, 3, 16, 67] {
                check(t, k, m, n, None, false);
                check(t, k, m, n, None, true);
                for ti in tilings {
                    check(t, k, m, n, Some(ti), false);
                }
            }
        }
        // k large enough that the ubatch kernels decode the weights in every pass instead
        // of into their stack scratch
        for ti in tilings {
            check(t, 32 * 420, 8, 3, Some(ti), false);
        }
    }
}

/// The kernels made of Cranelift's portable instructions only (aarch64's; here on the test
/// machine's own ISA): the same numbers, bit for bit, for SmolLM2's shapes, ragged ones and
/// every tiling.
#[test]
fn portable_forms_bit_exact() {
    for t in TYPES {
        for (k, m) in [(576, 576), (1536, 576), (160, 23)] {
            for n in [1, 3, 16] {
                check_on(t, k, m, n, None, false, true);
            }
        }
        for tokens in [1, 2, 4] {
            let ti = Tiling {
                tokens,
                unroll: 3,
                groups: 1,
                order: SumOrder::Ggml,
            };
            check_on(t, 96, 9, 5, Some(ti), true, true);
        }
    }
}

/// The block-order kernels (`--kernels fast`) made of portable instructions give the host
/// kernels' numbers bit for bit (their order is not llama.cpp's, so the host kernel is the
/// reference here).
#[test]
fn portable_block_order_equals_host() {
    for t in TYPES {
        for (k, m, n, tokens, groups) in
            [(576, 64, 1, 1, 2), (160, 23, 7, 4, 1), (1536, 12, 3, 2, 3)]
        {
            let mut rng = Rng((k * 31 + m) as u64 ^ (t as u64) << 32 | 1);
            let spec = MatmulSpec { wtype: t, k, m, n };
            let ti = Tiling {
                tokens,
                unroll: 2,
                groups,
                order: SumOrder::Block,
            };
            let host = compile_matmul_with(&spec, ti).unwrap();
            let portable = compile_matmul_portable(&spec, ti).unwrap();
            let w = repack(t, k, m, &random_weight(t, k, m, &mut rng)).unwrap();
            let x = random_acts(k, n, &mut rng);
            let mut act = vec![0u8; host.act_bytes()];
            host.prepare(&x, &mut act).unwrap();
            let run = |kernel: &codegen_cpu::MatmulKernel| {
                let mut out = vec![f32::NAN; m * n];
                kernel.call(&w, &act, &mut out, 0..m).unwrap();
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(&host), run(&portable), "{spec} {ti:?}");
        }
    }
}
