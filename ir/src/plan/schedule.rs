//! How tokens are cut into the compiled ubatch sizes ([`super::TailPolicy::Pad`]).
//!
//! A plan has steps for a few fixed ubatch sizes (by default 1 and 64). A run of `n` tokens
//! starting at position `n_past` becomes a list of [`Chunk`]s: full chunks of the largest
//! size while they fit, then the remainder `r`:
//!
//! - padded to the smallest compiled size `u ≥ r` when at least half of it is real
//!   (`2r ≥ u`) and the padded positions stay inside the KV cache (`pos0 + u ≤ n_ctx`);
//! - otherwise cut again with the largest size `u ≤ r` (so with sizes {1, 64} a 20-token
//!   tail runs as 20 single-token steps, a 40-token tail as one padded 64-token step).
//!
//! Why padding is sound: padding tokens (the chunk's last real token repeated) sit at the
//! positions right after the last real one. Their K/V rows go to cache rows no real token has
//! reached yet, which later tokens overwrite; causal attention hides them from every real
//! token (a query at position p reads keys at positions ≤ p only); each real row's other ops
//! (norms, products, rope) read only its own row. So every real row computes exactly what it
//! would without the padding, and the padding rows' logits are simply not read. Masking
//! (a runtime token count in every kernel) would save the padded work but put a variable
//! trip count in every generated kernel; padding keeps all shapes constant.

use super::PlanError;

/// One step of a run: `n_real` real tokens at positions `pos0 ..`, computed by the step
/// compiled for `n_tokens ≥ n_real` tokens (the rest is padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The compiled ubatch size to run.
    pub n_tokens: u32,
    /// How many of its rows are real tokens (the first ones).
    pub n_real: u32,
    /// Position of the first token.
    pub pos0: u32,
}

impl Chunk {
    /// The token ids to feed: the real ones, then the last real one repeated as padding.
    /// `real` must hold `n_real` ids (extra ones are ignored, missing ones padded).
    pub fn tokens(&self, real: &[i32]) -> Vec<i32> {
        let last = real
            .get(..self.n_real as usize)
            .and_then(|r| r.last())
            .copied()
            .unwrap_or(0);
        (0..self.n_tokens as usize)
            .map(|i| {
                if i < self.n_real as usize {
                    real.get(i).copied().unwrap_or(last)
                } else {
                    last
                }
            })
            .collect()
    }

    /// The positions to feed: `pos0, pos0 + 1, …` for every row, padding included.
    pub fn positions(&self) -> Vec<i32> {
        (0..self.n_tokens).map(|i| (self.pos0 + i) as i32).collect()
    }

    /// The output row to request from a step with one logit row (`n_outputs == 1`): the
    /// last real token's.
    pub fn last_row(&self) -> i32 {
        self.n_real.saturating_sub(1) as i32
    }

    /// The KV length of the step: one past the last position written (padding included).
    pub fn kv_len(&self) -> u64 {
        self.pos0 as u64 + self.n_tokens as u64
    }
}

/// Cuts `n` tokens starting at position `n_past` into chunks of the compiled sizes
/// `ubatches` for a KV cache of `n_ctx` cells (rule in the module doc).
///
/// # Errors
/// [`PlanError::Schedule`] when no size is compiled, when positions `n_past .. n_past + n`
/// do not fit the cache, or when a remainder is smaller than every size and padding it would
/// run past the cache.
pub fn chunks(ubatches: &[u32], n_past: u32, n: u32, n_ctx: u32) -> Result<Vec<Chunk>, PlanError> {
    let mut sizes: Vec<u32> = ubatches.iter().copied().filter(|&u| u > 0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let Some(&largest) = sizes.last() else {
        return Err(PlanError::Schedule("no ubatch size is compiled".into()));
    };
    let end = n_past as u64 + n as u64;
    if end > n_ctx as u64 {
        return Err(PlanError::Schedule(format!(
            "positions {n_past}..{end} do not fit the KV cache of {n_ctx} cells"
        )));
    }
    let mut out = Vec::new();
    let (mut pos, mut left) = (n_past, n);
    while left > 0 {
        let fits = |u: u32| pos as u64 + u as u64 <= n_ctx as u64;
        let chunk = if left >= largest {
            Chunk {
                n_tokens: largest,
                n_real: largest,
                pos0: pos,
            }
        } else {
            let pad = sizes.iter().copied().find(|&u| u >= left);
            let full = sizes.iter().copied().rev().find(|&u| u <= left);
            match (pad, full) {
                (Some(u), _) if 2 * left as u64 >= u as u64 && fits(u) => {
                    Chunk { n_tokens: u, n_real: left, pos0: pos }
                }
                (_, Some(u)) => Chunk { n_tokens: u, n_real: u, pos0: pos },
                (Some(u), None) if fits(u) => Chunk { n_tokens: u, n_real: left, pos0: pos },
                _ => {
                    return Err(PlanError::Schedule(format!(
                        "{left} tokens at position {pos} are fewer than the smallest ubatch {} and padding runs past n_ctx {n_ctx}",
                        sizes[0]
                    )))
                }
            }
        };
        pos += chunk.n_real;
        left -= chunk.n_real;
        out.push(chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(c: &[Chunk]) -> Vec<(u32, u32, u32)> {
        c.iter().map(|c| (c.n_tokens, c.n_real, c.pos0)).collect()
    }

    #[test]
    fn full_chunks_then_padded_tail() {
        let c = chunks(&[1, 64], 0, 160, 4096).unwrap();
        assert_eq!(shape(&c), vec![(64, 64, 0), (64, 64, 64), (64, 32, 128)]);
        assert_eq!(c[2].positions()[0], 128);
        assert_eq!(c[2].kv_len(), 192);
        assert_eq!(c[2].tokens(&[7; 32])[63], 7);
        assert_eq!(c[2].last_row(), 31);
    }

    #[test]
    fn short_tail_runs_token_by_token() {
        let c = chunks(&[64, 1], 5, 67, 4096).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(shape(&c)[0], (64, 64, 5));
        assert_eq!(shape(&c)[3], (1, 1, 71));
    }

    #[test]
    fn no_padding_past_the_cache() {
        // 40 tokens would pad to 64, but only 50 cells are left.
        let c = chunks(&[1, 64], 206, 40, 256).unwrap();
        assert!(c.iter().all(|c| c.n_tokens == 1));
        assert!(chunks(&[64], 206, 40, 256).is_err());
        assert!(chunks(&[1, 64], 250, 10, 256).is_err());
        assert!(chunks(&[], 0, 1, 256).is_err());
    }
}
