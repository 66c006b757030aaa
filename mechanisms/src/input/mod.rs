//! Next-token distributions as the mechanisms receive them.
//!
//! A model runtime hands over its raw logits, or probabilities, or
//! log-probabilities, in f32 or f64, as rows of one buffer. [`Ensemble::new`]
//! validates them once and converts them to f64 probability rows that sum to 1
//! in f64: every divergence a mechanism charges is then computed on exactly the
//! distribution it samples from.

mod convert;
mod exp;
mod rows;

use privmix_renyi::{ValidatedRow, ValidatedRows};
use rayon::prelude::*;

use crate::MechanismError;
use crate::bounds::MAX_VOCAB;
use convert::convert_row;
pub use rows::Rows;

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
    /// non-negative, and sum to 1 within [`privmix_renyi::NORMALISATION_TOLERANCE`]; it is then
    /// divided by its f64 sum so that it is a distribution in f64. Rows may hold at
    /// most [`MAX_VOCAB`] entries ([`MechanismError::VocabularyTooLarge`]): the charges
    /// of the averaged mechanisms rest on every row's exact mass lying within `1 ±`
    /// [`row_mass_deviation`](crate::bounds::row_mass_deviation), which is proven for
    /// rows up to that length (`src/pmixed/proof.md`, "Rounding"). Row 0 in errors is
    /// the public row, row i ≥ 1 is member i − 1.
    ///
    /// Zero members are allowed here (the public-only baseline); mechanisms that
    /// need members return [`MechanismError::EmptyEnsemble`].
    pub fn new(public: Rows<'_>, members: Rows<'_>) -> Result<Self, MechanismError> {
        Self::build(public, members, Vec::new(), Vec::new())
    }

    /// [`Ensemble::new`] for the next token, reusing this ensemble's buffers: a
    /// runtime that builds an ensemble every step then allocates (and the kernel
    /// zero-fills) nothing new. On error the buffers are dropped.
    pub fn renew(self, public: Rows<'_>, members: Rows<'_>) -> Result<Self, MechanismError> {
        Self::build(
            public,
            members,
            self.public.into_data(),
            self.members.into_data(),
        )
    }

    /// [`Ensemble::renew`] on `previous` where there is one, else
    /// [`Ensemble::new`]: the form for a loop that builds one ensemble per
    /// token and keeps the last (`last = Some(Ensemble::renew_or_new(last.take(), ..)?)`).
    pub fn renew_or_new(
        previous: Option<Self>,
        public: Rows<'_>,
        members: Rows<'_>,
    ) -> Result<Self, MechanismError> {
        match previous {
            Some(e) => e.renew(public, members),
            None => Self::new(public, members),
        }
    }

    fn build(
        public: Rows<'_>,
        members: Rows<'_>,
        mut public_buf: Vec<f64>,
        mut members_buf: Vec<f64>,
    ) -> Result<Self, MechanismError> {
        let vocab = public.len();
        if vocab == 0 {
            return Err(MechanismError::EmptyVocabulary);
        }
        if vocab > MAX_VOCAB {
            return Err(MechanismError::VocabularyTooLarge {
                vocab,
                max: MAX_VOCAB,
            });
        }
        if !members.len().is_multiple_of(vocab) {
            return Err(MechanismError::LengthMismatch {
                what: "members",
                len: members.len(),
                vocab,
            });
        }
        public_buf.resize(vocab, 0.0);
        let public_sum = convert_row(public, 0, &mut public_buf)?;
        // Rows are converted in parallel, each into its own slice of one buffer;
        // each row's arithmetic is that of `convert_row` alone, so the result does
        // not depend on the thread count. The first bad row (in order) is reported.
        members_buf.resize(members.len(), 0.0);
        let member_sums = members_buf
            .par_chunks_mut(vocab)
            .enumerate()
            .map(|(m, out)| convert_row(members.slice(m * vocab, vocab), m + 1, out))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<f64>, _>>()?;
        // Each row divided by its sum in the pass that validates it for the solvers.
        Ok(Self {
            public: ValidatedRows::new_divided(public_buf, vocab, &[public_sum])?,
            members: ValidatedRows::new_divided(members_buf, vocab, &member_sums)?,
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

#[cfg(test)]
mod tests;
