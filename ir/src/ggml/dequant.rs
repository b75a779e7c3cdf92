//! The reference dequantizer: GGML blocks to f32, bit-exact with ggml's `dequantize_row_*`
//! (ggml-quants.c) and `to_float` of the plain types.
//!
//! Each format is a plain loop over blocks written after the description in
//! [`super::format`]; the tests check every one bit for bit against
//! [`BlockFormat::decode_value`](super::BlockFormat::decode_value) on random blocks and against
//! the llama.cpp vectors in `shared/fixtures/dequant/`. The f32 operations are done in ggml's
//! order, e.g. Q4_K computes `d1 = d * sc` and `m1 = dmin * m` first, then `d1 * q - m1`.

use super::error::{check_lengths, BlockDataError};
use super::fp::{bf16_to_f32, e8m0_to_f32_half, f16_at, f32_at, u16_at};
use super::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};
use super::layouts::KVALUES_IQ4NL;
use super::{GgmlType, QK_K};

/// Dequantizes `dst.len()` values of type `t` from `src` into `dst`.
///
/// `src` holds `dst.len() / block_size` blocks back to back (one row or many rows: rows of a
/// GGML tensor are whole blocks, so they concatenate). The values come out in block order,
/// value `b * block_size + i` being value `i` of block `b`.
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K,
/// Q6_K, Q8_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, MXFP4. (ggml itself has no `to_float` for Q8_1; here
/// it is `d * q`.)
///
/// # Errors
/// [`BlockDataError::Unsupported`] naming the type for any other type;
/// [`BlockDataError::PartialBlock`] if `dst.len()` is not a multiple of the block size;
/// [`BlockDataError::ByteLength`] if `src.len()` is not `dst.len() / block_size * type_size`.
pub fn dequantize(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), BlockDataError> {
    if super::block_format(t).is_none() {
        return Err(BlockDataError::Unsupported {
            op: "dequantize",
            ty: t,
        });
    }
    check_lengths(t, "src", dst.len(), src.len())?;
    let blocks = src.chunks_exact(t.type_size());
    let outs = dst.chunks_exact_mut(t.block_size());
    match t {
        GgmlType::F32 => blocks.zip(outs).for_each(|(b, y)| y[0] = f32_at(b, 0)),
        GgmlType::F16 => blocks.zip(outs).for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks
            .zip(outs)
            .for_each(|(b, y)| y[0] = bf16_to_f32(u16_at(b, 0))),
        GgmlType::Q4_0 => blocks.zip(outs).for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.zip(outs).for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.zip(outs).for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.zip(outs).for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks
            .zip(outs)
            .for_each(|(b, y)| q8(f16_at(b, 0), &b[2..], y)),
        GgmlType::Q8_1 => blocks
            .zip(outs)
            .for_each(|(b, y)| q8(f16_at(b, 0), &b[4..], y)),
        GgmlType::Q8_K => blocks
            .zip(outs)
            .for_each(|(b, y)| q8(f32_at(b, 0), &b[4..260], y)),
        GgmlType::Q2_K => blocks.zip(outs).for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3_K => blocks.zip(outs).for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4_K => blocks.zip(outs).for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.zip(outs).for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.zip(outs).for_each(|(b, y)| q6_k(b, y)),
        GgmlType::IQ4_NL => blocks.zip(outs).for_each(|(b, y)| iq4_nl(b, y)),
        GgmlType::IQ4_XS => blocks.zip(outs).for_each(|(b, y)| iq4_xs(b, y)),
        GgmlType::TQ1_0 => blocks.zip(outs).for_each(|(b, y)| tq1_0(b, y)),
        GgmlType::IQ3_XXS => blocks.zip(outs).for_each(|(b, y)| iq3_xxs(b, y)),
        GgmlType::IQ2_XXS => blocks.zip(outs).for_each(|(b, y)| iq2_xxs(b, y)),
        GgmlType::IQ2_XS => blocks.zip(outs).for_each(|(b, y)| iq2_xs(b, y)),
        GgmlType::IQ2_S => blocks.zip(outs).for_each(|(b, y)| iq2_s(b, y)),
        GgmlType::IQ1_S => blocks.zip(outs).for_each(|(b, y)| iq1_s(b, y)),
        GgmlType::IQ1_M => blocks.zip(outs).for_each(|(b, y)| iq1_m(b, y)),
        GgmlType::IQ3_S => blocks.zip(outs).for_each(|(b, y)| iq3_s(b, y)),
        GgmlType::TQ2_0 => blocks.zip(outs).for_each(|(b, y)| tq2_0(b, y)),
        GgmlType::MXFP4 => blocks.zip(outs).for_each(|(b, y)| mxfp4(b, y)),
        _ => {
            return Err(BlockDataError::Unsupported {
                op: "dequantize",
                ty: t,
            })
        }
    }
    Ok(())
}

/// Q4_0: `d` f16 @0, `qs[16]` @2. `y[j] = (lo - 8) * d`, `y[j + 16] = (hi - 8) * d`.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: `d` @0, `m` @2, `qs[16]` @4. `y = q * d + m`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = (q & 0x0f) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The fifth bits of Q5_0 / Q5_1 for values j and j + 16 (`qh` is a little-endian u32).
#[inline]
fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

/// Q5_0: `d` @0, `qh[4]` @2, `qs[16]` @6. `y = (q5 - 16) * d`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let (h0, h1) = q5_high(qh, j);
        y[j] = (((q & 0x0f) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: `d` @0, `m` @2, `qh[4]` @4, `qs[16]` @8. `y = q5 * d + m`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..24].iter().enumerate() {
        let (h0, h1) = q5_high(qh, j);
        y[j] = ((q & 0x0f) | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) | h1) as f32 * d + m;
    }
}

/// Q8_0 / Q8_1 / Q8_K: `y = qs * d` (int8 quants).
fn q8(d: f32, qs: &[u8], y: &mut [f32]) {
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = (q as i8) as f32 * d;
    }
}

/// Q2_K: `scales[16]` @0, `qs[64]` @16, `d` @80, `dmin` @82.
/// Per 16 values: `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)`, `y = dl * q - ml`.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    let mut out = y.chunks_exact_mut(16);
    let mut is = 0;
    for half in 0..QK_K / 128 {
        let q = &b[16 + half * 32..16 + half * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for sub in [&q[0..16], &q[16..32]] {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0f) as f32;
                let ml = dmin * (sc >> 4) as f32;
                if let Some(o) = out.next() {
                    for (o, &qq) in o.iter_mut().zip(sub) {
                        *o = dl * ((qq >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

/// Unpacks the sixteen 6-bit Q3_K scales (with their +32 bias still applied).
pub(crate) fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | high << 4) as i32;
    }
    out
}

/// Q3_K: `hmask[32]` @0, `qs[64]` @32, `scales[12]` @96, `d` @108.
/// Per 16 values: `dl = d * (sc - 32)`, `y = dl * (q2 - (hbit ? 0 : 4))`.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let hm = &b[0..32];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    let mut out = y.chunks_exact_mut(16);
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..QK_K / 128 {
        let q = &b[32 + half * 32..32 + half * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for part in 0..2 {
                let dl = d * (scales[is] - 32) as f32;
                is += 1;
                if let Some(o) = out.next() {
                    for (l, o) in o.iter_mut().enumerate() {
                        let k = part * 16 + l;
                        let low = ((q[k] >> shift) & 3) as i32;
                        let sub = if hm[k] & m != 0 { 0 } else { 4 };
                        *o = dl * (low - sub) as f32;
                    }
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K /
/// Q5_K block, from its 12-byte `scales`.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: `d` @0, `dmin` @2, `scales[12]` @4, `qs[128]` @16.
/// Per 32 values: `d1 = d * sc`, `m1 = dmin * m`, `y = d1 * q - m1`.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    for (c, (q, o)) in b[16..144]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for (l, &qq) in q.iter().enumerate() {
            o[l] = d1 * (qq & 0x0f) as f32 - m1;
            o[l + 32] = d2 * (qq >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: `d` @0, `dmin` @2, `scales[12]` @4, `qh[32]` @16, `qs[128]` @48.
/// As Q4_K with a fifth bit: bit `i / 32` of `qh[i % 32]` adds 16.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (c, (ql, o)) in b[48..176]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for (l, &qq) in ql.iter().enumerate() {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * ((qq & 0x0f) + h1) as f32 - m1;
            o[l + 32] = d2 * ((qq >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: `ql[128]` @0, `qh[64]` @128, `scales[16]` (int8) @192, `d` @208.
/// `y = d * sc * q` evaluated as `(d * sc) * q`, with `q` the 6-bit value minus 32.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for (n, o) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[n * 64..n * 64 + 64];
        let qh = &b[128 + n * 32..128 + n * 32 + 32];
        let sc = &b[192 + n * 8..192 + n * 8 + 8];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            o[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            o[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            o[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// IQ4_NL: `d` @0, `qs[16]` @2. `y = d * kvalues_iq4nl[nibble]`.
fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// MXFP4 (`dequantize_row_mxfp4`): `e` (E8M0) @0, `qs[16]` @1, nibbles as IQ4_NL's.
/// `y = kvalues_mxfp4[nibble] * 2^(e - 128)` (the table value as f32 times the scale).
fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        y[j] = KVALUES_MXFP4[(q & 0x0f) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

/// IQ4_XS: `d` @0, `scales_h` (u16) @2, `scales_l[4]` @4, `qs[128]` @8.
/// Per 32 values: `dl = d * (ls - 32)`, `y = dl * kvalues_iq4nl[nibble]`.
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2) as u32;
    let scales_l = &b[4..8];
    for (ib, (qs, o)) in b[8..136]
        .chunks_exact(16)
        .zip(y.chunks_exact_mut(32))
        .enumerate()
    {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32
            | (((scales_h >> (2 * ib)) & 3) << 4) as i32;
        let dl = d * (ls - 32) as f32;
        for (j, &q) in qs.iter().enumerate() {
            o[j] = dl * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
            o[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

/// Digit `n` (0..5) of a base-3 packed TQ1_0 byte `q`, as ggml extracts it: the byte times
/// `3^n` modulo 256, then the top of that times 3 (`((q * 3^n mod 256) * 3) >> 8`, 0..2).
#[inline]
pub(super) fn ternary_digit(q: u8, n: u32) -> u8 {
    let shifted = q.wrapping_mul(3u8.wrapping_pow(n));
    ((shifted as u16 * 3) >> 8) as u8
}

/// The 256 ternary digits (0..2, before the `- 1`) of a TQ1_0 block in value order
/// (`dequantize_row_tq1_0`, ggml-quants.c): `qs[0..32]` digits 0..5 give values 0..160
/// (digit `n` of byte `m` is value `32n + m`), `qs[32..48]` digits 0..5 values 160..240
/// (`160 + 16n + m`), `qh[0..4]` digits 0..4 values 240..256 (`240 + 4n + j`).
pub(super) fn tq1_0_digits(b: &[u8]) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for n in 0..5 {
        for m in 0..32 {
            out[32 * n + m] = ternary_digit(b[m], n as u32);
        }
        for m in 0..16 {
            out[160 + 16 * n + m] = ternary_digit(b[32 + m], n as u32);
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            out[240 + 4 * n + j] = ternary_digit(b[48 + j], n as u32);
        }
    }
    out
}

/// TQ1_0: `qs[48]` @0, `qh[4]` @48, `d` @52. `y = (digit - 1) * d` ([`tq1_0_digits`]).
fn tq1_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 52);
    for (o, q) in y.iter_mut().zip(tq1_0_digits(b)) {
        *o = (q as i32 - 1) as f32 * d;
    }
}

/// TQ2_0: `qs[64]` @0, `d` @64. Value `128h + 32l + m` is bits `2l..2l+2` of
/// `qs[32h + m]`; `y = (q - 1) * d` (`dequantize_row_tq2_0`).
fn tq2_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 64);
    for (v, o) in y.iter_mut().enumerate() {
        let q = (b[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
        *o = (q as i32 - 1) as f32 * d;
    }
}

/// An IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S super-block unpacked: per value the grid magnitude and whether it is
/// negative, and the 4-bit scales `ls`.
pub(super) struct GridValues {
    /// `iq3xxs_grid[qs[v / 4]]` byte `v % 4`.
    pub mag: [u8; QK_K],
    /// Bit `v % 8` of `ksigns_iq2xs[sign index of v / 8]`.
    pub neg: [bool; QK_K],
    /// The 4-bit scale `ls` of each 16 values (IQ2_XS has one per 16; the others one per
    /// 32, stored twice).
    pub ls: [u8; 16],
}

/// Unpacks an IQ3_XXS block: `d` @0, grid indices `qs[64]` @2, `scales_and_signs` (eight
/// u32) @66 (the layout `dequantize_row_iq3_xxs` reads).
pub(super) fn iq3_xxs_unpack(b: &[u8]) -> GridValues {
    let mut out = GridValues {
        mag: [0; QK_K],
        neg: [false; QK_K],
        ls: [0; 16],
    };
    for ib in 0..8 {
        let aux = u32::from_le_bytes([
            b[66 + 4 * ib],
            b[67 + 4 * ib],
            b[68 + 4 * ib],
            b[69 + 4 * ib],
        ]);
        out.ls[2 * ib] = (aux >> 28) as u8;
        out.ls[2 * ib + 1] = out.ls[2 * ib];
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            for h in 0..2 {
                let g = IQ3XXS_GRID[b[2 + 8 * ib + 2 * l + h] as usize].to_le_bytes();
                for j in 0..4 {
                    let v = 32 * ib + 8 * l + 4 * h + j;
                    out.mag[v] = g[j];
                    out.neg[v] = signs & (1 << (4 * h + j)) != 0;
                }
            }
        }
    }
    out
}

/// IQ3_XXS (`dequantize_row_iq3_xxs`): per 32 values `db = (d * (0.5 + ls)) * 0.5`, then
/// `y = (db * grid) * (±1)`.
fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq3_xxs_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let db = d * (0.5 + u.ls[v / 16] as f32) * 0.5;
        let m = db * u.mag[v] as f32;
        *o = if u.neg[v] { -m } else { m };
    }
}

/// Unpacks an IQ3_S block: `d` @0, `qs[64]` @2 (low 8 bits of the grid indices), `qh[8]` @66
/// (bit `k` of `qh[b]` is bit 8 of index `k` of 32-value block `b`), `signs[32]` @74 (bit
/// `v % 8` of byte `v / 8` set for a negative value `v`), `scales[4]` @106 (the 4-bit `ls`
/// of blocks `2j`, `2j + 1` in the low and high nibble of byte `j`); the layout
/// `dequantize_row_iq3_s` reads.
pub(super) fn iq3_s_unpack(b: &[u8]) -> GridValues {
    let mut out = GridValues {
        mag: [0; QK_K],
        neg: [false; QK_K],
        ls: [0; 16],
    };
    for ib in 0..8 {
        out.ls[2 * ib] = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
        out.ls[2 * ib + 1] = out.ls[2 * ib];
        let qh = b[66 + ib] as usize;
        for k in 0..8 {
            let index = b[2 + 8 * ib + k] as usize | (((qh >> k) & 1) << 8);
            let g = IQ3S_GRID[index].to_le_bytes();
            for j in 0..4 {
                let v = 32 * ib + 4 * k + j;
                out.mag[v] = g[j];
                out.neg[v] = b[74 + v / 8] & (1 << (v % 8)) != 0;
            }
        }
    }
    out
}

/// IQ3_S (`dequantize_row_iq3_s`): per 32 values `db = d * (1 + 2 ls)`, then
/// `y = (db * grid) * (±1)`.
fn iq3_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq3_s_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let db = d * (1 + 2 * u.ls[v / 16] as i32) as f32;
        let m = db * u.mag[v] as f32;
        *o = if u.neg[v] { -m } else { m };
    }
}

/// Unpacks an IQ2_XXS block: `d` @0, then per 32 values 8 bytes @`2 + 8 ib`: four
/// `iq2xxs_grid` indices (each the magnitudes of 8 values) and a u32 with four 7-bit
/// `ksigns_iq2xs` indices and the 4-bit `ls` in bits 28..32 (`dequantize_row_iq2_xxs`).
pub(super) fn iq2_xxs_unpack(b: &[u8]) -> GridValues {
    let mut out = GridValues {
        mag: [0; QK_K],
        neg: [false; QK_K],
        ls: [0; 16],
    };
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        out.ls[2 * ib] = (aux >> 28) as u8;
        out.ls[2 * ib + 1] = out.ls[2 * ib];
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g = IQ2XXS_GRID[q[l] as usize].to_le_bytes();
            for j in 0..8 {
                let v = 32 * ib + 8 * l + j;
                out.mag[v] = g[j];
                out.neg[v] = signs & (1 << j) != 0;
            }
        }
    }
    out
}

/// IQ2_XXS (`dequantize_row_iq2_xxs`): per 32 values `db = (d * (0.5 + ls)) * 0.25`, then
/// `y = (db * grid) * (±1)`.
fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq2_xxs_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let db = d * (0.5 + u.ls[v / 16] as f32) * 0.25;
        let m = db * u.mag[v] as f32;
        *o = if u.neg[v] { -m } else { m };
    }
}

/// Unpacks an IQ2_XS block: `d` @0, `qs[32]` (u16) @2, each the `iq2xs_grid` index (bits
/// 0..9) and the `ksigns_iq2xs` index (bits 9..16) of 8 values, `scales[8]` @66, the 4-bit
/// `ls` of values `32 ib .. 32 ib + 16` in the low nibble of byte `ib`, of the next 16 in the
/// high nibble (`dequantize_row_iq2_xs`).
pub(super) fn iq2_xs_unpack(b: &[u8]) -> GridValues {
    let mut out = GridValues {
        mag: [0; QK_K],
        neg: [false; QK_K],
        ls: [0; 16],
    };
    for ib in 0..8 {
        out.ls[2 * ib] = b[66 + ib] & 0x0f;
        out.ls[2 * ib + 1] = b[66 + ib] >> 4;
    }
    for k in 0..32 {
        let q = u16_at(b, 2 + 2 * k) as usize;
        let signs = KSIGNS_IQ2XS[q >> 9];
        let g = IQ2XS_GRID[q & 511].to_le_bytes();
        for j in 0..8 {
            out.mag[8 * k + j] = g[j];
            out.neg[8 * k + j] = signs & (1 << j) != 0;
        }
    }
    out
}

/// IQ2_XS (`dequantize_row_iq2_xs`): per 16 values `db = (d * (0.5 + ls)) * 0.25`, then
/// `y = (db * grid) * (±1)`.
fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq2_xs_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let db = d * (0.5 + u.ls[v / 16] as f32) * 0.25;
        let m = db * u.mag[v] as f32;
        *o = if u.neg[v] { -m } else { m };
    }
}

/// Unpacks an IQ2_S block: `d` @0, `qs[64]` @2 (bytes 0..32 the low 8 bits of the 32
/// `iq2s_grid` indices, bytes 32..64 one sign byte per 8 values, bit `j` for value `j`),
/// `qh[8]` @66 (bits `2l..2l + 2` of `qh[ib]` are bits 8..10 of index `4 ib + l`),
/// `scales[8]` @74 (as IQ2_XS) (`dequantize_row_iq2_s`).
pub(super) fn iq2_s_unpack(b: &[u8]) -> GridValues {
    let mut out = GridValues {
        mag: [0; QK_K],
        neg: [false; QK_K],
        ls: [0; 16],
    };
    for ib in 0..8 {
        out.ls[2 * ib] = b[74 + ib] & 0x0f;
        out.ls[2 * ib + 1] = b[74 + ib] >> 4;
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let k = 4 * ib + l;
            let index = b[2 + k] as usize | ((qh >> (2 * l)) & 3) << 8;
            let g = IQ2S_GRID[index].to_le_bytes();
            let signs = b[34 + k];
            for j in 0..8 {
                out.mag[8 * k + j] = g[j];
                out.neg[8 * k + j] = signs & (1 << j) != 0;
            }
        }
    }
    out
}

/// IQ2_S (`dequantize_row_iq2_s`): per 16 values `db = (d * (0.5 + ls)) * 0.25`, then
/// `y = (db * grid) * (±1)`.
fn iq2_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq2_s_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let db = d * (0.5 + u.ls[v / 16] as f32) * 0.25;
        let m = db * u.mag[v] as f32;
        *o = if u.neg[v] { -m } else { m };
    }
}

/// An IQ1_S super-block unpacked: the `iq1s_grid` values (-1, 0, 1) of every value, and per
/// 32 values the 3-bit scale `ls` and whether the delta is negative.
pub(super) struct Iq1s {
    /// Grid value of each value.
    pub grid: [i8; QK_K],
    /// `(qh[ib] >> 12) & 7`.
    pub ls: [u8; 8],
    /// Bit 15 of `qh[ib]`: the delta is `-IQ1S_DELTA` (else `+IQ1S_DELTA`).
    pub delta_neg: [bool; 8],
}

/// Unpacks an IQ1_S block: `d` @0, `qs[32]` @2 (low 8 bits of the 11-bit grid indices),
/// `qh[8]` (u16) @34: bits `3l..3l + 3` the high bits of index `4 ib + l`, bits 12..15 the
/// scale, bit 15 the delta's sign (`dequantize_row_iq1_s`).
pub(super) fn iq1_s_unpack(b: &[u8]) -> Iq1s {
    let mut out = Iq1s {
        grid: [0; QK_K],
        ls: [0; 8],
        delta_neg: [false; 8],
    };
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib) as usize;
        out.ls[ib] = ((qh >> 12) & 7) as u8;
        out.delta_neg[ib] = qh & 0x8000 != 0;
        for l in 0..4 {
            let index = b[2 + 4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8;
            let g = IQ1S_GRID[index].to_le_bytes();
            for j in 0..8 {
                out.grid[32 * ib + 8 * l + j] = g[j] as i8;
            }
        }
    }
    out
}

/// IQ1_S (`dequantize_row_iq1_s`): per 32 values `dl = d * (2 ls + 1)`, `delta = ±0.125`,
/// `y = dl * (grid + delta)`.
fn iq1_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let u = iq1_s_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let ib = v / 32;
        let dl = d * (2 * u.ls[ib] as i32 + 1) as f32;
        let delta = if u.delta_neg[ib] { -0.125f32 } else { 0.125 };
        *o = dl * (u.grid[v] as f32 + delta);
    }
}

/// An IQ1_M super-block unpacked: the `iq1s_grid` values of every value, the delta sign of
/// each 8 values, the 3-bit scale of each 16 values and the f16 scale `d` (as f32).
pub(super) struct Iq1m {
    /// Grid value of each value.
    pub grid: [i8; QK_K],
    /// Whether the delta of values `8k .. 8k + 8` is negative.
    pub delta_neg: [bool; 32],
    /// The 3-bit scale of values `16h .. 16h + 16`.
    pub ls: [u8; 16],
    /// The super-block scale, assembled from the top nibbles of the four u16 scales.
    pub d: f32,
}

/// Unpacks an IQ1_M block: `qs[32]` @0 (low 8 bits of the grid indices), `qh[16]` @32 (per
/// 8 values a nibble, low nibble first: bits 0..3 the high index bits, bit 3 the delta
/// sign), `scales[8]` @48 (four u16: bits `6 (ib % 2) + 3t ..` the scale of values
/// `32 ib + 16 t ..` for `ib / 2` the u16, the top nibbles the f16 `d`)
/// (`dequantize_row_iq1_m`).
pub(super) fn iq1_m_unpack(b: &[u8]) -> Iq1m {
    let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k));
    let dbits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let mut out = Iq1m {
        grid: [0; QK_K],
        delta_neg: [false; 32],
        ls: [0; 16],
        d: super::fp::f16_to_f32(dbits),
    };
    for ib in 0..8 {
        for t in 0..2 {
            out.ls[2 * ib + t] = ((sc[ib / 2] >> (6 * (ib % 2) + 3 * t)) & 7) as u8;
        }
    }
    for k in 0..32 {
        let nib = (b[32 + k / 2] >> (4 * (k % 2))) as usize & 0x0f;
        let index = b[k] as usize | (nib & 7) << 8;
        out.delta_neg[k] = nib & 8 != 0;
        let g = IQ1S_GRID[index].to_le_bytes();
        for j in 0..8 {
            out.grid[8 * k + j] = g[j] as i8;
        }
    }
    out
}

/// IQ1_M (`dequantize_row_iq1_m`): per 16 values `dl = d * (2 ls + 1)`, per 8 values
/// `delta = ±0.125`, `y = dl * (grid + delta)`.
fn iq1_m(b: &[u8], y: &mut [f32]) {
    let u = iq1_m_unpack(b);
    for (v, o) in y.iter_mut().enumerate() {
        let dl = u.d * (2 * u.ls[v / 16] as i32 + 1) as f32;
        let delta = if u.delta_neg[v / 8] { -0.125f32 } else { 0.125 };
        *o = dl * (u.grid[v] as f32 + delta);
    }
}
