//! The Gaussian mechanism: noise N(0, σ²) added to a query of bounded L2
//! sensitivity.
//!
//! Mironov, "Rényi Differential Privacy", arXiv:1702.07476, Prop. 7 gives the
//! exact Rényi divergence between two Gaussians with the same variance.

use crate::amplification::check_sigma;
use crate::event::check::check_non_negative;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{div_up, mul_down, mul_up};

/// The Gaussian mechanism: noise N(0, σ²) added to a query of L2 sensitivity Δ.
///
/// Guarantee: `ε(α) = α·Δ²/(2σ²)` at every order (Mironov, arXiv:1702.07476, Prop. 7), rounded up.
/// σ must be finite and > 0, Δ finite and ≥ 0.
pub fn gaussian(
    orders: &Orders,
    sigma: f64,
    sensitivity: f64,
) -> Result<RdpCurve, AccountantError> {
    check_sigma(sigma)?;
    check_non_negative("sensitivity", sensitivity)?;
    let sens2 = mul_up(sensitivity, sensitivity);
    let two_var = mul_down(2.0, mul_down(sigma, sigma));
    RdpCurve::from_fn(orders.clone(), |a| div_up(mul_up(a, sens2), two_var))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orders() -> Orders {
        Orders::new(vec![1.5, 2.0, 18.0, 64.0]).unwrap()
    }

    #[test]
    fn gaussian_is_alpha_over_two_sigma_squared() {
        let c = gaussian(&orders(), 2.0, 1.0).unwrap();
        assert_eq!(c.epsilons(), &[1.5 / 8.0, 0.25, 18.0 / 8.0, 8.0]);
        assert!(gaussian(&orders(), 0.0, 1.0).is_err());
        assert!(gaussian(&orders(), 1.0, -1.0).is_err());
        assert!(gaussian(&orders(), f64::NAN, 1.0).is_err());
    }
}
