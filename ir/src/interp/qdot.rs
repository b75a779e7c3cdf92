//! A faster route to exactly the numbers of [`crate::ggml::vec_dot`] for the weight types
//! that dominate real models (Q4_0, Q4_1, Q8_0 with Q8_0 / Q8_1 activations): each weight row
//! is unpacked once into int8 quants and f32 scales, each activation row likewise, and every
//! (row, token) pair is then an int8 dot product per block combined in the same f32 order as
//! the reference. The unit tests check bit-for-bit equality with `vec_dot`; other types go
//! through `vec_dot` itself.

use crate::ggml::GgmlType;

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
    /// Quants, 32 per block, as the bytes of two's-complement int8 values.
    pub q: Vec<u8>,
    /// Block scale `d`.
    pub d: Vec<f32>,
    /// Second block value: the minimum `m` (Q4_1 weights) or `s` (Q8_1 activations).
    pub m: Vec<f32>,
}

/// IEEE half → f32, exact, inlinable (the same values as [`crate::ggml::f16_to_f32`], which
/// the tests check for all 65536 inputs; this one avoids a per-call CPU-feature dispatch).
#[inline(always)]
pub(crate) fn half_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0x1f {
        return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    }
    if exp == 0 {
        // Zero or subnormal: man * 2^-24, exact in f32.
        let v = man as f32 * (1.0 / 16_777_216.0);
        return if sign != 0 { -v } else { v };
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
}

#[inline(always)]
fn f16(b: &[u8], o: usize) -> f32 {
    half_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// `0x0f` in every byte.
const LOW4: u128 = u128::from_le_bytes([0x0f; 16]);
/// `0x80` in every byte.
const HIGH1: u128 = u128::from_le_bytes([0x80; 16]);
/// `0x08` in every byte.
const EIGHT: u128 = u128::from_le_bytes([0x08; 16]);

/// Subtracts 8 from every byte of `v` (each byte 0..=15), wrapping: sets the top bit so no
/// borrow crosses bytes, subtracts, flips the top bit back.
#[inline(always)]
fn minus8(v: u128) -> u128 {
    ((v | HIGH1) - EIGHT) ^ HIGH1
}

/// Unpacks a weight row of `kind` (whole blocks) into `out`.
#[inline(always)]
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
    for (b, (x, dst)) in row
        .chunks_exact(bs)
        .zip(out.q.chunks_exact_mut(32))
        .enumerate()
    {
        out.d[b] = f16(x, 0);
        match kind {
            Fast::Q4_0 | Fast::Q4_1 => {
                let qo = if kind == Fast::Q4_0 { 2 } else { 4 };
                if kind == Fast::Q4_1 {
                    out.m[b] = f16(x, 2);
                }
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&x[qo..qo + 16]);
                let v = u128::from_le_bytes(qs);
                let (mut lo, mut hi) = (v & LOW4, (v >> 4) & LOW4);
                if kind == Fast::Q4_0 {
                    lo = minus8(lo);
                    hi = minus8(hi);
                }
                dst[..16].copy_from_slice(&lo.to_le_bytes());
                dst[16..].copy_from_slice(&hi.to_le_bytes());
            }
            Fast::Q8_0 => dst.copy_from_slice(&x[2..34]),
        }
    }
}

/// The f32 values of an unpacked weight row, computed as ggml's `dequantize_row_*` does
/// (`q * d`, plus `m` for Q4_1): bit-identical to [`crate::ggml::dequantize`].
#[inline(always)]
pub(crate) fn dequant(kind: Fast, w: &Unpacked, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            // SAFETY: the CPU supports AVX2 (checked by `has_avx2`).
            return unsafe { dequant_avx2(kind, w, out) };
        }
    }
    dequant_portable(kind, w, out)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2"))
}

fn dequant_portable(kind: Fast, w: &Unpacked, out: &mut [f32]) {
    for (b, (o, q)) in out
        .chunks_exact_mut(32)
        .zip(w.q.chunks_exact(32))
        .enumerate()
    {
        let d = w.d[b];
        let m = if kind == Fast::Q4_1 {
            Some(w.m[b])
        } else {
            None
        };
        for (y, &x) in o.iter_mut().zip(q) {
            *y = match m {
                Some(m) => x as i8 as f32 * d + m,
                None => x as i8 as f32 * d,
            };
        }
    }
}

/// [`dequant_portable`] with AVX2: the same multiply, then add, per value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequant_avx2(kind: Fast, w: &Unpacked, out: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_cvtepi32_ps, _mm256_cvtepi8_epi32, _mm256_mul_ps, _mm256_set1_ps,
        _mm256_storeu_ps, _mm_loadl_epi64,
    };
    let nb = (out.len() / 32).min(w.q.len() / 32).min(w.d.len());
    let with_m = kind == Fast::Q4_1 && w.m.len() >= nb;
    for b in 0..nb {
        let d = _mm256_set1_ps(w.d[b]);
        let m = _mm256_set1_ps(if with_m { w.m[b] } else { 0.0 });
        for part in 0..4 {
            let o = b * 32 + part * 8;
            // SAFETY: o + 8 <= nb * 32, within `w.q` and `out`; the load reads 8 bytes.
            unsafe {
                let q8 = _mm_loadl_epi64(w.q.as_ptr().add(o).cast());
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d);
                let v = if with_m { _mm256_add_ps(v, m) } else { v };
                _mm256_storeu_ps(out.as_mut_ptr().add(o), v);
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
        out.q.extend_from_slice(&y[qo..qo + 32]);
    }
}

/// Exact sum of 32 int8 products (|sum| ≤ 32 · 128², no overflow).
#[inline(always)]
fn isum(a: &[u8], b: &[u8]) -> i32 {
    a.iter().zip(b).take(32).fold(0i32, |s, (&x, &y)| {
        s.wrapping_add((x as i8 as i32).wrapping_mul(y as i8 as i32))
    })
}

/// [`isum`] with AVX2: sign-extend to i16, multiply-add pairs to i32, add up (exact).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn isum_avx2(a: &[u8], b: &[u8]) -> i32 {
    use std::arch::x86_64::{
        _mm256_add_epi32, _mm256_castsi256_si128, _mm256_cvtepi8_epi16, _mm256_extracti128_si256,
        _mm256_madd_epi16, _mm_add_epi32, _mm_cvtsi128_si32, _mm_loadu_si128, _mm_shuffle_epi32,
    };
    if a.len() < 32 || b.len() < 32 {
        return isum(a, b);
    }
    // SAFETY: both slices hold at least 32 bytes; each load reads 16.
    unsafe {
        let a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.as_ptr().cast()));
        let a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.as_ptr().add(16).cast()));
        let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().cast()));
        let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().add(16).cast()));
        let s = _mm256_add_epi32(_mm256_madd_epi16(a0, b0), _mm256_madd_epi16(a1, b1));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// Which summation order a dot product follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// ggml's portable scalar code ([`crate::ggml::vec_dot`]): one f32 sum, block after block.
    Reference,
    /// ggml's x86 AVX2 kernels (`ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1`, `_q8_0_q8_0` in
    /// ggml-cpu/arch/x86/quants.c): eight lanes, lane `l` holding the exact sum of products
    /// `4l .. 4l + 4` of each block, accumulated as `acc_l = fma(dx * dy, lane, acc_l)`;
    /// then [`super::avx2::hsum8`], plus (Q4_1) the separate f32 sum of `m * s`.
    Avx2,
}

/// The dot product of an unpacked weight row with activation row `n` (blocks `n * nb ..`)
/// in the given order.
#[inline(always)]
pub(crate) fn dot(kind: Fast, w: &Unpacked, a: &Unpacked, n: usize, order: Order) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            return match order {
                // SAFETY: the CPU supports AVX2 (checked by `has_avx2`).
                Order::Reference => unsafe { dot_avx2(kind, w, a, n) },
                // SAFETY: AVX2 and FMA are present (FMA checked in `has_fma`).
                Order::Avx2 if has_fma() => unsafe { dot_lanes_simd(kind, w, a, n) },
                Order::Avx2 => dot_lanes(kind, w, a, n),
            };
        }
    }
    match order {
        Order::Reference => dot_with(kind, w, a, n, isum),
        Order::Avx2 => dot_lanes(kind, w, a, n),
    }
}

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| std::is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(kind: Fast, w: &Unpacked, a: &Unpacked, n: usize) -> f32 {
    // SAFETY: this function only runs where AVX2 is available.
    dot_with(kind, w, a, n, |x, y| unsafe { isum_avx2(x, y) })
}

#[inline(always)]
fn dot_with(
    kind: Fast,
    w: &Unpacked,
    a: &Unpacked,
    n: usize,
    isum: impl Fn(&[u8], &[u8]) -> i32,
) -> f32 {
    let nb = w.d.len();
    let ab = n * nb;
    let aq = &a.q[ab * 32..(ab + nb) * 32];
    let ad = &a.d[ab..ab + nb];
    let mut sumf = 0f32;
    for (b, (wq, xq)) in w.q.chunks_exact(32).zip(aq.chunks_exact(32)).enumerate() {
        let s = isum(wq, xq);
        let (dx, dy) = (w.d[b], ad[b]);
        match kind {
            Fast::Q4_0 => sumf += s as f32 * dx * dy,
            Fast::Q4_1 => sumf += (dx * dy) * s as f32 + w.m[b] * a.m[ab + b],
            Fast::Q8_0 => sumf += s as f32 * (dx * dy),
        }
    }
    sumf
}

/// [`Order::Avx2`], lanes written out.
fn dot_lanes(kind: Fast, w: &Unpacked, a: &Unpacked, n: usize) -> f32 {
    let nb = w.d.len();
    let ab = n * nb;
    let aq = &a.q[ab * 32..(ab + nb) * 32];
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (b, (wq, xq)) in w.q.chunks_exact(32).zip(aq.chunks_exact(32)).enumerate() {
        let d = w.d[b] * a.d[ab + b];
        if kind == Fast::Q4_1 {
            summs += w.m[b] * a.m[ab + b];
        }
        for (l, acc) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4)
                .map(|k| wq[k] as i8 as i32 * xq[k] as i8 as i32)
                .sum();
            *acc = d.mul_add(lane as f32, *acc);
        }
    }
    let s = super::avx2::hsum8(&acc);
    if kind == Fast::Q4_1 {
        s + summs
    } else {
        s
    }
}

/// [`Order::Avx2`] with the instructions ggml uses (`maddubs` of |w| and sign-adjusted
/// activations, `madd` with ones, convert, `fmadd`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_lanes_simd(kind: Fast, w: &Unpacked, a: &Unpacked, n: usize) -> f32 {
    use std::arch::x86_64::{
        _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_si256, _mm256_madd_epi16,
        _mm256_maddubs_epi16, _mm256_set1_epi16, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_sign_epi8, _mm256_storeu_ps,
    };
    let nb = w.d.len();
    let ab = n * nb;
    let aq = &a.q[ab * 32..(ab + nb) * 32];
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let ones = _mm256_set1_epi16(1);
    for (b, (wq, xq)) in w.q.chunks_exact(32).zip(aq.chunks_exact(32)).enumerate() {
        let d = w.d[b] * a.d[ab + b];
        if kind == Fast::Q4_1 {
            summs += w.m[b] * a.m[ab + b];
        }
        // SAFETY: both chunks hold exactly 32 bytes.
        let (x, y) = unsafe {
            (
                _mm256_loadu_si256(wq.as_ptr().cast()),
                _mm256_loadu_si256(xq.as_ptr().cast()),
            )
        };
        let p = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
            ones,
        );
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let s = super::avx2::hsum8(&lanes);
    if kind == Fast::Q4_1 {
        s + summs
    } else {
        s
    }
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
    fn half_conversion_matches_ggml_for_every_value() {
        for h in 0..=u16::MAX {
            let (a, b) = (half_to_f32(h), crate::ggml::f16_to_f32(h));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{h:#06x}: {a} vs {b}"
            );
        }
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
                        let bits = (0x1400 + (rng(&mut seed) % 0x1c00) as u16)
                            | (rng(&mut seed) as u16 & 0x8000);
                        blk[o..o + 2].copy_from_slice(&bits.to_le_bytes());
                    }
                }
                let x: Vec<f32> = (0..k)
                    .map(|_| (rng(&mut seed) % 20001) as f32 / 10000.0 - 1.0)
                    .collect();
                let vdt = vec_dot_type(t).unwrap();
                let mut act = vec![0u8; vdt.row_size(k as u64).unwrap() as usize];
                quantize(vdt, &x, &mut act, Q8Flavor::X86).unwrap();
                let want = vec_dot(t, &row, &act).unwrap();
                let (mut w, mut a) = (Unpacked::default(), Unpacked::default());
                unpack_weight(kind, &row, &mut w);
                unpack_act(&act, vdt == GgmlType::Q8_1, &mut a);
                assert_eq!(
                    dot(kind, &w, &a, 0, Order::Reference).to_bits(),
                    want.to_bits(),
                    "{t}"
                );
                assert_eq!(
                    dot_with(kind, &w, &a, 0, isum).to_bits(),
                    want.to_bits(),
                    "{t} portable"
                );
                // The AVX2 order: the lane version and the instruction version agree, and
                // both are within rounding of the reference.
                let lanes = dot_lanes(kind, &w, &a, 0);
                assert_eq!(
                    dot(kind, &w, &a, 0, Order::Avx2).to_bits(),
                    lanes.to_bits(),
                    "{t} avx2"
                );
                assert!(
                    (lanes - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{t}: {lanes} vs {want}"
                );
                let mut fast = vec![0f32; k];
                let mut portable = vec![0f32; k];
                let mut reference = vec![0f32; k];
                dequant(kind, &w, &mut fast);
                dequant_portable(kind, &w, &mut portable);
                assert!(
                    fast.iter()
                        .zip(&portable)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{t}"
                );
                crate::ggml::dequantize(t, &row, &mut reference).unwrap();
                let same = fast
                    .iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{t} dequantization differs");
            }
        }
    }
}
