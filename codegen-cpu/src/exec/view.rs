//! Resolved operands: a plan [`ir::plan::Value`] turned into a raw pointer into the arena,
//! a KV cache or a weight, with its shape and byte strides.

use ir::graph::{DType, MAX_DIMS};

/// A raw pointer that may cross threads. Every kernel writes only the elements its thread
/// owns (rows, row groups, heads); see each op's split.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ptr(pub *mut u8);

// SAFETY: the pointed-to buffers are owned by the `CompiledPlan` (or borrowed from the
// weights for its lifetime) and outlive every step; the chunks of one phase touch disjoint
// elements of any buffer they write, and the end of a phase separates a write from a read
// in a later phase.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

impl Ptr {
    /// The pointer `bytes` further.
    #[inline]
    pub fn add(self, bytes: usize) -> *mut u8 {
        // SAFETY (of the callers' use): offsets are checked against the buffer at lowering.
        self.0.wrapping_add(bytes)
    }

    /// As `*mut f32`, `bytes` further.
    #[inline]
    pub fn f32_at(self, bytes: usize) -> *mut f32 {
        self.add(bytes) as *mut f32
    }
}

/// A typed, strided operand resolved to a pointer (its first element).
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    /// First element.
    pub ptr: Ptr,
    /// Shape (upper bounds for the symbolic dimensions).
    pub ne: [usize; MAX_DIMS],
    /// Byte strides.
    pub nb: [usize; MAX_DIMS],
    /// Bit `d`: dimension `d` is the KV length.
    pub kv: u8,
    /// Element type.
    pub dtype: DType,
}

impl View {
    /// The actual sizes for KV length `kv_len`.
    #[inline]
    pub fn dims(&self, kv_len: usize) -> [usize; MAX_DIMS] {
        let mut ne = self.ne;
        for (d, n) in ne.iter_mut().enumerate() {
            if self.kv & (1 << d) != 0 {
                *n = kv_len.min(*n);
            }
        }
        ne
    }

    /// Number of rows (product of dims 1..4) for KV length `kv_len`.
    #[inline]
    pub fn n_rows(&self, kv_len: usize) -> usize {
        let ne = self.dims(kv_len);
        ne[1] * ne[2] * ne[3]
    }

    /// The first byte of flattened row `r` (dims 1..4, innermost first) given actual dims.
    #[inline]
    pub fn row(&self, r: usize, ne: &[usize; MAX_DIMS]) -> *mut u8 {
        let i1 = r % ne[1];
        let i2 = (r / ne[1]) % ne[2];
        let i3 = r / (ne[1] * ne[2]);
        self.ptr
            .add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// The first byte of row `(i1, i2, i3)`.
    #[inline]
    pub fn at(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        self.ptr
            .add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// This view in the KV memory at `kv`, for a view of a KV cache, whose `ptr` the
    /// lowering sets to its offset in a sequence's KV memory.
    #[inline]
    pub fn rebase(&self, kv: Ptr) -> View {
        View {
            ptr: Ptr(kv.add(self.ptr.0 as usize)),
            ..*self
        }
    }

    /// Whether elements along dim 0 are adjacent (stride = element size).
    pub fn rows_contiguous(&self) -> bool {
        self.ne[0] <= 1 || self.nb[0] as u64 == self.dtype.type_size()
    }
}
