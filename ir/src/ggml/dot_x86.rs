//! The dot products of llama.cpp's x86-64 AVX2 build (ggml-cpu/arch/x86/quants.c, the
//! `__AVX2__` branches; FMA and F16C on, no AVX-512, no AVX-VNNI), lane for lane, for the
//! weight types beyond Q4_0 / Q4_1 / Q8_0: Q5_0, Q5_1, IQ4_NL, MXFP4 (with Q8_0 / Q8_1
//! activations), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (with Q8_K activations); the
//! order llamafile's tinyBLAS (`tinyBLAS_Q0_AVX` in ggml-cpu/llamafile/sgemm.cpp) uses for
//! IQ4_NL when a product has two or more activation columns (for Q5_0 it equals `vec_dot`'s);
//! and ggml-cpu's tiled K-quant kernel (ggml-cpu/tiled), which `mul_mat` runs for the K types
//! and IQ4_XS from 8 activation columns on ([`tiled_q8_k`]).
//!
//! Checked bit for bit against llama.cpp's own CPU library (an AVX2 + FMA + F16C build of
//! commit 0c1e570) on random and real SmolLM2 weights with 1 to 28 columns: see the test
//! `matches_llama_cpp_mul_mat_dump`, which compares with a dump of its results.
//!
//! Plain scalar Rust, no `std::arch`: the 256-bit registers are arrays, and the few integer
//! instructions the kernels are built from are written out with their exact semantics
//! (saturating [`maddubs`], wrapping [`madd`], sign tricks), so that every integer lane holds
//! exactly what the corresponding register lane holds in ggml. The f32 arithmetic follows
//! ggml's operation order: `_mm256_fmadd_ps` is one rounding ([`f32::mul_add`]); scalar
//! `s += a * b` in those files is fused too, as GCC compiles it (`-ffp-contract=fast`, the
//! default); the horizontal sums are ggml's `hsum_float_8` ([`hsum8`]) and the 4-lane
//! `movehl` / `movehdup` reduction of Q4_K's mins ([`hsum4`]).
//!
//! Lane layout shared by all kernels: a 32-value group of weights sits in one register,
//! byte `b` holding value `b` of the group; `maddubs` adds bytes `2p, 2p + 1` into i16 lane
//! `p`, and `madd` adds i16 lanes `2l, 2l + 1` into i32 lane `l`. So i32 lane `l` (0..8)
//! collects values `4l .. 4l + 4` of every 32-value group, and for the K-quants, whose scales
//! cover 16 values, lanes 0..4 carry the scale of the group's first 16 values, lanes 4..8
//! that of the second. The integer parts are exact in any order; what the f32 result depends
//! on is which integer ends up in which lane, and that is what these functions reproduce.

use super::cpu_math::hsum8;
use super::dequant::{q3_k_scales, scale_min_k4};
use super::fp::{e8m0_to_f32_half, f16_at, f32_at, u16_at};
use super::grids::KVALUES_MXFP4;
use super::layouts::KVALUES_IQ4NL;
use super::QK_K;

/// `_mm256_maddubs_epi16`: i16 lane `p` = `u[2p] * s[2p] + u[2p+1] * s[2p+1]` (unsigned
/// times signed bytes), saturated to the i16 range.
#[inline(always)]
fn maddubs(u: &[u8; 32], s: &[i8; 32]) -> [i16; 16] {
    std::array::from_fn(|p| {
        let v = u[2 * p] as i32 * s[2 * p] as i32 + u[2 * p + 1] as i32 * s[2 * p + 1] as i32;
        v.clamp(i16::MIN as i32, i16::MAX as i32) as i16
    })
}

/// ggml's `mul_add_epi8(x, y)` / the first half of `mul_sum_i8_pairs_float`: a signed by
/// signed product through [`maddubs`], as `maddubs(sign(x, x), sign(y, x))`: `|x|` (where
/// `-128` stays the byte `0x80`, i.e. 128 unsigned) times `y` negated where `x < 0` (with
/// wrapping: `-(-128)` is `-128`) and zeroed where `x == 0`.
#[inline(always)]
fn maddubs_signed(x: &[i8; 32], y: &[i8; 32]) -> [i16; 16] {
    let ax: [u8; 32] = std::array::from_fn(|i| x[i].wrapping_abs() as u8);
    let sy: [i8; 32] = std::array::from_fn(|i| match x[i] {
        0 => 0,
        v if v < 0 => y[i].wrapping_neg(),
        _ => y[i],
    });
    maddubs(&ax, &sy)
}

/// `_mm256_madd_epi16`: i32 lane `l` = `a[2l] * b[2l] + a[2l+1] * b[2l+1]` (wrapping, as the
/// instruction does for the one overflowing input, `-32768 * -32768` twice).
#[inline(always)]
fn madd(a: &[i16; 16], b: &[i16; 16]) -> [i32; 8] {
    std::array::from_fn(|l| {
        (a[2 * l] as i32 * b[2 * l] as i32).wrapping_add(a[2 * l + 1] as i32 * b[2 * l + 1] as i32)
    })
}

/// [`madd`] with the i16 scale `lo` in lanes 0..8 (bytes 0..16 of the group) and `hi` in
/// lanes 8..16 (bytes 16..32): the K-quants' per-16-value scales after ggml's shuffles.
#[inline(always)]
fn madd_halves(p: &[i16; 16], lo: i16, hi: i16) -> [i32; 8] {
    let s: [i16; 16] = std::array::from_fn(|i| if i < 8 { lo } else { hi });
    madd(p, &s)
}

/// `_mm256_add_epi32` into `acc`.
#[inline(always)]
fn add_i32(acc: &mut [i32; 8], v: &[i32; 8]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a = a.wrapping_add(*b);
    }
}

/// `acc = _mm256_fmadd_ps(set1(d), _mm256_cvtepi32_ps(v), acc)`: per lane one rounding of
/// `d * v + acc` (the i32 converted to f32 first, to nearest even).
#[inline(always)]
fn fma_lanes(acc: &mut [f32; 8], d: f32, v: &[i32; 8]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = d.mul_add(x as f32, *a);
    }
}

/// The 4-lane reduction ggml writes with `_mm_movehl_ps` and `_mm_movehdup_ps`:
/// `(x0 + x2) + (x1 + x3)`.
#[inline(always)]
fn hsum4(x: &[f32; 4]) -> f32 {
    (x[0] + x[2]) + (x[1] + x[3])
}

/// 32 bytes as int8.
#[inline(always)]
fn i8x32(b: &[u8]) -> [i8; 32] {
    std::array::from_fn(|i| b[i] as i8)
}

/// The sixteen `bsums` of a Q8_K block as i16.
#[inline(always)]
fn bsums(y: &[u8]) -> [i16; 16] {
    std::array::from_fn(|j| i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]))
}

/// The 32 nibbles of a 16-byte group as ggml's `bytes_from_nibbles_32` lays them out:
/// low nibbles are values 0..16, high nibbles values 16..32.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|i| {
        if i < 16 {
            qs[i] & 0x0f
        } else {
            qs[i - 16] >> 4
        }
    })
}

/// A 32-value block of 4-bit indices into a 16-entry table with one scale (IQ4_NL, MXFP4):
/// what the kernels that treat both alike need to know of it.
#[derive(Clone, Copy)]
struct Lut4 {
    /// Bytes per block.
    bytes: usize,
    /// Offset of `qs[16]` (nibbles as [`nibbles`] lays them out).
    qs: usize,
    /// The values of the 16 indices.
    table: &'static [i8; 16],
    /// The block's scale as f32.
    d: fn(&[u8]) -> f32,
}

/// IQ4_NL: f16 `d` @0, `qs` @2, [`KVALUES_IQ4NL`].
const IQ4_NL: Lut4 = Lut4 {
    bytes: 18,
    qs: 2,
    table: &KVALUES_IQ4NL,
    d: |x| f16_at(x, 0),
};

/// MXFP4: E8M0 `e` @0 (`GGML_CPU_E8M0_TO_FP32_HALF`), `qs` @1, [`KVALUES_MXFP4`].
const MXFP4: Lut4 = Lut4 {
    bytes: 17,
    qs: 1,
    table: &KVALUES_MXFP4,
    d: |x| e8m0_to_f32_half(x[0]),
};

/// The table values of a 16-byte group of indices, in the same layout as [`nibbles`].
#[inline(always)]
fn lut_values(qs: &[u8], table: &[i8; 16]) -> [i8; 32] {
    nibbles(qs).map(|q| table[q as usize])
}

/// The IQ4_NL non-linear values of a 16-byte group, in the same layout as [`nibbles`].
#[inline(always)]
fn iq4_values(qs: &[u8]) -> [i8; 32] {
    lut_values(qs, &KVALUES_IQ4NL)
}

/// The i32 lanes of one Q5_0 block with a Q8_0 block (`mul_sum_i8_pairs_float`): each
/// weight byte is the nibble with `0xF0` or'ed in where the fifth bit is clear (so the byte
/// is the signed value `q - 16`).
#[inline(always)]
fn q5_0_lanes(x: &[u8], y: &[u8]) -> [i32; 8] {
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let nib = nibbles(&x[6..22]);
    let qx: [i8; 32] =
        std::array::from_fn(|j| (nib[j] | if (qh >> j) & 1 != 0 { 0 } else { 0xf0 }) as i8);
    let ones = [1i16; 16];
    madd(&maddubs_signed(&qx, &i8x32(&y[2..34])), &ones)
}

/// `ggml_vec_dot_q5_0_q8_0`, AVX2 branch; also what tinyBLAS (`tinyBLAS_Q0_AVX<block_q5_0>`)
/// computes for each output of a product with two or more columns.
///
/// Order: eight f32 lanes; per block `d = dx * dy` (f16 values, exact in f32) and
/// `acc_l = fma(d, isum_l, acc_l)`, `isum_l` the exact sum over values `4l .. 4l + 4` of
/// `(q - 16) * y`; then `hsum_float_8`.
pub(super) fn q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let d = f16_at(x, 0) * f16_at(y, 0);
        fma_lanes(&mut acc, d, &q5_0_lanes(x, y));
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q5_1_q8_1`, AVX2 branch.
///
/// Order: eight f32 lanes; per block `acc_l = fma(isum_l, dx * dy, acc_l)`, `isum_l` the
/// exact sum over values `4l .. 4l + 4` of `q * y` (`q` in 0..32, `mul_sum_us8_pairs_float`);
/// a separate f32 `summs += mx * sy` (exact products of f16 values); the result is
/// `hsum_float_8(acc) + summs`.
pub(super) fn q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    let ones = [1i16; 16];
    for (x, y) in w.chunks_exact(24).zip(a.chunks_exact(36)) {
        summs += f16_at(x, 2) * f16_at(y, 2);
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let nib = nibbles(&x[8..24]);
        let qx: [u8; 32] = std::array::from_fn(|j| nib[j] | (((qh >> j) & 1) << 4) as u8);
        let lanes = madd(&maddubs(&qx, &i8x32(&y[4..36])), &ones);
        fma_lanes(&mut acc, f16_at(x, 0) * f16_at(y, 0), &lanes);
    }
    hsum8(&acc) + summs
}

/// The i32 lanes of one IQ4_NL / MXFP4 block with a Q8_0 block: the table values times the
/// int8 activations through the sign trick, pairs added with `madd` by ones.
#[inline(always)]
fn lut4_lanes(f: Lut4, x: &[u8], y: &[u8]) -> [i32; 8] {
    let ones = [1i16; 16];
    madd(
        &maddubs_signed(&lut_values(&x[f.qs..f.qs + 16], f.table), &i8x32(&y[2..34])),
        &ones,
    )
}

/// The i32 lanes of one IQ4_NL block with a Q8_0 block ([`lut4_lanes`]).
#[inline(always)]
fn iq4_nl_lanes(x: &[u8], y: &[u8]) -> [i32; 8] {
    lut4_lanes(IQ4_NL, x, y)
}

/// `ggml_vec_dot_iq4_nl_q8_0`, AVX2 branch (the product with one activation column).
///
/// Order: two sets of eight f32 lanes, `acc1` for even blocks and `acc2` for odd ones, over
/// the pairs of blocks: `acc_l = fma(dy * dx, isum_l, acc_l)` with `isum_l` the exact sum
/// over values `4l .. 4l + 4`; then `hsum_float_8(acc1 + acc2)` (lanes added first). An odd
/// last block is added in scalar code as GCC compiles it: `sum = fma(dy * dx, isum, sum)`
/// with `isum` the block's exact sum.
pub(super) fn iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    lut4_q8_0(IQ4_NL, w, a)
}

/// `ggml_vec_dot_mxfp4_q8_0`, AVX2 branch: the order of [`iq4_nl_q8_0`] with `dx` the
/// block's `2^(e - 128)` and the values `kvalues_mxfp4[q]`.
pub(super) fn mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
    lut4_q8_0(MXFP4, w, a)
}

/// The even/odd-block order of [`iq4_nl_q8_0`] for a [`Lut4`] format.
#[inline(always)]
fn lut4_q8_0(f: Lut4, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    let (wp, ap) = (w.chunks_exact(2 * f.bytes), a.chunks_exact(68));
    let (w_tail, a_tail) = (wp.remainder(), ap.remainder());
    for (x2, y2) in wp.zip(ap) {
        for (i, (x, y)) in x2
            .chunks_exact(f.bytes)
            .zip(y2.chunks_exact(34))
            .enumerate()
        {
            let d = f16_at(y, 0) * (f.d)(x);
            fma_lanes(&mut acc[i], d, &lut4_lanes(f, x, y));
        }
    }
    let both: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sum = hsum8(&both);
    if let (Some(x), Some(y)) = (w_tail.get(..f.bytes), a_tail.get(..34)) {
        let d = f16_at(y, 0) * (f.d)(x);
        let isum: i32 = lut_values(&x[f.qs..f.qs + 16], f.table)
            .iter()
            .zip(&y[2..34])
            .map(|(&v, &q)| v as i32 * q as i8 as i32)
            .sum();
        sum = d.mul_add(isum as f32, sum);
    }
    sum
}

/// llamafile's `tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>` (sgemm.cpp) for one output: what
/// llama.cpp's CPU `mul_mat` computes for IQ4_NL weights that are not repacked when the
/// product has two or more activation columns.
///
/// Order: one set of eight f32 lanes over all blocks, `acc_l = fma(dx * dy, isum_l, acc_l)`
/// (lanes as in [`iq4_nl_q8_0`]); then the same horizontal sum as `hsum_float_8`.
pub(super) fn iq4_nl_q8_0_tinyblas(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let d = f16_at(x, 0) * f16_at(y, 0);
        fma_lanes(&mut acc, d, &iq4_nl_lanes(x, y));
    }
    hsum8(&acc)
}

/// The integer lanes of one Q2_K super-block with a Q8_K block: `(mins, sums)`.
///
/// `mins_l = m[2l] * bsums[2l] + m[2l+1] * bsums[2l+1]` (the 4-bit mins of the 16-value
/// sub-blocks `2l, 2l + 1`); `sums_l` = over the eight 32-value groups `g`, the scale of the
/// group's first (lanes 0..4) or second (lanes 4..8) 16 values times the exact sum of
/// `q * y` over values `32g + 4(l % 4) + 16(l / 4) .. + 4`.
fn q2_k_lanes(x: &[u8], y: &[u8]) -> ([i32; 8], [i32; 8]) {
    let sc = &x[0..16];
    let mins: [i16; 16] = std::array::from_fn(|j| (sc[j] >> 4) as i16);
    let scales: [i16; 16] = std::array::from_fn(|j| (sc[j] & 0x0f) as i16);
    let q8 = &y[4..260];
    let mut sumi = [0i32; 8];
    for half in 0..QK_K / 128 {
        let q2bits = &x[16 + 32 * half..48 + 32 * half];
        for k in 0..4 {
            let q2: [u8; 32] = std::array::from_fn(|b| (q2bits[b] >> (2 * k)) & 3);
            let g = 4 * half + k;
            let p = maddubs(&q2, &i8x32(&q8[32 * g..]));
            add_i32(
                &mut sumi,
                &madd_halves(&p, scales[2 * g], scales[2 * g + 1]),
            );
        }
    }
    (madd(&mins, &bsums(y)), sumi)
}

/// `ggml_vec_dot_q2_K_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes; per super-block, `d = yd * xd`, `dmin = -yd * xdmin`, first
/// `acc_l = fma(dmin, mins_l, acc_l)`, then `acc_l = fma(d, sums_l, acc_l)` (lanes of
/// [`q2_k_lanes`]); then `hsum_float_8`.
pub(super) fn q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(84).zip(a.chunks_exact(292)) {
        let yd = f32_at(y, 0);
        let d = yd * f16_at(x, 80);
        let dmin = -yd * f16_at(x, 82);
        let (mins, sumi) = q2_k_lanes(x, y);
        fma_lanes(&mut acc, dmin, &mins);
        fma_lanes(&mut acc, d, &sumi);
    }
    hsum8(&acc)
}

/// The integer lanes of one Q3_K super-block with a Q8_K block: over the eight 32-value
/// groups, `maddubs(low 2 bits, y) - maddubs(4 where the high bit is clear, y)` (i16,
/// wrapping), times the scale (`sc - 32`) of the group's first or second 16 values.
fn q3_k_lanes(x: &[u8], y: &[u8]) -> [i32; 8] {
    let hbits = &x[0..32];
    let scales = q3_k_scales(&x[96..108]).map(|s| (s - 32) as i16);
    let q8 = &y[4..260];
    let mut sumi = [0i32; 8];
    for half in 0..QK_K / 128 {
        let q3bits = &x[32 + 32 * half..64 + 32 * half];
        for k in 0..4 {
            let g = 4 * half + k;
            let low: [u8; 32] = std::array::from_fn(|b| (q3bits[b] >> (2 * k)) & 3);
            let high: [u8; 32] =
                std::array::from_fn(|b| if hbits[b] & (1 << g) == 0 { 4 } else { 0 });
            let q = i8x32(&q8[32 * g..]);
            let (pl, ph) = (maddubs(&low, &q), maddubs(&high, &q));
            let p: [i16; 16] = std::array::from_fn(|i| pl[i].wrapping_sub(ph[i]));
            add_i32(
                &mut sumi,
                &madd_halves(&p, scales[2 * g], scales[2 * g + 1]),
            );
        }
    }
    sumi
}

/// `ggml_vec_dot_q3_K_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes; per super-block `acc_l = fma(yd * xd, sums_l, acc_l)` (lanes of
/// [`q3_k_lanes`]); then `hsum_float_8`.
pub(super) fn q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(292)) {
        let d = f32_at(y, 0) * f16_at(x, 108);
        fma_lanes(&mut acc, d, &q3_k_lanes(x, y));
    }
    hsum8(&acc)
}

/// The mins part of a Q4_K / Q5_K super-block: four i32 lanes,
/// `t = m[2t] * s[2t] + m[2t+1] * s[2t+1]` with `s[j] = bsums[2j] + bsums[2j+1]` (i16,
/// wrapping: `_mm_hadd_epi16`) and `m` the eight 6-bit mins.
fn k4_mins(x: &[u8], y: &[u8]) -> [i32; 4] {
    let b = bsums(y);
    let s: [i16; 8] = std::array::from_fn(|j| b[2 * j].wrapping_add(b[2 * j + 1]));
    let m: [i16; 8] = std::array::from_fn(|j| scale_min_k4(j, &x[4..16]).1 as i16);
    std::array::from_fn(|t| {
        (m[2 * t] as i32 * s[2 * t] as i32).wrapping_add(m[2 * t + 1] as i32 * s[2 * t + 1] as i32)
    })
}

/// The scale lanes of a Q4_K / Q5_K super-block: over the eight 32-value groups `g` (weights
/// `q` in `0..16` or `0..32`, from `quants(g)`), the 6-bit scale of group `g` times the
/// exact sums of `q * y` over values `32g + 4l .. + 4`.
#[inline(always)]
fn k4_lanes(x: &[u8], y: &[u8], quants: impl Fn(usize) -> [u8; 32]) -> [i32; 8] {
    let q8 = &y[4..260];
    let mut sumi = [0i32; 8];
    for g in 0..8 {
        let sc = scale_min_k4(g, &x[4..16]).0 as i16;
        let p = maddubs(&quants(g), &i8x32(&q8[32 * g..]));
        add_i32(&mut sumi, &madd_halves(&p, sc, sc));
    }
    sumi
}

/// The 4-bit quants of group `g` (0..8) of a Q4_K super-block: low nibbles of
/// `qs[32 (g / 2) ..]` for even `g`, high nibbles for odd.
#[inline(always)]
fn q4_k_group(x: &[u8], g: usize) -> [u8; 32] {
    let qs = &x[16 + 32 * (g / 2)..48 + 32 * (g / 2)];
    std::array::from_fn(|b| (qs[b] >> (4 * (g % 2))) & 0x0f)
}

/// `ggml_vec_dot_q4_K_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes `acc` and four `acc_m`; per super-block
/// `acc_m_t = fma(-yd * xdmin, mins_t, acc_m_t)` ([`k4_mins`]) and
/// `acc_l = fma(yd * xd, sums_l, acc_l)` ([`k4_lanes`]); the result is
/// `hsum_float_8(acc) + ((acc_m_0 + acc_m_2) + (acc_m_1 + acc_m_3))`.
pub(super) fn q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let yd = f32_at(y, 0);
        let d = yd * f16_at(x, 0);
        let dmin = -yd * f16_at(x, 2);
        for (m, v) in acc_m.iter_mut().zip(k4_mins(x, y)) {
            *m = dmin.mul_add(v as f32, *m);
        }
        fma_lanes(&mut acc, d, &k4_lanes(x, y, |g| q4_k_group(x, g)));
    }
    hsum8(&acc) + hsum4(&acc_m)
}

/// The 5-bit quants of group `g` (0..8) of a Q5_K super-block: as Q4_K's nibbles (of
/// `qs` at byte 48), plus 16 where bit `g` of `qh[b]` is set.
#[inline(always)]
fn q5_k_group(x: &[u8], g: usize) -> [u8; 32] {
    let qs = &x[48 + 32 * (g / 2)..80 + 32 * (g / 2)];
    let qh = &x[16..48];
    std::array::from_fn(|b| ((qs[b] >> (4 * (g % 2))) & 0x0f) + (((qh[b] >> g) & 1) << 4))
}

/// `ggml_vec_dot_q5_K_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes; per super-block the mins as one exact integer (the four
/// [`k4_mins`] lanes added) go into a scalar `summs = fma(-yd * xdmin, mins, summs)` (GCC
/// fuses ggml's `summs += dmin * mins`), and `acc_l = fma(yd * xd, sums_l, acc_l)`
/// ([`k4_lanes`]); the result is `hsum_float_8(acc) + summs`.
pub(super) fn q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(292)) {
        let yd = f32_at(y, 0);
        let d = yd * f16_at(x, 0);
        let dmin = -yd * f16_at(x, 2);
        let mins = k4_mins(x, y).iter().fold(0i32, |s, &v| s.wrapping_add(v));
        summs = dmin.mul_add(mins as f32, summs);
        fma_lanes(&mut acc, d, &k4_lanes(x, y, |g| q5_k_group(x, g)));
    }
    hsum8(&acc) + summs
}

/// The integer lanes of one Q6_K super-block with a Q8_K block.
///
/// The 6-bit quants are used unsigned (0..64); over the eight 32-value groups, the
/// signed 8-bit scale of the group's first or second 16 values times the exact sums of
/// `q * y` over values `32g + 4(l % 4) + 16(l / 4) .. + 4`; then the offset of 32 is taken
/// off per lane as `32 * (bsums[2l] * sc[2l] + bsums[2l+1] * sc[2l+1])`, i.e. lane `l`
/// loses the offset of sub-blocks `2l` and `2l + 1`, not of the values it summed.
fn q6_k_lanes(x: &[u8], y: &[u8]) -> [i32; 8] {
    let sc: [i16; 16] = std::array::from_fn(|j| x[192 + j] as i8 as i16);
    let q8 = &y[4..260];
    let mut sumi = [0i32; 8];
    for half in 0..QK_K / 128 {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..160 + 32 * half];
        for k in 0..4 {
            let g = 4 * half + k;
            let q: [u8; 32] = std::array::from_fn(|b| {
                let low = (ql[b + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
                low | (((qh[b] >> (2 * k)) & 3) << 4)
            });
            let p = maddubs(&q, &i8x32(&q8[32 * g..]));
            add_i32(&mut sumi, &madd_halves(&p, sc[2 * g], sc[2 * g + 1]));
        }
    }
    let offset = madd(&bsums(y), &sc);
    for (s, o) in sumi.iter_mut().zip(offset) {
        *s = s.wrapping_sub(o.wrapping_shl(5));
    }
    sumi
}

/// `ggml_vec_dot_q6_K_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes; per super-block `acc_l = fma(yd * xd, sums_l, acc_l)` (lanes of
/// [`q6_k_lanes`]); then `hsum_float_8`.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let d = f32_at(y, 0) * f16_at(x, 208);
        fma_lanes(&mut acc, d, &q6_k_lanes(x, y));
    }
    hsum8(&acc)
}

/// The integer lanes of one IQ4_XS super-block with a Q8_K block: over the eight 32-value
/// blocks, the block's scale `ls - 32` times the exact sums (through the sign trick, i16
/// pairs) of table value times `y` over values `32 ib + 4l .. + 4`.
fn iq4_xs_lanes(x: &[u8], y: &[u8]) -> [i32; 8] {
    let scales_h = u16_at(x, 2) as u32;
    let q8 = &y[4..260];
    let mut sumi = [0i32; 8];
    for ib in 0..QK_K / 32 {
        let low = (x[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let ls = (low as i32 | (((scales_h >> (2 * ib)) & 3) << 4) as i32) - 32;
        let p = maddubs_signed(
            &iq4_values(&x[8 + 16 * ib..24 + 16 * ib]),
            &i8x32(&q8[32 * ib..]),
        );
        add_i32(&mut sumi, &madd_halves(&p, ls as i16, ls as i16));
    }
    sumi
}

/// `ggml_vec_dot_iq4_xs_q8_K`, AVX2 branch.
///
/// Order: eight f32 lanes; per super-block `acc_l = fma(xd * yd, sums_l, acc_l)` (lanes of
/// [`iq4_xs_lanes`]); then `hsum_float_8`.
pub(super) fn iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(136).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(&mut acc, d, &iq4_xs_lanes(x, y));
    }
    hsum8(&acc)
}

/// The eight i32 lanes of a ternary (TQ1_0 / TQ2_0) super-block with a Q8_K block, as
/// `ggml_vec_dot_tq1_0_q8_K` / `ggml_vec_dot_tq2_0_q8_K` (AVX2) build them: the unsigned
/// digits (0..3) times the activation bytes by `maddubs` (never saturating: at most
/// `2 * 3 * 128` a pair), added in i16 lanes, the Q8_K `bsums` subtracted in i16 (wrapping:
/// the `- 1` of every digit folded through the activation sums), then neighbouring i16
/// lanes added into i32 (`madd` by 1). Both kernels put value `v` of the super-block (its
/// activation byte `v`) in i16 lane `(v % 32) / 2`; integer adds wrap, so their order does
/// not matter.
fn ternary_lanes(digits: &[u8; QK_K], y: &[u8]) -> [i32; 8] {
    let mut l16 = [0i32; 16];
    for (v, &q) in digits.iter().enumerate() {
        l16[(v % 32) / 2] += q as i32 * (y[4 + v] as i8 as i32);
    }
    let ys = bsums(y);
    let l16: [i16; 16] = std::array::from_fn(|p| (l16[p] as i16).wrapping_sub(ys[p]));
    std::array::from_fn(|l| l16[2 * l] as i32 + l16[2 * l + 1] as i32)
}

/// `ggml_vec_dot_tq1_0_q8_K` (AVX2): the lanes of [`ternary_lanes`] per super-block (digits
/// as `dequantize_row_tq1_0` extracts them, which the kernel's `avg_epu8` arithmetic equals
/// for every byte), `acc = fma(f32(lane), dy * dx, acc)` (GCC fuses the kernel's
/// `add(mul(..), acc)`), `hsum_float_8` at the end.
pub(super) fn tq1_0_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(54).zip(a.chunks_exact(292)) {
        let d = f32_at(y, 0) * f16_at(x, 52);
        fma_lanes(
            &mut acc,
            d,
            &ternary_lanes(&super::dequant::tq1_0_digits(x), y),
        );
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_tq2_0_q8_K` (AVX2): as [`tq1_0_q8_k`] with the 2-bit digits of TQ2_0.
pub(super) fn tq2_0_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(66).zip(a.chunks_exact(292)) {
        let d = f32_at(y, 0) * f16_at(x, 64);
        let digits: [u8; QK_K] =
            std::array::from_fn(|v| (x[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3);
        fma_lanes(&mut acc, d, &ternary_lanes(&digits, y));
    }
    hsum8(&acc)
}

/// The 8 i32 lanes of one IQ3_XXS / IQ3_S super-block with a Q8_K block, as their AVX2
/// `vec_dot` kernels build them: per 32-value block the grid magnitudes (unsigned bytes, at
/// most 62) times the Q8_K bytes with the block's signs applied to the activation
/// (`_mm256_sign_epi8` in IQ3_XXS, `(y ^ s) - s` in IQ3_S: both leave `-(-128)` at `-128`)
/// by `maddubs`, times `2 ls + 1` by `madd` (IQ2_XS: the scale of values 0..16 of the block in
/// i16 lanes 0..8, of 16..32 in 8..16); value `v` in lane `(v % 32) / 4` (the kernels'
/// even and odd blocks in two sets that are added, which is exact).
fn grid_lanes(u: &super::dequant::GridValues, y: &[u8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for ib in 0..8 {
        let mag: [u8; 32] = std::array::from_fn(|b| u.mag[32 * ib + b]);
        let sy: [i8; 32] = std::array::from_fn(|b| {
            let v = y[4 + 32 * ib + b] as i8;
            if u.neg[32 * ib + b] {
                v.wrapping_neg()
            } else {
                v
            }
        });
        let lo = 2 * u.ls[2 * ib] as i16 + 1;
        let hi = 2 * u.ls[2 * ib + 1] as i16 + 1;
        add_i32(&mut lanes, &madd_halves(&maddubs(&mag, &sy), lo, hi));
    }
    lanes
}

/// The tiled kernel's exact `s1 = Σ_b (2 ls_b + 1) · Σ w · y` of an IQ3_XXS / IQ3_S
/// super-block, `w` the signed grid values (the kernel's +128 activation bias is taken out
/// again in integers, so a `-128` activation counts as itself).
fn grid_tiled_s1(u: &super::dequant::GridValues, y: &[u8]) -> i32 {
    let mut s1 = 0i32;
    for h in 0..16 {
        let mut sumi = 0i32;
        for v in 16 * h..16 * h + 16 {
            let p = u.mag[v] as i32 * (y[4 + v] as i8 as i32);
            sumi += if u.neg[v] { -p } else { p };
        }
        s1 = s1.wrapping_add(sumi * (2 * u.ls[h] as i32 + 1));
    }
    s1
}

/// `ggml_vec_dot_iq3_xxs_q8_K` (AVX2): the lanes of [`grid_lanes`] per super-block,
/// `acc = fma(dx · dy, f32(lane), acc)`; at the end `0.25 · hsum_float_8(acc)`.
pub(super) fn iq3_xxs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(98).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(
            &mut acc,
            d,
            &grid_lanes(&super::dequant::iq3_xxs_unpack(x), y),
        );
    }
    0.25 * hsum8(&acc)
}

/// One IQ3_XXS super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq3_xxs`):
/// the weight's scale `d · 0.25` (f32) and [`grid_tiled_s1`].
pub(super) fn tiled_iq3_xxs(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0) * 0.25,
        dmin: 0.0,
        s1: grid_tiled_s1(&super::dequant::iq3_xxs_unpack(x), y),
        s2: None,
    }
}

/// `ggml_vec_dot_iq2_xxs_q8_K` (AVX2): the lanes of [`grid_lanes`] (magnitudes at most 43)
/// per super-block, `acc = fma(dx · dy, f32(lane), acc)`; `0.125 · hsum_float_8(acc)` at
/// the end.
pub(super) fn iq2_xxs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(66).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(
            &mut acc,
            d,
            &grid_lanes(&super::dequant::iq2_xxs_unpack(x), y),
        );
    }
    0.125 * hsum8(&acc)
}

/// One IQ2_XXS super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq2_xxs`):
/// the weight's scale `d · 0.125` (f32) and [`grid_tiled_s1`].
pub(super) fn tiled_iq2_xxs(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0) * 0.125,
        dmin: 0.0,
        s1: grid_tiled_s1(&super::dequant::iq2_xxs_unpack(x), y),
        s2: None,
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K` (AVX2): as [`iq2_xxs_q8_k`] (its sign bytes completed by
/// parity are `ksigns_iq2xs`; its scale shuffle gives each 16 values their own scale).
pub(super) fn iq2_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(74).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(
            &mut acc,
            d,
            &grid_lanes(&super::dequant::iq2_xs_unpack(x), y),
        );
    }
    0.125 * hsum8(&acc)
}

/// One IQ2_XS super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq2_xs`,
/// 16-value sub-blocks): `d · 0.125` and [`grid_tiled_s1`].
pub(super) fn tiled_iq2_xs(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0) * 0.125,
        dmin: 0.0,
        s1: grid_tiled_s1(&super::dequant::iq2_xs_unpack(x), y),
        s2: None,
    }
}

/// `ggml_vec_dot_iq2_s_q8_K` (AVX2): as [`iq2_xs_q8_k`] (IQ2_S's sign bytes are stored
/// whole; its scale shuffle also gives each 16 values their own scale).
pub(super) fn iq2_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(82).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(
            &mut acc,
            d,
            &grid_lanes(&super::dequant::iq2_s_unpack(x), y),
        );
    }
    0.125 * hsum8(&acc)
}

/// One IQ2_S super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq2_s`,
/// 16-value sub-blocks): `d · 0.125` and [`grid_tiled_s1`].
pub(super) fn tiled_iq2_s(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0) * 0.125,
        dmin: 0.0,
        s1: grid_tiled_s1(&super::dequant::iq2_s_unpack(x), y),
        s2: None,
    }
}

/// `ggml_vec_dot_iq1_s_q8_K` (AVX2). Per 32-value block the grid values (-1, 0, 1) times
/// the Q8_K bytes by the sign trick (`mul_add_epi8`), times `2 ls + 1` (`madd`), into 8 i32
/// lanes; the delta's integer part `sumi1 = Σ (2 ls + 1) · (±1) · (bsums[2 ib] +
/// bsums[2 ib + 1])` apart. Per super-block `d = dy · dx`, `acc = fma(d, f32(lane), acc)`,
/// `acc1 = fma(d, f32(sumi1), acc1)` (as GCC fuses `accum1 += d * sumi1`); at the end
/// `hsum_float_8(acc) + 0.125 · acc1` (product, then sum).
pub(super) fn iq1_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc1 = 0f32;
    for (x, y) in w.chunks_exact(50).zip(a.chunks_exact(292)) {
        let u = super::dequant::iq1_s_unpack(x);
        let ys = bsums(y);
        let mut lanes = [0i32; 8];
        let mut sumi1 = 0i32;
        for ib in 0..8 {
            let g: [i8; 32] = std::array::from_fn(|b| u.grid[32 * ib + b]);
            let ls = 2 * u.ls[ib] as i16 + 1;
            let p = maddubs_signed(&g, &i8x32(&y[4 + 32 * ib..]));
            add_i32(&mut lanes, &madd(&p, &[ls; 16]));
            let delta = if u.delta_neg[ib] { -1 } else { 1 };
            sumi1 += (ys[2 * ib] as i32 + ys[2 * ib + 1] as i32) * delta * ls as i32;
        }
        let d = f32_at(y, 0) * f16_at(x, 0);
        fma_lanes(&mut acc, d, &lanes);
        acc1 = d.mul_add(sumi1 as f32, acc1);
    }
    hsum8(&acc) + 0.125 * acc1
}

/// One IQ1_S super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq1_s`): the
/// weights as the codes `8 · grid + delta` (delta ±1), `d · 0.125`, and the exact
/// `s1 = Σ (2 ls + 1) · Σ (8 grid + delta) · y`.
pub(super) fn tiled_iq1_s(x: &[u8], y: &[u8]) -> TiledBlock {
    let u = super::dequant::iq1_s_unpack(x);
    let mut s1 = 0i32;
    for ib in 0..8 {
        let delta = if u.delta_neg[ib] { -1 } else { 1 };
        let sumi: i32 = (32 * ib..32 * ib + 32)
            .map(|v| (8 * u.grid[v] as i32 + delta) * (y[4 + v] as i8 as i32))
            .sum();
        s1 = s1.wrapping_add(sumi * (2 * u.ls[ib] as i32 + 1));
    }
    TiledBlock {
        d: f16_at(x, 0) * 0.125,
        dmin: 0.0,
        s1,
        s2: None,
    }
}

/// `ggml_vec_dot_iq1_m_q8_K` (AVX2). Per 32-value block the grid values times the Q8_K
/// bytes by the sign trick into i16 pairs, and the activation bytes with each 8 values'
/// delta sign applied (`_mm256_sign_epi8`: `-(-128)` stays `-128`) added in pairs; each
/// times its 16 values' `2 ls + 1` (`madd`, lanes 0..8 the first 16 values), into two sets of
/// 8 i32 lanes. Per super-block `d = dy · d`, `acc1 = fma(d, f32(lane1), acc1)`,
/// `acc2 = fma(d, f32(lane2), acc2)`; at the end
/// `fma(hsum_float_8(acc2), 0.125, hsum_float_8(acc1))` (as GCC fuses it).
pub(super) fn iq1_m_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc1 = [0f32; 8];
    let mut acc2 = [0f32; 8];
    for (x, y) in w.chunks_exact(56).zip(a.chunks_exact(292)) {
        let u = super::dequant::iq1_m_unpack(x);
        let mut l1 = [0i32; 8];
        let mut l2 = [0i32; 8];
        for ib in 0..8 {
            let g: [i8; 32] = std::array::from_fn(|b| u.grid[32 * ib + b]);
            let yv = i8x32(&y[4 + 32 * ib..]);
            let lo = 2 * u.ls[2 * ib] as i16 + 1;
            let hi = 2 * u.ls[2 * ib + 1] as i16 + 1;
            add_i32(&mut l1, &madd_halves(&maddubs_signed(&g, &yv), lo, hi));
            let sy: [i8; 32] = std::array::from_fn(|b| {
                if u.delta_neg[4 * ib + b / 8] {
                    yv[b].wrapping_neg()
                } else {
                    yv[b]
                }
            });
            add_i32(&mut l2, &madd_halves(&maddubs(&[1u8; 32], &sy), lo, hi));
        }
        let d = f32_at(y, 0) * u.d;
        fma_lanes(&mut acc1, d, &l1);
        fma_lanes(&mut acc2, d, &l2);
    }
    hsum8(&acc2).mul_add(0.125, hsum8(&acc1))
}

/// One IQ1_M super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq1_m`,
/// 16-value sub-blocks): codes `8 · grid + delta` (delta ±1 per 8 values), `d · 0.125`, and
/// the exact `s1 = Σ (2 ls + 1) · Σ (8 grid + delta) · y`.
pub(super) fn tiled_iq1_m(x: &[u8], y: &[u8]) -> TiledBlock {
    let u = super::dequant::iq1_m_unpack(x);
    let mut s1 = 0i32;
    for h in 0..16 {
        let sumi: i32 = (16 * h..16 * h + 16)
            .map(|v| {
                let delta = if u.delta_neg[v / 8] { -1 } else { 1 };
                (8 * u.grid[v] as i32 + delta) * (y[4 + v] as i8 as i32)
            })
            .sum();
        s1 = s1.wrapping_add(sumi * (2 * u.ls[h] as i32 + 1));
    }
    TiledBlock {
        d: u.d * 0.125,
        dmin: 0.0,
        s1,
        s2: None,
    }
}

/// `ggml_vec_dot_iq3_s_q8_K` (AVX2): the lanes of [`grid_lanes`] per super-block,
/// `acc = fma(dx · dy, f32(lane), acc)`; `hsum_float_8(acc)` at the end.
pub(super) fn iq3_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        fma_lanes(
            &mut acc,
            d,
            &grid_lanes(&super::dequant::iq3_s_unpack(x), y),
        );
    }
    hsum8(&acc)
}

/// One IQ3_S super-block of the tiled kernel (`tiled_unpack_src0` for `block_iq3_s`): the
/// weight's `d` and [`grid_tiled_s1`].
pub(super) fn tiled_iq3_s(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0),
        dmin: 0.0,
        s1: grid_tiled_s1(&super::dequant::iq3_s_unpack(x), y),
        s2: None,
    }
}

/// The sum of the eight i32 lanes (wrapping, as the registers add).
#[inline(always)]
fn lanes_sum(v: &[i32; 8]) -> i32 {
    v.iter().fold(0i32, |s, &x| s.wrapping_add(x))
}

/// One super-block of the tiled kernel: the weight block's `d` and `dmin` (f16 values) and
/// the exact integers `s1 = sum over sub-blocks of scale * (w . y)` and, for types with
/// mins, `s2 = sum over sub-blocks of min * bsum`.
pub(super) struct TiledBlock {
    d: f32,
    dmin: f32,
    s1: i32,
    s2: Option<i32>,
}

/// A function giving the [`TiledBlock`] of one weight super-block and one Q8_K block.
pub(super) type TiledFn = fn(&[u8], &[u8]) -> TiledBlock;

/// The tiled K-quant product of llama.cpp's CPU backend (ggml-cpu/tiled: `tiled.cpp`, the
/// AVX2 microkernel of `tiled-kernel.cpp`), which `ggml_compute_forward_mul_mat` runs instead
/// of `vec_dot` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights that are not repacked when
/// the product has 8 or more activation columns (`ggml_tiled_min_batch`; `GGML_CPU_TILED_MM`
/// unset or non-zero), for one output.
///
/// Order: the integer dot product of each 256-value super-block is exact (`s1`, and `s2` for
/// the mins of Q2_K / Q4_K / Q5_K: [`TiledBlock`]); per super-block, in order, one f32
/// `r = xd * s1`, then `r = fma(-xdmin, s2, r)` where there are mins, then
/// `out = fma(r, yd, out)` from `out = 0`. The activation's scale comes last, unlike in
/// `vec_dot`; no lanes, no horizontal sum.
pub(super) fn tiled_q8_k(w: &[u8], a: &[u8], block_bytes: usize, block: TiledFn) -> f32 {
    let mut out = 0f32;
    for (x, y) in w.chunks_exact(block_bytes).zip(a.chunks_exact(292)) {
        let b = block(x, y);
        let mut r = b.d * b.s1 as f32;
        if let Some(s2) = b.s2 {
            r = (-b.dmin).mul_add(s2 as f32, r);
        }
        out = r.mul_add(f32_at(y, 0), out);
    }
    out
}

/// [`TiledBlock`] of a Q2_K super-block (4-bit scales and mins per 16 values).
pub(super) fn tiled_q2_k(x: &[u8], y: &[u8]) -> TiledBlock {
    let (mins, sums) = q2_k_lanes(x, y);
    TiledBlock {
        d: f16_at(x, 80),
        dmin: f16_at(x, 82),
        s1: lanes_sum(&sums),
        s2: Some(lanes_sum(&mins)),
    }
}

/// [`TiledBlock`] of a Q3_K super-block (weights `q - 4` where the high bit is clear).
pub(super) fn tiled_q3_k(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 108),
        dmin: 0.0,
        s1: lanes_sum(&q3_k_lanes(x, y)),
        s2: None,
    }
}

/// The exact `sum over the eight 32-value groups of min * (bsums[2g] + bsums[2g+1])` of a
/// Q4_K / Q5_K super-block, in i32 as the tiled kernel sums it.
fn tiled_k4_mins(x: &[u8], y: &[u8]) -> i32 {
    let b = bsums(y);
    (0..8).fold(0i32, |s, g| {
        let m = scale_min_k4(g, &x[4..16]).1 as i32;
        s.wrapping_add(m.wrapping_mul(b[2 * g] as i32 + b[2 * g + 1] as i32))
    })
}

/// [`TiledBlock`] of a Q4_K super-block.
pub(super) fn tiled_q4_k(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0),
        dmin: f16_at(x, 2),
        s1: lanes_sum(&k4_lanes(x, y, |g| q4_k_group(x, g))),
        s2: Some(tiled_k4_mins(x, y)),
    }
}

/// [`TiledBlock`] of a Q5_K super-block.
pub(super) fn tiled_q5_k(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0),
        dmin: f16_at(x, 2),
        s1: lanes_sum(&k4_lanes(x, y, |g| q5_k_group(x, g))),
        s2: Some(tiled_k4_mins(x, y)),
    }
}

/// [`TiledBlock`] of a Q6_K super-block (weights `q - 32`).
pub(super) fn tiled_q6_k(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 208),
        dmin: 0.0,
        s1: lanes_sum(&q6_k_lanes(x, y)),
        s2: None,
    }
}

/// [`TiledBlock`] of an IQ4_XS super-block (table values, scales `ls - 32`).
pub(super) fn tiled_iq4_xs(x: &[u8], y: &[u8]) -> TiledBlock {
    TiledBlock {
        d: f16_at(x, 0),
        dmin: 0.0,
        s1: lanes_sum(&iq4_xs_lanes(x, y)),
        s2: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{
        dequantize, f32_to_f16, quantize_activations, vec_dot, vec_dot_avx2, vec_dot_avx2_mul_mat,
        GgmlType, Q8Flavor,
    };

    /// xorshift
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random blocks of `t` with finite, moderate f16 scales at their places.
    fn random_row(t: GgmlType, n: usize, seed: &mut u64) -> Vec<u8> {
        let mut w = vec![0u8; n / t.block_size() * t.type_size()];
        w.iter_mut().for_each(|b| *b = next(seed) as u8);
        for blk in w.chunks_exact_mut(t.type_size()) {
            let mut put = |at: usize, v: f32| {
                blk[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
            };
            let d = ((next(seed) % 1000) as f32 * 2e-5 + 1e-3)
                * if next(seed).is_multiple_of(5) {
                    -1.0
                } else {
                    1.0
                };
            let m = (next(seed) % 1000) as f32 * 1e-5;
            match t {
                GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => put(0, d),
                GgmlType::Q5_1 => {
                    put(0, d);
                    put(2, -8.0 * m);
                }
                GgmlType::Q2_K => {
                    put(80, d);
                    put(82, m);
                }
                GgmlType::Q3_K => put(108, d),
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    put(0, d);
                    put(2, m);
                }
                GgmlType::Q6_K => put(208, d),
                _ => unreachable!("no test rows for {t}"),
            }
        }
        w
    }

    const TYPES: [GgmlType; 9] = [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ];

    /// Every kernel computes ggml's scalar dot product up to f32 rounding: within 1e-5 of
    /// `sum |w_i| |a_i|` of the scalar `vec_dot` (a wrong lane, scale or offset would be off
    /// by a whole term, about 1/n of that), for one and for several blocks, odd and even
    /// counts; and at least some results differ in the last bits (the order is another).
    #[test]
    fn kernels_agree_with_the_scalar_dot_product() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for t in TYPES {
            let bs = t.block_size();
            let mut differ = 0;
            let mut total = 0;
            for blocks in [1usize, 2, 3, 8] {
                let n = bs * blocks;
                for _ in 0..12 {
                    let w = random_row(t, n, &mut seed);
                    let x: Vec<f32> = (0..n)
                        .map(|_| (next(&mut seed) % 20001) as f32 / 5000.0 - 2.0)
                        .collect();
                    let (at, act) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
                    let ours = vec_dot_avx2(t, &w, &act).unwrap();
                    let scalar = vec_dot(t, &w, &act).unwrap();
                    let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
                    dequantize(t, &w, &mut wf).unwrap();
                    dequantize(at, &act, &mut af).unwrap();
                    let scale: f64 = wf.iter().zip(&af).map(|(p, q)| (p * q).abs() as f64).sum();
                    assert!(
                        ((ours - scalar) as f64).abs() <= 1e-5 * scale,
                        "{t} {blocks} blocks: {ours} vs scalar {scalar} (scale {scale})"
                    );
                    differ += (ours.to_bits() != scalar.to_bits()) as usize;
                    total += 1;
                    // tinyBLAS (IQ4_NL from 2 columns), the tiled K-quant kernel (from 8)
                    for cols in [2, 8] {
                        let other = vec_dot_avx2_mul_mat(t, &w, &act, cols).unwrap();
                        assert!(
                            ((other - scalar) as f64).abs() <= 1e-5 * scale,
                            "{t} with {cols} columns: {other} vs scalar {scalar}"
                        );
                    }
                }
            }
            assert!(
                differ > 0,
                "{t}: all {total} results equal the scalar order's"
            );
        }
    }

    /// One-hot activations put a weight's product in the lane ggml's registers give it.
    #[test]
    fn lanes_hold_values_4l_to_4l_plus_4_of_each_group() {
        // Q5_0: nibble 3 with the fifth bit set everywhere (value 19 - 16 = 3).
        let mut x = vec![0u8; 22];
        x[2..6].copy_from_slice(&[0xff; 4]);
        x[6..22].fill(0x33);
        for v in 0..32 {
            let mut y = vec![0u8; 34];
            y[2 + v] = 5;
            let lanes = q5_0_lanes(&x, &y);
            let want: [i32; 8] = std::array::from_fn(|l| if l == v / 4 { 15 } else { 0 });
            assert_eq!(lanes, want, "Q5_0 value {v}");
        }
        // Q4_K: all quants 1, scales of group g = g + 1, activation 1 at value i only.
        let mut x = vec![0u8; 144];
        x[4..16].copy_from_slice(&[1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8]);
        x[16..144].fill(0x11);
        for i in [0usize, 5, 17, 31, 32, 100, 255] {
            let mut y = vec![0u8; 292];
            y[4 + i] = 1;
            let lanes = k4_lanes(&x, &y, |g| q4_k_group(&x, g));
            let want: [i32; 8] = std::array::from_fn(|l| {
                if l == (i % 32) / 4 {
                    (i / 32 + 1) as i32
                } else {
                    0
                }
            });
            assert_eq!(lanes, want, "Q4_K value {i}");
        }
    }

    /// Q6_K takes the offset 32 off by sub-block pairs, not where the values were summed:
    /// with every quant at 32 (weight 0), scale 1 and activations 1 on values 0..16, the
    /// dot product is 0 but lane 0 holds `4 * 32 - 32 * 16 = -384` and lanes 1..4 hold 128.
    #[test]
    fn q6_k_subtracts_the_offset_by_sub_block_pairs() {
        let mut x = vec![0u8; 210];
        // q = 32: low nibble 0, high bits 2 (0b10) in every 2-bit field of qh.
        x[128..192].fill(0b1010_1010);
        x[192..208].fill(1);
        let mut y = vec![0u8; 292];
        y[4..20].fill(1);
        y[260..262].copy_from_slice(&16i16.to_le_bytes());
        assert_eq!(q6_k_lanes(&x, &y), [-384, 128, 128, 128, 0, 0, 0, 0]);
    }

    /// IQ4_NL with one column adds even and odd blocks in two accumulators, tinyBLAS in one:
    /// with three blocks the odd one is fused into the sum at the end. Both are checked here
    /// against a direct computation of the documented order.
    #[test]
    fn iq4_nl_orders() {
        let mut seed = 77u64;
        let w = random_row(GgmlType::IQ4_NL, 96, &mut seed);
        let x: Vec<f32> = (0..96).map(|i| (i as f32 * 0.37).sin()).collect();
        let (_, act) = quantize_activations(GgmlType::IQ4_NL, &x, Q8Flavor::X86).unwrap();
        let blocks: Vec<(&[u8], &[u8])> = w.chunks_exact(18).zip(act.chunks_exact(34)).collect();
        let d = |b: usize| f16_at(blocks[b].1, 0) * f16_at(blocks[b].0, 0);
        let lanes = |b: usize| iq4_nl_lanes(blocks[b].0, blocks[b].1).map(|v| v as f32);
        let (l0, l1, l2) = (lanes(0), lanes(1), lanes(2));
        let a1: [f32; 8] = std::array::from_fn(|l| d(0).mul_add(l0[l], 0.0));
        let a2: [f32; 8] = std::array::from_fn(|l| d(1).mul_add(l1[l], 0.0));
        let both: [f32; 8] = std::array::from_fn(|l| a1[l] + a2[l]);
        let tail: f32 = l2.iter().sum();
        let want = d(2).mul_add(tail, hsum8(&both));
        assert_eq!(iq4_nl_q8_0(&w, &act).to_bits(), want.to_bits());
        let one: [f32; 8] =
            std::array::from_fn(|l| d(2).mul_add(l2[l], d(1).mul_add(l1[l], d(0) * l0[l])));
        assert_eq!(
            iq4_nl_q8_0_tinyblas(&w, &act).to_bits(),
            hsum8(&one).to_bits()
        );
    }

    /// The tiled K-quant kernel (8 or more columns) scales each super-block's exact integer
    /// sums by the weight's `d` and `dmin` first and fuses the activation's `d` last; with
    /// fewer columns the same row goes through `vec_dot`'s lanes.
    #[test]
    fn tiled_order_from_eight_columns() {
        let mut seed = 99u64;
        let w = random_row(GgmlType::Q4_K, 512, &mut seed);
        let x: Vec<f32> = (0..512).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let (_, act) = quantize_activations(GgmlType::Q4_K, &x, Q8Flavor::X86).unwrap();
        let mut want = 0f32;
        for (xb, yb) in w.chunks_exact(144).zip(act.chunks_exact(292)) {
            let b = tiled_q4_k(xb, yb);
            let s1 = lanes_sum(&k4_lanes(xb, yb, |g| q4_k_group(xb, g)));
            let s2: i32 = (0..8)
                .map(|g| {
                    let m = scale_min_k4(g, &xb[4..16]).1 as i32;
                    m * (bsums(yb)[2 * g] as i32 + bsums(yb)[2 * g + 1] as i32)
                })
                .sum();
            assert_eq!((b.s1, b.s2), (s1, Some(s2)));
            let r = (-f16_at(xb, 2)).mul_add(s2 as f32, f16_at(xb, 0) * s1 as f32);
            want = r.mul_add(f32_at(yb, 0), want);
        }
        let tiled = vec_dot_avx2_mul_mat(GgmlType::Q4_K, &w, &act, 8).unwrap();
        assert_eq!(tiled.to_bits(), want.to_bits());
        for cols in [1, 2, 7] {
            let v = vec_dot_avx2_mul_mat(GgmlType::Q4_K, &w, &act, cols).unwrap();
            assert_eq!(v.to_bits(), q4_k_q8_k(&w, &act).to_bits());
        }
    }

    /// The integer helpers follow the instructions: `maddubs` saturates, the sign trick maps
    /// `-128` as the hardware does.
    #[test]
    fn integer_helpers_follow_the_instructions() {
        let u = [255u8; 32];
        let s = [127i8; 32];
        assert_eq!(maddubs(&u, &s), [i16::MAX; 16]);
        let s = [-128i8; 32];
        assert_eq!(maddubs(&u, &s), [i16::MIN; 16]);
        // x = -1, y = -128: |x| = 1, sign(y, x) = -(-128) wraps to -128.
        let p = maddubs_signed(&[-1i8; 32], &[-128i8; 32]);
        assert_eq!(p, [-256i16; 16]);
        let p = maddubs_signed(&[0i8; 32], &[100i8; 32]);
        assert_eq!(p, [0i16; 16]);
        assert_eq!(madd(&[i16::MIN; 16], &[i16::MIN; 16]), [i32::MIN; 8]);
        assert_eq!(hsum4(&[1.0, 2.0, 3.0, 4.0]), 10.0);
    }

    /// Cross-check with llama.cpp itself, when a file made by running its CPU `mul_mat` is
    /// given in `MODELC_GGML_MULMAT` (records, little-endian: `1, type, k, m, n`, the weight
    /// bytes, `n * k` f32 activations, llama.cpp's `n * m` f32 results; `2, type, k`, `k`
    /// f32, llama.cpp's quantized row; `0` at the end). The interpreter in llama.cpp mode must
    /// give the same bits for every product, and the activation quantizers the same bytes.
    /// Without the variable the test has nothing to compare and passes.
    #[test]
    fn matches_llama_cpp_mul_mat_dump() {
        use crate::graph::{DType, Graph, Input, Shape};
        use crate::interp::{Inputs, InterpOptions, Interpreter, MemWeights};
        let Some(path) = std::env::var_os("MODELC_GGML_MULMAT") else {
            return;
        };
        let data = std::fs::read(path).expect("MODELC_GGML_MULMAT names a readable file");
        assert_eq!(&data[..4], b"H1MM");
        let mut at = 4usize;
        let u32_ = |at: &mut usize| {
            let v = u32::from_le_bytes(data[*at..*at + 4].try_into().expect("4 bytes"));
            *at += 4;
            v as usize
        };
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (mut products, mut rows, mut bad) = (0, 0, Vec::new());
        let mut scalar_differs = 0;
        loop {
            match u32_(&mut at) {
                0 => break,
                1 => {
                    let t = GgmlType::from_id(u32_(&mut at) as u32).expect("type id");
                    let (k, m, n) = (u32_(&mut at), u32_(&mut at), u32_(&mut at));
                    let wb = t.row_size(k as u64).expect("whole blocks") as usize * m;
                    let w = data[at..at + wb].to_vec();
                    at += wb;
                    let x = f32s(&data[at..at + 4 * n * k]);
                    at += 4 * n * k;
                    let want = f32s(&data[at..at + 4 * n * m]);
                    at += 4 * n * m;
                    let mut g = Graph::new();
                    let wt = g.weight("w", DType::Block(t), Shape::new(&[k as u64, m as u64]));
                    let xt = g.input(
                        "x",
                        Input::Data,
                        DType::F32,
                        Shape::new(&[k as u64, n as u64]),
                    );
                    let y = g.mul_mat("y", wt, xt).expect("mul_mat");
                    g.outputs.push(y);
                    let mut mw = MemWeights::new();
                    mw.insert("w", t, [k as u64, m as u64, 1, 1], w);
                    let opts = InterpOptions {
                        q8_flavor: Q8Flavor::X86,
                        n_threads: 1,
                        ..InterpOptions::llama_cpp()
                    };
                    let xs = [("x", &x[..])];
                    let inputs = Inputs {
                        tokens: &[],
                        positions: &[],
                        output_ids: &[],
                        kv_len: 0,
                        data: &xs,
                    };
                    let out = Interpreter::new(&mw, opts).run(&g, &inputs).expect("run");
                    let scalar = InterpOptions {
                        avx2_order: false,
                        ..opts
                    };
                    let out_ref = Interpreter::new(&mw, scalar).run(&g, &inputs).expect("run");
                    scalar_differs += out_ref[0]
                        .iter()
                        .zip(&want)
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                        as usize;
                    let diff = out[0]
                        .iter()
                        .zip(&want)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    if let Some((i, (o, w))) = out[0]
                        .iter()
                        .zip(&want)
                        .enumerate()
                        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
                    {
                        bad.push(format!(
                            "{t} k={k} m={m} n={n}: {diff} of {} differ, first [{}, {}]: \
                             {o} vs llama.cpp {w}",
                            m * n,
                            i % m,
                            i / m
                        ));
                    }
                    products += 1;
                }
                2 => {
                    let t = GgmlType::from_id(u32_(&mut at) as u32).expect("type id");
                    let k = u32_(&mut at);
                    let x = f32s(&data[at..at + 4 * k]);
                    at += 4 * k;
                    let nb = t.row_size(k as u64).expect("whole blocks") as usize;
                    let want = &data[at..at + nb];
                    at += nb;
                    let mut ours = vec![0u8; nb];
                    crate::ggml::quantize(t, &x, &mut ours, Q8Flavor::X86).expect("quantize");
                    if ours != want {
                        bad.push(format!("{t} quantizer differs"));
                    }
                    rows += 1;
                }
                r => panic!("unknown record {r}"),
            }
        }
        eprintln!(
            "{products} products and {rows} quantized rows compared with llama.cpp; \
             {scalar_differs} products differ in ggml's scalar order"
        );
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        assert!(
            scalar_differs > 0,
            "the dump does not tell the orders apart"
        );
    }
}
