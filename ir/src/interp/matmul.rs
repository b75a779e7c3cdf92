//! `mul_mat`: `out[m, n] = dot(row m of a, row n of b)`, ggml's convention, over the
//! broadcast slices of dims 2 and 3.
//!
//! Two ways to compute a product with a weight, chosen by [`super::InterpOptions`]:
//!
//! - exact: the weight row is dequantized to f32 ([`crate::ggml::dequantize`], bit-exact with
//!   ggml) and dotted with the f32 activations;
//! - llama.cpp's rounding: the activations are first converted to the weight type's
//!   companion format ([`crate::ggml::vec_dot_type`]: Q8_0, Q8_1, Q8_K blocks, or F16 / BF16
//!   values), as ggml-cpu's `ggml_compute_forward_mul_mat` does, and each output is the
//!   weight type's reference dot product ([`crate::ggml::vec_dot`]) or, in llama.cpp's x86
//!   order, the one its AVX2 build computes for that number of columns
//!   ([`crate::ggml::vec_dot_avx2_mul_mat`]: `vec_dot`, tinyBLAS, the tiled K-quant kernel).
//!
//! Rows of `a` are split over threads (`std::thread::scope`); each output element is computed
//! by one thread in a fixed order, so results do not depend on the thread count.

use super::avx2;
use super::layout::Lay;
use super::qdot::{self, Fast, Order, Unpacked};
use crate::ggml::{self, bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, GgmlType, Q8Flavor};
use crate::graph::DType;

/// The first operand of a product.
pub(crate) enum MatA<'a> {
    /// A weight, as stored in the GGUF: `ne` fixed, rows of whole blocks back to back.
    Weight {
        /// Storage type.
        ty: GgmlType,
        /// All of its bytes.
        data: &'a [u8],
        /// Its shape.
        ne: [usize; 4],
    },
    /// An activation (F32, or F16 / BF16 values held as f32).
    Float {
        /// Its dtype.
        dtype: DType,
        /// Stored values.
        data: &'a [f32],
        /// Layout.
        lay: Lay,
    },
}

/// How to compute.
#[derive(Clone, Copy)]
pub(crate) struct MatOpts {
    /// Reproduce llama.cpp's activation rounding.
    pub round: bool,
    /// Which Q8_0 / Q8_1 quantizer to reproduce.
    pub flavor: Q8Flavor,
    /// Threads to split rows over.
    pub n_threads: usize,
    /// Summation order of the quantized dot products (and of the float ones).
    pub order: Order,
}

/// f32 dot product in a fixed order: 32 lanes, lane `l` summing (multiply, then add: no fused
/// multiply-add) the products of the elements whose index is `l` mod 32 over the whole
/// 32-element chunks; the lanes added in a fixed tree; then the tail in order. The AVX path
/// performs exactly the same operations, four 8-lane registers at a time.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx() {
            // SAFETY: the CPU supports AVX (checked by `has_avx`).
            return unsafe { dot_avx(a, b) };
        }
    }
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
fn has_avx() -> bool {
    static AVX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX.get_or_init(|| std::is_x86_feature_detected!("avx"))
}

/// Adds the 32 lanes: the four 8-lane groups first, then the 8 lanes pairwise.
#[inline(always)]
fn reduce32(acc: &[f32; 32], tail: f32) -> f32 {
    let mut v = [0f32; 8];
    for l in 0..8 {
        v[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
    }
    (v[0] + v[4]) + (v[1] + v[5]) + ((v[2] + v[6]) + (v[3] + v[7])) + tail
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 32];
    let ca = a.chunks_exact(32);
    let cb = b.chunks_exact(32);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..32 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    reduce32(&acc, tail)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn dot_avx(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let n = a.len().min(b.len());
    let chunks = n / 32;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut s0, mut s1, mut s2, mut s3) = (
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
    );
    // SAFETY: every load reads 8 floats at offset < chunks * 32 <= n of both slices.
    unsafe {
        for c in 0..chunks {
            let (x, y) = (pa.add(c * 32), pb.add(c * 32));
            s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y)));
            s1 = _mm256_add_ps(
                s1,
                _mm256_mul_ps(_mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(y.add(8))),
            );
            s2 = _mm256_add_ps(
                s2,
                _mm256_mul_ps(_mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(y.add(16))),
            );
            s3 = _mm256_add_ps(
                s3,
                _mm256_mul_ps(_mm256_loadu_ps(x.add(24)), _mm256_loadu_ps(y.add(24))),
            );
        }
    }
    let mut lanes = [0f32; 32];
    // SAFETY: each store writes 8 floats inside `lanes`.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), s0);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), s1);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(16), s2);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(24), s3);
    }
    let mut tail = 0f32;
    for (x, y) in a[chunks * 32..n].iter().zip(&b[chunks * 32..n]) {
        tail += x * y;
    }
    reduce32(&lanes, tail)
}

enum Kernel {
    /// Dequantize / copy rows of `a` to f32, dot with (possibly rounded) f32 rows of `b`.
    Float,
    /// `vec_dot` of weight rows with activation rows in the companion format: ggml's
    /// reference one ([`ggml::vec_dot`]), or in [`Order::Avx2`] what llama.cpp's x86
    /// `mul_mat` computes for this number of columns ([`ggml::vec_dot_avx2_mul_mat`]).
    Quant {
        act: Vec<u8>,
        act_row: usize,
        order: Order,
    },
    /// The same numbers through unpacked int8 rows ([`qdot`]).
    Fast {
        kind: Fast,
        act: Unpacked,
        order: Order,
    },
    /// A weight llama.cpp's x86 build repacks ([`ggml::repacked_by_llama_cpp`]): its
    /// interleaved gemm kernel for the first `n_rows - n_rows % 4` columns, gemv for the
    /// rest ([`ggml::RepackedRow`]), activations quantized per column for that kernel.
    Repack { act: Vec<u8>, act_row: usize },
}

/// Whether `a` is a weight llama.cpp's x86 AVX2 build repacks, in the order that follows it.
fn repacked(a: &MatA<'_>, t: GgmlType, order: Order) -> bool {
    let supported = matches!(
        t,
        GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::IQ4_NL | GgmlType::MXFP4
    );
    match a {
        MatA::Weight { ne, .. } => {
            supported
                && order == Order::Avx2
                && ggml::repacked_by_llama_cpp(t, ne.map(|n| n as u64))
        }
        MatA::Float { .. } => false,
    }
}

/// [`Kernel::Repack`]: each of the `n_rows` columns of `rows` quantized for its kernel.
fn repack_kernel(t: GgmlType, rows: &[f32], k: usize, n_rows: usize) -> Result<Kernel, String> {
    let mut act = Vec::new();
    for (n, src) in rows.chunks_exact(k.max(1)).take(n_rows).enumerate() {
        let kernel = ggml::RepackKernel::for_column(n, n_rows);
        let (_, a) =
            ggml::repack_quantize_activations(t, src, kernel).map_err(|e| e.to_string())?;
        act.extend_from_slice(&a);
    }
    let act_row = act.len() / n_rows.max(1);
    Ok(Kernel::Repack { act, act_row })
}

/// Computes `out = a · bᵀ` per slice; `b` and `out` are stored as [`Lay`] says.
pub(crate) fn mul_mat(
    a: &MatA<'_>,
    b: &[f32],
    lb: &Lay,
    lo: &Lay,
    opts: MatOpts,
) -> Result<Vec<f32>, String> {
    let (a_ne, a_dtype) = match a {
        MatA::Weight { ty, ne, .. } => (*ne, DType::from_ggml(*ty).unwrap_or(DType::F32)),
        MatA::Float { dtype, lay, .. } => (lay.ne, *dtype),
    };
    let (k, m_rows, n_rows) = (lb.ne[0], a_ne[1], lb.ne[1]);
    let mut out = vec![0f32; lo.alloc];
    let r2 = lb.ne[2] / a_ne[2].max(1);
    let r3 = lb.ne[3] / a_ne[3].max(1);
    for i3 in 0..lb.ne[3] {
        for i2 in 0..lb.ne[2] {
            let (a2, a3) = (i2 / r2.max(1), i3 / r3.max(1));
            // The b rows of this slice, rounded as llama.cpp converts them.
            let mut rows: Vec<f32> = Vec::with_capacity(n_rows * k);
            for n in 0..n_rows {
                let o = lb.off([0, n, i2, i3]);
                rows.extend_from_slice(&b[o..o + k]);
            }
            let kernel = match (opts.round, a_dtype) {
                (true, DType::F16) => {
                    rows.iter_mut()
                        .for_each(|v| *v = f16_to_f32(f32_to_f16(*v)));
                    Kernel::Float
                }
                (true, DType::BF16) => {
                    rows.iter_mut()
                        .for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
                    Kernel::Float
                }
                (true, DType::Block(t)) if repacked(a, t, opts.order) => {
                    repack_kernel(t, &rows, k, n_rows)?
                }
                (true, DType::Block(t)) => {
                    let vdt =
                        ggml::vec_dot_type(t).ok_or_else(|| format!("no dot product for {t}"))?;
                    let act_row = vdt
                        .row_size(k as u64)
                        .ok_or_else(|| format!("{k} values are not whole {vdt} blocks"))?
                        as usize;
                    let mut act = vec![0u8; act_row * n_rows];
                    for (src, dst) in rows.chunks_exact(k).zip(act.chunks_exact_mut(act_row)) {
                        ggml::quantize(vdt, src, dst, opts.flavor).map_err(|e| e.to_string())?;
                    }
                    match (Fast::of(t), matches!(a, MatA::Weight { .. })) {
                        (Some(kind), true) => {
                            let mut u = Unpacked::default();
                            qdot::unpack_act(&act, vdt == GgmlType::Q8_1, &mut u);
                            Kernel::Fast {
                                kind,
                                act: u,
                                order: opts.order,
                            }
                        }
                        _ => Kernel::Quant {
                            act,
                            act_row,
                            order: opts.order,
                        },
                    }
                }
                _ => Kernel::Float,
            };
            let fdot = float_dot(opts.order, a_dtype, n_rows);
            let sc = Slice {
                a,
                a2,
                a3,
                rows: &rows,
                k,
                n_rows,
                kernel: &kernel,
                fdot,
            };
            let slice = compute_slice(&sc, m_rows, opts.n_threads)?;
            for n in 0..n_rows {
                let o = lo.off([0, n, i2, i3]);
                for m in 0..m_rows {
                    out[o + m] = slice[m * n_rows + n];
                }
            }
        }
    }
    Ok(out)
}

/// One broadcast slice of a product.
struct Slice<'s, 'a> {
    a: &'s MatA<'a>,
    a2: usize,
    a3: usize,
    rows: &'s [f32],
    k: usize,
    n_rows: usize,
    kernel: &'s Kernel,
    /// The dot product of the float kernel.
    fdot: fn(&[f32], &[f32]) -> f32,
}

/// The dot product llama.cpp's CPU `mul_mat` uses for a float operand of type `dtype` and
/// `n_rows` columns (see [`super::avx2`]): llamafile's tinyBLAS from two columns on, ggml's
/// `vec_dot` of the type for one; [`dot`] when the order is the reference one.
fn float_dot(order: Order, dtype: DType, n_rows: usize) -> fn(&[f32], &[f32]) -> f32 {
    match (order, dtype, n_rows) {
        (Order::Avx2, DType::F32 | DType::F16 | DType::BF16, n) if n >= 2 => avx2::dot_tinyblas,
        (Order::Avx2, DType::F32, _) => avx2::dot_f32,
        (Order::Avx2, DType::F16, _) => avx2::dot_f16,
        (Order::Avx2, DType::BF16, _) => avx2::dot_bf16,
        _ => dot,
    }
}

/// One slice: returns `res[m * n_rows + n]`, rows of `a` split over threads.
fn compute_slice(sc: &Slice<'_, '_>, m_rows: usize, n_threads: usize) -> Result<Vec<f32>, String> {
    let work = m_rows * sc.n_rows * sc.k;
    let n_threads = if work < 1 << 17 {
        1
    } else {
        n_threads.clamp(1, m_rows.max(1))
    };
    if n_threads == 1 {
        return run_rows(sc, 0, m_rows);
    }
    let chunk = m_rows.div_ceil(n_threads);
    let parts: Vec<Result<Vec<f32>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n_threads)
            .map(|t| {
                let (lo, hi) = (t * chunk, ((t + 1) * chunk).min(m_rows));
                s.spawn(move || run_rows(sc, lo, hi.max(lo)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("matmul thread panicked".into()))
            })
            .collect()
    });
    let mut res = Vec::with_capacity(m_rows * sc.n_rows);
    for p in parts {
        res.extend_from_slice(&p?);
    }
    Ok(res)
}

/// Rows `lo..hi` of `a` against every row of `b`, with the widest vector unit available
/// (the arithmetic is the same; only the instructions differ).
fn run_rows(sc: &Slice<'_, '_>, lo: usize, hi: usize) -> Result<Vec<f32>, String> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { run_rows_avx2(sc, lo, hi) };
        }
    }
    run_rows_body(sc, lo, hi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_rows_avx2(sc: &Slice<'_, '_>, lo: usize, hi: usize) -> Result<Vec<f32>, String> {
    run_rows_body(sc, lo, hi)
}

#[inline(always)]
fn run_rows_body(sc: &Slice<'_, '_>, lo: usize, hi: usize) -> Result<Vec<f32>, String> {
    let (k, n_rows) = (sc.k, sc.n_rows);
    let mut res = vec![0f32; (hi - lo) * n_rows];
    let mut buf = vec![0f32; k];
    let mut unpacked = Unpacked::default();
    let mut repacked = ggml::RepackedRow::default();
    for m in lo..hi {
        let dst = &mut res[(m - lo) * n_rows..(m - lo + 1) * n_rows];
        match (sc.kernel, sc.a) {
            (Kernel::Fast { kind, act, order }, MatA::Weight { ty, data, ne }) => {
                let w = weight_row(*ty, data, ne, m, sc.a2, sc.a3, k)?;
                qdot::unpack_weight(*kind, w, &mut unpacked);
                for (n, o) in dst.iter_mut().enumerate() {
                    *o = qdot::dot(*kind, &unpacked, act, n, *order);
                }
            }
            (
                Kernel::Quant {
                    act,
                    act_row,
                    order,
                },
                MatA::Weight { ty, data, ne },
            ) => {
                let w = weight_row(*ty, data, ne, m, sc.a2, sc.a3, k)?;
                for (n, o) in dst.iter_mut().enumerate() {
                    let a = &act[n * act_row..(n + 1) * act_row];
                    *o = match order {
                        Order::Reference => ggml::vec_dot(*ty, w, a),
                        Order::Avx2 => ggml::vec_dot_avx2_mul_mat(*ty, w, a, n_rows),
                    }
                    .map_err(|e| e.to_string())?;
                }
            }
            (Kernel::Repack { act, act_row }, MatA::Weight { ty, data, ne }) => {
                let w = weight_row(*ty, data, ne, m, sc.a2, sc.a3, k)?;
                repacked.load(*ty, w).map_err(|e| e.to_string())?;
                for (n, o) in dst.iter_mut().enumerate() {
                    let a = &act[n * act_row..(n + 1) * act_row];
                    let kernel = ggml::RepackKernel::for_column(n, n_rows);
                    *o = repacked.dot(a, kernel).map_err(|e| e.to_string())?;
                }
            }
            _ => {
                a_row_f32(sc.a, m, sc.a2, sc.a3, &mut buf, &mut unpacked)?;
                for (n, o) in dst.iter_mut().enumerate() {
                    *o = (sc.fdot)(&buf, &sc.rows[n * k..(n + 1) * k]);
                }
            }
        }
    }
    Ok(res)
}

/// The bytes of row `m` of slice `(a2, a3)` of a weight.
#[inline(always)]
fn weight_row<'d>(
    ty: GgmlType,
    data: &'d [u8],
    ne: &[usize; 4],
    m: usize,
    a2: usize,
    a3: usize,
    k: usize,
) -> Result<&'d [u8], String> {
    let rb = ty.row_size(k as u64).unwrap_or(0) as usize;
    let start = (m + ne[1] * (a2 + ne[2] * a3)) * rb;
    data.get(start..start + rb)
        .ok_or_else(|| "weight row out of range".to_string())
}

/// Row `m` of slice `(a2, a3)` of `a` as f32.
#[inline(always)]
fn a_row_f32(
    a: &MatA<'_>,
    m: usize,
    a2: usize,
    a3: usize,
    buf: &mut [f32],
    unpacked: &mut Unpacked,
) -> Result<(), String> {
    match a {
        MatA::Weight { ty, data, ne } => {
            let w = weight_row(*ty, data, ne, m, a2, a3, buf.len())?;
            match Fast::of(*ty) {
                Some(kind) => {
                    qdot::unpack_weight(kind, w, unpacked);
                    qdot::dequant(kind, unpacked, buf);
                    Ok(())
                }
                None => ggml::dequantize(*ty, w, buf).map_err(|e| e.to_string()),
            }
        }
        MatA::Float { data, lay, .. } => {
            let o = lay.off([0, m, a2, a3]);
            buf.copy_from_slice(&data[o..o + buf.len()]);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Shape;

    #[test]
    fn small_product_matches_definition() {
        // a {3, 2}: rows [1,2,3], [4,5,6]; b {3, 2}: rows [1,0,1], [0,1,0].
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let la = Lay::of(&Shape::new(&[3, 2]), 0);
        let b = [1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0];
        let lb = Lay::of(&Shape::new(&[3, 2]), 0);
        let lo = Lay::of(&Shape::new(&[2, 2]), 0);
        let opts = MatOpts {
            round: false,
            flavor: Q8Flavor::X86,
            n_threads: 2,
            order: Order::Reference,
        };
        let am = MatA::Float {
            dtype: DType::F32,
            data: &a,
            lay: la,
        };
        let out = mul_mat(&am, &b, &lb, &lo, opts).unwrap();
        assert_eq!(out, vec![4.0, 10.0, 2.0, 5.0]);
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let want: f32 = a.iter().map(|x| x * x).sum();
        assert_eq!(dot(&a, &a), want);
    }

    #[test]
    fn dot_paths_agree_bit_for_bit() {
        let a: Vec<f32> = (0..587)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let b: Vec<f32> = (0..587)
            .map(|i| ((i * 104729) % 991) as f32 / 89.0 - 5.5)
            .collect();
        for n in [0, 5, 8, 64, 587] {
            assert_eq!(
                dot(&a[..n], &b[..n]).to_bits(),
                dot_portable(&a[..n], &b[..n]).to_bits()
            );
        }
    }
}
