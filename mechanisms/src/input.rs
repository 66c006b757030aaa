//! Next-token distributions as the mechanisms receive them.
//!
//! A model runtime hands over logits turned into probabilities or
//! log-probabilities, in f32 or f64, as rows of one buffer. [`Ensemble::new`]
//! validates them once and converts them to f64 probability rows that sum to 1
//! in f64: every divergence a mechanism charges is then computed on exactly the
//! distribution it samples from.

use privmix_renyi::NORMALISATION_TOLERANCE;

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

impl Rows<'_> {
    fn len(&self) -> usize {
        match self {
            Rows::ProbF32(r) => r.len(),
            Rows::ProbF64(r) => r.len(),
            Rows::LogProbF32(r) => r.len(),
            Rows::LogProbF64(r) => r.len(),
        }
    }

    fn is_log(&self) -> bool {
        matches!(self, Rows::LogProbF32(_) | Rows::LogProbF64(_))
    }

    fn get(&self, i: usize) -> f64 {
        match self {
            Rows::ProbF32(r) => f64::from(r[i]),
            Rows::ProbF64(r) => r[i],
            Rows::LogProbF32(r) => f64::from(r[i]),
            Rows::LogProbF64(r) => r[i],
        }
    }
}

/// A validated step input: the public distribution and N member distributions,
/// each an f64 probability row of length `vocab` summing to 1 in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Ensemble {
    vocab: usize,
    public: Vec<f64>,
    members: Vec<f64>,
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
        let public = convert_row(public, 0, 0, vocab)?;
        let n = members.len() / vocab;
        let mut rows = Vec::with_capacity(members.len());
        for m in 0..n {
            rows.extend(convert_row(members, m + 1, m * vocab, vocab)?);
        }
        Ok(Self {
            vocab,
            public,
            members: rows,
        })
    }

    /// From f64 probability rows (the common case in tests).
    pub fn from_probabilities(public: &[f64], members: &[f64]) -> Result<Self, MechanismError> {
        Self::new(Rows::ProbF64(public), Rows::ProbF64(members))
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Number of members N.
    pub fn len(&self) -> usize {
        self.members.len() / self.vocab
    }

    /// True when there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The public distribution p0.
    pub fn public(&self) -> &[f64] {
        &self.public
    }

    /// Member i's distribution p_i (0-based).
    pub fn member(&self, i: usize) -> &[f64] {
        &self.members[i * self.vocab..(i + 1) * self.vocab]
    }

    /// All member rows, row-major.
    pub fn members(&self) -> &[f64] {
        &self.members
    }

    /// The same ensemble without member i: the neighbouring dataset of
    /// PMixED and AdaPMixED (a member's data removed). Used by tests and audits.
    pub fn without_member(&self, i: usize) -> Self {
        let mut members = self.members.clone();
        members.drain(i * self.vocab..(i + 1) * self.vocab);
        Self {
            vocab: self.vocab,
            public: self.public.clone(),
            members,
        }
    }
}

fn convert_row(
    rows: Rows<'_>,
    row: usize,
    start: usize,
    vocab: usize,
) -> Result<Vec<f64>, MechanismError> {
    let mut out = Vec::with_capacity(vocab);
    for index in 0..vocab {
        let x = rows.get(start + index);
        let p = if rows.is_log() {
            // −∞ is a valid log-probability (zero); NaN and +∞ are not.
            if x.is_nan() || x == f64::INFINITY {
                return Err(MechanismError::NonFinite {
                    row,
                    index,
                    value: x,
                });
            }
            if x > 0.0 {
                return Err(MechanismError::Negative {
                    row,
                    index,
                    value: -x,
                });
            }
            x.exp()
        } else {
            if !x.is_finite() {
                return Err(MechanismError::NonFinite {
                    row,
                    index,
                    value: x,
                });
            }
            if x < 0.0 {
                return Err(MechanismError::Negative {
                    row,
                    index,
                    value: x,
                });
            }
            x
        };
        out.push(p);
    }
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
