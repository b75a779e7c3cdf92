//! `runtime`: what runs a compiled model — backends ([`backend`]: a target's program loaded
//! into an [`engine::Engine`]), sessions ([`session`]: the KV memory of one or more
//! sequences and its bookkeeping), generation as a state machine ([`generate`]), tokenizer,
//! chat templates, sampler — plus the `modelc` command line (`cli`).

pub mod artifact;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod cpu_engine;
pub mod embed;
pub mod engine;
pub mod engine_weights;
pub mod generate;
pub mod grammar;
pub mod interp_engine;
pub mod kl_divergence;
pub mod kv_cache;
pub mod memory;
pub mod mt19937;
pub mod perplexity;
pub mod quantize;
pub mod reasoning_budget;
pub mod repl;
pub mod sampler;
pub mod server;
pub mod session;
pub mod speculative;
pub mod synth;
pub mod synth_bert;
pub mod tokenizer;
