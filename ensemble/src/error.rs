//! The error of the ensemble runner and of the stacked adapters it applies:
//! below both, so that neither imports the other for it.

use privmix_models::ModelError;
use thiserror::Error;

use crate::lora::LoraError;

/// Errors of the ensemble runner.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum EnsembleError {
    /// An adapter does not fit the base model, or could not be read.
    #[error(transparent)]
    Lora(#[from] LoraError),
    /// The model rejected the input or failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A row names a member the runner does not hold.
    #[error("row names member {member}, the runner holds {members}")]
    MemberOutOfRange {
        /// The member index.
        member: usize,
        /// Number of members.
        members: usize,
    },
    /// Malformed input (no rows, empty context, a block shorter than two
    /// tokens, a token count other than the row count, ...).
    #[error("bad input: {0}")]
    BadInput(String),
}
