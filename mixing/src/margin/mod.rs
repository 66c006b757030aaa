//! How far below a radius `b` a solver must enforce its constraint so that the *exact*
//! divergence of what it returns stays `≤ b`.
//!
//! Every solver guarantees its constraint as *its own evaluator computes it* in f64. The
//! privacy analyses need the exact divergence of the distributions actually used — the
//! f64 mixture [`crate::PmixedProjection::mixture`] returns (normalised) against the
//! f64 public row (normalised), SubMix's two f64 mixtures, or the softmax of DPS-MOZO's
//! f64 mixed logits against that of the zero-shot logits — to be at most `b`. The two
//! differ by the evaluator's rounding error, which has an absolute part: no relative
//! margin `b·(1 − ε)` covers it once `b` is tiny. [`enforced_radius`] returns
//!
//! `b' = b·(1 − ρ) − A(α, V)` (rounded down; 0 when the margin swallows `b`),
//!
//! and if `D̂ ≤ b'` for an evaluated value `D̂` with `|D̂ − D| ≤ ρ·D + A` then
//! `D ≤ (D̂ + A)/(1 − ρ) ≤ b`. When `b' = 0` no λ > 0 can be certified and the
//! certified solves (`solve_certified`) return λ = 0, whose mixture is the public
//! distribution itself (divergence exactly 0), unless the private input equals the
//! public one bitwise (then every mixture is the public distribution too).
//!
//! # The error model
//!
//! `u = 2⁻⁵³` (unit roundoff), `V` the vector length, `e = α − 1`, `a = α/(α − 1)` (1 for
//! α = ∞), and `L` a bound on the magnitude of every logarithm the kernels take:
//! `L = 745 > |ln x|` for every positive f64 (`ln 2⁻¹⁰⁷⁴ ≈ −744.4`) on the probability
//! paths, the data-dependent `Λ` of [`LogitMixing`](crate::LogitMixing) on the logit path.
//! The value of each direction is `D = (ln S − α·ln M)/e + ln N` with
//! `S = Σ m^α n^{1−α}` and the normalisers `M = Σm`, `N = Σn` (or, at α = ∞,
//! `max ln(m/n) + ln(N/M)`), computed by one of privmix-renyi's mixture kernels. To
//! first order in `u`, bounding each rounding by `u` times the magnitude it is made at
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1–3.4):
//!
//! 1. *Inputs.* The mixture the evaluator forms differs entrywise from the f64 mixture
//!    returned (the closed-form path of `SymmetricMixture` forms `q·((1−λ) + λ·fl(p/q))`)
//!    and from the exact one `λp + (1−λ)q` by relative errors below `4u` per entry.
//!    Multiplying an argument's entries by factors within `e^{±c}` moves `D_α` by at
//!    most `2c·α/e` (first argument) or `2c` (second argument), normalisation included:
//!    at most `16u·a` here.
//! 2. *Sums.* `S`, `M`, `N` are sums of `V` non-negative terms; however they are split
//!    into lanes and chunks, each has a relative error below `V·u` (recursive summation,
//!    `γ_V`), and each term's own error (ratios, powers by repeated squaring, `powf`,
//!    `exp` of a log-space exponent, the rescalings of running maxima) is a factor
//!    within `e^{±3u(α+1)}` around the term, or `e^{±u(2 + 3α)L}` in log space. Through
//!    `ln S / e`, `α ln M / e` and `ln N` these give at most `(2a·V + 12a + 6a·L)·u`.
//! 3. *Logarithms and the final combination.* Each `ln` of a positive f64 is faithful
//!    (error `< u·|result|` plus `u`), each of the few additions, multiplications by α
//!    and divisions by `e` in the final combination adds `u` times the magnitude of its
//!    result, and the magnitudes are bounded by `α·L` (a log-space exponent, `α·ln t`
//!    for a scale `t`) or by `e·D` (the combination itself): at most `4u·D + 8u·a·L`.
//!
//! So `|D̂ − D| ≤ 4u·D + u·a·(14·L + 2·V + 28)`. [`evaluator_error`] states
//! `ρ = 2⁻⁴⁴ ≈ 5.7e-14` (≥ 500 times the derived `4u`) and
//! `A = u·a·(128·L + 16·V + 1024)` (≥ 8 times each derived coefficient), slack that
//! also covers the second-order terms and constant factors the sketch above rounds
//! away. At `V = 50 257`, `α = 18`, `A ≈ 1.0e-10`: PMixED's radii (`βα ≈ 0.1–4`) lose
//! nothing measurable; radii below `A` give λ = 0.

use privmix_renyi::Order;
use privmix_renyi::round::{add_up, div_up, mul_down, mul_up, sub_down, usize_up};

use crate::MixingError;
use crate::solver::check_bound;

/// The unit roundoff `u = 2⁻⁵³`.
const UNIT_ROUNDOFF: f64 = 1.0 / 9_007_199_254_740_992.0;

/// A bound on `|ln x|` for every positive f64 (`ln 2⁻¹⁰⁷⁴ ≈ −744.44`).
pub const LOG_RANGE: f64 = 745.0;

/// The relative part ρ of [`EvaluatorError`]: `2⁻⁴⁴` (see the module documentation).
pub const RELATIVE_ERROR: f64 = 1.0 / 17_592_186_044_416.0;

/// A bound on the error of a divergence evaluator: `|D̂ − D| ≤ relative·D + absolute`
/// for the exact divergence `D` of the distributions used and the value `D̂` computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvaluatorError {
    /// ρ: the part proportional to the divergence.
    pub relative: f64,
    /// `A`: the part that does not shrink with the divergence (dominant for tiny radii).
    pub absolute: f64,
}

impl EvaluatorError {
    /// `b·(1 − ρ) − A`, rounded down and clamped at 0 (`+∞` stays `+∞`): the largest
    /// value an evaluated divergence may take for the exact one to be `≤ b`.
    /// [`MixingError::InvalidBound`] for a negative or NaN `b`.
    pub fn enforced(&self, radius: f64) -> Result<f64, MixingError> {
        check_bound(radius)?;
        if radius == f64::INFINITY {
            return Ok(radius);
        }
        let kept = mul_down(radius, sub_down(1.0, self.relative));
        Ok(sub_down(kept, self.absolute).max(0.0))
    }
}

/// The error bound of privmix-renyi's mixture evaluators (`SymmetricMixture` and
/// `MixturePath`, every kernel they dispatch to) for probability vectors of length
/// `vocab` at order `order`: `ρ = 2⁻⁴⁴`, `A = u·a·(128·745 + 16·V + 1024)`, `a = α/(α−1)`
/// (1 at α = ∞), rounded up. [`MixingError::Empty`] for `vocab = 0`.
pub fn evaluator_error(order: Order, vocab: usize) -> Result<EvaluatorError, MixingError> {
    evaluator_error_with_logs(order, vocab, LOG_RANGE)
}

/// [`evaluator_error`] with `log_range` in place of [`LOG_RANGE`]: a bound on the
/// magnitude of every logarithm the evaluator takes or is given (the logit path's
/// log-probabilities are not bounded by 745).
pub(crate) fn evaluator_error_with_logs(
    order: Order,
    vocab: usize,
    log_range: f64,
) -> Result<EvaluatorError, MixingError> {
    if vocab == 0 {
        return Err(MixingError::Empty);
    }
    let a = match order {
        Order::Infinite => 1.0,
        // α/(α − 1) rounded up: α − 1 rounded down (exact for α ≤ 2 by Sterbenz).
        Order::Finite(alpha) => div_up(alpha, sub_down(alpha, 1.0)),
    };
    let terms = add_up(
        add_up(mul_up(128.0, log_range), mul_up(16.0, usize_up(vocab))),
        1024.0,
    );
    Ok(EvaluatorError {
        relative: RELATIVE_ERROR,
        absolute: mul_up(UNIT_ROUNDOFF, mul_up(a, terms)),
    })
}

/// The radius a PMixED or SubMix projection must enforce *as evaluated* so that the
/// exact divergence of the mixture it returns is at most `radius`:
/// `radius·(1 − ρ) − A(α, vocab)` rounded down, 0 when the margin swallows the radius
/// (see the module documentation for the error model). `+∞` stays `+∞`.
///
/// The projections' `solve_certified` methods apply it themselves (and return λ = 0
/// when it is 0); call this directly only to report or compare the margin.
/// Errors: [`MixingError::InvalidBound`] for a negative or NaN radius,
/// [`MixingError::Empty`] for `vocab = 0`.
pub fn enforced_radius(radius: f64, order: Order, vocab: usize) -> Result<f64, MixingError> {
    evaluator_error(order, vocab)?.enforced(radius)
}

#[cfg(test)]
mod exact_tests;

#[cfg(test)]
mod tests;
