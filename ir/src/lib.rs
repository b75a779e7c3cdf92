//! `ir`: the bottom of modelc's crate stack.
//!
//! - [`gguf`]: the strict GGUF reader and writer (tensor data stays memory-mapped);
//! - [`ggml`]: the GGML block formats as data, and the reference dequantizer;
//! - [`graph`]: the typed tensor IR (ops, shapes, verifier, printer, serde);
//! - [`interp`]: the reference interpreter, the oracle for every pass and backend;
//! - [`plan`]: the plan (kernels, values, arena), its verifier, printer and executor;
//! - [`text`]: what the text forms of graphs and plans share ([`text::ParseError`]);
//!
//! Everything here treats its input as untrusted: errors name the key, tensor or byte offset.

pub mod ggml;
pub mod gguf;
pub mod graph;
pub mod interp;
pub mod plan;
pub mod text;
