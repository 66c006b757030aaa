//! Typed errors of LoRA and DP-SGD fine-tuning.

use privmix_accountant::AccountantError;
use privmix_models::ModelError;
use thiserror::Error;

use crate::lora::LoraError;

/// Everything that can go wrong fine-tuning a member.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A hyper-parameter is out of range.
    #[error("bad training parameter {name}: {message}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// What is wrong.
        message: String,
    },
    /// No training blocks, or blocks of different lengths / under 2 tokens.
    #[error("bad training data: {0}")]
    BadData(String),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The adapter could not be built, read or written.
    #[error(transparent)]
    Lora(#[from] LoraError),
    /// The privacy accountant rejected its parameters.
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// The privacy-loss-distribution accountant failed (boxed: its error is large).
    #[error(transparent)]
    Pld(Box<privmix_accountant::PldError>),
    /// A loss or gradient is NaN or infinite.
    #[error("non-finite {0} at step {1}")]
    NonFinite(&'static str, usize),
    /// A checkpoint is missing, unreadable or does not fit this run.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file or directory.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl TrainError {
    pub(crate) fn bad(name: &'static str, message: impl Into<String>) -> Self {
        Self::BadParameter {
            name,
            message: message.into(),
        }
    }

    pub(crate) fn checkpoint(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        Self::Checkpoint {
            path: path.display().to_string(),
            message: message.to_string(),
        }
    }
}

impl From<privmix_accountant::PldError> for TrainError {
    fn from(e: privmix_accountant::PldError) -> Self {
        Self::Pld(Box::new(e))
    }
}
