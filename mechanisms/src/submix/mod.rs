//! SubMix (Ginart, van der Maaten, Zou, Guo, "SubMix: Practical Private Prediction for
//! Large-Scale Language Models", arXiv:2201.00971, §3, Alg. 1–2), with the change that
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
//! # Guarantee
//! Privacy unit: a user, whose data lies in one half of one part; adding, removing or
//! replacing the user changes that part's models arbitrarily, k public and fixed
//! (*changed-part* adjacency). Each response is `(α, ε(α))`-RDP with PMixED's bound for
//! k members without subsampling plus the f64 averaging slack
//! ([`crate::bounds::pmixed_charge_at`]), charged before
//! the token is released; there are no per-part budgets and no STOP.
//!
//! The paper's Alg. 2 (`λ* = mean(λᵢ^pair)`, a data-dependent charge, STOP when a part's
//! budget runs out; Prop. 3.1) has no data-independent bound at all and its STOP time
//! leaks (`tests/integration/submix_paper_protocol.rs`); anchoring each part to p₀ within radius b
//! is what makes the release provable. Both arguments are written out in `proof.md`
//! beside this file (`src/submix/proof.md`).

pub(crate) mod protocol;

use privmix_mixing::submix_lambda;
use privmix_renyi::Order;

use crate::pmixed::averaging::average_in_place;
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
    average_in_place(&mut output, k);
    Ok(SubmixDistribution {
        output,
        lambdas,
        pair_lambdas,
        anchor_lambdas,
        solver_evaluations,
    })
}

#[cfg(test)]
mod tests;
