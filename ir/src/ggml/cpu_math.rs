//! The few pieces of ggml-cpu arithmetic whose *definition* the reference interpreter
//! ([`crate::interp`]) and the backends' kernels share: a vectorized `expf` written out one
//! lane at a time, the reductions built on it, and the rope angle table. Each one is what
//! llama.cpp's CPU backend computes on x86-64 with AVX2 + FMA (the build that produced
//! `shared/reference/`), operation for operation.
//!
//! Why a module of its own: the interpreter is the oracle the kernels are checked against
//! (DESIGN.md principle 2), so production kernels must not call the interpreter's routines.
//! What both sides must compute from one definition lives here instead, with tests of its
//! own against plain maths; everything else (norms, softmax rows, dot products, attention)
//! is written independently on each side and compared by the backends' tests.
//!
//! All functions are plain scalar Rust, portable to any host; a backend's SIMD version
//! (8 lanes of [`v_expf`], say) must give the same bits, which its tests check against
//! these.

use crate::graph::RopeParams;

/// ggml's `hsum_float_8` (x86 quants.c): `((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))`.
#[inline(always)]
pub fn hsum8(x: &[f32; 8]) -> f32 {
    let r = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One entry of ggml-cpu's GELU table (`ggml_table_gelu_f16`, built in `ggml_cpu_init`
/// from `ggml_gelu_f32`, the tanh form) for the f16 value `x`, before rounding to f16:
/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))` with `1 + 0.044715·x·x` as one fused
/// multiply-add, as GCC contracts it when llama.cpp is built with FMA (every x86-64 build
/// with AVX2). The contraction changes one of the 65536 entries (x = -1.9990234, f16 0xbfff:
/// -0.0455017 instead of -0.0454712), which Gemma 3's prompts reach.
pub fn gelu_table_value(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

const R: u32 = 0x4b40_0000; // 0x1.8p23
const LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0
const LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20
const LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1
const P0: u32 = 0x3c07_2010; // 0x1.0e4020p-7
const P1: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5
const P2: u32 = 0x3e2a_af33; // 0x1.555e66p-3
const P3: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2
const P4: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `ggml_v_expf` for AVX2 + FMA (vec.h; adapted by ggml from Arm's optimized routines), one
/// lane: `x = n ln2 + b` with `n` rounded by the 1.5·2^23 trick, a degree-5 polynomial in
/// `b`, the exponent added to the bits; large |n| handled by the two-factor scaling. Within
/// about 1.5 ulp of `exp`; this is bit-for-bit what each lane of ggml's vector computes.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let r = c(R);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let big = n.abs() > 126.0;
    let u = b * b;
    let j = c(P0)
        .mul_add(b, c(P1))
        .mul_add(u, c(P2).mul_add(b, c(P3)))
        .mul_add(u, c(P4) * b);
    if !big {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `ggml_v_silu`, one lane: `x / (1 + v_expf(0 - x))`.
#[inline(always)]
pub fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_vec_soft_max_f32` (vec.cpp, AVX2 + FMA): `y = v_expf(x - max)` in groups of 8, each
/// group's sum ([`hsum8`]) added to an f64 total; the remaining values with libm's `expf`,
/// added one by one. Returns the total. Reads and writes `min(x.len(), y.len())` values.
pub fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let n = x.len().min(y.len());
    let whole = n & !7;
    let mut sum = 0f64;
    for i in (0..whole).step_by(8) {
        let mut v = [0f32; 8];
        for l in 0..8 {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
        sum += hsum8(&v) as f64;
    }
    for i in whole..n {
        let v = (x[i] - max).exp();
        sum += v as f64;
        y[i] = v;
    }
    sum
}

/// ggml's `ggml_rope_yarn_corr_dim`: the dimension at which `n_rot` rotations fit the
/// original context.
fn corr_dim(n_dims: u32, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// ggml's `ggml_rope_yarn_corr_dims`: the ramp's start and end dimensions.
pub fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(p.n_rot as f32 - 1.0)]
}

fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// The `(cos, sin)` of each of the `n_rot / 2` pairs for position `pos` (ggml's
/// `ggml_rope_cache_init`: theta multiplied by `theta_scale` in f32, pair after pair; YaRN
/// ramp and magnitude; frequency factors, `n_rot / 2` of them, divide theta). The
/// interpreter's rope and every backend's rope tables come from here, so they rotate by the
/// same angles. `out` is cleared first.
///
/// Panics when `freq_factors` holds fewer than `n_rot / 2` values.
pub fn rope_cache(
    p: &RopeParams,
    pos: f32,
    freq_factors: Option<&[f32]>,
    out: &mut Vec<(f32, f32)>,
) {
    out.clear();
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let cd = corr_dims(p);
    let mut theta = pos;
    for i in 0..(p.n_rot / 2) as usize {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let theta_extrap = theta / ff;
        let theta_interp = p.freq_scale * theta_extrap;
        let mut th = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let ramp_mix = yarn_ramp(cd[0], cd[1], 2 * i) * p.ext_factor;
            th = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
        }
        out.push((th.cos() * mscale, th.sin() * mscale));
        theta *= theta_scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::RopeMode;

    #[test]
    fn v_expf_is_close_to_exp_and_handles_the_range_ends() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (v_expf(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3.0 * f32::EPSILON as f64, "relative error {worst}");
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(100.0), f32::INFINITY);
        // Between the ends (|n| in 126..192) the two-factor path keeps subnormals.
        let t = v_expf(-95.0) as f64;
        assert!((t - (-95f64).exp()).abs() / (-95f64).exp() < 1e-5);
    }

    #[test]
    fn hsum8_adds_every_lane_once() {
        let x = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        assert_eq!(hsum8(&x), 255.0);
    }

    #[test]
    fn softmax_exponentials_sum_like_exp() {
        let x: Vec<f32> = (0..21).map(|i| i as f32 * 0.3 - 2.0).collect();
        let mut y = vec![0f32; 21];
        let s = soft_max_exp(&x, 4.0, &mut y);
        let want: f64 = x.iter().map(|&v| ((v - 4.0) as f64).exp()).sum();
        assert!((s - want).abs() / want < 1e-6);
        assert!((v_silu(2.0) - 2.0 / (1.0 + (-2f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn rope_angles_follow_theta_scale() {
        let p = RopeParams {
            mode: RopeMode::Norm,
            n_rot: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            n_ctx_orig: 256,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let mut cs = Vec::new();
        rope_cache(&p, 3.0, None, &mut cs);
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0], (3f32.cos(), 3f32.sin()));
        let th = 3.0 * 10000f32.powf(-0.5);
        assert!((cs[1].0 - th.cos()).abs() < 1e-6 && (cs[1].1 - th.sin()).abs() < 1e-6);
        // Frequency factors divide theta.
        rope_cache(&p, 3.0, Some(&[2.0, 1.0]), &mut cs);
        assert_eq!(cs[0], (1.5f32.cos(), 1.5f32.sin()));
    }
}
