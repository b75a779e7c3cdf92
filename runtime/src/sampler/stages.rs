//! The transforms of llama.cpp's sampler chain on a candidate list (`src/llama-sampler.cpp`,
//! commit 0c1e570): each takes the candidates in their current order and keeps llama.cpp's
//! arithmetic (f32 softmax with an f32 sum, `logf` / `powf` / `log2f`, the order of each
//! sum), so that with llama.cpp's logits a seeded chain draws llama.cpp's tokens.
//!
//! Where llama.cpp sorts (`std::partial_sort`, its bucket sort), candidates with equal logits
//! are ordered by id here ([`rank`]); llama.cpp's order among exact ties is its sort's.

use super::Cand;
use crate::mt19937::Mt19937;

/// Candidates and whether they are sorted by logit, descending (llama.cpp's
/// `llama_token_data_array` with its `sorted` flag).
#[derive(Default)]
pub struct Cands {
    pub v: Vec<Cand>,
    pub sorted: bool,
}

/// Descending logit (`total_cmp`), ties by id: the order every sort here gives.
pub fn rank(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

impl Cands {
    /// Sorts all candidates ([`rank`]) unless they are sorted.
    fn sort(&mut self) {
        if !self.sorted {
            self.v.sort_by(rank);
            self.sorted = true;
        }
    }

    /// `llama_sampler_softmax_impl`: (sorting first with `do_sort`) `p_i = expf(l_i - max)`
    /// in the current order, their f32 sum, then each divided by it.
    pub fn softmax(&mut self, do_sort: bool) {
        if self.v.is_empty() {
            return;
        }
        if do_sort {
            self.sort();
        }
        let max = if self.sorted {
            self.v[0].logit
        } else {
            self.v
                .iter()
                .skip(1)
                .fold(self.v[0].logit, |m, c| m.max(c.logit))
        };
        let mut sum = 0f32;
        for c in self.v.iter_mut() {
            c.p = (c.logit - max).exp();
            sum += c.p;
        }
        for c in self.v.iter_mut() {
            c.p /= sum;
        }
    }
}

/// `llama_sampler_temp_impl`: logits divided by `temp`; `temp <= 0` keeps the first
/// largest logit (in the current order) and sets every other to `-inf`.
pub fn temp(c: &mut Cands, temp: f32) {
    if c.v.is_empty() {
        return;
    }
    if temp <= 0.0 {
        let mut best = 0;
        for i in 1..c.v.len() {
            if c.v[i].logit > c.v[best].logit {
                c.v[best].logit = f32::NEG_INFINITY;
                best = i;
            } else {
                c.v[i].logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for x in c.v.iter_mut() {
        x.logit /= temp;
    }
}

/// `llama_sampler_temp_ext`: with `delta > 0` (llama.cpp's dynamic temperature,
/// `--dynatemp-range`) the temperature `min + (max - min) · (H / H_max)^exponent` from the
/// entropy `H` of the sorted softmax (`[min, max] = [temp - delta, temp + delta]`, `min`
/// at least 0), then the probabilities again in f64; else [`temp`].
pub fn temp_ext(c: &mut Cands, t: f32, delta: f32, exponent: f32) {
    if delta <= 0.0 {
        temp(c, t);
        return;
    }
    let (min_temp, max_temp) = ((t - delta).max(0.0), t + delta);
    if c.v.len() <= 1 {
        return;
    }
    let max_entropy = -(1.0f32 / c.v.len() as f32).ln();
    c.softmax(true);
    let mut entropy = 0f32;
    for x in &c.v {
        if x.p > 0.0 {
            entropy -= x.p * x.p.ln();
        }
    }
    let normalized = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
    temp(c, dyn_temp);
    let max = f64::from(c.v[0].logit);
    let mut sum = 0f64;
    for x in c.v.iter_mut() {
        let p = (f64::from(x.logit) - max).exp();
        x.p = p as f32;
        sum += p;
    }
    for x in c.v.iter_mut() {
        x.p = (f64::from(x.p) / sum) as f32;
    }
}

/// `llama_sampler_top_k_impl`: the `k` best (sorted); `k <= 0` changes nothing.
pub fn top_k(c: &mut Cands, k: i32) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).min(c.v.len());
    if !c.sorted {
        if k > 0 && k < c.v.len() {
            c.v.select_nth_unstable_by(k - 1, rank);
        }
        c.v.truncate(k);
        c.v.sort_by(rank);
        c.sorted = true;
    }
    c.v.truncate(k);
}

/// `llama_sampler_top_p`: the softmax in the current order, then in descending order the
/// shortest prefix whose f32 running sum reaches `p` with at least `min_keep` candidates.
pub fn top_p(c: &mut Cands, p: f32, min_keep: usize) {
    if p >= 1.0 || c.v.is_empty() {
        return;
    }
    c.softmax(false);
    c.sort();
    let mut cum = 0f32;
    let mut keep = c.v.len();
    for (i, x) in c.v.iter().enumerate() {
        cum += x.p;
        if cum >= p && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    c.v.truncate(keep);
}

/// `llama_sampler_min_p`: the candidates whose logit is at least the largest plus `logf(p)`
/// (probability at least `p` times the top one), in their order when unsorted (unless fewer
/// than `min_keep` remain); sorted, the prefix that does, at least the first and
/// `min_keep`.
pub fn min_p(c: &mut Cands, p: f32, min_keep: usize) {
    if p <= 0.0 || c.v.is_empty() {
        return;
    }
    if !c.sorted {
        let max = c.v.iter().fold(f32::MIN, |m, x| m.max(x.logit));
        let min_logit = max + p.ln();
        let n = c.v.iter().filter(|x| x.logit >= min_logit).count();
        if n > 0 && n >= min_keep {
            c.v.retain(|x| x.logit >= min_logit);
            return;
        }
        c.sort();
    }
    let min_logit = c.v[0].logit + p.ln();
    let mut i = 1;
    while i < c.v.len() && !(c.v[i].logit < min_logit && i >= min_keep) {
        i += 1;
    }
    c.v.truncate(i);
}

/// `llama_sampler_typical` (locally typical sampling): the sorted softmax and its f32
/// entropy `H`; candidates ordered by `|-logf(p) - H|` with libstdc++'s `std::sort` (a
/// candidate of probability 0 makes `H`, and so every score, NaN: the order is then that
/// sort's permutation, [`super::std_sort`]), the shortest prefix of that order whose f32
/// running sum of `p` exceeds `p` (and holds `min_keep`); the result unsorted.
pub fn typical(c: &mut Cands, p: f32, min_keep: usize, scratch: &mut Vec<(f32, usize)>) {
    if p >= 1.0 || c.v.is_empty() {
        return;
    }
    c.softmax(true);
    let mut entropy = 0f32;
    for x in &c.v {
        entropy += -x.p * x.p.ln();
    }
    scratch.clear();
    scratch.extend(
        c.v.iter()
            .enumerate()
            .map(|(i, x)| ((-x.p.ln() - entropy).abs(), i)),
    );
    super::std_sort::sort_by(scratch, &|a: &(f32, usize), b: &(f32, usize)| a.0 < b.0);
    let mut cum = 0f32;
    let mut keep = scratch.len();
    for (i, &(_, idx)) in scratch.iter().enumerate() {
        cum += c.v[idx].p;
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            keep = i + 1;
            break;
        }
    }
    let kept: Vec<Cand> = scratch[..keep].iter().map(|&(_, i)| c.v[i]).collect();
    c.v = kept;
    c.sorted = false;
}

/// `llama_sampler_top_n_sigma`: logits below `max - n·σ` set to `-inf` (the mean and σ
/// over the finite-from-below logits: an f32 sum, squares from `pow` in double added to an
/// f32). `n <= 0` or a single candidate changes nothing.
pub fn top_n_sigma(c: &mut Cands, n: f32) {
    if n <= 0.0 || c.v.len() <= 1 {
        return;
    }
    let mut max = c.v[0].logit;
    let mut sum = 0f32;
    let mut count = 0usize;
    for x in &c.v {
        if x.logit != f32::NEG_INFINITY {
            max = max.max(x.logit);
            sum += x.logit;
            count += 1;
        }
    }
    let mean = if count > 0 { sum / count as f32 } else { 0.0 };
    let mut acc = 0f32;
    for x in &c.v {
        if x.logit != f32::NEG_INFINITY {
            acc = (f64::from(acc) + f64::from(x.logit - mean).powi(2)) as f32;
        }
    }
    let std = if count > 0 {
        (acc / count as f32).sqrt()
    } else {
        0.0
    };
    for x in c.v.iter_mut() {
        if x.logit < max - n * std {
            x.logit = f32::NEG_INFINITY;
        }
    }
}

/// `llama_sample_xtc_apply` (exclude top choices): with probability `probability` (one
/// `uniform_real_distribution<float>` draw from the sampler's own `rng`), the sorted
/// softmax's leading candidates with `p >= threshold` are removed but for the last of them
/// (where at least `min_keep` remain). Draws only when `probability > 0`, `threshold <=
/// 0.5` and there are two candidates or more.
pub fn xtc(c: &mut Cands, probability: f32, threshold: f32, min_keep: usize, rng: &mut Mt19937) {
    if probability <= 0.0 || threshold > 0.5 || c.v.len() < 2 {
        return;
    }
    if rng.canonical_f32() > probability {
        return;
    }
    c.softmax(true);
    let mut last = 0;
    for (i, x) in c.v.iter().enumerate() {
        if x.p >= threshold {
            last = i;
        } else {
            break;
        }
    }
    if c.v.len() - last >= min_keep && last > 0 {
        c.v.drain(..last);
    }
}

/// `llama_sampler_penalties`: for the recent tokens (`counts`: id → occurrences), a
/// positive logit divided by `repeat`, a non-positive one multiplied by it, then
/// `count · freq + present` subtracted; the candidates are then taken as unsorted (also
/// when nothing was recent), as llama.cpp marks them.
pub fn penalties(
    c: &mut Cands,
    counts: &std::collections::HashMap<u32, u32>,
    repeat: f32,
    freq: f32,
    present: f32,
) {
    for x in c.v.iter_mut() {
        let Some(&n) = counts.get(&x.id) else {
            continue;
        };
        if x.logit <= 0.0 {
            x.logit *= repeat;
        } else {
            x.logit /= repeat;
        }
        x.logit -= n as f32 * freq + present;
    }
    c.sorted = false;
}

/// `llama_sample_dist`: `std::discrete_distribution<int>` over the candidates' `p` with
/// libstdc++'s arithmetic (weights summed in f64, normalized, their running f64 sums with
/// the last set to 1, the first at least one `generate_canonical<double>` draw); a single
/// candidate is chosen without a draw.
pub fn discrete(c: &Cands, rng: &mut Mt19937) -> usize {
    if c.v.len() < 2 {
        return 0;
    }
    let sum: f64 = c.v.iter().fold(0.0, |s, x| s + f64::from(x.p));
    let u = rng.canonical_f64();
    let mut cum = 0f64;
    for (i, x) in c.v.iter().enumerate() {
        cum += f64::from(x.p) / sum;
        if i + 1 == c.v.len() || cum >= u {
            return i;
        }
    }
    c.v.len() - 1
}

/// Mirostat (`llama_sampler_mirostat_apply`, version 1): `s_hat` from the `m` most likely
/// candidates, `k` from it and `mu`, top-k, the softmax, a [`discrete`] draw, then `mu`
/// moved by `eta` towards the target surprise `tau`. Returns the chosen index.
pub fn mirostat(
    c: &mut Cands,
    (n_vocab, m, tau, eta): (usize, usize, f32, f32),
    mu: &mut f32,
    rng: &mut Mt19937,
) -> usize {
    c.softmax(true);
    let (mut sum_ti_bi, mut sum_ti_sq) = (0f32, 0f32);
    let mut i = 0;
    while i + 1 < m && i + 1 < c.v.len() {
        let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b_i = (c.v[i].p / c.v[i + 1].p).ln();
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
        i += 1;
    }
    let s_hat = sum_ti_bi / sum_ti_sq;
    let epsilon_hat = s_hat - 1.0;
    let k = ((epsilon_hat * 2f32.powf(*mu)) / (1.0 - (n_vocab as f32).powf(-epsilon_hat)))
        .powf(1.0 / s_hat);
    // C's `int(k)`: toward zero; NaN and out-of-range values (not in the range) as x86's
    // conversion gives them.
    let k = if !(-2_147_483_648.0..2_147_483_648.0).contains(&k) {
        i32::MIN
    } else {
        k as i32
    };
    top_k(c, k.max(1));
    c.softmax(true);
    let idx = discrete(c, rng);
    let observed = -c.v[idx].p.log2();
    *mu -= eta * (observed - tau);
    idx
}

/// Mirostat 2.0 (`llama_sampler_mirostat_v2_apply`): the sorted softmax cut before the
/// first candidate whose surprise `-log2f(p)` exceeds `mu` (at least one kept), the softmax
/// again, a [`discrete`] draw, then `mu` moved by `eta` towards `tau`. Returns the chosen
/// index.
pub fn mirostat_v2(
    c: &mut Cands,
    (tau, eta): (f32, f32),
    mu: &mut f32,
    rng: &mut Mt19937,
) -> usize {
    c.softmax(true);
    let keep =
        c.v.iter()
            .position(|x| -x.p.log2() > *mu)
            .unwrap_or(c.v.len());
    c.v.truncate(keep.max(1));
    c.softmax(true);
    let idx = discrete(c, rng);
    let observed = -c.v[idx].p.log2();
    *mu -= eta * (observed - tau);
    idx
}
