//! Rotary position embedding and the KV cache store (`ggml_rope_ext`, `ggml_set_rows` into
//! the cache), the pieces of the fused `rope+kv_store` kernel.
//!
//! Plain Rust (a first version, not Cranelift). The `(cos, sin)` of every pair at every
//! position is computed once at load time ([`RopeTable`]) exactly as ggml-cpu's
//! `ggml_rope_cache_init` / `rope_yarn` compute them per call, by `ir::interp::rope_cache`
//! itself, so the rotation is bit-identical to the interpreter's; the kernel itself is table lookups and four
//! multiplies per pair. Values past `n_rot` pass through unchanged.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use ir::graph::{RopeMode, RopeParams};

use super::elementwise::has_avx2;

/// `(cos, sin)` of every rotated pair at positions `0..n_pos`: `n_pos × n_rot/2` pairs.
#[derive(Clone, Debug)]
pub(crate) struct RopeTable {
    mode: RopeMode,
    n_rot: usize,
    /// Position-major: position `p`, pair `i` at `2·(p·n_rot/2 + i)` (cos, then sin).
    cs: Vec<f32>,
}

impl RopeTable {
    /// The table for `params` with optional frequency factors (`n_rot / 2` values) for
    /// positions `0..n_pos`.
    pub(crate) fn new(p: &RopeParams, freq_factors: Option<&[f32]>, n_pos: usize) -> RopeTable {
        let half = (p.n_rot / 2) as usize;
        let mut cs = Vec::with_capacity(n_pos * half * 2);
        let mut pairs = Vec::with_capacity(half);
        for pos in 0..n_pos {
            ir::interp::rope_cache(p, pos as f32, freq_factors, &mut pairs);
            cs.extend(pairs.iter().flat_map(|&(c, s)| [c, s]));
        }
        RopeTable {
            mode: p.mode,
            n_rot: p.n_rot as usize,
            cs,
        }
    }

    /// Rotates one head of `d` values at position `pos` (`pos < n_pos`, `d ≥ n_rot`): reads
    /// `src`, writes `dst` (values past `n_rot` copied).
    ///
    /// # Safety
    /// `src` valid for `d` reads, `dst` for `d` writes; `dst` may equal `src` but must not
    /// otherwise overlap it; `pos` below the table's `n_pos`.
    pub(crate) unsafe fn rotate(&self, src: *const f32, dst: *mut f32, d: usize, pos: usize) {
        let half = self.n_rot / 2;
        let cs = self.cs.as_ptr().add(pos * half * 2);
        match self.mode {
            RopeMode::Norm => {
                for i in 0..half {
                    let (c, s) = (*cs.add(2 * i), *cs.add(2 * i + 1));
                    let (x0, x1) = (*src.add(2 * i), *src.add(2 * i + 1));
                    *dst.add(2 * i) = x0 * c - x1 * s;
                    *dst.add(2 * i + 1) = x0 * s + x1 * c;
                }
            }
            RopeMode::Neox => {
                for i in 0..half {
                    let (c, s) = (*cs.add(2 * i), *cs.add(2 * i + 1));
                    let (x0, x1) = (*src.add(i), *src.add(i + half));
                    *dst.add(i) = x0 * c - x1 * s;
                    *dst.add(i + half) = x0 * s + x1 * c;
                }
            }
        }
        if !std::ptr::eq(src, dst) {
            for i in self.n_rot..d {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

/// Stores `n` f32 values as f16 (round to nearest even, as `GGML_FP32_TO_FP16` / F16C).
///
/// # Safety
/// `src` valid for `n` reads, `dst` for `n` 2-byte writes (any alignment); no overlap.
pub(crate) unsafe fn store_f16(src: *const f32, dst: *mut u8, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        i = store_f16_avx2(src, dst, n);
    }
    for i in i..n {
        let h = half::f16::from_f32(*src.add(i)).to_bits();
        std::ptr::write_unaligned(dst.add(2 * i) as *mut u16, h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store_f16_avx2(src: *const f32, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
        _mm_storeu_si128(dst.add(2 * i) as *mut __m128i, h);
        i += 8;
    }
    i
}

/// Stores `n` f32 values as f32 (an F32 KV cache).
///
/// # Safety
/// `src` valid for `n` reads, `dst` for `4n` bytes of writes; no overlap.
pub(crate) unsafe fn store_f32(src: *const f32, dst: *mut u8, n: usize) {
    std::ptr::copy_nonoverlapping(src as *const u8, dst, 4 * n);
}
