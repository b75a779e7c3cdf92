//! Token sampling: a chain applied in llama.cpp's default order (`common/sampling.cpp`,
//! `src/llama-sampling.cpp`): repetition penalties, top-k, top-p, min-p, temperature, then
//! the random draw. `temp <= 0` keeps only the most likely token (greedy; ties go to the
//! lowest id), exactly as llama.cpp's `temp_ext` sampler does before its `dist` sampler.
//!
//! Each step does llama.cpp's arithmetic (f32 softmax and running sum in top-p, `logf` in
//! min-p, f32 exponentials summed in f64 in the draw) in its candidate order (sorted by top-k
//! or top-p, else in id order), and the draw takes one `[0, 1)` double from `std::mt19937`
//! seeded with `-s` as libstdc++ makes it ([`crate::mt19937`]): with the same seed and
//! llama.cpp's logits, the same tokens as llama.cpp (`tests/sampling_llama_cpp.rs`).

use crate::mt19937::Mt19937;
use std::collections::VecDeque;

pub mod dry;

/// A candidate token of the chain: llama.cpp's `llama_token_data` (id, logit, and the
/// probability the last softmax of the chain gave it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Sampler settings, with llama.cpp's defaults and flag names.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SamplerParams {
    /// `--temp`: logits are divided by it; `<= 0` means greedy. Default 0.8.
    pub temp: f32,
    /// `--top-k`: keep the k most likely tokens; `<= 0` disables. Default 40.
    pub top_k: i32,
    /// `--top-p`: keep the smallest set whose probability mass reaches p; 1 disables. Default 0.95.
    pub top_p: f32,
    /// `--min-p`: drop tokens below `min_p` times the top probability; 0 disables. Default 0.05.
    pub min_p: f32,
    /// `--repeat-penalty`: divide positive (multiply negative) logits of recent tokens; 1 disables.
    pub repeat_penalty: f32,
    /// `--repeat-last-n`: how many recent tokens the penalties look at; 0 disables, -1 = context.
    pub repeat_last_n: i32,
    /// `--frequency-penalty`: subtracted once per occurrence of a recent token. Default 0.
    pub frequency_penalty: f32,
    /// `--presence-penalty`: subtracted once for any recent token. Default 0.
    pub presence_penalty: f32,
    /// `-s/--seed`: seed of the random draw (`std::mt19937`; the low 32 bits, as llama.cpp).
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0xFFFF_FFFF,
        }
    }
}

/// A sampler with its random state and the history the penalties look at.
pub struct Sampler {
    params: SamplerParams,
    rng: Mt19937,
    history: VecDeque<u32>,
    history_cap: usize,
    candidates: Vec<(u32, f32)>,
    /// Scratch: the candidates' unnormalized probabilities.
    probs: Vec<f32>,
}

impl Sampler {
    /// A sampler for `params`; `n_ctx` bounds the penalty history when `repeat_last_n` is -1.
    pub fn new(params: SamplerParams, n_ctx: usize) -> Sampler {
        let history_cap = match params.repeat_last_n {
            n if n < 0 => n_ctx,
            n => n as usize,
        };
        Sampler {
            // llama.cpp's seed is 32 bits: larger values wrap, as its uint32_t does.
            rng: Mt19937::new(params.seed as u32),
            params,
            history: VecDeque::with_capacity(history_cap),
            history_cap,
            candidates: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Records a token that was emitted (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.history_cap == 0 {
            return;
        }
        if self.history.len() == self.history_cap {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Chooses the next token from `logits` (one value per vocabulary entry).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params.clone();
        let mut cand = std::mem::take(&mut self.candidates);
        cand.clear();
        if p.temp <= 0.0 && !self.penalizes() {
            // Greedy with nothing to penalize: the choice straight from the logits (no
            // candidate list: a server step samples one per sequence, each over the whole
            // vocabulary), kept as the only candidate for `post_sampling_probs`.
            self.rng.canonical_f64();
            let token = argmax_logits(logits);
            if let Some(&l) = logits.get(token as usize) {
                cand.push((token, l));
            }
            self.candidates = cand;
            return token;
        }
        let mut sorted = false;
        let k = usize::try_from(p.top_k).unwrap_or(0);
        if p.temp > 0.0 && !self.penalizes() && k > 0 && k < logits.len() {
            // Top-k straight from the logits: one pass that keeps the k best, not a list
            // of the whole vocabulary and a selection in it (~5× less time at k = 40 over
            // 49152 logits, for every sequence of every server step).
            top_k_of_logits(logits, k, &mut cand);
            sorted = true;
        } else {
            cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
            self.apply_penalties(&mut cand);
        }
        let token = if p.temp <= 0.0 {
            // llama.cpp's dist sampler still draws once from its single candidate.
            self.rng.canonical_f64();
            argmax(&cand)
        } else {
            top_k(&mut cand, &mut sorted, p.top_k);
            top_p(&mut cand, &mut sorted, p.top_p, &mut self.probs);
            min_p(&mut cand, sorted, p.min_p);
            for c in cand.iter_mut() {
                c.1 /= p.temp;
            }
            self.draw(&cand)
        };
        self.candidates = cand;
        token
    }

    /// The probabilities after the last [`Sampler::sample`]'s chain (penalties, top-k,
    /// top-p, min-p, temperature: the softmax of what the final draw chose from), the `n`
    /// most likely first (ties by id) — llama-server's `post_sampling_probs`. Greedy
    /// (`temp <= 0`) chose with certainty: the chosen token alone, with probability 1.
    pub fn post_sampling_probs(&self, n: usize) -> Vec<(u32, f32)> {
        let cand = &self.candidates;
        if self.params.temp <= 0.0 {
            return vec![(argmax(cand), 1.0)];
        }
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = cand.iter().map(|c| f64::from(c.1 - max).exp()).sum();
        let mut out: Vec<(u32, f32)> = cand
            .iter()
            .map(|c| (c.0, (f64::from(c.1 - max).exp() / sum) as f32))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out.truncate(n.max(1));
        out
    }

    /// Whether the penalties change any logit now (one is set and the history is not empty).
    fn penalizes(&self) -> bool {
        let p = &self.params;
        let active =
            p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
        active && !self.history.is_empty()
    }

    fn apply_penalties(&self, cand: &mut [(u32, f32)]) {
        if !self.penalizes() {
            return;
        }
        let p = &self.params;
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in &self.history {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(c) = cand.get_mut(t as usize) else {
                continue;
            };
            if c.1 <= 0.0 {
                c.1 *= p.repeat_penalty;
            } else {
                c.1 /= p.repeat_penalty;
            }
            c.1 -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// llama.cpp's `dist` sampler (`llama_sampler_dist_apply`): `p_i = expf(l_i - max)` in
    /// f32, their sum in f64, one draw `u` in `[0, 1)` ([`Mt19937::canonical_f64`]), and the
    /// first candidate, in the chain's current order, at which the running f64 sum reaches
    /// `sum · u`. One candidate: still one draw.
    fn draw(&mut self, cand: &[(u32, f32)]) -> u32 {
        let u = self.rng.canonical_f64();
        if cand.len() <= 1 {
            return cand.first().map_or(0, |c| c.0);
        }
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        self.probs.extend(cand.iter().map(|c| (c.1 - max).exp()));
        let sum: f64 = self.probs.iter().map(|&p| f64::from(p)).sum();
        let target = sum * u;
        let mut run = 0f64;
        for (c, &p) in cand.iter().zip(&self.probs) {
            run += f64::from(p);
            if run >= target {
                return c.0;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }
}

/// The most likely candidate; ties go to the lowest id.
fn argmax(cand: &[(u32, f32)]) -> u32 {
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    for &(id, l) in cand {
        if l > best.1 || (l == best.1 && id < best.0) {
            best = (id, l);
        }
    }
    if best.0 == u32::MAX {
        0
    } else {
        best.0
    }
}

/// [`argmax`] of the logits themselves (candidate `i` is id `i`): the lowest id of the
/// largest value, NaN never chosen, 0 when nothing is chosen: the maximum, then its first
/// position.
fn argmax_logits(logits: &[f32]) -> u32 {
    // Sixteen running maxima (vectorized: one `maxps` per 16 logits), NaN skipped by the
    // comparison; which of ±0 wins does not matter, `==` finds either.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = if l > *m { l } else { *m };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    logits
        .iter()
        .position(|&l| l == max)
        .map_or(0, |i| i as u32)
}

/// Sorts the candidates by logit, descending (ties by id).
fn sort_desc(cand: &mut [(u32, f32)]) {
    cand.sort_by(rank);
}

/// The order of [`sort_desc`]: logit descending by `total_cmp`, ties by id.
fn rank(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// llama.cpp's `top_k`: with `k > 0`, the `k` highest logits, sorted descending (ties by id);
/// `k <= 0` leaves the candidates as they are (unsorted).
fn top_k(cand: &mut Vec<(u32, f32)>, sorted: &mut bool, k: i32) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).min(cand.len());
    if !*sorted && k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, rank);
    }
    cand.truncate(k);
    sort_desc(cand);
    *sorted = true;
}

/// Whether candidate `a` comes before `b` in [`rank`]'s order.
fn ranks_before(a: (u32, f32), b: (u32, f32)) -> bool {
    rank(&a, &b) == std::cmp::Ordering::Less
}

/// [`top_k`] of the whole vocabulary (candidate `i` is id `i` with `logits[i]`) into `out`,
/// sorted: the same `k` candidates in the same order, found in one pass that keeps the best
/// `k` so far (sorted; most logits fail the one comparison with the last of them).
fn top_k_of_logits(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if k == 0 {
        return;
    }
    const CHUNK: usize = 32;
    for (ci, chunk) in logits.chunks(CHUNK).enumerate() {
        // A chunk with every logit below the k-th best so far changes nothing: a plain
        // comparison, false whenever a NaN is involved, which then takes the full one (a
        // NaN with the sign bit set, x86's default NaN, ranks last in `total_cmp`).
        if out.len() == k {
            let worst = out[k - 1].1;
            #[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must count as "not below"
            let any = chunk.iter().fold(false, |any, &l| any | !(l < worst));
            if !any {
                continue;
            }
        }
        for (j, &l) in chunk.iter().enumerate() {
            let c = ((ci * CHUNK + j) as u32, l);
            if out.len() == k {
                if !ranks_before(c, out[k - 1]) {
                    continue;
                }
                out.pop();
            }
            let at = out.partition_point(|&o| ranks_before(o, c));
            out.insert(at, c);
        }
    }
}

/// llama.cpp's `top_p`: the softmax in f32 (`expf(l - max)`, an f32 sum, each divided by it),
/// then, in descending order, the shortest prefix whose f32 running sum reaches `p` (at
/// least one candidate). Leaves the candidates sorted.
fn top_p(cand: &mut Vec<(u32, f32)>, sorted: &mut bool, p: f32, probs: &mut Vec<f32>) {
    if p >= 1.0 || cand.is_empty() {
        return;
    }
    if !*sorted {
        sort_desc(cand);
        *sorted = true;
    }
    let max = cand[0].1;
    probs.clear();
    probs.extend(cand.iter().map(|c| (c.1 - max).exp()));
    let total: f32 = probs.iter().sum();
    let mut cum = 0f32;
    let mut keep = cand.len();
    for (i, &q) in probs.iter().enumerate() {
        cum += q / total;
        if cum >= p {
            keep = i + 1;
            break;
        }
    }
    cand.truncate(keep.max(1));
}

/// llama.cpp's `min_p`: drops candidates whose probability is below `p` times the top one,
/// in logit space (`logit >= max_logit + logf(p)`), keeping the order (a sorted list keeps
/// its prefix; at least one candidate).
fn min_p(cand: &mut Vec<(u32, f32)>, sorted: bool, p: f32) {
    if p <= 0.0 || cand.is_empty() {
        return;
    }
    let max = if sorted {
        cand[0].1
    } else {
        cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max)
    };
    let threshold = max + p.ln();
    if sorted {
        let keep = cand.iter().skip(1).take_while(|c| c.1 >= threshold).count() + 1;
        cand.truncate(keep);
    } else {
        cand.retain(|c| c.1 >= threshold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(
            SamplerParams {
                temp: 0.0,
                ..Default::default()
            },
            16,
        );
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    /// The greedy shortcut over the logits chooses what the candidate list's argmax does:
    /// ties, NaN, infinities, nothing at all.
    #[test]
    fn greedy_from_logits_is_the_candidates_argmax() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![nan, nan],
            vec![-inf, -inf, nan],
            vec![nan, -inf, 1.0, 1.0],
            vec![nan, 2.0, inf, inf, 3.0],
            vec![0.0, -0.0],
            vec![-0.0, 0.0],
        ];
        // And pseudo-random logits with many ties (values in a small set).
        let mut x = 0x2545_f491_u32;
        let random = (0..200).map(|_| {
            (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x % 7) as f32 - 3.0
                })
                .collect::<Vec<f32>>()
        });
        for logits in cases.into_iter().chain(random) {
            let cand: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            assert_eq!(argmax_logits(&logits), argmax(&cand), "{logits:?}");
        }
    }

    /// The one-pass top-k keeps what the selection in the whole list keeps, in its order:
    /// ties across the cut, NaN (first in `total_cmp`'s descending order), infinities, k
    /// from 1 to past the vocabulary.
    #[test]
    fn top_k_from_logits_is_the_selection() {
        let mut x = 0x9e37_79b9_u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        // Each round draws from one palette: some with the special values, some of few
        // values (long runs of ties, ±0 cuts in whole chunks of the scan).
        let palettes: [&[f32]; 4] = [
            &[
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -0.0,
                -2.0,
                -1.0,
                0.0,
                1.0,
                2.0,
            ],
            &[-0.0, 0.0],
            &[-0.0, 0.0, -1.0],
            &[1.5, 1.5, 1.5, 0.5, f32::NAN],
        ];
        let random = (0..400).map(|round| {
            let palette = palettes[round % palettes.len()];
            let n = 1 + (next() % 200) as usize;
            (0..n)
                .map(|_| palette[next() as usize % palette.len()])
                .collect::<Vec<f32>>()
        });
        // x86's default NaN (sign bit set: last in `total_cmp`) filling the best k, then
        // whole chunks of ordinary logits that must replace it.
        let default_nan = f32::from_bits(0xffc0_0000);
        let nan_first: Vec<f32> = [default_nan; 40].into_iter().chain([3.0; 96]).collect();
        for (round, logits) in std::iter::once(nan_first).chain(random).enumerate() {
            let n = logits.len();
            // (k = 0 is "disabled" for `top_k`; `sample` never takes the one-pass form then.)
            for k in [1, 2, 3, 7, 40, n.saturating_sub(1), n, n + 5]
                .into_iter()
                .filter(|&k| k > 0)
            {
                let mut all: Vec<(u32, f32)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect();
                let mut sorted = false;
                top_k(&mut all, &mut sorted, k as i32);
                let mut got = Vec::new();
                top_k_of_logits(&logits, k, &mut got);
                let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    v.iter().map(|&(i, l)| (i, l.to_bits())).collect()
                };
                assert_eq!(bits(&got), bits(&all), "round {round}, k {k}: {logits:?}");
            }
        }
    }

    #[test]
    fn repeat_penalty_changes_the_greedy_choice() {
        let params = SamplerParams {
            temp: 0.0,
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(params, 16);
        s.accept(1);
        assert_eq!(s.sample(&[2.0, 3.0, 0.0]), 0);
    }

    #[test]
    fn truncations_keep_what_they_should() {
        let mut c: Vec<(u32, f32)> = (0..10).map(|i| (i, i as f32)).collect();
        let mut sorted = false;
        top_k(&mut c, &mut sorted, 3);
        assert!(sorted);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![9, 8, 7]);
        top_p(&mut c, &mut sorted, 0.5, &mut Vec::new());
        assert_eq!(c.len(), 1);
        let mut c: Vec<(u32, f32)> = vec![(0, 0.0), (1, -1.0), (2, -10.0)];
        min_p(&mut c, false, 0.1);
        assert_eq!(c.len(), 2);
        // top-k off: min-p keeps the id order the draw then scans.
        let mut c: Vec<(u32, f32)> = vec![(0, -1.0), (1, 0.0), (2, -10.0), (3, -0.5)];
        let mut sorted = false;
        top_k(&mut c, &mut sorted, 0);
        min_p(&mut c, sorted, 0.1);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1, 3]);
    }

    #[test]
    fn seeded_draws_repeat_and_follow_the_distribution() {
        let logits = [0.0f32, 1.0, 2.0];
        let params = SamplerParams {
            temp: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let draws = |n| {
            let mut s = Sampler::new(params.clone(), 16);
            (0..n).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(50), draws(50));
        let d = draws(3000);
        let frac2 = d.iter().filter(|&&t| t == 2).count() as f64 / 3000.0;
        // softmax([0,1,2])[2] = 0.665
        assert!((frac2 - 0.665).abs() < 0.04, "{frac2}");
    }
}
