//! SubMix (Ginart, van der Maaten, Zou & Guo, "Submix: Practical private prediction for
//! large-scale language models", arXiv 2201.00971, §3, Alg. 1–2), with the change that
//! makes its release provable.
//!
//! The private corpus is partitioned into k parts, each split into two halves with one
//! fine-tuned model per half (`h_{πᵢ}`, `h_{π'ᵢ}`). Per query, for each part:
//!
//! * `λᵢ^pair` = the largest λ ∈ [0, 1] with
//!   `D_α(λh_{πᵢ} + (1−λ)p₀ ‖ λh_{π'ᵢ} + (1−λ)p₀) ≤ β` (the paper's Eq. 2, its
//!   subsample-stability test; [`privmix_mixing::submix_lambda`]),
//! * `h̄ᵢ = (h_{πᵢ} + h_{π'ᵢ})/2` (Alg. 2 line 7),
//! * `λᵢ^anchor` = the largest λ ∈ [0, 1] with `Dsym_{α_c}(λh̄ᵢ + (1−λ)p₀, p₀) ≤ b` (PMixED's
//!   projection),
//! * `λᵢ = min(λᵢ^pair, λᵢ^anchor)`,
//!
//! and the output is `h = (1/k)·Σᵢ (λᵢh̄ᵢ + (1−λᵢ)p₀)`.
//!
//! # Why privmix departs from Alg. 2
//! The paper outputs `λ*·mean(h̄ᵢ) + (1−λ*)·p₀` with `λ* = mean(λᵢ^pair)`, charges each
//! response the data-dependent `Dsym_α(h, h₋ᵢ)` and issues STOP when a part's budget would
//! run out (Prop. 3.1). That release is not bounded by what it charges:
//! * the charge is itself a function of the corpus, and so is the STOP time; on a
//!   neighbouring corpus the budgets trigger STOP differently, so the token laws differ
//!   while the charge does not cover it (a two-part example with every λ = 1 releases
//!   laws `Dsym₂ ≈ 5.5` apart while 0 is charged: `tests/submix_paper_protocol.rs`);
//! * with every `λᵢ^pair = 1` (halves that agree) the output is the plain average of the
//!   parts, whose divergence from its neighbour is unbounded: no data-independent bound
//!   exists for Alg. 2's output at all.
//!
//! Anchoring each part's mixture to p₀ within radius b (PMixED's constraint) gives the
//! output a proven, data-independent per-response bound while keeping SubMix's
//! subsample-stability test, which can only lower λᵢ.
//!
//! # Guarantee
//! Privacy unit: a user, whose data lies in one half of one part. Adding, removing or
//! replacing the user changes that part's models arbitrarily (an emptied half gives the
//! public model); k is public and fixed (*changed-part* adjacency). Each part's
//! contribution `λᵢh̄ᵢ + (1−λᵢ)p₀` is within b of p₀ at α_c in both directions (λᵢ ≤
//! λᵢ^anchor and the divergence is non-decreasing along the segment from p₀, by joint
//! convexity of `Σ P^α Q^{1−α}`), so each response is `(α, ε(α))`-RDP with PMixED's
//! bound for k members without subsampling ([`crate::bounds::pmixed_bound_at`]).

use privmix_mixing::submix_lambda;
use privmix_renyi::Order;

use crate::pmixed::solve_lambdas;
use crate::{Ensemble, MechanismError};

/// The output of SubMix on one query, with the λ of every part.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmixDistribution {
    /// `h = (1/k)·Σᵢ (λᵢh̄ᵢ + (1−λᵢ)p₀)`: the distribution a response is sampled from.
    pub output: Vec<f64>,
    /// `λᵢ = min(λᵢ^pair, λᵢ^anchor)` of every part, in part order.
    pub lambdas: Vec<f64>,
    /// The paper's subsample-stability λ of every part (Eq. 2).
    pub pair_lambdas: Vec<f64>,
    /// The anchoring λ of every part (PMixED's constraint on h̄ᵢ).
    pub anchor_lambdas: Vec<f64>,
    /// Divergence evaluations the λ solvers spent.
    pub solver_evaluations: usize,
}

/// Checks SubMix's pair-test parameters: a finite order α > 1 and a finite β ≥ 0.
pub(crate) fn check_submix_parameters(alpha: f64, beta: f64) -> Result<Order, MechanismError> {
    if !(alpha.is_finite() && alpha > 1.0) {
        return Err(MechanismError::InvalidParameter {
            name: "alpha",
            value: alpha,
            reason: "SubMix's Rényi order must be finite and > 1",
        });
    }
    if !(beta.is_finite() && beta >= 0.0) {
        return Err(MechanismError::InvalidParameter {
            name: "beta",
            value: beta,
            reason: "SubMix's target leakage β must be finite and ≥ 0",
        });
    }
    Ok(Order::new(alpha)?)
}

/// SubMix's output on one query: members `2i` and `2i + 1` of `ensemble` are the two
/// halves of part i (so the ensemble must hold a positive, even number of members).
/// `alpha`, `beta` are the pair test's order and bound (Eq. 2); `alpha_c`, `radius` the
/// anchoring constraint.
///
/// Guarantee: every `λᵢ` is at most a λ at which the anchoring constraint holds as
/// privmix-mixing's PMixED projection evaluates it (with its evaluator margin), so the
/// module's per-response bound applies.
pub fn submix_distribution(
    ensemble: &Ensemble,
    alpha: f64,
    beta: f64,
    alpha_c: f64,
    radius: f64,
) -> Result<SubmixDistribution, MechanismError> {
    let order = check_submix_parameters(alpha, beta)?;
    if ensemble.is_empty() || !ensemble.len().is_multiple_of(2) {
        return Err(MechanismError::InvalidParameter {
            name: "members",
            value: ensemble.len() as f64,
            reason: "SubMix needs two halves per part (members 2i and 2i+1 form part i) and at least one part",
        });
    }
    let k = ensemble.len() / 2;
    let public = ensemble.public();
    let mut pair_lambdas = Vec::with_capacity(k);
    let mut hbars = Vec::with_capacity(k * public.len());
    let mut solver_evaluations = 0;
    for part in 0..k {
        let (a, b) = (ensemble.member(2 * part), ensemble.member(2 * part + 1));
        let solution = submix_lambda(a, b, public, order, beta)?;
        solver_evaluations += solution.evaluations as usize;
        pair_lambdas.push(solution.lambda);
        hbars.extend(a.iter().zip(b).map(|(&x, &y)| 0.5 * (x + y)));
    }
    let means = Ensemble::from_probabilities(public, &hbars)?;
    let parts: Vec<usize> = (0..k).collect();
    let anchors = solve_lambdas(&means, &parts, alpha_c, radius)?;
    let anchor_lambdas: Vec<f64> = anchors.iter().map(|s| s.lambda).collect();
    solver_evaluations += anchors
        .iter()
        .map(|s| s.evaluations as usize)
        .sum::<usize>();
    let lambdas: Vec<f64> = pair_lambdas
        .iter()
        .zip(&anchor_lambdas)
        .map(|(&p, &a)| p.min(a))
        .collect();
    let mut output = vec![0.0; public.len()];
    for (part, &lambda) in lambdas.iter().enumerate() {
        let hbar = means.member(part);
        for ((o, &h), &p) in output.iter_mut().zip(hbar).zip(public) {
            *o += lambda * h + (1.0 - lambda) * p;
        }
    }
    let kf = k as f64;
    output.iter_mut().for_each(|o| *o /= kf);
    Ok(SubmixDistribution {
        output,
        lambdas,
        pair_lambdas,
        anchor_lambdas,
        solver_evaluations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ensemble(public: &[f64], members: &[f64]) -> Ensemble {
        Ensemble::from_probabilities(public, members).unwrap()
    }

    #[test]
    fn agreeing_halves_are_held_by_the_anchor_and_public_parts_cost_nothing() {
        let p0 = [0.25, 0.25, 0.5];
        let e = ensemble(
            &p0,
            &[
                0.6, 0.2, 0.2, 0.6, 0.2, 0.2, 0.25, 0.25, 0.5, 0.25, 0.25, 0.5,
            ],
        );
        let d = submix_distribution(&e, 2.0, 0.0, 8.0, 0.01).unwrap();
        // Identical halves pass the pair test at any λ; the anchor holds part 0 back.
        assert_eq!(d.pair_lambdas, vec![1.0, 1.0]);
        assert!(d.anchor_lambdas[0] > 0.0 && d.anchor_lambdas[0] < 1.0);
        assert_eq!(d.anchor_lambdas[1], 1.0);
        assert_eq!(d.lambdas[0], d.anchor_lambdas[0]);
        let sum: f64 = d.output.iter().sum();
        assert!((sum - 1.0).abs() < 1e-15);
        // A huge radius leaves the paper's pair test in charge.
        let d = submix_distribution(&e, 2.0, 0.0, 8.0, 1e6).unwrap();
        assert_eq!(d.lambdas, vec![1.0, 1.0]);
        for (x, want) in d.output.iter().zip([0.425, 0.225, 0.35]) {
            assert!((x - want).abs() < 1e-15);
        }
    }

    #[test]
    fn disagreeing_halves_lower_lambda_below_the_anchor() {
        let p0 = [0.5, 0.5];
        let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
        let d = submix_distribution(&e, 2.0, 0.01, 8.0, 10.0).unwrap();
        assert!(d.pair_lambdas[0] < d.anchor_lambdas[0]);
        assert_eq!(d.lambdas[0], d.pair_lambdas[0]);
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let p0 = [0.5, 0.5];
        let odd = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8, 0.5, 0.5]);
        assert!(matches!(
            submix_distribution(&odd, 2.0, 0.1, 8.0, 0.1),
            Err(MechanismError::InvalidParameter {
                name: "members",
                ..
            })
        ));
        let empty = ensemble(&p0, &[]);
        assert!(submix_distribution(&empty, 2.0, 0.1, 8.0, 0.1).is_err());
        let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
        for (a, b) in [
            (1.0, 0.1),
            (f64::INFINITY, 0.1),
            (f64::NAN, 0.1),
            (2.0, -0.1),
            (2.0, f64::INFINITY),
        ] {
            assert!(matches!(
                submix_distribution(&e, a, b, 8.0, 0.1),
                Err(MechanismError::InvalidParameter { .. })
            ));
        }
        assert!(submix_distribution(&e, 2.0, 0.1, 1.0, 0.1).is_err());
        assert!(submix_distribution(&e, 2.0, 0.1, 8.0, -0.1).is_err());
    }
}
