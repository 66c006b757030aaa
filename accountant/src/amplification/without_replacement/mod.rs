//! Privacy amplification by sampling without replacement (replace-one
//! adjacency): a uniformly random subset of m of the n records, q = m/n.
//!
//! Wang, Balle & Kasiviswanathan (arXiv:1808.00087), "Subsampled Rényi Differential Privacy
//! and Analytical Moments Accountant" (AISTATS; arXiv:1808.00087):
//! Thm 9 for any mechanism, Thm 27 for the Gaussian, Cor. 10 for the
//! interpolation to fractional orders.

use crate::amplification::poisson::gaussian_rdp_up;
use crate::amplification::{
    IntegerBounds, MAX_AMPLIFIED_ORDER, amplified_curve, check_q, check_sigma, log_sum_exp_up,
};
use crate::interval::Interval;
use crate::special::{ln_binomials, ln_binomials_up};
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{add_up, exp_m1_up, ln_up, mul_up};

/// Orders up to this use Thm 27's forward differences for the Gaussian (as
/// dp_accounting does); above it, the Thm 9 terms, which Thm 27 refines.
const MAX_FORWARD_DIFFERENCE_ORDER: u32 = 256;

/// `ln 2` rounded up.
fn ln2_up() -> f64 {
    ln_up(2.0)
}

/// Upper bound on the Thm 9 log-moment `(α−1)ε'(α)` at integer α ≥ 2, given
/// upper bounds `eps(j)` on ε(j) (ε(∞) unknown, i.e. +∞):
///
/// `ln(1 + q²C(α,2)·min{4(e^{ε(2)} − 1), 2e^{ε(2)}} + Σ_{j=3}^{α} q^j C(α,j)·2e^{(j−1)ε(j)})`.
///
/// `refine(j)` may return a tighter upper bound on the ln of the j-th term's
/// factor (Thm 27), or `None`.
fn ln_moment_up(
    alpha: u32,
    q: f64,
    eps: &dyn Fn(u32) -> f64,
    refine: &dyn Fn(u32) -> Option<f64>,
) -> f64 {
    let ln_binom = ln_binomials_up(alpha);
    let ln_q = ln_up(q);
    let mut terms = Vec::with_capacity(alpha as usize);
    terms.push(0.0);
    let e2 = eps(2);
    if e2 == f64::INFINITY {
        return f64::INFINITY;
    }
    let second = add_up(ln_up(4.0), ln_up(exp_m1_up(e2))).min(add_up(ln2_up(), e2));
    terms.push(add_up(add_up(mul_up(2.0, ln_q), ln_binom[2]), second));
    for j in 3..=alpha {
        let e = eps(j);
        if e == f64::INFINITY {
            return f64::INFINITY;
        }
        let generic = add_up(ln2_up(), mul_up(f64::from(j - 1), e));
        let factor = refine(j).map_or(generic, |r| r.min(generic));
        terms.push(add_up(
            add_up(mul_up(f64::from(j), ln_q), ln_binom[j as usize]),
            factor,
        ));
    }
    log_sum_exp_up(&terms)
}

impl RdpCurve {
    /// The RDP curve of the mechanism run on a sample of m out of n records
    /// drawn without replacement, q = m/n, for replace-one adjacency (the base
    /// curve must hold for replace-one adjacency too).
    ///
    /// Guarantee, at each order α:
    /// * integer α ≥ 2: Wang, Balle & Kasiviswanathan (arXiv:1808.00087), Thm 9, with the
    ///   unknown ε(∞) taken as +∞ (so the `min{2, (e^{ε(∞)}−1)^j}` factors are 2);
    ///   ε(j) at integers the curve lacks are bounded by the next order above
    ///   (monotonicity of Rényi divergence in the order);
    /// * fractional α: convex interpolation of `(α−1)ε'(α)` between ⌊α⌋ and
    ///   ⌈α⌉ (WBK (arXiv:1808.00087), Cor. 10);
    /// * never above the unamplified value.
    ///
    /// Rounded up throughout. `q` in [0, 1]; q = 0 gives zero, q = 1 the curve.
    pub fn sampled_without_replacement(&self, q: f64) -> Result<RdpCurve, AccountantError> {
        check_q(q)?;
        if q == 0.0 {
            return Ok(RdpCurve::zero(self.orders().clone()));
        }
        if q == 1.0 {
            return Ok(self.clone());
        }
        let bounds = IntegerBounds::new(self);
        let eps = |j: u32| bounds.at(j);
        amplified_curve(self.orders(), self.epsilons(), |n| {
            ln_moment_up(n, q, &eps, &|_| None)
        })
    }
}

/// Amplification by sampling without replacement of an analytic per-order
/// bound `eps(α)`, evaluated exactly at every integer order (same guarantee as
/// [`RdpCurve::sampled_without_replacement`]).
pub(crate) fn without_replacement_amplify_analytic(
    orders: &Orders,
    q: f64,
    eps: &dyn Fn(f64) -> f64,
) -> Result<RdpCurve, AccountantError> {
    check_q(q)?;
    let unamplified: Vec<f64> = orders.as_slice().iter().map(|&a| eps(a)).collect();
    if q == 0.0 {
        return Ok(RdpCurve::zero(orders.clone()));
    }
    if q == 1.0 {
        return RdpCurve::new(orders.clone(), unamplified);
    }
    let at_integer = |j: u32| eps(f64::from(j));
    amplified_curve(orders, &unamplified, |n| {
        ln_moment_up(n, q, &at_integer, &|_| None)
    })
}

/// The RDP curve of the Gaussian mechanism (noise multiplier σ) on a sample
/// drawn without replacement at rate q, replace-one adjacency.
///
/// Guarantee: WBK (arXiv:1808.00087) Thm 27 at integer orders ≤ 256 — the Thm 9 terms for
/// j ≥ 3 are replaced by `min{4·√(Δ^{2⌊j/2⌋}·Δ^{2⌈j/2⌉}), 2e^{(j−1)ε(j)}}`, where
/// `Δ^i` is the i-th forward difference at 0 of `ℓ ↦ e^{(ℓ−1)ε(ℓ)}` with
/// `ε(ℓ) = ℓ/(2σ²)`, each enclosed in interval arithmetic (so cancellation in
/// the alternating sums cannot understate it); Thm 9 above order 256 and
/// convex interpolation at fractional orders; never above `α/(2σ²)`.
pub fn without_replacement_gaussian(
    orders: &Orders,
    q: f64,
    sigma: f64,
) -> Result<RdpCurve, AccountantError> {
    check_q(q)?;
    check_sigma(sigma)?;
    let plain: Vec<f64> = orders
        .as_slice()
        .iter()
        .map(|&a| gaussian_rdp_up(a, sigma))
        .collect();
    if q == 0.0 {
        return Ok(RdpCurve::zero(orders.clone()));
    }
    let plain_curve = RdpCurve::new(orders.clone(), plain.clone())?;
    if q == 1.0 {
        return Ok(plain_curve);
    }
    let largest = orders
        .as_slice()
        .iter()
        .map(|&a| a.ceil())
        .filter(|&a| a <= MAX_AMPLIFIED_ORDER)
        .fold(2.0f64, f64::max) as u32;
    let diffs = ForwardDifferences::new(sigma, largest.min(MAX_FORWARD_DIFFERENCE_ORDER) + 1);
    let eps = |j: u32| gaussian_rdp_up(f64::from(j), sigma);
    let refine = |j: u32| diffs.thm27_factor_up(j);
    amplified_curve(orders, &plain, |n| ln_moment_up(n, q, &eps, &refine))
}

/// Upper bounds on `ln |Δ^i g(0)|`, `g(ℓ) = e^{ℓ(ℓ−1)/(2σ²)}`, i = 0..=max.
struct ForwardDifferences {
    ln_abs_up: Vec<f64>,
}

impl ForwardDifferences {
    fn new(sigma: f64, max: u32) -> Self {
        let s = Interval::exact(sigma);
        let two_var = s.mul(s).mul(Interval::exact(2.0));
        // ln g(ℓ) enclosed.
        let ln_g: Vec<Interval> = (0..=max)
            .map(|l| {
                let l = f64::from(l);
                Interval::exact(l * (l - 1.0)).div_pos(two_var)
            })
            .collect();
        let mut ln_abs_up = Vec::with_capacity(max as usize + 1);
        for i in 0..=max {
            // Δ^i g(0) = Σ_k (−1)^{i−k} C(i,k) g(k), summed scaled by its largest term.
            let ln_c = ln_binomials(i);
            let logs: Vec<Interval> = (0..=i as usize).map(|k| ln_c[k].add(ln_g[k])).collect();
            let scale = logs.iter().map(|t| t.hi).fold(f64::NEG_INFINITY, f64::max);
            let mut sum = Interval::exact(0.0);
            for (k, t) in logs.iter().enumerate() {
                let v = t.sub(Interval::exact(scale)).exp();
                sum = if (i as usize - k).is_multiple_of(2) {
                    sum.add(v)
                } else {
                    sum.sub(v)
                };
            }
            let magnitude = sum.lo.abs().max(sum.hi.abs());
            ln_abs_up.push(add_up(scale, ln_up(magnitude)));
        }
        Self { ln_abs_up }
    }

    /// Upper bound on `ln(4·√(Δ^{2⌊j/2⌋} Δ^{2⌈j/2⌉}))`, if both are tabulated.
    fn thm27_factor_up(&self, j: u32) -> Option<f64> {
        let lo = self.ln_abs_up.get((2 * (j / 2)) as usize)?;
        let hi = self.ln_abs_up.get((2 * j.div_ceil(2)) as usize)?;
        Some(add_up(ln_up(4.0), mul_up(0.5, add_up(*lo, *hi))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_differences_match_direct_sums() {
        // Δ² g(0) = g(2) − 2g(1) + g(0) = e^{1/σ²} − 1 (g(0) = g(1) = 1).
        let sigma = 1.3f64;
        let d = ForwardDifferences::new(sigma, 8);
        let want = (1.0 / (sigma * sigma)).exp_m1().ln();
        assert!(d.ln_abs_up[2] >= want && d.ln_abs_up[2] - want < 1e-13);
        // Δ¹ g(0) = g(1) − g(0) = 0 exactly.
        assert_eq!(d.ln_abs_up[1], f64::NEG_INFINITY);
    }

    #[test]
    fn second_order_is_the_closed_form() {
        // α = 2: ε' = ln(1 + q²·min{4(e^{ε(2)} − 1), 2e^{ε(2)}}).
        let orders = Orders::new(vec![2.0]).unwrap();
        let base = RdpCurve::new(orders, vec![0.3]).unwrap();
        let q = 0.05;
        let got = base.sampled_without_replacement(q).unwrap().epsilons()[0];
        let want = (q * q * (4.0 * 0.3f64.exp_m1()).min(2.0 * 0.3f64.exp())).ln_1p();
        assert!(got >= want && got - want < 1e-15, "{got} vs {want}");
    }
}
