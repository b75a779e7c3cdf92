//! The error of the block-data routines: dequantize, quantize and the reference dot products.

use super::GgmlType;

/// What is wrong with a request to dequantize, quantize or dot blocks of a GGML type.
///
/// Every variant names the type; length errors also say what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockDataError {
    /// The operation is not implemented for this type (e.g. dequantizing IQ2_XXS, or
    /// quantizing activations to Q4_0).
    #[error("{op} is not supported for GGML type {ty}")]
    Unsupported {
        /// The operation asked for: "dequantize", "quantize", "vec_dot".
        op: &'static str,
        /// The type it was asked for.
        ty: GgmlType,
    },
    /// A value count that is not a whole number of blocks.
    #[error("{ty}: {n_values} values is not a multiple of the block size {block_size}")]
    PartialBlock {
        /// The block type.
        ty: GgmlType,
        /// The number of values given.
        n_values: usize,
        /// Values per block of `ty`.
        block_size: usize,
    },
    /// A byte buffer whose length does not match the number of values.
    #[error(
        "{ty}: {what} is {actual} bytes, expected {expected} \
         ({n_values} values in blocks of {block_size} values / {type_size} bytes)"
    )]
    ByteLength {
        /// The block type of the buffer.
        ty: GgmlType,
        /// Which buffer: "src", "dst", "weight row", "activation row".
        what: &'static str,
        /// Its length in bytes.
        actual: usize,
        /// The length it must have.
        expected: usize,
        /// The number of values it should hold.
        n_values: usize,
        /// Values per block of `ty`.
        block_size: usize,
        /// Bytes per block of `ty`.
        type_size: usize,
    },
    /// Two rows that should hold the same number of values do not.
    #[error("{ty}: {what} has {actual} values, expected {expected}")]
    ValueCount {
        /// The type of the row the count comes from.
        ty: GgmlType,
        /// Which buffer has the wrong count.
        what: &'static str,
        /// Its number of values.
        actual: usize,
        /// The number it must have.
        expected: usize,
    },
    /// A byte buffer that is not a whole number of blocks, so its value count is unknown.
    #[error("{ty}: {what} is {actual} bytes, not a whole number of {type_size}-byte blocks")]
    RaggedBytes {
        /// The block type of the buffer.
        ty: GgmlType,
        /// Which buffer.
        what: &'static str,
        /// Its length in bytes.
        actual: usize,
        /// Bytes per block of `ty`.
        type_size: usize,
    },
}

/// The error of [`dequantize`](super::dequantize) (the same type as [`BlockDataError`]).
pub type DequantError = BlockDataError;

/// Checks that `n_values` is whole blocks of `ty` and `bytes` is exactly their size.
pub(crate) fn check_lengths(
    ty: GgmlType,
    what: &'static str,
    n_values: usize,
    bytes: usize,
) -> Result<(), BlockDataError> {
    let block_size = ty.block_size();
    let type_size = ty.type_size();
    if n_values % block_size != 0 {
        return Err(BlockDataError::PartialBlock {
            ty,
            n_values,
            block_size,
        });
    }
    let expected = (n_values / block_size) * type_size;
    if bytes != expected {
        return Err(BlockDataError::ByteLength {
            ty,
            what,
            actual: bytes,
            expected,
            n_values,
            block_size,
            type_size,
        });
    }
    Ok(())
}
