//! How the interpreter stores a tensor, and the data-movement ops (get_rows, view, permute,
//! reshape, cont).
//!
//! Every float tensor is one `Vec<f32>` (F16 and BF16 tensors hold values exactly
//! representable in their type), laid out contiguously in `ne` order with the *upper-bound*
//! sizes as strides: a tensor with the symbolic KV dimension keeps the same element offsets
//! whatever the actual KV length, as a buffer planned for the bound would. Only the first
//! `kv_len` entries of a symbolic dimension are computed; the rest stay zero.

use crate::graph::{Shape, MAX_DIMS};

/// Actual sizes and element strides of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lay {
    /// Actual sizes (symbolic dimensions resolved).
    pub ne: [usize; MAX_DIMS],
    /// Element strides (from the upper-bound sizes); `st[0] == 1`.
    pub st: [usize; MAX_DIMS],
    /// Elements to allocate (the upper-bound element count).
    pub alloc: usize,
}

impl Lay {
    /// The layout of `shape` when the KV length is `kv_len`.
    pub fn of(shape: &Shape, kv_len: u64) -> Lay {
        let r = shape.resolve(kv_len);
        let mut ne = [0usize; MAX_DIMS];
        let mut st = [1usize; MAX_DIMS];
        for d in 0..MAX_DIMS {
            ne[d] = r[d] as usize;
            if d > 0 {
                st[d] = st[d - 1] * shape.ne[d - 1] as usize;
            }
        }
        let alloc = st[3] * shape.ne[3] as usize;
        Lay { ne, st, alloc }
    }

    /// Offset of element `i`.
    #[inline]
    pub fn off(&self, i: [usize; MAX_DIMS]) -> usize {
        i[0] + i[1] * self.st[1] + i[2] * self.st[2] + i[3] * self.st[3]
    }

    /// Number of rows (actual): `ne1 * ne2 * ne3`.
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Offset of the start of row `r` (rows counted in `ne1, ne2, ne3` order).
    #[inline]
    pub fn row_off(&self, r: usize) -> usize {
        let i1 = r % self.ne[1];
        let i2 = (r / self.ne[1]) % self.ne[2];
        let i3 = r / (self.ne[1] * self.ne[2]);
        i1 * self.st[1] + i2 * self.st[2] + i3 * self.st[3]
    }

    /// The row index (in `ne1, ne2, ne3` order) split into its three coordinates.
    #[inline]
    pub fn row_coords(&self, r: usize) -> [usize; 3] {
        [
            r % self.ne[1],
            (r / self.ne[1]) % self.ne[2],
            r / (self.ne[1] * self.ne[2]),
        ]
    }

    /// Whether the actual elements are back to back (no symbolic padding in use).
    pub fn is_dense(&self) -> bool {
        let mut want = 1;
        for d in 0..MAX_DIMS {
            if self.ne[d] != 1 && self.st[d] != want {
                return false;
            }
            want *= self.ne[d];
        }
        true
    }
}

/// Calls `f(index, offset)` for every element of `lay`, in `ne` order.
pub(crate) fn for_each_index(lay: &Lay, mut f: impl FnMut([usize; MAX_DIMS], usize)) {
    for i3 in 0..lay.ne[3] {
        for i2 in 0..lay.ne[2] {
            for i1 in 0..lay.ne[1] {
                let base = i1 * lay.st[1] + i2 * lay.st[2] + i3 * lay.st[3];
                for i0 in 0..lay.ne[0] {
                    f([i0, i1, i2, i3], base + i0);
                }
            }
        }
    }
}

/// `ggml_view_4d` on a stored tensor: element `i` of the view is the source element at
/// `(offset + Σ i_d nb_d) / elem_size`. `elem_size` is the byte size of one source element.
pub(crate) fn view(
    src: &[f32],
    out_lay: &Lay,
    nb: &[u64; MAX_DIMS],
    offset: u64,
    elem_size: u64,
) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; out_lay.alloc];
    let mut err = None;
    for_each_index(out_lay, |i, o| {
        let byte = offset + (0..MAX_DIMS).map(|d| i[d] as u64 * nb[d]).sum::<u64>();
        match src.get((byte / elem_size) as usize) {
            Some(v) if byte % elem_size == 0 => out[o] = *v,
            _ => {
                err = Some(format!(
                    "view element {i:?} at byte {byte} is outside the source"
                ))
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// `ggml_permute` materialized: source dimension `d` becomes dimension `axes[d]`.
pub(crate) fn permute(
    src: &[f32],
    src_lay: &Lay,
    out_lay: &Lay,
    axes: &[u8; MAX_DIMS],
) -> Vec<f32> {
    let mut out = vec![0f32; out_lay.alloc];
    for_each_index(src_lay, |i, s| {
        let mut o = [0usize; MAX_DIMS];
        for d in 0..MAX_DIMS {
            o[axes[d] as usize] = i[d];
        }
        out[out_lay.off(o)] = src[s];
    });
    out
}

/// A copy of the actual elements of `src` into layout `out_lay` (same actual sizes).
pub(crate) fn copy_to(src: &[f32], src_lay: &Lay, out_lay: &Lay) -> Vec<f32> {
    let mut out = vec![0f32; out_lay.alloc];
    for_each_index(src_lay, |i, s| out[out_lay.off(i)] = src[s]);
    out
}
