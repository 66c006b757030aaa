//! k-ary randomized response: report the true category with probability
//! `e^ε/(e^ε + k − 1)`, each other category with probability `1/(e^ε + k − 1)`.
//!
//! For k = 2 this is Warner's binary randomized response, whose RDP curve is
//! Mironov, "Rényi Differential Privacy", arXiv:1702.07476, Prop. 5 (Table II).
//! For general k the curve below is the exact Rényi divergence between the
//! output distributions of two different true categories, which is every
//! neighbouring pair of a one-record input (replace-one adjacency); the
//! algebra is in [`proof.md`](./proof.md).

use crate::amplification::log_sum_exp_up;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{
    add_down, div_up, exp_down, ln_1p_down, ln_up, mul_down, mul_up, sub_down, sub_up, u64_down,
};

/// Checks randomized response's parameters: ε finite and ≥ 0, k ≥ 2.
pub(crate) fn check_randomized_response(
    epsilon: f64,
    categories: u64,
) -> Result<(), AccountantError> {
    crate::event::check::check_non_negative("epsilon", epsilon)?;
    if categories < 2 {
        return Err(AccountantError::InvalidParameter {
            name: "categories",
            value: categories as f64,
            reason: "randomized response needs at least 2 categories",
        });
    }
    Ok(())
}

/// k-ary randomized response's RDP at one order α > 1, rounded up (see
/// [`randomized_response`]).
pub(crate) fn randomized_response_at(alpha: f64, epsilon: f64, categories: u64) -> f64 {
    if alpha == f64::INFINITY || epsilon == 0.0 {
        return epsilon;
    }
    // ln(e^{αε} + e^{−(α−1)ε} + k − 2), rounded up.
    let mut terms = vec![
        mul_up(alpha, epsilon),
        -mul_down(sub_down(alpha, 1.0), epsilon),
    ];
    if categories > 2 {
        terms.push(ln_up(u64_up_minus(categories, 2)));
    }
    let numerator = log_sum_exp_up(&terms);
    // ln(e^ε + k − 1) = ε + ln(1 + (k − 1)e^{−ε}), rounded down.
    let normaliser = add_down(
        epsilon,
        ln_1p_down(mul_down(u64_down(categories - 1), exp_down(-epsilon))),
    );
    let value = div_up(sub_up(numerator, normaliser).max(0.0), sub_down(alpha, 1.0));
    // D_α ≤ D_∞ = ε.
    value.min(epsilon)
}

/// `k − d` as a float at or above it (exact below 2^53).
fn u64_up_minus(k: u64, d: u64) -> f64 {
    privmix_renyi::round::u64_up(k - d)
}

/// k-ary randomized response with parameter ε (an ε-DP local randomizer).
///
/// Guarantee: the exact divergence between the output distributions of two
/// distinct true values, at every order α > 1 (derivation in
/// [`proof.md`](./proof.md); for k = 2 it is arXiv:1702.07476, Prop. 5 with
/// `p = e^ε/(e^ε + 1)`):
///
/// `ε(α) = [ln(e^{αε} + e^{−(α−1)ε} + k − 2) − ln(e^ε + k − 1)] / (α − 1)`,
///
/// rounded up, and capped at the pure-DP value ε. ε must be finite and ≥ 0;
/// k ≥ 2.
pub fn randomized_response(
    orders: &Orders,
    epsilon: f64,
    categories: u64,
) -> Result<RdpCurve, AccountantError> {
    check_randomized_response(epsilon, categories)?;
    RdpCurve::from_fn(orders.clone(), |a| {
        randomized_response_at(a, epsilon, categories)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_matches_mironov_prop_5_in_floats() {
        let (eps, alpha) = (1.0f64, 3.0f64);
        let p = eps.exp() / (eps.exp() + 1.0);
        let want = ((p.powf(alpha) * (1.0 - p).powf(1.0 - alpha))
            + (1.0 - p).powf(alpha) * p.powf(1.0 - alpha))
        .ln()
            / (alpha - 1.0);
        let got = randomized_response_at(alpha, eps, 2);
        assert!(
            got >= want * (1.0 - 1e-14) && got <= want * (1.0 + 1e-12),
            "{got} vs {want}"
        );
    }

    #[test]
    fn capped_by_epsilon_and_rejects_bad_parameters() {
        let orders = Orders::new(vec![2.0, 1024.0]).unwrap();
        let c = randomized_response(&orders, 2.0, 10).unwrap();
        assert!(c.epsilons()[1] <= 2.0 && c.epsilons()[0] < c.epsilons()[1]);
        assert_eq!(
            randomized_response(&orders, 0.0, 3).unwrap(),
            RdpCurve::zero(orders.clone())
        );
        assert!(randomized_response(&orders, 1.0, 1).is_err());
        assert!(randomized_response(&orders, -1.0, 2).is_err());
        assert!(randomized_response(&orders, f64::INFINITY, 2).is_err());
    }
}
