//! Privacy amplification by subsampling: Poisson sampling (`poisson/`) and
//! sampling without replacement (`without_replacement/`), and the machinery
//! they share: parameter checks, log-sum-exp rounded up, bounds on a curve at
//! integer orders, and the interpolation to fractional orders.
//!
//! The steps privmix adds to the published theorems (reading a curve at
//! orders it lacks, convex interpolation, the cap by the unsampled curve, the
//! non-negative form of the Poisson moment, signed series in interval
//! arithmetic) are proved in [`proof.md`](./proof.md) beside this file.

pub(crate) mod poisson;
pub(crate) mod without_replacement;

use std::collections::BTreeMap;

use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{add_up, div_up, exp_up, ln_up, mul_up, sub_down, sub_up};

/// Orders above this are not amplified (cost grows linearly with the order);
/// they keep the unamplified value, which is always a valid bound.
pub(crate) const MAX_AMPLIFIED_ORDER: f64 = 16_384.0;

/// Checks a sampling probability q ∈ [0, 1].
pub(crate) fn check_q(q: f64) -> Result<(), AccountantError> {
    if (0.0..=1.0).contains(&q) {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name: "q",
            value: q,
            reason: "a sampling probability must lie in [0, 1]",
        })
    }
}

/// Checks a noise multiplier σ: finite and > 0.
pub(crate) fn check_sigma(sigma: f64) -> Result<(), AccountantError> {
    if sigma.is_finite() && sigma > 0.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name: "sigma",
            value: sigma,
            reason: "a noise multiplier must be finite and > 0",
        })
    }
}

/// Upper bound on `ln Σ exp(tᵢ)` given upper bounds tᵢ (rounded up throughout).
pub(crate) fn log_sum_exp_up(terms: &[f64]) -> f64 {
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max.is_infinite() {
        return max;
    }
    let sum = terms
        .iter()
        .fold(0.0, |acc, &t| add_up(acc, exp_up(sub_up(t, max))));
    add_up(max, ln_up(sum))
}

/// Whether an order is an integer the tight integer-order bounds can use.
pub(crate) fn as_integer_order(alpha: f64) -> Option<u32> {
    (alpha.fract() == 0.0 && alpha <= MAX_AMPLIFIED_ORDER).then_some(alpha as u32)
}

/// Upper bounds on ε(j) at integer orders j, read off a curve.
///
/// Rényi divergence is non-decreasing in its order (van Erven & Harremoës
/// arXiv:1206.2459, Thm 3), so a mechanism that is (α', r)-RDP is (j, r)-RDP for every
/// j ≤ α'. The bound used at j is therefore the smallest value the curve
/// holds at any order ≥ j; +∞ when the curve has no order ≥ j.
pub(crate) struct IntegerBounds {
    orders: Vec<f64>,
    suffix_min: Vec<f64>,
}

impl IntegerBounds {
    /// Precomputes suffix minima of the curve.
    pub(crate) fn new(curve: &RdpCurve) -> Self {
        let orders = curve.orders().as_slice().to_vec();
        let mut suffix_min = curve.epsilons().to_vec();
        for i in (0..suffix_min.len().saturating_sub(1)).rev() {
            suffix_min[i] = suffix_min[i].min(suffix_min[i + 1]);
        }
        Self { orders, suffix_min }
    }

    /// An upper bound on ε(j).
    pub(crate) fn at(&self, j: u32) -> f64 {
        let j = f64::from(j);
        let i = self.orders.partition_point(|&a| a < j);
        self.suffix_min.get(i).copied().unwrap_or(f64::INFINITY)
    }

    /// An upper bound on (j − 1)·ε(j).
    pub(crate) fn cgf_at(&self, j: u32) -> f64 {
        let e = self.at(j);
        if j <= 1 {
            0.0
        } else {
            mul_up(f64::from(j - 1), e)
        }
    }
}

/// Builds an amplified curve from bounds on the log-moment `K(n) = (n − 1)·ε'(n)`
/// at integer orders n ≥ 2.
///
/// * Integer order n: `ε'(n) = K(n)/(n − 1)`.
/// * Fractional order α between a = ⌊α⌋ and a + 1: `K` is convex in the order
///   (α ↦ ln E[(P/Q)^α] is convex by Hölder's inequality, for each pair of
///   distributions, and a supremum of convex functions is convex; Wang, Balle &
///   Kasiviswanathan, arXiv:1808.00087, Cor. 10), with K(1) = 0, so
///   `ε'(α) ≤ ((a+1−α)·K(a) + (α−a)·K(a+1))/(α − 1)`.
/// * Every order: the result is also capped by the unamplified value
///   `unamplified[i]` — subsampling never hurts (quasi-convexity of Rényi
///   divergence), and that is the value kept above [`MAX_AMPLIFIED_ORDER`].
pub(crate) fn amplified_curve(
    orders: &Orders,
    unamplified: &[f64],
    mut ln_moment: impl FnMut(u32) -> f64,
) -> Result<RdpCurve, AccountantError> {
    let mut cache: BTreeMap<u32, f64> = BTreeMap::new();
    let mut k_at = |n: u32| -> f64 {
        if n <= 1 {
            return 0.0;
        }
        *cache.entry(n).or_insert_with(|| ln_moment(n).max(0.0))
    };
    let mut values = Vec::with_capacity(orders.len());
    for (&alpha, &fallback) in orders.as_slice().iter().zip(unamplified) {
        let amplified = if alpha > MAX_AMPLIFIED_ORDER {
            f64::INFINITY
        } else if let Some(n) = as_integer_order(alpha) {
            div_up(k_at(n), f64::from(n - 1))
        } else {
            let a = alpha.floor();
            let n = a as u32;
            let t = alpha - a; // exact: both on α's grid
            let k_lo = k_at(n);
            let k_hi = k_at(n + 1);
            if k_hi == f64::INFINITY {
                f64::INFINITY
            } else {
                let weighted = add_up(mul_up(1.0 - t, k_lo), mul_up(t, k_hi));
                div_up(weighted, sub_down(alpha, 1.0))
            }
        };
        values.push(amplified.max(0.0).min(fallback));
    }
    RdpCurve::new(orders.clone(), values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_sum_exp_bounds_the_exact_value() {
        let got = log_sum_exp_up(&[0.0, 0.0]);
        assert!(got >= std::f64::consts::LN_2 && got - std::f64::consts::LN_2 < 1e-15);
        assert_eq!(log_sum_exp_up(&[f64::NEG_INFINITY]), f64::NEG_INFINITY);
        assert_eq!(log_sum_exp_up(&[1.0, f64::INFINITY]), f64::INFINITY);
        let big = log_sum_exp_up(&[1000.0, 1000.0]);
        assert!(big > 1000.69 && big < 1000.7);
    }

    #[test]
    fn integer_bounds_use_the_next_order_up() {
        let orders = Orders::new(vec![1.5, 3.0, 4.5, 10.0]).unwrap();
        let curve = RdpCurve::new(orders, vec![0.1, 0.3, 0.2, 1.0]).unwrap();
        let b = IntegerBounds::new(&curve);
        assert_eq!(b.at(2), 0.2); // min over orders ≥ 2: {0.3, 0.2, 1.0}
        assert_eq!(b.at(4), 0.2);
        assert_eq!(b.at(5), 1.0);
        assert_eq!(b.at(11), f64::INFINITY);
        assert_eq!(b.cgf_at(5), 4.0);
    }

    #[test]
    fn bad_q_and_sigma_are_rejected() {
        for q in [-0.1, 1.1, f64::NAN] {
            assert!(check_q(q).is_err());
        }
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(check_sigma(s).is_err());
        }
        assert!(check_q(0.0).is_ok() && check_q(1.0).is_ok() && check_sigma(1e-9).is_ok());
    }
}
