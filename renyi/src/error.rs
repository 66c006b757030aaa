//! The one error type of this crate.

use thiserror::Error;

use crate::NORMALISATION_TOLERANCE;

/// Why a divergence computation rejected its input. Every variant names the problem;
/// no function of this crate panics, returns NaN or silently repairs bad input.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum RenyiError {
    /// The Rényi order is not in (1, ∞]: it is ≤ 1, NaN or −∞.
    #[error("Rényi order must be a number > 1 or +∞, got {0}")]
    InvalidOrder(f64),
    /// A vector has no entries.
    #[error("empty probability vector")]
    Empty,
    /// Two vectors that must have the same length do not.
    #[error("length mismatch: {left} entries against {right}")]
    LengthMismatch {
        /// Length of the first vector.
        left: usize,
        /// Length of the second vector.
        right: usize,
    },
    /// A probability is NaN or ±∞, or a log-probability is NaN or +∞.
    #[error("entry {index} is not finite: {value}")]
    NonFinite {
        /// Position of the offending entry.
        index: usize,
        /// The entry, widened to f64.
        value: f64,
    },
    /// A probability is negative.
    #[error("entry {index} is negative: {value}")]
    Negative {
        /// Position of the offending entry.
        index: usize,
        /// The entry, widened to f64.
        value: f64,
    },
    /// The entries do not sum to 1 within [`NORMALISATION_TOLERANCE`]. For log-probability
    /// input `sum` is the exponential of their log-sum-exp.
    #[error("entries sum to {sum}, more than {NORMALISATION_TOLERANCE} away from 1")]
    NotNormalised {
        /// The sum that was found (f64 accumulation).
        sum: f64,
    },
    /// A mixing weight λ is NaN or outside [0, 1].
    #[error("mixing weight λ must lie in [0, 1], got {0}")]
    InvalidLambda(f64),
    /// A batch buffer is not a whole number of rows of the reference's length.
    #[error("batch of {len} entries is not a whole number of rows of length {row_len}")]
    RaggedBatch {
        /// Number of entries in the batch buffer.
        len: usize,
        /// Length of one row (the reference's length).
        row_len: usize,
    },
    /// One row of a batch was rejected; `source` says why.
    #[error("row {row}: {source}")]
    Row {
        /// Index of the row in the batch.
        row: usize,
        /// The problem found in that row.
        source: Box<RenyiError>,
    },
}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, RenyiError>;
