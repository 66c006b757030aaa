//! Privacy amplification by Poisson subsampling (add/remove-one adjacency):
//! each record enters the sample independently with probability q.
//!
//! Zhu & Wang, "Poisson Subsampled Rényi Differential Privacy" (ICML 2019,
//! PMLR 97:7634–7642), Thm 6 for any mechanism; Mironov, Talwar & Zhang,
//! "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
//! arXiv:1908.10530, §3.3 for the Gaussian. The steps privmix adds are proved
//! in `amplification/proof.md`.

use crate::amplification::{
    IntegerBounds, amplified_curve, as_integer_order, check_q, check_sigma, log_sum_exp_up,
};
use crate::special::ln_binomials_up;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{
    add_up, div_up, exp_m1_up, exp_up, ln_1p_up, ln_up, mul_down, mul_up, sub_down,
};

mod gaussian_fractional;

/// Upper bound on `ln A` for integer α ≥ 2, where
/// `A = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{c(k)}` and `c(k)` bounds `(k−1)ε(k)`
/// from above (c(0) = c(1) = 0). For a general curve this is Zhu & Wang (ICML 2019),
/// Thm 6 (the tight bound, restated as Thm A.4 of arXiv:2410.02016: its first term
/// `(1−q)^{α−1}(1+(α−1)q)` is the k = 0 and k = 1 terms here); for the Gaussian
/// with `c(k) = k(k−1)/(2σ²)` it is the exact moment of Mironov, Talwar & Zhang
/// (arXiv:1908.10530), §3.3.
///
/// Evaluated as `A = 1 + Σ_{k=2}^{α} C(α,k) (1−q)^{α−k} q^k (e^{c(k)} − 1)` (the
/// binomial weights sum to 1), a sum of non-negative terms, so that `ln A` keeps
/// its relative accuracy when A is close to 1.
fn ln_moment_integer_up(alpha: u32, q: f64, mut cgf_up: impl FnMut(u32) -> f64) -> f64 {
    let ln_binom = ln_binomials_up(alpha);
    let ln_q = ln_up(q);
    let ln_1mq = ln_1p_up(-q);
    let mut terms = Vec::with_capacity(alpha as usize);
    for k in 2..=alpha {
        let c = cgf_up(k);
        if c == f64::INFINITY {
            return f64::INFINITY;
        }
        // ln(eᶜ − 1) ≤ c; use the exact form while eᶜ − 1 is representable.
        let ln_excess = if c < 700.0 { ln_up(exp_m1_up(c)) } else { c };
        // k·ln q and (α−k)·ln(1−q) grow with their (upper-bounded) logarithms.
        let q_part = mul_up(f64::from(k), ln_q);
        let r_part = if k == alpha {
            0.0
        } else {
            mul_up(f64::from(alpha - k), ln_1mq)
        };
        terms.push(add_up(
            add_up(add_up(ln_binom[k as usize], q_part), r_part),
            ln_excess,
        ));
    }
    // ln(1 + eᴸ), without overflowing for large L.
    let l = log_sum_exp_up(&terms);
    if l < 0.0 {
        ln_1p_up(exp_up(l))
    } else {
        add_up(l, ln_1p_up(exp_up(-l)))
    }
}

impl RdpCurve {
    /// The RDP curve of the mechanism run on a Poisson subsample (rate `q`) of
    /// its input, for add/remove-one adjacency.
    ///
    /// Guarantee, at each order α of the curve:
    /// * integer α ≥ 2: the tight bound of Zhu & Wang (ICML 2019) (Thm 6; arXiv:2410.02016,
    ///   Thm A.4), `ε'(α) = ln((1−q)^{α−1}(1+(α−1)q) + Σ_{j=2}^{α} C(α,j) q^j
    ///   (1−q)^{α−j} e^{(j−1)ε(j)})/(α−1)`. It needs ε(j) at every integer
    ///   j ≤ α: where the curve lacks j, the value at the nearest order above j
    ///   is used (the smallest over all orders ≥ j) — valid because Rényi
    ///   divergence is non-decreasing in the order (van Erven & Harremoës (arXiv:1206.2459),
    ///   Thm 3). A curve with no order ≥ j gives +∞ there.
    /// * fractional α: the tight form does not apply; the bound is the convex
    ///   interpolation of `(α−1)ε'(α)` between ⌊α⌋ and ⌈α⌉ (convexity of the
    ///   log-moment in the order; Wang, Balle & Kasiviswanathan (arXiv:1808.00087), Cor. 10),
    ///   which needs the amplified value at ⌈α⌉ (computed even if ⌈α⌉ is not
    ///   one of the orders).
    /// * every order: never above the unamplified value (subsampling cannot
    ///   hurt), which is also what orders above 16384 keep.
    ///
    /// All arithmetic is rounded up. `q` must lie in [0, 1]; q = 0 gives the zero
    /// curve and q = 1 the curve itself.
    pub fn poisson_subsampled(&self, q: f64) -> Result<RdpCurve, AccountantError> {
        check_q(q)?;
        if q == 0.0 {
            return Ok(RdpCurve::zero(self.orders().clone()));
        }
        if q == 1.0 {
            return Ok(self.clone());
        }
        let bounds = IntegerBounds::new(self);
        amplified_curve(self.orders(), self.epsilons(), |n| {
            ln_moment_integer_up(n, q, |k| bounds.cgf_at(k))
        })
    }
}

/// Poisson amplification of an analytic per-order bound `eps(α)`, evaluated
/// exactly at every integer order the tight bound needs (same guarantee as
/// [`RdpCurve::poisson_subsampled`]).
pub(crate) fn poisson_amplify_analytic(
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
    amplified_curve(orders, &unamplified, |n| {
        ln_moment_integer_up(n, q, |k| mul_up(f64::from(k - 1), eps(f64::from(k))))
    })
}

/// `(k² − k)/(2σ²)` rounded up: `(k−1)·ε(k)` of the Gaussian with noise multiplier σ.
fn gaussian_cgf_up(k: u32, sigma: f64) -> f64 {
    let k = f64::from(k);
    // k(k−1) is an exact integer (k ≤ 2^26); 2σ² is bounded below.
    let two_var_lo = mul_down(2.0, mul_down(sigma, sigma));
    div_up(k * (k - 1.0), two_var_lo)
}

/// `α/(2σ²)` rounded up: the RDP of the Gaussian mechanism with noise
/// multiplier σ (standard deviation over L2 sensitivity; Mironov, arXiv:1702.07476, Prop. 7).
pub(crate) fn gaussian_rdp_up(alpha: f64, sigma: f64) -> f64 {
    div_up(alpha, mul_down(2.0, mul_down(sigma, sigma)))
}

/// The RDP of the Poisson-subsampled Gaussian mechanism (noise multiplier σ,
/// sampling rate q, add/remove-one adjacency) at one order α ∈ (1, ∞].
///
/// Guarantee: an upper bound on the exact value `ln A_α/(α−1)` of Mironov,
/// Talwar & Zhang (arXiv:1908.10530, Thm 4 / §3.3: for this mechanism the divergence
/// `D_α(μ‖μ₀)` with `μ = (1−q)N(0,σ²) + qN(1,σ²)` dominates the reverse one):
/// * integer α: the finite binomial sum for `A_α`, rounded up;
/// * fractional α: the two series of MTZ §3.3 split at
///   `z₀ = σ² ln(1/q − 1) + ½`, summed with their signs in interval
///   arithmetic (no cancellation can push the bound under the truth), plus a
///   proven bound on the truncated tails (see `gaussian_fractional.rs`) —
///   unlike dp_accounting's absolute-value series, which loosens and needs
///   many terms as α → 1 and drops its tail;
/// * α = ∞: +∞ for q > 0.
///
/// It is never above the unsubsampled `α/(2σ²)`. q = 0 gives 0, q = 1 the
/// plain Gaussian.
pub fn poisson_subsampled_gaussian_at(
    q: f64,
    sigma: f64,
    alpha: f64,
) -> Result<f64, AccountantError> {
    check_q(q)?;
    check_sigma(sigma)?;
    if alpha.is_nan() || alpha <= 1.0 {
        return Err(AccountantError::InvalidOrder(alpha));
    }
    if q == 0.0 {
        return Ok(0.0);
    }
    if alpha == f64::INFINITY {
        return Ok(f64::INFINITY);
    }
    let plain = gaussian_rdp_up(alpha, sigma);
    if q == 1.0 || alpha > crate::amplification::MAX_AMPLIFIED_ORDER {
        return Ok(plain);
    }
    let ln_a = match as_integer_order(alpha) {
        Some(n) => ln_moment_integer_up(n, q, |k| gaussian_cgf_up(k, sigma)),
        None => gaussian_fractional::ln_moment_up(q, sigma, alpha),
    };
    Ok(div_up(ln_a.max(0.0), sub_down(alpha, 1.0)).min(plain))
}

/// The RDP curve of the Poisson-subsampled Gaussian mechanism over `orders`
/// (see [`poisson_subsampled_gaussian_at`] for the guarantee at each order).
pub fn poisson_subsampled_gaussian(
    orders: &Orders,
    q: f64,
    sigma: f64,
) -> Result<RdpCurve, AccountantError> {
    check_q(q)?;
    check_sigma(sigma)?;
    let values = orders
        .as_slice()
        .iter()
        .map(|&alpha| poisson_subsampled_gaussian_at(q, sigma, alpha))
        .collect::<Result<Vec<_>, _>>()?;
    RdpCurve::new(orders.clone(), values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_zero_and_one_are_the_identity_cases() {
        let orders = Orders::integers(8).unwrap();
        let base = RdpCurve::from_fn(orders.clone(), |a| a / 4.0).unwrap();
        assert_eq!(
            base.poisson_subsampled(0.0).unwrap(),
            RdpCurve::zero(orders.clone())
        );
        assert_eq!(base.poisson_subsampled(1.0).unwrap(), base);
        assert!(matches!(
            base.poisson_subsampled(1.5),
            Err(AccountantError::InvalidParameter { name: "q", .. })
        ));
    }

    #[test]
    fn general_curve_of_a_gaussian_matches_the_gaussian_at_integers() {
        // Feeding the Gaussian's own curve to the general bound reproduces the
        // exact Gaussian moment at integer orders (same sum, up to rounding).
        let orders = Orders::integers(40).unwrap();
        let sigma = 1.3;
        let base = RdpCurve::from_fn(orders.clone(), |a| a / (2.0 * sigma * sigma)).unwrap();
        let general = base.poisson_subsampled(0.05).unwrap();
        let gauss = poisson_subsampled_gaussian(&orders, 0.05, sigma).unwrap();
        for (g, h) in general.epsilons().iter().zip(gauss.epsilons()) {
            assert!((g - h).abs() <= 1e-12 * h.max(1e-300), "{g} vs {h}");
        }
    }

    #[test]
    fn second_order_closed_form() {
        // At α = 2: A = 1 + q²(e^{ε(2)} − 1), exactly.
        let orders = Orders::new(vec![2.0]).unwrap();
        let base = RdpCurve::new(orders, vec![0.7]).unwrap();
        let q = 0.1;
        let got = base.poisson_subsampled(q).unwrap().epsilons()[0];
        let want = (q * q * 0.7f64.exp_m1()).ln_1p();
        assert!(got >= want && got - want < 1e-14, "{got} vs {want}");
    }

    #[test]
    fn missing_integer_orders_use_the_next_order_above() {
        // Only order 4 given: ε(2), ε(3) are bounded by ε(4) (monotonicity).
        let sparse = RdpCurve::new(Orders::new(vec![4.0]).unwrap(), vec![0.5]).unwrap();
        let full = RdpCurve::new(Orders::new(vec![2.0, 3.0, 4.0]).unwrap(), vec![0.5; 3]).unwrap();
        let a = sparse.poisson_subsampled(0.2).unwrap().epsilons()[0];
        let b = full.poisson_subsampled(0.2).unwrap().epsilons()[2];
        assert_eq!(a, b);
    }

    #[test]
    fn gaussian_bad_inputs() {
        assert!(poisson_subsampled_gaussian_at(0.1, 0.0, 2.0).is_err());
        assert!(poisson_subsampled_gaussian_at(0.1, -1.0, 2.0).is_err());
        assert!(poisson_subsampled_gaussian_at(-0.1, 1.0, 2.0).is_err());
        assert!(poisson_subsampled_gaussian_at(0.1, 1.0, 1.0).is_err());
        assert!(poisson_subsampled_gaussian_at(0.1, 1.0, f64::NAN).is_err());
        assert_eq!(
            poisson_subsampled_gaussian_at(0.1, 1.0, f64::INFINITY),
            Ok(f64::INFINITY)
        );
        assert_eq!(
            poisson_subsampled_gaussian_at(0.0, 1.0, f64::INFINITY),
            Ok(0.0)
        );
    }
}
