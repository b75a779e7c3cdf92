//! The sampler flags beyond top-k / top-p / min-p / temperature and the penalties, with
//! llama.cpp's names, defaults and checks (`common/arg.cpp`, commit 0c1e570): locally typical,
//! top-n-σ, XTC, dynamic temperature, Mirostat, DRY, and the chain's order.

use crate::sampler::{SamplerKind, SamplerParams};

/// Flattened into [`super::gen_args::GenArgs`].
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SamplerArgs {
    /// Locally typical sampling, parameter p (1.0 disables).
    #[arg(long = "typical", visible_alias = "typical-p", value_name = "N")]
    pub typical: Option<f32>,
    /// Top-n-sigma sampling: keep logits within N standard deviations of the largest (-1
    /// disables).
    #[arg(
        long = "top-nsigma",
        visible_alias = "top-n-sigma",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub top_n_sigma: Option<f32>,
    /// XTC: the chance of removing the top choices (0.0 disables).
    #[arg(long = "xtc-probability", value_name = "N")]
    pub xtc_probability: Option<f32>,
    /// XTC: the probability a top choice needs to be removed (above 0.5 disables).
    #[arg(long = "xtc-threshold", value_name = "N")]
    pub xtc_threshold: Option<f32>,
    /// Dynamic temperature range: the temperature moves in temp ± N with the entropy (0.0
    /// disables).
    #[arg(long = "dynatemp-range", value_name = "N")]
    pub dynatemp_range: Option<f32>,
    /// Dynamic temperature exponent.
    #[arg(long = "dynatemp-exp", value_name = "N", allow_negative_numbers = true)]
    pub dynatemp_exp: Option<f32>,
    /// Mirostat sampling (0 off, 1 Mirostat, 2 Mirostat 2.0); top-k, top-p, typical and
    /// the others are then not used.
    #[arg(long = "mirostat", value_name = "N")]
    pub mirostat: Option<u8>,
    /// Mirostat learning rate, parameter eta.
    #[arg(long = "mirostat-lr", value_name = "N")]
    pub mirostat_lr: Option<f32>,
    /// Mirostat target entropy, parameter tau.
    #[arg(long = "mirostat-ent", value_name = "N")]
    pub mirostat_ent: Option<f32>,
    /// DRY multiplier (0.0 disables).
    #[arg(long = "dry-multiplier", value_name = "N")]
    pub dry_multiplier: Option<f32>,
    /// DRY base (values below 1.0 are ignored, as llama.cpp ignores them).
    #[arg(long = "dry-base", value_name = "N", allow_negative_numbers = true)]
    pub dry_base: Option<f32>,
    /// DRY: repetitions this long go unpenalized.
    #[arg(
        long = "dry-allowed-length",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub dry_allowed_length: Option<i32>,
    /// DRY: how many recent tokens to scan (0 disables).
    #[arg(
        long = "dry-penalty-last-n",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub dry_penalty_last_n: Option<i32>,
    /// A DRY sequence breaker (repeatable; the first replaces the defaults `\n`, `:`, `"`,
    /// `*`; "none" clears them).
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub dry_sequence_breaker: Vec<String>,
    /// The samplers, in order, separated by ';' (llama.cpp's names: penalties, dry,
    /// top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature; also top-k, topk, ...).
    #[arg(long = "samplers", value_name = "SAMPLERS")]
    pub samplers: Option<String>,
    /// The samplers as one letter each (default "edskypmxt").
    #[arg(
        long = "sampler-seq",
        visible_alias = "sampling-seq",
        value_name = "SEQUENCE"
    )]
    pub sampler_seq: Option<String>,
}

impl SamplerArgs {
    /// Refuses what llama.cpp refuses (`--dry-penalty-last-n` below 0, a Mirostat version
    /// other than 0–2, which llama.cpp aborts on) and numbers that are not finite, naming
    /// the flag.
    ///
    /// # Errors
    /// The first such value, in one line.
    pub fn validate(&self) -> anyhow::Result<()> {
        let floats = [
            ("--typical", self.typical),
            ("--top-nsigma", self.top_n_sigma),
            ("--xtc-probability", self.xtc_probability),
            ("--xtc-threshold", self.xtc_threshold),
            ("--dynatemp-range", self.dynatemp_range),
            ("--dynatemp-exp", self.dynatemp_exp),
            ("--mirostat-lr", self.mirostat_lr),
            ("--mirostat-ent", self.mirostat_ent),
            ("--dry-multiplier", self.dry_multiplier),
            ("--dry-base", self.dry_base),
        ];
        for (flag, v) in floats {
            if let Some(v) = v {
                super::gen_args::check_finite(flag, v)?;
            }
        }
        if let Some(n) = self.dry_penalty_last_n {
            anyhow::ensure!(
                n >= 0,
                "--dry-penalty-last-n {n}: must be 0 or more (0 disables)"
            );
        }
        if let Some(m) = self.mirostat {
            anyhow::ensure!(m <= 2, "--mirostat {m}: 0 (off), 1 or 2");
        }
        self.kinds(true)?;
        Ok(())
    }

    /// The chain's order from `--samplers` or `--sampler-seq` (the later flag wins in
    /// llama.cpp; here both at once are refused), if given.
    fn kinds(&self, warn: bool) -> anyhow::Result<Option<Vec<SamplerKind>>> {
        match (&self.samplers, &self.sampler_seq) {
            (Some(_), Some(_)) => {
                anyhow::bail!("--samplers and --sampler-seq both give the order: pass one")
            }
            (Some(names), None) => {
                let kinds = names
                    .split(';')
                    .filter(|n| !n.is_empty())
                    .map(SamplerKind::from_name);
                Ok(Some(known(kinds, "--samplers", warn)?))
            }
            (None, Some(seq)) => Ok(Some(known(
                seq.chars().map(SamplerKind::from_chr),
                "--sampler-seq",
                warn,
            )?)),
            (None, None) => Ok(None),
        }
    }

    /// Writes the flags given into `p` (the others keep llama.cpp's defaults).
    pub fn apply(&self, p: &mut SamplerParams) {
        let set = |dst: &mut f32, v: Option<f32>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut p.typical_p, self.typical);
        set(&mut p.top_n_sigma, self.top_n_sigma);
        set(&mut p.xtc_probability, self.xtc_probability);
        set(&mut p.xtc_threshold, self.xtc_threshold);
        set(&mut p.dynatemp_range, self.dynatemp_range);
        set(&mut p.dynatemp_exponent, self.dynatemp_exp);
        set(&mut p.mirostat_eta, self.mirostat_lr);
        set(&mut p.mirostat_tau, self.mirostat_ent);
        set(&mut p.dry_multiplier, self.dry_multiplier);
        if let Some(b) = self.dry_base.filter(|&b| b >= 1.0) {
            p.dry_base = b;
        }
        if let Some(m) = self.mirostat {
            p.mirostat = m;
        }
        if let Some(n) = self.dry_allowed_length {
            p.dry_allowed_length = n;
        }
        if let Some(n) = self.dry_penalty_last_n {
            p.dry_penalty_last_n = n;
        }
        if !self.dry_sequence_breaker.is_empty() {
            p.dry_sequence_breakers = Vec::new();
            for b in &self.dry_sequence_breaker {
                if b == "none" {
                    p.dry_sequence_breakers.clear();
                } else {
                    p.dry_sequence_breakers.push(b.clone());
                }
            }
        }
        if let Ok(Some(kinds)) = self.kinds(false) {
            p.samplers = kinds;
        }
    }
}

/// The samplers of a `--samplers` / `--sampler-seq` list: a name llama.cpp does not know
/// is skipped (with a warning when `warn`), as llama.cpp skips it (`common_sampler_types_from_names`);
/// one of llama.cpp's that modelc does not have (`infill`, `adaptive_p`) is refused,
/// naming the flag.
static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn known(
    kinds: impl Iterator<Item = Result<SamplerKind, String>>,
    flag: &str,
    warn: bool,
) -> anyhow::Result<Vec<SamplerKind>> {
    let mut out = Vec::new();
    for k in kinds {
        match k {
            Ok(k) => out.push(k),
            Err(e) if e.contains("not supported") => anyhow::bail!("{flag}: {e}"),
            // Once per process: the flags are checked more than once on some paths.
            Err(e) if warn && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "{}: warning: {flag}: {e} (skipped)",
                    super::prog()
                );
            }
            Err(_) => {}
        }
    }
    Ok(out)
}
