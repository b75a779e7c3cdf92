//! Hand-written kernels: plain Rust, with AVX2 + FMA + F16C paths through `std::arch` (the
//! micro-kernels: `_mm256_*` intrinsics) where the host has them.
//!
//! - `actq`: the activation quantizer of every quantized matmul (Q8_0 / Q8_1 blocks in the
//!   layout of [`crate::actq`]);
//! - `elementwise`: SiLU, GELU, tanh, soft-capping, scale, copy, Hadamard rotation, the GLUs,
//!   add / mul, soft_max rows, ggml's vectorized `expf`;
//! - `norm`: `rms_norm` (× weight) and `norm`;
//! - `rope`: rope tables and rotation, f16 / f32 KV cache stores;
//! - `embed`: `get_rows` (dequantized token embeddings);
//! - `qdot`, `qdot_tiled`, `qdot_repack`, `fdot` (F16 / BF16): the row-dot kernels'
//!   products ([`crate::rows`]);
//!   `rowq`: their activation quantizers (ggml's Q8_0 / Q8_1 / Q8_K layouts); `amx`: the
//!   AMX tiles some of them take their exact integer sums from, where the host has them;
//! - `attention`: what the attention kernels share (KV rows, K/V to f32);
//! - `flash`: llama.cpp's CPU flash attention (reference, tiled and split-KV kernels);
//! - `soft_max_attn`: llama.cpp's attention without flash attention (`-fa off`).
//!
//! Portability: every `std::arch` item is inside `#[cfg(target_arch = "x86_64")]` code and is
//! reached only when `has_avx2` says the host has the features; the plain Rust path next to
//! it computes the same values, operation for operation (lanes written out where ggml's
//! vector order matters), so results do not depend on which path runs. Hosts other than
//! x86-64 take the plain path. The module docs say where a plain path differs (the
//! activation quantizer's plain path is the scalar reference [`crate::actq::quantize_act`]).
//!
//! The numeric definitions these kernels share with the reference interpreter (ggml's
//! vectorized `expf`, its softmax sum, the rope angles) come from [`ir::ggml::cpu_math`];
//! nothing here calls the interpreter, which stays the independent oracle of the tests.

// Off x86-64 only the plain paths exist: the x86 routines' dispatchers and helpers are
// compiled (their tests and callers are shared) but have nothing to dispatch to.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

pub(crate) mod actq;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod embed;
pub(crate) mod fdot;
pub(crate) mod flash;
pub(crate) mod norm;
pub(crate) mod qdot;
#[cfg(target_arch = "x86_64")]
pub(crate) mod qdot_amx;
pub(crate) mod qdot_kpacked;
pub(crate) mod qdot_repack;
pub(crate) mod qdot_tiled;
pub(crate) mod rope;
pub(crate) mod rowq;
pub(crate) mod soft_max_attn;

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

/// Whether the host has AVX2, FMA and F16C (the vector paths of the hand-written kernels;
/// x86-64 only: other hosts have no vector path to choose).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    static SIMD: OnceLock<bool> = OnceLock::new();
    *SIMD.get_or_init(|| {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    })
}

/// Whether the host has AVX-512F and AVX-512VL (besides [`has_avx2`]'s features): 16 f32
/// lanes per register and 32 registers, for float kernels whose lanes compute what the
/// 8-lane AVX2 code computes, lane for lane. `MODELC_NO_AVX512=1` turns it off, as for
/// [`has_vnni`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| {
        has_avx2()
            && std::env::var_os("MODELC_NO_AVX512").is_none()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
    })
}

/// Whether the host also has AVX-512 VNNI and AVX-512VL: `vpdpbusd` on 256-bit vectors
/// (four u8 × i8 products summed into each i32 lane in one instruction, where AVX2 needs
/// `maddubs` then `madd`) and 32 vector registers instead of 16. The integers are the same;
/// the row-dot tiles use it where no i16 pair of AVX2's `maddubs` can saturate
/// (`qdot::x86::Lanes`). `MODELC_NO_AVX512=1` in the environment turns it off (to compare
/// the two builds; the numbers are the same).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        has_avx2()
            && std::env::var_os("MODELC_NO_AVX512").is_none()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    })
}

/// Whether the host has [`has_vnni`]'s features and AVX-512BW: byte operations on 512-bit
/// registers (absolute values, sign masks, masked subtraction), for the 4 × 8 row-dot tiles.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_vnni512() -> bool {
    static VNNI512: OnceLock<bool> = OnceLock::new();
    *VNNI512.get_or_init(|| has_vnni() && std::is_x86_feature_detected!("avx512bw"))
}
