//! The one error type of this crate.

use privmix_renyi::RenyiError;
use thiserror::Error;

/// Why a λ solver or a truncation helper rejected its input. Every variant names the
/// problem; no function of this crate panics, returns NaN or silently clamps bad input.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum MixingError {
    /// A divergence computation rejected its input (bad order, vector, length…).
    #[error(transparent)]
    Renyi(#[from] RenyiError),
    /// The divergence bound is NaN or negative (`+∞` is allowed: every λ is feasible).
    #[error("divergence bound must be a number ≥ 0 or +∞, got {0}")]
    InvalidBound(f64),
    /// The upper end of the λ range is NaN, infinite or not positive.
    #[error("upper end of the λ range must be a finite number > 0, got {0}")]
    InvalidUpperEnd(f64),
    /// A mixing weight λ is NaN or outside the solver's range `[0, upper]`.
    #[error("mixing weight λ must lie in [0, {upper}], got {lambda}")]
    LambdaOutOfRange {
        /// The offending λ.
        lambda: f64,
        /// The upper end of the range.
        upper: f64,
    },
    /// A vector has no entries.
    #[error("empty vector")]
    Empty,
    /// Two vectors that must have the same length do not.
    #[error("length mismatch: {left} entries against {right}")]
    LengthMismatch {
        /// Length of the first vector.
        left: usize,
        /// Length of the second vector.
        right: usize,
    },
    /// A logit is NaN or ±∞ (the logit path needs every logit of the support finite).
    #[error("logit {index} is not finite: {value}")]
    NonFiniteLogit {
        /// Position of the offending logit.
        index: usize,
        /// The logit.
        value: f64,
    },
    /// A value to be ranked by top-k is NaN.
    #[error("entry {index} is NaN and cannot be ranked")]
    NotANumber {
        /// Position of the offending entry.
        index: usize,
    },
    /// `k` is 0 or larger than the vector being truncated.
    #[error("top-k needs 1 ≤ k ≤ {len}, got k = {k}")]
    InvalidK {
        /// The requested number of entries.
        k: usize,
        /// The length of the vector.
        len: usize,
    },
    /// A truncation index is outside the row.
    #[error("index {index} is outside a row of length {len}")]
    IndexOutOfRange {
        /// The offending index.
        index: usize,
        /// The length of the row.
        len: usize,
    },
    /// A vector to renormalise has no mass (or NaN, infinite or negative entries).
    #[error("cannot renormalise: entries sum to {sum}")]
    CannotRenormalise {
        /// The f64 sum that was found.
        sum: f64,
    },
    /// The constraint evaluated above the bound at λ = 0. For valid inputs the divergence
    /// there is exactly 0 (both arguments are the public distribution), so this signals a
    /// defect in an evaluator; it is reported rather than hidden.
    #[error("constraint is {value} at λ = 0, above the bound {bound}")]
    InfeasibleAtZero {
        /// The value found at λ = 0.
        value: f64,
        /// The bound.
        bound: f64,
    },
    /// A batch buffer is not a whole number of rows of the reference's length.
    #[error("batch of {len} entries is not a whole number of rows of length {row_len}")]
    RaggedBatch {
        /// Number of entries in the batch buffer.
        len: usize,
        /// Length of one row.
        row_len: usize,
    },
    /// One row of a batch was rejected; `source` says why.
    #[error("row {row}: {source}")]
    Row {
        /// Index of the row in the batch.
        row: usize,
        /// The problem found in that row.
        source: Box<MixingError>,
    },
}
