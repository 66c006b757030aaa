//! Typed errors of safetensors loading.

use thiserror::Error;

/// Everything that can go wrong loading safetensors checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// A file could not be read.
    #[error("I/O error reading {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// The `safetensors` crate rejected the file's header or layout.
    #[error("invalid safetensors file {file}: {message}")]
    Format {
        /// The file (or `<memory>`).
        file: String,
        /// The `safetensors` crate's description of the problem.
        message: String,
    },
    /// `model.safetensors.index.json` is not valid JSON of the expected shape.
    #[error("invalid safetensors index {path}: {message}")]
    Index {
        /// The index path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The index names a shard file that does not exist.
    #[error("shard {shard:?} named by the index is missing (looked for {path})")]
    MissingShard {
        /// The shard's file name as written in the index.
        shard: String,
        /// Where it was looked for.
        path: String,
    },
    /// A shard file name in the index that would leave the checkpoint folder.
    #[error("shard name {0:?} is not a plain file name")]
    BadShardName(String),
    /// No tensor of that name (in the file, or in the index's weight map).
    #[error("no tensor named {0:?}")]
    MissingTensor(String),
    /// The index maps a tensor to a shard that does not contain it.
    #[error("index maps tensor {tensor:?} to shard {shard:?}, which does not contain it")]
    TensorNotInShard {
        /// The tensor's name.
        tensor: String,
        /// The shard the index names.
        shard: String,
    },
    /// A dtype that cannot be converted to `f32` (only F32, F16, BF16 can).
    #[error(
        "tensor {tensor:?} has dtype {dtype}, which cannot be read as f32 (F32, F16, BF16 can)"
    )]
    UnsupportedDtype {
        /// The tensor's name.
        tensor: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor's dtype differs from the one the caller requires.
    #[error("tensor {tensor:?} has dtype {found}, expected {expected}")]
    DtypeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The dtype required.
        expected: String,
        /// The dtype found.
        found: String,
    },
    /// A tensor's shape differs from the one the caller requires.
    #[error("tensor {tensor:?} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape found.
        found: Vec<usize>,
    },
}
