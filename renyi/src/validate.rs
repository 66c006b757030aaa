//! Input validation, done once per call (or once per construction) before any kernel runs,
//! so that the kernels never re-check their input inside hot loops.

use crate::kernel::{CHUNK, LANES, combine};
use crate::{NORMALISATION_TOLERANCE, RenyiError, Result};

/// Element types accepted as probabilities: `f32` and `f64`. Every computation widens to
/// `f64` first.
pub trait Probability: Copy + Send + Sync + 'static {
    /// The value widened to `f64` (exactly: every `f32` is an `f64`).
    fn to_f64(self) -> f64;
}

impl Probability for f32 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Probability for f64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

/// What validation learnt about a probability vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProbSummary {
    /// Smallest strictly positive entry (`+∞` when every entry is 0, which normalisation
    /// already excludes).
    pub min_positive: f64,
    /// `Σp` as validation summed it (the closed-form mixture path uses it for its
    /// normalisations).
    pub sum: f64,
}

/// Checks that `p` is a probability vector: non-empty, every entry finite and ≥ 0, and
/// `|Σp − 1| ≤ NORMALISATION_TOLERANCE` (summed in f64).
pub(crate) fn probabilities<T: Probability>(p: &[T]) -> Result<ProbSummary> {
    if p.is_empty() {
        return Err(RenyiError::Empty);
    }
    // One branch-free pass in LANES independent lanes (so it vectorises): a NaN or
    // infinite entry makes the sum non-finite, a negative one the minimum negative; only
    // then is the first bad entry looked for. The sum is formed exactly as the kernels
    // form theirs (per CHUNK, lane-wise, lanes combined in a fixed order), so that a
    // kernel's own screening accepts exactly the vectors this function accepts.
    // Compiled for the CPU's widest vectors (the lane arrays fix the summation
    // order, so the result does not depend on the vector width).
    let screened = pulp::Arch::new().dispatch(Screen(p));
    summary(p, screened)
}

/// `p` divided by `divisor` in place (`x / divisor`, entry by entry), then checked
/// as [`probabilities`] checks it, in one pass: the same summary and the same error
/// as dividing first and calling [`probabilities`] on the result.
pub(crate) fn probabilities_divided(p: &mut [f64], divisor: f64) -> Result<ProbSummary> {
    if p.is_empty() {
        return Err(RenyiError::Empty);
    }
    let screened = pulp::Arch::new().dispatch(ScreenDivided(p, divisor));
    summary(p, screened)
}

/// The summary of a screened vector, or the problem its screen points to.
fn summary<T: Probability>(
    p: &[T],
    (sum, min, min_positive): (f64, [f64; LANES], [f64; LANES]),
) -> Result<ProbSummary> {
    if (!sum.is_finite() || min.iter().any(|&m| m < 0.0))
        && let Some(problem) = first_bad_entry(p)
    {
        return Err(problem);
    }
    check_sum(sum)?;
    Ok(ProbSummary {
        min_positive: min_positive.into_iter().fold(f64::INFINITY, f64::min),
        sum,
    })
}

/// The screening pass of [`probabilities`] as a `pulp` operation:
/// `(Σp, lane minima, lane smallest positive entries)`.
struct Screen<'a, T>(&'a [T]);

impl<T: Probability> pulp::WithSimd for Screen<'_, T> {
    type Output = (f64, [f64; LANES], [f64; LANES]);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> Self::Output {
        let mut screened = Screened::new();
        for chunk in self.0.chunks(CHUNK) {
            screened.chunk(chunk);
        }
        (screened.sum, screened.min, screened.min_positive)
    }
}

/// [`Screen`] of `p / divisor` (each entry divided, in place, just before it is
/// screened): the same values, sums and extremes as dividing the whole vector first
/// and screening it then, in one pass over it.
struct ScreenDivided<'a>(&'a mut [f64], f64);

impl pulp::WithSimd for ScreenDivided<'_> {
    type Output = (f64, [f64; LANES], [f64; LANES]);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> Self::Output {
        let ScreenDivided(p, divisor) = self;
        let mut screened = Screened::new();
        for chunk in p.chunks_mut(CHUNK) {
            for x in chunk.iter_mut() {
                *x /= divisor;
            }
            screened.chunk::<f64>(chunk);
        }
        (screened.sum, screened.min, screened.min_positive)
    }
}

/// The running state of a screening pass: `Σp` (formed per [`CHUNK`], lane-wise,
/// lanes combined in a fixed order), lane minima and lane smallest positive entries.
struct Screened {
    sum: f64,
    min: [f64; LANES],
    min_positive: [f64; LANES],
}

impl Screened {
    #[inline(always)]
    fn new() -> Self {
        Screened {
            sum: 0.0,
            min: [0.0; LANES],
            min_positive: [f64::INFINITY; LANES],
        }
    }

    /// One chunk (at most [`CHUNK`] entries) screened.
    #[inline(always)]
    fn chunk<T: Probability>(&mut self, chunk: &[T]) {
        let Screened {
            sum,
            min,
            min_positive,
        } = self;
        // Three simple lane-wise loops straight over the chunk, which the compiler
        // vectorises (one loop with all three updates it does not; copying the
        // chunk to a widened buffer first cost a `memcpy` call per chunk, more than
        // the loops themselves).
        let mut lanes = [0.0_f64; LANES];
        let blocks = chunk.chunks_exact(LANES);
        let tail = blocks.remainder();
        for block in blocks.clone() {
            for j in 0..LANES {
                lanes[j] += block[j].to_f64();
            }
        }
        for block in blocks {
            for j in 0..LANES {
                let v = block[j].to_f64();
                min[j] = if v < min[j] { v } else { min[j] };
                min_positive[j] = if (v > 0.0) & (v < min_positive[j]) {
                    v
                } else {
                    min_positive[j]
                };
            }
        }
        for (j, &v) in tail.iter().enumerate() {
            lane(v.to_f64(), &mut lanes[j], &mut min[j], &mut min_positive[j]);
        }
        *sum += combine(lanes);
    }
}

#[inline(always)]
fn lane(v: f64, sum: &mut f64, min: &mut f64, min_positive: &mut f64) {
    *sum += v;
    *min = if v < *min { v } else { *min };
    *min_positive = if (v > 0.0) & (v < *min_positive) {
        v
    } else {
        *min_positive
    };
}

fn first_bad_entry<T: Probability>(p: &[T]) -> Option<RenyiError> {
    p.iter().enumerate().find_map(|(index, &entry)| {
        let value = entry.to_f64();
        if !value.is_finite() {
            Some(RenyiError::NonFinite { index, value })
        } else if value < 0.0 {
            Some(RenyiError::Negative { index, value })
        } else {
            None
        }
    })
}

/// Checks that `log_p` holds log-probabilities: non-empty, no NaN and no `+∞` (`−∞` is
/// probability 0), and `|exp(logsumexp) − 1| ≤ NORMALISATION_TOLERANCE`.
pub(crate) fn log_probabilities(log_p: &[f64]) -> Result<()> {
    if log_p.is_empty() {
        return Err(RenyiError::Empty);
    }
    let mut max = f64::NEG_INFINITY;
    for (index, &value) in log_p.iter().enumerate() {
        if value.is_nan() || value == f64::INFINITY {
            return Err(RenyiError::NonFinite { index, value });
        }
        max = max.max(value);
    }
    let sum = if max == f64::NEG_INFINITY {
        0.0
    } else {
        let scaled: f64 = log_p.iter().map(|&l| (l - max).exp()).sum();
        (max + scaled.ln()).exp()
    };
    check_sum(sum)
}

/// Both vectors of a pair are non-empty (checked by the callee) and equally long.
pub(crate) fn same_length(left: usize, right: usize) -> Result<()> {
    if left == right {
        Ok(())
    } else {
        Err(RenyiError::LengthMismatch { left, right })
    }
}

/// λ must be a number in [0, 1].
pub(crate) fn lambda(lambda: f64) -> Result<()> {
    if (0.0..=1.0).contains(&lambda) {
        Ok(())
    } else {
        Err(RenyiError::InvalidLambda(lambda))
    }
}

pub(crate) fn check_sum(sum: f64) -> Result<()> {
    // Written so that a NaN or infinite sum fails too.
    if (sum - 1.0).abs() <= NORMALISATION_TOLERANCE {
        Ok(())
    } else {
        Err(RenyiError::NotNormalised { sum })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_distributions_within_tolerance() {
        assert!(probabilities(&[0.5_f32, 0.5]).is_ok());
        assert!(probabilities(&[0.5, 0.5 + 0.9e-4]).is_ok());
        let s = probabilities(&[0.0, 1e-300, 1.0]).unwrap();
        assert_eq!(s.min_positive, 1e-300);
        assert!(log_probabilities(&[f64::NEG_INFINITY, 0.0]).is_ok());
        assert!(log_probabilities(&[0.5_f64.ln(), 0.5_f64.ln()]).is_ok());
    }

    #[test]
    fn names_each_problem() {
        assert_eq!(probabilities::<f64>(&[]), Err(RenyiError::Empty));
        assert_eq!(
            probabilities(&[0.5, -0.25, 0.75]),
            Err(RenyiError::Negative {
                index: 1,
                value: -0.25
            })
        );
        assert_eq!(
            probabilities(&[0.5, f64::INFINITY]),
            Err(RenyiError::NonFinite {
                index: 1,
                value: f64::INFINITY
            })
        );
        assert!(matches!(
            probabilities(&[f32::NAN, 1.0]),
            Err(RenyiError::NonFinite { index: 0, value }) if value.is_nan()
        ));
        assert_eq!(
            probabilities(&[0.5, 0.6]),
            Err(RenyiError::NotNormalised { sum: 1.1 })
        );
        assert_eq!(
            probabilities(&[1e308, 1e308]),
            Err(RenyiError::NotNormalised { sum: f64::INFINITY })
        );
        assert_eq!(log_probabilities(&[]), Err(RenyiError::Empty));
        assert_eq!(
            log_probabilities(&[0.0, f64::INFINITY]),
            Err(RenyiError::NonFinite {
                index: 1,
                value: f64::INFINITY
            })
        );
        assert_eq!(
            log_probabilities(&[f64::NEG_INFINITY]),
            Err(RenyiError::NotNormalised { sum: 0.0 })
        );
        assert!(matches!(
            log_probabilities(&[0.0, 0.0]),
            Err(RenyiError::NotNormalised { .. })
        ));
        assert_eq!(
            same_length(2, 3),
            Err(RenyiError::LengthMismatch { left: 2, right: 3 })
        );
        assert_eq!(lambda(1.5), Err(RenyiError::InvalidLambda(1.5)));
        assert!(lambda(f64::NAN).is_err());
        assert!(lambda(0.0).is_ok() && lambda(1.0).is_ok());
    }
}
