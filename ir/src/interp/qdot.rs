//! A faster route to exactly the numbers of [`crate::ggml::vec_dot`] for the weight types
//! that dominate real models (Q4_0, Q4_1, Q8_0 with Q8_0 / Q8_1 activations): each weight row
//! is unpacked once into int8 quants and f32 scales, each activation row likewise, and every
//! (row, token) pair is then an int8 dot product per block combined in the same f32 order as
//! the reference. The unit tests check bit-for-bit equality with `vec_dot`; other types go
//! through `vec_dot` itself.

use crate::ggml::{f16_to_f32, GgmlType};

/// A weight type with a fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fast {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Fast {
    pub fn of(t: GgmlType) -> Option<Fast> {
        match t {
            GgmlType::Q4_0 => Some(Fast::Q4_0),
            GgmlType::Q4_1 => Some(Fast::Q4_1),
            GgmlType::Q8_0 => Some(Fast::Q8_0),
            _ => None,
        }
    }
}

/// Int8 quants and per-32-value scales of one or more rows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Unpacked {
    /// Quants, 32 per block.
    pub q: Vec<i8>,
    /// Block scale `d`.
    pub d: Vec<f32>,
    /// Second block value: the minimum `m` (Q4_1 weights) or `s` (Q8_1 activations).
    pub m: Vec<f32>,
}

#[inline]
fn f16(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// Unpacks a weight row of `kind` (whole blocks) into `out`.
pub(crate) fn unpack_weight(kind: Fast, row: &[u8], out: &mut Unpacked) {
    let bs = match kind {
        Fast::Q4_0 => 18,
        Fast::Q4_1 => 20,
        Fast::Q8_0 => 34,
    };
    let nb = row.len() / bs;
    out.q.resize(nb * 32, 0);
    out.d.resize(nb, 0.0);
    out.m.resize(if kind == Fast::Q4_1 { nb } else { 0 }, 0.0);
    for (b, (x, dst)) in row.chunks_exact(bs).zip(out.q.chunks_exact_mut(32)).enumerate() {
        out.d[b] = f16(x, 0);
        let Ok(dst) = <&mut [i8; 32]>::try_from(dst) else { continue };
        match kind {
            Fast::Q4_0 | Fast::Q4_1 => {
                let (qo, bias) = if kind == Fast::Q4_0 { (2, 8u8) } else { (4, 0) };
                if kind == Fast::Q4_1 {
                    out.m[b] = f16(x, 2);
                }
                let Ok(qs) = <&[u8; 16]>::try_from(&x[qo..qo + 16]) else { continue };
                for j in 0..16 {
                    dst[j] = (qs[j] & 0x0f).wrapping_sub(bias) as i8;
                    dst[j + 16] = (qs[j] >> 4).wrapping_sub(bias) as i8;
                }
            }
            Fast::Q8_0 => {
                for (o, &q) in dst.iter_mut().zip(&x[2..34]) {
                    *o = q as i8;
                }
            }
        }
    }
}

/// The f32 values of an unpacked weight row, computed as ggml's `dequantize_row_*` does
/// (`q * d`, plus `m` for Q4_1): bit-identical to [`crate::ggml::dequantize`].
pub(crate) fn dequant(kind: Fast, w: &Unpacked, out: &mut [f32]) {
    for (b, (o, q)) in out.chunks_exact_mut(32).zip(w.q.chunks_exact(32)).enumerate() {
        let d = w.d[b];
        if kind == Fast::Q4_1 {
            let m = w.m[b];
            for (y, &x) in o.iter_mut().zip(q) {
                *y = x as f32 * d + m;
            }
        } else {
            for (y, &x) in o.iter_mut().zip(q) {
                *y = x as f32 * d;
            }
        }
    }
}

/// Unpacks activation rows in Q8_0 (`with_sum == false`) or Q8_1 blocks into `out`.
pub(crate) fn unpack_act(bytes: &[u8], with_sum: bool, out: &mut Unpacked) {
    let (bs, qo) = if with_sum { (36, 4) } else { (34, 2) };
    for y in bytes.chunks_exact(bs) {
        out.d.push(f16(y, 0));
        if with_sum {
            out.m.push(f16(y, 2));
        }
        out.q.extend(y[qo..qo + 32].iter().map(|&q| q as i8));
    }
}

/// Exact sum of 32 int8 products (|sum| ≤ 32 · 128², no overflow; wrapping ops keep the
/// loop free of overflow checks so it vectorizes in every profile).
#[inline(always)]
fn isum(a: &[i8], b: &[i8]) -> i32 {
    let (a, b): (&[i8; 32], &[i8; 32]) = match (a.try_into(), b.try_into()) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return 0,
    };
    let mut s = 0i32;
    for i in 0..32 {
        s = s.wrapping_add((a[i] as i32).wrapping_mul(b[i] as i32));
    }
    s
}

/// The dot product of an unpacked weight row with activation row `n` (blocks `n * nb ..`),
/// computed in the reference's f32 order for `kind`.
#[inline(always)]
pub(crate) fn dot(kind: Fast, w: &Unpacked, a: &Unpacked, n: usize) -> f32 {
    let nb = w.d.len();
    let ab = n * nb;
    let mut sumf = 0f32;
    for b in 0..nb {
        let s = isum(&w.q[b * 32..b * 32 + 32], &a.q[(ab + b) * 32..(ab + b) * 32 + 32]);
        let (dx, dy) = (w.d[b], a.d[ab + b]);
        match kind {
            Fast::Q4_0 => sumf += s as f32 * dx * dy,
            Fast::Q4_1 => sumf += (dx * dy) * s as f32 + w.m[b] * a.m[ab + b],
            Fast::Q8_0 => sumf += s as f32 * (dx * dy),
        }
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{quantize, vec_dot, vec_dot_type, Q8Flavor};

    /// A deterministic pseudo-random generator (xorshift).
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn fast_path_is_bit_identical_to_vec_dot() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let kind = Fast::of(t).unwrap();
            let k = 32 * 18;
            for _ in 0..50 {
                let mut row = vec![0u8; t.row_size(k as u64).unwrap() as usize];
                row.iter_mut().for_each(|b| *b = rng(&mut seed) as u8);
                // Sane f16 scales (|d| in about [2^-10, 2^-3]) at the block starts.
                for blk in row.chunks_exact_mut(t.type_size()) {
                    for o in (0..if t == GgmlType::Q4_1 { 4 } else { 2 }).step_by(2) {
                        let bits = 0x1400 + (rng(&mut seed) % 0x1c00) as u16 | (rng(&mut seed) as u16 & 0x8000);
                        blk[o..o + 2].copy_from_slice(&bits.to_le_bytes());
                    }
                }
                let x: Vec<f32> = (0..k).map(|_| (rng(&mut seed) % 20001) as f32 / 10000.0 - 1.0).collect();
                let vdt = vec_dot_type(t).unwrap();
                let mut act = vec![0u8; vdt.row_size(k as u64).unwrap() as usize];
                quantize(vdt, &x, &mut act, Q8Flavor::X86).unwrap();
                let want = vec_dot(t, &row, &act).unwrap();
                let (mut w, mut a) = (Unpacked::default(), Unpacked::default());
                unpack_weight(kind, &row, &mut w);
                unpack_act(&act, vdt == GgmlType::Q8_1, &mut a);
                assert_eq!(dot(kind, &w, &a, 0).to_bits(), want.to_bits(), "{t}");
                let mut fast = vec![0f32; k];
                let mut reference = vec![0f32; k];
                dequant(kind, &w, &mut fast);
                crate::ggml::dequantize(t, &row, &mut reference).unwrap();
                let same = fast.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{t} dequantization differs");
            }
        }
    }
}
