//! What llama.cpp's x86 AVX2 build computes for the weights it *repacks* at load time.
//!
//! On a CPU with AVX2, llama.cpp puts some weights in its `CPU_REPACK` buffer
//! (ggml-cpu/repack.cpp): at load time it interleaves the blocks of 8 consecutive rows
//! (`block_q4_0x8`, `block_q4_Kx8`, `block_iq4_nlx8`, `block_mxfp4x8`) and from then on every `mul_mat` with
//! such a weight runs the interleaved kernels of ggml-cpu/arch/x86/repack.cpp instead of the
//! type's `ggml_vec_dot_*` (or llamafile's tinyBLAS). Those kernels compute the same integer
//! sums per block but add the scaled sums in their own order, so their f32 results differ
//! from [`super::vec_dot`] / [`super::vec_dot_avx2`] in the last bits — enough, after 8-bit
//! activation rounding and 30 layers, to move log-probabilities by tenths of a nat.
//!
//! The functions here compute, from the *original* row-major ggml blocks (no physical
//! repacking is needed: every output depends only on its own weight row and activation
//! column), the f32 values those kernels produce, bit for bit, in plain scalar Rust. They
//! were checked against llama.cpp's own library (the x86 AVX2 build without AVX-512 that
//! made `shared/reference/`: ggml's `mul_mat` with the weight in `CPU_REPACK`, 2 threads) on
//! random data with 1, 3, 4, 7 and 9 activation columns: identical bits for every output.
//! AVX-512 builds run other code paths (16-column gemm blocks, other reductions).
//!
//! # Which weights are repacked ([`repacked_by_llama_cpp`])
//!
//! `ggml_repack_get_optimal_repack_type` on an AVX2 CPU without AVX-512: Q4_0 →
//! `q4_0_8x8_q8_0`, Q4_K → `q4_K_8x8_q8_K`, IQ4_NL → `iq4_nl_8x8_q8_0`, MXFP4 →
//! `mxfp4_8x8_q8_0`, each only when `ne[1] % 8 == 0`; every other type (Q8_0, Q4_1, Q5_x,
//! Q2_K/Q3_K/Q5_K/Q6_K, IQ4_XS, floats) stays in the plain CPU buffer (Q2_K needs AVX-512;
//! Q8_0, Q5_K, Q6_K are repacked only on ARM / RISC-V). The loader
//! (`llama_model_loader::create_tensor` → `select_weight_buft`) offers `CPU_REPACK` before
//! the plain CPU buffer, and the repack buffer type accepts a weight only for a 2-D
//! `GGML_OP_MUL_MAT` (3-D for `MUL_MAT_ID`) with F32 activations. Hence:
//!
//! - `token_embd` is *not* repacked for its `GGML_OP_GET_ROWS` use;
//! - a tied output (no `output.weight`; `token_embd` loaded a second time with
//!   `TENSOR_DUPLICATED` as the output's `MUL_MAT` weight) *is* repacked when its type and
//!   `ne[1]` qualify, as a separate copy — so the rule is the same for every weight used in
//!   a `mul_mat`, whatever its name;
//! - `output.weight` and all `blk.N.*` projection weights follow the type / `ne[1]` rule.
//!
//! # Which columns go through which kernel ([`RepackKernel::for_column`])
//!
//! `tensor_traits::forward_mul_mat` (repack.cpp), per plane of `src1` (`ne12`):
//!
//! - columns `0 .. ne11 - ne11 % 4` are quantized four at a time by
//!   `ggml_quantize_mat_q8_0_4x8` / `ggml_quantize_mat_q8_K_4x8` and multiplied by the gemm
//!   kernel (`ggml_gemm_*_8x8_*`), which computes 4 columns × 8 rows at a time;
//! - the remaining `ne11 % 4` columns are quantized one by one by the type's `from_float`
//!   (`quantize_row_q8_0` x86 / `quantize_row_q8_K`) and multiplied by the gemv kernel
//!   (`ggml_gemv_*_8x8_*`), one column × 8 rows at a time.
//!
//! So a one-token decode always uses gemv; a prompt of `n` tokens uses gemm for the first
//! `n - n % 4` and gemv for the last `n % 4`. Rows are split over threads in chunks aligned
//! to 8 rows (`src0_start` / `src0_end` rounded up to `NB_COLS`); each output is computed by
//! exactly one thread in a fixed order, so the thread count does not change any number.
//!
//! # The activations ([`repack_quantize_activations`])
//!
//! - `ggml_quantize_mat_q8_0_4x8` (x86) computes exactly what x86 `quantize_row_q8_0` does
//!   per column (`d = amax / 127` as f16, `qs = round_ties_even(x * (127 / amax))`): the
//!   values are those of [`super::quantize_q8_0_with`] with [`super::Q8Flavor::X86`], only
//!   stored interleaved. Both gemm and gemv columns of Q4_0 / IQ4_NL therefore use that.
//! - `ggml_quantize_mat_q8_K_4x8` (x86 AVX2) equals `quantize_row_q8_K_ref`
//!   ([`super::quantize_q8_k`]) except for the sign of the scale when the largest magnitude
//!   occurs both positive and negative in a 256-value block: the reference takes the sign of
//!   the *first* such value, the AVX2 code takes `+amax` whenever `+amax` occurs (its
//!   `iscale = -127 / amax`, so `d < 0`), and the quants and `bsums` are then all negated.
//!   Since rounding to nearest-even and every product are symmetric under negation, the dot
//!   products are the same f32 values either way: the bytes differ, the numbers do not. See
//!   [`quantize_q8_k_4x8`]; gemv columns use the reference quantizer.
//!
//! # The arithmetic ([`RepackedRow::dot`])
//!
//! Integer sums are exact in every kernel (no `maddubs` saturation is reachable with these
//! formats). Per output, with `dx` the weight's f16 scale(s) as f32 and `dy` the
//! activation's scale:
//!
//! - Q4_0, IQ4_NL, MXFP4, gemv and gemm alike (`gemv_q4_b32_8x8_q8_0_lut_avx`,
//!   `gemm_q4_b32_8x8_q8_0_lut_avx`): one f32 accumulator,
//!   `acc = fma(isum_b, dx_b * dy_b, acc)` for the 32-value blocks `b` in order, `isum_b`
//!   the exact i32 sum of the block's products (Q4_0 values `q - 8`, IQ4_NL values
//!   `kvalues_iq4nl[q]`, MXFP4 values `kvalues_mxfp4[q]` with `dx_b = 2^(e - 128)` from
//!   the table `ggml_table_f32_e8m0_half`). Gemm and gemv give identical results for the same activations.
//!   The plain AVX2 `ggml_vec_dot_q4_0_q8_0` instead keeps 8 partial lanes and adds them
//!   with `hsum_float_8`; the scalar reference adds `isum * dx * dy` without fusing.
//! - Q4_K, gemv (`ggml_gemv_q4_K_8x8_q8_K`): per 256-value super-block
//!   `acc = fma(Σ_j sc_j · isum_j, d * dy, acc)` and
//!   `acc_min = fma(Σ_j m_j · bsum_j, dmin * dy, acc_min)` over the 8 sub-blocks `j` of 32
//!   values (`bsum_j` the sum of the sub-block's activation quants, from `bsums`); result
//!   `acc - acc_min`.
//! - Q4_K, gemm (`ggml_gemm_q4_K_8x8_q8_K`): the same, but one fma per *pair* of
//!   sub-blocks (64 values): for `p` in 0..4 of each super-block,
//!   `acc = fma(sc_2p · isum_2p + sc_2p+1 · isum_2p+1, d * dy, acc)` and likewise for the
//!   mins. Gemm and gemv therefore differ in the last bits for the same activations.
//!
//! The scalar and AVX2 `ggml_vec_dot_q4_K_q8_K` use yet other orders (8 lanes; per
//! super-block `sumf += d * sumi` with `sumi` over all sub-blocks, then the mins).

use super::error::{check_lengths, BlockDataError};
use super::fp::{e8m0_to_f32_half, f16_at, f32_at};
use super::grids::KVALUES_MXFP4;
use super::layouts::KVALUES_IQ4NL;
use super::quant::{nearest_int, quantize_q8_0_with, quantize_q8_k, Q8Flavor};
use super::{GgmlType, QK_K};

/// Which of a repacked weight's two kernels computes an output column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RepackKernel {
    /// `ggml_gemv_*_8x8_*`: one activation column (quantized by `from_float`).
    Gemv,
    /// `ggml_gemm_*_8x8_*`: four activation columns at a time (quantized by
    /// `ggml_quantize_mat_*_4x8`).
    Gemm,
}

impl RepackKernel {
    /// The kernel `forward_mul_mat` uses for column `col` of a plane of `ncols` activation
    /// columns: gemm for the first `ncols - ncols % 4`, gemv for the rest.
    pub fn for_column(col: usize, ncols: usize) -> RepackKernel {
        if col < ncols - ncols % 4 {
            RepackKernel::Gemm
        } else {
            RepackKernel::Gemv
        }
    }
}

/// Whether llama.cpp's x86 AVX2 build (without AVX-512) repacks a weight of type `wtype` and
/// shape `ne` (ggml order) used as the first operand of a `mul_mat`: Q4_0, Q4_K, IQ4_NL or
/// MXFP4, two-dimensional, `ne[1] % 8 == 0` (see the module documentation; the name of the
/// tensor does not matter: a tied output is repacked as a separate copy of `token_embd`).
///
/// [`RepackedRow`] computes the kernels' results for each of them.
pub fn repacked_by_llama_cpp(wtype: GgmlType, ne: [u64; 4]) -> bool {
    matches!(
        wtype,
        GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::IQ4_NL | GgmlType::MXFP4
    ) && ne[1] > 0
        && ne[1].is_multiple_of(8)
        && ne[2] == 1
        && ne[3] == 1
}

/// F32 → Q8_K as llama.cpp's x86 AVX2 `ggml_quantize_mat_q8_K_4x8` computes each of its four
/// columns (values only; the layout here is plain `block_q8_K`: `d` f32 @0, `qs[256]` @4,
/// `bsums[16]` i16 @260).
///
/// Per 256 values: `amax = max |x|`; `iscale = -127 / amax` if some value equals `+amax`,
/// else `127 / amax`; `qs = round_ties_even(iscale * x)`; `d = 1 / iscale`; `bsums[j]` the
/// sum of `qs[16 j .. 16 j + 16]`; an all-zero block gives `d = 0` and zero quants. This
/// equals [`super::quantize_q8_k`] except when `-amax` occurs before `+amax` (the reference
/// then takes the negative sign): there `d`, the quants and `bsums` are negated, which
/// leaves every dot product with them unchanged.
///
/// # Errors
/// [`BlockDataError::PartialBlock`] if `src.len()` is not a multiple of 256;
/// [`BlockDataError::ByteLength`] unless `dst.len() == src.len() / 256 * 292`.
pub fn quantize_q8_k_4x8(src: &[f32], dst: &mut [u8]) -> Result<(), BlockDataError> {
    check_lengths(GgmlType::Q8_K, "dst", src.len(), dst.len())?;
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(292)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            b[0..4].copy_from_slice(&0.0f32.to_le_bytes());
            b[4..292].fill(0);
            continue;
        }
        let positive = x.contains(&amax);
        let iscale = if positive {
            -127.0 / amax
        } else {
            127.0 / amax
        };
        for (o, &v) in b[4..260].iter_mut().zip(x) {
            // `_mm256_packs_*` saturate; in-range values pass unchanged.
            *o = nearest_int(iscale * v).clamp(-128, 127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = b[4 + 16 * j..4 + 16 * j + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
    Ok(())
}

/// Converts the f32 activation column `x` to what the repacked kernel `kernel` of weight
/// type `wtype` reads: Q8_0 (x86 flavor, gemm and gemv alike) for Q4_0, IQ4_NL and MXFP4; Q8_K by
/// [`quantize_q8_k_4x8`] (gemm) or [`super::quantize_q8_k`] (gemv) for Q4_K.
///
/// Returns the activation type and the converted row (plain ggml layout), ready for
/// [`RepackedRow::dot`].
///
/// # Errors
/// [`BlockDataError::Unsupported`] for other weight types;
/// [`BlockDataError::PartialBlock`] if `x.len()` is not whole blocks of the activation type.
pub fn repack_quantize_activations(
    wtype: GgmlType,
    x: &[f32],
    kernel: RepackKernel,
) -> Result<(GgmlType, Vec<u8>), BlockDataError> {
    let at = repack_act_type(wtype)?;
    if !x.len().is_multiple_of(at.block_size()) {
        return Err(BlockDataError::PartialBlock {
            ty: at,
            n_values: x.len(),
            block_size: at.block_size(),
        });
    }
    let mut act = vec![0u8; x.len() / at.block_size() * at.type_size()];
    match (at, kernel) {
        (GgmlType::Q8_0, _) => quantize_q8_0_with(x, &mut act, Q8Flavor::X86)?,
        (_, RepackKernel::Gemm) => quantize_q8_k_4x8(x, &mut act)?,
        (_, RepackKernel::Gemv) => quantize_q8_k(x, &mut act)?,
    }
    Ok((at, act))
}

/// The activation type of a repacked weight type's kernels.
fn repack_act_type(wtype: GgmlType) -> Result<GgmlType, BlockDataError> {
    match wtype {
        GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => Ok(GgmlType::Q8_0),
        GgmlType::Q4_K => Ok(GgmlType::Q8_K),
        _ => Err(BlockDataError::Unsupported {
            op: "repacked dot product",
            ty: wtype,
        }),
    }
}

/// One weight row (Q4_0, Q4_K, IQ4_NL or MXFP4) decoded once into integer values and f32 scales,
/// to be dotted with many activation columns as llama.cpp's interleaved x86 kernels do
/// ([`RepackedRow::dot`]; the module documentation gives the order of operations).
#[derive(Clone, Debug, Default)]
pub struct RepackedRow {
    /// Weight type (Q4_0, Q4_K, IQ4_NL or MXFP4 once decoded).
    ty: Option<GgmlType>,
    /// Number of values.
    n: usize,
    /// Integer values: `q - 8` (Q4_0), `kvalues_iq4nl[q]` (IQ4_NL), `kvalues_mxfp4[q]`
    /// (MXFP4), `q` in 0..16 (Q4_K).
    q: Vec<i8>,
    /// `d` per 32-value block (Q4_0, IQ4_NL: f16 → f32; MXFP4: `2^(e - 128)`) or per
    /// super-block (Q4_K).
    d: Vec<f32>,
    /// `dmin` per super-block (Q4_K).
    dmin: Vec<f32>,
    /// 6-bit scales, 8 per super-block (Q4_K).
    sc: Vec<i32>,
    /// 6-bit mins, 8 per super-block (Q4_K).
    mins: Vec<i32>,
}

impl RepackedRow {
    /// Decodes weight row `row` (whole blocks of `wtype`), reusing this value's buffers.
    ///
    /// # Errors
    /// [`BlockDataError::Unsupported`] unless `wtype` is Q4_0, Q4_K, IQ4_NL or MXFP4;
    /// [`BlockDataError::RaggedBytes`] if `row` is not whole blocks.
    pub fn load(&mut self, wtype: GgmlType, row: &[u8]) -> Result<(), BlockDataError> {
        repack_act_type(wtype)?;
        let ts = wtype.type_size();
        if !row.len().is_multiple_of(ts) {
            return Err(BlockDataError::RaggedBytes {
                ty: wtype,
                what: "weight row",
                actual: row.len(),
                type_size: ts,
            });
        }
        let nb = row.len() / ts;
        self.ty = Some(wtype);
        self.n = nb * wtype.block_size();
        self.q.clear();
        self.d.clear();
        self.dmin.clear();
        self.sc.clear();
        self.mins.clear();
        self.q.reserve(self.n);
        for x in row.chunks_exact(ts) {
            if wtype == GgmlType::MXFP4 {
                self.d.push(e8m0_to_f32_half(x[0]));
                let qs = &x[1..17];
                let val = |n: u8| KVALUES_MXFP4[n as usize];
                self.q.extend(qs.iter().map(|&b| val(b & 0x0f)));
                self.q.extend(qs.iter().map(|&b| val(b >> 4)));
                continue;
            }
            self.d.push(f16_at(x, 0));
            match wtype {
                GgmlType::Q4_0 | GgmlType::IQ4_NL => {
                    let qs = &x[2..18];
                    let val = |n: u8| -> i8 {
                        if wtype == GgmlType::Q4_0 {
                            n as i8 - 8
                        } else {
                            KVALUES_IQ4NL[n as usize]
                        }
                    };
                    self.q.extend(qs.iter().map(|&b| val(b & 0x0f)));
                    self.q.extend(qs.iter().map(|&b| val(b >> 4)));
                }
                _ => {
                    self.dmin.push(f16_at(x, 2));
                    let scales = &x[4..16];
                    for j in 0..8 {
                        let (s, m) = super::dequant::scale_min_k4(j, scales);
                        self.sc.push(s as i32);
                        self.mins.push(m as i32);
                    }
                    for c in 0..QK_K / 32 {
                        let qs = &x[16 + 32 * (c / 2)..16 + 32 * (c / 2) + 32];
                        let shift = 4 * (c % 2) as u32;
                        self.q
                            .extend(qs.iter().map(|&b| ((b >> shift) & 0x0f) as i8));
                    }
                }
            }
        }
        Ok(())
    }

    /// Decodes weight row `row` of type `wtype` (see [`RepackedRow::load`]).
    ///
    /// # Errors
    /// As [`RepackedRow::load`].
    pub fn new(wtype: GgmlType, row: &[u8]) -> Result<RepackedRow, BlockDataError> {
        let mut r = RepackedRow::default();
        r.load(wtype, row)?;
        Ok(r)
    }

    /// The output llama.cpp's kernel `kernel` computes for this weight row and the activation
    /// column `act` (in the activation type, as [`repack_quantize_activations`] makes it for
    /// that kernel; the same bytes may be given to either kernel).
    ///
    /// # Errors
    /// [`BlockDataError::Unsupported`] if no row was loaded;
    /// [`BlockDataError::PartialBlock`] / [`BlockDataError::ByteLength`] if `act` does not
    /// hold exactly as many values as the row.
    pub fn dot(&self, act: &[u8], kernel: RepackKernel) -> Result<f32, BlockDataError> {
        let ty = self.ty.ok_or(BlockDataError::Unsupported {
            op: "repacked dot product (no row loaded)",
            ty: GgmlType::Q4_0,
        })?;
        let at = repack_act_type(ty)?;
        check_lengths(at, "activation row", self.n, act.len())?;
        Ok(if at == GgmlType::Q8_0 {
            self.dot_b32(act)
        } else {
            self.dot_q4_k(act, kernel)
        })
    }

    /// Q4_0 / IQ4_NL / MXFP4 with Q8_0 activations: `acc = fma(isum_b, dx_b * dy_b, acc)`.
    #[inline(always)]
    fn dot_b32(&self, act: &[u8]) -> f32 {
        let mut acc = 0f32;
        for ((y, q), &dx) in act
            .chunks_exact(34)
            .zip(self.q.chunks_exact(32))
            .zip(&self.d)
        {
            let isum = isum32(q, &y[2..34]);
            acc = (isum as f32).mul_add(dx * f16_at(y, 0), acc);
        }
        acc
    }

    /// Q4_K with Q8_K activations: one fma per super-block (gemv) or per pair of sub-blocks
    /// (gemm), mins in a second accumulator, subtracted at the end.
    #[inline(always)]
    fn dot_q4_k(&self, act: &[u8], kernel: RepackKernel) -> f32 {
        let mut acc = 0f32;
        let mut acc_min = 0f32;
        for (b, y) in act.chunks_exact(292).enumerate() {
            let dy = f32_at(y, 0);
            let qy = &y[4..260];
            let d = self.d[b] * dy;
            let dmin = self.dmin[b] * dy;
            let sc = &self.sc[8 * b..8 * b + 8];
            let mins = &self.mins[8 * b..8 * b + 8];
            let qx = &self.q[QK_K * b..QK_K * (b + 1)];
            let bsum32 = |j: usize| -> i32 {
                let s = |g: usize| i16::from_le_bytes([y[260 + 2 * g], y[261 + 2 * g]]) as i32;
                s(2 * j) + s(2 * j + 1)
            };
            let mut isum_b = 0i32;
            let mut imin_b = 0i32;
            for p in 0..4 {
                let (j0, j1) = (2 * p, 2 * p + 1);
                let isum = sc[j0] * isum32(&qx[32 * j0..32 * j0 + 32], &qy[32 * j0..32 * j0 + 32])
                    + sc[j1] * isum32(&qx[32 * j1..32 * j1 + 32], &qy[32 * j1..32 * j1 + 32]);
                let imin = mins[j0] * bsum32(j0) + mins[j1] * bsum32(j1);
                match kernel {
                    RepackKernel::Gemm => {
                        acc = (isum as f32).mul_add(d, acc);
                        acc_min = (imin as f32).mul_add(dmin, acc_min);
                    }
                    RepackKernel::Gemv => {
                        isum_b += isum;
                        imin_b += imin;
                    }
                }
            }
            if kernel == RepackKernel::Gemv {
                acc = (isum_b as f32).mul_add(d, acc);
                acc_min = (imin_b as f32).mul_add(dmin, acc_min);
            }
        }
        acc - acc_min
    }
}

/// Exact sum of 32 products of int8 weights `q` and int8 activation bytes `y`.
#[inline(always)]
fn isum32(q: &[i8], y: &[u8]) -> i32 {
    let mut s = 0i32;
    for (&a, &b) in q.iter().zip(y).take(32) {
        s += a as i32 * (b as i8 as i32);
    }
    s
}

/// What llama.cpp's interleaved x86 kernels compute for 8 weight rows and `ncols` activation
/// columns, as `forward_mul_mat` calls them: gemm for columns `0 .. ncols - ncols % 4`, gemv
/// for the rest ([`RepackKernel::for_column`]).
///
/// `w_rows`: 8 weight rows of type `wtype` (Q4_0, Q4_K, IQ4_NL or MXFP4) back to back, original
/// ggml layout. `acts`: `ncols` activation columns back to back, each quantized as
/// [`repack_quantize_activations`] does for its column's kernel. Returns `out[c * 8 + r]`
/// (column `c`, row `r`), the layout of ggml's `dst`.
///
/// # Errors
/// [`BlockDataError::Unsupported`] for other types; [`BlockDataError::RaggedBytes`] if
/// `w_rows` is not 8 rows of whole blocks; [`BlockDataError::ByteLength`] if `acts` is not
/// `ncols` activation rows of the weight rows' length.
pub fn repack_mul_mat_8(
    wtype: GgmlType,
    w_rows: &[u8],
    acts: &[u8],
    ncols: usize,
) -> Result<Vec<f32>, BlockDataError> {
    let at = repack_act_type(wtype)?;
    let ts = wtype.type_size();
    if !w_rows.len().is_multiple_of(8 * ts) {
        return Err(BlockDataError::RaggedBytes {
            ty: wtype,
            what: "8 weight rows",
            actual: w_rows.len(),
            type_size: 8 * ts,
        });
    }
    let rb = w_rows.len() / 8;
    let act_row = rb / ts * at.type_size();
    if acts.len() != act_row * ncols {
        return Err(BlockDataError::ByteLength {
            ty: at,
            what: "activation columns",
            actual: acts.len(),
            expected: act_row * ncols,
            n_values: rb / ts * wtype.block_size() * ncols,
            block_size: at.block_size(),
            type_size: at.type_size(),
        });
    }
    let mut out = vec![0f32; 8 * ncols];
    let mut row = RepackedRow::default();
    for r in 0..8 {
        row.load(wtype, &w_rows[r * rb..(r + 1) * rb])?;
        for c in 0..ncols {
            let act = &acts[c * act_row..(c + 1) * act_row];
            out[c * 8 + r] = row.dot(act, RepackKernel::for_column(c, ncols))?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{f32_to_f16, quantize_activations, vec_dot};

    /// xorshift
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random rows of `wtype` with sane scales.
    fn weights(t: GgmlType, k: usize, m: usize, seed: &mut u64) -> Vec<u8> {
        let mut w = vec![0u8; t.row_size(k as u64).unwrap() as usize * m];
        w.iter_mut().for_each(|b| *b = next(seed) as u8);
        for blk in w.chunks_exact_mut(t.type_size()) {
            let d = ((next(seed) % 1000) as f32 + 1.0) * 2e-5;
            blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            if t == GgmlType::Q4_K {
                let dmin = ((next(seed) % 1000) as f32 + 1.0) * 1e-5;
                blk[2..4].copy_from_slice(&f32_to_f16(dmin).to_le_bytes());
            }
        }
        w
    }

    fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| (next(seed) % 20001) as f32 / 5000.0 - 2.0)
            .collect()
    }

    const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::Q4_K];

    /// Both kernels agree with the scalar `vec_dot` within a few f32 roundings, on the very
    /// same activation bytes; Q4_0 / IQ4_NL gemm and gemv are bit-identical, Q4_K's differ
    /// somewhere.
    #[test]
    fn kernels_agree_with_vec_dot() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut q4k_differ = 0;
        let mut vs_scalar_differ = 0;
        for t in TYPES {
            let k = 1024;
            let w = weights(t, k, 8, &mut seed);
            let rb = w.len() / 8;
            for _ in 0..40 {
                let x = activations(k, &mut seed);
                let (_, act) = quantize_activations(t, &x, Q8Flavor::X86).unwrap();
                for r in 0..8 {
                    let row = RepackedRow::new(t, &w[r * rb..(r + 1) * rb]).unwrap();
                    let gemv = row.dot(&act, RepackKernel::Gemv).unwrap();
                    let gemm = row.dot(&act, RepackKernel::Gemm).unwrap();
                    let want = vec_dot(t, &w[r * rb..(r + 1) * rb], &act).unwrap();
                    let tol = 1e-5 * want.abs().max(1.0);
                    assert!((gemv - want).abs() <= tol, "{t} gemv {gemv} vs {want}");
                    assert!((gemm - want).abs() <= tol, "{t} gemm {gemm} vs {want}");
                    vs_scalar_differ += (gemv.to_bits() != want.to_bits()) as usize;
                    if t == GgmlType::Q4_K {
                        q4k_differ += (gemv.to_bits() != gemm.to_bits()) as usize;
                    } else {
                        assert_eq!(gemv.to_bits(), gemm.to_bits(), "{t}: gemm != gemv");
                    }
                }
            }
        }
        assert!(q4k_differ > 0, "Q4_K gemm and gemv never differ");
        assert!(
            vs_scalar_differ > 0,
            "the kernels never differ from vec_dot"
        );
    }

    /// The Q4_0 / IQ4_NL order written out independently: one fused multiply-add per block.
    #[test]
    fn b32_order_is_one_fma_per_block() {
        let mut seed = 0x0bad_cafe_f00d_1234u64;
        for t in [GgmlType::Q4_0, GgmlType::IQ4_NL] {
            let k = 256;
            let w = weights(t, k, 1, &mut seed);
            let x = activations(k, &mut seed);
            let (_, act) = repack_quantize_activations(t, &x, RepackKernel::Gemv).unwrap();
            let mut wf = vec![0f32; 32];
            let mut acc = 0f32;
            for (xb, yb) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
                let dx = crate::ggml::f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
                let dy = crate::ggml::f16_to_f32(u16::from_le_bytes([yb[0], yb[1]]));
                crate::ggml::dequantize(t, xb, &mut wf).unwrap();
                // integer values back from the dequantized ones (exact: small integers × d)
                let isum: i32 = wf
                    .iter()
                    .zip(&yb[2..34])
                    .map(|(&v, &q)| (v / dx).round() as i32 * (q as i8 as i32))
                    .sum();
                acc = (isum as f32).mul_add(dx * dy, acc);
            }
            let row = RepackedRow::new(t, &w).unwrap();
            assert_eq!(
                row.dot(&act, RepackKernel::Gemv).unwrap().to_bits(),
                acc.to_bits()
            );
        }
    }

    /// The activation quantizers: Q8_0 is x86 `quantize_row_q8_0` for both kernels; Q8_K
    /// 4x8 equals the reference except when `-amax` precedes `+amax`.
    #[test]
    fn activation_quantizers() {
        let mut seed = 0xfeed_beef_0000_0001u64;
        let x = activations(512, &mut seed);
        for kernel in [RepackKernel::Gemv, RepackKernel::Gemm] {
            let (t, a) = repack_quantize_activations(GgmlType::Q4_0, &x, kernel).unwrap();
            let (t2, b) = quantize_activations(GgmlType::Q4_0, &x, Q8Flavor::X86).unwrap();
            assert_eq!((t, &a), (t2, &b));
        }
        for _ in 0..20 {
            let x = activations(512, &mut seed);
            let (_, gemm) =
                repack_quantize_activations(GgmlType::Q4_K, &x, RepackKernel::Gemm).unwrap();
            let (_, gemv) =
                repack_quantize_activations(GgmlType::Q4_K, &x, RepackKernel::Gemv).unwrap();
            let mut reference = vec![0u8; gemv.len()];
            quantize_q8_k(&x, &mut reference).unwrap();
            assert_eq!(gemv, reference);
            // no exact ±amax tie in random data: the same bytes
            assert_eq!(gemm, reference);
        }
        // a tie, negative first: the reference keeps the sign of the first, AVX2 takes +amax
        let mut x = activations(256, &mut seed);
        x[3] = -4.0;
        x[200] = 4.0;
        let mut a = vec![0u8; 292];
        let mut b = vec![0u8; 292];
        quantize_q8_k(&x, &mut a).unwrap();
        quantize_q8_k_4x8(&x, &mut b).unwrap();
        let d_ref = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let d_avx = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(d_ref, -d_avx);
        assert!(d_avx < 0.0);
        assert_eq!(b[4 + 200] as i8, -127);
        assert_eq!(a[4 + 200] as i8, 127);
        // ... and the products are the same numbers
        let w = weights(GgmlType::Q4_K, 256, 1, &mut seed);
        let row = RepackedRow::new(GgmlType::Q4_K, &w).unwrap();
        for kernel in [RepackKernel::Gemv, RepackKernel::Gemm] {
            let (p, q) = (row.dot(&a, kernel).unwrap(), row.dot(&b, kernel).unwrap());
            assert_eq!(p.to_bits(), q.to_bits());
        }
        // positive first: identical
        x[3] = 4.0;
        x[200] = -4.0;
        quantize_q8_k(&x, &mut a).unwrap();
        quantize_q8_k_4x8(&x, &mut b).unwrap();
        assert_eq!(a, b);
        // zeros
        let z = vec![0f32; 256];
        quantize_q8_k_4x8(&z, &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0));
    }

    /// `forward_mul_mat`'s column split, through [`repack_mul_mat_8`].
    #[test]
    fn column_split_follows_forward_mul_mat() {
        assert_eq!(RepackKernel::for_column(0, 1), RepackKernel::Gemv);
        assert_eq!(RepackKernel::for_column(2, 3), RepackKernel::Gemv);
        assert_eq!(RepackKernel::for_column(3, 4), RepackKernel::Gemm);
        assert_eq!(RepackKernel::for_column(7, 9), RepackKernel::Gemm);
        assert_eq!(RepackKernel::for_column(8, 9), RepackKernel::Gemv);
        let mut seed = 0x5555_aaaa_3333_ccccu64;
        let t = GgmlType::Q4_K;
        let k = 512;
        let w = weights(t, k, 8, &mut seed);
        let ncols = 6;
        let x = activations(k * ncols, &mut seed);
        let mut acts = Vec::new();
        for c in 0..ncols {
            let kernel = RepackKernel::for_column(c, ncols);
            let (_, a) = repack_quantize_activations(t, &x[c * k..(c + 1) * k], kernel).unwrap();
            acts.extend_from_slice(&a);
        }
        let out = repack_mul_mat_8(t, &w, &acts, ncols).unwrap();
        let rb = w.len() / 8;
        let ab = acts.len() / ncols;
        for c in 0..ncols {
            for r in 0..8 {
                let row = RepackedRow::new(t, &w[r * rb..(r + 1) * rb]).unwrap();
                let kernel = if c < 4 {
                    RepackKernel::Gemm
                } else {
                    RepackKernel::Gemv
                };
                let want = row.dot(&acts[c * ab..(c + 1) * ab], kernel).unwrap();
                assert_eq!(out[c * 8 + r].to_bits(), want.to_bits());
            }
        }
        assert!(repack_mul_mat_8(t, &w[..rb * 7], &acts, ncols).is_err());
        assert!(repack_mul_mat_8(t, &w, &acts[1..], ncols).is_err());
        assert!(repack_mul_mat_8(GgmlType::Q8_0, &w, &acts, ncols).is_err());
    }

    /// The interpreter in llama.cpp's order runs repacked weights through these kernels,
    /// gemm for the first `n - n % 4` columns and gemv for the rest, bit for bit; weights
    /// llama.cpp does not repack (`ne[1] % 8 != 0`) and the reference order do not.
    #[test]
    fn interpreter_uses_the_repacked_kernels() {
        use crate::graph::{DType, Graph, Input, Shape};
        use crate::interp::{Inputs, InterpOptions, Interpreter, MemWeights};
        let mut seed = 0x7777_1111_2222_3333u64;
        for t in TYPES {
            let k = 512;
            for (m, n) in [(16usize, 1usize), (16, 6), (12, 5)] {
                let w = weights(t, k, m, &mut seed);
                let x = activations(k * n, &mut seed);
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
                let data = [("x", &x[..])];
                let inputs = Inputs {
                    tokens: &[],
                    positions: &[],
                    output_ids: &[],
                    kv_len: 0,
                    data: &data,
                };
                let run = |opts: InterpOptions| {
                    let opts = InterpOptions {
                        q8_flavor: Q8Flavor::X86,
                        n_threads: 2,
                        ..opts
                    };
                    Interpreter::new(&mw, opts)
                        .run(&g, &inputs)
                        .unwrap()
                        .remove(0)
                };
                let llama = run(InterpOptions::llama_cpp());
                let rounded = run(InterpOptions::rounded());
                let rb = w.len() / m;
                let (mut same_llama, mut same_rounded) = (0, 0);
                for c in 0..n {
                    let kernel = RepackKernel::for_column(c, n);
                    let (_, act) =
                        repack_quantize_activations(t, &x[c * k..(c + 1) * k], kernel).unwrap();
                    for r in 0..m {
                        let row = RepackedRow::new(t, &w[r * rb..(r + 1) * rb]).unwrap();
                        let ours = row.dot(&act, kernel).unwrap().to_bits();
                        same_llama += (ours == llama[c * m + r].to_bits()) as usize;
                        same_rounded += (ours == rounded[c * m + r].to_bits()) as usize;
                    }
                }
                if m % 8 == 0 {
                    assert_eq!(same_llama, m * n, "{t} m={m} n={n}");
                } else {
                    assert!(same_llama < m * n, "{t} m={m} n={n}: not repacked");
                }
                assert!(same_rounded < m * n, "{t} m={m} n={n}: reference order");
            }
        }
    }

    #[test]
    fn repack_rule() {
        use GgmlType::*;
        for t in [Q4_0, Q4_K, IQ4_NL, MXFP4] {
            assert!(repacked_by_llama_cpp(t, [576, 1536, 1, 1]));
            assert!(!repacked_by_llama_cpp(t, [576, 1532, 1, 1]));
            assert!(!repacked_by_llama_cpp(t, [576, 1536, 2, 1]));
        }
        for t in [
            Q8_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS, F16, F32, BF16,
        ] {
            assert!(!repacked_by_llama_cpp(t, [576, 1536, 1, 1]));
        }
        assert!(RepackedRow::new(Q8_0, &[0; 34]).is_err());
        assert!(RepackedRow::new(Q4_0, &[0; 17]).is_err());
        assert!(RepackedRow::default()
            .dot(&[0; 34], RepackKernel::Gemv)
            .is_err());
        let row = RepackedRow::new(Q4_0, &[0; 18]).unwrap();
        assert!(row.dot(&[0; 68], RepackKernel::Gemv).is_err());
    }
}
