//! Perplexity as llama.cpp's `llama-perplexity` computes it (`tools/perplexity/perplexity.cpp`,
//! `perplexity()`): the tokens are cut into chunks of `n_ctx`; each chunk is evaluated from an
//! empty KV cache (its first token replaced by BOS when the model adds one), and only the
//! second half of each chunk is scored, so every scored token has at least `n_ctx / 2` tokens
//! of context. The ± figure is llama.cpp's: the standard error of the mean negative
//! log-likelihood, carried through `exp`.

use crate::session::Session;

/// Result of a perplexity run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Perplexity {
    /// Number of chunks evaluated.
    pub n_chunks: usize,
    /// Tokens scored.
    pub n_scored: usize,
    /// exp(mean negative log-likelihood).
    pub ppl: f64,
    /// llama.cpp's uncertainty of `ppl`.
    pub ppl_err: f64,
    /// Running estimate after each chunk (what llama-perplexity prints as `[1]25.1,[2]...`).
    pub per_chunk: Vec<f64>,
}

/// `log softmax(logits)[target]`, in f64 as llama.cpp's `log_softmax` does.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(logits[target] - max) - sum.ln()
}

/// Runs perplexity over `tokens` with chunks of `n_ctx`, evaluating at most `n_batch` tokens
/// per decode call, over at most `max_chunks` chunks (llama-perplexity's `--chunks`; `None`:
/// all). `bos` replaces the first token of each chunk when the model adds BOS.
///
/// Errors: fewer than `2 * n_ctx` tokens (llama-perplexity's requirement), an engine whose
/// context is smaller than `n_ctx`, or an engine error.
pub fn perplexity(
    engine: &mut Session<'_>,
    tokens: &[u32],
    n_ctx: usize,
    n_batch: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    progress: impl FnMut(usize, usize, f64),
) -> anyhow::Result<Perplexity> {
    perplexity_with(
        engine,
        tokens,
        n_ctx,
        n_batch,
        max_chunks,
        bos,
        progress,
        |_, _| Ok(()),
    )
}

/// [`perplexity`], also handing `on_token` each scored token's logits (`n_vocab`) and the
/// token that follows, in order (`--kl-divergence-base` saves them).
///
/// # Errors
/// As [`perplexity`]; what `on_token` returns.
#[allow(clippy::too_many_arguments)]
pub fn perplexity_with(
    engine: &mut Session<'_>,
    tokens: &[u32],
    n_ctx: usize,
    n_batch: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    mut progress: impl FnMut(usize, usize, f64),
    mut on_token: impl FnMut(&[f32], usize) -> anyhow::Result<()>,
) -> anyhow::Result<Perplexity> {
    anyhow::ensure!(
        n_ctx >= 8,
        "the perplexity context (-c) must be at least 8 tokens"
    );
    anyhow::ensure!(
        tokens.len() >= 2 * n_ctx,
        "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; the text has {}",
        2 * n_ctx,
        tokens.len()
    );
    anyhow::ensure!(
        engine.n_ctx() >= n_ctx,
        "the engine's context ({}) is smaller than -c {n_ctx}",
        engine.n_ctx()
    );
    let n_chunks = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
    let first = n_ctx / 2;
    let n_vocab = engine.n_vocab();
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut per_chunk = Vec::with_capacity(n_chunks);
    eval_chunks(
        engine,
        tokens,
        n_ctx,
        n_batch,
        n_chunks,
        bos,
        |chunk, logits| {
            let start = chunk * n_ctx;
            for i in first..n_ctx - 1 {
                let target = tokens[start + i + 1] as usize;
                let row = &logits[i * n_vocab..(i + 1) * n_vocab];
                on_token(row, target)?;
                let lp = log_prob(row, target);
                nll -= lp;
                nll2 += lp * lp;
                count += 1;
            }
            let est = (nll / count as f64).exp();
            per_chunk.push(est);
            progress(chunk + 1, n_chunks, est);
            Ok(())
        },
    )?;
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let ppl_err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        n_chunks,
        n_scored: count,
        ppl,
        ppl_err,
        per_chunk,
    })
}

/// Evaluates chunks `0..n_chunks` of `tokens` (`n_ctx` each) as llama-perplexity does: each
/// from an empty KV cache, its first token replaced by `bos` when given, at most `n_batch`
/// tokens per decode call; hands `f` the chunk index and the logits of all its `n_ctx`
/// positions (`n_ctx × n_vocab`).
///
/// # Errors
/// An engine error, or what `f` returns.
pub fn eval_chunks(
    engine: &mut Session<'_>,
    tokens: &[u32],
    n_ctx: usize,
    n_batch: usize,
    n_chunks: usize,
    bos: Option<u32>,
    mut f: impl FnMut(usize, &[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let n_batch = n_batch.min(n_ctx).min(engine.max_ubatch()).max(1);
    let n_vocab = engine.n_vocab();
    let mut logits = vec![0f32; n_ctx * n_vocab];
    for chunk in 0..n_chunks {
        let start = chunk * n_ctx;
        let mut batch: Vec<u32> = tokens[start..start + n_ctx].to_vec();
        if let Some(b) = bos {
            batch[0] = b;
        }
        engine.clear();
        for pos in (0..n_ctx).step_by(n_batch) {
            let end = (pos + n_batch).min(n_ctx);
            let out = engine.decode(&batch[pos..end], pos, true)?;
            logits[pos * n_vocab..end * n_vocab].copy_from_slice(out);
        }
        f(chunk, &logits)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineMemory, KvStream};
    use ir::plan::KvLayout;

    /// An engine whose logits make token `t + 1` follow `t` with a known probability.
    struct Markov {
        n_vocab: usize,
        logits: Vec<f32>,
        layout: KvLayout,
    }

    impl Engine for Markov {
        fn n_vocab(&self) -> usize {
            self.n_vocab
        }
        fn n_ctx(&self) -> usize {
            1024
        }
        fn max_ubatch(&self) -> usize {
            7
        }
        fn kv_layout(&self) -> &KvLayout {
            &self.layout
        }
        fn last_logits(&self) -> &[f32] {
            &self.logits
        }
        fn memory(&self) -> EngineMemory {
            EngineMemory::default()
        }
        fn decode(
            &mut self,
            _kv: &mut KvStream<'_>,
            tokens: &[u32],
            _pos0: usize,
            all: bool,
        ) -> anyhow::Result<&[f32]> {
            self.logits.clear();
            for &t in tokens {
                let mut row = vec![0f32; self.n_vocab];
                row[(t as usize + 1) % self.n_vocab] = 2.0;
                self.logits.extend_from_slice(&row);
            }
            if !all {
                let n = self.logits.len();
                self.logits.drain(..n - self.n_vocab);
            }
            Ok(&self.logits)
        }
    }

    #[test]
    fn perplexity_of_a_known_distribution() {
        let n_vocab = 5;
        let mut e = Session::single(Markov {
            n_vocab,
            logits: vec![],
            layout: KvLayout {
                n_cells: 1024,
                caches: vec![],
                stream_bytes: 0,
            },
        })
        .unwrap();
        let tokens: Vec<u32> = (0..100).map(|i| (i % n_vocab) as u32).collect();
        let r = perplexity(&mut e, &tokens, 16, 5, None, None, |_, _, _| {}).unwrap();
        let p = (2f64.exp()) / (2f64.exp() + 4.0);
        assert_eq!(r.n_chunks, 6);
        assert_eq!(r.n_scored, 6 * 7);
        assert!((r.ppl - 1.0 / p).abs() < 1e-9, "{}", r.ppl);
        assert!(r.ppl_err.abs() < 1e-6, "{}", r.ppl_err);
        assert!(perplexity(&mut e, &tokens[..20], 16, 5, None, None, |_, _, _| {}).is_err());
        // --chunks 2: the first two chunks only (the length check still sees all tokens).
        let two = perplexity(&mut e, &tokens, 16, 5, Some(2), None, |_, _, _| {}).unwrap();
        assert_eq!(two.n_chunks, 2);
        assert_eq!(two.n_scored, 2 * 7);
    }
}
