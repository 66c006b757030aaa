//! Next-token distributions as the mechanisms receive them.
//!
//! A model runtime hands over logits turned into probabilities or
//! log-probabilities, in f32 or f64, as rows of one buffer. [`Ensemble::new`]
//! validates them once and converts them to f64 probability rows that sum to 1
//! in f64: every divergence a mechanism charges is then computed on exactly the
//! distribution it samples from.

use privmix_renyi::{NORMALISATION_TOLERANCE, ValidatedRow, ValidatedRows};
use rayon::prelude::*;

use crate::MechanismError;

/// Rows of next-token distributions in one row-major buffer.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Probabilities in f32.
    ProbF32(&'a [f32]),
    /// Probabilities in f64.
    ProbF64(&'a [f64]),
    /// Natural-log probabilities in f32 (−∞ for zero).
    LogProbF32(&'a [f32]),
    /// Natural-log probabilities in f64 (−∞ for zero).
    LogProbF64(&'a [f64]),
}

impl<'a> Rows<'a> {
    fn len(&self) -> usize {
        match self {
            Rows::ProbF32(r) => r.len(),
            Rows::ProbF64(r) => r.len(),
            Rows::LogProbF32(r) => r.len(),
            Rows::LogProbF64(r) => r.len(),
        }
    }

    /// Entries `start..start + len`, of the same kind.
    fn slice(&self, start: usize, len: usize) -> Rows<'a> {
        let range = start..start + len;
        match *self {
            Rows::ProbF32(r) => Rows::ProbF32(&r[range]),
            Rows::ProbF64(r) => Rows::ProbF64(&r[range]),
            Rows::LogProbF32(r) => Rows::LogProbF32(&r[range]),
            Rows::LogProbF64(r) => Rows::LogProbF64(&r[range]),
        }
    }
}

/// A validated step input: the public distribution and N member distributions,
/// each an f64 probability row of length `vocab` summing to 1 in f64.
///
/// The rows are kept as `privmix_renyi::ValidatedRows`, so that the λ solves of every
/// step (N of them against the same public row) do not validate them again.
#[derive(Debug, Clone, PartialEq)]
pub struct Ensemble {
    public: ValidatedRows,
    members: ValidatedRows,
}

impl Ensemble {
    /// Validates and converts. Each row must be finite (log rows may hold −∞),
    /// non-negative, and sum to 1 within [`NORMALISATION_TOLERANCE`]; it is then
    /// divided by its f64 sum so that it is a distribution in f64. Row 0 in
    /// errors is the public row, row i ≥ 1 is member i − 1.
    ///
    /// Zero members are allowed here (the public-only baseline); mechanisms that
    /// need members return [`MechanismError::EmptyEnsemble`].
    pub fn new(public: Rows<'_>, members: Rows<'_>) -> Result<Self, MechanismError> {
        let vocab = public.len();
        if vocab == 0 {
            return Err(MechanismError::EmptyVocabulary);
        }
        if !members.len().is_multiple_of(vocab) {
            return Err(MechanismError::LengthMismatch {
                what: "members",
                len: members.len(),
                vocab,
            });
        }
        let public = convert_row(public, 0)?;
        // Rows are converted in parallel; each row's arithmetic is that of
        // `convert_row` alone, so the result does not depend on the thread count.
        let members = (0..members.len() / vocab)
            .into_par_iter()
            .map(|m| convert_row(members.slice(m * vocab, vocab), m + 1))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        Ok(Self {
            public: ValidatedRows::new(public, vocab)?,
            members: ValidatedRows::new(members, vocab)?,
        })
    }

    /// From f64 probability rows (the common case in tests).
    pub fn from_probabilities(public: &[f64], members: &[f64]) -> Result<Self, MechanismError> {
        Self::new(Rows::ProbF64(public), Rows::ProbF64(members))
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.public.row_len()
    }

    /// Number of members N.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The public distribution p0.
    pub fn public(&self) -> &[f64] {
        self.public.entries(0)
    }

    /// The public distribution with its validation summary (for the solvers).
    pub fn public_row(&self) -> ValidatedRow<'_> {
        self.public.row(0)
    }

    /// Member i's distribution p_i (0-based).
    pub fn member(&self, i: usize) -> &[f64] {
        self.members.entries(i)
    }

    /// Member i's distribution with its validation summary (for the solvers).
    pub fn member_row(&self, i: usize) -> ValidatedRow<'_> {
        self.members.row(i)
    }

    /// All member rows, row-major.
    pub fn members(&self) -> &[f64] {
        self.members.as_slice()
    }

    /// The same ensemble without member i: the neighbouring dataset of
    /// PMixED and AdaPMixED (a member's data removed). Used by tests and audits.
    pub fn without_member(&self, i: usize) -> Self {
        Self {
            public: self.public.clone(),
            members: self.members.without_row(i),
        }
    }
}

/// One row converted to f64 probabilities: checked (finite, non-negative, or for
/// log rows not NaN and not positive), summed in order, and divided by its sum.
fn convert_row(row: Rows<'_>, index: usize) -> Result<Vec<f64>, MechanismError> {
    let out = match row {
        Rows::ProbF32(r) => probabilities(r.iter().map(|&x| f64::from(x)), r.len(), index)?,
        Rows::ProbF64(r) => probabilities(r.iter().copied(), r.len(), index)?,
        Rows::LogProbF32(r) => log_probabilities(r.iter().map(|&x| f64::from(x)), index)?,
        Rows::LogProbF64(r) => log_probabilities(r.iter().copied(), index)?,
    };
    normalise(out, index)
}

/// Probability entries, copied after one check pass that finds the first bad entry
/// only when the branch-free screen (a non-finite sum or a negative minimum) says
/// there is one.
fn probabilities(
    values: impl Iterator<Item = f64> + Clone,
    len: usize,
    row: usize,
) -> Result<Vec<f64>, MechanismError> {
    let (sum, min) = values
        .clone()
        .fold((0.0_f64, 0.0_f64), |(s, m), x| (s + x, m.min(x)));
    if !sum.is_finite() || min < 0.0 {
        for (index, value) in values.clone().enumerate() {
            if !value.is_finite() {
                return Err(MechanismError::NonFinite { row, index, value });
            }
            if value < 0.0 {
                return Err(MechanismError::Negative { row, index, value });
            }
        }
    }
    let mut out = Vec::with_capacity(len);
    out.extend(values);
    Ok(out)
}

/// Log-probability entries exponentiated: −∞ is a valid log-probability (zero);
/// NaN and +∞ are not, and a positive one is a probability above 1.
fn log_probabilities(
    values: impl Iterator<Item = f64>,
    row: usize,
) -> Result<Vec<f64>, MechanismError> {
    values
        .enumerate()
        .map(|(index, x)| {
            if x.is_nan() || x == f64::INFINITY {
                Err(MechanismError::NonFinite {
                    row,
                    index,
                    value: x,
                })
            } else if x > 0.0 {
                Err(MechanismError::Negative {
                    row,
                    index,
                    value: -x,
                })
            } else {
                Ok(x.exp())
            }
        })
        .collect()
}

/// Divides a checked row by its f64 sum, which must lie within
/// [`NORMALISATION_TOLERANCE`] of 1.
fn normalise(mut out: Vec<f64>, row: usize) -> Result<Vec<f64>, MechanismError> {
    let sum: f64 = out.iter().sum();
    // Entries are finite, so the sum is finite (or +∞ on overflow, which fails too).
    if sum.is_nan() || (sum - 1.0).abs() > NORMALISATION_TOLERANCE {
        return Err(MechanismError::NotNormalised {
            row,
            sum,
            tolerance: NORMALISATION_TOLERANCE,
        });
    }
    for p in &mut out {
        *p /= sum;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_rows_convert_to_normalised_f64() {
        let public = [0.5f64.ln(), 0.5f64.ln()];
        let members = [0.25f32.ln(), 0.75f32.ln(), f32::NEG_INFINITY, 0.0];
        let e = Ensemble::new(Rows::LogProbF64(&public), Rows::LogProbF32(&members)).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e.member(1), &[0.0, 1.0]);
        assert!((e.member(0).iter().sum::<f64>() - 1.0).abs() < 1e-15);
    }

    #[test]
    fn bad_rows_are_typed_errors() {
        let p = [0.5, 0.5];
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[0.5, 0.5, 1.0]),
            Err(MechanismError::LengthMismatch { .. })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[f64::NAN, 1.0]),
            Err(MechanismError::NonFinite {
                row: 1,
                index: 0,
                ..
            })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[-0.5, 1.5]),
            Err(MechanismError::Negative {
                row: 1,
                index: 0,
                ..
            })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[0.5, 0.6]),
            Err(MechanismError::NotNormalised { row: 1, .. })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&[], &[]),
            Err(MechanismError::EmptyVocabulary)
        ));
        let logs = [0.1f64, -3.0];
        assert!(matches!(
            Ensemble::new(Rows::LogProbF64(&logs), Rows::ProbF64(&p)),
            Err(MechanismError::Negative { row: 0, .. })
        ));
    }

    #[test]
    fn without_member_drops_one_row() {
        let e = Ensemble::from_probabilities(&[0.5, 0.5], &[1.0, 0.0, 0.0, 1.0, 0.5, 0.5]).unwrap();
        let d = e.without_member(1);
        assert_eq!(d.len(), 2);
        assert_eq!(d.member(1), &[0.5, 0.5]);
    }
}
