//! llama.cpp's CPU flash attention (ggml-cpu ops.cpp, `ggml_compute_forward_flash_attn_ext_f16`,
//! llama.cpp's default on the CPU), bit for bit as `ir::interp` computes it with
//! `InterpOptions::llama_cpp` (`ir/src/interp/flash.rs`, `ir::interp::llama_cpu::attention`):
//!
//! - the reference kernel ([`one_chunk`], ggml's `_one_chunk`) for ubatches of fewer than
//!   [`Q_TILE`] tokens: Q rounded to f16; for each visible cell in order the score
//!   `ggml_vec_dot_f16(k, q)` (4 × 8 lanes of fused multiply-adds, ggml's reduction) times the
//!   scale; an online softmax (running maximum `M`, sum `S = fma(S, ms, vs)`, libm `expf`);
//!   the weighted sum of V in an f16 accumulator, rounded to f16 after every update;
//! - the tiled kernel ([`tiled_query`], ggml's `_tiled`) for ubatches of [`Q_TILE`] tokens or
//!   more: f32 Q, tiles of [`KV_TILE`] cells aligned to cell 0, each score a chain of fused
//!   multiply-adds over the head, the tile's exponentials by ggml's vectorized `expf` with
//!   its grouped f64 sum (`ggml_vec_soft_max_f32`), an f32 accumulator;
//! - the split-KV decode ([`split`]) for one token with a padded KV length of [`SPLIT_MIN`]
//!   or more: the padded cache cut into one chunk per llama.cpp thread, each chunk by the
//!   reference kernel, the partial results merged in chunk order.
//!
//! The kernel is chosen from the number of tokens of llama.cpp's ubatch (its `n_tokens`),
//! not from the size of the step that computes them (which may be padded, or a part of it); the padded KV length ([`padded_kv`]) only matters
//! for the split. The scores of a query are computed first (they are independent), then the
//! serial online softmax runs over them; the arithmetic is unchanged. AVX2 + FMA + F16C through
//! `std::arch` when the host has them; otherwise scalar code computing the same values.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::attention::KvRows;
#[cfg(target_arch = "x86_64")]
use super::elementwise::{exp256, hsum8};
#[cfg(target_arch = "x86_64")]
use super::has_avx2;
use ir::ggml::{quantize_q8_0_with, Q8Flavor};

/// Rows of the tiled kernel's Q tile (`GGML_FA_TILE_Q`): ubatches this large take it.
pub(crate) const Q_TILE: usize = 64;
/// Cells of the tiled kernel's KV tile (`GGML_FA_TILE_KV`).
pub(crate) const KV_TILE: usize = 64;
/// llama.cpp pads the KV length to a multiple of this with flash attention.
pub(crate) const KV_PAD: usize = 256;
/// Padded KV length from which a one-token ubatch takes the split-KV path.
pub(crate) const SPLIT_MIN: usize = 512;

/// The KV length ggml's kernel sees for a KV length `kv_len` and a cache of `n_ctx` cells:
/// `kv_len` padded to [`KV_PAD`], at most the cache.
pub(crate) fn padded_kv(kv_len: usize, n_ctx: usize) -> usize {
    kv_len
        .div_ceil(KV_PAD)
        .max(1)
        .saturating_mul(KV_PAD)
        .min(n_ctx.max(kv_len))
}

/// The score scale and soft-cap (0: none) as ggml folds them: with a cap `c`, scores are
/// `c · tanh(q·k · kq_scale / c)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlashParams {
    pub scale: f32,
    pub cap: f32,
}

impl FlashParams {
    pub(crate) fn new(kq_scale: f32, softcap: Option<f32>) -> FlashParams {
        match softcap {
            Some(c) => FlashParams {
                scale: kq_scale / c,
                cap: c,
            },
            None => FlashParams {
                scale: kq_scale,
                cap: 0.0,
            },
        }
    }

    #[inline(always)]
    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        if self.cap != 0.0 {
            self.cap * s.tanh()
        } else {
            s
        }
    }
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[inline(always)]
unsafe fn load_scalar(p: *const u8, i: usize, f16: bool) -> f32 {
    if f16 {
        half::f16::from_bits(std::ptr::read_unaligned(p.add(2 * i) as *const u16)).to_f32()
    } else {
        std::ptr::read_unaligned(p.add(4 * i) as *const f32)
    }
}

/// Scratch floats [`query`] needs: Q, an accumulator, and one score per cell.
pub(crate) fn query_scratch(d_k: usize, d_v: usize, n_ctx: usize) -> usize {
    d_k + d_v + n_ctx
}

/// One query of a llama.cpp ubatch of `n_tokens` tokens with the reference or split-KV
/// kernel (module doc): `out[0..d_v]` from `q[0..d_k]` (f32) over the visible cells `lo..hi`; `nek1` is the
/// padded KV length ([`padded_kv`]), `llama_threads` llama.cpp's thread count.
///
/// # Safety
/// `q` valid for `d_k` reads, `out` for `d_v` writes; `kv` rows `0..hi` valid; `scratch`
/// holds [`query_scratch`] floats (with `n_ctx ≥ hi`); nothing overlaps `out`.
#[allow(clippy::too_many_arguments)]
// The executor calls `query_group` (groups of one take this path); the tests compare
// groups against this one-query form.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) unsafe fn query(
    q: *const f32,
    d_k: usize,
    kv: &KvRows,
    lo: usize,
    hi: usize,
    n_tokens: usize,
    nek1: usize,
    llama_threads: usize,
    p: &FlashParams,
    scratch: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    // A group of one: the one-query path, in `scratch` as it is.
    query_group(
        &[q],
        &[out],
        d_k,
        kv,
        (lo, hi),
        (n_tokens, nek1, llama_threads),
        p,
        scratch,
        d_v,
    )
}

/// [`query`] on the best instruction set the host has.
fn run_query(a: &Query<'_>) {
    // SAFETY: the caller's contract ([`query`]); the AVX2 build only where the host has it.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return query_avx2(a);
        }
        query_body::<false>(a)
    }
}

/// Whether a query of a ubatch of `n_tokens` tokens over a padded KV length `nek1` takes
/// ggml's split-KV path: one token, at least [`SPLIT_MIN`] cells, and F16 or F32 caches
/// (not Q8_0).
fn takes_split(n_tokens: usize, nek1: usize, kv: &KvRows) -> bool {
    n_tokens == 1 && nek1 >= SPLIT_MIN && !kv.k_q8 && !kv.v_q8
}

/// Queries [`query_group`] runs through the weighted sum of V together (their serial
/// online softmaxes interleaved: one alone is bound by the latency of its f16 rounding).
pub(crate) const GROUP: usize = 4;

/// Scratch floats [`query_group`] needs: [`query_scratch`] per query of a [`GROUP`].
pub(crate) fn group_scratch(d_k: usize, d_v: usize, n_ctx: usize) -> usize {
    GROUP * query_scratch(d_k, d_v, n_ctx)
}

/// [`query`] for queries that share their KV rows and visible cells (the query heads of
/// one KV head, for one token): `outs[i]` from `qs[i]`, each bit for bit what [`query`]
/// gives it alone. Up to [`GROUP`] at a time share the pass over V (each chunk's pass on
/// the split-KV path) where the host has AVX-512 and the V rows are f16 or f32 of a head
/// size of 64, 128 or 256 (else one at a time).
///
/// # Safety
/// As [`query`] for each query; `scratch` holds [`group_scratch`] floats ([`query_scratch`]
/// for one query); no output overlaps another or an input.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn query_group(
    qs: &[*const f32],
    outs: &[*mut f32],
    d_k: usize,
    kv: &KvRows,
    (lo, hi): (usize, usize),
    (n_tokens, nek1, llama_threads): (usize, usize, usize),
    p: &FlashParams,
    scratch: *mut f32,
    d_v: usize,
) {
    let one = |q: *const f32, out: *mut f32, scratch: *mut f32| Query {
        q,
        d_k,
        kv,
        lo,
        hi,
        n_tokens,
        nek1,
        llama_threads,
        p,
        scratch,
        out,
        d_v,
    };
    #[cfg(target_arch = "x86_64")]
    if qs.len() > 1 && !kv.v_q8 && crate::target::Tier::host().vnni() {
        let stride = query_scratch(d_k, d_v, hi - lo);
        for (qs, outs) in qs.chunks(GROUP).zip(outs.chunks(GROUP)) {
            let n = qs.len();
            let queries: [Query<'_>; GROUP] = std::array::from_fn(|i| {
                let i = i.min(n - 1);
                one(qs[i], outs[i], scratch.add(i * stride))
            });
            let queries = &queries[..n];
            if group_avx512(queries) {
                continue;
            }
            for a in queries {
                query_avx2(a);
            }
        }
        return;
    }
    for (&q, &out) in qs.iter().zip(outs) {
        run_query(&one(q, out, scratch));
    }
}

/// Up to [`GROUP`] queries of [`query_group`]: the scores of each, then one pass over the V
/// rows for all of them (`false`, having done nothing, for a head size it has no form for).
///
/// # Safety
/// As [`query_group`]; the host has AVX-512F/VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn group_avx512(queries: &[Query<'_>]) -> bool {
    let Some(a) = queries.first() else {
        return true;
    };
    let (kv, d_k, d_v, lo, hi) = (a.kv, a.d_k, a.d_v, a.lo, a.hi);
    macro_rules! pass {
        ($g:literal, $nv:literal) => {{
            if d_k == 64 && kv.f16 && !kv.k_q8 {
                // Each K row converted once for the group's queries.
                for a in queries {
                    for i in 0..d_k {
                        *a.scratch.add(i) = round_f16(*a.q.add(i));
                    }
                }
                let q16: [*const f32; $g] =
                    std::array::from_fn(|i| queries[i].scratch as *const f32);
                let scores: [*mut f32; $g] =
                    std::array::from_fn(|i| queries[i].scratch.add(d_k + d_v));
                scores64_group::<$g>(kv, q16, lo, hi, a.p, scores);
            } else {
                for a in queries {
                    query_scores::<true>(a);
                }
            }
            let acc: [*mut f32; $g] = std::array::from_fn(|i| queries[i].scratch.add(d_k));
            let scores: [*const f32; $g] = std::array::from_fn(|i| acc[i].add(d_v) as *const f32);
            if takes_split(a.n_tokens, a.nek1, kv) {
                let outs: [*mut f32; $g] = std::array::from_fn(|i| queries[i].out);
                if kv.f16 {
                    split_group::<$g, $nv, V_F16>(
                        kv,
                        lo,
                        hi,
                        a.nek1,
                        a.llama_threads,
                        scores,
                        acc,
                        outs,
                        d_v,
                    );
                } else {
                    split_group::<$g, $nv, V_F32>(
                        kv,
                        lo,
                        hi,
                        a.nek1,
                        a.llama_threads,
                        scores,
                        acc,
                        outs,
                        d_v,
                    );
                }
                return true;
            }
            for i in 0..$g {
                softmax_weights(kv, lo, lo, hi, scores[i] as *mut f32);
            }
            let sums = if kv.f16 {
                v_pass::<$g, $nv, V_F16>(kv, lo, hi, scores, acc)
            } else {
                v_pass::<$g, $nv, V_F32>(kv, lo, hi, scores, acc)
            };
            for (i, a) in queries.iter().enumerate() {
                finish(acc[i], sums[i], a.out, d_v);
            }
            true
        }};
    }
    macro_rules! sizes {
        ($g:literal) => {
            match d_v {
                64 => pass!($g, 4),
                128 => pass!($g, 8),
                256 => pass!($g, 16),
                _ => false,
            }
        };
    }
    match queries.len() {
        1 => sizes!(1),
        2 => sizes!(2),
        3 => sizes!(3),
        4 => sizes!(4),
        _ => false,
    }
}

/// How many cells ahead the grouped passes over K and V rows prefetch: a decode step of
/// many sequences reads their caches from L3 (a KV head's row of a cell is one or two
/// cache lines, the cells a stride apart), and waited on each row's load.
#[cfg(target_arch = "x86_64")]
const PREFETCH_CELLS: usize = 8;

/// Asks for the `len` bytes at `p` to be brought into the caches (a prefetch never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_row(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        // SAFETY: a prefetch has no architectural effect and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8) };
    }
}

/// [`scores64`] for `G` queries of one KV head at once, on 512-bit registers: each K row
/// is converted once for all of them, and each register holds two of [`dot64`]'s four
/// 8-lane sums (lanes 0..8 the first, 8..16 the second), which take the same fused
/// multiply-adds; the reduction adds them in `dot64`'s order (`(s0 + s2) + (s1 + s3)`, then
/// the 128-bit halves, then two horizontal adds), so every score is the same bit for bit.
///
/// # Safety
/// AVX-512F/VL and F16C; an F16 cache with heads of 64; `q16[g]` 64 readable f32 (the query
/// rounded to f16); `scores[g]` writable for the cells `lo..hi`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores64_group<const G: usize>(
    kv: &KvRows,
    q16: [*const f32; G],
    lo: usize,
    hi: usize,
    p: &FlashParams,
    scores: [*mut f32; G],
) {
    let q: [[__m512; 4]; G] =
        std::array::from_fn(|g| std::array::from_fn(|i| _mm512_loadu_ps(q16[g].add(16 * i))));
    let zero = _mm512_setzero_ps();
    for j in kv.ranges(lo, hi).into_iter().flatten() {
        let kr = kv.k.add(j * kv.k_stride);
        prefetch_row(kr.wrapping_add(PREFETCH_CELLS * kv.k_stride), 128);
        let k: [__m512; 4] = std::array::from_fn(|i| {
            _mm512_cvtph_ps(_mm256_loadu_si256(kr.add(32 * i) as *const __m256i))
        });
        for g in 0..G {
            // a: dot64's s0 | s1, b: its s2 | s3.
            let a = _mm512_fmadd_ps(k[0], q[g][0], zero);
            let b = _mm512_fmadd_ps(k[1], q[g][1], zero);
            let a = _mm512_fmadd_ps(k[2], q[g][2], a);
            let b = _mm512_fmadd_ps(k[3], q[g][3], b);
            let s = _mm512_add_ps(a, b);
            let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)));
            let v = _mm256_add_ps(_mm512_castps512_ps256(s), hi8);
            let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let t = _mm_hadd_ps(t, t);
            *scores[g].add(j - lo) = p.score(_mm_cvtss_f32(_mm_hadd_ps(t, t)));
        }
    }
}

/// Sixteen f32 values rounded to f16 (to nearest even) and back.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(x))
}

/// [`one_chunk_reg`] over cells `lo..hi` for `G` queries at once, `NV` vectors of 16 per
/// accumulator (`d_v = 16·NV`): each query's maximum, sum and f16-rounded accumulator
/// take the same operations in the same order as alone (each lane's value does not depend
/// on the vector width); the V row is loaded once for all. Returns each query's sum `S`;
/// `acc[i][0..d_v]` receives its accumulator.
///
/// # Safety
/// AVX-512F/VL and F16C; `scores[i]` holds query `i`'s scores of `lo..hi`; `acc[i]` valid for
/// `d_v` writes; V rows of kind `V` (f16 or f32).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)] // i indexes the V row and every query's accumulator
unsafe fn v_pass<const G: usize, const NV: usize, const V: u8>(
    kv: &KvRows,
    lo: usize,
    hi: usize,
    scores: [*const f32; G],
    acc: [*mut f32; G],
) -> [f32; G] {
    let mut a = [[_mm512_setzero_ps(); NV]; G];
    let mut sum = [0f32; G];
    for j in kv.ranges(lo, hi).into_iter().flatten() {
        let mut vs = [1f32; G];
        for g in 0..G {
            let (ms, w) = split_weight(*scores[g].add(j - lo));
            vs[g] = w;
            if ms != 1.0 {
                let v = _mm512_set1_ps(ms);
                for x in a[g].iter_mut() {
                    *x = round16(_mm512_mul_ps(*x, v));
                }
            }
            sum[g] = sum[g].mul_add(ms, w);
        }
        let vr = kv.v.add(j * kv.v_stride);
        prefetch_row(
            vr.wrapping_add(PREFETCH_CELLS * kv.v_stride),
            NV * if V == V_F16 { 32 } else { 64 },
        );
        let mut vv = [_mm512_setzero_ps(); G];
        for g in 0..G {
            vv[g] = _mm512_set1_ps(vs[g]);
        }
        for i in 0..NV {
            let x = if V == V_F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(vr.add(32 * i) as *const __m256i))
            } else {
                _mm512_loadu_ps(vr.add(64 * i) as *const f32)
            };
            for g in 0..G {
                a[g][i] = round16(_mm512_fmadd_ps(x, vv[g], a[g][i]));
            }
        }
    }
    for g in 0..G {
        for (i, x) in a[g].iter().enumerate() {
            _mm512_storeu_ps(acc[g].add(16 * i), *x);
        }
    }
    sum
}

/// [`split`] for `G` queries of one KV head at once: each chunk's weights per query
/// ([`softmax_weights`], as [`one_chunk_reg`] computes them), the chunk's pass over V shared
/// by all ([`v_pass`]: the same operations per query as alone), then each query's partial
/// result merged into `outs[g]` as [`split`] merges it (the same fused multiply-adds per
/// lane, in chunk order) and normalized. Each output is bit for bit [`split`]'s.
///
/// # Safety
/// AVX-512F/VL and F16C; `scores[g]` holds query `g`'s scores of `lo..hi` (overwritten by
/// its weights); `acc[g]` valid for `d_v = 16·NV` writes (scratch), `outs[g]` for `d_v`
/// writes; V rows of kind `V` (f16 or f32); nothing overlaps.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split_group<const G: usize, const NV: usize, const V: u8>(
    kv: &KvRows,
    lo: usize,
    hi: usize,
    nek1: usize,
    threads: usize,
    scores: [*const f32; G],
    acc: [*mut f32; G],
    outs: [*mut f32; G],
    d_v: usize,
) {
    let nth = threads.max(1);
    let cs = nek1.div_ceil(nth);
    let mut m = [f32::NEG_INFINITY; G];
    let mut sum = [0f32; G];
    for out in outs {
        std::slice::from_raw_parts_mut(out, d_v).fill(0.0);
    }
    for c in 0..nth {
        let c0 = c * cs;
        if c0 >= nek1 {
            continue;
        }
        let (a, b) = (c0.max(lo), (c0 + cs).min(nek1).min(hi));
        let b = b.max(a);
        let mut pm = [f32::NEG_INFINITY; G];
        for g in 0..G {
            pm[g] = softmax_weights(kv, lo, a, b, scores[g] as *mut f32);
        }
        let at: [*const f32; G] = std::array::from_fn(|g| scores[g].add(a - lo));
        let ps = v_pass::<G, NV, V>(kv, a, b, at, acc);
        for g in 0..G {
            if ps[g] == 0.0 {
                continue;
            }
            let new = m[g].max(pm[g]);
            let (so, sn) = ((m[g] - new).exp(), (pm[g] - new).exp());
            let (vo, vn) = (_mm256_set1_ps(so), _mm256_set1_ps(sn));
            let (out, part) = (outs[g], acc[g]);
            for i in (0..d_v).step_by(8) {
                let o = out.add(i);
                let y = _mm256_mul_ps(_mm256_loadu_ps(part.add(i)), vn);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), vo, y));
            }
            sum[g] = sum[g].mul_add(so, ps[g] * sn);
            m[g] = new;
        }
    }
    for g in 0..G {
        if sum[g] != 0.0 {
            let inv = 1.0 / sum[g];
            for x in std::slice::from_raw_parts_mut(outs[g], d_v) {
                *x *= inv;
            }
        }
    }
}

/// The arguments of [`query`], passed on to its instruction-set variants.
#[derive(Clone, Copy)]
struct Query<'a> {
    q: *const f32,
    d_k: usize,
    kv: &'a KvRows,
    lo: usize,
    hi: usize,
    n_tokens: usize,
    nek1: usize,
    llama_threads: usize,
    p: &'a FlashParams,
    scratch: *mut f32,
    out: *mut f32,
    d_v: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn query_avx2(a: &Query<'_>) {
    query_body::<true>(a)
}

#[inline(always)]
unsafe fn query_body<const SIMD: bool>(a: &Query<'_>) {
    let Query {
        d_k,
        kv,
        lo,
        hi,
        n_tokens,
        nek1,
        llama_threads,
        scratch,
        out,
        d_v,
        ..
    } = *a;
    let acc = scratch.add(d_k);
    let scores = acc.add(d_v);
    query_scores::<SIMD>(a);
    if takes_split(n_tokens, nek1, kv) {
        split::<SIMD>(kv, lo, hi, nek1, llama_threads, scores, acc, out, d_v);
        return;
    }
    let (_, s) = one_chunk::<SIMD>(kv, lo, lo, hi, scores, acc, d_v);
    finish(acc, s, out, d_v);
}

/// `out = acc / s` (zeros where `s` is 0: no visible cell), ggml's final normalization.
#[inline(always)]
unsafe fn finish(acc: *const f32, s: f32, out: *mut f32, d_v: usize) {
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for i in 0..d_v {
        *out.add(i) = *acc.add(i) * inv;
    }
}

/// The scores of [`query`]'s visible cells into its scratch (after Q, rounded to f16 or
/// quantized to Q8_0, and the accumulator: [`query_scratch`]), `scores[j - lo]` for cell `j`.
#[inline(always)]
unsafe fn query_scores<const SIMD: bool>(a: &Query<'_>) {
    let Query {
        q,
        d_k,
        kv,
        lo,
        hi,
        p,
        scratch,
        d_v,
        ..
    } = *a;
    let q16 = scratch;
    let scores = scratch.add(d_k + d_v);
    // Scores of the visible cells (the split's chunks only cut this range).
    if kv.k_q8 {
        // Q as Q8_0 blocks (ggml's `q_to_vec_dot`) in Q's scratch: d_k / 32 · 34 bytes.
        let nb = d_k / 32;
        let qq = q16 as *mut u8;
        quantize_q(q, d_k, qq);
        for j in kv.ranges(lo, hi).into_iter().flatten() {
            let kr = kv.k.add(j * kv.k_stride);
            *scores.add(j - lo) = p.score(dot_q8::<SIMD>(kr, qq, nb));
        }
    } else {
        for i in 0..d_k {
            *q16.add(i) = round_f16(*q.add(i));
        }
        #[cfg(target_arch = "x86_64")]
        let fast = SIMD && d_k == 64 && kv.f16;
        #[cfg(not(target_arch = "x86_64"))]
        let fast = false;
        if fast {
            #[cfg(target_arch = "x86_64")]
            scores64(kv, q16, lo, hi, p, scores);
        } else {
            for j in kv.ranges(lo, hi).into_iter().flatten() {
                let kr = kv.k.add(j * kv.k_stride);
                *scores.add(j - lo) = p.score(dot_f16::<SIMD>(kr, kv.f16, q16, d_k));
            }
        }
    }
}

/// Bytes of a Q8_0 block: an f16 scale and 32 int8 values.
const Q8_BYTES: usize = 34;

/// `q[0..d_k]` as Q8_0 blocks at `dst` (`d_k / 32 · 34` bytes), as ggml-cpu's
/// `quantize_row_q8_0` converts a query for a Q8_0 K cache.
///
/// # Safety
/// `d_k` is a multiple of 32 (the lowering checks a Q8_0 cache's heads); `q` valid for
/// `d_k` reads, `dst` for the bytes written; no overlap.
pub(crate) unsafe fn quantize_q(q: *const f32, d_k: usize, dst: *mut u8) {
    let dst = std::slice::from_raw_parts_mut(dst, d_k / 32 * Q8_BYTES);
    // Whole blocks by the contract: cannot fail.
    let _ = quantize_q8_0_with(std::slice::from_raw_parts(q, d_k), dst, Q8Flavor::native());
}

/// The f16 scale of the Q8_0 block at `b`.
#[inline(always)]
unsafe fn q8_scale(b: *const u8) -> f32 {
    half::f16::from_bits(std::ptr::read_unaligned(b as *const u16)).to_f32()
}

/// `ggml_vec_dot_q8_0_q8_0(k, q)` over `nb` blocks as ggml's AVX2 code computes it: per block
/// `d = d_k · d_q` and eight i32 lanes of four products each (`mul_sum_i8_pairs_float`),
/// `acc = fma(d, lanes, acc)`; then `hsum_float_8`. Matches `ir::ggml::vec_dot_avx2`.
#[inline(always)]
pub(crate) unsafe fn dot_q8<const SIMD: bool>(k: *const u8, q: *const u8, nb: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        let mut acc = _mm256_setzero_ps();
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            let (kb, qb) = (k.add(b * Q8_BYTES), q.add(b * Q8_BYTES));
            let d = _mm256_set1_ps(q8_scale(kb) * q8_scale(qb));
            let x = _mm256_loadu_si256(kb.add(2) as *const __m256i);
            let y = _mm256_loadu_si256(qb.add(2) as *const __m256i);
            let ax = _mm256_sign_epi8(x, x);
            let sy = _mm256_sign_epi8(y, x);
            let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc);
        }
        return hsum8(acc);
    }
    let mut acc = [0f32; 8];
    for b in 0..nb {
        let (kb, qb) = (k.add(b * Q8_BYTES), q.add(b * Q8_BYTES));
        let d = q8_scale(kb) * q8_scale(qb);
        for (l, a) in acc.iter_mut().enumerate() {
            let mut sum = 0i32;
            for i in 4 * l..4 * l + 4 {
                sum += (*kb.add(2 + i) as i8 as i32) * (*qb.add(2 + i) as i8 as i32);
            }
            *a = d.mul_add(sum as f32, *a);
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// V rows of F16 values: an f16 accumulator, rounded after every update (ggml's `VKQ16`).
const V_F16: u8 = 0;
/// V rows of F32 values: an f16 accumulator as for F16 rows (llama.cpp casts an F32 cache
/// to F16 before its flash kernel; with flash attention the executor stores an F32 cache's
/// values rounded to f16, so these rows hold f16 values).
const V_F32: u8 = 1;
/// V rows of Q8_0 blocks, dequantized (ggml's `v_to_float`) into an f32 accumulator.
const V_Q8: u8 = 2;

/// Value `i` of a V row of kind `V`.
#[inline(always)]
unsafe fn load_v<const V: u8>(p: *const u8, i: usize) -> f32 {
    match V {
        V_F16 => load_scalar(p, i, true),
        V_F32 => load_scalar(p, i, false),
        _ => {
            let b = p.add(i / 32 * Q8_BYTES);
            (*b.add(2 + i % 32) as i8 as f32) * q8_scale(b)
        }
    }
}

/// Values `i .. i + 8` of a V row of kind `V` (`i` a multiple of 8).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_v8<const V: u8>(p: *const u8, i: usize) -> __m256 {
    match V {
        V_F16 => load8(p, i, true),
        V_F32 => load8(p, i, false),
        _ => {
            let b = p.add(i / 32 * Q8_BYTES);
            let q = _mm_loadl_epi64(b.add(2 + i % 32) as *const __m128i);
            let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_mul_ps(x, _mm256_set1_ps(q8_scale(b)))
        }
    }
}

/// The accumulator's rounding for V rows of kind `V`.
#[inline(always)]
fn round_v<const V: u8>(x: f32) -> f32 {
    if V != V_Q8 {
        round_f16(x)
    } else {
        x
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round_v8<const V: u8>(x: __m256) -> __m256 {
    if V != V_Q8 {
        round8(x)
    } else {
        x
    }
}

/// `ggml_vec_dot_f16(k, q)` (AVX/F16C): 4 accumulators of 8 lanes over chunks of 32, ggml's
/// `GGML_F32x8_REDUCE`, leftovers added in f64; `q` holds f16 values.
#[inline(always)]
pub(crate) unsafe fn dot_f16<const SIMD: bool>(
    k: *const u8,
    f16: bool,
    q: *const f32,
    n: usize,
) -> f32 {
    let np = n & !31;
    #[cfg(target_arch = "x86_64")]
    let r = if SIMD {
        let mut s = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, a) in s.iter_mut().enumerate() {
                let kv = load8(k, i + 8 * j, f16);
                *a = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q.add(i + 8 * j)), *a);
            }
            i += 32;
        }
        let s0 = _mm256_add_ps(s[0], s[2]);
        let s1 = _mm256_add_ps(s[1], s[3]);
        let s0 = _mm256_add_ps(s0, s1);
        let t = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps::<1>(s0));
        let t = _mm_hadd_ps(t, t);
        _mm_cvtss_f32(_mm_hadd_ps(t, t))
    } else {
        dot_f16_lanes(k, f16, q, np)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let r = dot_f16_lanes(k, f16, q, np);
    let mut sum = r as f64;
    for i in np..n {
        sum += (load_scalar(k, i, f16) * *q.add(i)) as f64;
    }
    sum as f32
}

/// The lanes of [`dot_f16`] written out (hosts without AVX2).
#[inline(always)]
unsafe fn dot_f16_lanes(k: *const u8, f16: bool, q: *const f32, np: usize) -> f32 {
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                let x = i + 8 * j + l;
                *a = load_scalar(k, x, f16).mul_add(*q.add(x), *a);
            }
        }
    }
    for l in 0..8 {
        s[0][l] += s[2][l];
        s[1][l] += s[3][l];
    }
    for l in 0..8 {
        s[0][l] += s[1][l];
    }
    let t: [f32; 4] = std::array::from_fn(|i| s[0][i] + s[0][i + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load8(p: *const u8, i: usize, f16: bool) -> __m256 {
    if f16 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
    } else {
        _mm256_loadu_ps(p.add(4 * i) as *const f32)
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round8(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// The reference kernel over cells `c0..c1` (visible ones; `scores[j - lo]` is cell `j`'s
/// score): the accumulator (f32 for Q8_0 V rows, else f16) into `acc[0..d_v]`, returns
/// `(M, S)`.
#[inline(always)]
unsafe fn one_chunk<const SIMD: bool>(
    kv: &KvRows,
    lo: usize,
    c0: usize,
    c1: usize,
    scores: *mut f32,
    acc: *mut f32,
    d_v: usize,
) -> (f32, f32) {
    match (kv.v_q8, kv.f16) {
        (true, _) => one_chunk_v::<SIMD, V_Q8>(kv, lo, c0, c1, scores, acc, d_v),
        (false, true) => one_chunk_v::<SIMD, V_F16>(kv, lo, c0, c1, scores, acc, d_v),
        (false, false) => one_chunk_v::<SIMD, V_F32>(kv, lo, c0, c1, scores, acc, d_v),
    }
}

/// [`one_chunk`] for V rows of kind `V`.
#[inline(always)]
unsafe fn one_chunk_v<const SIMD: bool, const V: u8>(
    kv: &KvRows,
    lo: usize,
    c0: usize,
    c1: usize,
    scores: *mut f32,
    acc: *mut f32,
    d_v: usize,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if SIMD && d_v == 64 {
        return one_chunk_reg::<8, V>(kv, lo, c0, c1, scores, acc);
    }
    #[cfg(target_arch = "x86_64")]
    if SIMD && d_v == 128 {
        return one_chunk_reg::<16, V>(kv, lo, c0, c1, scores, acc);
    }
    for i in 0..d_v {
        *acc.add(i) = 0.0;
    }
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    // Masked cells (a wrapped ring's gap) are skipped, as ggml skips -inf mask entries.
    for j in kv.ranges(c0, c1).into_iter().flatten() {
        let s = *scores.add(j - lo);
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        let vr = kv.v.add(j * kv.v_stride);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            scale_round::<SIMD, V>(acc, d_v, ms);
        } else {
            vs = (s - m).exp();
        }
        fma_round::<SIMD, V>(acc, vr, vs, d_v);
        sum = sum.mul_add(ms, vs);
    }
    (m, sum)
}

/// [`dot_f16`] of one cached F16 key row with a head of 64 f16 values held in registers
/// (the same operations in the same order).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot64(kr: *const u8, q: &[__m256; 8]) -> f32 {
    let mut s = [_mm256_setzero_ps(); 4];
    for (i, a) in s.iter_mut().enumerate() {
        *a = _mm256_fmadd_ps(load8(kr, 8 * i, true), q[i], *a);
    }
    for (i, a) in s.iter_mut().enumerate() {
        *a = _mm256_fmadd_ps(load8(kr, 32 + 8 * i, true), q[4 + i], *a);
    }
    let s0 = _mm256_add_ps(s[0], s[2]);
    let s1 = _mm256_add_ps(s[1], s[3]);
    let s0 = _mm256_add_ps(s0, s1);
    let t = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps::<1>(s0));
    let t = _mm_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_hadd_ps(t, t))
}

/// The scores of cells `lo..hi` for a head of 64 and an F16 cache ([`dot64`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores64(
    kv: &KvRows,
    q16: *const f32,
    lo: usize,
    hi: usize,
    p: &FlashParams,
    scores: *mut f32,
) {
    let q: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(q16.add(8 * i)));
    for j in kv.ranges(lo, hi).into_iter().flatten() {
        *scores.add(j - lo) = p.score(dot64(kv.k.add(j * kv.k_stride), &q));
    }
}

/// The online softmax's weights of cells `c0..c1` in place of their scores
/// (`scores[j - lo]` for cell `j`), with the libm `expf` calls in a loop of their own (a call
/// clobbers every vector register, so calls inside the weighted sum of V spill its
/// accumulator): where cell `j`'s score `s` raises the running maximum `M`, `-expf(M - s)`
/// (the accumulator's scale `ms`, sign bit set, also for 0); else `expf(s - M)` (the V
/// row's weight `vs`, sign bit clear). Returns the final maximum. The values are ggml's
/// (`_one_chunk`): each comes from the same maximum and the same `expf`.
///
/// # Safety
/// `scores` valid for the cells' reads and writes.
#[inline(always)]
unsafe fn softmax_weights(kv: &KvRows, lo: usize, c0: usize, c1: usize, scores: *mut f32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for j in kv.ranges(c0, c1).into_iter().flatten() {
        let x = scores.add(j - lo);
        let s = *x;
        if s > m {
            *x = -(m - s).exp();
            m = s;
        } else {
            *x = (s - m).exp();
        }
    }
    m
}

/// A weight of [`softmax_weights`] as `(ms, vs)`: the accumulator's scale and the V row's
/// weight (one of them 1).
#[inline(always)]
fn split_weight(x: f32) -> (f32, f32) {
    if x.is_sign_negative() {
        (-x, 1.0)
    } else {
        (1.0, x)
    }
}

/// [`one_chunk`] with the accumulator in registers: `NV` vectors of 8 (`d_v = 8·NV`). (The
/// scores are computed before, in a loop of their own: computing each in this loop is
/// slower, measured; so are the exponentials, [`softmax_weights`].)
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn one_chunk_reg<const NV: usize, const V: u8>(
    kv: &KvRows,
    lo: usize,
    c0: usize,
    c1: usize,
    scores: *mut f32,
    out: *mut f32,
) -> (f32, f32) {
    let m = softmax_weights(kv, lo, c0, c1, scores);
    let mut acc = [_mm256_setzero_ps(); NV];
    let mut sum = 0f32;
    for j in kv.ranges(c0, c1).into_iter().flatten() {
        let (ms, vs) = split_weight(*scores.add(j - lo));
        let vr = kv.v.add(j * kv.v_stride);
        if ms != 1.0 {
            let v = _mm256_set1_ps(ms);
            for a in acc.iter_mut() {
                *a = round_v8::<V>(_mm256_mul_ps(*a, v));
            }
        }
        let v = _mm256_set1_ps(vs);
        for (i, a) in acc.iter_mut().enumerate() {
            *a = round_v8::<V>(_mm256_fmadd_ps(load_v8::<V>(vr, 8 * i), v, *a));
        }
        sum = sum.mul_add(ms, vs);
    }
    for (i, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.add(8 * i), *a);
    }
    (m, sum)
}

/// `acc = round(acc · ms)` (to f16 for F16 V rows).
#[inline(always)]
unsafe fn scale_round<const SIMD: bool, const V: u8>(acc: *mut f32, d_v: usize, ms: f32) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        let m = _mm256_set1_ps(ms);
        while i + 8 <= d_v {
            let a = acc.add(i);
            _mm256_storeu_ps(a, round_v8::<V>(_mm256_mul_ps(_mm256_loadu_ps(a), m)));
            i += 8;
        }
    }
    for i in i..d_v {
        *acc.add(i) = round_v::<V>(*acc.add(i) * ms);
    }
}

/// `acc = round(fma(v, vs, acc))` (to f16 for F16 V rows).
#[inline(always)]
unsafe fn fma_round<const SIMD: bool, const V: u8>(
    acc: *mut f32,
    v: *const u8,
    vs: f32,
    d_v: usize,
) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        let s = _mm256_set1_ps(vs);
        while i + 8 <= d_v {
            let a = acc.add(i);
            let x = _mm256_fmadd_ps(load_v8::<V>(v, i), s, _mm256_loadu_ps(a));
            _mm256_storeu_ps(a, round_v8::<V>(x));
            i += 8;
        }
    }
    for i in i..d_v {
        *acc.add(i) = round_v::<V>(load_v::<V>(v, i).mul_add(vs, *acc.add(i)));
    }
}

/// The split-KV decode: chunks of `ceil(nek1 / threads)` cells, each by [`one_chunk`] into
/// `part`, merged in order into `out` (`fma(out, so, part · sn)`), then normalized.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split<const SIMD: bool>(
    kv: &KvRows,
    lo: usize,
    hi: usize,
    nek1: usize,
    threads: usize,
    scores: *mut f32,
    part: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    let nth = threads.max(1);
    let cs = nek1.div_ceil(nth);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for i in 0..d_v {
        *out.add(i) = 0.0;
    }
    for c in 0..nth {
        let c0 = c * cs;
        if c0 >= nek1 {
            continue;
        }
        let (a, b) = (c0.max(lo), (c0 + cs).min(nek1).min(hi));
        let (pm, ps) = one_chunk::<SIMD>(kv, lo, a, b.max(a), scores, part, d_v);
        if ps == 0.0 {
            continue;
        }
        let new = m.max(pm);
        let (so, sn) = ((m - new).exp(), (pm - new).exp());
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut i = 0;
        #[cfg(target_arch = "x86_64")]
        if SIMD {
            let (vo, vn) = (_mm256_set1_ps(so), _mm256_set1_ps(sn));
            while i + 8 <= d_v {
                let o = out.add(i);
                let y = _mm256_mul_ps(_mm256_loadu_ps(part.add(i)), vn);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), vo, y));
                i += 8;
            }
        }
        for i in i..d_v {
            *out.add(i) = (*out.add(i)).mul_add(so, *part.add(i) * sn);
        }
        sum = sum.mul_add(so, ps * sn);
        m = new;
    }
    if sum != 0.0 {
        let inv = 1.0 / sum;
        for i in 0..d_v {
            *out.add(i) *= inv;
        }
    }
}

/// Scratch floats [`tiled_query`] and [`tiled_queries`] need.
pub(crate) fn tiled_scratch(d_v: usize) -> usize {
    TILED_GROUP * (d_v + 2 * KV_TILE)
}

/// One query with the tiled kernel (module doc): `out[0..d_v]` from `q[0..d_k]` (f32) over
/// the visible cells `lo..hi`, reading keys from `kt` (transposed: cell `j`, dimension `d`
/// at `kt[d·ldk + j - t0]`) and values from `vf` (`vf[(j - t0)·d_v + d]`), both f32 copies
/// of cells `t0..hi` with `t0` a multiple of [`KV_TILE`] at most `lo`; `kt` rows are read up
/// to the end of `hi`'s tile (values past `hi` are masked, so any finite or not), so
/// `ldk ≥ ceil(hi - t0, KV_TILE)`. Cells `gap.0..gap.1` are masked too (a wrapped ring's
/// older positions; empty otherwise): tiles wholly inside it are skipped, as ggml skips a
/// tile whose mask is all -inf.
///
/// # Safety
/// As described; `scratch` holds [`tiled_scratch`] floats; `out` overlaps nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiled_query(
    q: *const f32,
    d_k: usize,
    lo: usize,
    hi: usize,
    gap: (usize, usize),
    t0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    p: &FlashParams,
    scratch: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && d_v.is_multiple_of(8) {
        return tiled_avx2(q, d_k, lo, hi, gap, t0, kt, ldk, vf, p, scratch, out, d_v);
    }
    tiled_scalar(q, d_k, lo, hi, gap, t0, kt, ldk, vf, p, scratch, out, d_v)
}

/// One query's online-softmax step over the tile at cell `tile`, its raw scores (dot
/// products) in `kq[0..KV_TILE]`: scaled (and soft-capped), cells outside `lo..hi` or in
/// `gap` set to -inf, the tile's maximum folded into `m` (rescaling `acc[0..d_v]` and `sum`
/// when it grows), the exponentials written to `e` and their grouped f64 sum added to
/// `sum`, as ggml's `ggml_vec_soft_max_f32` on AVX2. Returns false (nothing changed) when
/// every cell of the tile is masked.
///
/// # Safety
/// AVX2, FMA and F16C (inlined into such a caller); `kq` and `e` hold [`KV_TILE`] floats,
/// `acc` holds `d_v` floats, `d_v` a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn softmax_tile(
    kq: *mut f32,
    e: *mut f32,
    acc: *mut f32,
    d_v: usize,
    tile: usize,
    (lo, hi, gap): (usize, usize, (usize, usize)),
    p: &FlashParams,
    (m, sum): (&mut f32, &mut f32),
) -> bool {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale = _mm256_set1_ps(p.scale);
    let (vlo, vhi) = (
        _mm256_set1_epi32(lo as i32 - 1),
        _mm256_set1_epi32(hi as i32),
    );
    let (vg0, vg1) = (
        _mm256_set1_epi32(gap.0 as i32),
        _mm256_set1_epi32(gap.1 as i32 - 1),
    );
    let has_gap = gap.0 < gap.1;
    let mut vmax = ninf;
    for g in 0..KV_TILE / 8 {
        let mut s = _mm256_mul_ps(_mm256_loadu_ps(kq.add(8 * g)), scale);
        if p.cap != 0.0 {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), s);
            for x in &mut l {
                *x = x.tanh() * p.cap;
            }
            s = _mm256_loadu_ps(l.as_ptr());
        }
        // Cells outside lo..hi (or in the gap) are -inf.
        let j = _mm256_add_epi32(
            _mm256_set1_epi32((tile + 8 * g) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut ok = _mm256_and_si256(_mm256_cmpgt_epi32(j, vlo), _mm256_cmpgt_epi32(vhi, j));
        if has_gap {
            let out_of_gap =
                _mm256_or_si256(_mm256_cmpgt_epi32(vg0, j), _mm256_cmpgt_epi32(j, vg1));
            ok = _mm256_and_si256(ok, out_of_gap);
        }
        s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(ok));
        _mm256_storeu_ps(kq.add(8 * g), s);
        vmax = _mm256_max_ps(vmax, s);
    }
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), vmax);
    let tile_max = l.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
    if tile_max == f32::NEG_INFINITY {
        return false;
    }
    let new = m.max(tile_max);
    if new > *m {
        let ms = (*m - new).exp();
        let v = _mm256_set1_ps(ms);
        let mut i = 0;
        while i < d_v {
            _mm256_storeu_ps(acc.add(i), _mm256_mul_ps(_mm256_loadu_ps(acc.add(i)), v));
            i += 8;
        }
        *sum *= ms;
    }
    *m = new;
    let vm = _mm256_set1_ps(*m);
    let mut tsum = 0f64;
    for g in 0..KV_TILE / 8 {
        let x = exp256(_mm256_sub_ps(_mm256_loadu_ps(kq.add(8 * g)), vm));
        _mm256_storeu_ps(e.add(8 * g), x);
        tsum += hsum8(x) as f64;
    }
    *sum = (*sum as f64 + tsum) as f32;
    true
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled_avx2(
    q: *const f32,
    d_k: usize,
    lo: usize,
    hi: usize,
    gap: (usize, usize),
    t0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    p: &FlashParams,
    scratch: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    let acc = scratch;
    let kq = scratch.add(d_v);
    let e = kq.add(KV_TILE);
    for i in 0..d_v {
        *acc.add(i) = 0.0;
    }
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut tile = 0;
    while tile < hi {
        if tile + KV_TILE <= lo || (tile >= gap.0 && tile + KV_TILE <= gap.1) {
            tile += KV_TILE;
            continue;
        }
        // Scores of the tile's 8 groups of 8 cells: one chain of fused multiply-adds over
        // the head per cell (Q broadcast once per dimension for all groups).
        let mut c = [_mm256_setzero_ps(); KV_TILE / 8];
        let kp = kt.add(tile - t0);
        for d in 0..d_k {
            let qd = _mm256_broadcast_ss(&*q.add(d));
            let row = kp.add(d * ldk);
            for (g, a) in c.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row.add(8 * g)), *a);
            }
        }
        for (g, a) in c.iter().enumerate() {
            _mm256_storeu_ps(kq.add(8 * g), *a);
        }
        if !softmax_tile(kq, e, acc, d_v, tile, (lo, hi, gap), p, (&mut m, &mut sum)) {
            tile += KV_TILE;
            continue;
        }
        for tk in 0..KV_TILE {
            let j = tile + tk;
            if j >= hi {
                break;
            }
            let pj = *e.add(tk);
            if pj == 0.0 {
                continue;
            }
            let pv = _mm256_set1_ps(pj);
            let vr = vf.add((j - t0) * d_v);
            let mut i = 0;
            while i < d_v {
                let a = acc.add(i);
                _mm256_storeu_ps(
                    a,
                    _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr.add(i)), _mm256_loadu_ps(a)),
                );
                i += 8;
            }
        }
        tile += KV_TILE;
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for i in 0..d_v {
        *out.add(i) = *acc.add(i) * inv;
    }
}

/// One query of [`tiled_queries`]: its f32 row `q` (`d_k` values), its visible cells
/// `lo..hi` less `gap`, and its output row `out` (`d_v` values), as [`tiled_query`] takes
/// them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TiledQuery {
    pub q: *const f32,
    pub lo: usize,
    pub hi: usize,
    pub gap: (usize, usize),
    pub out: *mut f32,
}

impl TiledQuery {
    /// A query of no cells (a placeholder for a fixed buffer of them).
    pub(crate) const EMPTY: TiledQuery = TiledQuery {
        q: std::ptr::null(),
        lo: 0,
        hi: 0,
        gap: (0, 0),
        out: std::ptr::null_mut(),
    };
}

/// Queries [`tiled_queries`] computes together (a GQA group's heads, or a chunk's tokens):
/// each tile of keys and values is read once for all of them.
pub(crate) const TILED_GROUP: usize = 4;

/// [`tiled_query`] for several queries over the same converted cells (`kt`, `vf`, `t0`,
/// `ldk` as there): `out` of each query is what [`tiled_query`] gives it, bit for bit. With
/// AVX-512 and [`TILED_GROUP`] queries whose `d_v` is a multiple of 64, one pass computes
/// the group's scores from each key row (16 cells per register, four queries per load) and
/// adds each value row to the four accumulators held in registers; the arithmetic of every
/// lane is the 8-lane kernel's. Otherwise one query at a time.
///
/// # Safety
/// As [`tiled_query`] for each query; `scratch` holds [`tiled_scratch`] floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiled_queries(
    qs: &[TiledQuery],
    d_k: usize,
    t0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    p: &FlashParams,
    scratch: *mut f32,
    d_v: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if qs.len() == TILED_GROUP && d_v.is_multiple_of(64) && super::has_avx512() {
        let group: &[TiledQuery; TILED_GROUP] = qs.try_into().expect("checked length");
        return tiled4_avx512(group, d_k, t0, kt, ldk, vf, p, scratch, d_v);
    }
    for t in qs {
        tiled_query(
            t.q, d_k, t.lo, t.hi, t.gap, t0, kt, ldk, vf, p, scratch, t.out, d_v,
        );
    }
}

/// [`tiled_queries`] for [`TILED_GROUP`] queries on AVX-512 (`d_v` a multiple of 64).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled4_avx512(
    qs: &[TiledQuery; TILED_GROUP],
    d_k: usize,
    t0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    p: &FlashParams,
    scratch: *mut f32,
    d_v: usize,
) {
    const G: usize = TILED_GROUP;
    // Per query: its accumulator (d_v), the tile's scores and exponentials (KV_TILE each).
    let per = d_v + 2 * KV_TILE;
    let acc = |i: usize| scratch.add(i * per);
    let kq = |i: usize| scratch.add(i * per + d_v);
    let e = |i: usize| scratch.add(i * per + d_v + KV_TILE);
    for i in 0..G {
        for x in 0..d_v {
            *acc(i).add(x) = 0.0;
        }
    }
    let mut m = [f32::NEG_INFINITY; G];
    let mut sum = [0f32; G];
    let hi_all = qs.iter().map(|t| t.hi).max().unwrap_or(0);
    let mut tile = 0;
    while tile < hi_all {
        // The queries that see some cell of this tile (those that do not skip it).
        let sees = qs.map(|t| {
            tile < t.hi && tile + KV_TILE > t.lo && !(tile >= t.gap.0 && tile + KV_TILE <= t.gap.1)
        });
        if !sees.contains(&true) {
            tile += KV_TILE;
            continue;
        }
        // Scores: lane j of register g of query i is the chain of fused multiply-adds
        // over the head for cell tile + 16g + j, from 0, as the 8-lane kernel's.
        let mut c = [[_mm512_setzero_ps(); KV_TILE / 16]; G];
        let kp = kt.add(tile - t0);
        for d in 0..d_k {
            let row = kp.add(d * ldk);
            let k = [
                _mm512_loadu_ps(row),
                _mm512_loadu_ps(row.add(16)),
                _mm512_loadu_ps(row.add(32)),
                _mm512_loadu_ps(row.add(48)),
            ];
            for (i, ci) in c.iter_mut().enumerate() {
                let qd = _mm512_set1_ps(*qs[i].q.add(d));
                for (a, kg) in ci.iter_mut().zip(k) {
                    *a = _mm512_fmadd_ps(qd, kg, *a);
                }
            }
        }
        // Each query's online softmax over the tile, as the 8-lane kernel's.
        let mut live = [false; G];
        for i in 0..G {
            if !sees[i] {
                continue;
            }
            for (g, a) in c[i].iter().enumerate() {
                _mm512_storeu_ps(kq(i).add(16 * g), *a);
            }
            let t = &qs[i];
            let state = (&mut m[i], &mut sum[i]);
            live[i] = softmax_tile(
                kq(i),
                e(i),
                acc(i),
                d_v,
                tile,
                (t.lo, t.hi, t.gap),
                p,
                state,
            );
        }
        // Values: each 64-wide slice of the four accumulators stays in registers while
        // the tile's value rows are added in cell order (a query skips its zero weights
        // and the cells at or past its end, as the 8-lane kernel does).
        let end = (tile + KV_TILE).min(hi_all);
        let mut x = 0;
        while x < d_v {
            let mut a = [[_mm512_setzero_ps(); 4]; G];
            for i in 0..G {
                for (r, ar) in a[i].iter_mut().enumerate() {
                    *ar = _mm512_loadu_ps(acc(i).add(x + 16 * r));
                }
            }
            for j in tile..end {
                let vr = vf.add((j - t0) * d_v + x);
                let v = [
                    _mm512_loadu_ps(vr),
                    _mm512_loadu_ps(vr.add(16)),
                    _mm512_loadu_ps(vr.add(32)),
                    _mm512_loadu_ps(vr.add(48)),
                ];
                for i in 0..G {
                    if !live[i] || j >= qs[i].hi {
                        continue;
                    }
                    let pj = *e(i).add(j - tile);
                    if pj == 0.0 {
                        continue;
                    }
                    let pv = _mm512_set1_ps(pj);
                    for (ar, vg) in a[i].iter_mut().zip(v) {
                        *ar = _mm512_fmadd_ps(pv, vg, *ar);
                    }
                }
            }
            for i in 0..G {
                for (r, ar) in a[i].iter().enumerate() {
                    _mm512_storeu_ps(acc(i).add(x + 16 * r), *ar);
                }
            }
            x += 64;
        }
        tile += KV_TILE;
    }
    for i in 0..G {
        let inv = if sum[i] == 0.0 { 0.0 } else { 1.0 / sum[i] };
        for x in 0..d_v {
            *qs[i].out.add(x) = *acc(i).add(x) * inv;
        }
    }
}

/// [`tiled_query`] in scalar code (hosts without AVX2, or `d_v` not a multiple of 8).
#[allow(clippy::too_many_arguments)]
unsafe fn tiled_scalar(
    q: *const f32,
    d_k: usize,
    lo: usize,
    hi: usize,
    gap: (usize, usize),
    t0: usize,
    kt: *const f32,
    ldk: usize,
    vf: *const f32,
    p: &FlashParams,
    scratch: *mut f32,
    out: *mut f32,
    d_v: usize,
) {
    let acc = std::slice::from_raw_parts_mut(scratch, d_v);
    let kq = std::slice::from_raw_parts_mut(scratch.add(d_v), KV_TILE);
    let e = std::slice::from_raw_parts_mut(scratch.add(d_v + KV_TILE), KV_TILE);
    acc.fill(0.0);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for tile in (0..hi).step_by(KV_TILE) {
        if tile + KV_TILE <= lo || (tile >= gap.0 && tile + KV_TILE <= gap.1) {
            continue;
        }
        for (tk, s) in kq.iter_mut().enumerate() {
            let j = tile + tk;
            *s = if j >= lo && j < hi && !(j >= gap.0 && j < gap.1) {
                let mut c = 0f32;
                for d in 0..d_k {
                    c = (*q.add(d)).mul_add(*kt.add(d * ldk + j - t0), c);
                }
                let s = c * p.scale;
                if p.cap != 0.0 {
                    s.tanh() * p.cap
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
        sum = (sum as f64 + ir::ggml::cpu_math::soft_max_exp(kq, m, e)) as f32;
        for (tk, &pj) in e.iter().enumerate() {
            let j = tile + tk;
            if j >= hi {
                break;
            }
            if pj == 0.0 {
                continue;
            }
            let vr = vf.add((j - t0) * d_v);
            for (d, x) in acc.iter_mut().enumerate() {
                *x = pj.mul_add(*vr.add(d), *x);
            }
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (d, x) in acc.iter().enumerate() {
        *out.add(d) = x * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`query_group`] gives each query what [`query`] gives it alone, bit for bit: F16 and
    /// F32 rows, head sizes 64, 128 and 256 (and 80, which has no group form), groups of 1
    /// to 6 (more than [`GROUP`]), a ring's gap, a soft-cap, the split-KV path (a padded
    /// KV length of 512) and ubatches of several tokens (the reference kernel).
    #[test]
    fn query_groups_match_one_query_at_a_time() {
        let mut st = 11u64;
        let mut r = move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let n = 300usize;
        for (d, f16, cap, gap, nek1, n_tokens) in [
            (64usize, true, None, (0, 0), 512, 1),
            (64, true, None, (40, 90), 256, 1),
            (64, false, None, (0, 0), 256, 3),
            (128, true, Some(30.0f32), (0, 0), 512, 2),
            (256, false, Some(30.0), (10, 20), 512, 1),
            (256, true, None, (0, 0), 256, 1),
            (80, true, None, (0, 0), 256, 1),
        ] {
            let bytes = if f16 { 2 } else { 4 };
            let row = |r: &mut dyn FnMut() -> f32| -> Vec<u8> {
                (0..n * d)
                    .flat_map(|_| {
                        let x = r();
                        if f16 {
                            half::f16::from_f32(x).to_le_bytes().to_vec()
                        } else {
                            half::f16::from_f32(x).to_f32().to_le_bytes().to_vec()
                        }
                    })
                    .collect()
            };
            let (k, v) = (row(&mut r), row(&mut r));
            let kv = KvRows {
                k: k.as_ptr(),
                k_stride: bytes * d,
                v: v.as_ptr(),
                v_stride: bytes * d,
                f16,
                k_q8: false,
                v_q8: false,
                gap,
            };
            let p = FlashParams::new(1.0 / (d as f32).sqrt(), cap);
            let (lo, hi) = (3, 290);
            for len in 1..=6 {
                let qs: Vec<Vec<f32>> = (0..len)
                    .map(|_| (0..d).map(|_| r() * 4.0).collect())
                    .collect();
                let mut outs = vec![vec![f32::NAN; d]; len];
                let qp: Vec<*const f32> = qs.iter().map(|q| q.as_ptr()).collect();
                let op: Vec<*mut f32> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
                let mut scratch = vec![f32::NAN; group_scratch(d, d, n)];
                unsafe {
                    query_group(
                        &qp,
                        &op,
                        d,
                        &kv,
                        (lo, hi),
                        (n_tokens, nek1, 4),
                        &p,
                        scratch.as_mut_ptr(),
                        d,
                    )
                };
                for (q, got) in qs.iter().zip(&outs) {
                    let mut want = vec![0f32; d];
                    let mut scratch = vec![f32::NAN; query_scratch(d, d, n)];
                    unsafe {
                        query(
                            q.as_ptr(),
                            d,
                            &kv,
                            lo,
                            hi,
                            n_tokens,
                            nek1,
                            4,
                            &p,
                            scratch.as_mut_ptr(),
                            want.as_mut_ptr(),
                            d,
                        )
                    };
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "d {d}, f16 {f16}, group of {len}: {got:?} != {want:?}"
                    );
                }
            }
        }
    }

    /// A group of queries gives each query what it gets alone, bit for bit: different
    /// visible ranges (causal ends, a sliding window's starts, a wrapped ring's gap), a
    /// soft-cap, head sizes 64 and 256 (SmolLM2's, Gemma 3's), groups of 1 to 4.
    #[test]
    fn tiled_queries_match_one_query_at_a_time() {
        let mut st = 7u64;
        let mut r = move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for (d, cap) in [(64usize, None), (256, Some(30.0f32)), (128, None)] {
            let (t0, n) = (64usize, 300usize);
            let ldk = (n - t0).next_multiple_of(KV_TILE) + KV_TILE;
            let kt: Vec<f32> = (0..d * ldk).map(|_| r() * 2.0).collect();
            let vf: Vec<f32> = (0..ldk * d).map(|_| r()).collect();
            let qs: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..d).map(|_| r() * 3.0).collect())
                .collect();
            let p = FlashParams::new(1.0 / (d as f32).sqrt(), cap);
            let ranges = [
                (70, 200, (0, 0)),
                (64, 201, (0, 0)),
                (100, 300, (130, 260)),
                (250, 290, (0, 0)),
            ];
            for len in 1..=TILED_GROUP {
                let mut outs = vec![vec![f32::NAN; d]; len];
                let group: Vec<TiledQuery> = (0..len)
                    .map(|i| TiledQuery {
                        q: qs[i].as_ptr(),
                        lo: ranges[i].0,
                        hi: ranges[i].1,
                        gap: ranges[i].2,
                        out: outs[i].as_mut_ptr(),
                    })
                    .collect();
                let mut scratch = vec![0f32; tiled_scratch(d)];
                unsafe {
                    tiled_queries(
                        &group,
                        d,
                        t0,
                        kt.as_ptr(),
                        ldk,
                        vf.as_ptr(),
                        &p,
                        scratch.as_mut_ptr(),
                        d,
                    )
                };
                for (i, t) in group.iter().enumerate() {
                    let mut want = vec![0f32; d];
                    unsafe {
                        tiled_query(
                            t.q,
                            d,
                            t.lo,
                            t.hi,
                            t.gap,
                            t0,
                            kt.as_ptr(),
                            ldk,
                            vf.as_ptr(),
                            &p,
                            scratch.as_mut_ptr(),
                            want.as_mut_ptr(),
                            d,
                        )
                    };
                    let same = want
                        .iter()
                        .zip(&outs[i])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "d {d}, group of {len}, query {i}: differs from one query alone"
                    );
                }
            }
        }
    }

    /// Time of one head over 1000 cells (min of many), flash reference vs soft_max path.
    #[test]
    #[ignore = "timing: cargo test --release -p codegen-cpu --lib flash_head_timing -- --ignored --nocapture"]
    fn flash_head_timing() {
        let (d, n) = (64usize, 1000usize);
        let mut st = 1u64;
        let mut r = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let k: Vec<u16> = (0..n * d)
            .map(|_| half::f16::from_f32(r()).to_bits())
            .collect();
        let v: Vec<u16> = (0..n * d)
            .map(|_| half::f16::from_f32(r()).to_bits())
            .collect();
        let q: Vec<f32> = (0..d).map(|_| r() * 3.0).collect();
        let kv = KvRows {
            k: k.as_ptr() as *const u8,
            k_stride: 2 * d,
            v: v.as_ptr() as *const u8,
            v_stride: 2 * d,
            f16: true,
            k_q8: false,
            v_q8: false,
            gap: (0, 0),
        };
        let p = FlashParams::new(0.125, None);
        let mut scratch = vec![0f32; query_scratch(d, d, n) + 4096];
        let mut out = vec![0f32; d];
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..200 {
                let t = std::time::Instant::now();
                f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            best * 1e6
        };
        for nek1 in [256usize, 1024] {
            let us = time(&mut || unsafe {
                query(
                    q.as_ptr(),
                    d,
                    &kv,
                    0,
                    n,
                    1,
                    nek1,
                    2,
                    &p,
                    scratch.as_mut_ptr(),
                    out.as_mut_ptr(),
                    d,
                )
            });
            println!("flash one head, {n} cells, nek1 {nek1}: {us:.1} µs");
        }
        let sp = super::super::attention::ScoreParams {
            kq_scale: 0.125,
            softcap: None,
        };
        let mut sm = vec![0f32; super::super::soft_max_attn::exact_scratch(d, d, n)];
        let us = time(&mut || unsafe {
            super::super::soft_max_attn::attend_exact(&super::super::soft_max_attn::ExactQuery {
                q: q.as_ptr(),
                d_k: d,
                kv: &kv,
                lo: 0,
                hi: n,
                batch: false,
                p: &sp,
                scratch: sm.as_mut_ptr(),
                out: out.as_mut_ptr(),
                d_v: d,
            })
        });
        println!("soft_max path one head, {n} cells: {us:.1} µs");
        #[cfg(target_arch = "x86_64")]
        {
            let sc = scratch.as_mut_ptr();
            let us = time(&mut || unsafe { scores_only(&kv, q.as_ptr(), n, &p, sc) });
            println!("  of which scores: {us:.1} µs");
            let us = time(&mut || unsafe { chunk_only(&kv, n, sc, out.as_mut_ptr()) });
            println!("  of which the online softmax: {us:.1} µs");
            let us = time(&mut || {
                let mut a = 0f32;
                for j in 0..n {
                    a += (scratch[j] - 1.0).exp();
                }
                std::hint::black_box(a);
            });
            println!("  expf alone: {us:.1} µs");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_only(kv: &KvRows, q: *const f32, n: usize, p: &FlashParams, sc: *mut f32) {
        scores64(kv, q, 0, n, p, sc.add(1024));
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk_only(kv: &KvRows, n: usize, sc: *mut f32, out: *mut f32) {
        std::hint::black_box(one_chunk_reg::<8, V_F16>(kv, 0, 0, n, sc.add(1024), out));
    }
}
