//! Typed errors of LoRA adapters: reading and writing the PEFT format and
//! checking an adapter against the base model it is applied to.

use privmix_models::ModelError;
use privmix_models::safetensors::SafetensorsError;
use thiserror::Error;

/// Everything that can go wrong loading, saving, building or applying a LoRA
/// adapter. An adapter made for another base model (other layer count or
/// widths), of inconsistent rank, or using a PEFT feature this crate does not
/// implement is rejected with one of these, never applied approximately.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum LoraError {
    /// A file the PEFT format requires is absent.
    #[error("missing file {0}")]
    MissingFile(String),
    /// A file could not be read or written.
    #[error("I/O error on {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// `adapter_config.json` is not JSON of the expected shape.
    #[error("invalid adapter config {path}: {message}")]
    ConfigJson {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A configuration value asks for a PEFT feature this crate does not
    /// implement (another `peft_type`, trained biases, DoRA, per-module ranks, ...).
    #[error("unsupported adapter config {field}: {message}")]
    Unsupported {
        /// The `adapter_config.json` field.
        field: String,
        /// What is unsupported.
        message: String,
    },
    /// A configuration value is out of range (rank 0, non-finite alpha, ...).
    #[error("bad adapter config {field}: {message}")]
    BadConfig {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The safetensors reader rejected the adapter file.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// A tensor name is not a LoRA factor of a projection this crate knows.
    #[error("tensor {0} is not a LoRA factor of a known projection")]
    UnknownTensor(String),
    /// A projection has one LoRA factor but not the other.
    #[error("projection {site} has no {factor}")]
    MissingFactor {
        /// The projection (PEFT module path).
        site: String,
        /// `lora_A` or `lora_B`.
        factor: &'static str,
    },
    /// A factor's rank differs from the configuration's `r`.
    #[error("tensor {tensor}: rank {found}, the config says r = {expected}")]
    RankMismatch {
        /// The tensor (or site).
        tensor: String,
        /// The rank of the configuration.
        expected: usize,
        /// The rank found.
        found: usize,
    },
    /// A factor's shape does not fit the base model's projection.
    #[error("tensor {tensor}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// The tensor (or site).
        tensor: String,
        /// The shape the base model implies.
        expected: Vec<usize>,
        /// The shape found.
        found: Vec<usize>,
    },
    /// The adapter targets a projection the base model does not have (a
    /// layer past the last one, a module of another architecture): it was
    /// made for another base model.
    #[error("the base model has no projection {0} (adapter for another base model?)")]
    SiteNotInBase(String),
    /// A tensor targets a module that `target_modules` does not list.
    #[error("tensor {tensor} targets module {module}, not in target_modules")]
    UntargetedModule {
        /// The tensor.
        tensor: String,
        /// Its module name.
        module: String,
    },
    /// The adapter has no LoRA factor at all.
    #[error("the adapter holds no LoRA factors")]
    EmptyAdapter,
    /// A factor holds a NaN or an infinity.
    #[error("tensor {0} holds a non-finite value")]
    NonFinite(String),
    /// A factor entry (`B` after the member's scale is folded in) lies
    /// beyond f16's range, so factors held in f16 cannot represent it.
    #[error("tensor {tensor}: entry {value} is beyond f16's range (|x| < 65520)")]
    HalfOverflow {
        /// The factor (with `(scaled)` for `B`).
        tensor: String,
        /// The entry.
        value: f32,
    },
    /// The base model's architecture has no LoRA sites this crate knows.
    #[error("unsupported base model: {0}")]
    UnsupportedBase(String),
    /// An error from the model crate.
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl LoraError {
    pub(crate) fn io(path: &std::path::Path, e: &std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }

    pub(crate) fn unsupported(field: &str, message: impl Into<String>) -> Self {
        Self::Unsupported {
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn bad_config(field: &str, message: impl Into<String>) -> Self {
        Self::BadConfig {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
