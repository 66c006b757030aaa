//! The error type of every mechanism step.

use privmix_accountant::AccountantError;
use privmix_mixing::MixingError;
use privmix_renyi::RenyiError;
use thiserror::Error;

/// What went wrong in a mechanism step. Nothing is released when a step errs.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MechanismError {
    /// A divergence computation rejected its input.
    #[error(transparent)]
    Renyi(#[from] RenyiError),
    /// A λ solver rejected its input.
    #[error(transparent)]
    Mixing(#[from] MixingError),
    /// The accountant rejected a curve or parameter.
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// The account refused the charge: the token it would pay for is not released.
    #[error("the privacy account refused the charge: {0}")]
    ChargeRefused(String),
    /// No members were given where the mechanism needs at least one.
    #[error("the ensemble has no members")]
    EmptyEnsemble,
    /// The vocabulary is empty.
    #[error("the vocabulary is empty")]
    EmptyVocabulary,
    /// The vocabulary is longer than the f64 analysis of the averaged mechanisms covers
    /// (`privmix_mechanisms::bounds::MAX_VOCAB`).
    #[error("the vocabulary has {vocab} entries, more than the {max} the charges are proven for")]
    VocabularyTooLarge {
        /// The vocabulary size given.
        vocab: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A buffer's length does not fit the vocabulary size.
    #[error("{what}: length {len} is not a multiple of the vocabulary size {vocab}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The vocabulary size.
        vocab: usize,
    },
    /// An entry is NaN or infinite (or +∞ for a log-probability or a logit).
    #[error("row {row}, index {index}: value {value} is not finite")]
    NonFinite {
        /// Row (0 = public, i = member i − 1 … as documented by the caller).
        row: usize,
        /// Index in the row.
        index: usize,
        /// The value.
        value: f64,
    },
    /// A row of logits has no finite entry (every token is masked with −∞), so it
    /// describes no distribution.
    #[error("row {row}: every logit is −∞, no token has positive probability")]
    NoFiniteLogit {
        /// Row (0 = public, i = member i − 1).
        row: usize,
    },
    /// A probability is negative.
    #[error("row {row}, index {index}: probability {value} is negative")]
    Negative {
        /// Row.
        row: usize,
        /// Index in the row.
        index: usize,
        /// The value.
        value: f64,
    },
    /// A row does not sum to 1 within the documented tolerance.
    #[error("row {row} sums to {sum}, not 1 (tolerance {tolerance})")]
    NotNormalised {
        /// Row.
        row: usize,
        /// Its sum (of probabilities, or of exp(log-probabilities)).
        sum: f64,
        /// The tolerance allowed.
        tolerance: f64,
    },
    /// A parameter is outside its domain.
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// Its value.
        value: f64,
        /// The domain.
        reason: &'static str,
    },
    /// The durable ledger failed for a reason other than a refused charge
    /// (I/O, a poisoned handle, a label too long, …); nothing was released.
    #[error(transparent)]
    Ledger(#[from] privmix_accountant::LedgerError),
    /// The source of the distributions (a model, a file) failed; nothing was released.
    #[error("the distribution source failed: {0}")]
    Source(String),
}

/// `Ok` when `value` is finite and > 0, else [`MechanismError::InvalidParameter`] naming
/// it: the check of every scale and σ parameter.
pub(crate) fn positive(name: &'static str, value: f64) -> Result<(), MechanismError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name,
            value,
            reason: "must be finite and > 0",
        })
    }
}
