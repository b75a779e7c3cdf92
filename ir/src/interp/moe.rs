//! The mixture-of-experts ops, as llama.cpp's `build_moe_ffn` computes them on the CPU:
//! the top-k selection of experts, their routing weights, the products with the selected
//! experts' matrices and the weighted sum of the experts' outputs.
//!
//! ```text
//! ids      = argsort_top_k(probs, k)                 I32 {k, T}
//! weights  = moe_weights(probs, ids)                 {k, T}    gathered, normalized, scaled
//! up, gate = mul_mat_id(up_exps, x, ids), …          {n_ff, k, T}
//! down     = mul_mat_id(down_exps, swiglu(gate, up), ids)   {n_embd, k, T}
//! out      = moe_sum(down, weights)                  {n_embd, T}
//! ```

use super::layout::Lay;
use super::matmul::{mul_mat, MatA, MatOpts};
use crate::ggml::GgmlType;

/// `argsort_top_k`: the indices of the `k` largest values of each row of `x` (layout
/// `lx`), largest first, ties in index order; `lo` is the result's layout.
pub(crate) fn top_k(x: &[f32], lx: &Lay, k: usize, lo: &Lay) -> Vec<i32> {
    let mut out = vec![0i32; lo.alloc];
    let n = lx.ne[0];
    let mut idx: Vec<usize> = Vec::with_capacity(n);
    for i3 in 0..lx.ne[3] {
        for i2 in 0..lx.ne[2] {
            for i1 in 0..lx.ne[1] {
                let row = &x[lx.off([0, i1, i2, i3])..][..n];
                idx.clear();
                idx.extend(0..n);
                // Stable: equal values keep their index order.
                idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                let dst = &mut out[lo.off([0, i1, i2, i3])..][..k];
                for (d, &i) in dst.iter_mut().zip(&idx) {
                    *d = i as i32;
                }
            }
        }
    }
    out
}

/// The smallest sum llama.cpp divides the weights by: 2⁻¹⁴ = 6.103515625e-5, the smallest
/// normal F16.
pub(crate) const WEIGHTS_SUM_MIN: f32 = 1.0 / 16384.0;

/// Normalizes and scales one token's gathered weights in place, as `build_moe_ffn` does
/// (`ggml_sum_rows` in f64, `ggml_clamp`, `ggml_div`, `ggml_scale`).
pub fn moe_weights_row(w: &mut [f32], norm: bool, scale: f32) {
    if norm {
        let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
        let sum = sum.clamp(WEIGHTS_SUM_MIN, f32::INFINITY);
        w.iter_mut().for_each(|v| *v /= sum);
    }
    if scale != 0.0 && scale != 1.0 {
        w.iter_mut().for_each(|v| *v *= scale);
    }
}

/// `moe_weights`: `probs {n_expert, T}`, `ids {k, T}` → `{k, T}`.
pub(crate) fn moe_weights(
    probs: &[f32],
    lp: &Lay,
    ids: &[i32],
    li: &Lay,
    norm: bool,
    scale: f32,
    lo: &Lay,
) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; lo.alloc];
    let k = li.ne[0];
    let mut w = vec![0f32; k];
    for t in 0..li.ne[1] {
        for (i, wi) in w.iter_mut().enumerate() {
            let e = ids[li.off([i, t, 0, 0])];
            if e < 0 || e as usize >= lp.ne[0] {
                return Err(format!("expert id {e} is outside 0..{}", lp.ne[0]));
            }
            *wi = probs[lp.off([e as usize, t, 0, 0])];
        }
        moe_weights_row(&mut w, norm, scale);
        out[lo.off([0, t, 0, 0])..][..k].copy_from_slice(&w);
    }
    Ok(out)
}

/// The experts' matrices of a `mul_mat_id`.
pub(crate) enum Experts<'a> {
    /// A weight `{K, M, n_expert}` as stored.
    Weight {
        /// Storage type.
        ty: GgmlType,
        /// All of its bytes.
        data: &'a [u8],
        /// Its shape.
        ne: [usize; 4],
    },
    /// F32 values `{K, M, n_expert}` (layout `lay`).
    Float {
        /// Values.
        data: &'a [f32],
        /// Layout.
        lay: Lay,
    },
}

/// `mul_mat_id`: `as {K, M, n_expert}`, `b {K, B1, T}` (layout `lb`), `ids {k, T}`
/// (layout `li`) → `{M, k, T}` (layout `lo`), as ggml-cpu's `ggml_compute_forward_mul_mat_id`
/// computes it: the columns are grouped by expert; an expert's columns are multiplied one at
/// a time (`vec_dot`: never tinyBLAS; the repacked gemv for the weights llama.cpp repacks,
/// [`crate::ggml::repacked_by_llama_cpp`]), or all together where ggml takes its tiled
/// kernel for that many (`ggml_compute_forward_mul_mat_id_tiled`: K-quants and the i-quants
/// of [`crate::ggml::x86_mul_mat_kernel`] from 8 columns, when not repacked).
pub(crate) fn mul_mat_id(
    experts: &Experts<'_>,
    b: &[f32],
    lb: &Lay,
    ids: &[i32],
    li: &Lay,
    lo: &Lay,
    opts: MatOpts,
) -> Result<Vec<f32>, String> {
    let (k_in, n_used, n_tok) = (lb.ne[0], li.ne[0], li.ne[1]);
    let ne = match experts {
        Experts::Weight { ne, .. } => *ne,
        Experts::Float { lay, .. } => lay.ne,
    };
    let (m, n_expert) = (ne[1], ne[2]);
    let opts = MatOpts {
        n_threads: 1,
        ..opts
    };
    let mut out = vec![0f32; lo.alloc];
    // The (slot, token) pairs routed to each expert, in ggml's order (token-major).
    let mut rows: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_expert];
    for t in 0..n_tok {
        for i in 0..n_used {
            let e = ids[li.off([i, t, 0, 0])];
            if e < 0 || e as usize >= n_expert {
                return Err(format!("expert id {e} is outside 0..{n_expert}"));
            }
            rows[e as usize].push((i, t));
        }
    }
    for (e, pairs) in rows.iter().enumerate() {
        if pairs.is_empty() {
            continue;
        }
        // One product of all the expert's columns where llama.cpp takes its tiled kernel
        // for that many (K-quants from 8), else one column at a time (`vec_dot`).
        // Weights llama.cpp repacks take its gemv one column at a time whatever the count.
        let tiled = matches!(experts, Experts::Weight { ty, .. }
            if crate::ggml::x86_mul_mat_kernel(*ty, pairs.len()) == crate::ggml::X86MulMatKernel::Tiled
                && !crate::ggml::repacked_by_llama_cpp(*ty, [k_in as u64, m as u64, 1, 1]));
        let groups: Vec<&[(usize, usize)]> = if tiled {
            vec![pairs.as_slice()]
        } else {
            pairs.chunks(1).collect()
        };
        for g in groups {
            let n = g.len();
            let mut cols = Vec::with_capacity(n * k_in);
            for &(i, t) in g {
                let o = lb.off([0, i % lb.ne[1], t, 0]);
                cols.extend_from_slice(&b[o..o + k_in]);
            }
            let y = expert_product(experts, e, &cols, n, k_in, m, opts)?;
            for (c, &(i, t)) in g.iter().enumerate() {
                out[lo.off([0, i, t, 0])..][..m].copy_from_slice(&y[c * m..(c + 1) * m]);
            }
        }
    }
    Ok(out)
}

/// The product of expert `e`'s `{K, M}` matrix with `n` columns `cols` (`{K, n}`): `{M, n}`.
fn expert_product(
    experts: &Experts<'_>,
    e: usize,
    cols: &[f32],
    n: usize,
    k_in: usize,
    m: usize,
    opts: MatOpts,
) -> Result<Vec<f32>, String> {
    let lay = |a: usize, b: usize| Lay {
        ne: [a, b, 1, 1],
        st: [1, a, a * b, a * b],
        alloc: a * b,
    };
    let (lb, lo) = (lay(k_in, n), lay(m, n));
    match experts {
        Experts::Weight { ty, data, .. } => {
            let bytes = ty
                .row_size(k_in as u64)
                .ok_or("expert rows are not whole blocks")? as usize
                * m;
            let slice = data
                .get(e * bytes..(e + 1) * bytes)
                .ok_or("expert data out of range")?;
            let a = MatA::Weight {
                ty: *ty,
                data: slice,
                ne: [k_in, m, 1, 1],
            };
            mul_mat(&a, cols, &lb, &lo, opts)
        }
        Experts::Float { data, lay: la } => {
            let mut rows = Vec::with_capacity(k_in * m);
            for r in 0..m {
                let o = la.off([0, r, e, 0]);
                rows.extend_from_slice(&data[o..o + k_in]);
            }
            let a = MatA::Float {
                dtype: crate::graph::DType::F32,
                data: &rows,
                lay: lay(k_in, m),
            };
            mul_mat(&a, cols, &lb, &lo, opts)
        }
    }
}

/// `moe_sum`: `experts {E, k, T}`, `weights {k, T}` → `{E, T}`: per token
/// `((x0 w0 + x1 w1) + x2 w2) + …`, each product rounded to f32 before the add.
pub(crate) fn moe_sum(x: &[f32], lx: &Lay, w: &[f32], lw: &Lay, lo: &Lay) -> Vec<f32> {
    let mut out = vec![0f32; lo.alloc];
    let (e, k) = (lx.ne[0], lx.ne[1]);
    for t in 0..lx.ne[2] {
        let dst = &mut out[lo.off([0, t, 0, 0])..][..e];
        for i in 0..k {
            let wi = w[lw.off([i, t, 0, 0])];
            let src = &x[lx.off([0, i, t, 0])..][..e];
            if i == 0 {
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s * wi);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s * wi);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{parse_graph, DType, Graph, Input, Shape};

    fn lay(ne: &[usize]) -> Lay {
        let s: Vec<u64> = ne.iter().map(|&n| n as u64).collect();
        Lay::of(&Shape::new(&s), 0)
    }

    #[test]
    fn top_k_is_descending_with_ties_in_index_order() {
        let x = [0.1, 0.5, 0.3, 0.5, -1.0, 0.2, 0.2, 0.9];
        let got = top_k(&x, &lay(&[4, 2]), 2, &lay(&[2, 2]));
        assert_eq!(got, vec![1, 3, 3, 1]);
    }

    #[test]
    fn weights_are_gathered_normalized_clamped_and_scaled() {
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let ids = [3, 1];
        let w = moe_weights(
            &probs,
            &lay(&[4, 1]),
            &ids,
            &lay(&[2, 1]),
            false,
            0.0,
            &lay(&[2, 1]),
        );
        assert_eq!(w.expect("in range"), vec![0.4, 0.2]);
        let w = moe_weights(
            &probs,
            &lay(&[4, 1]),
            &ids,
            &lay(&[2, 1]),
            true,
            2.0,
            &lay(&[2, 1]),
        );
        let sum = (0.4f64 + 0.2f64) as f32;
        assert_eq!(w.expect("in range"), vec![0.4 / sum * 2.0, 0.2 / sum * 2.0]);
        // A sum below the smallest normal f16 is clamped to it.
        let mut tiny = [1e-9f32, 1e-9];
        moe_weights_row(&mut tiny, true, 1.0);
        assert_eq!(tiny, [1e-9 / WEIGHTS_SUM_MIN; 2]);
        let bad = moe_weights(
            &probs,
            &lay(&[4, 1]),
            &[4, 0],
            &lay(&[2, 1]),
            true,
            0.0,
            &lay(&[2, 1]),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn sum_adds_rounded_products_in_slot_order() {
        // {E = 1, k = 3, T = 1}: ((1e8 * 1 + 1 * 1) + -1e8 * 1) = 0 in f32, not 1.
        let x = [1e8f32, 1.0, -1e8];
        let w = [1.0f32, 1.0, 1.0];
        let got = moe_sum(&x, &lay(&[1, 3, 1]), &w, &lay(&[3, 1]), &lay(&[1, 1]));
        assert_eq!(got, vec![0.0]);
    }

    #[test]
    fn mul_mat_id_reads_the_selected_experts() {
        // Experts {K = 2, M = 2, n_expert = 3} in F32: expert e is e + 1 times the identity.
        let mut data = Vec::new();
        for e in 0..3 {
            let d = (e + 1) as f32;
            for v in [d, 0.0, 0.0, d] {
                data.extend_from_slice(&f32::to_le_bytes(v));
            }
        }
        let ex = Experts::Weight {
            ty: GgmlType::F32,
            data: &data,
            ne: [2, 2, 3, 1],
        };
        // b {K = 2, 1, T = 2}, ids {k = 2, T = 2}.
        let b = [1.0f32, 2.0, 3.0, 4.0];
        let ids = [2, 0, 1, 1];
        let opts = MatOpts {
            round: true,
            flavor: crate::ggml::Q8Flavor::X86,
            n_threads: 1,
            order: super::super::qdot::Order::Avx2,
        };
        let got = mul_mat_id(
            &ex,
            &b,
            &lay(&[2, 1, 2]),
            &ids,
            &lay(&[2, 2]),
            &lay(&[2, 2, 2]),
            opts,
        );
        assert_eq!(
            got.expect("in range"),
            vec![3.0, 6.0, 1.0, 2.0, 6.0, 8.0, 6.0, 8.0]
        );
    }

    #[test]
    fn ops_print_and_parse_back() {
        let mut g = Graph::new();
        let x = g.input("x", Input::Data, DType::F32, Shape::new(&[8, 3]));
        let ids = g.argsort_top_k("ids", x, 2).expect("top-k");
        let w = g.moe_weights("w", x, ids, true, 2.5).expect("weights");
        let e = g.weight("exps", DType::F32, Shape::new(&[8, 4, 8]));
        let b = g.reshape("b", x, &[8, 1, 3]).expect("reshape");
        let y = g.mul_mat_id("y", e, b, ids).expect("mul_mat_id");
        assert_eq!(g.tensor(y).shape, Shape::new(&[4, 2, 3]));
        let d = g.weight("down", DType::F32, Shape::new(&[4, 8, 8]));
        let z = g.mul_mat_id("z", d, y, ids).expect("mul_mat_id of k rows");
        let out = g.moe_sum("out", z, w).expect("sum");
        assert_eq!(g.tensor(out).shape, Shape::new(&[8, 3]));
        g.mark_output(out);
        let text = g.to_string();
        assert_eq!(parse_graph(&text).expect("parses").to_string(), text);
        // Shape rules: k above the row, a b that is neither 1 nor k rows per token.
        assert!(g.argsort_top_k("bad", x, 9).is_err());
        let b3 = g.reshape("b3", x, &[4, 2, 3]).expect("reshape");
        assert!(g.mul_mat_id("bad2", e, b3, ids).is_err());
    }
}
