//! Tensor shapes as ggml `ne` (innermost dimension first), with the KV length as the one
//! symbolic dimension.

use serde::{Deserialize, Serialize};

/// Number of dimensions of every IR shape (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// A tensor shape: `ne[0]` is the innermost (contiguous) dimension, as in ggml; unused
/// trailing dimensions are 1.
///
/// Every dimension is a fixed number except those flagged in `kv`: bit `d` set means `ne[d]` is
/// the KV length, known only when a step runs (positions 0 ..= the last position of the
/// ubatch), and `ne[d]` holds its upper bound (the KV cache size, `n_ctx`). Memory planning
/// uses the upper bound; the interpreter and kernels use the actual length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Sizes, innermost first (upper bounds for the KV dimensions).
    pub ne: [u64; MAX_DIMS],
    /// Bit `d` set: dimension `d` is the symbolic KV length.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

impl Shape {
    /// A fixed shape from up to 4 sizes, innermost first (missing ones are 1).
    ///
    /// # Panics
    /// If more than 4 sizes are given (a programming error, never input-dependent).
    pub fn new(ne: &[u64]) -> Shape {
        assert!(ne.len() <= MAX_DIMS, "shape with {} dims", ne.len());
        let mut out = [1u64; MAX_DIMS];
        out[..ne.len()].copy_from_slice(ne);
        Shape { ne: out, kv: 0 }
    }

    /// This shape with dimension `d` marked as the KV length (its size becomes the bound).
    pub fn with_kv_dim(mut self, d: usize) -> Shape {
        self.kv |= 1 << d;
        self
    }

    /// Whether dimension `d` is the symbolic KV length.
    pub fn is_kv(&self, d: usize) -> bool {
        self.kv & (1 << d) != 0
    }

    /// Whether any dimension is symbolic.
    pub fn has_kv(&self) -> bool {
        self.kv != 0
    }

    /// Number of elements at the upper bound, or `None` on overflow.
    pub fn n_elements(&self) -> Option<u64> {
        self.ne.iter().try_fold(1u64, |a, &n| a.checked_mul(n))
    }

    /// Number of dimensions up to the last one that is not 1 (at least 1), as ggml prints.
    pub fn rank(&self) -> usize {
        (1..MAX_DIMS)
            .rev()
            .find(|&d| self.ne[d] != 1 || self.is_kv(d))
            .map_or(1, |d| d + 1)
    }

    /// The actual sizes once the KV length is `kv_len` (symbolic dimensions take `kv_len`).
    pub fn resolve(&self, kv_len: u64) -> [u64; MAX_DIMS] {
        let mut ne = self.ne;
        for (d, n) in ne.iter_mut().enumerate() {
            if self.is_kv(d) {
                *n = kv_len;
            }
        }
        ne
    }

    /// Whether `b` can be broadcast onto `self` the way ggml's binary ops repeat their second
    /// source (`ggml_can_repeat`): every `self.ne[d]` is a multiple of `b.ne[d]`, and a
    /// dimension of `b` that is not 1 agrees with `self` on being symbolic.
    pub fn can_repeat(&self, b: &Shape) -> bool {
        (0..MAX_DIMS).all(|d| {
            let sizes = if b.ne[d] == 0 {
                self.ne[d] == 0
            } else {
                self.ne[d] % b.ne[d] == 0
            };
            sizes && (b.ne[d] == 1 && !b.is_kv(d) || self.is_kv(d) == b.is_kv(d))
        })
    }
}

impl std::fmt::Display for Shape {
    /// `{576, 7}`; a symbolic dimension prints as `kv≤256`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("{")?;
        for d in 0..self.rank() {
            if d > 0 {
                f.write_str(", ")?;
            }
            if self.is_kv(d) {
                write!(f, "kv≤{}", self.ne[d])?;
            } else {
                write!(f, "{}", self.ne[d])?;
            }
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_rank() {
        assert_eq!(Shape::new(&[576, 7]).to_string(), "{576, 7}");
        assert_eq!(Shape::new(&[576]).to_string(), "{576}");
        assert_eq!(Shape::new(&[1, 1]).to_string(), "{1}");
        let s = Shape::new(&[64, 2, 256]).with_kv_dim(2);
        assert_eq!(s.to_string(), "{64, 2, kv≤256}");
        assert_eq!(s.resolve(9), [64, 2, 9, 1]);
    }

    #[test]
    fn repeat_rules() {
        let a = Shape::new(&[576, 7]);
        assert!(a.can_repeat(&Shape::new(&[576])));
        assert!(!a.can_repeat(&Shape::new(&[575])));
        let k = Shape::new(&[256, 7]).with_kv_dim(0);
        assert!(!k.can_repeat(&Shape::new(&[256, 7])));
        assert!(k.can_repeat(&Shape::new(&[1, 7])));
    }
}
