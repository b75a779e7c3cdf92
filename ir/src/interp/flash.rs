//! llama.cpp's CPU flash attention (ggml-cpu ops.cpp, `ggml_compute_forward_flash_attn_ext_f16`),
//! which llama.cpp uses by default on the CPU (`flash_attn` auto). Three kernels, chosen as
//! ggml chooses them when [`AttnCfg::avx2`] asks for llama.cpp's arithmetic:
//!
//! - the reference kernel (`_one_chunk`): Q rounded to f16; per visible cell in order the
//!   score `q·k` (`ggml_vec_dot_f16`), times the scale; an online softmax with running maximum
//!   `M` and sum `S`; the weighted sum of V in an f16 accumulator, each update rounded to f16;
//! - the tiled kernel (`_tiled`) for ubatches of [`Q_TILE`] tokens or more: f32 Q, tiles of
//!   [`KV_TILE`] cells, scores and weighted sums as fused multiply-add chains (`simd_gemm`),
//!   the tile's exponentials from `ggml_vec_soft_max_f32`, an f32 accumulator;
//! - the split-KV decode (one token, at least [`SPLIT_MIN`] cells): the padded cache cut into
//!   one chunk per llama.cpp thread, each chunk by the reference kernel, the partial results
//!   merged in chunk order (`ggml_flash_attn_ext_reduce_partials`).
//!
//! The KV length ggml sees is llama.cpp's padded one: a multiple of [`KV_PAD`] cells.
//! llama.cpp is built by GCC, which fuses `a * b + c` in scalar code into one fused
//! multiply-add (its default `-ffp-contract=fast`); the running sum and the merge do so here.

use super::attention::{requantize_q8_0, round_f16, AttnArgs, AttnCfg};
use super::avx2;
use super::matmul::dot;
use crate::ggml::{self, GgmlType};
use crate::graph::{AttnParams, DType};

/// Rows of the tiled kernel's Q tile (`GGML_FA_TILE_Q`): ubatches this large take it.
pub(crate) const Q_TILE: usize = 64;
/// Cells of the tiled kernel's KV tile (`GGML_FA_TILE_KV`).
pub(crate) const KV_TILE: usize = 64;
/// llama.cpp pads the KV length to a multiple of this with flash attention.
pub(crate) const KV_PAD: usize = 256;
/// Padded KV length from which a one-token ubatch takes the split-KV path.
pub(crate) const SPLIT_MIN: usize = 512;

/// The state of an online softmax over some cells: maximum, sum, weighted sum of V.
struct Partial {
    m: f32,
    s: f32,
    acc: Vec<f32>,
}

/// The scale applied to `q·k` and the soft-cap (0: none), as ggml folds them.
fn scale_cap(p: &AttnParams) -> (f32, f32) {
    match p.softcap {
        Some(c) => (p.kq_scale / c, c),
        None => (p.kq_scale, 0.0),
    }
}

/// One query head of token `t`; see the module doc.
#[inline(always)]
pub(crate) fn head(
    a: &AttnArgs<'_>,
    p: &AttnParams,
    cfg: &AttnCfg,
    t: usize,
    h: usize,
    dst: &mut [f32],
) {
    let n_tokens = a.lq.ne[2];
    // A ring's KV length is at most its cells (llama.cpp's `get_n_kv` of the SWA cache).
    let n_kv = a.lk.ne[2].min(cfg.n_ctx.max(1));
    let nek1 = n_kv
        .div_ceil(KV_PAD)
        .max(1)
        .saturating_mul(KV_PAD)
        .min(cfg.n_ctx.max(n_kv));
    if cfg.avx2 && a.plain_kv() && n_tokens >= Q_TILE && dst.len() % 8 == 0 {
        return tiled(a, p, cfg, t, h, dst);
    }
    if cfg.avx2 && a.plain_kv() && n_tokens == 1 && nek1 >= SPLIT_MIN {
        return split(a, p, cfg, nek1, t, h, dst);
    }
    let part = one_chunk(a, p, cfg, cfg.avx2, t, h, 0, usize::MAX);
    let inv = if part.s == 0.0 { 0.0 } else { 1.0 / part.s };
    for (o, x) in dst.iter_mut().zip(&part.acc) {
        *o = x * inv;
    }
}

/// The reference kernel over cells `[c0, c1)` (intersected with the visible ones).
///
/// With a Q8_0 K cache, Q is quantized to Q8_0 (ggml's `q_to_vec_dot`) and each score is
/// `ggml_vec_dot_q8_0_q8_0` of the cell's blocks with it; else Q is rounded to f16 for
/// `ggml_vec_dot_f16`. With a Q8_0 V cache the accumulator is f32 (V dequantized,
/// `ggml_vec_mad_f32`), else f16 (rounded after every update). An F32 cache arrives here
/// cast to F16, as llama.cpp casts it before its flash kernel (the interpreter's `Attention`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn one_chunk(
    a: &AttnArgs<'_>,
    p: &AttnParams,
    cfg: &AttnCfg,
    avx2: bool,
    t: usize,
    h: usize,
    c0: usize,
    c1: usize,
) -> Partial {
    let d_k = a.lq.ne[0];
    let d_v = a.lv.ne[0];
    let kvh = a.kv_head(h);
    let vis = a.visible(p, t, cfg.n_ctx);
    let (lo, hi) = (vis.lo, vis.hi);
    let qo = a.lq.off([0, h, t, 0]);
    let q_f32 = &a.q[qo..qo + d_k];
    let q8 = a.k_type == DType::Block(GgmlType::Q8_0);
    let q: Vec<f32> = q_f32.iter().map(|&x| round_f16(x)).collect();
    let q_q8 = if q8 {
        requantize_q8_0(q_f32, cfg.flavor)
    } else {
        Vec::new()
    };
    let round: fn(f32) -> f32 = if a.v_type == DType::Block(GgmlType::Q8_0) {
        |x| x
    } else {
        round_f16
    };
    let (scale, cap) = scale_cap(p);
    let mut acc = vec![0f32; d_v];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j in lo.max(c0)..hi.min(c1) {
        // llama.cpp skips masked cells (a wrapped ring's gap).
        if vis.in_gap(j) {
            continue;
        }
        let ko = a.lk.off([0, kvh, j, 0]);
        let k = &a.k[ko..ko + d_k];
        let dot_kq = if q8 {
            let kb = requantize_q8_0(k, cfg.flavor);
            let r = if avx2 {
                ggml::vec_dot_avx2(GgmlType::Q8_0, &kb, &q_q8)
            } else {
                ggml::vec_dot(GgmlType::Q8_0, &kb, &q_q8)
            };
            // Both rows are whole blocks of d_k values (the graph checks d_k % 32 == 0).
            r.unwrap_or(f32::NAN)
        } else if avx2 {
            avx2::dot_f16(k, &q)
        } else {
            dot(&q, k)
        };
        let mut s = dot_kq * scale;
        if cap != 0.0 {
            s = cap * s.tanh();
        }
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            acc.iter_mut().for_each(|x| *x = round(*x * ms));
        } else {
            vs = (s - m).exp();
        }
        let vo = a.lv.off([0, kvh, j, 0]);
        for (x, &v) in acc.iter_mut().zip(&a.v[vo..vo + d_v]) {
            *x = round(v.mul_add(vs, *x));
        }
        sum = if avx2 {
            sum.mul_add(ms, vs)
        } else {
            sum * ms + vs
        };
    }
    Partial { m, s: sum, acc }
}

/// The split-KV decode: chunks of `ceil(nek1 / threads)` cells, merged in order.
#[inline(always)]
fn split(
    a: &AttnArgs<'_>,
    p: &AttnParams,
    cfg: &AttnCfg,
    nek1: usize,
    t: usize,
    h: usize,
    dst: &mut [f32],
) {
    let nth = cfg.llama_threads.max(1);
    let cs = nek1.div_ceil(nth);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    dst.iter_mut().for_each(|x| *x = 0.0);
    for c in 0..nth {
        let c0 = c * cs;
        if c0 >= nek1 {
            continue;
        }
        let part = one_chunk(a, p, cfg, true, t, h, c0, (c0 + cs).min(nek1));
        if part.s == 0.0 {
            continue;
        }
        let new = m.max(part.m);
        let (so, sn) = ((m - new).exp(), (part.m - new).exp());
        for (x, &y) in dst.iter_mut().zip(&part.acc) {
            *x = x.mul_add(so, y * sn);
        }
        sum = sum.mul_add(so, part.s * sn);
        m = new;
    }
    if sum != 0.0 {
        let inv = 1.0 / sum;
        dst.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The tiled kernel for one query row.
#[inline(always)]
fn tiled(a: &AttnArgs<'_>, p: &AttnParams, cfg: &AttnCfg, t: usize, h: usize, dst: &mut [f32]) {
    let d_k = a.lq.ne[0];
    let kvh = a.kv_head(h);
    let vis = a.visible(p, t, cfg.n_ctx);
    let (lo, hi) = (vis.lo, vis.hi);
    let qo = a.lq.off([0, h, t, 0]);
    let q = &a.q[qo..qo + d_k];
    let (scale, cap) = scale_cap(p);
    let d_v = dst.len();
    let mut acc = vec![0f32; d_v];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut kq = [0f32; KV_TILE];
    let mut e = [0f32; KV_TILE];
    for tile in (0..hi).step_by(KV_TILE) {
        if tile + KV_TILE <= lo {
            continue;
        }
        for (tk, s) in kq.iter_mut().enumerate() {
            let j = tile + tk;
            *s = if j >= lo && j < hi && !vis.in_gap(j) {
                let ko = a.lk.off([0, kvh, j, 0]);
                let mut c = 0f32;
                for (x, y) in q.iter().zip(&a.k[ko..ko + d_k]) {
                    c = x.mul_add(*y, c);
                }
                let s = c * scale;
                if cap != 0.0 {
                    s.tanh() * cap
                } else {
                    s
                }
            } else {
                f32::NEG_INFINITY
            };
        }
        let tile_max = kq.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
        if tile_max == f32::NEG_INFINITY {
            continue;
        }
        let new = m.max(tile_max);
        if new > m {
            let ms = (m - new).exp();
            acc.iter_mut().for_each(|x| *x *= ms);
            sum *= ms;
        }
        m = new;
        sum = (sum as f64 + avx2::soft_max_exp(&kq, m, &mut e)) as f32;
        for (tk, &pj) in e.iter().enumerate() {
            let j = tile + tk;
            if j >= hi {
                break;
            }
            if pj == 0.0 {
                continue;
            }
            let vo = a.lv.off([0, kvh, j, 0]);
            for (x, &v) in acc.iter_mut().zip(&a.v[vo..vo + d_v]) {
                *x = pj.mul_add(v, *x);
            }
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, x) in dst.iter_mut().zip(&acc) {
        *o = x * inv;
    }
}
