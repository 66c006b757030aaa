//! PMixED's projection (Flemings et al. 2024, "Differentially private next-token prediction
//! of large language models", §3.2 and Alg. 2; AdaPMixED, adapmixed Alg. 1 line 11): the
//! largest `λ ∈ [0, 1]` with
//!
//! `Dsym(λ·p_i + (1−λ)·p₀, p₀) = max(D_α(m_λ ‖ p₀), D_α(p₀ ‖ m_λ)) ≤ b`   (`b = βα`).
//!
//! # Why the constraint is monotone in λ
//!
//! Rényi divergence of order α ∈ [0, ∞] is jointly quasi-convex (van Erven & Harremoës
//! 2014, Thm. 13). For `0 ≤ λ₁ < λ₂` the pair `(m_{λ₁}, p₀)` is the convex combination
//! `(λ₁/λ₂)·(m_{λ₂}, p₀) + (1 − λ₁/λ₂)·(p₀, p₀)`, so
//! `D(m_{λ₁} ‖ p₀) ≤ max(D(m_{λ₂} ‖ p₀), D(p₀ ‖ p₀)) = D(m_{λ₂} ‖ p₀)`, and likewise for the
//! reverse direction and hence for their maximum. Both directions are in fact strictly
//! increasing when `p_i ≠ p₀`: with `w = m_λ/p₀ = 1 + λ(p_i/p₀ − 1)`, affine in λ,
//! `Σ p₀ w^α` is strictly convex in λ with zero slope at 0 (`Σ (p_i − p₀) = 0`), and so is
//! `Σ p₀ w^{1−α}`. A zero bound therefore admits only λ = 0.
//!
//! # The transforms the search uses
//!
//! With `w = m_λ/p₀` and the power mean `M_s(w) = (Σ p₀ w^s)^{1/s}` (a norm for `s ≥ 1`,
//! concave for `s ≤ 1`): `exp(D_α(m ‖ p₀)) = M_α(w)^{α/(α−1)}` and
//! `exp(−D_α(p₀ ‖ m)) = M_{1−α}(w)`. The search (see `solver`) models
//! `H = expm1(κD)/κ` as a power of λ; it uses κ = 1 for the forward direction, where
//! `H = e^D − 1` is convex and, for the large orders PMixED uses (`D_α ≈ log(1 + λR)`),
//! nearly the linear `λR` (exactly at α = ∞); and κ = −1 for the reverse one, where
//! `H = 1 − e^{−D} = 1 − M_{1−α}(w)` is convex and nearly the linear `λ(1 − min w)`
//! (exactly at α = ∞). Near λ = 0 both grow like `λ²` (α(α−1)χ²/2), the other power the
//! model captures exactly. A typical solve costs 3 evaluations (1 when λ = 1 is
//! feasible, up to about 8 on awkward shapes), each one pass over both vectors computing
//! both directions.

use privmix_renyi::{Order, RenyiError, SymmetricMixture, ValidatedRow};
use rayon::prelude::*;

use crate::solver::{Evaluation, Part, Search, check_bound};
use crate::{MixingError, Solution, enforced_radius};

/// The PMixED projection of one private distribution toward the public one.
///
/// Guarantee: [`PmixedProjection::solve`] returns a λ ∈ [0, 1] at which
/// [`PmixedProjection::constraint`] — `privmix_renyi::SymmetricMixture` evaluated at λ, the
/// symmetric divergence that PMixED's Thm. 3.1 requires to be at most `βα` — is at most the
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
    /// convex (κ = 1 forward, κ = −1 reverse; see the module documentation).
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
            // A zero bound admits only λ = 0 (module documentation); the evaluator's
            // 0 at some λ > 0 would not certify the exact divergence.
            return Ok(Solution::at_zero(self.evaluate(0.0)?.value, 1.0));
        }
        self.search(enforced)
    }

    fn search(&self, bound: f64) -> Result<Solution, MixingError> {
        Search {
            upper: 1.0,
            bound,
            // Both transforms are convex in λ (module documentation).
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
