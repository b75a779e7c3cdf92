//! Elementwise kernels over f32 rows: activations (SiLU, GELU, tanh, soft-capping), the GLUs
//! (`swiglu`, `geglu`), broadcasting add / mul, scale, softmax, and the vectorized `exp` the
//! attention kernel shares.
//!
//! Plain Rust (a first version, not Cranelift): AVX2 + FMA through `std::arch` when the host
//! has them ([`has_avx2`]), scalar loops otherwise. Each function matches what ggml-cpu
//! computes (`ggml-cpu/vec.h`, `vec.cpp`, `ops.cpp`) and what `ir::interp` computes, with one
//! documented difference: SiLU and the softmax exponentials use a vectorized `expf` (as
//! ggml's `ggml_v_expf` / `ggml_v_silu` do on AVX2), accurate to about 1 ulp instead of the
//! libm value the interpreter uses.
//!
//! Every kernel takes raw pointers: the plan lets results overwrite their sources in place
//! (`KernelOp::may_alias`), and each element is read before the same element is written.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether the host has AVX2, FMA and F16C (the vector paths of the plain-Rust kernels).
pub(crate) fn has_avx2() -> bool {
    static SIMD: OnceLock<bool> = OnceLock::new();
    *SIMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `sqrt(2 / π)` as ggml writes it.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// ggml's `GELU_COEF_A`.
const GELU_COEF_A: f32 = 0.044715;

/// `e^x` for 8 lanes (Cody–Waite range reduction to `r ∈ [-ln2/2, ln2/2]`, a degree-6
/// polynomial for `e^r`, `2^n` built in the exponent bits). Relative error about 1e-7;
/// inputs below -87.3 give about 1e-38 instead of 0, inputs above about 88.37 give infinity
/// (the softmax feeds only values ≤ 0; SiLU then gives -0 as it should).
///
/// # Safety
/// The host must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.336_54)),
        _mm256_set1_ps(88.722_83),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // r = x - n·ln2 in two steps (ln2 = HI + LO, HI exact in few bits).
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166_666_65));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // 2^n: n ∈ [-126, 128] after the clamp; 2^128 overflows to inf only for x ≥ 88.72.
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(e))
}

/// `x / (1 + e^-x)` for 8 lanes (ggml's `ggml_v_silu`).
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

/// `ggml_gelu_f32`, the tanh form.
#[inline]
fn gelu_exact(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
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
            .map(|b| half::f16::from_f32(gelu_exact(half::f16::from_bits(b).to_f32())).to_bits())
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
}

/// `y[i] = f(x[i])` for `n` values.
///
/// # Safety
/// `x` and `y` must be valid for `n` f32 reads / writes; they may be the same pointer but
/// must not otherwise overlap.
pub(crate) unsafe fn unary(f: Unary, x: *const f32, y: *mut f32, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if f == Unary::Silu && has_avx2() {
        i = silu_avx2(x, y, n);
    }
    for i in i..n {
        let v = *x.add(i);
        *y.add(i) = match f {
            Unary::Silu => silu(v),
            Unary::Gelu => gelu(v),
            Unary::Tanh => v.tanh(),
            Unary::SoftCap(cap) => (v * (1.0 / cap)).tanh() * cap,
            Unary::Scale(s) => v * s,
            Unary::Copy => v,
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

/// `y[i] = act(g[i]) · u[i]` for `n` values.
///
/// # Safety
/// `g`, `u` valid for `n` reads and `y` for `n` writes; `y` may equal `g` or `u` but must not
/// otherwise overlap them.
pub(crate) unsafe fn glu(f: Glu, g: *const f32, u: *const f32, y: *mut f32, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if f == Glu::Swiglu && has_avx2() {
        i = swiglu_avx2(g, u, y, n);
    }
    for i in i..n {
        let a = *g.add(i);
        let act = match f {
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

/// `e^(w[i] - max)` in place for `n` values; returns their sum in f64 (`ggml_vec_soft_max_f32`
/// sums in `ggml_float`).
///
/// # Safety
/// `w` valid for `n` reads and writes.
pub(crate) unsafe fn exp_shifted_sum(w: *mut f32, n: usize, max: f32) -> f64 {
    let mut i = 0;
    let mut sum = 0f64;
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        let (done, s) = exp_shifted_avx2(w, n, max);
        i = done;
        sum = s;
    }
    for i in i..n {
        let e = (*w.add(i) - max).exp();
        *w.add(i) = e;
        sum += e as f64;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(w: *mut f32, n: usize, max: f32) -> (usize, f64) {
    let m = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_pd();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(w.add(i)), m));
        _mm256_storeu_ps(w.add(i), e);
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
        i += 8;
    }
    let mut lanes = [0f64; 4];
    _mm256_storeu_pd(lanes.as_mut_ptr(), acc);
    (i, (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
}

/// `ggml_soft_max_ext` without mask over one row: `y = softmax(x · scale)`.
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
    let sum = exp_shifted_sum(y, n, max);
    let inv = (1.0 / sum) as f32;
    for i in 0..n {
        *y.add(i) *= inv;
    }
}
