//! The Laplace mechanism: noise Lap(b) added to a query of L1 sensitivity 1.
//!
//! Mironov, "Rényi Differential Privacy", arXiv:1702.07476, Prop. 6 (Table II)
//! gives the exact Rényi divergence between two Laplace distributions of scale
//! b whose centres are 1 apart, which is the mechanism's RDP curve.

use crate::amplification::log_sum_exp_up;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{add_up, div_down, div_up, ln_down, ln_up, sub_down, sub_up};

/// Checks a Laplace scale: finite and > 0.
pub(crate) fn check_scale(scale: f64) -> Result<(), AccountantError> {
    if scale.is_finite() && scale > 0.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name: "scale",
            value: scale,
            reason: "a Laplace scale must be finite and > 0",
        })
    }
}

/// The Laplace mechanism's RDP at one order α > 1, rounded up (see [`laplace`]).
pub(crate) fn laplace_at(alpha: f64, scale: f64) -> f64 {
    let pure = div_up(1.0, scale);
    if alpha == f64::INFINITY {
        return pure;
    }
    // ln(2α − 1) rounded down: 2α is exact, the subtraction rounds down.
    let ln_denominator = ln_down(sub_down(2.0 * alpha, 1.0));
    // ln(α/(2α−1)) + (α−1)/b, and ln((α−1)/(2α−1)) − α/b, each rounded up.
    let first = add_up(
        sub_up(ln_up(alpha), ln_denominator),
        div_up(sub_up(alpha, 1.0), scale),
    );
    let second = sub_up(
        sub_up(ln_up(sub_up(alpha, 1.0)), ln_denominator),
        div_down(alpha, scale),
    );
    let value = div_up(
        log_sum_exp_up(&[first, second]).max(0.0),
        sub_down(alpha, 1.0),
    );
    // D_α ≤ D_∞ = 1/b (the divergence is non-decreasing in the order).
    value.min(pure)
}

/// The Laplace mechanism with scale b on a query of L1 sensitivity 1.
///
/// Guarantee (Mironov, arXiv:1702.07476, Prop. 6), at every order α > 1:
///
/// `ε(α) = ln( α/(2α−1)·e^{(α−1)/b} + (α−1)/(2α−1)·e^{−α/b} ) / (α − 1)`,
///
/// the exact divergence, evaluated in log space with every step rounded up,
/// and capped at the pure-DP value `1/b` (its limit as α → ∞). A query of
/// sensitivity Δ with scale s is this event with `b = s/Δ`. b must be finite
/// and > 0.
pub fn laplace(orders: &Orders, scale: f64) -> Result<RdpCurve, AccountantError> {
    check_scale(scale)?;
    RdpCurve::from_fn(orders.clone(), |a| laplace_at(a, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_scale_reaches_the_pure_bound_and_large_scale_is_quadratic() {
        let orders = Orders::new(vec![1.5, 2.0, 32.0, 1024.0]).unwrap();
        let c = laplace(&orders, 0.01).unwrap();
        // At α = 1024 the curve is within ln(2)/1023 of 1/b = 100.
        assert!(c.epsilons()[3] <= 100.0 && c.epsilons()[3] > 99.0);
        // For large b, ε(α) ≈ α/(2b²) to leading order.
        let c = laplace(&orders, 1000.0).unwrap();
        let approx = 2.0 / (2.0 * 1e6);
        assert!((c.epsilons()[1] - approx).abs() < 1e-3 * approx);
        // Non-decreasing in the order.
        assert!(c.epsilons().windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn bad_scales_are_rejected() {
        let orders = Orders::integers(4).unwrap();
        for b in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                laplace(&orders, b),
                Err(AccountantError::InvalidParameter { name: "scale", .. })
            ));
        }
    }
}
