//! Many rows against one reference row: the shape of every mechanism (each ensemble
//! member's next-token distribution against the public one).

use rayon::prelude::*;

use super::ratio;
use super::ratio::{SCREEN_P, SCREEN_Q};
use super::{forward_prob, forward_prob_screened};
use crate::validate::{self, ProbSummary, Probability};
use crate::{Order, RenyiError, Result};

/// Which divergence a batched kernel computes for each row `r` against the reference `q`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `D_α(r ‖ q)`.
    Forward,
    /// `D_α(q ‖ r)`.
    Reverse,
    /// `max(D_α(r ‖ q), D_α(q ‖ r))`.
    Symmetric,
}

/// The divergence of each row of `rows` against `reference`, in row order.
///
/// `rows` holds N rows of `reference.len()` entries each, row-major in one buffer (N may
/// be 0). The reference and α are validated once, each row once; then the rows are
/// processed in parallel (rayon), each by exactly the kernel [`crate::divergence`] uses,
/// so every entry equals the scalar result bitwise. For integer α the inner loop has no
/// `exp` or `log` (ratios raised to `α − 1` by repeated multiplication), and each row is
/// read once. A rejected row gives [`RenyiError::Row`] naming the first bad row. Why the
/// entries are bitwise the scalar ones: `proof.md` beside this file (G5).
pub fn batched_divergence<T: Probability>(
    rows: &[T],
    reference: &[T],
    alpha: Order,
    direction: Direction,
) -> Result<Vec<f64>> {
    let alpha = alpha.checked()?;
    let s_ref = validate::probabilities(reference)?;
    let row_len = reference.len();
    if !rows.len().is_multiple_of(row_len) {
        return Err(RenyiError::RaggedBatch {
            len: rows.len(),
            row_len,
        });
    }
    // The reference is the denominator of every forward ratio: take its reciprocals once.
    let inv_ref = match direction {
        Direction::Forward | Direction::Symmetric => Some(ratio::reciprocals(reference)),
        Direction::Reverse => None,
    };
    let inv_ref = inv_ref.as_deref();
    let results: Vec<Result<f64>> = rows
        .par_chunks(row_len)
        .enumerate()
        .map(|(row, r)| {
            one_row(r, reference, inv_ref, s_ref, alpha, direction).map_err(|e| RenyiError::Row {
                row,
                source: Box::new(e),
            })
        })
        .collect();
    results.into_iter().collect()
}

/// One row. The row is validated by the kernel's own pass where possible (the row is then
/// read from memory once); otherwise, or when that screen finds anything unusual, by
/// [`validate::probabilities`], which names the problem.
fn one_row<T: Probability>(
    r: &[T],
    reference: &[T],
    inv_ref: Option<&[f64]>,
    s_ref: ProbSummary,
    alpha: Order,
    direction: Direction,
) -> Result<f64> {
    let screened = match direction {
        Direction::Forward => {
            forward_prob_screened::<T, SCREEN_P>(r, reference, inv_ref, s_ref, alpha)
        }
        Direction::Reverse | Direction::Symmetric => {
            forward_prob_screened::<T, SCREEN_Q>(reference, r, None, s_ref, alpha)
        }
    };
    let (first, s_row) = match screened {
        Some(found) => found,
        None => {
            let s_row = validate::probabilities(r)?;
            let d = match direction {
                Direction::Forward => forward_prob(r, reference, inv_ref, s_row, s_ref, alpha),
                _ => forward_prob(reference, r, None, s_ref, s_row, alpha),
            };
            (d, s_row)
        }
    };
    Ok(match direction {
        Direction::Symmetric => first.max(forward_prob(r, reference, inv_ref, s_row, s_ref, alpha)),
        _ => first,
    })
}
