//! Probability rows validated once and kept with what validation learnt, so that every
//! later computation against them skips its validation pass: one borrowed row
//! ([`ValidatedRow`]) or many owned ones ([`ValidatedRows`]).

use rayon::prelude::*;

use crate::validate::{self, ProbSummary};
use crate::{RenyiError, Result};

/// A probability vector validated once (finite, ≥ 0, non-empty, summing to 1 within
/// [`crate::NORMALISATION_TOLERANCE`]), for constructors that take many rows against
/// the same reference ([`crate::SymmetricMixture::with_public`]).
#[derive(Debug, Clone, Copy)]
pub struct ValidatedRow<'a> {
    pub(super) row: &'a [f64],
    pub(super) summary: ProbSummary,
}

impl<'a> ValidatedRow<'a> {
    /// Validates `row` (the checks of [`crate::divergence`]'s inputs).
    pub fn new(row: &'a [f64]) -> Result<Self> {
        let summary = validate::probabilities(row)?;
        Ok(ValidatedRow { row, summary })
    }

    /// The row.
    pub fn row(&self) -> &'a [f64] {
        self.row
    }

    /// A row and the summary its validation produced ([`crate::ValidatedRows`] keeps
    /// both).
    fn from_parts(row: &'a [f64], summary: ProbSummary) -> Self {
        ValidatedRow { row, summary }
    }

    #[cfg(test)]
    fn summary(&self) -> ProbSummary {
        self.summary
    }
}

/// Row-major probability rows of one length, each validated once (the checks of
/// [`crate::divergence`]'s inputs) and owned, so that a [`ValidatedRow`] handed out by
/// [`ValidatedRows::row`] always describes the very entries it borrows.
///
/// A mechanism that solves against the same rows many times (every member of an ensemble
/// against the public row, every token) pays for validation when the rows are built, not
/// on every solve.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedRows {
    data: Vec<f64>,
    row_len: usize,
    summaries: Vec<ProbSummary>,
}

impl ValidatedRows {
    /// Validates each row of `data` (row-major, rows of `row_len` entries; zero rows are
    /// allowed), in parallel over rows. Errors: [`RenyiError::Empty`] for `row_len = 0`,
    /// [`RenyiError::RaggedBatch`] unless `data.len()` is a multiple of `row_len`, and
    /// [`RenyiError::Row`] naming the first rejected row.
    pub fn new(data: Vec<f64>, row_len: usize) -> Result<Self> {
        if row_len == 0 {
            return Err(RenyiError::Empty);
        }
        if !data.len().is_multiple_of(row_len) {
            return Err(RenyiError::RaggedBatch {
                len: data.len(),
                row_len,
            });
        }
        let summaries = data
            .par_chunks(row_len)
            .enumerate()
            .map(|(row, p)| {
                validate::probabilities(p).map_err(|e| RenyiError::Row {
                    row,
                    source: Box::new(e),
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Ok(ValidatedRows {
            data,
            row_len,
            summaries,
        })
    }

    /// Row `i` of `data` divided by `divisors[i]` (`x / divisors[i]`, entry by entry,
    /// in place), then validated as [`ValidatedRows::new`] validates, each row in one
    /// pass (in parallel over rows): the same rows, summaries and errors as dividing
    /// first and calling [`ValidatedRows::new`] then. For rows normalised by their
    /// sum just before (a runtime's distributions). Errors: those of
    /// [`ValidatedRows::new`], and [`RenyiError::LengthMismatch`] unless there is one
    /// divisor per row.
    pub fn new_divided(mut data: Vec<f64>, row_len: usize, divisors: &[f64]) -> Result<Self> {
        if row_len == 0 {
            return Err(RenyiError::Empty);
        }
        if !data.len().is_multiple_of(row_len) {
            return Err(RenyiError::RaggedBatch {
                len: data.len(),
                row_len,
            });
        }
        validate::same_length(data.len() / row_len, divisors.len())?;
        let summaries = data
            .par_chunks_mut(row_len)
            .zip(divisors)
            .enumerate()
            .map(|(row, (p, &divisor))| {
                validate::probabilities_divided(p, divisor).map_err(|e| RenyiError::Row {
                    row,
                    source: Box::new(e),
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Ok(ValidatedRows {
            data,
            row_len,
            summaries,
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.summaries.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.summaries.is_empty()
    }

    /// Entries per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Row `i` with its validation summary. Panics if `i ≥ len()`, like slice indexing.
    pub fn row(&self, i: usize) -> ValidatedRow<'_> {
        ValidatedRow::from_parts(
            &self.data[i * self.row_len..(i + 1) * self.row_len],
            self.summaries[i],
        )
    }

    /// Row `i`'s entries. Panics if `i ≥ len()`, like slice indexing.
    pub fn entries(&self, i: usize) -> &[f64] {
        &self.data[i * self.row_len..(i + 1) * self.row_len]
    }

    /// All rows, row-major.
    pub fn as_slice(&self) -> &[f64] {
        &self.data
    }

    /// The rows' buffer, for reuse (its summaries are dropped).
    pub fn into_data(self) -> Vec<f64> {
        self.data
    }

    /// The same rows without row `i` (the others keep their summaries: nothing is
    /// validated again). Panics if `i ≥ len()`, like `Vec::remove`.
    pub fn without_row(&self, i: usize) -> Self {
        let mut data = self.data.clone();
        data.drain(i * self.row_len..(i + 1) * self.row_len);
        let mut summaries = self.summaries.clone();
        summaries.remove(i);
        ValidatedRows {
            data,
            row_len: self.row_len,
            summaries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Order, SymmetricMixture};

    /// Dividing in the validation pass gives what dividing first and validating then
    /// gives: the same entries, the same summaries (sums formed in the same order), the
    /// same errors; rows longer than a chunk, of uneven length, of tiny entries.
    #[test]
    fn rows_divided_while_validated_equal_rows_divided_first() {
        for row_len in [3, 1000, 5003] {
            let mut data: Vec<f64> = crate::test_rows::uniforms(row_len as u64)
                .take(4 * row_len)
                .map(|u| u.powi(6))
                .collect();
            data[1] = 0.0;
            let sums: Vec<f64> = data.chunks(row_len).map(|r| r.iter().sum()).collect();
            let divided: Vec<f64> = data
                .chunks(row_len)
                .zip(&sums)
                .flat_map(|(r, &s)| r.iter().map(move |&x| x / s))
                .collect();
            let want = ValidatedRows::new(divided, row_len).unwrap();
            let got = ValidatedRows::new_divided(data.clone(), row_len, &sums).unwrap();
            assert_eq!(got, want);
            for i in 0..4 {
                assert_eq!(got.row(i).summary(), want.row(i).summary());
            }
            // Divisors that leave a row unnormalised, or non-finite, fail as `new` fails.
            let mut bad = sums.clone();
            bad[2] *= 2.0;
            let err = ValidatedRows::new_divided(data.clone(), row_len, &bad).unwrap_err();
            assert!(matches!(err, RenyiError::Row { row: 2, .. }), "{err:?}");
            bad[2] = 0.0;
            let err = ValidatedRows::new_divided(data.clone(), row_len, &bad).unwrap_err();
            assert!(matches!(err, RenyiError::Row { row: 2, .. }), "{err:?}");
            let err = ValidatedRows::new_divided(data, row_len, &sums[..3]).unwrap_err();
            assert!(matches!(err, RenyiError::LengthMismatch { .. }), "{err:?}");
        }
    }

    #[test]
    fn rows_carry_the_summary_a_fresh_validation_gives() {
        let data = vec![0.25, 0.75, 0.0, 1.0, 0.5, 0.5];
        let rows = ValidatedRows::new(data.clone(), 2).unwrap();
        assert_eq!((rows.len(), rows.row_len()), (3, 2));
        for i in 0..3 {
            let fresh = ValidatedRow::new(&data[2 * i..2 * i + 2]).unwrap();
            assert_eq!(rows.row(i).summary(), fresh.summary());
            assert_eq!(rows.entries(i), fresh.row());
        }
        let fewer = rows.without_row(1);
        assert_eq!(fewer.as_slice(), &[0.25, 0.75, 0.5, 0.5]);
        assert_eq!(fewer.row(1).summary(), rows.row(2).summary());
        // A path built from validated rows is the path built from the slices.
        let alpha = Order::new(3.0).unwrap();
        let from_rows = SymmetricMixture::from_rows(&rows.row(0), &rows.row(2), alpha).unwrap();
        let fresh = SymmetricMixture::new(&data[0..2], &data[4..6], alpha).unwrap();
        assert_eq!(from_rows.evaluate(0.5), fresh.evaluate(0.5));
    }

    #[test]
    fn bad_rows_are_named() {
        assert_eq!(ValidatedRows::new(vec![], 0), Err(RenyiError::Empty));
        assert_eq!(
            ValidatedRows::new(vec![0.5, 0.5, 1.0], 2),
            Err(RenyiError::RaggedBatch { len: 3, row_len: 2 })
        );
        assert_eq!(
            ValidatedRows::new(vec![0.5, 0.5, 0.5, 0.6], 2),
            Err(RenyiError::Row {
                row: 1,
                source: Box::new(RenyiError::NotNormalised { sum: 1.1 })
            })
        );
        assert!(ValidatedRows::new(vec![], 3).unwrap().is_empty());
    }
}
