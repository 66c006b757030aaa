//! DPS-MOZO's logit-space mixing (Flemings, Gan, Li, Razaviyayn, Annavaram,
//! "Differentially Private In-context Learning via Sampling Few-shot Mixed with Zero-shot
//! Outputs", arXiv:2501.19287, §4.1, Eq. 2–3): the largest `λ ∈ [0, λ_max]` with
//!
//! `Dsym(softmax(λ·l₁ + (1−λ)·l₀), softmax(l₀)) ≤ b`,
//!
//! where `l₀` are the zero-shot and `l₁` the one-shot logits, both already truncated to the
//! top-k support of the zero-shot logits (see [`crate::top_k_indices`]), and `Dsym` is the
//! larger of the two Rényi divergences of order α.
//!
//! With `T = l₁ − l₀`, `softmax(l₀ + λT)` is an exponential family in λ, whose convex
//! log-partition makes both directions non-decreasing on `[0, ∞)` (strictly unless `T`
//! is constant), beyond 1 as well, which the extrapolating range `[0, 1.5]` needs. The
//! same formulas, as expectations under escort distributions, give the slopes the
//! search uses; it models each direction as a power of λ directly (κ = 0). The
//! arguments, and the log-range bound behind [`LogitMixing::evaluator_error`], are
//! written out in `proof.md` beside this file.

use privmix_renyi::round::{add_up, ln_up, mul_up, sub_up, usize_up};
use privmix_renyi::{Order, divergence_log};

use crate::margin::evaluator_error_with_logs;
use crate::solver::{Evaluation, Part, Search, check_bound, check_upper};
use crate::{EvaluatorError, MixingError, Solution};

/// The default upper end of the λ range: DPS-MOZO (arXiv:2501.19287, §4.1) follows Xu,
/// "Context-aware Decoding Reduces Hallucination in Query-focused Summarization"
/// (arXiv:2312.14335).
pub const DEFAULT_LOGIT_UPPER: f64 = 1.5;

/// `log softmax(logits)` in f64 via log-sum-exp. Errors: [`MixingError::Empty`], or
/// [`MixingError::NonFiniteLogit`] for a NaN or infinite logit.
pub fn log_softmax(logits: &[f64]) -> Result<Vec<f64>, MixingError> {
    check_logits(logits)?;
    // `(l − max) − ln Σ exp(l − max)`, not `l − (max + ln Σ …)`: near ±f64::MAX the sum
    // `max + ln Σ` absorbs the logarithm and the result would not be normalised. A
    // difference `l − max` that overflows is −∞: a probability that underflows to 0.
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let shifted: Vec<f64> = logits.iter().map(|&l| l - max).collect();
    let ln_sum = shifted.iter().map(|&x| x.exp()).sum::<f64>().ln();
    Ok(shifted.into_iter().map(|x| x - ln_sum).collect())
}

fn check_logits(logits: &[f64]) -> Result<(), MixingError> {
    if logits.is_empty() {
        return Err(MixingError::Empty);
    }
    match logits.iter().position(|l| !l.is_finite()) {
        Some(index) => Err(MixingError::NonFiniteLogit {
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// `log Σ exp(v)` for finite `v` (non-empty): the tests' independent evaluator.
#[cfg(test)]
fn log_sum_exp(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max + v.iter().map(|&x| (x - max).exp()).sum::<f64>().ln()
}

/// `E[t]` under `softmax(u)`.
fn expectation(u: &[f64], t: &[f64]) -> f64 {
    let max = u.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (mut num, mut den) = (0.0, 0.0);
    for (&ux, &tx) in u.iter().zip(t) {
        let w = (ux - max).exp();
        num += w * tx;
        den += w;
    }
    num / den
}

/// The logit-mixing projection of one demonstration (one-shot logits) toward the
/// zero-shot logits.
///
/// Guarantee: [`LogitMixing::solve`] returns a λ at which [`LogitMixing::constraint`] — the
/// value DPS-MOZO's privacy analysis (arXiv:2501.19287, Thm. B.3) bounds by `βα` — is at most the
/// bound as computed in f64, and within [`crate::LAMBDA_TOLERANCE`] of the supremum of the
/// feasible interval, or the upper end when that is feasible. The distribution to sample
/// from is [`LogitMixing::mixed_log_probs`] at that λ: the very vector the constraint was
/// evaluated on.
#[derive(Debug, Clone)]
pub struct LogitMixing {
    zero_shot: Vec<f64>,
    /// `T = l₁ − l₀`: the direction of the path, and its derivative in λ.
    shift: Vec<f64>,
    log_public: Vec<f64>,
    alpha: Order,
    bound: f64,
    upper: f64,
}

impl LogitMixing {
    /// Validates the logits (non-empty, equal lengths, finite, with a finite difference),
    /// the order and the bound (≥ 0 or `+∞`); the λ range is `[0, DEFAULT_LOGIT_UPPER]`.
    pub fn new(
        one_shot: &[f64],
        zero_shot: &[f64],
        alpha: Order,
        bound: f64,
    ) -> Result<Self, MixingError> {
        let alpha = Order::new(alpha.value())?;
        check_bound(bound)?;
        check_logits(one_shot)?;
        check_logits(zero_shot)?;
        if one_shot.len() != zero_shot.len() {
            return Err(MixingError::LengthMismatch {
                left: one_shot.len(),
                right: zero_shot.len(),
            });
        }
        let shift: Vec<f64> = one_shot
            .iter()
            .zip(zero_shot)
            .map(|(&a, &b)| a - b)
            .collect();
        check_logits(&shift)?;
        Ok(LogitMixing {
            zero_shot: zero_shot.to_vec(),
            shift,
            log_public: log_softmax(zero_shot)?,
            alpha,
            bound,
            upper: DEFAULT_LOGIT_UPPER,
        })
    }

    /// The same projection over `[0, upper]` (finite, > 0).
    pub fn with_upper_end(mut self, upper: f64) -> Result<Self, MixingError> {
        self.upper = check_upper(upper)?;
        Ok(self)
    }

    /// The upper end of the λ range.
    pub fn upper_end(&self) -> f64 {
        self.upper
    }

    /// The mixed logits `l₀ + λ(l₁ − l₀)` (the paper's `λl₁ + (1−λ)l₀`, written so that
    /// λ = 0 and identical inputs give `l₀` exactly). Errors:
    /// [`MixingError::LambdaOutOfRange`] outside `[0, upper]`, and
    /// [`MixingError::NonFiniteLogit`] if a mixed logit overflows.
    pub fn mixed_logits(&self, lambda: f64) -> Result<Vec<f64>, MixingError> {
        if !(0.0..=self.upper).contains(&lambda) {
            return Err(MixingError::LambdaOutOfRange {
                lambda,
                upper: self.upper,
            });
        }
        let mixed: Vec<f64> = self
            .zero_shot
            .iter()
            .zip(&self.shift)
            .map(|(&l, &t)| l + lambda * t)
            .collect();
        check_logits(&mixed)?;
        Ok(mixed)
    }

    /// `log softmax` of [`LogitMixing::mixed_logits`]: the mixed distribution `P_λ`.
    pub fn mixed_log_probs(&self, lambda: f64) -> Result<Vec<f64>, MixingError> {
        log_softmax(&self.mixed_logits(lambda)?)
    }

    /// The forward `D_α(P_λ ‖ P₀)` and reverse `D_α(P₀ ‖ P_λ)`, with `log P_λ`.
    fn divergences(&self, lambda: f64) -> Result<(f64, f64, Vec<f64>), MixingError> {
        let lp = self.mixed_log_probs(lambda)?;
        let forward = divergence_log(&lp, &self.log_public, self.alpha)?;
        let reverse = divergence_log(&self.log_public, &lp, self.alpha)?;
        Ok((forward, reverse, lp))
    }

    /// The constraint `Dsym(P_λ, P₀) = max(D_α(P_λ ‖ P₀), D_α(P₀ ‖ P_λ))`, computed by
    /// `privmix_renyi::divergence_log` on the log-probabilities of
    /// [`LogitMixing::mixed_log_probs`] and of the zero-shot logits.
    pub fn constraint(&self, lambda: f64) -> Result<f64, MixingError> {
        let (forward, reverse, _) = self.divergences(lambda)?;
        Ok(forward.max(reverse))
    }

    /// The constraint and its two directions with their derivatives in λ (derived in
    /// `proof.md` beside this file).
    fn evaluate(&self, lambda: f64) -> Result<Evaluation, MixingError> {
        let (forward, reverse, lp) = self.divergences(lambda)?;
        let t = &self.shift;
        let mean: f64 = lp.iter().zip(t).map(|(&l, &tx)| l.exp() * tx).sum();
        let (slope_f, slope_r) = match self.alpha {
            Order::Finite(alpha) => {
                let e = alpha - 1.0;
                let lq = &self.log_public;
                let escort_f: Vec<f64> =
                    lp.iter().zip(lq).map(|(&a, &b)| a + e * (a - b)).collect();
                let escort_r: Vec<f64> =
                    lq.iter().zip(&lp).map(|(&a, &b)| a + e * (a - b)).collect();
                (
                    (alpha / e) * (expectation(&escort_f, t) - mean),
                    mean - expectation(&escort_r, t),
                )
            }
            Order::Infinite => {
                let max = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let min = t.iter().copied().fold(f64::INFINITY, f64::min);
                (max - mean, mean - min)
            }
        };
        Ok(Evaluation {
            value: forward.max(reverse),
            parts: [
                Part {
                    value: forward,
                    slope: slope_f,
                    kappa: 0.0,
                },
                Part {
                    value: reverse,
                    slope: slope_r,
                    kappa: 0.0,
                },
            ],
        })
    }

    /// The largest feasible λ (see the type's guarantee). A zero bound gives λ = 0 unless
    /// the constraint is 0 at the upper end (the constraint is strictly increasing unless
    /// `l₁ − l₀` is constant).
    pub fn solve(&self) -> Result<Solution, MixingError> {
        self.search(self.bound)
    }

    /// The error bound of this projection's evaluator over its whole λ range: that of
    /// `privmix_renyi::divergence_log` (see [`crate::EvaluatorError`]) with the
    /// log-probabilities' magnitude bounded by
    /// `Λ = range(l₀) + upper·range(l₁ − l₀) + ln V + 1` (a log-softmax entry is
    /// `l − max l − ln Σ exp(l − max l)`, and the mixed logits' range grows by at most
    /// `λ·range(l₁ − l₀)`), which also covers `log_softmax`'s own rounding (its entries
    /// carry errors below `u·(3Λ + V + 4)`, moving each direction by at most four times
    /// that, inside the model's slack). Errors: none for a validated projection.
    pub fn evaluator_error(&self) -> Result<EvaluatorError, MixingError> {
        let range = |v: &[f64]| {
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            sub_up(hi, lo)
        };
        let logs = add_up(
            add_up(
                range(&self.zero_shot),
                mul_up(self.upper, range(&self.shift)),
            ),
            add_up(ln_up(usize_up(self.shift.len())), 1.0),
        );
        evaluator_error_with_logs(self.alpha, self.shift.len(), logs)
    }

    /// A λ whose distribution ([`LogitMixing::mixed_log_probs`]: the softmax of the f64
    /// mixed logits) has an *exact* symmetric divergence from `softmax(l₀)` of at most
    /// the bound `b`, not merely as evaluated: the search enforces
    /// [`EvaluatorError::enforced`]`(b)` with [`LogitMixing::evaluator_error`]. The
    /// [`Solution`]'s `value` and `violated_at` refer to that enforced radius. When the
    /// margin swallows `b` the answer is λ = 0 (the mixed logits are then `l₀` exactly),
    /// unless `l₁ − l₀` is 0 everywhere (then every λ gives `l₀`).
    pub fn solve_certified(&self) -> Result<Solution, MixingError> {
        let enforced = self.evaluator_error()?.enforced(self.bound)?;
        if enforced == 0.0 && self.shift.iter().any(|&t| t != 0.0) {
            return Ok(Solution::at_zero(self.constraint(0.0)?, self.upper));
        }
        self.search(enforced)
    }

    fn search(&self, bound: f64) -> Result<Solution, MixingError> {
        Search {
            upper: self.upper,
            bound,
            convex: false,
        }
        .run(|x| self.evaluate(x))
    }
}

/// [`LogitMixing::new`] then [`LogitMixing::solve`], over `[0, DEFAULT_LOGIT_UPPER]`.
pub fn logit_mixing_lambda(
    one_shot: &[f64],
    zero_shot: &[f64],
    alpha: Order,
    bound: f64,
) -> Result<Solution, MixingError> {
    LogitMixing::new(one_shot, zero_shot, alpha, bound)?.solve()
}

#[cfg(test)]
mod tests;
