//! Rotary position embedding, as ggml-cpu's `ggml_compute_forward_rope` computes it for f32
//! (normal and neox modes, YaRN scaling, optional frequency factors). The angles come from
//! [`crate::ggml::cpu_math::rope_cache`] (`ggml_rope_cache_init`), which the backends' rope
//! tables share.

use super::layout::Lay;
use crate::ggml::cpu_math::rope_cache;
use crate::graph::{RopeMode, RopeParams};

/// Applies rope to `x {head, n_head, n_tokens}` with one position per token. With `fused`,
/// each rotated value is computed as GCC compiles ggml's `x0*cos - x1*sin` and
/// `x0*sin + x1*cos` with contraction on: the first product fused into a multiply-add.
pub(crate) fn rope(
    x: &[f32],
    lay: &Lay,
    pos: &[i32],
    freq_factors: Option<&[f32]>,
    p: &RopeParams,
    fused: bool,
) -> Vec<f32> {
    let mut out = x.to_vec();
    let n_rot = p.n_rot as usize;
    let half = n_rot / 2;
    let mut cache = Vec::with_capacity(half);
    for (t, &ps) in pos.iter().enumerate().take(lay.ne[2]) {
        rope_cache(p, ps as f32, freq_factors, &mut cache);
        for h in 0..lay.ne[1] {
            let o = lay.off([0, h, t, 0]);
            let src = &x[o..o + lay.ne[0]];
            let dst = &mut out[o..o + lay.ne[0]];
            for (i, &(c, s)) in cache.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Norm => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (src[a], src[b]);
                if fused {
                    dst[a] = x0.mul_add(c, -(x1 * s));
                    dst[b] = x0.mul_add(s, x1 * c);
                } else {
                    dst[a] = x0 * c - x1 * s;
                    dst[b] = x0 * s + x1 * c;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Shape;

    fn params(mode: RopeMode) -> RopeParams {
        RopeParams {
            mode,
            n_rot: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            n_ctx_orig: 256,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    #[test]
    fn position_zero_is_identity_and_norms_are_kept() {
        let lay = Lay::of(&Shape::new(&[6, 1, 2]), 0);
        let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.0).collect();
        for mode in [RopeMode::Norm, RopeMode::Neox] {
            let y = rope(&x, &lay, &[0, 5], None, &params(mode), false);
            assert_eq!(&y[..6], &x[..6]);
            // Values past n_rot pass through.
            assert_eq!(&y[10..12], &x[10..12]);
            let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((n(&y[6..10]) - n(&x[6..10])).abs() < 1e-5);
        }
    }

    #[test]
    fn first_pair_rotates_by_position() {
        let lay = Lay::of(&Shape::new(&[4, 1, 1]), 0);
        let y = rope(
            &[1.0, 0.0, 0.0, 0.0],
            &lay,
            &[3],
            None,
            &params(RopeMode::Norm),
            true,
        );
        assert!((y[0] - 3f32.cos()).abs() < 1e-6 && (y[1] - 3f32.sin()).abs() < 1e-6);
        let y = rope(
            &[1.0, 0.0, 0.0, 0.0],
            &lay,
            &[3],
            None,
            &params(RopeMode::Neox),
            false,
        );
        assert!((y[0] - 3f32.cos()).abs() < 1e-6 && (y[2] - 3f32.sin()).abs() < 1e-6);
    }
}
