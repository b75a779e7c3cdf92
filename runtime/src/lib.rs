//! `runtime`: what runs a compiled model — tokenizer, chat templates, sampler, KV cache and
//! execution — plus the `modelc` command line (`cli`).

pub mod artifact;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod cpu_engine;
pub mod engine;
pub mod engine_weights;
pub mod generate;
pub mod interp_engine;
pub mod mt19937;
pub mod perplexity;
pub mod sampler;
pub mod tokenizer;
