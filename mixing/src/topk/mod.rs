//! Top-k truncation from a public distribution: DPS-MOZO's output-space truncation
//! (arXiv:2501.19287, §4.1 and Alg. 1, lines 5, 7 and 10, after Tang et al.,
//! "Privacy-Preserving In-Context Learning with Differentially Private Few-Shot
//! Generation", arXiv:2309.11765) and AdaPMixED's noisy screening (arXiv:2410.02016,
//! §4.1 and Alg. 1, lines 2–5).
//!
//! The indices are chosen from the *public* vector only (zero-shot logits, or `p0`), so
//! the choice reveals nothing about private data. Ranking is a strict total order — larger
//! value first, and among equal values the lower index first — so the chosen set and its
//! order are a deterministic function of the public vector, whatever the selection
//! algorithm does internally. Why the selection is correct and private: `proof.md`
//! beside this file.

use std::cmp::Ordering;

use crate::MixingError;

/// The `k` indices of the largest entries of `values`, largest first; ties are broken by
/// the lower index (`+0.0` and `−0.0` tie). `−∞` ranks last, `+∞` first.
///
/// Runs in O(V) on average (`select_nth_unstable_by`) plus O(k log k) to order the k.
/// Errors: [`MixingError::Empty`] for an empty vector, [`MixingError::InvalidK`] unless
/// `1 ≤ k ≤ values.len()`, [`MixingError::NotANumber`] for a NaN entry.
pub fn top_k_indices<T: Copy + Into<f64>>(
    values: &[T],
    k: usize,
) -> Result<Vec<usize>, MixingError> {
    if values.is_empty() {
        return Err(MixingError::Empty);
    }
    if k == 0 || k > values.len() {
        return Err(MixingError::InvalidK {
            k,
            len: values.len(),
        });
    }
    // A branch-free scan first (it vectorises); the first NaN is looked for only
    // when there is one.
    if values.iter().fold(false, |any, &v| any | v.into().is_nan())
        && let Some(index) = values.iter().position(|&v| v.into().is_nan())
    {
        return Err(MixingError::NotANumber { index });
    }
    let rank = |&i: &usize, &j: &usize| -> Ordering {
        let (a, b): (f64, f64) = (values[i].into(), values[j].into());
        b.partial_cmp(&a).unwrap_or(Ordering::Equal).then(i.cmp(&j))
    };
    if k <= SMALL_K && k < values.len() {
        return Ok(small_top_k(values, k));
    }
    let mut order: Vec<usize> = (0..values.len()).collect();
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, rank);
        order.truncate(k);
    }
    order.sort_unstable_by(rank);
    Ok(order)
}

/// Largest k served by [`small_top_k`].
const SMALL_K: usize = 256;

/// The top k in one pass that keeps the best k seen so far in rank order (value
/// descending, then index ascending — the order [`top_k_indices`] defines): an entry
/// that does not beat the current k-th costs one comparison, so the pass is O(V)
/// plus O(k) per insertion (about k·ln(V/k) insertions for values in random order).
/// No NaN may be present (checked by the caller).
fn small_top_k<T: Copy + Into<f64>>(values: &[T], k: usize) -> Vec<usize> {
    let mut best: Vec<(f64, usize)> = Vec::with_capacity(k + 1);
    // The k-th value kept so far (−∞ until k are kept), in a local so that the
    // common case (an entry that does not beat it) is one comparison in registers.
    let mut floor = f64::NEG_INFINITY;
    // Blocks of 8 entries are screened against the floor at once (branch-free, so it
    // vectorises); a block with an entry above it is taken entry by entry.
    for (block_index, block) in values.chunks(8).enumerate() {
        let above = block.iter().fold(false, |any, &v| any | (v.into() > floor));
        if !above && best.len() == k {
            continue;
        }
        for (j, &v) in block.iter().enumerate() {
            let v: f64 = v.into();
            // Entries come in index order, so an equal value never beats a kept one.
            if v <= floor && best.len() == k {
                continue;
            }
            let at = best.partition_point(|&(b, _)| b >= v);
            best.insert(at, (v, block_index * 8 + j));
            best.truncate(k);
            if best.len() == k {
                floor = best[k - 1].0;
            }
        }
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// The entries of `row` at `indices`, in that order, widened to f64.
///
/// Errors: [`MixingError::IndexOutOfRange`] for an index `≥ row.len()`.
pub fn gather<T: Copy + Into<f64>>(row: &[T], indices: &[usize]) -> Result<Vec<f64>, MixingError> {
    indices
        .iter()
        .map(|&index| {
            row.get(index)
                .map(|&v| v.into())
                .ok_or(MixingError::IndexOutOfRange {
                    index,
                    len: row.len(),
                })
        })
        .collect()
}

/// Divides `weights` by their f64 sum, in place, so that they sum to 1 (within rounding).
///
/// Renormalising is a deterministic function of the vector it is given, hence
/// post-processing of whatever produced that vector: apply it *after* any noise (as
/// AdaPMixED's screening must, so that the noise is calibrated to the sensitivity of the
/// un-renormalised truncation).
///
/// Errors: [`MixingError::CannotRenormalise`] if an entry is negative or not finite, or the
/// sum is not a finite number > 0.
pub fn renormalise(weights: &mut [f64]) -> Result<(), MixingError> {
    let sum: f64 = weights.iter().sum();
    let valid = weights.iter().all(|&w| w.is_finite() && w >= 0.0);
    if !(valid && sum.is_finite() && sum > 0.0) {
        return Err(MixingError::CannotRenormalise { sum });
    }
    weights.iter_mut().for_each(|w| *w /= sum);
    Ok(())
}

/// A probability row restricted to `indices` and renormalised: [`gather`] then
/// [`renormalise`] (the "truncate and rescale" of DPS-MOZO's Alg. 1, lines 7 and 10,
/// arXiv:2501.19287).
pub fn truncate_renormalised<T: Copy + Into<f64>>(
    row: &[T],
    indices: &[usize],
) -> Result<Vec<f64>, MixingError> {
    let mut out = gather(row, indices)?;
    renormalise(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
