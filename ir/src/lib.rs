//! `ir`: the bottom of modelc's crate stack.
//!
//! - [`gguf`]: the strict GGUF reader and writer (tensor data stays memory-mapped);
//! - [`ggml`]: the GGML block formats as data, and the reference dequantizer;
//! - [`graph`]: the typed tensor IR (ops, shapes, verifier, printer, serde);
//! - [`interp`]: the reference interpreter, the oracle for every pass and backend;
//!
//! Everything here treats its input as untrusted: errors name the key, tensor or byte offset.

pub mod ggml;
pub mod gguf;
pub mod graph;
pub mod interp;
pub mod plan;
