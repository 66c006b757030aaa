//! Typed errors of model configuration, weight loading and the forward pass.

use thiserror::Error;

use crate::gguf::GgufError;
use crate::safetensors::SafetensorsError;

/// Everything that can go wrong building or running a model. Loading checks
/// every tensor's name and shape against the configuration before any tensor
/// is built, so a corrupt or mismatched checkpoint gives one of these instead
/// of a panic inside the tensor library.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The GGUF reader rejected the file.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The safetensors reader rejected a file or the shard index.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// A file could not be read.
    #[error("I/O error reading {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// `config.json` is not JSON of the expected shape.
    #[error("invalid config {path}: {message}")]
    ConfigJson {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The architecture named by the checkpoint is not one this crate runs.
    #[error("unknown or unsupported architecture {0:?}")]
    UnknownArchitecture(String),
    /// A configuration field is missing, of the wrong type, or out of range.
    #[error("bad config field {field}: {message}")]
    BadConfig {
        /// The field (HF `config.json` key or GGUF metadata key).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint lacks a tensor the configuration requires.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor's shape differs from the one the configuration implies.
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// The tensor (canonical Hugging Face name).
        name: String,
        /// The shape implied by the configuration (row-major).
        expected: Vec<usize>,
        /// The shape in the file (row-major).
        found: Vec<usize>,
    },
    /// A tensor holds a NaN or an infinity.
    #[error("tensor {0} holds a non-finite value")]
    NonFiniteWeight(String),
    /// The input handed to the model is malformed (empty batch, ragged rows,
    /// token id outside the vocabulary, cache of another batch size, ...).
    #[error("bad input: {0}")]
    BadInput(String),
    /// The forward pass produced NaN logits (e.g. from extreme weights).
    #[error("the model produced non-finite output: {0}")]
    NonFiniteOutput(String),
    /// A tokenizer could not be loaded or failed on its input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template could not be found, compiled or rendered (a
    /// `raise_exception` in the template included: the message is its own).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The backend's device failed (a lost device, a failed submission).
    #[error("device: {0}")]
    Device(String),
    /// Two key/value caches cannot be joined into one batch
    /// ([`crate::KvCache::append_rows`]): different layer counts,
    /// precisions or head shapes, or a cache whose layers disagree with its
    /// rows (left by a failed step).
    #[error("key/value caches cannot be joined: {0}")]
    CacheMismatch(String),
}

impl ModelError {
    /// Shorthand for [`ModelError::BadConfig`].
    pub fn bad_config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadConfig {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`ModelError::BadInput`].
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::BadInput(message.into())
    }
}
