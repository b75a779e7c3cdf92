//! The GGML block formats: descriptions, dequantizer, activation quantizers, dot products.
//!
//! - every pair in `shared/fixtures/dequant/` (llama.cpp / gguf-py output) is reproduced bit
//!   for bit, by the fast dequantizer and by the description's interpreter;
//! - the fast dequantizer equals the description on random blocks of every format;
//! - every description is consistent with the type table and covers its block exactly;
//! - the activation quantizers match ggml on cases computed independently (an f32 emulation
//!   of ggml's C code), and round-trip within their rounding error;
//! - every dot product equals the dot of the dequantized rows within f32 summation error.

use ir::ggml::{
    block_format, block_formats, dequantize, f16_to_f32, f32_to_f16, quantize, quantize_q8_0,
    quantize_q8_0_with, quantize_q8_1_with, quantize_q8_k, vec_dot, vec_dot_f32, vec_dot_type,
    BlockDataError, BlockFormat, Decode, FieldKind, GgmlType, IntCode, MinTerm, Q8Flavor,
    ScalarKind,
};
use std::collections::HashMap;

/// A small deterministic generator (splitmix64) so the tests need no dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

const DESCRIBED: [GgmlType; 27] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::MXFP4,
];

/// `n_blocks` random blocks of `fmt`: random bytes, with every f16/f32 scale-like field set
/// to a finite value of magnitude 2^-10 .. 1 (random bytes would give NaN and infinity), and
/// every E8M0 exponent to a scale of 2^-10 .. 2.
fn random_blocks(fmt: &BlockFormat, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = rng.bytes(n_blocks * fmt.type_size);
    for block in data.chunks_exact_mut(fmt.type_size) {
        for f in fmt.fields {
            let kind = match f.kind {
                FieldKind::Value(k)
                | FieldKind::Scale(k)
                | FieldKind::Min(k)
                | FieldKind::MinScale(k)
                | FieldKind::Sum(k) => k,
                FieldKind::E8M0Scale => {
                    // 2^-10 .. 2^1: the values' scale stays moderate.
                    block[f.offset] = 118 + (rng.next_u64() % 12) as u8;
                    continue;
                }
                _ => continue,
            };
            let v = rng.unit() * 2f32.powi(-((rng.next_u64() % 11) as i32));
            let bytes = match kind {
                ScalarKind::F32 => v.to_le_bytes().to_vec(),
                ScalarKind::F16 => f32_to_f16(v).to_le_bytes().to_vec(),
                ScalarKind::BF16 => ir::ggml::f32_to_bf16(v).to_le_bytes().to_vec(),
            };
            block[f.offset..f.offset + bytes.len()].copy_from_slice(&bytes);
        }
    }
    data
}

/// One pair of `shared/fixtures/dequant/`.
struct DequantFixture {
    ty: GgmlType,
    /// The blocks, as stored in the GGUF file.
    bin: Vec<u8>,
    /// What llama.cpp / gguf-py dequantize them to.
    expected: Vec<f32>,
}

/// The fixture pairs of `shared/fixtures/dequant/`, or `None` (a recorded skip) if absent.
fn dequant_fixtures() -> Option<Vec<DequantFixture>> {
    let dir = modelc_tests::shared("fixtures/dequant")?;
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("read index.json"))
            .expect("parse index.json");
    let vectors = index["vectors"].as_array().expect("vectors array");
    let mut out = Vec::new();
    for v in vectors {
        let name = v["type"].as_str().expect("type");
        let ty = GgmlType::from_name(name).expect("known type");
        assert_eq!(v["ggml_type_id"].as_u64(), Some(ty.id() as u64), "{name}");
        assert_eq!(
            v["block_size"].as_u64(),
            Some(ty.block_size() as u64),
            "{name}"
        );
        assert_eq!(
            v["type_size"].as_u64(),
            Some(ty.type_size() as u64),
            "{name}"
        );
        let bin = std::fs::read(dir.join(v["bin"].as_str().expect("bin"))).expect("read bin");
        let f32s = std::fs::read(dir.join(v["f32"].as_str().expect("f32"))).expect("read f32");
        let expected: Vec<f32> = f32s
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(
            v["n_values"].as_u64(),
            Some(expected.len() as u64),
            "{name}"
        );
        out.push(DequantFixture { ty, bin, expected });
    }
    Some(out)
}

#[test]
fn fixtures_dequantize_bit_exact() {
    let Some(fixtures) = dequant_fixtures() else {
        return;
    };
    assert!(fixtures.len() >= 14, "expected 14 fixture types");
    for DequantFixture { ty, bin, expected } in &fixtures {
        let mut got = vec![0f32; expected.len()];
        dequantize(*ty, bin, &mut got).expect("dequantize");
        let fmt = block_format(*ty).expect("described");
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{ty} value {i}: {g} vs {e}");
            let block = &bin[(i / ty.block_size()) * ty.type_size()..][..ty.type_size()];
            let by_recipe = fmt
                .decode_value(block, i % ty.block_size())
                .expect("decodable");
            assert_eq!(
                by_recipe.to_bits(),
                e.to_bits(),
                "{ty} value {i} by description"
            );
        }
    }
}

#[test]
fn fast_dequantizer_equals_description_on_random_blocks() {
    let mut rng = Rng(0x5eed_0001);
    for fmt in block_formats() {
        let n_blocks = if fmt.block_size == 1 { 512 } else { 24 };
        let data = random_blocks(fmt, n_blocks, &mut rng);
        let mut fast = vec![0f32; n_blocks * fmt.block_size];
        dequantize(fmt.ty, &data, &mut fast).expect("dequantize");
        for (i, y) in fast.iter().enumerate() {
            let block = &data[(i / fmt.block_size) * fmt.type_size..][..fmt.type_size];
            let r = fmt
                .decode_value(block, i % fmt.block_size)
                .expect("decodable");
            assert_eq!(y.to_bits(), r.to_bits(), "{} value {i}: {y} vs {r}", fmt.ty);
        }
    }
}

/// Every (byte, bit) of field `name` read by `code` for value `i`.
fn bits_read(fmt: &BlockFormat, code: &IntCode, name: &str, i: usize) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for p in code.pieces.iter().filter(|p| p.field == name) {
        if i < p.values.0 || i >= p.values.1 {
            continue;
        }
        let (byte, shift) = (p.byte.eval(i), p.shift.eval(i) as u32);
        let f = fmt.field(p.field).expect("field exists");
        assert!(
            byte < f.size,
            "{} {name}: value {i} reads byte {byte}",
            fmt.ty
        );
        assert!(
            shift + p.width as u32 <= 8,
            "{} {name}: bits past the byte",
            fmt.ty
        );
        out.extend((0..p.width as u32).map(|b| (byte, shift + b)));
    }
    out
}

#[test]
fn descriptions_are_consistent_with_the_type_table() {
    let described: Vec<GgmlType> = block_formats().iter().map(|f| f.ty).collect();
    let mut want = DESCRIBED.to_vec();
    want.sort();
    assert_eq!(described, want, "described types, in id order");
    for &t in GgmlType::ALL {
        assert_eq!(block_format(t).is_some(), DESCRIBED.contains(&t), "{t}");
    }

    for fmt in block_formats() {
        let ty = fmt.ty;
        assert_eq!(fmt.block_size, ty.block_size(), "{ty} block size");
        assert_eq!(fmt.type_size, ty.type_size(), "{ty} type size");
        // Fields tile the block exactly, in offset order, with unique names.
        let mut at = 0;
        for f in fmt.fields {
            assert_eq!(f.offset, at, "{ty}.{} offset", f.name);
            assert!(f.size > 0, "{ty}.{} empty", f.name);
            at += f.size;
            assert_eq!(
                fmt.fields.iter().filter(|g| g.name == f.name).count(),
                1,
                "{ty}.{} duplicated",
                f.name
            );
            match f.kind {
                FieldKind::Value(k)
                | FieldKind::Scale(k)
                | FieldKind::Min(k)
                | FieldKind::MinScale(k)
                | FieldKind::Sum(k) => assert_eq!(f.size, k.size(), "{ty}.{}", f.name),
                FieldKind::Quants { bits } | FieldKind::HighBits { bits } => {
                    assert_eq!(
                        f.size * 8,
                        bits as usize * fmt.block_size,
                        "{ty}.{}",
                        f.name
                    )
                }
                FieldKind::BlockSums => assert_eq!(f.size, 2 * fmt.block_size / 16),
                FieldKind::SubScales(_)
                | FieldKind::Ternary { .. }
                | FieldKind::GridIndex { .. }
                | FieldKind::ScalesAndSigns
                | FieldKind::SignBits
                | FieldKind::GridIndexScalesSigns
                | FieldKind::GridIndexSigns
                | FieldKind::GridHighScaleDelta
                | FieldKind::GridHighDelta
                | FieldKind::ScalesAndScale
                | FieldKind::E8M0Scale => {}
            }
        }
        assert_eq!(at, fmt.type_size, "{ty} fields cover the block");

        let r = match fmt.decode {
            Decode::Scalar(k) => {
                assert_eq!(fmt.block_size, 1, "{ty}");
                assert_eq!(fmt.fields.len(), 1, "{ty}");
                assert_eq!(fmt.fields[0].kind, FieldKind::Value(k), "{ty}");
                continue;
            }
            Decode::Quantized(r) => r,
            Decode::Routine => {
                // Ternary digits: the fields hold exactly one digit per value.
                let digits: usize = fmt
                    .fields
                    .iter()
                    .map(|f| match f.kind {
                        FieldKind::Ternary { per_byte } => f.size * per_byte as usize,
                        _ => 0,
                    })
                    .sum();
                if digits > 0 {
                    assert_eq!(digits, fmt.block_size, "{ty} digits");
                }
                continue;
            }
        };
        assert!(
            matches!(fmt.field(r.d).map(|f| f.kind), Some(FieldKind::Scale(_))),
            "{ty} d"
        );
        let mut codes: Vec<&IntCode> = vec![&r.quant];
        codes.extend(r.sub_scale.as_ref());
        match &r.min {
            MinTerm::None => {}
            MinTerm::Add { m } => {
                assert!(
                    matches!(fmt.field(m).map(|f| f.kind), Some(FieldKind::Min(_))),
                    "{ty}"
                )
            }
            MinTerm::SubtractScaled { dmin, min } => {
                assert!(
                    matches!(
                        fmt.field(dmin).map(|f| f.kind),
                        Some(FieldKind::MinScale(_))
                    ),
                    "{ty}"
                );
                codes.push(min);
            }
        }
        for c in &codes {
            for p in c.pieces {
                assert!(fmt.field(p.field).is_some(), "{ty}: no field {}", p.field);
            }
        }

        // Every quant bit is read by exactly one value, and each value reads `bits` bits of
        // each of its quant fields.
        for f in fmt.fields {
            let bits = match f.kind {
                FieldKind::Quants { bits } | FieldKind::HighBits { bits } => bits as usize,
                _ => continue,
            };
            let mut seen = vec![0u32; f.size * 8];
            for i in 0..fmt.block_size {
                let read = bits_read(fmt, &r.quant, f.name, i);
                assert_eq!(read.len(), bits, "{ty}.{}: value {i}", f.name);
                for (byte, bit) in read {
                    seen[byte * 8 + bit as usize] += 1;
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "{ty}.{}: bits not read once",
                f.name
            );
        }

        // Every bit of the sub-scale fields is used, and values of one sub-block share it.
        for f in fmt.fields {
            if !matches!(f.kind, FieldKind::SubScales(_)) {
                continue;
            }
            let mut seen = vec![false; f.size * 8];
            for c in &codes[1..] {
                for i in 0..fmt.block_size {
                    for (byte, bit) in bits_read(fmt, c, f.name, i) {
                        seen[byte * 8 + bit as usize] = true;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "{ty}.{}: unused bits", f.name);
        }
    }
}

#[test]
fn q8_0_quantizers_match_ggml_flavors() {
    // One block where ggml's three Q8_0 quantizers disagree. Expected values come from an
    // independent emulation of the C code in f32 (x86: id = 127/amax, ties to even;
    // Arm: id = 1/d, ties to even; reference: id = 1/d, roundf).
    let amax = f32::from_bits(0x3f85_42c4);
    let mut x = [0f32; 32];
    x[0] = amax;
    x[1] = f32::from_bits(0x3c49_7714);
    x[2] = f32::from_bits(0x3ca7_e33c);
    x[3] = f32::from_bits(0x3ceb_0aed);
    x[4] = f32::from_bits(0xbf05_42c4); // -amax / 2
    let cases: [(Q8Flavor, [i8; 5], u16); 3] = [
        (Q8Flavor::Reference, [127, 1, 3, 3, -63], 0x38a8),
        (Q8Flavor::Arm, [127, 1, 2, 3, -63], 0x3897),
        (Q8Flavor::X86, [127, 2, 3, 4, -64], 0x38b9),
    ];
    for (flavor, qs, s_bits) in cases {
        let mut b = [0u8; 34];
        quantize_q8_0_with(&x, &mut b, flavor).expect("q8_0");
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x2032, "{flavor:?} d");
        let got: Vec<i8> = b[2..7].iter().map(|&q| q as i8).collect();
        assert_eq!(got, qs, "{flavor:?}");
        assert!(b[7..].iter().all(|&q| q == 0), "{flavor:?} zeros");

        let mut b1 = [0u8; 36];
        quantize_q8_1_with(&x, &mut b1, flavor).expect("q8_1");
        assert_eq!(u16::from_le_bytes([b1[0], b1[1]]), 0x2032, "{flavor:?} d");
        assert_eq!(u16::from_le_bytes([b1[2], b1[3]]), s_bits, "{flavor:?} s");
        assert_eq!(&b1[4..], &b[2..], "{flavor:?} q8_1 quants equal q8_0's");
    }

    // d = 1 exactly: ties show roundf (away from zero) against ties to even.
    let mut x = [0f32; 32];
    x[..6].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -0.5, 63.5]);
    let mut b = [0u8; 34];
    quantize_q8_0(&x, &mut b).expect("q8_0");
    assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x3c00);
    let got: Vec<i8> = b[2..8].iter().map(|&q| q as i8).collect();
    assert_eq!(got, [127, 3, -3, 1, -1, 64]);
    quantize_q8_0_with(&x, &mut b, Q8Flavor::X86).expect("q8_0");
    let got: Vec<i8> = b[2..8].iter().map(|&q| q as i8).collect();
    assert_eq!(got, [127, 2, -2, 0, 0, 64]);

    // An all-zero block: d = 0 and zero quants, no NaN.
    quantize_q8_0(&[0.0; 32], &mut b).expect("q8_0");
    assert!(b.iter().all(|&v| v == 0));
}

#[test]
fn q8_k_quantizer_matches_ggml() {
    // max = +127 (largest magnitude, positive): iscale = -1, so d = -1 and the quants are
    // the negated values, rounded half to even.
    let mut x = [0f32; 256];
    x[..5].copy_from_slice(&[127.0, 2.5, -3.5, 0.5, -126.5]);
    x[16] = 7.0;
    let mut b = vec![0xffu8; 292];
    quantize_q8_k(&x, &mut b).expect("q8_k");
    assert_eq!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), -1.0);
    let qs: Vec<i8> = b[4..9].iter().map(|&q| q as i8).collect();
    assert_eq!(qs, [-127, -2, 4, 0, 126]);
    assert_eq!(b[4 + 16] as i8, -7);
    let bsums: Vec<i16> = b[260..]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(bsums[0], 1);
    assert_eq!(bsums[1], -7);
    assert!(bsums[2..].iter().all(|&s| s == 0));

    // max = -63.5: iscale = 2, d = 0.5; 10.25 * 2 = 20.5 rounds to 20.
    let mut x = [0f32; 256];
    x[0] = -63.5;
    x[1] = 10.25;
    quantize_q8_k(&x, &mut b).expect("q8_k");
    assert_eq!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 0.5);
    assert_eq!((b[4] as i8, b[5] as i8), (-127, 20));

    // All zero: d = 0, everything zero.
    quantize_q8_k(&[0.0; 256], &mut b).expect("q8_k");
    assert!(b.iter().all(|&v| v == 0));
}

#[test]
fn activation_quantizers_round_trip() {
    let mut rng = Rng(0x5eed_0002);
    let x: Vec<f32> = (0..1024)
        .map(|i| rng.unit() * if i % 97 == 0 { 20.0 } else { 1.5 })
        .collect();
    for flavor in [Q8Flavor::Reference, Q8Flavor::X86, Q8Flavor::Arm] {
        for t in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            let mut q = vec![0u8; x.len() / t.block_size() * t.type_size()];
            quantize(t, &x, &mut q, flavor).expect("quantize");
            let mut y = vec![0f32; x.len()];
            dequantize(t, &q, &mut y).expect("dequantize");
            for (blk, (xb, yb)) in x
                .chunks(t.block_size())
                .zip(y.chunks(t.block_size()))
                .enumerate()
            {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Half a step of d = amax / 127, plus (Q8_0/Q8_1) the f16 rounding of d
                // applied to up to 127 steps.
                let step = amax / 127.0;
                let bound = if t == GgmlType::Q8_K {
                    step * 0.5 * (1.0 + 1e-4)
                } else {
                    step * (0.5 + 127.0 * 2f32.powi(-11)) * (1.0 + 1e-4)
                };
                for (a, b) in xb.iter().zip(yb) {
                    assert!(
                        (a - b).abs() <= bound,
                        "{t} {flavor:?} block {blk}: {a} -> {b}"
                    );
                }
            }
        }
    }
    // F16 and BF16: relative error at most half an ulp (2^-11, 2^-8), or half the smallest
    // f16 subnormal (2^-25).
    for (t, rel) in [
        (GgmlType::F16, 2f32.powi(-11)),
        (GgmlType::BF16, 2f32.powi(-8)),
    ] {
        let mut q = vec![0u8; 2 * x.len()];
        quantize(t, &x, &mut q, Q8Flavor::Reference).expect("quantize");
        let mut y = vec![0f32; x.len()];
        dequantize(t, &q, &mut y).expect("dequantize");
        for (a, b) in x.iter().zip(&y) {
            assert!(
                (a - b).abs() <= a.abs() * rel + 2f32.powi(-25),
                "{t}: {a} -> {b}"
            );
        }
    }
}

/// The dot of the dequantized rows in f64, and a bound on f32 summation error.
fn reference_dot(wt: GgmlType, w: &[u8], at: GgmlType, a: &[u8], n: usize) -> (f64, f64) {
    let mut wf = vec![0f32; n];
    let mut af = vec![0f32; n];
    dequantize(wt, w, &mut wf).expect("dequantize w");
    dequantize(at, a, &mut af).expect("dequantize a");
    let exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y as f64).sum();
    let magnitude: f64 = wf
        .iter()
        .zip(&af)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    let mut bound = 1e-5 * magnitude + 1e-30;
    if at == GgmlType::Q8_1 {
        // ggml uses s = f16(d * sum(q)) for the min term, not the exact sum: add its rounding.
        let mins = w
            .chunks_exact(wt.type_size())
            .map(|b| f16_to_f32(u16::from_le_bytes([b[2], b[3]])));
        let sums = a
            .chunks_exact(36)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[2], b[3]])));
        bound += mins
            .zip(sums)
            .map(|(m, s)| (m as f64 * s as f64).abs() * 2f64.powi(-10))
            .sum::<f64>();
    }
    (exact, bound)
}

#[test]
fn vec_dot_equals_dequantized_dot() {
    let mut rng = Rng(0x5eed_0003);
    let mut weight_sets: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    for fmt in block_formats() {
        if vec_dot_type(fmt.ty).is_some() {
            let n_blocks = 1024 / fmt.block_size;
            weight_sets.push((fmt.ty, random_blocks(fmt, n_blocks, &mut rng)));
        }
    }
    // Real llama.cpp blocks too, where the fixtures are present.
    if let Some(fixtures) = dequant_fixtures() {
        for f in fixtures {
            weight_sets.push((f.ty, f.bin));
        }
    }
    let mut tested = HashMap::new();
    for (wt, w) in &weight_sets {
        let n = w.len() / wt.type_size() * wt.block_size();
        let at = vec_dot_type(*wt).expect("has vec_dot_type");
        for trial in 0..4 {
            let x: Vec<f32> = (0..n)
                .map(|i| rng.unit() * if (i + trial) % 61 == 0 { 8.0 } else { 1.0 })
                .collect();
            let mut a = vec![0u8; n / at.block_size() * at.type_size()];
            quantize(at, &x, &mut a, Q8Flavor::X86).expect("quantize");
            let got = vec_dot(*wt, w, &a).expect("vec_dot") as f64;
            let (exact, bound) = reference_dot(*wt, w, at, &a, n);
            assert!(
                (got - exact).abs() <= bound,
                "{wt}·{at} trial {trial}: {got} vs {exact} (bound {bound})"
            );
            let via_f32 = vec_dot_f32(*wt, w, &x, Q8Flavor::X86).expect("vec_dot_f32");
            assert_eq!(
                via_f32.to_bits(),
                (got as f32).to_bits(),
                "{wt} vec_dot_f32"
            );
        }
        *tested.entry(*wt).or_insert(0) += 1;
    }
    // Every weight type (those `modelc quantize` makes) has a dot product.
    for &t in ir::ggml::WEIGHT_QUANT_TYPES.iter() {
        assert!(tested.contains_key(&t), "{t} has no dot product test");
    }
}

#[test]
fn vec_dot_types_are_llama_cpp_s() {
    use GgmlType::*;
    let want = [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (IQ4_NL, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
        (IQ4_XS, Q8_K),
        (TQ1_0, Q8_K),
        (TQ2_0, Q8_K),
        (IQ3_XXS, Q8_K),
        (IQ3_S, Q8_K),
        (IQ2_XXS, Q8_K),
        (IQ2_XS, Q8_K),
        (IQ2_S, Q8_K),
        (IQ1_S, Q8_K),
        (IQ1_M, Q8_K),
        (MXFP4, Q8_0),
    ];
    for (w, a) in want {
        assert_eq!(vec_dot_type(w), Some(a), "{w}");
    }
    assert_eq!(vec_dot_type(Q8_1), None);
    assert_eq!(vec_dot_type(Q8_K), None);
}

#[test]
fn errors_name_the_type_and_the_expected_size() {
    let mut out = [0f32; 32];
    let e = dequantize(GgmlType::I32, &[0u8; 4], &mut [0f32; 1]).unwrap_err();
    assert!(matches!(
        e,
        BlockDataError::Unsupported {
            ty: GgmlType::I32,
            ..
        }
    ));
    assert!(e.to_string().contains("I32"), "{e}");

    let e = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            BlockDataError::ByteLength {
                expected: 18,
                actual: 17,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("Q4_0") && e.to_string().contains("18"),
        "{e}"
    );

    let e = dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            BlockDataError::PartialBlock {
                block_size: 256,
                ..
            }
        ),
        "{e:?}"
    );

    let e = quantize(GgmlType::Q4_0, &[0.0; 32], &mut [0u8; 18], Q8Flavor::X86).unwrap_err();
    assert!(
        e.to_string().contains("quantize") && e.to_string().contains("Q4_0"),
        "{e}"
    );

    let e = vec_dot(GgmlType::Q4_0, &[0u8; 19], &[0u8; 34]).unwrap_err();
    assert!(matches!(e, BlockDataError::RaggedBytes { .. }), "{e:?}");
    let e = vec_dot(GgmlType::Q4_0, &[0u8; 18], &[0u8; 36]).unwrap_err();
    assert!(
        matches!(
            e,
            BlockDataError::ByteLength {
                ty: GgmlType::Q8_0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = vec_dot_f32(GgmlType::Q4_0, &[0u8; 18], &[0.0; 64], Q8Flavor::X86).unwrap_err();
    assert!(
        matches!(
            e,
            BlockDataError::ValueCount {
                expected: 32,
                actual: 64,
                ..
            }
        ),
        "{e:?}"
    );
}
