//! The HTTP endpoints, one module per kind: [`completion`] (`/completion`,
//! `/v1/completions`, `/v1/chat/completions`, and `/infill` with its prompt from
//! [`infill`]), [`info`] (health, models, props, slots,
//! metrics), [`embeddings`] (`/v1/embeddings`, `/embedding` with `--embedding`), [`rerank`]
//! (`/rerank`, `/v1/rerank` with `--reranking`), [`tokens`] (tokenize, detokenize, apply-template), [`stream`] (resumable
//! streams: `/v1/stream`, `/v1/streams/lookup`).

pub mod completion;
pub mod embeddings;
pub mod infill;
pub mod info;
pub mod rerank;
pub mod stream;
pub mod tokens;
