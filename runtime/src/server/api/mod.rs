//! The HTTP endpoints, one module per kind: [`completion`] (`/completion`,
//! `/v1/completions`, `/v1/chat/completions`), [`info`] (health, models, props, slots,
//! metrics), [`tokens`] (tokenize, detokenize, apply-template).

pub mod completion;
pub mod info;
pub mod tokens;
