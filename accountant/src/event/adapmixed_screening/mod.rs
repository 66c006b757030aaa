//! AdaPMixED's noisy screening: a Gaussian mechanism on the ensemble's
//! averaged divergence.
//!
//! Flemings, Razaviyayn, Annavaram, "Adaptively Private Next-Token Prediction
//! of Large Language Models", arXiv:2410.02016, §4, Thm 4.1 (proof in App. D,
//! Thm D.1).

use crate::amplification::check_sigma;
use crate::event::check::check_non_negative;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{div_up, mul_down, mul_up, u64_down};

/// AdaPMixED's noisy screening (arXiv:2410.02016, §4, Thm 4.1 / D.1): Gaussian noise
/// σ on the average of N members each mixed with weight λ, whose L2
/// sensitivity is `√2·λ/N`.
///
/// Guarantee: `ε(α) = α·(√2λ/N)²/(2σ²) = (λ/(N·σ))²·α`, rounded up. λ ≥ 0,
/// σ > 0, N ≥ 1.
pub fn adapmixed_screening(
    orders: &Orders,
    lambda: f64,
    members: u64,
    sigma: f64,
) -> Result<RdpCurve, AccountantError> {
    check_non_negative("lambda", lambda)?;
    check_sigma(sigma)?;
    if members == 0 {
        return Err(AccountantError::InvalidParameter {
            name: "members",
            value: 0.0,
            reason: "the ensemble must have at least one member",
        });
    }
    RdpCurve::from_fn(orders.clone(), |a| screening_at(a, lambda, members, sigma))
}

/// `(λ/(N·σ))²·α` rounded up (see [`adapmixed_screening`]).
pub(crate) fn screening_at(alpha: f64, lambda: f64, members: u64, sigma: f64) -> f64 {
    let n_sigma = mul_down(u64_down(members), sigma);
    let ratio2 = mul_up(lambda, lambda);
    let denom = mul_down(n_sigma, n_sigma);
    div_up(mul_up(ratio2, alpha), denom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::gaussian::gaussian;

    fn orders() -> Orders {
        Orders::new(vec![1.5, 2.0, 18.0, 64.0]).unwrap()
    }

    #[test]
    fn screening_matches_the_gaussian_with_sqrt2_lambda_over_n() {
        let (lambda, n, sigma) = (1e-4, 100u64, 1e-2);
        let s = adapmixed_screening(&orders(), lambda, n, sigma).unwrap();
        let g = gaussian(&orders(), sigma, 2f64.sqrt() * lambda / n as f64).unwrap();
        for (a, b) in s.epsilons().iter().zip(g.epsilons()) {
            assert!((a - b).abs() <= 1e-12 * b, "{a} vs {b}");
        }
        // (λ/(Nσ))²·α at α = 18: (1e-4/1)²·18 = 1.8e-7.
        assert!((s.epsilons()[2] - 1.8e-7).abs() < 1e-20);
        assert!(adapmixed_screening(&orders(), 1e-4, 0, 1e-2).is_err());
    }
}
