//! Every generated matmul kernel against ggml's arithmetic on random inputs of SmolLM2-135M's
//! real shapes.
//!
//! Two oracles:
//! - `ir::ggml` (the interpreter's reference): activations quantized as llama.cpp on x86
//!   (`quantize_activations(.., Q8Flavor::X86)`), then ggml's scalar `vec_dot` per row;
//! - a private integer-exact formula in this file: per block the exact integer sum and the
//!   magnitude `Σ|terms|`, which sets the tolerance: |kernel − reference| ≤ 1e-5 · Σ|terms|
//!   (float kernels add in their own order; the integer sums are exact).
//!
//! Quantized kernels must moreover equal `ir::ggml::vec_dot_avx2` (llama.cpp's x86 order)
//! bit for bit (see also `matmul_exact.rs`).

use codegen_cpu::actq::{act_quant, quantize_act, ACT_AUX_OFFSET, ACT_BLOCK_BYTES};
use codegen_cpu::formats::QuantFormat;
use codegen_cpu::{
    compile_matmul, compile_matmul_with, repack, MatmulSpec, SumOrder, ThreadPool, Tiling,
};
use ir::ggml::{
    f16_to_f32, f32_to_bf16, f32_to_f16, quantize_activations, vec_dot, vec_dot_avx2, GgmlType,
    Q8Flavor,
};

/// SmolLM2-135M's matmul shapes `(k, m)`: q/o, k/v, gate/up, down.
mod matmul_data;
use matmul_data::{fill_quant_blocks, random_acts, Rng};

const SHAPES: [(usize, usize); 4] = [(576, 576), (576, 192), (576, 1536), (1536, 576)];
const NS: [usize; 3] = [1, 3, 64];

/// Random GGML tensor data for a `{k, m}` weight of type `t`, with realistic scales.
fn random_weight(t: GgmlType, k: usize, m: usize, rng: &mut Rng) -> Vec<u8> {
    let row = t.row_size(k as u64).unwrap() as usize;
    let mut data = vec![0u8; row * m];
    match t {
        GgmlType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.range(-0.2, 0.2).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_f16(rng.range(-0.2, 0.2)).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_bf16(rng.range(-0.2, 0.2)).to_le_bytes());
            }
        }
        _ => fill_quant_blocks(t, &mut data, false, rng),
    }
    data
}

/// `(value, magnitude)` of one output element from ggml blocks, with exact integer sums.
fn exact_dot(t: GgmlType, w_row: &[u8], act_row: &[u8], x: &[f32]) -> (f64, f64) {
    match QuantFormat::of(t) {
        Some(fmt) => {
            let ab = if fmt.has_min { 36 } else { 34 };
            let aqs = if fmt.has_min { 4 } else { 2 };
            let mut val = 0.0f64;
            let mut mag = 0.0f64;
            for (wb, ablk) in w_row
                .chunks_exact(t.type_size())
                .zip(act_row.chunks_exact(ab))
            {
                let dw = f16_to_f32(u16::from_le_bytes([wb[0], wb[1]])) as f64;
                let da = f16_to_f32(u16::from_le_bytes([ablk[0], ablk[1]])) as f64;
                let mut sumi: i64 = 0;
                let mut sumabs: i64 = 0;
                for j in 0..32 {
                    let qw: i64 = match fmt.bits {
                        4 => {
                            let byte = wb[fmt.src_qs_offset() + j % 16];
                            let q = if j < 16 { byte & 15 } else { byte >> 4 };
                            q as i64 - fmt.zero_point as i64
                        }
                        _ => wb[2 + j] as i8 as i64,
                    };
                    let qa = ablk[aqs + j] as i8 as i64;
                    sumi += qw * qa;
                    sumabs += (qw * qa).abs();
                }
                val += dw * da * sumi as f64;
                mag += (dw * da).abs() * sumabs as f64;
                if fmt.has_min {
                    let mw = f16_to_f32(u16::from_le_bytes([wb[2], wb[3]])) as f64;
                    let sa = f16_to_f32(u16::from_le_bytes([ablk[2], ablk[3]])) as f64;
                    val += mw * sa;
                    mag += (mw * sa).abs();
                }
            }
            (val, mag)
        }
        None => {
            let es = t.type_size();
            let mut val = 0.0f64;
            let mut mag = 0.0f64;
            for (e, &xv) in w_row.chunks_exact(es).zip(x) {
                let w = match t {
                    GgmlType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                    GgmlType::F16 => f16_to_f32(u16::from_le_bytes([e[0], e[1]])),
                    _ => ir::ggml::bf16_to_f32(u16::from_le_bytes([e[0], e[1]])),
                } as f64;
                let a = match t {
                    GgmlType::F16 => f16_to_f32(f32_to_f16(xv)),
                    GgmlType::BF16 => ir::ggml::bf16_to_f32(f32_to_bf16(xv)),
                    _ => xv,
                } as f64;
                val += w * a;
                mag += (w * a).abs();
            }
            (val, mag)
        }
    }
}

/// Compiles, runs and checks one shape; `rows_checked` limits the reference work on huge `m`.
fn check(t: GgmlType, k: usize, m: usize, n: usize, tiling: Option<Tiling>, seed: u64) {
    let mut rng = Rng(seed | 1);
    let spec = MatmulSpec { wtype: t, k, m, n };
    let kernel = match tiling {
        Some(ti) => compile_matmul_with(&spec, ti).unwrap(),
        None => compile_matmul(&spec).unwrap(),
    };
    let wdata = random_weight(t, k, m, &mut rng);
    let w = repack(t, k, m, &wdata).unwrap();
    let x = random_acts(k, n, &mut rng);
    let mut act = vec![0u8; kernel.act_bytes()];
    kernel.prepare(&x, &mut act).unwrap();
    let mut out = vec![f32::NAN; m * n];
    kernel.call(&w, &act, &mut out, 0..m).unwrap();

    let row_bytes = t.row_size(k as u64).unwrap() as usize;
    // Check every row unless that is a lot of scalar work; then a spread-out subset plus the
    // last rows.
    let step = ((m * n * k) / (40 << 20)).max(1);
    for tok in 0..n {
        let xt = &x[tok * k..(tok + 1) * k];
        let (_, aq) = quantize_activations(t, xt, Q8Flavor::X86).unwrap();
        for r in (0..m).filter(|r| r % step == tok % step || *r + 4 >= m) {
            let w_row = &wdata[r * row_bytes..(r + 1) * row_bytes];
            let (exact, mag) = exact_dot(t, w_row, &aq, xt);
            let ggml = vec_dot(t, w_row, &aq).unwrap() as f64;
            let got = out[tok * m + r] as f64;
            if QuantFormat::of(t).is_some() && kernel.tiling().order == SumOrder::Ggml {
                // quantized kernels: llama.cpp's x86 AVX2 order, bit for bit
                let want = vec_dot_avx2(t, w_row, &aq).unwrap();
                assert_eq!(
                    out[tok * m + r].to_bits(),
                    want.to_bits(),
                    "{spec} tiling {:?}: row {r} token {tok}: kernel {got}, llama.cpp order {want}",
                    kernel.tiling()
                );
            }
            let tol = 1e-5 * mag + 1e-30;
            assert!(
                (got - exact).abs() <= tol && (ggml - exact).abs() <= tol,
                "{spec} tiling {:?}: row {r} token {tok}: kernel {got}, exact {exact}, ggml {ggml}, tol {tol}",
                kernel.tiling()
            );
        }
    }
}

/// The block-order kernels ([`SumOrder::Block`]) at SmolLM2's shapes, within rounding of
/// the exact result.
#[test]
fn block_order_smollm2_shapes() {
    for t in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for (i, &(k, m)) in SHAPES.iter().enumerate() {
            for &n in &NS {
                let spec = MatmulSpec { wtype: t, k, m, n };
                let ti = spec.tiling_for(SumOrder::Block);
                check(t, k, m, n, Some(ti), 31 + i as u64 * 5 + n as u64);
            }
        }
    }
}

#[test]
fn q4_1_smollm2_shapes() {
    for (i, &(k, m)) in SHAPES.iter().enumerate() {
        for &n in &NS {
            check(GgmlType::Q4_1, k, m, n, None, 11 + i as u64 * 7 + n as u64);
        }
    }
}

#[test]
fn q4_0_smollm2_shapes() {
    for (i, &(k, m)) in SHAPES.iter().enumerate() {
        for &n in &NS {
            check(GgmlType::Q4_0, k, m, n, None, 101 + i as u64 * 7 + n as u64);
        }
    }
}

#[test]
fn q8_0_smollm2_shapes_and_output() {
    for (i, &(k, m)) in SHAPES.iter().enumerate() {
        for &n in &NS {
            check(GgmlType::Q8_0, k, m, n, None, 201 + i as u64 * 7 + n as u64);
        }
    }
    // token_embd / output: {576, 49152}
    for &n in &NS {
        check(GgmlType::Q8_0, 576, 49152, n, None, 301 + n as u64);
    }
}

#[test]
fn float_smollm2_shapes() {
    for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (i, &(k, m)) in SHAPES.iter().enumerate() {
            for &n in &NS {
                check(
                    t,
                    k,
                    m,
                    n,
                    None,
                    401 + i as u64 * 7 + n as u64 + t.id() as u64,
                );
            }
        }
    }
}

#[test]
fn other_tilings_and_ragged_shapes() {
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
            tokens: 3,
            unroll: 2,
            groups: 3,
            order: SumOrder::Ggml,
        },
        Tiling {
            tokens: 6,
            unroll: 1,
            groups: 1,
            order: SumOrder::Ggml,
        },
        Tiling {
            tokens: 1,
            unroll: 2,
            groups: 4,
            order: SumOrder::Ggml,
        },
    ];
    for t in [
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::F32,
    ] {
        for (j, ti) in tilings.iter().enumerate() {
            for order in [SumOrder::Ggml, SumOrder::Block] {
                let ti = Tiling { order, ..*ti };
                // m not a multiple of 4 (padded last group), n not a multiple of the tile
                check(t, 160, 23, 7, Some(ti), 500 + j as u64 + t.id() as u64);
                check(t, 32, 4, 1, Some(ti), 600 + j as u64 + t.id() as u64);
            }
        }
    }
    // many tokens at a large k: the kernels cut the tokens into chunks (with a remainder
    // that is not a whole number of tiles)
    for t in [GgmlType::Q4_1, GgmlType::Q8_0] {
        check(t, 1536, 8, 67, None, 900 + t.id() as u64);
    }
    // float weights take any k, including k not a multiple of 4 or of the unroll
    for (j, ti) in tilings.iter().enumerate() {
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            check(t, 7, 5, 3, Some(*ti), 700 + j as u64 + t.id() as u64);
            check(t, 13, 8, 1, Some(*ti), 800 + j as u64 + t.id() as u64);
        }
    }
}

#[test]
fn activation_quantizer_matches_ggml_x86() {
    let mut rng = Rng(77);
    let k = 1536;
    let x = random_acts(k, 1, &mut rng);
    for t in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let fmt = QuantFormat::of(t).unwrap();
        let mut ours = vec![0u8; k / 32 * ACT_BLOCK_BYTES];
        quantize_act(&fmt, k, 1, &x, &mut ours).unwrap();
        let (at, theirs) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
        let (tb, qoff) = (at.type_size(), if fmt.has_min { 4 } else { 2 });
        for (b, (o, g)) in ours
            .chunks_exact(ACT_BLOCK_BYTES)
            .zip(theirs.chunks_exact(tb))
            .enumerate()
        {
            let d = f16_to_f32(u16::from_le_bytes([g[0], g[1]]));
            assert_eq!(
                f32::from_le_bytes(o[0..4].try_into().unwrap()),
                d,
                "{t} block {b} d"
            );
            if fmt.has_min {
                let s = f16_to_f32(u16::from_le_bytes([g[2], g[3]]));
                let at = ACT_AUX_OFFSET;
                assert_eq!(
                    f32::from_le_bytes(o[at..at + 4].try_into().unwrap()),
                    s,
                    "{t} block {b} s"
                );
            }
            for j in 0..32 {
                assert_eq!(act_quant(o, j), g[qoff + j] as i8, "{t} block {b} q{j}");
            }
        }
    }
}

#[test]
fn generated_quantizer_matches_reference_bitwise() {
    let mut rng = Rng(4242);
    let k = 32 * 12;
    let n = 3;
    let mut x = random_acts(k, n, &mut rng);
    // special blocks: zeros; f16-subnormal scale; scale beyond f16 (inf); exact ties;
    // one huge outlier; negative-only; scale just under the largest f16
    for v in &mut x[0..32] {
        *v = 0.0;
    }
    for (j, v) in x[32..64].iter_mut().enumerate() {
        *v = (j as f32 - 16.0) * 3e-6;
    }
    for (j, v) in x[64..96].iter_mut().enumerate() {
        *v = (j as f32 - 10.0) * 1e6;
    }
    for (j, v) in x[96..128].iter_mut().enumerate() {
        *v = if j == 0 { 127.0 } else { j as f32 - 15.5 };
    }
    x[140] = 3e4;
    for v in &mut x[160..192] {
        *v = -v.abs() - 0.25;
    }
    for (j, v) in x[192..224].iter_mut().enumerate() {
        *v = if j == 3 { -65500.0 * 127.0 } else { j as f32 };
    }
    for t in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let fmt = QuantFormat::of(t).unwrap();
        let kernel = compile_matmul(&MatmulSpec {
            wtype: t,
            k,
            m: 4,
            n,
        })
        .unwrap();
        let mut jit_act = vec![0xEEu8; kernel.act_bytes()];
        kernel.prepare(&x, &mut jit_act).unwrap();
        let mut ref_act = vec![0u8; kernel.act_bytes()];
        quantize_act(&fmt, k, n, &x, &mut ref_act).unwrap();
        for (b, (j, r)) in jit_act
            .chunks(ACT_BLOCK_BYTES)
            .zip(ref_act.chunks(ACT_BLOCK_BYTES))
            .enumerate()
        {
            assert_eq!(j, r, "{t}: block {b} differs");
        }
        // a token sub-range leaves the other tokens alone
        let mut part = vec![0u8; kernel.act_bytes()];
        kernel.prepare_tokens(&x, &mut part, 1..2).unwrap();
        let arb = kernel.act_bytes() / n;
        assert!(part[..arb].iter().all(|&b| b == 0));
        assert_eq!(&part[arb..2 * arb], &ref_act[arb..2 * arb]);
        assert!(part[2 * arb..].iter().all(|&b| b == 0));
    }
}

#[test]
fn threaded_run_matches_single_thread_bitwise() {
    let mut rng = Rng(999);
    for (t, k, m, n) in [
        (GgmlType::Q4_1, 576, 1536, 1),
        (GgmlType::Q8_0, 576, 578, 3),
    ] {
        let spec = MatmulSpec { wtype: t, k, m, n };
        let kernel = compile_matmul(&spec).unwrap();
        let w = repack(t, k, m, &random_weight(t, k, m, &mut rng)).unwrap();
        let x = random_acts(k, n, &mut rng);
        let mut act = vec![0u8; kernel.act_bytes()];
        kernel.prepare(&x, &mut act).unwrap();
        let mut one = vec![0.0; m * n];
        kernel.call(&w, &act, &mut one, 0..m).unwrap();
        for threads in [2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            let mut many = vec![f32::NAN; m * n];
            kernel.run(&pool, &w, &act, &mut many).unwrap();
            assert!(one
                .iter()
                .zip(&many)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn bad_calls_are_errors() {
    let spec = MatmulSpec {
        wtype: GgmlType::Q4_1,
        k: 64,
        m: 8,
        n: 2,
    };
    let kernel = compile_matmul(&spec).unwrap();
    let mut rng = Rng(5);
    let w = repack(
        GgmlType::Q4_1,
        64,
        8,
        &random_weight(GgmlType::Q4_1, 64, 8, &mut rng),
    )
    .unwrap();
    let w_other = repack(
        GgmlType::Q4_1,
        64,
        4,
        &random_weight(GgmlType::Q4_1, 64, 4, &mut rng),
    )
    .unwrap();
    let act = vec![0u8; kernel.act_bytes()];
    let mut out = vec![0.0; 16];
    assert!(kernel.call(&w, &act[1..], &mut out, 0..8).is_err());
    assert!(kernel.call(&w, &act, &mut out[1..], 0..8).is_err());
    assert!(kernel.call(&w_other, &act, &mut out, 0..4).is_err());
    assert!(kernel.call(&w, &act, &mut out, 2..8).is_err());
    assert!(kernel.call(&w, &act, &mut out, 0..9).is_err());
    assert!(kernel.call(&w, &act, &mut out, 4..8).is_ok());
    assert!(compile_matmul(&MatmulSpec {
        wtype: GgmlType::Q6_K,
        k: 256,
        m: 4,
        n: 1
    })
    .is_err());
    assert!(compile_matmul(&MatmulSpec {
        wtype: GgmlType::Q4_0,
        k: 48,
        m: 4,
        n: 1
    })
    .is_err());
    assert!(compile_matmul(&MatmulSpec {
        wtype: GgmlType::F32,
        k: 4,
        m: 0,
        n: 1
    })
    .is_err());
}
