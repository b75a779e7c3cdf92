//! Reference dot products of a weight row with an activation row, as llama.cpp's CPU matrix
//! product computes each output element.
//!
//! llama.cpp's CPU `mul_mat` converts the activations (`src1`) to the weight type's
//! companion format [`vec_dot_type`] once per row (see [`super::quantize`]), then calls the
//! type's `vec_dot` for each (weight row, activation row) pair. The functions here reproduce
//! ggml's portable scalar code (`ggml_vec_dot_*_generic` in ggml-cpu/quants.c and the scalar
//! branches of `ggml_vec_dot_f32/f16/bf16` in ggml-cpu/vec.cpp), including its accumulation
//! order:
//!
//! - Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 (with Q8_0) and Q4_1, Q5_1 (with Q8_1): an exact i32 sum per
//!   32-value block, scaled in f32 and added to one f32 running sum, block after block:
//!   Q4_0 `sum += (sumi * dx) * dy`; Q5_0 `sum += (dx * dy) * sumi`; Q8_0
//!   `sum += sumi * (dx * dy)`; IQ4_NL and MXFP4 `sum += (dy * dx) * sumi` (MXFP4's `dx`
//!   the block's `2^(e - 128)`); Q4_1 / Q5_1
//!   `sum += (dx * dy) * sumi + mx * sy`.
//! - Q2_K: per super-block `sum += dall * isum - dmin * summs` (exact i32 sums).
//! - Q3_K, Q4_K, Q5_K, Q6_K: eight f32 lanes; lane `l` accumulates `(dx * dy) * isum_l`,
//!   where `isum_l` is the exact i32 sum over the values whose index is `l` mod 8; the mins
//!   of Q4_K / Q5_K are subtracted from a separate f32 sum (`sum -= (dmin * dy) * summs`);
//!   the lanes are added to that sum in order 0..8 at the end.
//! - IQ4_XS: per 32 values `sum += (dx * dy * (ls - 32)) * sumi`.
//! - IQ3_XXS: per super-block `sum += d * bsum` (`d = dx * dy`, `bsum` the exact sum of
//!   `(2 * ls + 1) * sumi` over its 32-value blocks), then `0.25 * sum`.
//! - IQ3_S: as IQ3_XXS without the final `0.25`; IQ2_XXS, IQ2_XS, IQ2_S: with `0.125`
//!   instead (IQ2_XS / IQ2_S scales cover 16 values).
//! - TQ1_0: per super-block `sum += sumi * (dx * dy)`; TQ2_0: `sum += sumi * (dy * dx)`
//!   (`sumi` the exact i32 sum of `(digit - 1) * y`).
//! - F32, F16, BF16: each product in f32, summed in f64, rounded to f32 at the end.
//!
//! llama.cpp's SIMD kernels (AVX2, NEON) and llamafile's sgemm compute the same integer
//! sums but add the scaled block results in a different order, often with fused
//! multiply-adds; their results differ from these by a few f32 ulps of the partial sums,
//! never by a rounding of the activations. [`vec_dot_avx2`] and [`vec_dot_avx2_mul_mat`]
//! reproduce the x86 AVX2 build's order exactly (the kernels beyond Q4_0 / Q4_1 / Q8_0 are in
//! `dot_x86.rs`).

use super::dot_x86;
use super::error::{check_lengths, BlockDataError};
use super::fp::{bf16_to_f32, e8m0_to_f32_half, f16_at, f32_at, u16_at};
use super::grids::KVALUES_MXFP4;
use super::layouts::KVALUES_IQ4NL;
use super::quant::{quantize, Q8Flavor};
use super::{GgmlType, QK_K};

/// The type llama.cpp's CPU backend converts activations to before a dot product with
/// weights of type `t` (`vec_dot_type` in ggml-cpu's type traits), or `None` if `t` has no
/// CPU dot product here.
///
/// Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 → Q8_0; Q4_1, Q5_1 → Q8_1; Q2_K … Q6_K, IQ4_XS, TQ1_0, TQ2_0,
/// IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M → Q8_K; F32 → F32; F16 → F16; BF16 → BF16 (ggml-cpu.c's `type_traits_cpu`).
pub fn vec_dot_type(t: GgmlType) -> Option<GgmlType> {
    use GgmlType::*;
    Some(match t {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | TQ1_0 | TQ2_0 | IQ3_XXS | IQ3_S | IQ2_XXS
        | IQ2_XS | IQ2_S | IQ1_S | IQ1_M => Q8_K,
        _ => return None,
    })
}

/// The dot product of one weight row `w_row` (type `wtype`, whole blocks) with one
/// activation row `act_row` already in [`vec_dot_type`]`(wtype)`, computed as ggml's scalar
/// `vec_dot` does (see the module documentation for the order of operations).
///
/// The number of values `n` is given by `w_row`; `act_row` must hold the same `n` values.
///
/// # Errors
/// [`BlockDataError::Unsupported`] if `wtype` has no dot product here;
/// [`BlockDataError::RaggedBytes`] if `w_row` is not whole blocks;
/// [`BlockDataError::PartialBlock`] / [`BlockDataError::ByteLength`] if `act_row` does not
/// hold exactly `n` values of the activation type.
pub fn vec_dot(wtype: GgmlType, w_row: &[u8], act_row: &[u8]) -> Result<f32, BlockDataError> {
    let at = vec_dot_type(wtype).ok_or(BlockDataError::Unsupported {
        op: "vec_dot",
        ty: wtype,
    })?;
    let n = row_values(wtype, w_row)?;
    check_lengths(at, "activation row", n, act_row.len())?;
    let w = w_row.chunks_exact(wtype.type_size());
    let a = act_row;
    Ok(match wtype {
        GgmlType::F32 => dot_plain(w_row, a, 4, f32_at),
        GgmlType::F16 => dot_plain(w_row, a, 2, f16_at),
        GgmlType::BF16 => dot_plain(w_row, a, 2, |b, o| bf16_to_f32(u16_at(b, o))),
        GgmlType::Q4_0 => q4_0_q8_0(w, a),
        GgmlType::Q4_1 => q4_1_q8_1(w, a),
        GgmlType::Q5_0 => q5_0_q8_0(w, a),
        GgmlType::Q5_1 => q5_1_q8_1(w, a),
        GgmlType::Q8_0 => q8_0_q8_0(w, a),
        GgmlType::IQ4_NL => iq4_nl_q8_0(w, a),
        GgmlType::Q2_K => q2_k_q8_k(w, a),
        GgmlType::Q3_K => q3_k_q8_k(w, a),
        GgmlType::Q4_K => q45_k_q8_k(w, a, false),
        GgmlType::Q5_K => q45_k_q8_k(w, a, true),
        GgmlType::Q6_K => q6_k_q8_k(w, a),
        GgmlType::IQ4_XS => iq4_xs_q8_k(w, a),
        GgmlType::TQ1_0 => tq1_0_q8_k(w, a),
        GgmlType::TQ2_0 => tq2_0_q8_k(w, a),
        GgmlType::IQ3_XXS => iq3_xxs_q8_k(w, a),
        GgmlType::IQ3_S => iq3_s_q8_k(w, a),
        GgmlType::IQ2_XXS => iq2_xxs_q8_k(w, a),
        GgmlType::IQ2_XS => iq2_xs_q8_k(w, a),
        GgmlType::IQ2_S => iq2_s_q8_k(w, a),
        GgmlType::IQ1_S => iq1_s_q8_k(w, a),
        GgmlType::IQ1_M => iq1_m_q8_k(w, a),
        GgmlType::MXFP4 => mxfp4_q8_0(w, a),
        _ => {
            return Err(BlockDataError::Unsupported {
                op: "vec_dot",
                ty: wtype,
            })
        }
    })
}

/// Converts the f32 activation row `x` to the companion format of weight type `wtype`
/// (`vec_dot_type(wtype)`, Q8_0 / Q8_1 per `flavor`), as llama.cpp's `mul_mat` does once per
/// activation row before the dot products with every weight row.
///
/// Returns the activation type and the converted row, ready for [`vec_dot`].
///
/// # Errors
/// [`BlockDataError::Unsupported`] if `wtype` has no dot product here;
/// [`BlockDataError::PartialBlock`] if `x.len()` is not whole blocks of the activation type.
pub fn quantize_activations(
    wtype: GgmlType,
    x: &[f32],
    flavor: Q8Flavor,
) -> Result<(GgmlType, Vec<u8>), BlockDataError> {
    let at = vec_dot_type(wtype).ok_or(BlockDataError::Unsupported {
        op: "vec_dot",
        ty: wtype,
    })?;
    if x.len() % at.block_size() != 0 {
        return Err(BlockDataError::PartialBlock {
            ty: at,
            n_values: x.len(),
            block_size: at.block_size(),
        });
    }
    let mut act = vec![0u8; x.len() / at.block_size() * at.type_size()];
    quantize(at, x, &mut act, flavor)?;
    Ok((at, act))
}

/// The dot product of weight row `w_row` with the f32 activations `x`, as llama.cpp computes
/// it: [`quantize_activations`] then [`vec_dot`]. Allocates the converted row; to dot one
/// activation row with many weight rows, convert it once with [`quantize_activations`].
///
/// # Errors
/// As [`vec_dot`]; [`BlockDataError::ValueCount`] if `x.len()` differs from the number of
/// values in `w_row`.
pub fn vec_dot_f32(
    wtype: GgmlType,
    w_row: &[u8],
    x: &[f32],
    flavor: Q8Flavor,
) -> Result<f32, BlockDataError> {
    let n = row_values(wtype, w_row)?;
    if x.len() != n {
        return Err(BlockDataError::ValueCount {
            ty: wtype,
            what: "activation row",
            actual: x.len(),
            expected: n,
        });
    }
    let (_, act) = quantize_activations(wtype, x, flavor)?;
    vec_dot(wtype, w_row, &act)
}

/// The dot product of one weight row with one activation row as llama.cpp's x86 AVX2 kernels
/// compute it: `ggml_vec_dot_<type>_q8_<0|1|K>` in ggml-cpu/arch/x86/quants.c, `__AVX2__`
/// branch (FMA, no AVX-512), for Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K,
/// Q5_K, Q6_K and IQ4_XS weights; the interpreter's `avx2_order` for a product with one
/// activation column ([`vec_dot_avx2_mul_mat`] for any number).
///
/// Order for Q4_0, Q4_1, Q8_0 (the other types are documented in `dot_x86.rs`, one
/// function per ggml kernel): eight f32 lanes; per block `d = dx * dy`, and lane `l` (0..8)
/// does `acc_l = fma(d, isum_l, acc_l)` with `isum_l` the exact i32 sum of the products of
/// values `4l .. 4l + 4` (natural order; for 4-bit formats `(q - 8)` for Q4_0, `q` for Q4_1);
/// Q4_1 also sums `mx * sy` in a separate f32 (multiply, then add). At the end ggml's
/// `hsum_float_8`: `((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))`,
/// plus that sum for Q4_1. `act_row` is in [`vec_dot_type`]`(wtype)` (Q8_0, Q8_1 or Q8_K) as
/// [`quantize_activations`] makes it with [`Q8Flavor::X86`].
///
/// # Errors
/// [`BlockDataError::Unsupported`] for other weight types; the length errors of
/// [`vec_dot`].
pub fn vec_dot_avx2(wtype: GgmlType, w_row: &[u8], act_row: &[u8]) -> Result<f32, BlockDataError> {
    if let Some(kernel) = x86_kernel(wtype) {
        return checked_x86(wtype, w_row, act_row, kernel);
    }
    let (zero, has_min, bits4) = match wtype {
        GgmlType::Q4_0 => (8, false, true),
        GgmlType::Q4_1 => (0, true, true),
        GgmlType::Q8_0 => (0, false, false),
        _ => {
            return Err(BlockDataError::Unsupported {
                op: "vec_dot_avx2",
                ty: wtype,
            })
        }
    };
    let at = if has_min {
        GgmlType::Q8_1
    } else {
        GgmlType::Q8_0
    };
    let n = row_values(wtype, w_row)?;
    check_lengths(at, "activation row", n, act_row.len())?;
    let (wq0, aq0) = if has_min { (4, 4) } else { (2, 2) };
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w_row
        .chunks_exact(wtype.type_size())
        .zip(act_row.chunks_exact(at.type_size()))
    {
        let d = f16_at(x, 0) * f16_at(y, 0);
        if has_min {
            summs += f16_at(x, 2) * f16_at(y, 2);
        }
        let wq = |j: usize| -> i32 {
            if bits4 {
                let b = x[wq0 + j % 16];
                let q = if j < 16 { b & 0x0f } else { b >> 4 };
                q as i32 - zero
            } else {
                x[wq0 + j] as i8 as i32
            }
        };
        for (l, a) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4)
                .map(|j| wq(j) * (y[aq0 + j] as i8 as i32))
                .sum();
            *a = d.mul_add(lane as f32, *a);
        }
    }
    let r = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    let sum = (r[0] + r[2]) + (r[1] + r[3]);
    Ok(if has_min { sum + summs } else { sum })
}

/// The dot product of one weight row with one activation row inside llama.cpp's x86 CPU
/// `mul_mat` (`ggml_compute_forward_mul_mat`, AVX2 build with llamafile on) for a product
/// with `n_cols` activation columns (`ne[1]` of the activations):
///
/// - from 8 columns on, for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS,
///   IQ2_XS and IQ2_S, ggml-cpu's tiled
///   K-quant kernel (ggml-cpu/tiled, on unless `GGML_CPU_TILED_MM=0`): per super-block an
///   exact integer dot product, scaled by the weight's `d` (and its mins subtracted with
///   `dmin`, fused), then fused into the output with the activation's `d`;
/// - from two columns on, llamafile's tinyBLAS (`tinyBLAS_Q0_AVX` in sgemm.cpp) for the
///   weight types it takes with quantized activations, Q4_0, Q8_0, Q5_0 and IQ4_NL;
/// - ggml's `vec_dot` ([`vec_dot_avx2`]) otherwise.
///
/// tinyBLAS accumulates every block into one set of eight lanes, `fma(dx * dy, isum_l, acc_l)`,
/// then sums them as `hsum_float_8`: the same numbers as `vec_dot` for Q4_0, Q8_0 and Q5_0;
/// for IQ4_NL, whose `vec_dot` keeps even and odd blocks apart, other numbers. Weights
/// llama.cpp repacks (Q4_0, Q4_K, IQ4_NL, MXFP4 with rows a multiple of 8, see
/// ggml-cpu/repack.cpp) run other kernels: [`super::RepackedRow`]. MXFP4 weights that are
/// not repacked always take `vec_dot` (neither tinyBLAS nor the tiled kernel has MXFP4).
///
/// # Errors
/// As [`vec_dot_avx2`].
pub fn vec_dot_avx2_mul_mat(
    wtype: GgmlType,
    w_row: &[u8],
    act_row: &[u8],
    n_cols: usize,
) -> Result<f32, BlockDataError> {
    let kernel = x86_mul_mat_kernel(wtype, n_cols);
    if kernel == X86MulMatKernel::TinyBlas {
        match wtype {
            GgmlType::IQ4_NL => {
                return checked_x86(wtype, w_row, act_row, dot_x86::iq4_nl_q8_0_tinyblas)
            }
            GgmlType::F32 => return checked_x86(wtype, w_row, act_row, f32_f32_tinyblas),
            GgmlType::F16 => return checked_x86(wtype, w_row, act_row, f16_f16_tinyblas),
            GgmlType::BF16 => return checked_x86(wtype, w_row, act_row, bf16_bf16_tinyblas),
            _ => {}
        }
    }
    if kernel == X86MulMatKernel::Tiled {
        let tiled = match wtype {
            GgmlType::Q2_K => Some(dot_x86::tiled_q2_k as dot_x86::TiledFn),
            GgmlType::Q3_K => Some(dot_x86::tiled_q3_k as dot_x86::TiledFn),
            GgmlType::Q4_K => Some(dot_x86::tiled_q4_k as dot_x86::TiledFn),
            GgmlType::Q5_K => Some(dot_x86::tiled_q5_k as dot_x86::TiledFn),
            GgmlType::Q6_K => Some(dot_x86::tiled_q6_k as dot_x86::TiledFn),
            GgmlType::IQ4_XS => Some(dot_x86::tiled_iq4_xs as dot_x86::TiledFn),
            GgmlType::IQ3_XXS => Some(dot_x86::tiled_iq3_xxs as dot_x86::TiledFn),
            GgmlType::IQ3_S => Some(dot_x86::tiled_iq3_s as dot_x86::TiledFn),
            GgmlType::IQ2_XXS => Some(dot_x86::tiled_iq2_xxs as dot_x86::TiledFn),
            GgmlType::IQ2_XS => Some(dot_x86::tiled_iq2_xs as dot_x86::TiledFn),
            GgmlType::IQ2_S => Some(dot_x86::tiled_iq2_s as dot_x86::TiledFn),
            GgmlType::IQ1_S => Some(dot_x86::tiled_iq1_s as dot_x86::TiledFn),
            GgmlType::IQ1_M => Some(dot_x86::tiled_iq1_m as dot_x86::TiledFn),
            _ => None,
        };
        if let Some(block) = tiled {
            let at = GgmlType::Q8_K;
            let n = row_values(wtype, w_row)?;
            check_lengths(at, "activation row", n, act_row.len())?;
            return Ok(dot_x86::tiled_q8_k(
                w_row,
                act_row,
                wtype.type_size(),
                block,
            ));
        }
    }
    vec_dot_avx2(wtype, w_row, act_row)
}

/// Which kernel llama.cpp's x86 `mul_mat` runs for a weight of type `wtype` (not repacked)
/// and `n_cols` activation columns (the rules of [`vec_dot_avx2_mul_mat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum X86MulMatKernel {
    /// The type's `ggml_vec_dot_*` ([`vec_dot_avx2`]).
    VecDot,
    /// llamafile's tinyBLAS from two columns: with quantized activations for Q4_0, Q5_0,
    /// Q8_0, IQ4_NL (the same numbers as `vec_dot` except for IQ4_NL), with F16 / BF16
    /// activations for F16 / BF16 weights (another order than `vec_dot`: one 8-lane
    /// accumulator per output, [`tinyblas_same_as_vec_dot`]).
    TinyBlas,
    /// ggml-cpu's tiled K-quant kernel (Q2_K … Q6_K, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS,
    /// IQ2_S from eight columns).
    Tiled,
}

/// The kernel of llama.cpp's x86 `mul_mat` for `wtype` weights and `n_cols` columns
/// ([`X86MulMatKernel`]).
pub fn x86_mul_mat_kernel(wtype: GgmlType, n_cols: usize) -> X86MulMatKernel {
    use GgmlType::*;
    match wtype {
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | IQ3_XXS | IQ3_S | IQ2_XXS | IQ2_XS | IQ2_S
        | IQ1_S | IQ1_M
            if n_cols >= 8 =>
        {
            X86MulMatKernel::Tiled
        }
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | F32 | F16 | BF16 if n_cols >= 2 => X86MulMatKernel::TinyBlas,
        _ => X86MulMatKernel::VecDot,
    }
}

/// Whether tinyBLAS computes `wtype`'s products in the same numbers as its `vec_dot` (the
/// quantized Q4_0 / Q5_0 / Q8_0 do: one f32 sum per block either way; IQ4_NL, F32, F16 and
/// BF16 do not).
pub fn tinyblas_same_as_vec_dot(wtype: GgmlType) -> bool {
    !matches!(
        wtype,
        GgmlType::IQ4_NL | GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
    )
}

/// A kernel of [`super::dot_x86`]: weight row and activation row, checked, to the result.
type X86Kernel = fn(&[u8], &[u8]) -> f32;

/// The kernel of [`super::dot_x86`] for `wtype`, if it has one there.
fn x86_kernel(wtype: GgmlType) -> Option<X86Kernel> {
    Some(match wtype {
        GgmlType::Q5_0 => dot_x86::q5_0_q8_0,
        GgmlType::Q5_1 => dot_x86::q5_1_q8_1,
        GgmlType::IQ4_NL => dot_x86::iq4_nl_q8_0,
        GgmlType::Q2_K => dot_x86::q2_k_q8_k,
        GgmlType::Q3_K => dot_x86::q3_k_q8_k,
        GgmlType::Q4_K => dot_x86::q4_k_q8_k,
        GgmlType::Q5_K => dot_x86::q5_k_q8_k,
        GgmlType::Q6_K => dot_x86::q6_k_q8_k,
        GgmlType::IQ4_XS => dot_x86::iq4_xs_q8_k,
        GgmlType::TQ1_0 => dot_x86::tq1_0_q8_k,
        GgmlType::TQ2_0 => dot_x86::tq2_0_q8_k,
        GgmlType::IQ3_XXS => dot_x86::iq3_xxs_q8_k,
        GgmlType::IQ3_S => dot_x86::iq3_s_q8_k,
        GgmlType::IQ2_XXS => dot_x86::iq2_xxs_q8_k,
        GgmlType::IQ2_XS => dot_x86::iq2_xs_q8_k,
        GgmlType::IQ2_S => dot_x86::iq2_s_q8_k,
        GgmlType::IQ1_S => dot_x86::iq1_s_q8_k,
        GgmlType::IQ1_M => dot_x86::iq1_m_q8_k,
        GgmlType::MXFP4 => dot_x86::mxfp4_q8_0,
        GgmlType::F32 => f32_f32,
        GgmlType::F16 => f16_f16,
        GgmlType::BF16 => bf16_bf16,
        _ => return None,
    })
}

/// The values of an F16 row as f32 (exact).
fn f16_values(row: &[u8]) -> Vec<f32> {
    (0..row.len() / 2).map(|i| f16_at(row, 2 * i)).collect()
}

/// The values of a BF16 row as f32 (exact).
fn bf16_values(row: &[u8]) -> Vec<f32> {
    (0..row.len() / 2)
        .map(|i| bf16_to_f32(u16_at(row, 2 * i)))
        .collect()
}

/// The values of an F32 row.
fn f32_values(row: &[u8]) -> Vec<f32> {
    (0..row.len() / 4).map(|i| f32_at(row, 4 * i)).collect()
}

/// `ggml_vec_dot_f32`, AVX + FMA branch (ggml-cpu/vec.cpp): the interpreter's order.
fn f32_f32(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_f32(&f32_values(w), &f32_values(a))
}

/// tinyBLAS on F32 rows (`tinyBLAS<8, __m256, __m256, float, float, float>`).
fn f32_f32_tinyblas(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_tinyblas(&f32_values(w), &f32_values(a))
}

/// `ggml_vec_dot_f16`, AVX2 + F16C branch (ggml-cpu/vec.cpp): the interpreter's order.
fn f16_f16(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_f16(&f16_values(w), &f16_values(a))
}

/// `ggml_vec_dot_bf16`, AVX2 branch (ggml-cpu/vec.cpp): the interpreter's order.
fn bf16_bf16(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_bf16(&bf16_values(w), &bf16_values(a))
}

/// tinyBLAS (llamafile/sgemm.cpp, `tinyBLAS<8, __m256, …>`) on F16 rows: the interpreter's
/// order.
fn f16_f16_tinyblas(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_tinyblas(&f16_values(w), &f16_values(a))
}

/// tinyBLAS on BF16 rows (the AVX2 build converts BF16 by a shift; `fma` as for F16).
fn bf16_bf16_tinyblas(w: &[u8], a: &[u8]) -> f32 {
    crate::interp::avx2::dot_tinyblas(&bf16_values(w), &bf16_values(a))
}

/// Checks that `w_row` is whole blocks of `wtype` and `act_row` the same number of values of
/// its activation type, then runs `kernel`.
fn checked_x86(
    wtype: GgmlType,
    w_row: &[u8],
    act_row: &[u8],
    kernel: X86Kernel,
) -> Result<f32, BlockDataError> {
    let at = vec_dot_type(wtype).ok_or(BlockDataError::Unsupported {
        op: "vec_dot_avx2",
        ty: wtype,
    })?;
    let n = row_values(wtype, w_row)?;
    check_lengths(at, "activation row", n, act_row.len())?;
    Ok(kernel(w_row, act_row))
}

/// Number of values in a row of whole blocks.
fn row_values(t: GgmlType, row: &[u8]) -> Result<usize, BlockDataError> {
    let ts = t.type_size();
    if row.len() % ts != 0 {
        return Err(BlockDataError::RaggedBytes {
            ty: t,
            what: "weight row",
            actual: row.len(),
            type_size: ts,
        });
    }
    Ok(row.len() / ts * t.block_size())
}

/// F32 / F16 / BF16 · same type: f32 products summed in f64 (ggml's scalar `ggml_vec_dot_*`).
fn dot_plain(w: &[u8], a: &[u8], size: usize, read: impl Fn(&[u8], usize) -> f32) -> f32 {
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(size).zip(a.chunks_exact(size)) {
        sum += (read(x, 0) * read(y, 0)) as f64;
    }
    sum as f32
}

/// The int8 quants of a Q8_0 / Q8_1 / Q8_K block.
#[inline]
fn i8s(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
    b.iter().map(|&q| q as i8 as i32)
}

fn q4_0_q8_0<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(34)) {
        let (mut s0, mut s1) = (0i32, 0i32);
        let yq = &y[2..34];
        for (j, &q) in x[2..18].iter().enumerate() {
            s0 += ((q & 0x0f) as i32 - 8) * (yq[j] as i8 as i32);
            s1 += ((q >> 4) as i32 - 8) * (yq[j + 16] as i8 as i32);
        }
        sumf += (s0 + s1) as f32 * f16_at(x, 0) * f16_at(y, 0);
    }
    sumf
}

fn q4_1_q8_1<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(36)) {
        let (mut s0, mut s1) = (0i32, 0i32);
        let yq = &y[4..36];
        for (j, &q) in x[4..20].iter().enumerate() {
            s0 += (q & 0x0f) as i32 * (yq[j] as i8 as i32);
            s1 += (q >> 4) as i32 * (yq[j + 16] as i8 as i32);
        }
        let sumi = s0 + s1;
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

/// Integer sum of a Q5 block's quants (32 nibbles at `qs`, fifth bits in `qh`) times the
/// Q8 quants `yq`, with `bias` subtracted from each 5-bit value (16 for Q5_0, 0 for Q5_1).
#[inline]
fn q5_sum(qh: u32, qs: &[u8], yq: &[u8], bias: i32) -> i32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for (j, &q) in qs.iter().enumerate() {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        s0 += (((q & 0x0f) | h0) as i32 - bias) * (yq[j] as i8 as i32);
        s1 += (((q >> 4) | h1) as i32 - bias) * (yq[j + 16] as i8 as i32);
    }
    s0 + s1
}

fn q5_0_q8_0<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(34)) {
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let sumi = q5_sum(qh, &x[6..22], &y[2..34], 16);
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32;
    }
    sumf
}

fn q5_1_q8_1<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(36)) {
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let sumi = q5_sum(qh, &x[8..24], &y[4..36], 0);
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

fn q8_0_q8_0<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(34)) {
        let sumi: i32 = i8s(&x[2..34]).zip(i8s(&y[2..34])).map(|(p, q)| p * q).sum();
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

fn iq4_nl_q8_0<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    table4_q8_0(w, a, &KVALUES_IQ4NL, 2, |x| f16_at(x, 0))
}

/// MXFP4 · Q8_0 (`ggml_vec_dot_mxfp4_q8_0_generic`): IQ4_NL's sums over `kvalues_mxfp4`,
/// the block scale `dx = 2^(e - 128)` from its E8M0 byte.
fn mxfp4_q8_0<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    table4_q8_0(w, a, &KVALUES_MXFP4, 1, |x| e8m0_to_f32_half(x[0]))
}

/// A 32-value block of 4-bit indices into `table` (16 bytes from `qs`, low nibbles values
/// 0..16, high nibbles 16..32) with the scale `dx(block)`, times Q8_0, as ggml's generic
/// `vec_dot_iq4_nl_q8_0` / `vec_dot_mxfp4_q8_0`: per block `d = dy · dx` (exact: a product of
/// an f16 value with an f16 value or a power of two), then `sum += d · (sumi1 + sumi2)`, the
/// exact sums of the low and high nibbles' table values times the activations.
fn table4_q8_0<'a>(
    w: impl Iterator<Item = &'a [u8]>,
    a: &[u8],
    table: &[i8; 16],
    qs: usize,
    dx: impl Fn(&[u8]) -> f32,
) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(34)) {
        let d = f16_at(y, 0) * dx(x);
        let yq = &y[2..34];
        let (mut s1, mut s2) = (0i32, 0i32);
        for (j, &q) in x[qs..qs + 16].iter().enumerate() {
            s1 += (yq[j] as i8 as i32) * table[(q & 0x0f) as usize] as i32;
            s2 += (yq[j + 16] as i8 as i32) * table[(q >> 4) as usize] as i32;
        }
        sumf += d * (s1 + s2) as f32;
    }
    sumf
}

/// The parts of a Q8_K block: `d` (f32), the 256 quants, the 16 `bsums`.
#[inline]
fn q8_k_parts(y: &[u8]) -> (f32, &[u8], impl Iterator<Item = i32> + '_) {
    let bsums = y[260..292]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]) as i32);
    (f32_at(y, 0), &y[4..260], bsums)
}

fn q2_k_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let (yd, q8, bsums) = q8_k_parts(y);
        let sc = &x[0..16];
        let summs: i32 = bsums.zip(sc).map(|(s, &c)| s * (c >> 4) as i32).sum();
        let dall = yd * f16_at(x, 80);
        let dmin = yd * f16_at(x, 82);
        let mut isum = 0i32;
        let mut is = 0;
        for half in 0..QK_K / 128 {
            let q2 = &x[16 + 32 * half..16 + 32 * half + 32];
            for (k, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                let q8 = &q8[128 * half + 32 * k..128 * half + 32 * k + 32];
                for part in 0..2 {
                    let d = (sc[is] & 0x0f) as i32;
                    is += 1;
                    let isuml: i32 = (16 * part..16 * part + 16)
                        .map(|l| (q8[l] as i8 as i32) * ((q2[l] >> shift) & 3) as i32)
                        .sum();
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Adds `scale * q8[l] * a[l]` over 16 values into the eight lanes (`aux32[l % 8]`).
#[inline]
fn lanes_16(aux32: &mut [i32; 8], scale: i32, q8: &[u8], a: &[i8]) {
    for (qc, ac) in q8.chunks_exact(8).zip(a.chunks_exact(8)) {
        for l in 0..8 {
            aux32[l] += scale * ((qc[l] as i8 as i32) * ac[l] as i32);
        }
    }
}

/// Adds the lanes of one super-block, scaled by `d`, to `sums`.
#[inline]
fn add_lanes(sums: &mut [f32; 8], d: f32, aux32: &[i32; 8]) {
    for (s, &v) in sums.iter_mut().zip(aux32) {
        *s += d * v as f32;
    }
}

fn q3_k_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let (yd, q8, _) = q8_k_parts(y);
        let hm = &x[0..32];
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        for (c, chunk) in aux8.chunks_exact_mut(32).enumerate() {
            let q3 = &x[32 + 32 * (c / 4)..32 + 32 * (c / 4) + 32];
            let shift = 2 * (c % 4) as u32;
            for (l, o) in chunk.iter_mut().enumerate() {
                let low = ((q3[l] >> shift) & 3) as i8;
                *o = low - if hm[l] & m != 0 { 0 } else { 4 };
            }
            m = m.wrapping_shl(1);
        }
        let scales = super::dequant::q3_k_scales(&x[96..108]);
        let mut aux32 = [0i32; 8];
        for (j, &sc) in scales.iter().enumerate() {
            lanes_16(
                &mut aux32,
                sc - 32,
                &q8[16 * j..16 * j + 16],
                &aux8[16 * j..16 * j + 16],
            );
        }
        add_lanes(&mut sums, f16_at(x, 108) * yd, &aux32);
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}

fn q45_k_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8], five_bit: bool) -> f32 {
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    let qs_at = if five_bit { 48 } else { 16 };
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let (yd, q8, bsums) = q8_k_parts(y);
        let mut aux8 = [0i8; QK_K];
        for (c, chunk) in aux8.chunks_exact_mut(32).enumerate() {
            let q4 = &x[qs_at + 32 * (c / 2)..qs_at + 32 * (c / 2) + 32];
            let shift = 4 * (c % 2) as u32;
            for (l, o) in chunk.iter_mut().enumerate() {
                let high = if five_bit && x[16 + l] & (1u8 << c) != 0 {
                    16
                } else {
                    0
                };
                *o = ((q4[l] >> shift) & 0x0f) as i8 + high;
            }
        }
        let scales = &x[4..16];
        let sm: [(u8, u8); 8] = std::array::from_fn(|j| super::dequant::scale_min_k4(j, scales));
        let sumi: i32 = bsums.enumerate().map(|(j, s)| s * sm[j / 2].1 as i32).sum();
        let mut aux32 = [0i32; 8];
        for (j, &(sc, _)) in sm.iter().enumerate() {
            for half in 0..2 {
                let r = 32 * j + 16 * half;
                lanes_16(&mut aux32, sc as i32, &q8[r..r + 16], &aux8[r..r + 16]);
            }
        }
        add_lanes(&mut sums, f16_at(x, 0) * yd, &aux32);
        sumf -= (f16_at(x, 2) * yd) * sumi as f32;
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

fn q6_k_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let (yd, q8, _) = q8_k_parts(y);
        let mut aux8 = [0i8; QK_K];
        for (n, o) in aux8.chunks_exact_mut(128).enumerate() {
            let ql = &x[64 * n..64 * n + 64];
            let qh = &x[128 + 32 * n..128 + 32 * n + 32];
            for l in 0..32 {
                let h = qh[l];
                o[l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                o[l + 32] = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                o[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                o[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let mut aux32 = [0i32; 8];
        for (j, &sc) in x[192..208].iter().enumerate() {
            let r = 16 * j;
            lanes_16(
                &mut aux32,
                sc as i8 as i32,
                &q8[r..r + 16],
                &aux8[r..r + 16],
            );
        }
        add_lanes(&mut sums, f16_at(x, 208) * yd, &aux32);
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}

fn iq4_xs_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let (yd, q8, _) = q8_k_parts(y);
        let d4d8 = f16_at(x, 0) * yd;
        let scales_h = u16_at(x, 2) as u32;
        for ib in 0..QK_K / 32 {
            let ls = ((x[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32
                | (((scales_h >> (2 * ib)) & 3) << 4) as i32;
            let dl = d4d8 * (ls - 32) as f32;
            let qs = &x[8 + 16 * ib..8 + 16 * ib + 16];
            let yq = &q8[32 * ib..32 * ib + 32];
            let (mut s1, mut s2) = (0i32, 0i32);
            for (j, &q) in qs.iter().enumerate() {
                s1 += (yq[j] as i8 as i32) * KVALUES_IQ4NL[(q & 0x0f) as usize] as i32;
                s2 += (yq[j + 16] as i8 as i32) * KVALUES_IQ4NL[(q >> 4) as usize] as i32;
            }
            sumf += dl * (s1 + s2) as f32;
        }
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::f32_to_f16;
    use crate::graph::{DType, Graph, Input, Shape};
    use crate::interp::{Inputs, InterpOptions, Interpreter, MemWeights};

    /// xorshift
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// [`vec_dot_avx2`] gives the interpreter's numbers in llama.cpp's x86 order (its
    /// `avx2_order`, `InterpOptions::llama_cpp`), bit for bit, for one and several tokens.
    #[test]
    fn vec_dot_avx2_matches_the_interpreter() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        // elements where ggml's scalar order gives another f32 (the test can tell them apart)
        let mut differ = 0;
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for (k, m, n) in [(96usize, 5usize, 1usize), (64, 3, 3)] {
                let mut w = vec![0u8; t.row_size(k as u64).unwrap() as usize * m];
                w.iter_mut().for_each(|b| *b = next(&mut seed) as u8);
                for blk in w.chunks_exact_mut(t.type_size()) {
                    let d = (next(&mut seed) % 1000) as f32 * 3e-5 - 0.01;
                    blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                    if t == GgmlType::Q4_1 {
                        let mn = -((next(&mut seed) % 1000) as f32) * 2e-4;
                        blk[2..4].copy_from_slice(&f32_to_f16(mn).to_le_bytes());
                    }
                }
                let x: Vec<f32> = (0..k * n)
                    .map(|_| (next(&mut seed) % 20001) as f32 / 5000.0 - 2.0)
                    .collect();
                let mut g = Graph::new();
                let wt = g.weight("w", DType::Block(t), Shape::new(&[k as u64, m as u64]));
                let xt = g.input(
                    "x",
                    Input::Data,
                    DType::F32,
                    Shape::new(&[k as u64, n as u64]),
                );
                let y = g.mul_mat("y", wt, xt).unwrap();
                g.outputs.push(y);
                let mut mw = MemWeights::new();
                mw.insert("w", t, [k as u64, m as u64, 1, 1], w.clone());
                let opts = InterpOptions {
                    q8_flavor: Q8Flavor::X86,
                    n_threads: 1,
                    ..InterpOptions::llama_cpp()
                };
                let data = [("x", &x[..])];
                let inputs = Inputs {
                    tokens: &[],
                    positions: &[],
                    output_ids: &[],
                    kv_len: 0,
                    data: &data,
                };
                let out = Interpreter::new(&mw, opts).run(&g, &inputs).unwrap();
                let rb = w.len() / m;
                for tok in 0..n {
                    let (_, act) =
                        quantize_activations(t, &x[tok * k..(tok + 1) * k], Q8Flavor::X86).unwrap();
                    for r in 0..m {
                        let ours = vec_dot_avx2(t, &w[r * rb..(r + 1) * rb], &act).unwrap();
                        let scalar = vec_dot(t, &w[r * rb..(r + 1) * rb], &act).unwrap();
                        differ += (scalar.to_bits() != ours.to_bits()) as usize;
                        assert_eq!(
                            ours.to_bits(),
                            out[0][tok * m + r].to_bits(),
                            "{t} k={k} n={n} row {r} token {tok}: {ours} vs {}",
                            out[0][tok * m + r]
                        );
                    }
                }
            }
        }
        assert!(differ > 0, "no element tells the two orders apart");
        assert!(vec_dot_avx2(GgmlType::Q6_K, &[0; 210], &[0; 291]).is_err());
        assert!(vec_dot_avx2(GgmlType::Q8_1, &[0; 36], &[0; 36]).is_err());
    }
}

/// TQ1_0 · Q8_K (`ggml_vec_dot_tq1_0_q8_K_generic`): per super-block the exact sum of
/// `(digit - 1) * y`, then `sumf += sumi * (dx * dy)`.
fn tq1_0_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let digits = super::dequant::tq1_0_digits(x);
        let sumi: i32 = digits
            .iter()
            .zip(i8s(&y[4..260]))
            .map(|(&q, v)| (q as i32 - 1) * v)
            .sum();
        sumf += sumi as f32 * (f16_at(x, 52) * f32_at(y, 0));
    }
    sumf
}

/// TQ2_0 · Q8_K (`ggml_vec_dot_tq2_0_q8_K_generic`): per super-block the exact sum of
/// `(q - 1) * y`, then `sumf += sumi * (dy * dx)`.
fn tq2_0_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let yq = &y[4..260];
        let mut sumi = 0i32;
        for (v, &yv) in yq.iter().enumerate() {
            let q = (x[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
            sumi += (q as i32 - 1) * (yv as i8 as i32);
        }
        sumf += sumi as f32 * (f32_at(y, 0) * f16_at(x, 64));
    }
    sumf
}

/// IQ3_XXS · Q8_K (`ggml_vec_dot_iq3_xxs_q8_K_generic`): per super-block the exact
/// `bsum = Σ (2 ls + 1) · Σ ±grid · y`, `sumf += (dx · dy) · bsum`; `0.25 · sumf` at the end.
fn iq3_xxs_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let u = super::dequant::iq3_xxs_unpack(x);
        sumf += d * grid_bsum(&u, y) as f32;
    }
    0.25 * sumf
}

/// IQ3_S · Q8_K (`ggml_vec_dot_iq3_s_q8_K_generic`): per super-block the exact
/// `bsum = Σ (2 ls + 1) · Σ ±grid · y`, `sumf += (dx · dy) · bsum`.
fn iq3_s_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let u = super::dequant::iq3_s_unpack(x);
        sumf += d * grid_bsum(&u, y) as f32;
    }
    sumf
}

/// IQ2_XXS · Q8_K (`ggml_vec_dot_iq2_xxs_q8_K_generic`): per super-block the exact
/// `bsum = Σ (2 ls + 1) · Σ ±grid · y`, `sumf += (dx · dy) · bsum`; `0.125 · sumf` at the end.
fn iq2_xxs_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let u = super::dequant::iq2_xxs_unpack(x);
        sumf += d * grid_bsum(&u, y) as f32;
    }
    0.125 * sumf
}

/// `Σ_h (2 ls_h + 1) · Σ ±grid · y` over the scale groups `h` of an unpacked grid block
/// with one Q8_K block: exact, so the same integer as ggml's per-32 or per-16 sums.
fn grid_bsum(u: &super::dequant::GridValues, y: &[u8]) -> i32 {
    let mut bsum = 0i32;
    for h in 0..16 {
        let mut sumi = 0i32;
        for v in 16 * h..16 * h + 16 {
            let p = u.mag[v] as i32 * (y[4 + v] as i8 as i32);
            sumi += if u.neg[v] { -p } else { p };
        }
        bsum += sumi * (2 * u.ls[h] as i32 + 1);
    }
    bsum
}

/// IQ2_XS · Q8_K (`ggml_vec_dot_iq2_xs_q8_K_generic`): per super-block the exact
/// `bsum = Σ (2 ls + 1) · Σ ±grid · y` (scales per 16 values), `sumf += (dx · dy) · bsum`;
/// `0.125 · sumf` at the end.
fn iq2_xs_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let u = super::dequant::iq2_xs_unpack(x);
        sumf += d * grid_bsum(&u, y) as f32;
    }
    0.125 * sumf
}

/// IQ2_S · Q8_K (`ggml_vec_dot_iq2_s_q8_K_generic`): as IQ2_XS.
fn iq2_s_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let u = super::dequant::iq2_s_unpack(x);
        sumf += d * grid_bsum(&u, y) as f32;
    }
    0.125 * sumf
}

/// IQ1_S · Q8_K (`ggml_vec_dot_iq1_s_q8_K_generic`): per super-block the exact
/// `sumi = Σ (2 ls + 1) · Σ grid · y` and `sumi1 = Σ (2 ls + 1) · (±1) · bsums`, then
/// `sumf += (dx · dy) · (sumi + 0.125 · sumi1)`.
fn iq1_s_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let u = super::dequant::iq1_s_unpack(x);
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let ls = 2 * u.ls[ib] as i32 + 1;
            let lsum: i32 = (32 * ib..32 * ib + 32)
                .map(|v| u.grid[v] as i32 * (y[4 + v] as i8 as i32))
                .sum();
            sumi += ls * lsum;
            let bs = |j: usize| i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]) as i32;
            let delta = if u.delta_neg[ib] { -1 } else { 1 };
            sumi1 += ls * delta * (bs(2 * ib) + bs(2 * ib + 1));
        }
        sumf += f16_at(x, 0) * f32_at(y, 0) * (sumi as f32 + 0.125 * sumi1 as f32);
    }
    sumf
}

/// IQ1_M · Q8_K (`ggml_vec_dot_iq1_m_q8_K_generic`): per super-block the exact
/// `sumi1 = Σ (2 ls + 1) · Σ grid · y` and `sumi2 = Σ (2 ls + 1) · Σ (±1) · y`, then
/// `sumf += (d · dy) · (sumi1 + 0.125 · sumi2)`.
fn iq1_m_q8_k<'a>(w: impl Iterator<Item = &'a [u8]>, a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.zip(a.chunks_exact(292)) {
        let u = super::dequant::iq1_m_unpack(x);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for h in 0..16 {
            let ls = 2 * u.ls[h] as i32 + 1;
            let (mut a1, mut a2) = (0i32, 0i32);
            for v in 16 * h..16 * h + 16 {
                let q = y[4 + v] as i8 as i32;
                a1 += u.grid[v] as i32 * q;
                a2 += if u.delta_neg[v / 8] { -q } else { q };
            }
            sumi1 += ls * a1;
            sumi2 += ls * a2;
        }
        sumf += u.d * f32_at(y, 0) * (sumi1 as f32 + 0.125 * sumi2 as f32);
    }
    sumf
}
