//! SubMix (Ginart et al. 2022, "Submix: Practical private prediction for large-scale
//! language models", submix.txt §3, Alg. 1–2, Prop. 3.1, App. C).
//!
//! The private corpus is partitioned into k parts Πᵢ, each split into two halves πᵢ, π'ᵢ
//! with one fine-tuned model per half. Per query, for each part:
//!
//! * `λᵢ` = the largest λ ∈ [0, 1] with `D_α(λh_{πᵢ} + (1−λ)p₀ ‖ λh_{π'ᵢ} + (1−λ)p₀) ≤ β`
//!   (Eq. 2; [`privmix_mixing::submix_lambda`]),
//! * `h̄ᵢ = (h_{πᵢ} + h_{π'ᵢ})/2` (Alg. 2 line 7: the average of the two halves),
//!
//! then `λ* = mean(λᵢ)`, `h̄ = mean(h̄ᵢ)` and the output is `h = λ*·h̄ + (1−λ*)·p₀`
//! (lines 10–12). The neighbour of the corpus under partition-level adjacency is the corpus
//! without one part: its output is the same construction over the remaining k − 1 parts,
//! `h₋ᵢ = λ*₋ᵢ·h̄₋ᵢ + (1−λ*₋ᵢ)·p₀` with both means over the remaining parts (lines 14–17;
//! the reference code divides by the vocabulary size where it means the number of parts),
//! and `h₋ᵢ = p₀` when k = 1 (no part left: the public model h_∅).
//!
//! [`submix_distribution`] computes `h`, and each `h₋ᵢ` by literally running that
//! construction on the remaining parts (O(k²·V)), so `h₋ᵢ` is bitwise the distribution the
//! mechanism would sample from on the neighbouring corpus — not an approximation of it.

use privmix_accountant::{Orders, RdpCurve};
use privmix_mixing::submix_lambda;
use privmix_renyi::{Direction, Order, batched_divergence};

use crate::{Ensemble, MechanismError};

/// The output of SubMix on one query before any budget decision, with everything the
/// charge is computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmixDistribution {
    /// `h = λ*·h̄ + (1−λ*)·p₀`: the distribution a response is sampled from.
    pub output: Vec<f64>,
    /// `λᵢ` of every part, in part order.
    pub lambdas: Vec<f64>,
    /// `λ* = mean(λᵢ)` (0 when there are no parts).
    pub lambda_star: f64,
    /// `h₋ᵢ` for every part i, row-major (k rows of V): the output on the corpus
    /// without part i.
    pub leave_one_out: Vec<f64>,
    /// Divergence evaluations the λ solvers spent.
    pub solver_evaluations: usize,
}

impl SubmixDistribution {
    /// Number of parts k.
    pub fn parts(&self) -> usize {
        self.lambdas.len()
    }

    /// `h₋ᵢ`, the output without part i.
    pub fn without_part(&self, part: usize) -> &[f64] {
        let v = self.output.len();
        &self.leave_one_out[part * v..(part + 1) * v]
    }

    /// `Dsym_α(h, h₋ᵢ)` for every part i at `alpha`, each rounded up by one ulp
    /// (`f64::next_up`; +∞ stays +∞), in part order.
    ///
    /// This is the privacy loss of one response for the users of part i (Alg. 2 line
    /// 18): the response is a sample from `h` on the corpus and from `h₋ᵢ` on its
    /// neighbour without part i, so the RDP of that response at order α between the two
    /// is exactly this divergence.
    pub fn part_losses(&self, alpha: Order) -> Result<Vec<f64>, MechanismError> {
        if self.parts() == 0 {
            return Ok(Vec::new());
        }
        let d = batched_divergence(
            &self.leave_one_out,
            &self.output,
            alpha,
            Direction::Symmetric,
        )?;
        Ok(d.into_iter().map(round_up).collect())
    }

    /// Per part, the curve `α ↦ Dsym_α(h, h₋ᵢ)` (rounded up) over `orders`.
    pub fn part_curves(&self, orders: &Orders) -> Result<Vec<RdpCurve>, MechanismError> {
        let k = self.parts();
        let mut values = vec![Vec::with_capacity(orders.len()); k];
        for &a in orders.as_slice() {
            for (part, loss) in self.part_losses(Order::new(a)?)?.into_iter().enumerate() {
                values[part].push(loss);
            }
        }
        values
            .into_iter()
            .map(|v| RdpCurve::new(orders.clone(), v).map_err(MechanismError::from))
            .collect()
    }

    /// The charge of one response as one curve: at each order, the maximum over parts of
    /// `Dsym_α(h, h₋ᵢ)` (rounded up).
    ///
    /// Why this is a valid bound for a user in any one part: under partition-level
    /// adjacency (Def. 2.4) the neighbours of the corpus are exactly the k corpora
    /// without one part, and the user's part is one of them; the maximum over i bounds
    /// each of them, at every order separately. It is *data-dependent* (computed from
    /// the models' predictions), so the value itself is sensitive — the papers' caveat —
    /// and it is reported as such.
    pub fn charge_curve(&self, orders: &Orders) -> Result<RdpCurve, MechanismError> {
        let mut max = vec![0.0f64; orders.len()];
        for curve in self.part_curves(orders)? {
            for (m, &e) in max.iter_mut().zip(curve.epsilons()) {
                *m = m.max(e);
            }
        }
        Ok(RdpCurve::new(orders.clone(), max)?)
    }
}

/// Rounds a computed divergence up by one ulp (outward), keeping +∞.
fn round_up(x: f64) -> f64 {
    if x == f64::INFINITY { x } else { x.next_up() }
}

/// Checks SubMix's parameters: a finite order α > 1 and a finite β ≥ 0.
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

/// `λ*·mean(h̄) + (1−λ*)·p₀` over the parts listed in `parts` (in that order); `p₀` when
/// the list is empty. Means are sequential sums divided by the count, so the result for a
/// sub-list is bitwise what the mechanism computes on a corpus holding only those parts.
fn combine(public: &[f64], hbars: &[Vec<f64>], lambdas: &[f64], parts: &[usize]) -> Vec<f64> {
    if parts.is_empty() {
        return public.to_vec();
    }
    let count = parts.len() as f64;
    let lambda_star = parts.iter().map(|&j| lambdas[j]).sum::<f64>() / count;
    let mut mean = vec![0.0; public.len()];
    for &j in parts {
        for (m, &h) in mean.iter_mut().zip(&hbars[j]) {
            *m += h;
        }
    }
    mean.iter()
        .zip(public)
        .map(|(&m, &p)| lambda_star * (m / count) + (1.0 - lambda_star) * p)
        .collect()
}

/// SubMix's output on one query: members `2i` and `2i + 1` of `ensemble` are the two
/// halves of part i (so the ensemble must hold an even number of members; zero members
/// give the public model). `alpha` is the order of Eq. 2 and `beta` its bound.
///
/// Guarantee: `output` and every `leave_one_out` row are the distributions SubMix samples
/// from on the corpus and on each neighbour without one part (see the module docs), and
/// each `λᵢ` satisfies Eq. 2 as evaluated by [`privmix_mixing::SubmixPairProjection`].
pub fn submix_distribution(
    ensemble: &Ensemble,
    alpha: f64,
    beta: f64,
) -> Result<SubmixDistribution, MechanismError> {
    let order = check_submix_parameters(alpha, beta)?;
    if !ensemble.len().is_multiple_of(2) {
        return Err(MechanismError::InvalidParameter {
            name: "members",
            value: ensemble.len() as f64,
            reason: "SubMix needs two halves per part: members 2i and 2i+1 form part i",
        });
    }
    let k = ensemble.len() / 2;
    let public = ensemble.public();
    let mut lambdas = Vec::with_capacity(k);
    let mut hbars = Vec::with_capacity(k);
    let mut solver_evaluations = 0;
    for part in 0..k {
        let (a, b) = (ensemble.member(2 * part), ensemble.member(2 * part + 1));
        let solution = submix_lambda(a, b, public, order, beta)?;
        solver_evaluations += solution.evaluations as usize;
        lambdas.push(solution.lambda);
        hbars.push(
            a.iter()
                .zip(b)
                .map(|(&x, &y)| 0.5 * (x + y))
                .collect::<Vec<f64>>(),
        );
    }
    let all: Vec<usize> = (0..k).collect();
    let output = combine(public, &hbars, &lambdas, &all);
    let mut leave_one_out = Vec::with_capacity(k * public.len());
    for part in 0..k {
        let rest: Vec<usize> = (0..k).filter(|&j| j != part).collect();
        leave_one_out.extend(combine(public, &hbars, &lambdas, &rest));
    }
    let lambda_star = if k == 0 {
        0.0
    } else {
        lambdas.iter().sum::<f64>() / k as f64
    };
    Ok(SubmixDistribution {
        output,
        lambdas,
        lambda_star,
        leave_one_out,
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
    fn identical_halves_give_lambda_one_and_output_the_mean_of_parts() {
        let p0 = [0.25, 0.25, 0.5];
        let e = ensemble(
            &p0,
            &[0.6, 0.2, 0.2, 0.6, 0.2, 0.2, 0.1, 0.1, 0.8, 0.1, 0.1, 0.8],
        );
        let d = submix_distribution(&e, 2.0, 0.0).unwrap();
        assert_eq!(d.lambdas, vec![1.0, 1.0]);
        assert_eq!(d.lambda_star, 1.0);
        for (x, want) in d.output.iter().zip([0.35, 0.15, 0.5]) {
            assert!((x - want).abs() < 1e-15);
        }
        // Without part 0 the output is part 1's h̄ (λ* = 1).
        assert_eq!(d.without_part(0), &[0.1, 0.1, 0.8]);
    }

    #[test]
    fn one_part_neighbour_is_the_public_model() {
        let p0 = [0.5, 0.5];
        let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
        let d = submix_distribution(&e, 2.0, 0.1).unwrap();
        assert_eq!(d.without_part(0), &p0);
        assert!(d.lambdas[0] > 0.0 && d.lambdas[0] < 1.0);
        let empty = ensemble(&p0, &[]);
        let d0 = submix_distribution(&empty, 2.0, 0.1).unwrap();
        assert_eq!((d0.output.as_slice(), d0.lambda_star), (p0.as_slice(), 0.0));
        assert!(d0.part_losses(Order::new(2.0).unwrap()).unwrap().is_empty());
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let p0 = [0.5, 0.5];
        let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8, 0.5, 0.5]);
        assert!(matches!(
            submix_distribution(&e, 2.0, 0.1),
            Err(MechanismError::InvalidParameter {
                name: "members",
                ..
            })
        ));
        let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
        for (a, b) in [
            (1.0, 0.1),
            (f64::INFINITY, 0.1),
            (f64::NAN, 0.1),
            (2.0, -0.1),
            (2.0, f64::INFINITY),
        ] {
            assert!(matches!(
                submix_distribution(&e, a, b),
                Err(MechanismError::InvalidParameter { .. })
            ));
        }
    }
}
