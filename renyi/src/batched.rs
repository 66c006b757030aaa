//! Many rows against one reference row: the shape of every mechanism (each ensemble
//! member's next-token distribution against the public one).

use rayon::prelude::*;

use crate::scalar::forward_prob;
use crate::validate::{self, Probability};
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
/// read once. A rejected row gives [`RenyiError::Row`] naming the first bad row.
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
    let results: Vec<Result<f64>> = rows
        .par_chunks(row_len)
        .enumerate()
        .map(|(row, r)| {
            let s_row = validate::probabilities(r).map_err(|e| RenyiError::Row {
                row,
                source: Box::new(e),
            })?;
            Ok(match direction {
                Direction::Forward => forward_prob(r, reference, s_row, s_ref, alpha),
                Direction::Reverse => forward_prob(reference, r, s_ref, s_row, alpha),
                Direction::Symmetric => forward_prob(r, reference, s_row, s_ref, alpha)
                    .max(forward_prob(reference, r, s_ref, s_row, alpha)),
            })
        })
        .collect();
    results.into_iter().collect()
}
