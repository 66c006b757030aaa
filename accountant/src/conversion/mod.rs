//! RDP → (ε, δ)-DP conversion and its inverse, rounded outward.
//!
//! Why each bound holds and why the computed values bound the exact ones is
//! written out in [`proof.md`](./proof.md) beside this file.
//!
//! # The bounds used, at each order α of a curve with value r = ε(α)
//!
//! 1. **Balle, Barthe, Gaboardi, Hsu & Sato, "Hypothesis Testing
//!    Interpretations and Rényi Differential Privacy", arXiv:1905.09982,
//!    Thm 21 / Canonne, Kamath & Steinke, "The Discrete Gaussian for
//!    Differential Privacy", arXiv:2004.00010, Prop. 12**: an (α, r)-RDP mechanism is (ε, δ)-DP for every ε ≥ 0 with
//!    `δ = exp((α−1)(r−ε)) / α · (1 − 1/α)^(α−1)`, i.e.
//!    `ε = r + ln(1 − 1/α) − (ln δ + ln α)/(α − 1)` and
//!    `ln δ = (α−1)(r − ε + ln(1 − 1/α)) − ln α`.
//!    It is never worse than Mironov's classic `ε = r + ln(1/δ)/(α−1)` (arXiv:1702.07476,
//!    Prop. 3): the two extra terms are both negative.
//! 2. **Bretagnolle–Huber** through the KL divergence: `TV(P, Q) ≤ √(1 − e^{−KL})`
//!    and `KL = D₁ ≤ D_α` for α > 1, so the mechanism is also
//!    `(0, √(1 − e^{−r}))`-DP. This only matters for tiny r and large δ, where it
//!    gives ε = 0 (dp_accounting uses the same bound).
//!
//! The minimum over the orders is returned together with the order achieving it.
//!
//! # Orders close to 1
//!
//! dp_accounting skips bound 1 for α ≤ 1.01 because its float evaluation is
//! inaccurate there. Here every operation is rounded outward (see
//! `privmix_renyi::round`): `α − 1` is bracketed, `ln(1 − 1/α)` is evaluated as `ln(α − 1) − ln α` for
//! α < 2 (no cancellation), so the computed value is a valid upper bound at
//! *every* order α > 1 and all orders take part in the minimum. Near α = 1 the
//! bound is simply large (the `ln(1/δ)/(α−1)` term) and never wins in practice.
//!
//! # Rounding
//!
//! The reported ε and δ are upper bounds on the exact real-number value of the
//! formulas above for the stored (already upper-bounding) RDP values: every
//! intermediate is rounded toward the side that enlarges the result, like
//! OpenDP's outward-rounded arithmetic. The only assumption is a faithful libm
//! (`ln`, `exp`, `ln_1p`, `exp_m1` within one ulp).

use crate::{AccountantError, RdpCurve};
use privmix_renyi::round::{
    add_down, add_up, div_down, div_up, exp_m1_down, exp_up, ln_1p_up, ln_down, ln_up, mul_down,
    mul_up, sub_down, sub_up,
};

/// An (ε, δ)-DP guarantee derived from an RDP curve, and the order that gave it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpsilonDelta {
    /// The privacy-loss bound ε ≥ 0 (rounded up; +∞ when no order gives a bound).
    pub epsilon: f64,
    /// The failure probability δ ∈ [0, 1].
    pub delta: f64,
    /// The Rényi order α at which the minimum over orders was achieved.
    pub order: f64,
}

impl RdpCurve {
    /// The smallest ε such that the curve implies (ε, δ)-DP, minimised over the
    /// curve's orders (Balle et al. (arXiv:1905.09982) Thm 21 / Canonne–Kamath–Steinke (arXiv:2004.00010)
    /// Prop. 12, plus the Bretagnolle–Huber bound; see the module docs), rounded up.
    ///
    /// `delta` must lie in the open interval (0, 1). An all-infinite curve gives
    /// ε = +∞ (no guarantee), reported at the smallest order.
    pub fn epsilon(&self, delta: f64) -> Result<EpsilonDelta, AccountantError> {
        check_delta(delta)?;
        let ln_delta_lo = ln_down(delta);
        // δ² ≥ 1 − e^{−r} (Bretagnolle–Huber) is checked with δ² rounded down.
        let delta_sq_lo = mul_down(delta, delta);
        let mut best = EpsilonDelta {
            epsilon: f64::INFINITY,
            delta,
            order: self.orders().as_slice()[0],
        };
        for (&alpha, &r) in self.orders().as_slice().iter().zip(self.epsilons()) {
            let eps = if r < f64::INFINITY && delta_sq_lo >= one_minus_exp_neg_up(r) {
                0.0
            } else {
                balle_epsilon_up(alpha, r, ln_delta_lo)
            };
            if eps < best.epsilon {
                best.epsilon = eps;
                best.order = alpha;
            }
        }
        Ok(best)
    }

    /// The smallest δ such that the curve implies (ε, δ)-DP, minimised over the
    /// curve's orders (the inverse of [`RdpCurve::epsilon`], same bounds), rounded up.
    ///
    /// `epsilon` must be ≥ 0 and not NaN; ε = +∞ gives δ = 0.
    pub fn delta(&self, epsilon: f64) -> Result<f64, AccountantError> {
        Ok(self.delta_with_order(epsilon)?.delta)
    }

    /// Like [`RdpCurve::delta`], also reporting the order that achieved the minimum.
    pub fn delta_with_order(&self, epsilon: f64) -> Result<EpsilonDelta, AccountantError> {
        if epsilon.is_nan() || epsilon < 0.0 {
            return Err(AccountantError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "must be a non-negative number",
            });
        }
        let first = self.orders().as_slice()[0];
        if epsilon == f64::INFINITY {
            return Ok(EpsilonDelta {
                epsilon,
                delta: 0.0,
                order: first,
            });
        }
        let mut best_log = f64::INFINITY;
        let mut order = first;
        for (&alpha, &r) in self.orders().as_slice().iter().zip(self.epsilons()) {
            let log_delta = balle_log_delta_up(alpha, r, epsilon).min(huber_log_delta_up(r));
            if log_delta < best_log {
                best_log = log_delta;
                order = alpha;
            }
        }
        Ok(EpsilonDelta {
            epsilon,
            delta: exp_up(best_log).min(1.0),
            order,
        })
    }
}

/// Checks δ ∈ (0, 1).
pub(crate) fn check_delta(delta: f64) -> Result<(), AccountantError> {
    if delta > 0.0 && delta < 1.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name: "delta",
            value: delta,
            reason: "must lie in the open interval (0, 1)",
        })
    }
}

/// Upper bound on `ln(1 − 1/α)` for α > 1.
fn ln_one_minus_inv_up(alpha: f64) -> f64 {
    if alpha < 2.0 {
        // ln(α − 1) − ln α: α − 1 is exact here (Sterbenz), no cancellation in 1 − 1/α.
        sub_up(ln_up(sub_up(alpha, 1.0)), ln_down(alpha))
    } else {
        ln_1p_up(-div_down(1.0, alpha))
    }
}

/// Upper bound on `1 − e^{−r}`.
fn one_minus_exp_neg_up(r: f64) -> f64 {
    -exp_m1_down(-r)
}

/// Upper bound on Balle et al.'s ε at one order, clamped at 0 (a negative ε
/// bound implies ε = 0). `ln_delta_lo` is a lower bound on ln δ.
fn balle_epsilon_up(alpha: f64, r: f64, ln_delta_lo: f64) -> f64 {
    if r == f64::INFINITY {
        return f64::INFINITY;
    }
    // −(ln δ + ln α), rounded up.
    let numerator = -add_down(ln_delta_lo, ln_down(alpha));
    // Divide by α − 1 rounded toward the side that enlarges the quotient.
    let tail = if numerator >= 0.0 {
        div_up(numerator, sub_down(alpha, 1.0))
    } else {
        div_up(numerator, sub_up(alpha, 1.0))
    };
    add_up(add_up(r, ln_one_minus_inv_up(alpha)), tail).max(0.0)
}

/// Upper bound on Balle et al.'s ln δ at one order for a target ε.
fn balle_log_delta_up(alpha: f64, r: f64, epsilon: f64) -> f64 {
    if r == f64::INFINITY {
        return f64::INFINITY;
    }
    let inner = add_up(sub_up(r, epsilon), ln_one_minus_inv_up(alpha));
    let scaled = if inner >= 0.0 {
        mul_up(inner, sub_up(alpha, 1.0))
    } else {
        mul_up(inner, sub_down(alpha, 1.0))
    };
    sub_up(scaled, ln_down(alpha))
}

/// Upper bound on the Bretagnolle–Huber ln δ = ½ ln(1 − e^{−r}), which holds at ε = 0
/// and therefore at every ε ≥ 0.
fn huber_log_delta_up(r: f64) -> f64 {
    if r == 0.0 {
        return f64::NEG_INFINITY;
    }
    // The factor ½ is exact in binary floating point.
    0.5 * ln_up(one_minus_exp_neg_up(r)).min(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Orders;

    fn constant(orders: Vec<f64>, r: f64) -> RdpCurve {
        let orders = Orders::new(orders).unwrap();
        let n = orders.len();
        RdpCurve::new(orders, vec![r; n]).unwrap()
    }

    #[test]
    fn single_order_matches_the_closed_form() {
        // ε = r + ln(1 − 1/α) − (ln δ + ln α)/(α − 1) at α = 2, r = 1, δ = 1e-5.
        let curve = constant(vec![2.0], 1.0);
        let got = curve.epsilon(1e-5).unwrap();
        let want = 1.0 + (0.5f64).ln() - ((1e-5f64).ln() + 2f64.ln());
        assert!(
            got.epsilon >= want && got.epsilon - want < 1e-14,
            "{got:?} vs {want}"
        );
        assert_eq!(got.order, 2.0);
    }

    #[test]
    fn zero_curve_is_free_and_infinite_curve_has_no_guarantee() {
        let zero = RdpCurve::zero(Orders::default());
        assert_eq!(zero.epsilon(1e-9).unwrap().epsilon, 0.0);
        assert_eq!(zero.delta(0.0).unwrap(), 0.0);
        let inf = constant(vec![2.0, 3.0], f64::INFINITY);
        let e = inf.epsilon(1e-5).unwrap();
        assert_eq!((e.epsilon, e.order), (f64::INFINITY, 2.0));
        assert_eq!(inf.delta(10.0).unwrap(), 1.0);
        assert_eq!(inf.delta(f64::INFINITY).unwrap(), 0.0);
    }

    #[test]
    fn tiny_rdp_and_large_delta_give_zero_epsilon_by_bretagnolle_huber() {
        // √(1 − e^{−1e-6}) ≈ 1e-3 < δ = 0.01.
        let curve = constant(vec![2.0, 10.0], 1e-6);
        assert_eq!(curve.epsilon(0.01).unwrap().epsilon, 0.0);
        let d = curve.delta(0.0).unwrap();
        assert!(d > 0.99e-3 && d < 1.01e-3, "{d}");
    }

    #[test]
    fn bad_delta_and_epsilon_are_typed_errors() {
        let curve = constant(vec![2.0], 1.0);
        for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                curve.epsilon(bad),
                Err(AccountantError::InvalidParameter { name: "delta", .. })
            ));
        }
        for bad in [-1.0, f64::NAN, f64::NEG_INFINITY] {
            assert!(matches!(
                curve.delta(bad),
                Err(AccountantError::InvalidParameter {
                    name: "epsilon",
                    ..
                })
            ));
        }
    }

    #[test]
    fn orders_near_one_are_valid_but_never_win_for_moderate_curves() {
        let orders = Orders::new(vec![1.0001, 1.005, 1.5, 8.0]).unwrap();
        let curve = RdpCurve::from_fn(orders, |a| a / 8.0).unwrap();
        let e = curve.epsilon(1e-6).unwrap();
        assert_eq!(e.order, 8.0);
        assert!(e.epsilon.is_finite());
    }
}
