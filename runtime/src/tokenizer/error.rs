//! Errors of vocabulary loading and token lookups.

/// What went wrong while building a [`super::Vocab`] from GGUF metadata or using it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required `tokenizer.ggml.*` key is absent.
    #[error("metadata key '{0}' is missing")]
    MissingKey(&'static str),
    /// A key holds the wrong type or an impossible value.
    #[error("metadata key '{key}': {msg}")]
    BadKey {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        msg: String,
    },
    /// The tokenizer model named in `tokenizer.ggml.model` is not implemented.
    #[error("tokenizer model '{0}' is not supported (supported: llama, gpt2, gemma4, whitespace)")]
    UnsupportedModel(String),
    /// The vocabulary contradicts itself (duplicate token, missing required token, ...).
    #[error("invalid vocabulary: {0}")]
    Invalid(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is out of range (n_vocab = {n_vocab})")]
    BadTokenId {
        /// The id.
        id: i64,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The GGUF reader failed.
    #[error(transparent)]
    Gguf(#[from] ir::gguf::GgufError),
}
