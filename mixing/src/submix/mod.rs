//! SubMix's pair projection (Ginart, van der Maaten, Zou, Guo, "SubMix: Practical
//! Private Prediction for Large-Scale Language Models", arXiv:2201.00971, §3, Eq. 2): for
//! the two models of one part, fine-tuned on the halves `π_i`, `π'_i`, the largest
//! `λ ∈ [0, 1]` with
//!
//! `D_α(λ·h + (1−λ)·p₀ ‖ λ·h' + (1−λ)·p₀) ≤ β`.
//!
//! The constraint is non-decreasing in λ (joint quasi-convexity of Rényi divergence) and
//! is 0 at some λ > 0 only when `h = h'`, so a zero bound admits only λ = 0 otherwise.
//! The search models `H = e^D − 1` (κ = 1) as a power of λ; `e^D` is convex for α ≤ 2
//! (SubMix's α = 2), and for larger orders the bracketing safeguards carry the search
//! (no tangent certification). The arguments are written out in `proof.md` beside this
//! file.

use privmix_renyi::{MixturePath, Order};

use crate::pmixed::bitwise_equal;
use crate::solver::{Evaluation, Search, check_bound};
use crate::{MixingError, Solution, enforced_radius};

/// The SubMix projection for one part's pair of models.
///
/// Guarantee: [`SubmixPairProjection::solve`] returns a λ ∈ [0, 1] at which
/// [`SubmixPairProjection::constraint`] — `privmix_renyi::MixturePath` evaluated at λ — is at
/// most the bound as computed in f64, and the supremum of the feasible set lies within
/// [`crate::LAMBDA_TOLERANCE`] above it, unless λ = 1 (feasible) or the bound is 0 (then
/// λ = 0 is exact, see the module documentation).
#[derive(Debug, Clone)]
pub struct SubmixPairProjection<'a> {
    path: MixturePath<'a>,
    /// The halves, for the bitwise-equality case of a certified solve.
    halves: (&'a [f64], &'a [f64]),
    alpha: Order,
    bound: f64,
}

impl<'a> SubmixPairProjection<'a> {
    /// Validates `h`, `h_prime`, `public` (probability vectors of one length), the order
    /// (finite or ∞) and the bound (≥ 0 or `+∞`).
    pub fn new(
        h: &'a [f64],
        h_prime: &'a [f64],
        public: &'a [f64],
        alpha: Order,
        bound: f64,
    ) -> Result<Self, MixingError> {
        check_bound(bound)?;
        let path = MixturePath::new(h, h_prime, public, alpha)?;
        Ok(SubmixPairProjection {
            path,
            halves: (h, h_prime),
            alpha,
            bound,
        })
    }

    /// `D_α(λh + (1−λ)p₀ ‖ λh' + (1−λ)p₀)` as evaluated by `privmix_renyi::MixturePath`.
    /// Errors for λ outside [0, 1] or NaN.
    pub fn constraint(&self, lambda: f64) -> Result<f64, MixingError> {
        Ok(self.path.evaluate(lambda)?.value)
    }

    /// The largest feasible λ (see the type's guarantee).
    pub fn solve(&self) -> Result<Solution, MixingError> {
        self.search(self.bound)
    }

    /// A λ at which the *exact* divergence of the two f64 mixtures
    /// `λh + (1−λ)p₀` and `λh' + (1−λ)p₀` (normalised, formed as the evaluator forms
    /// them), and of the exact mixtures, is at most the bound β: the search enforces
    /// [`crate::enforced_radius`]`(β, α, V)`, which covers the evaluator's error. The
    /// [`Solution`]'s `value` and `violated_at` refer to that enforced radius. When the
    /// margin swallows β the answer is λ = 0 (both mixtures are then p₀), unless
    /// `h = h'` bitwise (then every λ gives two equal mixtures and λ = 1 is returned).
    pub fn solve_certified(&self) -> Result<Solution, MixingError> {
        let (h, h_prime) = self.halves;
        let enforced = enforced_radius(self.bound, self.alpha, h.len())?;
        if enforced == 0.0 && !bitwise_equal(h, h_prime) {
            return Ok(Solution::at_zero(self.path.evaluate(0.0)?.value, 1.0));
        }
        self.search(enforced)
    }

    fn search(&self, bound: f64) -> Result<Solution, MixingError> {
        Search {
            upper: 1.0,
            bound,
            convex: false,
        }
        .run(|x| {
            let v = self.path.evaluate(x)?;
            Ok(Evaluation::single(v.value, v.slope, 1.0))
        })
    }
}

/// [`SubmixPairProjection::new`] then [`SubmixPairProjection::solve`].
pub fn submix_lambda(
    h: &[f64],
    h_prime: &[f64],
    public: &[f64],
    alpha: Order,
    bound: f64,
) -> Result<Solution, MixingError> {
    SubmixPairProjection::new(h, h_prime, public, alpha, bound)?.solve()
}

#[cfg(test)]
mod tests;
