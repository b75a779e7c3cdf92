//! llama-server's sampler fields beyond temperature / top-k / top-p / min-p and the
//! penalties (`tools/server/server-schema.cpp`, commit 0c1e570), with its limits: a soft
//! limit clamps the value, a hard one refuses it with llama-server's message. Also the
//! cache of DRY's processed sequence breakers (a pass over the whole vocabulary per set of
//! breakers, done once per distinct set).

use super::error::ApiError;
use super::params::{wrong_type, Body};
use crate::sampler::dry::DryBreakers;
use crate::sampler::{SamplerKind, SamplerParams};
use crate::tokenizer::Vocab;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// Reads `typical_p`, `top_n_sigma`, `xtc_*`, `dynatemp_*`, `mirostat*`, `dry_*`,
/// `min_keep` and `samplers` from `body` into `s`.
///
/// # Errors
/// 400 with llama-server's message for a value outside a hard limit (`min_keep`,
/// `dry_allowed_length`, `dry_penalty_last_n`), an empty or non-string
/// `dry_sequence_breakers`, a wrong type; and for `samplers` naming a sampler modelc does
/// not have (llama-server's `infill`, `adaptive_p`). Names llama-server does not know are
/// skipped, as it skips them.
pub fn read(body: &Body, s: &mut SamplerParams, defaults: &SamplerParams) -> Result<(), ApiError> {
    let soft = |v: Option<f32>, lo: f32, hi: f32| v.map(|x| x.clamp(lo, hi));
    if let Some(v) = body.f32("typical_p")? {
        s.typical_p = v;
    }
    if let Some(v) = body.f32("top_n_sigma")? {
        s.top_n_sigma = v;
    }
    if let Some(v) = soft(body.f32("xtc_probability")?, 0.0, 1.0) {
        s.xtc_probability = v;
    }
    if let Some(v) = soft(body.f32("xtc_threshold")?, 0.0, 1.0) {
        s.xtc_threshold = v;
    }
    if let Some(v) = body.f32("dynatemp_range")? {
        s.dynatemp_range = v;
    }
    if let Some(v) = body.f32("dynatemp_exponent")? {
        s.dynatemp_exponent = v;
    }
    if let Some(v) = body.i64("mirostat")? {
        s.mirostat = v.clamp(0, 2) as u8;
    }
    if let Some(v) = body.f32("mirostat_tau")? {
        s.mirostat_tau = v;
    }
    if let Some(v) = body.f32("mirostat_eta")? {
        s.mirostat_eta = v;
    }
    if let Some(v) = body.f32("dry_multiplier")? {
        s.dry_multiplier = v;
    }
    if let Some(v) = body.f32("dry_base")? {
        // Below 1: the server's default, as llama-server's handler does.
        s.dry_base = if v < 1.0 { defaults.dry_base } else { v };
    }
    if let Some(v) = hard(body, "dry_allowed_length")? {
        s.dry_allowed_length = v;
    }
    if let Some(v) = hard(body, "dry_penalty_last_n")? {
        s.dry_penalty_last_n = v;
    }
    if let Some(v) = hard(body, "min_keep")? {
        s.min_keep = v as usize;
    }
    if body.get("dry_sequence_breakers").is_some() {
        let breakers = body
            .strings("dry_sequence_breakers")?
            .filter(|b| !b.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings",
                )
            })?;
        s.dry_sequence_breakers = breakers;
    }
    if let Some(v) = body.get("samplers") {
        let kinds: Vec<Result<SamplerKind, String>> = match v {
            Value::Array(names) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(SamplerKind::from_name)
                        .ok_or_else(|| wrong_type("samplers", "a list of strings", n))
                })
                .collect::<Result<_, _>>()?,
            Value::String(chars) => chars.chars().map(SamplerKind::from_chr).collect(),
            other => return Err(wrong_type("samplers", "a list of names or a string", other)),
        };
        let mut order = Vec::with_capacity(kinds.len());
        for k in kinds {
            match k {
                Ok(k) => order.push(k),
                Err(e) if e.contains("not supported") => {
                    return Err(ApiError::invalid(format!("Field 'samplers': {e}")))
                }
                Err(_) => {}
            }
        }
        s.samplers = order;
    }
    Ok(())
}

/// An integer field with llama-server's hard limits `0 ..= i32::MAX`.
fn hard(body: &Body, name: &str) -> Result<Option<i32>, ApiError> {
    match body.i64(name)? {
        None => Ok(None),
        Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Ok(Some(n as i32)),
        Some(n) => Err(ApiError::invalid(format!(
            "Field '{name}': Value must be between 0 <= value <= {}, but got {n}",
            i32::MAX
        ))),
    }
}

/// DRY's processed breakers per distinct list of breaker strings (a handful in practice:
/// the defaults and what clients send).
#[derive(Debug, Default)]
pub struct DryCache(Mutex<Vec<(Vec<String>, Arc<DryBreakers>)>>);

impl DryCache {
    /// The breakers of `s` when DRY is on, built once per list.
    pub fn get(&self, vocab: &Vocab, s: &SamplerParams) -> Option<Arc<DryBreakers>> {
        if !s.dry_on() {
            return None;
        }
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, b)) = cache.iter().find(|(k, _)| *k == s.dry_sequence_breakers) {
            return Some(b.clone());
        }
        let b = Arc::new(DryBreakers::new(vocab, &s.dry_sequence_breakers));
        // Bounded: a client sending new lists each time reuses the oldest slots.
        if cache.len() >= 16 {
            cache.remove(0);
        }
        cache.push((s.dry_sequence_breakers.clone(), b.clone()));
        Some(b)
    }
}
