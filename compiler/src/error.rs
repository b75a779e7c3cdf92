//! The error of hyperparameter reading and lowering.

use ir::graph::GraphError;

/// What stops a model from being read or lowered. Every variant names the key, tensor or
/// architecture involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// `general.architecture` is absent.
    #[error("metadata key 'general.architecture' is missing")]
    NoArch,
    /// An architecture modelc cannot lower.
    #[error("architecture '{0}' is not supported (supported: {list})", list = crate::arch::Arch::supported())]
    UnsupportedArch(String),
    /// A required metadata key is absent.
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    /// A metadata key of the wrong type or with an unusable value.
    #[error("metadata key '{key}': {msg}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A required tensor is absent.
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    /// A tensor of the wrong shape (as llama.cpp's `create_tensor` checks).
    #[error("tensor '{name}' has shape {found}, expected {expected}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Its shape in the file.
        found: String,
        /// The shape the hyperparameters imply.
        expected: String,
    },
    /// A tensor whose GGML type the IR cannot hold or the interpreter cannot compute with.
    #[error("tensor '{name}' has type {ty}, which modelc does not support")]
    TensorType {
        /// Tensor name.
        name: String,
        /// Its GGML type name.
        ty: String,
    },
    /// A model feature modelc does not implement yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The lowering built an ill-typed graph (a bug, or shapes the checks above missed).
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
