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

impl MechanismError {
    /// A stable code naming the kind of problem (`"non_finite"`, `"charge_refused"`,
    /// …), a function of the variant alone.
    pub fn public_kind(&self) -> &'static str {
        match self {
            Self::Renyi(_) => "divergence",
            Self::Mixing(_) => "solver",
            Self::Accountant(_) => "accountant",
            Self::ChargeRefused(_) => "charge_refused",
            Self::EmptyEnsemble => "empty_ensemble",
            Self::EmptyVocabulary => "empty_vocabulary",
            Self::VocabularyTooLarge { .. } => "vocabulary_too_large",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::NonFinite { .. } => "non_finite",
            Self::NoFiniteLogit { .. } => "no_finite_logit",
            Self::Negative { .. } => "negative_probability",
            Self::NotNormalised { .. } => "not_normalised",
            Self::InvalidParameter { .. } => "invalid_parameter",
            Self::Ledger(_) => "ledger",
            Self::Source(_) => "source",
        }
    }

    /// What went wrong, for text that leaves the process (an HTTP body, a server-sent
    /// event, a ledger, a command's stderr or JSON): the kind of problem and public
    /// quantities only.
    ///
    /// The [`Display`](std::fmt::Display) form names rows, indices and values: a
    /// member's non-finite log-probability and where it sits, a row's sum, a
    /// divergence or a solver's state — functions of the private members that no
    /// charge covers. This form keeps the variant, the shapes (vocabulary size,
    /// buffer lengths: public), a parameter's name and domain, and the account's
    /// refusal (the store's message names the budget, which is public); it drops
    /// every row, index and value, and the messages of the wrapped divergence, solver,
    /// accountant, ledger and source errors (which may quote values).
    pub fn public_description(&self) -> String {
        match self {
            Self::Renyi(_) => "a divergence computation rejected its input".into(),
            Self::Mixing(_) => "a λ solver rejected its input".into(),
            Self::Accountant(_) => "the accountant rejected a curve or parameter".into(),
            Self::ChargeRefused(message) => {
                format!("the privacy account refused the charge: {message}")
            }
            Self::EmptyEnsemble | Self::EmptyVocabulary | Self::VocabularyTooLarge { .. } => {
                self.to_string()
            }
            Self::LengthMismatch { .. } => self.to_string(),
            Self::NonFinite { .. } => "a distribution had a non-finite entry".into(),
            Self::NoFiniteLogit { .. } => {
                "a distribution had no finite logit (every token masked)".into()
            }
            Self::Negative { .. } => "a distribution had a negative probability".into(),
            Self::NotNormalised { .. } => {
                "a distribution was not normalised within the tolerance".into()
            }
            Self::InvalidParameter { name, reason, .. } => {
                format!("invalid parameter {name}: {reason}")
            }
            Self::Ledger(_) => "the durable ledger failed; nothing was released".into(),
            Self::Source(_) => {
                "the source of the distributions failed; nothing was released".into()
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The public form of every error built from private values carries no digit
    /// (no row, index, value, sum or tolerance) and no spelled-out non-finite value,
    /// while the `Display` form, kept for the process itself, does.
    #[test]
    fn public_descriptions_carry_no_values() {
        let private = [
            MechanismError::NonFinite {
                row: 3,
                index: 17,
                value: f64::NAN,
            },
            MechanismError::NonFinite {
                row: 2,
                index: 5,
                value: f64::INFINITY,
            },
            MechanismError::NoFiniteLogit { row: 4 },
            MechanismError::Negative {
                row: 1,
                index: 9,
                value: -0.0123,
            },
            MechanismError::NotNormalised {
                row: 6,
                sum: 1.75,
                tolerance: 1e-6,
            },
            MechanismError::Source("member 2 produced 0.987 at token 41".into()),
            MechanismError::Mixing(MixingError::LambdaOutOfRange {
                lambda: 0.75,
                upper: 1.0,
            }),
        ];
        for e in &private {
            let public = e.public_description();
            assert!(!public.chars().any(|c| c.is_ascii_digit()), "{public}");
            assert!(!public.contains('∞'), "{public}");
            for word in public.split(|c: char| !c.is_alphanumeric()) {
                let w = word.to_ascii_lowercase();
                assert!(
                    !["nan", "inf", "infinity"].contains(&w.as_str()),
                    "{public}"
                );
            }
            assert!(e.to_string().chars().any(|c| c.is_ascii_digit()), "{e}");
            assert!(!e.public_kind().is_empty());
        }
        assert_eq!(private[0].public_kind(), "non_finite");
        // A parameter keeps its name and (static, public) domain, not its value.
        let parameter = MechanismError::InvalidParameter {
            name: "noise",
            value: 123.456,
            reason: "a noise draw exceeded the 64-bit range",
        };
        assert_eq!(
            parameter.public_description(),
            "invalid parameter noise: a noise draw exceeded the 64-bit range"
        );
        // Public shapes stay.
        let shape = MechanismError::LengthMismatch {
            what: "members",
            len: 10,
            vocab: 4,
        };
        assert_eq!(shape.public_description(), shape.to_string());
    }
}
