//! Rotary position embedding and the KV cache store (`ggml_rope_ext`, `ggml_set_rows` into
//! the cache), the pieces of the fused `rope+kv_store` kernel.
//!
//! Hand-written (not Cranelift). The `(cos, sin)` of every pair at every position (up to
//! 16384 positions; later ones when first used) is computed once at load time
//! ([`RopeTable`]) exactly as ggml-cpu's `ggml_rope_cache_init` / `rope_yarn` compute them
//! per call, by [`ir::ggml::cpu_math::rope_cache`] (the definition
//! the interpreter uses too), and the rotation fuses its multiply-adds as GCC does in ggml
//! (and the interpreter in llama.cpp mode), so results are bit-identical to the
//! interpreter's. Values past `n_rot` pass through unchanged. The rotation is scalar code
//! (`mul_add`), compiled with FMA instructions on x86-64 hosts that have them: the same
//! arithmetic either way; the f16 cache store uses F16C there, else `half`'s conversion
//! (both round to nearest even).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use ir::ggml::cpu_math::rope_cache;
use ir::graph::{RopeMode, RopeParams};

#[cfg(target_arch = "x86_64")]
use super::has_avx2;

/// Positions a [`RopeTable`] holds at most: `4 · n_rot` bytes each (4 MiB for heads of 64).
/// A context of 128K positions would otherwise cost 32–64 MiB and tens of milliseconds of
/// start-up for angles most runs never use.
const TABLE_POSITIONS: usize = 16384;

thread_local! {
    /// The `(cos, sin)` pairs of the last position past a table that this thread rotated
    /// by (the heads of a token share it), keyed by the table's id and the position.
    static PAST_TABLE: std::cell::RefCell<(u64, usize, Vec<f32>)> =
        const { std::cell::RefCell::new((0, usize::MAX, Vec::new())) };
}

/// The next [`RopeTable`]'s id (never 0, never reused).
static NEXT_TABLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// `(cos, sin)` of every rotated pair at positions `0..n_pos` (at most [`TABLE_POSITIONS`];
/// later ones are computed when used, by the same function): `n_pos × n_rot/2` pairs.
#[derive(Clone, Debug)]
pub(crate) struct RopeTable {
    mode: RopeMode,
    n_rot: usize,
    /// The parameters and frequency factors, for rotations by positions outside the table
    /// ([`RopeTable::rotate_by`]).
    params: RopeParams,
    factors: Option<Vec<f32>>,
    /// Position-major: position `p`, pair `i` at `2·(p·n_rot/2 + i)` (cos, then sin).
    cs: Vec<f32>,
    /// This table's key in the per-thread cache of positions past it.
    id: u64,
}

impl RopeTable {
    /// The table for `params` with optional frequency factors (`n_rot / 2` values) for
    /// positions `0..n_pos` (the first [`TABLE_POSITIONS`] of them computed now).
    pub(crate) fn new(p: &RopeParams, freq_factors: Option<&[f32]>, n_pos: usize) -> RopeTable {
        let n_pos = n_pos.min(TABLE_POSITIONS);
        let half = (p.n_rot / 2) as usize;
        let mut cs = Vec::with_capacity(n_pos * half * 2);
        let mut pairs = Vec::with_capacity(half);
        for pos in 0..n_pos {
            rope_cache(p, pos as f32, freq_factors, &mut pairs);
            cs.extend(pairs.iter().flat_map(|&(c, s)| [c, s]));
        }
        RopeTable {
            mode: p.mode,
            n_rot: p.n_rot as usize,
            params: *p,
            factors: freq_factors.map(<[f32]>::to_vec),
            cs,
            id: NEXT_TABLE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The `(cos, sin)` pairs of position `pos` (any, negative included), as the table's.
    pub(crate) fn pairs_at(&self, pos: i64, out: &mut Vec<(f32, f32)>) {
        rope_cache(&self.params, pos as f32, self.factors.as_deref(), out);
    }

    /// Rotates one head of `d` values in place by the angles of position `pos` given as
    /// its `pairs` ([`RopeTable::pairs_at`]): what llama.cpp's K shift does to a cached key
    /// (`build_rope_shift`: `ggml_rope_ext` by the position delta), in the same arithmetic
    /// as [`RopeTable::rotate`].
    ///
    /// # Safety
    /// `x` valid for `d` reads and writes, `d ≥ n_rot`; `pairs` has `n_rot / 2` entries.
    pub(crate) unsafe fn rotate_by(&self, x: *mut f32, pairs: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        let (sa, sb) = match self.mode {
            RopeMode::Norm => (2, 1),
            RopeMode::Neox => (1, half),
        };
        for (i, &(c, s)) in pairs.iter().enumerate().take(half) {
            let (a, b) = (sa * i, sa * i + sb);
            let (x0, x1) = (*x.add(a), *x.add(b));
            *x.add(a) = x0.mul_add(c, -(x1 * s));
            *x.add(b) = x0.mul_add(s, x1 * c);
        }
    }

    /// Rotates one head of `d` values at position `pos` (any, `d ≥ n_rot`): reads
    /// `src`, writes `dst` (values past `n_rot` copied). Each pair as GCC compiles ggml's
    /// `x0*cos - x1*sin`, `x0*sin + x1*cos` (contraction on): `fma(x0, cos, -(x1*sin))` and
    /// `fma(x0, sin, x1*cos)`, as `ir::interp::llama_cpu::rope`.
    ///
    /// # Safety
    /// `src` valid for `d` reads, `dst` for `d` writes; `dst` may equal `src` but must not
    /// otherwise overlap it.
    pub(crate) unsafe fn rotate(&self, src: *const f32, dst: *mut f32, d: usize, pos: usize) {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return self.rotate_fma(src, dst, d, pos);
        }
        self.rotate_body(src, dst, d, pos)
    }

    /// [`RopeTable::rotate`] with FMA instructions (the same arithmetic as `mul_add`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn rotate_fma(&self, src: *const f32, dst: *mut f32, d: usize, pos: usize) {
        self.rotate_body(src, dst, d, pos)
    }

    #[inline(always)]
    unsafe fn rotate_body(&self, src: *const f32, dst: *mut f32, d: usize, pos: usize) {
        let half = self.n_rot / 2;
        if (pos + 1) * half * 2 > self.cs.len() {
            // Past the table: this position's pairs, computed once per thread and token.
            return PAST_TABLE.with(|c| {
                let mut c = c.borrow_mut();
                if c.0 != self.id || c.1 != pos {
                    let mut pairs = Vec::with_capacity(half);
                    rope_cache(
                        &self.params,
                        pos as f32,
                        self.factors.as_deref(),
                        &mut pairs,
                    );
                    c.2.clear();
                    c.2.extend(pairs.iter().flat_map(|&(co, si)| [co, si]));
                    (c.0, c.1) = (self.id, pos);
                }
                self.rotate_with(c.2.as_ptr(), src, dst, d)
            });
        }
        self.rotate_with(self.cs.as_ptr().add(pos * half * 2), src, dst, d)
    }

    /// [`RopeTable::rotate_body`] with the position's `(cos, sin)` pairs at `cs`.
    #[inline(always)]
    unsafe fn rotate_with(&self, cs: *const f32, src: *const f32, dst: *mut f32, d: usize) {
        let half = self.n_rot / 2;
        let (sa, sb) = match self.mode {
            RopeMode::Norm => (2, 1),
            RopeMode::Neox => (1, half),
        };
        for i in 0..half {
            let (c, s) = (*cs.add(2 * i), *cs.add(2 * i + 1));
            let (a, b) = (sa * i, sa * i + sb);
            let (x0, x1) = (*src.add(a), *src.add(b));
            *dst.add(a) = x0.mul_add(c, -(x1 * s));
            *dst.add(b) = x0.mul_add(s, x1 * c);
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
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Rope of heads of 64 in `mode` with frequency base `base`, no scaling.
    fn params(mode: RopeMode, base: f32) -> RopeParams {
        RopeParams {
            mode,
            n_rot: 64,
            freq_base: base,
            freq_scale: 1.0,
            n_ctx_orig: 8192,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    /// Past [`TABLE_POSITIONS`] a rotation computes its angles when used: the same values
    /// as a rotation by [`RopeTable::pairs_at`] (the function the table is made with), also
    /// with two tables taking turns on one thread (the per-thread cache keys on the table).
    #[test]
    fn positions_past_the_table_rotate_by_the_same_angles() {
        let tables = [
            RopeTable::new(&params(RopeMode::Neox, 10000.0), None, 40000),
            RopeTable::new(&params(RopeMode::Neox, 500000.0), None, 40000),
        ];
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut pairs = Vec::new();
        for pos in [
            TABLE_POSITIONS - 1,
            TABLE_POSITIONS,
            20000,
            20000,
            39999,
            TABLE_POSITIONS,
        ] {
            for t in &tables {
                let mut got = vec![0f32; 64];
                let mut want = x.clone();
                t.pairs_at(pos as i64, &mut pairs);
                // SAFETY: 64 values each; `got` does not overlap `x`.
                unsafe {
                    t.rotate(x.as_ptr(), got.as_mut_ptr(), 64, pos);
                    t.rotate_by(want.as_mut_ptr(), &pairs);
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "position {pos}");
            }
        }
    }

    #[test]
    fn rotation_is_the_interpreters() {
        let mut s = 9u64;
        let x: Vec<f32> = (0..64 * 9 * 5)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        let pos = [0, 1, 17, 300, 1023];
        for mode in [RopeMode::Norm, RopeMode::Neox] {
            let p = params(mode, 100000.0);
            let want = ir::interp::llama_cpu::rope(&x, [64, 9, 5], &pos, None, &p);
            let table = RopeTable::new(&p, None, 1024);
            let mut y = x.clone();
            for (t, &ps) in pos.iter().enumerate() {
                for h in 0..9 {
                    let o = (t * 9 + h) * 64;
                    // SAFETY: one head of 64 values, in place.
                    unsafe {
                        table.rotate(y.as_ptr().add(o), y.as_mut_ptr().add(o), 64, ps as usize)
                    };
                }
            }
            assert!(
                y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{mode:?}"
            );
        }
    }
}
