//! Row lookup (`ggml_get_rows`): the token embedding (`token_embd`, any GGML type, read in
//! place from the mapped file) and the selection of output rows from an f32 activation.
//!
//! Plain Rust (a first version, not Cranelift): one row per token, dequantized with the
//! reference dequantizer [`ir::ggml::dequantize`], which is bit-exact with ggml's
//! `dequantize_row_*` (what `ggml_get_rows` calls).

use ir::ggml::{dequantize, GgmlType};

/// Dequantizes one stored row (`ggml_row_size(t, n)` bytes of `t`) into `n` f32 values.
///
/// Returns `false` (writing nothing) when `row` does not hold exactly `n` values of `t`.
///
/// # Safety
/// `dst` valid for `n` f32 writes and not overlapping `row`.
pub(crate) unsafe fn dequant_row(t: GgmlType, row: &[u8], dst: *mut f32, n: usize) -> bool {
    // SAFETY: the caller gives `n` writable values that nothing else reads during the call.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, n) };
    dequantize(t, row, out).is_ok()
}
