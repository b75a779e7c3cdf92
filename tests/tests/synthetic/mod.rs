//! Models of the weight types no fixture has: the I-quants llama-quantize makes only with an
//! importance matrix (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), TQ1_0 and
//! MXFP4. A copy of an F32 fixture whose 2-D weights are random valid blocks of a chosen
//! type, written with `ir`'s GGUF writer and read back from memory: nothing about the
//! model is meaningful, every kernel still has to compute what the interpreter computes.
//! Shared by the test files that `mod synthetic;` it.

#![allow(dead_code)]

use ir::ggml::{f32_to_bf16, f32_to_f16, BlockFormat, FieldKind, GgmlType, ScalarKind};
use ir::gguf::{GgufFile, GgufWriter};

/// The weight types whose formats no recipe describes (`ir::ggml::Decode::Routine`): the
/// GPU printer's hand-written dequantizers (codegen-cuda's `kernels::routines`).
pub const ROUTINE_TYPES: [GgmlType; 9] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::MXFP4,
];

/// A small deterministic generator (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// How large the scales of [`random_blocks`] are.
#[derive(Clone, Copy, Debug)]
pub struct Scales {
    /// f16/f32 scale fields: `±[0.5, 1) · 2^-e`, `e` uniform in this range.
    pub exp: (i32, i32),
    /// E8M0 scale bytes (MXFP4): uniform in this range (the scale is `2^(e - 128)`).
    pub e8m0: (u8, u8),
}

/// Scales of 2^-10 .. 1 (E8M0: 2^-10 .. 2), as `ir`'s own format tests use.
pub const WIDE: Scales = Scales {
    exp: (0, 10),
    e8m0: (118, 129),
};

/// Scales for a model's weights: values of a few tenths at most, so that two layers of
/// random products stay well inside f32 and the softmax.
pub const WEIGHTS: Scales = Scales {
    exp: (7, 9),
    e8m0: (118, 122),
};

/// `n_blocks` random valid blocks of `fmt`: random bytes, with every f16/f32 scale field
/// (and IQ1_M's `d`, spread over the top nibbles of its four `scales`) set to a finite
/// value and every E8M0 exponent to a moderate scale (random bytes would give NaN,
/// infinity and scales of 2^127).
pub fn random_blocks(fmt: &BlockFormat, n_blocks: usize, s: Scales, rng: &mut Rng) -> Vec<u8> {
    let mut data: Vec<u8> = (0..n_blocks * fmt.type_size)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let pick =
        |lo: i32, hi: i32, rng: &mut Rng| lo + (rng.next_u64() % (hi - lo + 1) as u64) as i32;
    for block in data.chunks_exact_mut(fmt.type_size) {
        for f in fmt.fields {
            let mag = |rng: &mut Rng, e: i32| {
                let u = rng.unit();
                (0.5 + 0.5 * u.abs()) * if u < 0.0 { -1.0 } else { 1.0 } * 2f32.powi(-e)
            };
            match f.kind {
                FieldKind::Value(k)
                | FieldKind::Scale(k)
                | FieldKind::Min(k)
                | FieldKind::MinScale(k)
                | FieldKind::Sum(k) => {
                    let e = pick(s.exp.0, s.exp.1, rng);
                    let v = mag(rng, e);
                    let bytes = match k {
                        ScalarKind::F32 => v.to_le_bytes().to_vec(),
                        ScalarKind::F16 => f32_to_f16(v).to_le_bytes().to_vec(),
                        ScalarKind::BF16 => f32_to_bf16(v).to_le_bytes().to_vec(),
                    };
                    block[f.offset..f.offset + bytes.len()].copy_from_slice(&bytes);
                }
                FieldKind::E8M0Scale => {
                    block[f.offset] = pick(i32::from(s.e8m0.0), i32::from(s.e8m0.1), rng) as u8;
                }
                FieldKind::ScalesAndScale => {
                    // IQ1_M: nibble k of d's f16 bits is the top nibble of the k-th u16.
                    let e = pick(s.exp.0, s.exp.1, rng);
                    let d = f32_to_f16(mag(rng, e));
                    for k in 0..4 {
                        let at = f.offset + 2 * k;
                        let w = u16::from_le_bytes([block[at], block[at + 1]]);
                        let w = (w & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                        block[at..at + 2].copy_from_slice(&w.to_le_bytes());
                    }
                }
                _ => {}
            }
        }
    }
    data
}

/// [`synthetic_bytes`] read back (from memory).
pub fn synthetic(name: &str, pick: impl Fn(&str) -> Option<GgmlType>, seed: u64) -> GgufFile {
    GgufFile::from_bytes(synthetic_bytes(name, pick, seed)).expect("the copy reads back")
}

/// The fixture `fixtures/models/<name>.gguf`, its 2-D weights of the types `pick` names
/// (by tensor name) replaced by random valid blocks of that type ([`WEIGHTS`] scales;
/// every other tensor and all metadata as they are): the bytes of the GGUF file.
///
/// # Panics
/// A fixture that is absent or unreadable, or a weight whose rows are not whole blocks of
/// the type picked for it.
pub fn synthetic_bytes(name: &str, pick: impl Fn(&str) -> Option<GgmlType>, seed: u64) -> Vec<u8> {
    let path = modelc_tests::shared_root().join(format!("fixtures/models/{name}.gguf"));
    let base = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut rng = Rng(seed);
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata().iter() {
        w.add_kv(k, v.clone());
    }
    for t in base.tensors() {
        let ne = &t.ne[..t.n_dims as usize];
        let (ty, data) = match pick(&t.name).filter(|_| t.n_dims == 2) {
            Some(ty) => {
                let fmt = ir::ggml::block_format(ty).expect("a described type");
                assert_eq!(
                    ne[0] % fmt.block_size as u64,
                    0,
                    "{name}: {} rows of {} values are not whole {} blocks",
                    t.name,
                    ne[0],
                    ty.name()
                );
                let n_blocks = (t.n_elements() / fmt.block_size as u64) as usize;
                (ty, random_blocks(fmt, n_blocks, WEIGHTS, &mut rng))
            }
            None => (t.ggml_type, base.tensor_data(t).to_vec()),
        };
        w.add_tensor(&t.name, ne, ty, data)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", t.name));
    }
    w.to_bytes().expect("the copy serializes")
}

/// `llama-sep-F32` (n_embd 256, n_ff 512: every row whole 256-blocks) with the nine
/// [`ROUTINE_TYPES`] among its weights: each type in at least one plain product (the decode
/// and the tiled prompt kernels), some in the gate/up pair (the GLU kernel) and one in
/// `token_embd` (the `get_rows` kernel); the q/k/v siblings of a layer mix three types.
/// One model for all nine keeps the shim's compiles (a few seconds each) to one per step.
pub fn mixed_routine_model() -> GgufFile {
    synthetic("llama-sep-F32", mixed_type, 14)
}

/// The type [`mixed_routine_model`] gives the weight `name`.
pub fn mixed_type(name: &str) -> Option<GgmlType> {
    use GgmlType::*;
    let layer = |n: &str, i: u32| name == format!("blk.{i}.{n}.weight");
    Some(match () {
        _ if name == "token_embd.weight" => IQ2_XS,
        _ if name == "output.weight" => IQ2_XXS,
        _ if layer("attn_q", 0) => IQ2_XXS,
        _ if layer("attn_k", 0) => IQ2_XS,
        _ if layer("attn_v", 0) => IQ2_S,
        _ if layer("attn_output", 0) => IQ3_XXS,
        _ if layer("ffn_gate", 0) => IQ1_S,
        _ if layer("ffn_up", 0) => IQ1_M,
        _ if layer("ffn_down", 0) => IQ3_S,
        _ if layer("attn_q", 1) => IQ1_S,
        _ if layer("attn_k", 1) => IQ1_M,
        _ if layer("attn_v", 1) => TQ1_0,
        _ if layer("attn_output", 1) => MXFP4,
        _ if layer("ffn_gate", 1) => TQ1_0,
        _ if layer("ffn_up", 1) => MXFP4,
        _ if layer("ffn_down", 1) => IQ2_S,
        _ => return None,
    })
}
