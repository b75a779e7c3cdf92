//! The KV cache write and attention over it, in the three ways the interpreter can compute it
//! (see [`super::InterpOptions`]):
//!
//! - exact: f32 scores, softmax and weighted sum;
//! - llama.cpp without flash attention (`build_attn_mha`: `kq = mul_mat(k, q)`, optional
//!   soft-cap, `soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`): Q rounded to f16
//!   for the scores and the probabilities to f16 for the product with V;
//! - llama.cpp's CPU flash attention ([`super::flash`]).
//!
//! K and V are whatever the cache holds (f16 values for an F16 cache).

use super::avx2;
use super::elementwise::soft_max_in_place;
use super::flash;
use super::layout::Lay;
use super::matmul::dot;
use crate::ggml::{self, f16_to_f32, f32_to_f16, GgmlType, Q8Flavor};
use crate::graph::{AttnParams, DType, VisibleCells};

#[inline]
pub(crate) fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Writes row `t` of `cur {n_embd_gqa, n_tokens}` into row `pos[t] % cells` of `cache` (a
/// ring of `cells` rows, or `cells` ≥ the cache's rows: row `pos[t]`), rounded to
/// the cache's dtype; a Q8_0 cache holds the dequantized values of the row quantized with
/// `flavor` (from which [`requantize_q8_0`] recovers the blocks).
#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_store(
    cache: &mut [f32],
    cache_lay: &Lay,
    cache_dtype: DType,
    flavor: Q8Flavor,
    cur: &[f32],
    cur_lay: &Lay,
    pos: &[i32],
    cells: usize,
) -> Result<(), String> {
    let n = cur_lay.ne[0];
    let mut blocks = match cache_dtype {
        DType::Block(t) => vec![0u8; t.row_size(n as u64).unwrap_or(0) as usize],
        _ => Vec::new(),
    };
    for (t, &p) in pos.iter().enumerate() {
        if p < 0 || p as usize >= cache_lay.ne[1] {
            return Err(format!(
                "position {p} is outside the KV cache of {} cells",
                cache_lay.ne[1]
            ));
        }
        let row = p as usize % cells.clamp(1, cache_lay.ne[1]);
        let dst = &mut cache[cache_lay.off([0, row, 0, 0])..][..n];
        let src = &cur[cur_lay.off([0, t, 0, 0])..][..n];
        match cache_dtype {
            DType::Block(bt) => {
                ggml::quantize(bt, src, &mut blocks, flavor).map_err(|e| e.to_string())?;
                ggml::dequantize(bt, &blocks, dst).map_err(|e| e.to_string())?;
            }
            DType::F16 => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = round_f16(v)),
            _ => dst.copy_from_slice(src),
        }
    }
    Ok(())
}

/// The Q8_0 blocks of `x`, values a Q8_0 cache holds (dequantized blocks): quantizing them
/// again gives back the stored blocks exactly, because the largest magnitude of a block is
/// `127·d` (exact in f32), so the scale comes back as `d` and every `q·d / d` rounds to `q`.
/// The one exception, a block whose scale underflowed f16 to 0, comes back all zero and
/// contributes 0 to any dot product either way (`requantize_q8_0_is_the_identity`).
pub(crate) fn requantize_q8_0(x: &[f32], flavor: Q8Flavor) -> Vec<u8> {
    let mut b = vec![0u8; x.len() / 32 * GgmlType::Q8_0.type_size()];
    // The caller passes whole blocks (a head of a cache row).
    let _ = ggml::quantize(GgmlType::Q8_0, x, &mut b, flavor);
    b
}

/// How attention computes (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttnMode {
    /// f32 throughout.
    Exact,
    /// llama.cpp without flash attention.
    F16,
    /// llama.cpp's CPU flash attention.
    Flash,
}

/// How to compute, beyond the op's parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnCfg {
    /// Rounding mode.
    pub mode: AttnMode,
    /// Follow llama.cpp's x86 operation order ([`avx2`]).
    pub avx2: bool,
    /// KV cache size in cells (the bound of the KV length); for a ring (a sliding-window
    /// cache sized to its window) its cells, the KV length may then pass it.
    pub n_ctx: usize,
    /// Threads llama.cpp runs with (its split-KV decode path cuts the cache per thread).
    pub llama_threads: usize,
    /// Threads of this interpreter.
    pub n_threads: usize,
    /// The Q8_0 quantizer of llama.cpp's build (Q rows for a Q8_0 K cache).
    pub flavor: Q8Flavor,
}

/// The sources of one attention evaluation.
pub(crate) struct AttnArgs<'a> {
    pub q: &'a [f32],
    pub lq: Lay,
    pub k: &'a [f32],
    pub lk: Lay,
    pub v: &'a [f32],
    pub lv: Lay,
    /// The K cache's type (its values are in `k`, dequantized for Q8_0).
    pub k_type: DType,
    /// The V cache's type.
    pub v_type: DType,
    pub pos: &'a [i32],
    pub out: Lay,
}

impl AttnArgs<'_> {
    /// The cells the query of token `t` sees in a cache of `cells` cells
    /// ([`AttnParams::visible_cells`]; a ring once the KV length passes `cells`).
    pub fn visible(&self, p: &AttnParams, t: usize, cells: usize) -> VisibleCells {
        p.visible_cells(self.pos[t] as i64, self.lk.ne[2], cells)
    }

    /// Whether K and V are one float type (F32 or F16): ggml's tiled and split-KV flash
    /// kernels only take those.
    pub fn plain_kv(&self) -> bool {
        self.k_type == self.v_type && matches!(self.k_type, DType::F32 | DType::F16)
    }

    /// The KV head read by query head `h` (grouped-query attention).
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.lq.ne[1] / self.lk.ne[1])
    }
}

/// Attention for every token and head; see the module doc. Tokens are split over threads.
pub(crate) fn attention(a: &AttnArgs<'_>, p: &AttnParams, cfg: &AttnCfg) -> Vec<f32> {
    let n_tokens = a.lq.ne[2];
    let n_threads = if n_tokens * a.lk.ne[2] < 4096 {
        1
    } else {
        cfg.n_threads.clamp(1, n_tokens)
    };
    let chunk = n_tokens.div_ceil(n_threads.max(1));
    let run = |lo: usize, hi: usize| -> Vec<f32> { heads(a, p, cfg, lo, hi) };
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
            hs.into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
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

/// Every head of tokens `lo..hi`, rows of `d_v * n_head` values; with FMA instructions when
/// the CPU has them (the arithmetic is the same: `mul_add` is a fused multiply-add either way).
fn heads(a: &AttnArgs<'_>, p: &AttnParams, cfg: &AttnCfg, lo: usize, hi: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *FMA.get_or_init(|| {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
        }) {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { heads_fma(a, p, cfg, lo, hi) };
        }
    }
    heads_body(a, p, cfg, lo, hi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads_fma(
    a: &AttnArgs<'_>,
    p: &AttnParams,
    cfg: &AttnCfg,
    lo: usize,
    hi: usize,
) -> Vec<f32> {
    heads_body(a, p, cfg, lo, hi)
}

#[inline(always)]
fn heads_body(a: &AttnArgs<'_>, p: &AttnParams, cfg: &AttnCfg, lo: usize, hi: usize) -> Vec<f32> {
    let row = a.out.ne[0] * a.out.ne[1];
    let mut res = vec![0f32; (hi - lo) * row];
    for t in lo..hi {
        for h in 0..a.lq.ne[1] {
            let o = (t - lo) * row + h * a.out.ne[0];
            let dst = &mut res[o..o + a.out.ne[0]];
            match cfg.mode {
                AttnMode::Flash => flash::head(a, p, cfg, t, h, dst),
                AttnMode::Exact => head(a, p, false, false, cfg, t, h, dst),
                AttnMode::F16 => head(a, p, true, cfg.avx2, cfg, t, h, dst),
            }
        }
    }
    res
}

/// One query head of one token (llama.cpp without flash attention): writes its `d_v`
/// outputs to `dst`. With `avx2`, the scores, exponentials and the weighted sum follow
/// llama.cpp's x86 kernels: for a ubatch of two or more tokens the two products go through
/// llamafile's tinyBLAS ([`avx2::dot_tinyblas`]: 8 lanes), for one token through
/// `ggml_vec_dot_f16` ([`avx2::dot_f16`]: 4 × 8 lanes); the softmax through
/// [`avx2::soft_max_exp`]. Lanes are indexed by the absolute cache cell, as the cache rows
/// are (llama.cpp pads the KV length to a multiple of 32; padded cells weigh zero).
#[allow(clippy::too_many_arguments)]
fn head(
    a: &AttnArgs<'_>,
    p: &AttnParams,
    f16: bool,
    avx2: bool,
    cfg: &AttnCfg,
    t: usize,
    h: usize,
    dst: &mut [f32],
) {
    let cfg_flavor: Q8Flavor = cfg.flavor;
    let d_k = a.lq.ne[0];
    let batch = a.lq.ne[2] >= 2;
    let kvh = a.kv_head(h);
    let vis = a.visible(p, t, cfg.n_ctx);
    let (lo, hi) = (vis.lo, vis.hi);
    dst.iter_mut().for_each(|x| *x = 0.0);
    if vis.is_empty() {
        return;
    }
    let qo = a.lq.off([0, h, t, 0]);
    let mut q: Vec<f32> = a.q[qo..qo + d_k].to_vec();
    // A Q8_0 K cache: `mul_mat(k, q)` converts Q to Q8_0 and takes ggml's
    // `vec_dot_q8_0_q8_0` order (tinyBLAS's Q8_0 kernel adds in the same order).
    let q8 =
        (f16 && a.k_type == DType::Block(GgmlType::Q8_0)).then(|| requantize_q8_0(&q, cfg_flavor));
    // `mul_mat` converts Q to K's `vec_dot_type` and the probabilities to V's type: f16 for
    // F16 caches, nothing for F32 ones.
    if f16 && a.k_type == DType::F16 {
        q.iter_mut().for_each(|x| *x = round_f16(*x));
    }
    let f16 = f16 && a.v_type == DType::F16;
    let kq_dot: fn(&[f32], &[f32]) -> f32 = match (avx2, batch) {
        (true, true) => avx2::dot_tinyblas,
        (true, false) => avx2::dot_f16,
        (false, _) => dot,
    };
    let score = |k: &[f32]| match &q8 {
        Some(qq) => {
            let kb = requantize_q8_0(k, cfg_flavor);
            let r = if avx2 {
                ggml::vec_dot_avx2(GgmlType::Q8_0, &kb, qq)
            } else {
                ggml::vec_dot(GgmlType::Q8_0, &kb, qq)
            };
            // Whole blocks (the graph checks a Q8_0 cache's heads).
            r.unwrap_or(f32::NAN)
        }
        None => kq_dot(k, &q),
    };
    // Scores over the 8-aligned span [lo8, hi8); cells outside [lo, hi) are masked.
    let (lo8, hi8) = if avx2 {
        (lo & !7, (hi + 7) & !7)
    } else {
        (lo, hi)
    };
    let mut w = vec![f32::NEG_INFINITY; hi8 - lo8];
    let mut max = f32::NEG_INFINITY;
    // A wrapped ring's masked cells keep -inf: weight 0, lanes by absolute cell as before.
    for j in vis.ranges().into_iter().flatten() {
        let ko = a.lk.off([0, kvh, j, 0]);
        let mut s = score(&a.k[ko..ko + d_k]);
        if let Some(cap) = p.softcap {
            s = (s * (1.0 / cap)).tanh() * cap;
        }
        s *= p.kq_scale;
        max = max.max(s);
        w[j - lo8] = s;
    }
    if avx2 {
        let mut e = vec![0f32; w.len()];
        let sum = avx2::soft_max_exp(&w, max, &mut e);
        let inv = (1.0 / sum) as f32;
        w = e.into_iter().map(|x| x * inv).collect();
    } else {
        soft_max_in_place(&mut w, max);
    }
    let d_v = dst.len();
    if !avx2 {
        for (j, &pj) in (lo..hi).zip(&w) {
            if vis.in_gap(j) {
                continue;
            }
            let pj = if f16 { round_f16(pj) } else { pj };
            let vo = a.lv.off([0, kvh, j, 0]);
            for (o, &vv) in dst.iter_mut().zip(&a.v[vo..vo + d_v]) {
                *o += pj * vv;
            }
        }
        return;
    }
    // Lane accumulators per output value: 8 (tinyBLAS) or 4 × 8 (ggml_vec_dot_f16).
    let lanes = if batch { 8 } else { 32 };
    let mut acc = vec![0f32; d_v * lanes];
    for j in vis.ranges().into_iter().flatten() {
        let pj = w[j - lo8];
        let pj = if f16 { round_f16(pj) } else { pj };
        let lane = j % lanes;
        let vo = a.lv.off([0, kvh, j, 0]);
        for (d, &vv) in a.v[vo..vo + d_v].iter().enumerate() {
            let x = &mut acc[d * lanes + lane];
            *x = vv.mul_add(pj, *x);
        }
    }
    for (d, o) in dst.iter_mut().enumerate() {
        let l = &acc[d * lanes..(d + 1) * lanes];
        *o = if batch {
            let mut v = [0f32; 8];
            v.copy_from_slice(l);
            avx2::hsum8(&v)
        } else {
            let mut s4 = [[0f32; 8]; 4];
            for (j, s) in s4.iter_mut().enumerate() {
                s.copy_from_slice(&l[8 * j..8 * j + 8]);
            }
            avx2::reduce_4x8(s4)
        };
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
        let args = AttnArgs {
            q: &q,
            lq,
            k: &k,
            lk,
            v: &v,
            lv: lk,
            k_type: DType::F32,
            v_type: DType::F32,
            pos: &[0],
            out,
        };
        let cfg = AttnCfg {
            mode: AttnMode::Exact,
            avx2: false,
            n_ctx: 4,
            llama_threads: 1,
            n_threads: 1,
            flavor: Q8Flavor::X86,
        };
        let p = AttnParams {
            kq_scale: 0.5,
            softcap: None,
            window: None,
            causal: true,
        };
        let r = attention(&args, &p, &cfg);
        assert_eq!(r, vec![5.0, -6.0, 5.0, -6.0]);
    }

    #[test]
    fn window_hides_old_keys() {
        // Position 2 with window 1 sees only cell 2.
        let lq = Lay::of(&Shape::new(&[1, 1, 1]), 0);
        let lk = Lay::of(&Shape::new(&[1, 1, 3]).with_kv_dim(2), 3);
        let out = Lay::of(&Shape::new(&[1, 1, 1]), 0);
        let args = AttnArgs {
            q: &[1.0],
            lq,
            k: &[1.0, 2.0, 3.0],
            lk,
            v: &[10.0, 20.0, 30.0],
            lv: lk,
            k_type: DType::F32,
            v_type: DType::F32,
            pos: &[2],
            out,
        };
        let p = AttnParams {
            kq_scale: 1.0,
            softcap: None,
            window: Some(1),
            causal: true,
        };
        for mode in [AttnMode::Exact, AttnMode::F16, AttnMode::Flash] {
            let cfg = AttnCfg {
                mode,
                avx2: true,
                n_ctx: 3,
                llama_threads: 2,
                n_threads: 1,
                flavor: Q8Flavor::X86,
            };
            assert_eq!(attention(&args, &p, &cfg), vec![30.0], "{mode:?}");
        }
        let cfg = AttnCfg {
            mode: AttnMode::Exact,
            avx2: false,
            n_ctx: 3,
            llama_threads: 1,
            n_threads: 1,
            flavor: Q8Flavor::X86,
        };
        let p = AttnParams { window: None, ..p };
        let all = attention(&args, &p, &cfg)[0];
        assert!(all > 20.0 && all < 30.0);
    }

    #[test]
    fn requantize_q8_0_is_the_identity() {
        // Blocks of mixed magnitudes, an all-zero block, tiny (f16-subnormal scales) and
        // large values: quantize, dequantize as a Q8_0 cache holds them, quantize again.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for flavor in [Q8Flavor::X86, Q8Flavor::Reference, Q8Flavor::Arm] {
            for scale in [1e-7f32, 1e-3, 1.0, 37.0, 6e4] {
                let mut x: Vec<f32> = (0..32 * 64).map(|_| rnd() * scale).collect();
                x[32..64].iter_mut().for_each(|v| *v = 0.0);
                let mut b = vec![0u8; 64 * 34];
                ggml::quantize(GgmlType::Q8_0, &x, &mut b, flavor).expect("whole blocks");
                let mut y = vec![0f32; x.len()];
                ggml::dequantize(GgmlType::Q8_0, &b, &mut y).expect("whole blocks");
                let again = requantize_q8_0(&y, flavor);
                for (i, (r, o)) in again.chunks(34).zip(b.chunks(34)).enumerate() {
                    if o[..2] == [0, 0] {
                        assert!(r.iter().all(|&v| v == 0), "{flavor:?} {scale} block {i}");
                    } else {
                        assert_eq!(r, o, "{flavor:?} scale {scale} block {i}");
                    }
                }
            }
        }
    }
}
