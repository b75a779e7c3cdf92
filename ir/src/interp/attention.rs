//! The KV cache write and attention over it, as llama.cpp computes them without flash
//! attention (`build_attn_mha` in llama-graph.cpp: `kq = mul_mat(k, q)`, optional soft-cap,
//! `soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`).
//!
//! With `f16` rounding on, Q is rounded to f16 before the scores (ggml converts `src1` to the
//! cache's F16 for the product) and the probabilities are rounded to f16 before the product
//! with V, as llama.cpp's CPU backend does; K and V are whatever the cache holds.

use super::elementwise::soft_max_in_place;
use super::layout::Lay;
use super::matmul::dot;
use crate::ggml::{f16_to_f32, f32_to_f16};
use crate::graph::{AttnParams, DType};

#[inline]
fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Writes row `t` of `cur {n_embd_gqa, n_tokens}` into row `pos[t]` of `cache`, rounded to
/// the cache's dtype.
pub(crate) fn kv_store(
    cache: &mut [f32],
    cache_lay: &Lay,
    cache_dtype: DType,
    cur: &[f32],
    cur_lay: &Lay,
    pos: &[i32],
) -> Result<(), String> {
    let n = cur_lay.ne[0];
    for (t, &p) in pos.iter().enumerate() {
        if p < 0 || p as usize >= cache_lay.ne[1] {
            return Err(format!(
                "position {p} is outside the KV cache of {} cells",
                cache_lay.ne[1]
            ));
        }
        let dst = cache_lay.off([0, p as usize, 0, 0]);
        let src = cur_lay.off([0, t, 0, 0]);
        for i in 0..n {
            let v = cur[src + i];
            cache[dst + i] = if cache_dtype == DType::F16 { round_f16(v) } else { v };
        }
    }
    Ok(())
}

/// The sources of one attention evaluation.
pub(crate) struct AttnArgs<'a> {
    pub q: &'a [f32],
    pub lq: Lay,
    pub k: &'a [f32],
    pub lk: Lay,
    pub v: &'a [f32],
    pub lv: Lay,
    pub pos: &'a [i32],
    pub out: Lay,
}

/// Attention for every token and head; see the module doc.
pub(crate) fn attention(a: &AttnArgs<'_>, p: &AttnParams, f16: bool, n_threads: usize) -> Vec<f32> {
    let n_tokens = a.lq.ne[2];
    let n_threads = if n_tokens * a.lk.ne[2] < 4096 { 1 } else { n_threads.clamp(1, n_tokens) };
    let chunk = n_tokens.div_ceil(n_threads.max(1));
    let run = |lo: usize, hi: usize| -> Vec<f32> {
        let row = a.out.ne[0] * a.out.ne[1];
        let mut res = vec![0f32; (hi - lo) * row];
        for t in lo..hi {
            for h in 0..a.lq.ne[1] {
                let o = (t - lo) * row + h * a.out.ne[0];
                head(a, p, f16, t, h, &mut res[o..o + a.out.ne[0]]);
            }
        }
        res
    };
    let parts: Vec<Vec<f32>> = if n_threads <= 1 {
        vec![run(0, n_tokens)]
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n_threads)
                .map(|i| {
                    let (lo, hi) = (i * chunk, ((i + 1) * chunk).min(n_tokens));
                    let run = &run;
                    s.spawn(move || run(lo, hi.max(lo)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
        })
    };
    let mut out = vec![0f32; a.out.alloc];
    let row = a.out.ne[0] * a.out.ne[1];
    let mut t = 0;
    for part in parts {
        for r in part.chunks_exact(row) {
            let o = a.out.off([0, 0, t, 0]);
            out[o..o + row].copy_from_slice(r);
            t += 1;
        }
    }
    out
}

/// One query head of one token: writes its `d_v` outputs to `dst`.
fn head(a: &AttnArgs<'_>, p: &AttnParams, f16: bool, t: usize, h: usize, dst: &mut [f32]) {
    let (d_k, n_kv) = (a.lq.ne[0], a.lk.ne[2]);
    let group = a.lq.ne[1] / a.lk.ne[1];
    let kvh = h / group;
    let pos = a.pos[t] as i64;
    // Visible key cells [lo, hi).
    let hi = if p.causal { (pos + 1).clamp(0, n_kv as i64) } else { n_kv as i64 };
    let lo = match p.window {
        Some(w) => (pos - w as i64 + 1).clamp(0, hi),
        None => 0,
    };
    let (lo, hi) = (lo as usize, hi as usize);
    if lo >= hi {
        return;
    }
    let qo = a.lq.off([0, h, t, 0]);
    let mut q: Vec<f32> = a.q[qo..qo + d_k].to_vec();
    if f16 {
        q.iter_mut().for_each(|x| *x = round_f16(*x));
    }
    let mut w = Vec::with_capacity(hi - lo);
    let mut max = f32::NEG_INFINITY;
    for j in lo..hi {
        let ko = a.lk.off([0, kvh, j, 0]);
        let mut s = dot(&q, &a.k[ko..ko + d_k]);
        if let Some(cap) = p.softcap {
            s = (s * (1.0 / cap)).tanh() * cap;
        }
        s *= p.kq_scale;
        max = max.max(s);
        w.push(s);
    }
    soft_max_in_place(&mut w, max);
    dst.iter_mut().for_each(|x| *x = 0.0);
    for (j, &pj) in (lo..hi).zip(&w) {
        let pj = if f16 { round_f16(pj) } else { pj };
        let vo = a.lv.off([0, kvh, j, 0]);
        let d_v = dst.len();
        for (o, &vv) in dst.iter_mut().zip(&a.v[vo..vo + d_v]) {
            *o += pj * vv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Shape;

    #[test]
    fn single_visible_key_returns_its_value() {
        // One token at position 0: only cell 0 is visible, so the output is v[0].
        let lq = Lay::of(&Shape::new(&[2, 2, 1]), 0);
        let lk = Lay::of(&Shape::new(&[2, 1, 4]).with_kv_dim(2), 3);
        let q = [1.0, 2.0, -1.0, 0.5];
        let k = [0.3, 0.1, 9.0, 9.0, 9.0, 9.0, 0.0, 0.0];
        let v = [5.0, -6.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let out = Lay::of(&Shape::new(&[2, 2, 1]), 0);
        let args = AttnArgs { q: &q, lq, k: &k, lk, v: &v, lv: lk, pos: &[0], out };
        let p = AttnParams { kq_scale: 0.5, softcap: None, window: None, causal: true };
        let r = attention(&args, &p, false, 1);
        assert_eq!(r, vec![5.0, -6.0, 5.0, -6.0]);
    }

    #[test]
    fn window_hides_old_keys() {
        // Position 2 with window 1 sees only cell 2.
        let lq = Lay::of(&Shape::new(&[1, 1, 1]), 0);
        let lk = Lay::of(&Shape::new(&[1, 1, 3]).with_kv_dim(2), 3);
        let out = Lay::of(&Shape::new(&[1, 1, 1]), 0);
        let args = AttnArgs { q: &[1.0], lq, k: &[1.0, 2.0, 3.0], lk, v: &[10.0, 20.0, 30.0], lv: lk, pos: &[2], out };
        let p = AttnParams { kq_scale: 1.0, softcap: None, window: Some(1), causal: true };
        assert_eq!(attention(&args, &p, false, 1), vec![30.0]);
        let p = AttnParams { window: None, ..p };
        let all = attention(&args, &p, false, 1)[0];
        assert!(all > 20.0 && all < 30.0);
    }
}
