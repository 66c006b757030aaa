//! The law of the token a prediction baseline samples, for scoring perplexity
//! without drawing its noise (SubMix, arXiv:2201.00971, App. B.3–B.4).
//!
//! Neither baseline releases a distribution: S&A-Laplace releases a noisy
//! vector (the token is drawn from it clipped at 0 and renormalised) and GNMax
//! a noisy argmax. Perplexity is read from the probability `q_x` that the
//! released token is the true one `x`.

use privmix_mechanisms::baselines::{Gnmax, SubsampleAggregateLaplace};
use privmix_mechanisms::{Ensemble, MechanismError};
use statrs::function::erf::erfc;

/// S&A-Laplace at scale b: `q_x ≈ E[(a_x + L)⁺] / Σ_z E[(a_z + L)⁺]`, with a the
/// members' average and L ~ Laplace(b), where `E[(a + L)⁺] = a + (b/2)·e^{−a/b}`
/// for a ≥ 0. This replaces the expectation of the ratio by the ratio of the
/// expectations: the denominator is a sum of V independent terms, whose
/// relative spread is O(1/√V) (a fraction of a percent for V in the tens of
/// thousands). The second value says whether x is the mode of that law.
pub fn sa_laplace(
    ensemble: &Ensemble,
    scale: f64,
    x: usize,
) -> Result<(f64, bool), MechanismError> {
    let avg = SubsampleAggregateLaplace::average(ensemble)?;
    let positive = |a: f64| a.max(0.0) + 0.5 * scale * (-a.max(0.0) / scale).exp();
    let weights: Vec<f64> = avg.iter().map(|&a| positive(a)).collect();
    let total: f64 = weights.iter().sum();
    let mode = weights
        .iter()
        .enumerate()
        .fold(0, |best, (i, &w)| if w > weights[best] { i } else { best });
    Ok((weights[x] / total, mode == x))
}

/// GNMax at σ: the SubMix paper's upper bound on `q_x` (App. B.4), which gives
/// a lower bound on perplexity (in the baseline's favour):
/// `q_x ≤ min(1/|{z : n_z ≥ n_x}|, P[N(n_x − n_{z*}, 2σ²) ≥ 0])` with n the vote
/// histogram and z* the most voted token other than x. The second value says
/// whether x wins the noiseless vote (the mode of the noisy argmax's law).
pub fn gnmax_bound(
    ensemble: &Ensemble,
    sigma: f64,
    x: usize,
) -> Result<(f64, bool), MechanismError> {
    let votes = Gnmax::votes(ensemble)?;
    let nx = votes[x];
    let at_least = votes.iter().filter(|&&n| n >= nx).count();
    let runner_up = votes
        .iter()
        .enumerate()
        .filter(|&(z, _)| z != x)
        .map(|(_, &n)| n)
        .fold(f64::NEG_INFINITY, f64::max);
    // P[N(μ, 2σ²) ≥ 0] = Φ(μ/(√2σ)) = erfc(−μ/(2σ))/2.
    let tail = 0.5 * erfc(-(nx - runner_up) / (2.0 * sigma));
    let first = votes
        .iter()
        .enumerate()
        .fold(0, |best, (i, &n)| if n > votes[best] { i } else { best });
    Ok(((1.0 / at_least as f64).min(tail), first == x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_mechanisms::Rows;

    fn ensemble(public: &[f64], members: &[f64]) -> Ensemble {
        Ensemble::new(Rows::ProbF64(public), Rows::ProbF64(members)).unwrap()
    }

    #[test]
    fn sa_laplace_tends_to_the_average_and_to_uniform() {
        let e = ensemble(&[0.25; 4], &[0.7, 0.1, 0.1, 0.1, 0.5, 0.3, 0.1, 0.1]);
        // Tiny noise: the law is the average itself.
        let (q, mode) = sa_laplace(&e, 1e-9, 0).unwrap();
        assert!((q - 0.6).abs() < 1e-6 && mode);
        // Huge noise: uniform.
        let (q, _) = sa_laplace(&e, 1e9, 1).unwrap();
        assert!((q - 0.25).abs() < 1e-6);
    }

    #[test]
    fn gnmax_bound_matches_its_closed_form() {
        // Votes: token 0 twice, token 1 once.
        let e = ensemble(
            &[0.25; 4],
            &[0.7, 0.1, 0.1, 0.1, 0.6, 0.2, 0.1, 0.1, 0.1, 0.6, 0.2, 0.1],
        );
        // x = 0 leads by 1: min(1, Φ(1/(√2σ))) at σ = 1: Φ(0.7071…) = 0.760249938.
        let (q, mode) = gnmax_bound(&e, 1.0, 0).unwrap();
        assert!((q - 0.760_249_938).abs() < 1e-6 && mode);
        // x = 2 has no vote: 3 tokens have ≥ 0 votes… all 4 do: ≤ 1/4.
        let (q, mode) = gnmax_bound(&e, 100.0, 2).unwrap();
        assert!(q <= 0.25 && !mode);
    }
}
