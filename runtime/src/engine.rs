//! The execution interface every backend implements (the reference interpreter, the compiled
//! CPU plan, later CUDA and Metal): evaluate a ubatch of tokens at given positions against the
//! KV cache and return logits. Generation, perplexity and benchmarks are written once over it.

/// One model instance with its KV cache, ready to evaluate tokens.
pub trait Engine {
    /// Vocabulary size: the length of one row of logits.
    fn n_vocab(&self) -> usize;

    /// Context size: the KV cache holds positions `0..n_ctx`.
    fn n_ctx(&self) -> usize;

    /// Largest number of tokens one [`Engine::decode`] call accepts (the ubatch size);
    /// callers split longer inputs.
    fn max_ubatch(&self) -> usize;

    /// Evaluates `tokens` at positions `pos0..pos0 + tokens.len()`, storing their K/V, and
    /// returns logits: `tokens.len()` rows of `n_vocab` values when `all_logits`, otherwise
    /// only the last token's row.
    ///
    /// Errors: an empty ubatch, more than `max_ubatch` tokens, positions past `n_ctx`, or a
    /// token id outside the vocabulary.
    fn decode(&mut self, tokens: &[u32], pos0: usize, all_logits: bool) -> anyhow::Result<&[f32]>;

    /// Forgets everything in the KV cache.
    fn clear(&mut self);
}

/// Checks the arguments of [`Engine::decode`] the same way for every backend.
pub fn check_decode_args(engine: &dyn Engine, tokens: &[u32], pos0: usize) -> anyhow::Result<()> {
    anyhow::ensure!(!tokens.is_empty(), "decode: empty ubatch");
    anyhow::ensure!(
        tokens.len() <= engine.max_ubatch(),
        "decode: {} tokens exceed the ubatch size {}",
        tokens.len(),
        engine.max_ubatch()
    );
    let end = pos0 + tokens.len();
    anyhow::ensure!(
        end <= engine.n_ctx(),
        "the context is full: positions up to {end} do not fit in n_ctx = {} (use -c to enlarge it)",
        engine.n_ctx()
    );
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= engine.n_vocab()) {
        anyhow::bail!(
            "token id {bad} is outside the vocabulary (n_vocab = {})",
            engine.n_vocab()
        );
    }
    Ok(())
}
