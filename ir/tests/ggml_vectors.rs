//! The second list of weight types (TQ1_0, TQ2_0, ...) against llama.cpp's own CPU library,
//! bit for bit: `tests/data/ggml_vectors.bin`, written by `scripts/ggml-vectors.c` (compiled
//! at dev time against the llama.cpp build at commit 0c1e570, AVX2 + FMA + F16C).
//!
//! File format (little-endian): `MCGV`, version `1`, then records, `0` at the end:
//! - `1, type, nb`, `nb` weight blocks, ggml's `to_float` of them (`nb * block_size` f32);
//! - `2, type, nb, raw`, `nb` weight blocks, the activation row in the type's
//!   `vec_dot_type` (quantized by ggml's `from_float` if `raw == 0`, random bytes with a
//!   moderate scale otherwise), ggml's `vec_dot` result (f32);
//! - `3, type, k, m, n, seed` (u64), `m` weight rows of `k` values, ggml's `mul_mat` result
//!   (`n * m` f32, column after column) for the `n * k` f32 activations that splitmix64 from
//!   `seed` gives (`unit()` below), computed by a ggml graph on one thread;
//! - `4, type, k, m, n, seed`, laid out as `3`, but the weight uploaded into the CPU
//!   backend's `CPU_REPACK` buffer (as llama.cpp loads model weights): for Q4_0, IQ4_NL and
//!   MXFP4 with `m % 8 == 0`, the interleaved gemv / gemm kernels
//!   ([`ir::ggml::RepackedRow`]).
//!
//! The 32-value types also have `vec_dot` records of 3 blocks (the AVX2 kernels' scalar
//! tail after a pair of blocks).

use ir::ggml::{
    dequantize, quantize_activations, repack_quantize_activations, repacked_by_llama_cpp,
    vec_dot_avx2, vec_dot_avx2_mul_mat, GgmlType, Q8Flavor, RepackKernel, RepackedRow,
};

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let b = &self.data[self.at..self.at + n];
        self.at += n;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes(8).try_into().expect("8 bytes"))
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.bytes(4 * n)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
    fn ty(&mut self) -> GgmlType {
        GgmlType::from_id(self.u32()).expect("known type id")
    }
}

/// The harness's splitmix64 `unit()`: uniform in [-1, 1), exact in f32.
fn unit(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

#[test]
fn second_list_types_match_llama_cpp_bit_for_bit() {
    let data = include_bytes!("data/ggml_vectors.bin");
    let mut r = Reader { data, at: 0 };
    assert_eq!(r.bytes(4), b"MCGV");
    assert_eq!(r.u32(), 1);
    let mut seen = std::collections::BTreeMap::<&str, [usize; 3]>::new();
    let mut repacked = std::collections::BTreeSet::<&str>::new();
    loop {
        match r.u32() {
            0 => break,
            1 => {
                let t = r.ty();
                let nb = r.u32() as usize;
                let w = r.bytes(nb * t.type_size());
                let want = r.f32s(nb * t.block_size());
                let mut got = vec![0f32; want.len()];
                dequantize(t, w, &mut got).expect("dequantizes");
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{t} value {i}: {g} vs {e}");
                }
                seen.entry(t.name()).or_default()[0] += 1;
            }
            2 => {
                let t = r.ty();
                let nb = r.u32() as usize;
                let raw = r.u32() != 0;
                let at = ir::ggml::vec_dot_type(t).expect("has a vec_dot_type");
                let w = r.bytes(nb * t.type_size());
                let n = nb * t.block_size();
                let a = r.bytes(n / at.block_size() * at.type_size());
                let want = r.f32s(1)[0];
                let got = vec_dot_avx2(t, w, a).expect("x86 vec_dot");
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{t} vec_dot, {nb} blocks, raw {raw}: {got} vs {want}"
                );
                seen.entry(t.name()).or_default()[1] += 1;
            }
            3 => {
                let t = r.ty();
                let (k, m, n) = (r.u32() as usize, r.u32() as usize, r.u32() as usize);
                let mut seed = r.u64();
                let row = t.row_size(k as u64).expect("whole blocks") as usize;
                let w = r.bytes(row * m);
                let want = r.f32s(n * m);
                let x: Vec<f32> = (0..n * k).map(|_| unit(&mut seed)).collect();
                for c in 0..n {
                    let (_, act) = quantize_activations(t, &x[c * k..][..k], Q8Flavor::X86)
                        .expect("quantizes");
                    for j in 0..m {
                        let got = vec_dot_avx2_mul_mat(t, &w[j * row..][..row], &act, n)
                            .expect("mul_mat product");
                        let e = want[c * m + j];
                        assert_eq!(
                            got.to_bits(),
                            e.to_bits(),
                            "{t} mul_mat {n} columns, row {j} column {c}: {got} vs {e}"
                        );
                    }
                }
                seen.entry(t.name()).or_default()[2] += 1;
            }
            4 => {
                let t = r.ty();
                let (k, m, n) = (r.u32() as usize, r.u32() as usize, r.u32() as usize);
                let mut seed = r.u64();
                let row = t.row_size(k as u64).expect("whole blocks") as usize;
                let w = r.bytes(row * m);
                let want = r.f32s(n * m);
                assert!(repacked_by_llama_cpp(t, [k as u64, m as u64, 1, 1]), "{t}");
                let x: Vec<f32> = (0..n * k).map(|_| unit(&mut seed)).collect();
                for c in 0..n {
                    let kernel = RepackKernel::for_column(c, n);
                    let (_, act) = repack_quantize_activations(t, &x[c * k..][..k], kernel)
                        .expect("quantizes");
                    for j in 0..m {
                        let got = RepackedRow::new(t, &w[j * row..][..row])
                            .and_then(|rr| rr.dot(&act, kernel))
                            .expect("repacked product");
                        let e = want[c * m + j];
                        assert_eq!(
                            got.to_bits(),
                            e.to_bits(),
                            "{t} repacked mul_mat {n} columns ({kernel:?}), row {j} column {c}: \
                             {got} vs {e}"
                        );
                    }
                }
                repacked.insert(t.name());
            }
            other => panic!("unknown record kind {other} at byte {}", r.at - 4),
        }
    }
    assert_eq!(r.at, data.len(), "trailing bytes");
    for (t, counts) in &seen {
        assert!(counts.iter().all(|&c| c > 0), "{t}: {counts:?}");
    }
    for t in [
        "TQ1_0", "TQ2_0", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M",
        "MXFP4",
    ] {
        assert!(seen.contains_key(t), "{t} missing");
    }
    for t in ["MXFP4", "IQ4_NL"] {
        assert!(repacked.contains(t), "{t}: no repacked mul_mat");
    }
}
