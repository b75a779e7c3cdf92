//! Token sampling: llama.cpp's sampler chain (`common/sampling.cpp`,
//! `src/llama-sampler.cpp`, commit 0c1e570). By default, in llama.cpp's order: repetition
//! penalties, DRY, top-n-σ, top-k, locally typical, top-p, min-p, XTC, temperature (with
//! the dynamic range), then the random draw; `samplers` reorders or drops them, as
//! llama.cpp's `--samplers` / `--sampler-seq` and llama-server's `samplers` do. Mirostat
//! (version 1 or 2) replaces the chain with temperature and its own draw, as in llama.cpp.
//! `temp <= 0` keeps only the most likely token (greedy; ties go to the lowest id), as
//! llama.cpp's temperature sampler does before its `dist` sampler.
//!
//! Each step does llama.cpp's arithmetic ([`stages`]) in its candidate order, and the draw
//! takes one `[0, 1)` double from `std::mt19937` seeded with `-s` as libstdc++ makes it
//! ([`crate::mt19937`]); XTC and Mirostat draw from engines of their own seeded alike: with
//! the same seed and llama.cpp's logits, the same tokens as llama.cpp
//! (`tests/sampling_llama_cpp.rs`).

use crate::mt19937::Mt19937;
use stages::{rank, Cands};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub mod dry;
mod stages;
mod std_sort;

/// A candidate token of the chain: llama.cpp's `llama_token_data` (id, logit, and the
/// probability the last softmax of the chain gave it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// One sampler of the chain (llama.cpp's `common_sampler_type`), in `samplers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerKind {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
}

impl SamplerKind {
    /// llama.cpp's default chain (`common_params_sampling::samplers`).
    pub const DEFAULT: [SamplerKind; 9] = [
        SamplerKind::Penalties,
        SamplerKind::Dry,
        SamplerKind::TopNSigma,
        SamplerKind::TopK,
        SamplerKind::TypicalP,
        SamplerKind::TopP,
        SamplerKind::MinP,
        SamplerKind::Xtc,
        SamplerKind::Temperature,
    ];

    /// llama.cpp's canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Penalties => "penalties",
            SamplerKind::Dry => "dry",
            SamplerKind::TopNSigma => "top_n_sigma",
            SamplerKind::TopK => "top_k",
            SamplerKind::TypicalP => "typ_p",
            SamplerKind::TopP => "top_p",
            SamplerKind::MinP => "min_p",
            SamplerKind::Xtc => "xtc",
            SamplerKind::Temperature => "temperature",
        }
    }

    /// llama.cpp's one-letter code (`common_sampler_type_to_chr`, `--sampler-seq`).
    pub fn chr(self) -> char {
        match self {
            SamplerKind::Penalties => 'e',
            SamplerKind::Dry => 'd',
            SamplerKind::TopNSigma => 's',
            SamplerKind::TopK => 'k',
            SamplerKind::TypicalP => 'y',
            SamplerKind::TopP => 'p',
            SamplerKind::MinP => 'm',
            SamplerKind::Xtc => 'x',
            SamplerKind::Temperature => 't',
        }
    }

    /// A name as `common_sampler_types_from_names` takes it: canonical, kebab-case
    /// (`top-k`), without the underscore (`topk`), `nucleus`, `temp`, `typ`; any case.
    ///
    /// # Errors
    /// A name llama.cpp does not know, or one of its samplers modelc does not have
    /// (`infill`, `adaptive_p`): the message says which.
    pub fn from_name(name: &str) -> Result<SamplerKind, String> {
        let n = name.to_ascii_lowercase();
        let alias = match n.as_str() {
            "nucleus" => Some(SamplerKind::TopP),
            "temp" => Some(SamplerKind::Temperature),
            "typ" => Some(SamplerKind::TypicalP),
            _ => None,
        };
        if let Some(k) = alias {
            return Ok(k);
        }
        if let Some(k) = SamplerKind::DEFAULT.into_iter().find(|k| {
            let c = k.name();
            n == c || n == c.replace('_', "-") || n == c.replace('_', "")
        }) {
            return Ok(k);
        }
        if ["infill", "adaptive_p", "adaptive-p", "adaptivep"].contains(&n.as_str()) {
            return Err(format!("the sampler '{name}' is not supported by modelc"));
        }
        Err(format!("unknown sampler '{name}'"))
    }

    /// A `--sampler-seq` letter ([`SamplerKind::chr`]).
    ///
    /// # Errors
    /// A letter that names no sampler, or one of llama.cpp's modelc does not have (`i`
    /// infill, `a` adaptive-p: the message says so).
    pub fn from_chr(c: char) -> Result<SamplerKind, String> {
        if c == 'i' || c == 'a' {
            return Err(format!("the sampler '{c}' is not supported by modelc"));
        }
        SamplerKind::DEFAULT
            .into_iter()
            .find(|k| k.chr() == c)
            .ok_or_else(|| format!("unknown sampler letter '{c}'"))
    }
}

/// Sampler settings, with llama.cpp's defaults and flag names (`common/common.h`,
/// `common_params_sampling`).
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
    /// The fewest candidates top-p, min-p, typical-p and XTC leave (llama-server's
    /// `min_keep`). Default 0.
    pub min_keep: usize,
    /// `--typical`: locally typical sampling's mass; 1 disables (default).
    pub typical_p: f32,
    /// `--top-nsigma`: keep logits within n standard deviations of the largest; `<= 0`
    /// disables (default -1).
    pub top_n_sigma: f32,
    /// `--xtc-probability`: how often XTC removes the top choices; 0 disables (default).
    pub xtc_probability: f32,
    /// `--xtc-threshold`: the probability a top choice needs to be removed (default 0.1;
    /// above 0.5 disables).
    pub xtc_threshold: f32,
    /// `--dynatemp-range`: the temperature varies in `temp ± range` with the entropy; 0
    /// disables (default).
    pub dynatemp_range: f32,
    /// `--dynatemp-exp`: the exponent of that mapping (default 1).
    pub dynatemp_exponent: f32,
    /// `--mirostat`: 0 off (default), 1 Mirostat, 2 Mirostat 2.0 (then only temperature
    /// and Mirostat sample).
    pub mirostat: u8,
    /// `--mirostat-ent`: Mirostat's target entropy τ (default 5).
    pub mirostat_tau: f32,
    /// `--mirostat-lr`: Mirostat's learning rate η (default 0.1).
    pub mirostat_eta: f32,
    /// `--dry-multiplier`: DRY's strength; 0 disables (default).
    pub dry_multiplier: f32,
    /// `--dry-base`: DRY's base (default 1.75).
    pub dry_base: f32,
    /// `--dry-allowed-length`: repetitions this long go unpenalized (default 2).
    pub dry_allowed_length: i32,
    /// `--dry-penalty-last-n`: how many recent tokens DRY scans; 0 (or less, as llama.cpp
    /// clamps it) disables (default 64).
    pub dry_penalty_last_n: i32,
    /// `--dry-sequence-breaker`: texts that end a repetition (default `\n`, `:`, `"`, `*`).
    pub dry_sequence_breakers: Vec<String>,
    /// `--samplers` / `--sampler-seq`: the chain's order (default [`SamplerKind::DEFAULT`]).
    #[serde(serialize_with = "serialize_kinds")]
    pub samplers: Vec<SamplerKind>,
}

fn serialize_kinds<S: serde::Serializer>(k: &[SamplerKind], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(k.iter().map(|k| k.name()))
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
            min_keep: 0,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            samplers: SamplerKind::DEFAULT.to_vec(),
        }
    }
}

impl SamplerParams {
    /// Whether DRY is on (llama.cpp builds it only then); its breakers then need the
    /// vocabulary ([`dry::DryBreakers`]).
    pub fn dry_on(&self) -> bool {
        self.mirostat == 0
            && self.samplers.contains(&SamplerKind::Dry)
            && self.dry_multiplier != 0.0
            && self.dry_base >= 1.0
            && self.dry_penalty_last_n > 0
    }

    /// Whether the stage `k` changes nothing (as configured): the chain skips it.
    fn idle(&self, k: SamplerKind) -> bool {
        match k {
            SamplerKind::Penalties => {
                self.repeat_last_n == 0
                    || (self.repeat_penalty == 1.0
                        && self.frequency_penalty == 0.0
                        && self.presence_penalty == 0.0)
            }
            SamplerKind::Dry => !self.dry_on(),
            SamplerKind::TopNSigma => self.top_n_sigma <= 0.0,
            SamplerKind::TopK => self.top_k <= 0,
            SamplerKind::TypicalP => self.typical_p >= 1.0,
            SamplerKind::TopP => self.top_p >= 1.0,
            SamplerKind::MinP => self.min_p <= 0.0,
            SamplerKind::Xtc => self.xtc_probability <= 0.0 || self.xtc_threshold > 0.5,
            SamplerKind::Temperature => self.temp == 1.0 && self.dynatemp_range <= 0.0,
        }
    }

    /// Whether the chain ends greedy: the temperature stage is in it with `temp <= 0` and no
    /// dynamic range, Mirostat off.
    fn greedy(&self) -> bool {
        self.mirostat == 0
            && self.temp <= 0.0
            && self.dynatemp_range <= 0.0
            && self.samplers.contains(&SamplerKind::Temperature)
    }
}

/// A sampler with its random states and the history the penalties and DRY look at.
pub struct Sampler {
    params: SamplerParams,
    /// The `dist` sampler's engine (Mirostat's when Mirostat is on).
    rng: Mt19937,
    /// XTC's engine (seeded alike; drawn from only while XTC is on).
    xtc_rng: Mt19937,
    /// Mirostat's `mu` (starts at `2τ`).
    mu: f32,
    dry: Option<dry::Dry>,
    /// The stages that change something, in the chain's order (fixed by the parameters).
    active: Vec<SamplerKind>,
    /// Whether the chain is greedy and every active stage keeps the largest logit: the
    /// choice is then the argmax of the logits.
    argmax_only: bool,
    history: VecDeque<u32>,
    history_cap: usize,
    counts: HashMap<u32, u32>,
    cands: Cands,
    typical_scratch: Vec<(f32, usize)>,
}

impl Sampler {
    /// A sampler for `params`; `n_ctx` bounds the penalty history when `repeat_last_n` is -1
    /// (and DRY's with `dry_penalty_last_n` -1); `dry` the breakers DRY needs when
    /// [`SamplerParams::dry_on`] (without them DRY stays off).
    pub fn new(params: SamplerParams, n_ctx: usize, dry: Option<Arc<dry::DryBreakers>>) -> Sampler {
        let history_cap = match params.repeat_last_n {
            n if n < 0 => n_ctx,
            n => n as usize,
        };
        // llama.cpp's seed is 32 bits: larger values wrap, as its uint32_t does.
        let seed = params.seed as u32;
        let dry = dry.filter(|_| params.dry_on()).map(|b| {
            dry::Dry::new(
                params.dry_multiplier,
                params.dry_base,
                params.dry_allowed_length,
                params.dry_penalty_last_n,
                n_ctx,
                b,
            )
        });
        let active: Vec<SamplerKind> = params
            .samplers
            .iter()
            .copied()
            .filter(|&k| !(params.idle(k) || k == SamplerKind::Dry && dry.is_none()))
            .collect();
        let keeps_max = |k: &SamplerKind| {
            matches!(
                k,
                SamplerKind::TopNSigma
                    | SamplerKind::TopK
                    | SamplerKind::TopP
                    | SamplerKind::MinP
                    | SamplerKind::Temperature
            )
        };
        let argmax_only = params.greedy() && active.iter().all(keeps_max);
        Sampler {
            rng: Mt19937::new(seed),
            xtc_rng: Mt19937::new(seed),
            mu: 2.0 * params.mirostat_tau,
            dry,
            active,
            argmax_only,
            params,
            history: VecDeque::with_capacity(history_cap),
            history_cap,
            counts: HashMap::new(),
            cands: Cands::default(),
            typical_scratch: Vec::new(),
        }
    }

    /// Records a token that was emitted (prompt or generated) for the penalties and DRY.
    pub fn accept(&mut self, token: u32) {
        if let Some(d) = self.dry.as_mut() {
            d.accept(token);
        }
        if self.history_cap == 0 {
            return;
        }
        if self.history.len() == self.history_cap {
            if let Some(old) = self.history.pop_front() {
                if let Some(n) = self.counts.get_mut(&old) {
                    *n -= 1;
                    if *n == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.history.push_back(token);
        *self.counts.entry(token).or_default() += 1;
    }

    /// Chooses the next token from `logits` (one value per vocabulary entry).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut c = std::mem::take(&mut self.cands);
        c.v.clear();
        c.sorted = false;
        let token = self.run_chain(logits, &mut c);
        self.cands = c;
        token
    }

    fn run_chain(&mut self, logits: &[f32], c: &mut Cands) -> u32 {
        let p = &self.params;
        if p.mirostat != 0 {
            all_logits(logits, c);
            stages::temp(c, p.temp);
            let idx = if p.mirostat == 1 {
                let cfg = (logits.len(), 100, p.mirostat_tau, p.mirostat_eta);
                stages::mirostat(c, cfg, &mut self.mu, &mut self.rng)
            } else {
                let cfg = (p.mirostat_tau, p.mirostat_eta);
                stages::mirostat_v2(c, cfg, &mut self.mu, &mut self.rng)
            };
            return c.v.get(idx).map_or(0, |x| x.id);
        }
        if self.argmax_only {
            // Greedy and nothing changes which token is largest: the choice straight from
            // the logits (no candidate list: a server step samples one per sequence, each
            // over the whole vocabulary), kept as the only candidate for
            // `post_sampling_probs`; the `dist` sampler still draws once.
            self.rng.canonical_f64();
            let token = argmax_logits(logits);
            if let Some(&l) = logits.get(token as usize) {
                c.v.push(Cand {
                    id: token,
                    logit: l,
                    p: 1.0,
                });
            }
            return token;
        }
        let mut first = 0;
        let k = usize::try_from(p.top_k).unwrap_or(0);
        if self.active.first() == Some(&SamplerKind::TopK) && k < logits.len() {
            // Top-k first: one pass over the logits that keeps the k best, not a list of
            // the whole vocabulary and a selection in it (~5× less time at k = 40 over
            // 49152 logits, for every sequence of every server step).
            top_k_of_logits(logits, k, &mut c.v);
            c.sorted = true;
            first = 1;
        } else {
            all_logits(logits, c);
        }
        for i in first..self.active.len() {
            self.apply(self.active[i], c);
        }
        self.dist(c)
    }

    /// One stage of the chain.
    fn apply(&mut self, k: SamplerKind, c: &mut Cands) {
        let p = &self.params;
        match k {
            SamplerKind::Penalties => {
                let (r, f, pr) = (p.repeat_penalty, p.frequency_penalty, p.presence_penalty);
                stages::penalties(c, &self.counts, r, f, pr);
            }
            SamplerKind::Dry => {
                if let Some(d) = self.dry.as_mut() {
                    d.apply(&mut c.v);
                    // Lowered logits: no longer in order (llama.cpp marks them unsorted).
                    c.sorted = false;
                }
            }
            SamplerKind::TopNSigma => stages::top_n_sigma(c, p.top_n_sigma),
            SamplerKind::TopK => stages::top_k(c, p.top_k),
            SamplerKind::TypicalP => {
                stages::typical(c, p.typical_p, p.min_keep, &mut self.typical_scratch)
            }
            SamplerKind::TopP => stages::top_p(c, p.top_p, p.min_keep),
            SamplerKind::MinP => stages::min_p(c, p.min_p, p.min_keep),
            SamplerKind::Xtc => {
                let (pr, t, mk) = (p.xtc_probability, p.xtc_threshold, p.min_keep);
                stages::xtc(c, pr, t, mk, &mut self.xtc_rng)
            }
            SamplerKind::Temperature => {
                stages::temp_ext(c, p.temp, p.dynatemp_range, p.dynatemp_exponent)
            }
        }
    }

    /// llama.cpp's `dist` sampler (`llama_sampler_dist_apply`): `p_i = expf(l_i - max)` in
    /// f32, their sum in f64, one draw `u` in `[0, 1)` ([`Mt19937::canonical_f64`]), and the
    /// first candidate, in the chain's current order, at which the running f64 sum reaches
    /// `sum · u`. One candidate: still one draw; none: no draw.
    fn dist(&mut self, c: &mut Cands) -> u32 {
        if c.v.is_empty() {
            return 0;
        }
        let u = self.rng.canonical_f64();
        if c.v.len() == 1 {
            c.v[0].p = 1.0;
            return c.v[0].id;
        }
        let max = if c.sorted {
            c.v[0].logit
        } else {
            c.v.iter().skip(1).fold(c.v[0].logit, |m, x| m.max(x.logit))
        };
        let mut sum = 0f64;
        for x in c.v.iter_mut() {
            x.p = (x.logit - max).exp();
            sum += f64::from(x.p);
        }
        let target = sum * u;
        let mut run = 0f64;
        let mut chosen = None;
        for x in c.v.iter_mut() {
            if chosen.is_none() {
                run += f64::from(x.p);
                if run >= target {
                    chosen = Some(x.id);
                }
            }
            x.p = (f64::from(x.p) / sum) as f32;
        }
        chosen.unwrap_or_else(|| c.v[c.v.len() - 1].id)
    }

    /// The probabilities after the last [`Sampler::sample`]'s chain (what the final draw
    /// normalized, in its arithmetic), the `n` most likely first (ties by id) —
    /// llama-server's `post_sampling_probs`. A greedy chain chose with certainty: the chosen token alone,
    /// with probability 1.
    pub fn post_sampling_probs(&self, n: usize) -> Vec<(u32, f32)> {
        let cand = &self.cands.v;
        if self.params.greedy() {
            let best = cand.iter().copied().min_by(rank).map_or(0, |x| x.id);
            return vec![(best, 1.0)];
        }
        // The probabilities the last step of the chain left in the candidates (the draw's
        // normalization, or Mirostat's softmax), as llama-server reads them
        // (`common_sampler_get_candidates`, sorted by probability).
        let mut out: Vec<(u32, f32)> = cand.iter().map(|c| (c.id, c.p)).collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out.truncate(n.max(1));
        out
    }
}

/// Every logit as a candidate, in id order, unsorted.
fn all_logits(logits: &[f32], c: &mut Cands) {
    c.v.clear();
    c.v.extend(logits.iter().enumerate().map(|(i, &l)| Cand {
        id: i as u32,
        logit: l,
        p: 0.0,
    }));
    c.sorted = false;
}

/// The most likely logit's id (candidate `i` is id `i`): the lowest id of the
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

/// [`stages::top_k`] of the whole vocabulary (candidate `i` is id `i` with `logits[i]`) into `out`,
/// sorted: the same `k` candidates in the same order, found in one pass that keeps the best
/// `k` so far (sorted; most logits fail the one comparison with the last of them).
fn top_k_of_logits(logits: &[f32], k: usize, out: &mut Vec<Cand>) {
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
            let worst = out[k - 1].logit;
            #[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must count as "not below"
            let any = chunk.iter().fold(false, |any, &l| any | !(l < worst));
            if !any {
                continue;
            }
        }
        for (j, &l) in chunk.iter().enumerate() {
            let c = Cand {
                id: (ci * CHUNK + j) as u32,
                logit: l,
                p: 0.0,
            };
            if out.len() == k {
                if rank(&c, &out[k - 1]) != std::cmp::Ordering::Less {
                    continue;
                }
                out.pop();
            }
            let at = out.partition_point(|o| rank(o, &c) == std::cmp::Ordering::Less);
            out.insert(at, c);
        }
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
            None,
        );
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    /// The lowest id of the largest value, NaN never chosen, 0 for nothing: what the
    /// greedy shortcut must choose.
    fn argmax(logits: &[f32]) -> u32 {
        let mut best = (u32::MAX, f32::NEG_INFINITY);
        for (id, &l) in logits.iter().enumerate() {
            if l > best.1 || (l == best.1 && (id as u32) < best.0) {
                best = (id as u32, l);
            }
        }
        if best.0 == u32::MAX {
            0
        } else {
            best.0
        }
    }

    /// The greedy shortcut over the logits chooses the candidate list's argmax: ties, NaN,
    /// infinities, nothing at all.
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
            assert_eq!(argmax_logits(&logits), argmax(&logits), "{logits:?}");
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
                let mut all = Cands::default();
                all_logits(&logits, &mut all);
                stages::top_k(&mut all, k as i32);
                let mut got = Vec::new();
                top_k_of_logits(&logits, k, &mut got);
                let bits = |v: &[Cand]| -> Vec<(u32, u32)> {
                    v.iter().map(|c| (c.id, c.logit.to_bits())).collect()
                };
                assert_eq!(bits(&got), bits(&all.v), "round {round}, k {k}: {logits:?}");
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
        let mut s = Sampler::new(params, 16, None);
        s.accept(1);
        assert_eq!(s.sample(&[2.0, 3.0, 0.0]), 0);
    }

    #[test]
    fn truncations_keep_what_they_should() {
        let cands = |v: &[(u32, f32)]| Cands {
            v: v.iter()
                .map(|&(id, logit)| Cand { id, logit, p: 0.0 })
                .collect(),
            sorted: false,
        };
        let ids = |c: &Cands| c.v.iter().map(|c| c.id).collect::<Vec<_>>();
        let mut c = cands(&(0..10).map(|i| (i, i as f32)).collect::<Vec<_>>());
        stages::top_k(&mut c, 3);
        assert!(c.sorted);
        assert_eq!(ids(&c), vec![9, 8, 7]);
        stages::top_p(&mut c, 0.5, 0);
        assert_eq!(c.v.len(), 1);
        let mut c = cands(&[(0, 0.0), (1, -1.0), (2, -10.0)]);
        stages::min_p(&mut c, 0.1, 0);
        assert_eq!(c.v.len(), 2);
        // top-k off: min-p keeps the id order the draw then scans.
        let mut c = cands(&[(0, -1.0), (1, 0.0), (2, -10.0), (3, -0.5)]);
        stages::top_k(&mut c, 0);
        stages::min_p(&mut c, 0.1, 0);
        assert_eq!(ids(&c), vec![0, 1, 3]);
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
            let mut s = Sampler::new(params.clone(), 16, None);
            (0..n).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(50), draws(50));
        let d = draws(3000);
        let frac2 = d.iter().filter(|&&t| t == 2).count() as f64 / 3000.0;
        // softmax([0,1,2])[2] = 0.665
        assert!((frac2 - 0.665).abs() < 0.04, "{frac2}");
    }
}
