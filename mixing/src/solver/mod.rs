//! The search shared by every λ solver: the largest λ ∈ [0, U] with `c(λ) ≤ b`, for a
//! constraint `c` that is non-decreasing in λ with `c(0) = 0`.
//!
//! # What it guarantees
//!
//! The search keeps a bracket `[lo, hi]` whose ends have been *evaluated*: `c(lo) ≤ b`
//! and `c(hi) > b`. It returns `lo` once `hi − lo ≤ LAMBDA_TOLERANCE`, so the λ returned
//! satisfies the constraint exactly as the evaluator computes it and, by monotonicity,
//! lies within the tolerance below the supremum of the feasible set. Nothing below relies
//! on the shape of `c` for correctness, only for speed. The argument (feasibility, the
//! bracket, termination, the tangent test) is written out in `proof.md` beside this file.
//!
//! # How it gets there in a handful of evaluations
//!
//! Each evaluation reports the constraint's parts (it is the maximum of two directions
//! for PMixED and DPS-MOZO), each with its value, its slope and a curvature κ chosen by
//! the solver so that `H = expm1(κc)/κ` (`H = c` for κ = 0) is close to a power law in λ
//! — κ = 1 makes `H = λR` exact for the forward max-divergence along a mixture, κ = −1
//! makes `H = λc` exact for the reverse one, and near λ = 0 smooth divergences grow like
//! λ². Newton therefore runs in log–log coordinates: from a point with `p = λH'/H`, the
//! model `H ∝ λ^p` reaches `H(b)` at `λ·(H(b)/H(c))^{1/p}`; for a maximum of parts, the
//! smallest of the parts' points. The next point is, in order of preference,
//!
//! 1. that Newton point, if it lies strictly inside the bracket and its step (in log λ) is
//!    at most half the step before last (Numerical Recipes' `rtsafe` rule);
//! 2. the zero of the secant through the bracket ends in log–log coordinates (a chord of
//!    H while the lower end is λ = 0), unless three evaluations have not halved the
//!    bracket;
//! 3. the midpoint (geometric while the bracket spans more than a factor 4);
//!
//! and after `GUIDED_EVALUATIONS` only midpoints, so every search terminates.
//!
//! # Reproducible λ
//!
//! Permuting the vocabulary changes the evaluator's summation order and the last bits of
//! every value, so which side of the root a point landed on can differ when a point lands
//! within rounding of it. Once an estimate of the root has converged (its predicted error
//! is below 1e-11 in log λ) the search therefore *finishes on a grid*: it evaluates the
//! grid point (`2⁻³²`) at least `ESTIMATE_ERROR` below the estimate — even if an earlier
//! point above it was already feasible — and, unless the bracket is already that narrow,
//! the grid point four steps above. The λ returned then depends on the estimate alone and
//! is bit-identical across summation orders unless the supremum lies within
//! `ESTIMATE_ERROR` of a grid point. A finishing evaluation that lands on the wrong side
//! forces a bisection.
//!
//! Where the solver proves each part's transform `H` convex in λ (PMixED), the grid point
//! above is not evaluated when the tangent of `H` at the grid point below already passes
//! the bound there with room for rounding (`H(x) ≥ H(lo) + (x − lo)·H'(lo)`): one pass
//! fewer per solve. The upper end is then proven, not evaluated, infeasible; the tests
//! evaluate it and check.
//!
//! # Two-point estimates
//!
//! Newton's estimate uses one point. Once two points have been evaluated, the zero of the
//! cubic Hermite interpolant through both (values and slopes, in Newton's coordinates) is
//! far more accurate when the latest point came from a Newton step: its predicted error
//! is `d³h²/(3u⁴)` against Newton's `d` (`d` the two estimates' difference, `u` Newton's
//! step, `h` the distance between the points). It typically certifies convergence right
//! after the first Newton step from the upper end, so a PMixED solve that the upper end
//! cannot satisfy costs three passes (the top, one Newton point, the grid point below)
//! instead of four. The estimate only chooses where to evaluate: feasibility and the
//! upper end are still evaluated or proven.

use crate::MixingError;

mod bracket;

/// Absolute accuracy of every λ the solvers return: the supremum of the feasible set lies
/// in `[λ, λ + LAMBDA_TOLERANCE]`.
pub const LAMBDA_TOLERANCE: f64 = 1e-9;

/// The outcome of a λ search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Solution {
    /// The λ chosen. Its constraint value, as computed by the solver's evaluator, is at most
    /// the bound.
    pub lambda: f64,
    /// The constraint's value at `lambda`, as evaluated (`≤` the bound).
    pub value: f64,
    /// The smallest λ at which the constraint is known to be above the bound: evaluated
    /// there and found above, or, for a constraint whose parts' transforms are convex in λ
    /// (PMixED's), proven above by the tangent at `lambda` (see `bracket`); `None` when
    /// `lambda` is the upper end of the range. By monotonicity the supremum of the
    /// feasible set lies in `[lambda, violated_at]`, and except for a zero bound (see the
    /// solvers) `violated_at − lambda ≤ LAMBDA_TOLERANCE`.
    pub violated_at: Option<f64>,
    /// How many times the constraint was evaluated (each evaluation is one pass over the
    /// inputs, except that PMixED's probe of λ = 1 on the closed-form path of
    /// `privmix_renyi::SymmetricMixture` comes from the pass that builds its ratio table):
    /// the cost of the solve.
    pub evaluations: u32,
}

impl Solution {
    /// λ = 0 when a certified solve's margin swallows the whole bound: `value` is the
    /// constraint there (one evaluation), and every λ up to `upper` counts as violated.
    pub(crate) fn at_zero(value: f64, upper: f64) -> Self {
        Self {
            lambda: 0.0,
            value,
            violated_at: Some(upper),
            evaluations: 1,
        }
    }
}

/// One part of a constraint: the constraint is the maximum of its parts (PMixED's and
/// DPS-MOZO's two directions) or a single part (SubMix).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Part {
    /// The part's value (may be `+∞`).
    pub value: f64,
    /// Its derivative in λ (right derivative, or left at the upper end); may be `+∞`,
    /// never trusted beyond guiding a step.
    pub slope: f64,
    /// The curvature κ of the transform `H = expm1(κc)/κ` Newton uses for this part.
    pub kappa: f64,
}

/// What an evaluator reports at one λ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Evaluation {
    /// The constraint's value, as the solver's `constraint(λ)` computes it: feasibility is
    /// decided on this number alone (NaN counts as infeasible).
    pub value: f64,
    /// The parts whose maximum the value is, for guiding steps (a single-part constraint
    /// repeats its part).
    pub parts: [Part; 2],
}

impl Evaluation {
    /// A constraint with one part.
    pub(crate) fn single(value: f64, slope: f64, kappa: f64) -> Self {
        let part = Part {
            value,
            slope,
            kappa,
        };
        Evaluation {
            value,
            parts: [part, part],
        }
    }
}

/// The search over `[0, upper]` for `c(λ) ≤ bound`; `Search::run` (in `bracket`, below
/// this module's types) runs it.
pub(crate) struct Search {
    /// Upper end `U` of the range (finite, > 0).
    pub upper: f64,
    /// The bound `b` (≥ 0, possibly `+∞`).
    pub bound: f64,
    /// Each part's transform `H = expm1(κc)/κ` is convex in λ (the solver proves it), so
    /// the tangent at a feasible point bounds H from below to its right: the search may
    /// then certify the upper end of its final bracket without evaluating it (see
    /// `bracket`).
    pub convex: bool,
}

/// Validates a bound: a number ≥ 0 or `+∞`.
pub(crate) fn check_bound(bound: f64) -> Result<f64, MixingError> {
    if bound >= 0.0 {
        Ok(bound)
    } else {
        Err(MixingError::InvalidBound(bound))
    }
}

/// Validates the upper end of a λ range: finite and > 0.
pub(crate) fn check_upper(upper: f64) -> Result<f64, MixingError> {
    if upper.is_finite() && upper > 0.0 {
        Ok(upper)
    } else {
        Err(MixingError::InvalidUpperEnd(upper))
    }
}

#[cfg(test)]
mod tests;
