//! Random test data shared by the matmul tests: a xorshift generator, GGML weight blocks and
//! activations.

#![allow(dead_code)]

use codegen_cpu::formats::QuantFormat;
use ir::ggml::{f32_to_f16, GgmlType};

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
}

/// Random quantized blocks (`data`, whole blocks of `t`): random quants, mostly realistic
/// positive scales, some negative, f16-subnormal (below 6.1e-5) and zero ones, which the
/// kernels' f16 conversion must get exactly. Q8_0 quants of -128, which ggml's quantizer never
/// writes but a file may hold, are kept when `q8_min` and replaced by -127 otherwise.
pub fn fill_quant_blocks(t: GgmlType, data: &mut [u8], q8_min: bool, rng: &mut Rng) {
    let fmt = QuantFormat::of(t).unwrap();
    for (i, blk) in data.chunks_exact_mut(t.type_size()).enumerate() {
        for b in blk.iter_mut() {
            *b = rng.next() as u8;
        }
        if t == GgmlType::Q8_0 && !q8_min {
            for b in &mut blk[2..] {
                if *b == 0x80 {
                    *b = 0x81;
                }
            }
        }
        let d = match i % 37 {
            3 => -rng.range(0.001, 0.03),
            7 => rng.range(-3e-6, 3e-6),
            11 => 0.0,
            _ => rng.range(0.001, 0.03),
        };
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        if fmt.has_min {
            blk[2..4].copy_from_slice(&f32_to_f16(rng.range(-0.3, 0.0)).to_le_bytes());
        }
    }
}

/// `k × n` activations in [-1, 1) with a few outliers (×20), as real activations have.
pub fn random_acts(k: usize, n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..k * n)
        .map(|i| {
            let v = rng.range(-1.0, 1.0);
            if i % 97 == 5 {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}
