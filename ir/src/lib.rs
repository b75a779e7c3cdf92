//! `ir`: the bottom of modelc's crate stack.
//!
//! - [`gguf`]: the strict GGUF reader and writer (tensor data stays memory-mapped);
//! - [`ggml`]: the GGML block formats as data, and the reference dequantizer;
//!
//! Everything here treats its input as untrusted: errors name the key, tensor or byte offset.

pub mod ggml;
pub mod gguf;
