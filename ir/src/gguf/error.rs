//! Errors of the GGUF reader and writer.

use std::path::PathBuf;

/// What went wrong while reading or writing a GGUF file. Every variant names where: the file,
/// and for format errors the byte offset and the key or tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, mapped or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        error: std::io::Error,
    },
    /// The bytes are not a valid GGUF file.
    #[error("{}invalid GGUF at byte {offset}: {msg}", path_prefix(path))]
    Invalid {
        /// The file, when the data came from one.
        path: Option<PathBuf>,
        /// Byte offset in the file where the problem was found.
        offset: u64,
        /// What was wrong, naming the key or tensor.
        msg: String,
    },
    /// A split model's shards do not fit together (missing, extra or mismatched shard).
    #[error("{}: {msg}", path.display())]
    Split {
        /// The shard (or expected shard) involved.
        path: PathBuf,
        /// What was wrong.
        msg: String,
    },
    /// A metadata key has a type other than the one asked for.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    KeyType {
        /// The key.
        key: String,
        /// What the caller needed.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// The writer was asked to write something GGUF cannot hold.
    #[error("cannot write GGUF: {0}")]
    Write(String),
}

fn path_prefix(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!("{}: ", p.display()),
        None => String::new(),
    }
}

impl GgufError {
    /// Attaches `path` to a format error that was found in memory.
    pub(crate) fn with_path(self, p: &std::path::Path) -> GgufError {
        match self {
            GgufError::Invalid {
                path: None,
                offset,
                msg,
            } => GgufError::Invalid {
                path: Some(p.to_path_buf()),
                offset,
                msg,
            },
            other => other,
        }
    }
}
