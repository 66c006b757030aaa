//! PMixED's projection (Flemings, Razaviyayn, Annavaram, "Differentially Private
//! Next-Token Prediction of Large Language Models", arXiv:2403.15638; restated in
//! "Adaptively Private Next-Token Prediction of Large Language Models", arXiv:2410.02016,
//! §3.2, Thm. 3.1 and App. B Alg. 2, and used by its Alg. 1, line 11): the largest
//! `λ ∈ [0, 1]` with
//!
//! `Dsym(λ·p_i + (1−λ)·p₀, p₀) = max(D_α(m_λ ‖ p₀), D_α(p₀ ‖ m_λ)) ≤ b`   (`b = βα`).
//!
//! The constraint is non-decreasing in λ (joint quasi-convexity of Rényi divergence),
//! strictly when `p_i ≠ p₀`, so a zero bound admits only λ = 0. The search models
//! `H = expm1(κD)/κ` as a power of λ, with κ = 1 for the forward direction and κ = −1
//! for the reverse one; both transforms are convex in λ (power means of the likelihood
//! ratio), which lets the search certify the upper end of its final bracket by a
//! tangent. A typical solve costs 3 evaluations (1 when λ = 1 is feasible), each one
//! pass over both vectors computing both directions. The arguments are written out in
//! `proof.md` beside this file.

use privmix_renyi::{Order, RenyiError, SymmetricMixture, ValidatedRow};
use rayon::prelude::*;

use crate::solver::{Evaluation, Part, Search, check_bound};
use crate::{MixingError, Solution, enforced_radius};

/// The PMixED projection of one private distribution toward the public one.
///
/// Guarantee: [`PmixedProjection::solve`] returns a λ ∈ [0, 1] at which
/// [`PmixedProjection::constraint`] — `privmix_renyi::SymmetricMixture` evaluated at λ, the
/// symmetric divergence that PMixED's privacy theorem (arXiv:2410.02016, Thm. 3.1)
/// requires to be at most `βα` — is at most the
/// bound as computed in f64; and the supremum of the feasible set lies within
/// [`crate::LAMBDA_TOLERANCE`] above it, unless λ = 1 (feasible) or the bound is 0 (then
/// λ = 0, exactly the supremum, see the module documentation). The mixture to output is
/// [`PmixedProjection::mixture`] at that λ, formed exactly as the evaluator forms it.
#[derive(Debug, Clone)]
pub struct PmixedProjection<'a> {
    path: SymmetricMixture<'a>,
    private: &'a [f64],
    public: &'a [f64],
    alpha: Order,
    bound: f64,
}

impl<'a> PmixedProjection<'a> {
    /// Validates `private` and `public` (probability vectors of one length, see
    /// `privmix_renyi`), the order (finite or ∞) and the bound (≥ 0 or `+∞`).
    pub fn new(
        private: &'a [f64],
        public: &'a [f64],
        alpha: Order,
        bound: f64,
    ) -> Result<Self, MixingError> {
        check_bound(bound)?;
        let path = SymmetricMixture::new(private, public, alpha)?;
        Ok(PmixedProjection {
            path,
            private,
            public,
            alpha,
            bound,
        })
    }

    /// As [`PmixedProjection::new`] with the public row validated once beforehand
    /// (many members against one public row); bitwise the same projection.
    pub fn with_public(
        private: &'a [f64],
        public: &ValidatedRow<'a>,
        alpha: Order,
        bound: f64,
    ) -> Result<Self, MixingError> {
        check_bound(bound)?;
        let path = SymmetricMixture::with_public(private, public, alpha)?;
        Ok(PmixedProjection {
            path,
            private,
            public: public.row(),
            alpha,
            bound,
        })
    }

    /// From a private and a public row both validated beforehand
    /// (`privmix_renyi::ValidatedRows`: the rows of an ensemble, solved against every
    /// token); bitwise the same projection as [`PmixedProjection::new`] on their slices.
    pub fn from_rows(
        private: &ValidatedRow<'a>,
        public: &ValidatedRow<'a>,
        alpha: Order,
        bound: f64,
    ) -> Result<Self, MixingError> {
        check_bound(bound)?;
        let path = SymmetricMixture::from_rows(private, public, alpha)?;
        Ok(PmixedProjection {
            path,
            private: private.row(),
            public: public.row(),
            alpha,
            bound,
        })
    }

    /// `Dsym(λp_i + (1−λ)p₀, p₀)` as evaluated by `privmix_renyi::SymmetricMixture`.
    /// Errors for λ outside [0, 1] or NaN.
    pub fn constraint(&self, lambda: f64) -> Result<f64, MixingError> {
        Ok(self.path.evaluate(lambda)?.max())
    }

    /// The mixture `λ·p_i + (1−λ)·p₀`, entry by entry with the same f64 expression as the
    /// evaluator (`λ·p + (1 − λ)·q`). Errors for λ outside [0, 1] or NaN.
    pub fn mixture(&self, lambda: f64) -> Result<Vec<f64>, MixingError> {
        if !(0.0..=1.0).contains(&lambda) {
            return Err(RenyiError::InvalidLambda(lambda).into());
        }
        let mu = 1.0 - lambda;
        Ok(self
            .private
            .iter()
            .zip(self.public)
            .map(|(&p, &q)| lambda * p + mu * q)
            .collect())
    }

    /// The constraint and its two directions, each with the transform that makes it
    /// convex (κ = 1 forward, κ = −1 reverse; see `proof.md` beside this file).
    fn evaluate(&self, lambda: f64) -> Result<Evaluation, MixingError> {
        let v = self.path.evaluate(lambda)?;
        let (f, r) = (v.forward, v.reverse);
        Ok(Evaluation {
            value: v.max(),
            parts: [
                Part {
                    value: f.value,
                    slope: f.slope,
                    kappa: 1.0,
                },
                Part {
                    value: r.value,
                    slope: r.slope,
                    kappa: -1.0,
                },
            ],
        })
    }

    /// The largest feasible λ (see the type's guarantee).
    pub fn solve(&self) -> Result<Solution, MixingError> {
        self.search(self.bound)
    }

    /// A λ whose mixture ([`PmixedProjection::mixture`]) has an *exact* symmetric
    /// divergence from the public distribution of at most the bound `b` (both
    /// normalised), not merely as evaluated in f64: the search enforces
    /// [`crate::enforced_radius`]`(b, α, V)`, which covers the evaluator's error
    /// (see [`crate::EvaluatorError`]). The [`Solution`]'s `value` and `violated_at`
    /// refer to that enforced radius. When the margin swallows `b` (radii below about
    /// `1e-10` at `V = 5·10⁴`) the answer is λ = 0 — the public distribution itself —
    /// unless the private row equals the public one bitwise (then λ = 1, the same
    /// distribution).
    pub fn solve_certified(&self) -> Result<Solution, MixingError> {
        let enforced = enforced_radius(self.bound, self.alpha, self.public.len())?;
        if enforced == 0.0 && !bitwise_equal(self.private, self.public) {
            // A zero bound admits only λ = 0 (`proof.md` beside this file); the evaluator's
            // 0 at some λ > 0 would not certify the exact divergence.
            return Ok(Solution::at_zero(self.evaluate(0.0)?.value, 1.0));
        }
        self.search(enforced)
    }

    fn search(&self, bound: f64) -> Result<Solution, MixingError> {
        Search {
            upper: 1.0,
            bound,
            // Both transforms are convex in λ (`proof.md` beside this file).
            convex: true,
        }
        .run(|x| self.evaluate(x))
    }
}

/// Whether two rows hold the same bits (then every mixture of them is that row).
pub(crate) fn bitwise_equal(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// [`PmixedProjection::new`] then [`PmixedProjection::solve`].
pub fn pmixed_lambda(
    private: &[f64],
    public: &[f64],
    alpha: Order,
    bound: f64,
) -> Result<Solution, MixingError> {
    PmixedProjection::new(private, public, alpha, bound)?.solve()
}

/// [`pmixed_lambda`] for each of the N rows of `rows` (row-major, each of `public.len()`
/// entries) against the same `public`, in parallel over rows (rayon). Errors:
/// [`MixingError::Empty`] for an empty `public`, [`MixingError::RaggedBatch`] unless
/// `rows.len()` is a multiple of `public.len()`, and [`MixingError::Row`] naming the first
/// row (by index) that was rejected.
pub fn pmixed_lambdas(
    rows: &[f64],
    public: &[f64],
    alpha: Order,
    bound: f64,
) -> Result<Vec<Solution>, MixingError> {
    if public.is_empty() {
        return Err(MixingError::Empty);
    }
    if !rows.len().is_multiple_of(public.len()) {
        return Err(MixingError::RaggedBatch {
            len: rows.len(),
            row_len: public.len(),
        });
    }
    rows.par_chunks(public.len())
        .enumerate()
        .map(|(row, p)| {
            pmixed_lambda(p, public, alpha, bound).map_err(|e| MixingError::Row {
                row,
                source: Box::new(e),
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests;
