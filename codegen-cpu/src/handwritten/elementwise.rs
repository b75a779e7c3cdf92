//! Elementwise kernels over f32 rows: activations (SiLU, GELU, tanh, soft-capping), the GLUs
//! (`swiglu`, `geglu`), broadcasting add / mul, scale, softmax, and the vectorized `exp` the
//! attention kernel shares.
//!
//! Hand-written (not Cranelift): AVX2 + FMA through `std::arch` when the host has them
//! (`has_avx2`), scalar loops computing the same values otherwise. Each function matches
//! what ggml-cpu computes on x86-64 with AVX2 (`ggml-cpu/vec.h`, `vec.cpp`, `ops.cpp`) bit
//! for bit, as `ir::interp` does with `InterpOptions::llama_cpp`: SiLU and SwiGLU take
//! ggml's vectorized `ggml_v_expf` ([`exp256`]; one lane of it is
//! [`ir::ggml::cpu_math::v_expf`], the scalar path) for the values in whole groups of 8 and
//! libm's `expf` for the rest; the tests compare every kernel with the interpreter's routine
//! (`ir::interp::llama_cpu`) with `to_bits`.
//!
//! Every kernel takes raw pointers: the plan lets results overwrite their sources in place
//! (`KernelOp::may_alias`), and each element is read before the same element is written.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use ir::ggml::cpu_math::v_silu;

#[cfg(target_arch = "x86_64")]
use super::has_avx2;

/// ggml's `ggml_v_expf` for AVX2 + FMA (vec.h), 8 lanes: `x = n·ln2 + b` with `n` rounded
/// by the 1.5·2^23 trick, a degree-5 polynomial in `b`, the exponent added to the bits, the
/// two-factor scaling when some |n| > 126. Operation for operation what ggml computes, so
/// each lane equals [`ir::ggml::cpu_math::v_expf`] bit for bit (checked by the tests).
///
/// # Safety
/// The host must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    let f = |b: u32| _mm256_set1_ps(f32::from_bits(b));
    let r = f(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, f(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, f(0x35bf_be8e), _mm256_fnmadd_ps(n, f(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(f(0x3c07_2010), b, f(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(f(0x3e2a_af33), b, f(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(f(0x3f7f_fff6), b),
    );
    if _mm256_movemask_ps(c) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            d,
            _mm256_or_ps(
                _mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

/// `x / (1 + e^-x)` for 8 lanes (ggml's `ggml_v_silu`: `e^-x` by [`exp256`] of `0 - x`).
///
/// # Safety
/// The host must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn silu256(x: __m256) -> __m256 {
    let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// `ggml_silu_f32`: `x / (1 + e^-x)`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU as ggml-cpu evaluates it (`GGML_GELU_FP16`): 0 at or below -10, `x` at or above 10,
/// otherwise the f16 value of `gelu(f16(x))` (a 64K-entry table indexed by the f16 bits of
/// `x`, built on first use).
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let t = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| {
                let x = half::f16::from_bits(b).to_f32();
                half::f16::from_f32(ir::ggml::cpu_math::gelu_table_value(x)).to_bits()
            })
            .collect()
    });
    half::f16::from_bits(t[half::f16::from_f32(x).to_bits() as usize]).to_f32()
}

/// A unary elementwise function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Unary {
    /// `ggml_silu`.
    Silu,
    /// `ggml_gelu` (f16 table, see [`gelu`]).
    Gelu,
    /// `tanh`.
    Tanh,
    /// `cap · tanh(x / cap)`.
    SoftCap(f32),
    /// `x · s` (`ggml_scale`).
    Scale(f32),
    /// Copy (`ggml_cont`).
    Copy,
    /// The Walsh–Hadamard rotation of each group of `n` values ([`ir::ggml::fwht`]); rows
    /// only (the row length a multiple of `n`).
    Hadamard(u32),
}

/// `y[i] = f(x[i])` for `n` values (one row: SiLU takes ggml's vectorized form for the
/// values in whole groups of 8 from `x`, its scalar form for the rest, as
/// `ggml_vec_silu_f32`).
///
/// # Safety
/// `x` and `y` must be valid for `n` f32 reads / writes; they may be the same pointer but
/// must not otherwise overlap.
pub(crate) unsafe fn unary(f: Unary, x: *const f32, y: *mut f32, n: usize) {
    if let Unary::Hadamard(m) = f {
        std::ptr::copy(x, y, n);
        let row = std::slice::from_raw_parts_mut(y, n);
        row.chunks_exact_mut(m as usize).for_each(ir::ggml::fwht);
        return;
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if f == Unary::Silu && has_avx2() {
        i = silu_avx2(x, y, n);
    }
    let whole = n & !7;
    for i in i..n {
        let v = *x.add(i);
        *y.add(i) = match f {
            Unary::Silu if i < whole => v_silu(v),
            Unary::Silu => silu(v),
            Unary::Gelu => gelu(v),
            Unary::Tanh => v.tanh(),
            Unary::SoftCap(cap) => (v * (1.0 / cap)).tanh() * cap,
            Unary::Scale(s) => v * s,
            Unary::Copy | Unary::Hadamard(_) => v,
        };
    }
}

/// Vector part of SiLU; returns how many values it did (a multiple of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(x: *const f32, y: *mut f32, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(y.add(i), silu256(_mm256_loadu_ps(x.add(i))));
        i += 8;
    }
    i
}

/// A gated linear unit: `y = act(gate) · up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Glu {
    /// `silu(gate) · up` (`ggml_swiglu_split`).
    Swiglu,
    /// `gelu(gate) · up` (`ggml_geglu_split`, GELU from the f16 table).
    Geglu,
}

/// `y[i] = act(g[i]) · u[i]` for `n` values (one row, or a part of one starting at a
/// multiple of 8: SiLU as in [`unary`], `ggml_vec_swiglu_f32`).
///
/// # Safety
/// `g`, `u` valid for `n` reads and `y` for `n` writes; `y` may equal `g` or `u` but must not
/// otherwise overlap them.
pub(crate) unsafe fn glu(f: Glu, g: *const f32, u: *const f32, y: *mut f32, n: usize) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if f == Glu::Swiglu && has_avx2() {
        i = swiglu_avx2(g, u, y, n);
    }
    let whole = n & !7;
    for i in i..n {
        let a = *g.add(i);
        let act = match f {
            Glu::Swiglu if i < whole => v_silu(a),
            Glu::Swiglu => silu(a),
            Glu::Geglu => gelu(a),
        };
        *y.add(i) = act * *u.add(i);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(g: *const f32, u: *const f32, y: *mut f32, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        let s = silu256(_mm256_loadu_ps(g.add(i)));
        _mm256_storeu_ps(y.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
    i
}

/// A binary elementwise function (`ggml_add`, `ggml_mul`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binary {
    /// `a + b`.
    Add,
    /// `a · b`.
    Mul,
}

/// `y[i] = a[i] ∘ b[i % nb]` for `n` values (`nb` = the second source's row length, which
/// ggml repeats along the row; `nb == n` for same-shape rows).
///
/// # Safety
/// `a` valid for `n` reads, `b` for `nb` reads, `y` for `n` writes; `y` may equal `a` or `b`
/// but must not otherwise overlap them; `nb ≥ 1`.
pub(crate) unsafe fn binary(
    f: Binary,
    a: *const f32,
    b: *const f32,
    nb: usize,
    y: *mut f32,
    n: usize,
) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if nb == n && has_avx2() {
        i = binary_avx2(f, a, b, y, n);
    }
    for i in i..n {
        let (x, z) = (*a.add(i), *b.add(if nb == n { i } else { i % nb }));
        *y.add(i) = match f {
            Binary::Add => x + z,
            Binary::Mul => x * z,
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn binary_avx2(f: Binary, a: *const f32, b: *const f32, y: *mut f32, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        let (x, z) = (_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)));
        let r = match f {
            Binary::Add => _mm256_add_ps(x, z),
            Binary::Mul => _mm256_mul_ps(x, z),
        };
        _mm256_storeu_ps(y.add(i), r);
        i += 8;
    }
    i
}

/// ggml's `hsum_float_8`: `((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `ggml_vec_soft_max_f32` (AVX2 + FMA): `y = v_expf(x - max)` in groups of 8, each group's
/// [`hsum8`] added to an f64 total, the remaining values with `expf`; returns the total. The
/// same values as [`ir::ggml::cpu_math::soft_max_exp`] (which hosts without AVX2 call).
pub(crate) fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        return unsafe { soft_max_exp_avx2(x, max, y) };
    }
    ir::ggml::cpu_math::soft_max_exp(x, max, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn soft_max_exp_avx2(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let n = x.len().min(y.len());
    let whole = n & !7;
    let m = _mm256_set1_ps(max);
    let mut sum = 0f64;
    for i in (0..whole).step_by(8) {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), e);
        sum += hsum8(e) as f64;
    }
    for i in whole..n {
        let e = (x[i] - max).exp();
        y[i] = e;
        sum += e as f64;
    }
    sum
}

/// `ggml_soft_max_ext` without mask over one row: `y = softmax(x · scale)`, as the
/// interpreter computes it in llama.cpp's order (`ir::interp::llama_cpu::soft_max_row`:
/// [`soft_max_exp`], then `y · (1 / sum)`).
///
/// # Safety
/// `x` valid for `n` reads, `y` for `n` writes; `y` may equal `x`.
pub(crate) unsafe fn soft_max_row(x: *const f32, y: *mut f32, n: usize, scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for i in 0..n {
        let v = *x.add(i) * scale;
        *y.add(i) = v;
        max = max.max(v);
    }
    // ggml_vec_soft_max_f32's x86 numbers: ggml_v_expf in groups of 8, libm's expf after.
    let y = std::slice::from_raw_parts_mut(y, n);
    let mut w = [0f32; 64];
    let sum = if n <= w.len() {
        w[..n].copy_from_slice(y);
        soft_max_exp(&w[..n], max, y)
    } else {
        let w = y.to_vec();
        soft_max_exp(&w, max, y)
    };
    let inv = (1.0 / sum) as f32;
    for v in y.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::interp::llama_cpu;

    /// xorshift64 values uniform in `[lo, hi)`.
    fn random(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.to_bits() == y.to_bits(),
                "{what}[{i}]: {x:e} vs the interpreter's {y:e}"
            );
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn exp256_is_ggml_v_expf() {
        if !has_avx2() {
            modelc_tests::skip("the host lacks AVX2, FMA or F16C (the vector exp is not used)");
            return;
        }
        let mut x = random(4096, -110.0, 95.0, 1);
        x.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            -87.5,
            -126.5 * std::f32::consts::LN_2,
            -150.0,
            -200.0,
            0.0,
            -0.0,
            88.7,
        ]);
        while x.len() % 8 != 0 {
            x.push(1.0);
        }
        let mut y = vec![0f32; x.len()];
        for (xs, ys) in x.chunks_exact(8).zip(y.chunks_exact_mut(8)) {
            // SAFETY: AVX2 and FMA checked above; 8 values each.
            unsafe { _mm256_storeu_ps(ys.as_mut_ptr(), exp256(_mm256_loadu_ps(xs.as_ptr()))) };
        }
        let want: Vec<f32> = x.iter().map(|&v| ir::ggml::cpu_math::v_expf(v)).collect();
        assert_bits("v_expf", &y, &want);
    }

    #[test]
    fn swiglu_and_silu_are_the_interpreters() {
        // SmolLM2's n_ff, and a row with a tail beyond the groups of 8.
        for (n, seed) in [(1536usize, 2u64), (1541, 3)] {
            let g = random(n, -12.0, 12.0, seed);
            let u = random(n, -3.0, 3.0, seed + 10);
            let mut want = vec![0f32; n];
            llama_cpu::silu_row(&g, Some(&u), &mut want);
            let mut y = vec![0f32; n];
            // SAFETY: three rows of `n` values.
            unsafe { glu(Glu::Swiglu, g.as_ptr(), u.as_ptr(), y.as_mut_ptr(), n) };
            assert_bits("swiglu", &y, &want);
            llama_cpu::silu_row(&g, None, &mut want);
            // SAFETY: two rows of `n` values.
            unsafe { unary(Unary::Silu, g.as_ptr(), y.as_mut_ptr(), n) };
            assert_bits("silu", &y, &want);
            // In place, as the plan may run it.
            let mut z = g.clone();
            // SAFETY: one row, read before written element by element.
            unsafe { unary(Unary::Silu, z.as_ptr(), z.as_mut_ptr(), n) };
            assert_bits("silu in place", &z, &want);
        }
    }

    #[test]
    fn softmax_and_gelu_are_the_interpreters() {
        let x = random(577, -20.0, 20.0, 4);
        let mut want = vec![0f32; x.len()];
        llama_cpu::soft_max_row(&x, &mut want, 0.3);
        let mut y = vec![0f32; x.len()];
        // SAFETY: two rows of the same length.
        unsafe { soft_max_row(x.as_ptr(), y.as_mut_ptr(), x.len(), 0.3) };
        assert_bits("soft_max", &y, &want);
        let x = random(20000, -12.0, 12.0, 5);
        let g: Vec<f32> = x.iter().map(|&v| gelu(v)).collect();
        let want: Vec<f32> = x.iter().map(|&v| llama_cpu::gelu_f16(v)).collect();
        assert_bits("gelu", &g, &want);
    }

    #[test]
    fn add_and_mul_are_exact() {
        let a = random(576, -5.0, 5.0, 6);
        let b = random(576, -5.0, 5.0, 7);
        let mut y = vec![0f32; 576];
        // SAFETY: rows of 576 values.
        unsafe {
            binary(
                Binary::Add,
                a.as_ptr(),
                b.as_ptr(),
                576,
                y.as_mut_ptr(),
                576,
            )
        };
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, z)| x + z).collect();
        assert_bits("add", &y, &want);
        // SAFETY: as above, `b` repeated every 64 values.
        unsafe { binary(Binary::Mul, a.as_ptr(), b.as_ptr(), 64, y.as_mut_ptr(), 576) };
        let want: Vec<f32> = a.iter().enumerate().map(|(i, x)| x * b[i % 64]).collect();
        assert_bits("mul", &y, &want);
    }
}
