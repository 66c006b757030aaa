//! Calibration: the largest β (or smallest σ) whose cost fits a budget.
//!
//! Every search returns a value that was *checked feasible* with the same
//! rounded-up arithmetic that reports ε — the lower end of the final bracket
//! (upper end for σ) — and is maximal (minimal) to the stated relative
//! tolerance: the other end of the bracket, within `REL_TOL` of it, was checked
//! infeasible. Feasibility is assumed monotone in the parameter, which holds for
//! every cost here (each is non-decreasing in β and non-increasing in σ).

use crate::amplification::check_q;
use crate::amplification::poisson::poisson_amplify_analytic;
use crate::amplification::without_replacement::without_replacement_amplify_analytic;
use crate::conversion::check_delta;
use crate::event::check::check_non_negative;
use crate::event::pmixed::pmixed_query_at;
use crate::{AccountantError, Orders, RdpCurve, poisson_subsampled_gaussian};
use privmix_renyi::round::mul_up;

/// Relative width of the final bracket of every calibration.
pub const REL_TOL: f64 = 1e-9;

/// Doublings tried while looking for an infeasible upper end.
const MAX_DOUBLINGS: u32 = 2_000;

/// The largest x in `[lo, ∞)` with `feasible(x)`, to relative tolerance
/// [`REL_TOL`], for a feasibility predicate that is monotone (true below a
/// threshold, false above). `start` > `lo` is a first guess for the upper end.
///
/// This is the one search behind every "largest parameter that fits a budget" in
/// the workspace (β, radii, filter budgets); the predicate may fail with any error
/// an [`AccountantError`] converts into.
///
/// Returns `lo` itself if only `lo` is feasible: for `lo = 0` that is decided by
/// one probe at the smallest normal number instead of halving into the
/// subnormals. Returns `f64::MAX` if no infeasible value is found; errors if `lo`
/// is infeasible.
pub fn largest_feasible<E: From<AccountantError>>(
    name: &'static str,
    lo: f64,
    start: f64,
    mut feasible: impl FnMut(f64) -> Result<bool, E>,
) -> Result<f64, E> {
    if !feasible(lo)? {
        return Err(AccountantError::Infeasible {
            name,
            lo,
            hi: start,
            reason: "even the lower end of the range exceeds the budget",
        }
        .into());
    }
    let mut good = lo;
    let mut bad = start.max(f64::MIN_POSITIVE);
    let mut doublings = 0;
    while feasible(bad)? {
        good = bad;
        if bad == f64::MAX || doublings == MAX_DOUBLINGS {
            return Ok(bad);
        }
        bad = (bad * 2.0).min(f64::MAX);
        doublings += 1;
    }
    if good == 0.0 && bad > f64::MIN_POSITIVE && !feasible(f64::MIN_POSITIVE)? {
        // Nothing positive fits: 0 is the answer, found without ~1,000 halvings.
        return Ok(0.0);
    }
    // Invariant: feasible(good), !feasible(bad), good < bad.
    narrow(good, bad, feasible)
}

/// Halves the bracket between a point checked feasible (`good`) and one checked
/// infeasible (`bad`), on either side of it, until it is within [`REL_TOL`] of the
/// larger end; returns the feasible end, which every step evaluated.
fn narrow<E>(
    mut good: f64,
    mut bad: f64,
    mut feasible: impl FnMut(f64) -> Result<bool, E>,
) -> Result<f64, E> {
    while (bad - good).abs() > REL_TOL * good.max(bad) {
        let mid = good + (bad - good) / 2.0;
        if mid == good || mid == bad {
            break;
        }
        if feasible(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok(good)
}

/// The smallest x in `(0, hi]` with `feasible(x)`, to relative tolerance
/// [`REL_TOL`], for a predicate that is false below a threshold and true above.
pub fn smallest_feasible<E: From<AccountantError>>(
    name: &'static str,
    hi: f64,
    mut feasible: impl FnMut(f64) -> Result<bool, E>,
) -> Result<f64, E> {
    if !feasible(hi)? {
        return Err(AccountantError::Infeasible {
            name,
            lo: 0.0,
            hi,
            reason: "even the upper end of the range exceeds the budget",
        }
        .into());
    }
    let mut good = hi;
    let mut bad = hi / 2.0;
    while feasible(bad)? {
        good = bad;
        if bad < f64::MIN_POSITIVE {
            return Ok(good);
        }
        bad /= 2.0;
    }
    // Invariant: feasible(good), !feasible(bad), bad < good.
    narrow(good, bad, feasible)
}

/// Checks a budget: finite and > 0.
fn check_budget(name: &'static str, value: f64) -> Result<(), AccountantError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name,
            value,
            reason: "a budget must be finite and > 0",
        })
    }
}

/// Checks an order α > 1, finite.
fn check_order(alpha: f64) -> Result<(), AccountantError> {
    if alpha.is_finite() && alpha > 1.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidOrder(alpha))
    }
}

/// PMixED's β: the largest β whose per-query RDP at order `alpha` is at most
/// `per_query_epsilon` (ε_G/T), for `members` models, with members Poisson-
/// subsampled at rate `q` (q = 1: no subsampling).
///
/// Guarantee: the returned β satisfies [`crate::pmixed_query`] (q = 1) or
/// [`crate::pmixed_subsampled`] (q < 1) ≤ `per_query_epsilon` at `alpha`, as
/// evaluated (rounded up); β·(1 + 1e-9) does not. Without subsampling the
/// maximum is Lemma C.1's closed form `ln(m·e^{(α−1)ε} + 1 − m)/(4α(α−1))`
/// with m = max(members, 2) (see [`crate::pmixed_query`] for why m = 1 costs
/// what m = 2 does); it seeds the search.
///
/// With subsampling (q < 1) the sampled ensemble can have any size, so the base
/// cost is the m = 2 worst case whatever `members` is (see
/// [`crate::pmixed_subsampled`]).
pub fn pmixed_beta(
    alpha: f64,
    members: u64,
    q: f64,
    per_query_epsilon: f64,
) -> Result<f64, AccountantError> {
    check_order(alpha)?;
    check_q(q)?;
    check_budget("per_query_epsilon", per_query_epsilon)?;
    let m = members.max(2) as f64;
    let closed_form = (m * ((alpha - 1.0) * per_query_epsilon).exp() + 1.0 - m).ln()
        / (4.0 * alpha * (alpha - 1.0));
    let start = if closed_form.is_finite() && closed_form > 0.0 {
        closed_form
    } else {
        per_query_epsilon / (4.0 * alpha)
    };
    if q == 0.0 {
        // Nothing is ever sampled: no β costs anything.
        return Ok(f64::MAX);
    }
    let orders = Orders::new(vec![alpha])?;
    largest_feasible("beta", 0.0, start, |beta| {
        let cost = if q == 1.0 {
            pmixed_query_at(alpha, beta, members)
        } else {
            poisson_amplify_analytic(&orders, q, &|a| pmixed_query_at(a, beta, 2))?.epsilons()[0]
        };
        Ok(cost <= per_query_epsilon)
    })
}

/// DPS-MOZO's β (arXiv:2501.19287, App. B): the largest β such that `tokens`
/// (= n_test · T_max) tokens, each `(α, 4βα)`-RDP and amplified by sampling
/// `n_shots` of `dataset_size` demonstrations without replacement
/// (q = n_shots/|D|, WBK (arXiv:1808.00087) Thm 9), compose to at most ε at δ over `orders`.
///
/// Guarantee: the returned β gives `ε(δ) ≤ epsilon` with the crate's rounded-up
/// conversion; β·(1 + 1e-9) does not.
pub fn dps_mozo_beta(
    orders: &Orders,
    epsilon: f64,
    delta: f64,
    tokens: u64,
    n_shots: u64,
    dataset_size: u64,
) -> Result<f64, AccountantError> {
    check_budget("epsilon", epsilon)?;
    check_delta(delta)?;
    if dataset_size == 0 || n_shots > dataset_size {
        return Err(AccountantError::InvalidParameter {
            name: "n_shots",
            value: n_shots as f64,
            reason: "must be at most the (non-zero) dataset size",
        });
    }
    let q = n_shots as f64 / dataset_size as f64;
    largest_feasible(
        "beta",
        0.0,
        epsilon / (4.0 * 32.0 * tokens.max(1) as f64),
        |beta| {
            let total = dps_mozo_total(orders, beta, q, tokens)?;
            Ok(total.epsilon(delta)?.epsilon <= epsilon)
        },
    )
}

/// The composed curve of DPS-MOZO: `tokens` tokens at `4βα`, each amplified by
/// sampling without replacement at rate q.
pub fn dps_mozo_total(
    orders: &Orders,
    beta: f64,
    q: f64,
    tokens: u64,
) -> Result<RdpCurve, AccountantError> {
    check_non_negative("beta", beta)?;
    let four_beta = mul_up(4.0, beta);
    let per_token = without_replacement_amplify_analytic(orders, q, &|a| mul_up(four_beta, a))?;
    Ok(per_token.self_compose(tokens))
}

/// The smallest noise multiplier σ for `steps` Poisson-subsampled Gaussian steps
/// at rate q to stay within (ε, δ) over `orders` (DP-SGD calibration, as
/// Opacus's `get_noise_multiplier`).
///
/// Guarantee: the returned σ gives `ε(δ) ≤ epsilon` as evaluated (rounded up);
/// σ/(1 + 1e-9) does not.
pub fn poisson_gaussian_sigma(
    orders: &Orders,
    q: f64,
    steps: u64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, AccountantError> {
    check_q(q)?;
    check_budget("epsilon", epsilon)?;
    check_delta(delta)?;
    let fits = |sigma: f64| -> Result<bool, AccountantError> {
        let c = poisson_subsampled_gaussian(orders, q, sigma)?.self_compose(steps);
        Ok(c.epsilon(delta)?.epsilon <= epsilon)
    };
    // A feasible upper end by doubling from 1 (2^200 stays finite).
    smallest_sigma(1.0, 200, fits)
}

/// The smallest σ for which `queries` Gaussian releases of L2 sensitivity
/// `sensitivity` ([`crate::gaussian`], composed) stay within (ε, δ) over
/// `orders` (e.g. the embedding aggregation of Wu et al. 2023).
///
/// Guarantee: the returned σ gives `ε(δ) ≤ epsilon` as evaluated (rounded up);
/// σ/(1 + 1e-9) does not.
pub fn gaussian_sigma(
    orders: &Orders,
    sensitivity: f64,
    queries: u64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, AccountantError> {
    check_budget("epsilon", epsilon)?;
    check_delta(delta)?;
    check_non_negative("sensitivity", sensitivity)?;
    if sensitivity == 0.0 || queries == 0 {
        // Nothing to hide: any σ > 0 costs nothing.
        return Ok(f64::MIN_POSITIVE);
    }
    let fits = |sigma: f64| -> Result<bool, AccountantError> {
        let c = crate::gaussian(orders, sigma, sensitivity)?.self_compose(queries);
        Ok(c.epsilon(delta)?.epsilon <= epsilon)
    };
    smallest_sigma(sensitivity, 2_000, fits)
}

/// The smallest σ with `fits(σ)`: doubles `hi` (at most `max_doublings` times,
/// while finite) until it fits, then narrows with [`smallest_feasible`].
fn smallest_sigma(
    mut hi: f64,
    max_doublings: u32,
    mut fits: impl FnMut(f64) -> Result<bool, AccountantError>,
) -> Result<f64, AccountantError> {
    let mut tries = 0;
    while !fits(hi)? {
        hi *= 2.0;
        tries += 1;
        if tries > max_doublings || !hi.is_finite() {
            return Err(AccountantError::Infeasible {
                name: "sigma",
                lo: 0.0,
                hi,
                reason: "no noise level fits the budget at these orders",
            });
        }
    }
    smallest_feasible("sigma", hi, fits)
}

/// AdaPMixED's screening noise: the smallest σ whose screening cost
/// `(λ/(N·σ))²·α` ([`crate::adapmixed_screening`]) at order `alpha` is at most
/// `per_query_epsilon`.
///
/// Guarantee: the returned σ satisfies the budget as evaluated (rounded up);
/// σ/(1 + 1e-9) does not. The closed form `λ/N·√(α/budget)` seeds the search.
pub fn screening_sigma(
    alpha: f64,
    lambda: f64,
    members: u64,
    per_query_epsilon: f64,
) -> Result<f64, AccountantError> {
    check_order(alpha)?;
    check_budget("per_query_epsilon", per_query_epsilon)?;
    check_non_negative("lambda", lambda)?;
    if lambda == 0.0 {
        // Nothing to hide: any σ > 0 costs nothing.
        return Ok(f64::MIN_POSITIVE);
    }
    let orders = Orders::new(vec![alpha])?;
    let closed = lambda / members.max(1) as f64 * (alpha / per_query_epsilon).sqrt();
    smallest_feasible("sigma", closed * 2.0, |sigma| {
        let cost = crate::adapmixed_screening(&orders, lambda, members, sigma)?.epsilons()[0];
        Ok(cost <= per_query_epsilon)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_returns_a_feasible_value_within_tolerance() {
        let threshold = std::f64::consts::PI;
        let x = largest_feasible::<AccountantError>("x", 0.0, 1.0, |x| Ok(x <= threshold)).unwrap();
        assert!(x <= threshold && x > threshold * (1.0 - 2.0 * REL_TOL));
        let y = smallest_feasible::<AccountantError>("y", 100.0, |y| Ok(y >= threshold)).unwrap();
        assert!(y >= threshold && y < threshold * (1.0 + 2.0 * REL_TOL));
        assert!(largest_feasible::<AccountantError>("x", 5.0, 6.0, |x| Ok(x <= 1.0)).is_err());
    }

    #[test]
    fn only_zero_feasible_is_found_in_a_few_probes() {
        let mut probes = 0;
        let x = largest_feasible::<AccountantError>("x", 0.0, 1.0, |x| {
            probes += 1;
            Ok(x == 0.0)
        })
        .unwrap();
        assert_eq!(x, 0.0);
        assert!(probes <= 3, "{probes} probes");
        // A threshold far below `start` is still found by narrowing from 0.
        let tiny = 1e-200;
        let y = largest_feasible::<AccountantError>("y", 0.0, 1.0, |y| Ok(y <= tiny)).unwrap();
        assert!(y <= tiny && y > tiny * (1.0 - 2.0 * REL_TOL));
    }

    #[test]
    fn pmixed_beta_matches_lemma_c1_without_subsampling() {
        let (alpha, m, budget) = (3.0, 16u64, 0.01);
        let beta = pmixed_beta(alpha, m, 1.0, budget).unwrap();
        let closed = (16.0 * (2.0f64 * budget).exp() - 15.0).ln() / (4.0 * 3.0 * 2.0);
        assert!(pmixed_query_at(alpha, beta, m) <= budget);
        assert!((beta - closed).abs() <= 1e-8 * closed, "{beta} vs {closed}");
        // m = 1 gets the m = 2 value: monotone in m.
        let b1 = pmixed_beta(alpha, 1, 1.0, budget).unwrap();
        let b2 = pmixed_beta(alpha, 2, 1.0, budget).unwrap();
        assert_eq!(b1, b2);
        assert!(b2 <= beta);
    }

    #[test]
    fn subsampling_allows_a_larger_beta() {
        let full = pmixed_beta(4.0, 8, 1.0, 0.01).unwrap();
        let sub = pmixed_beta(4.0, 8, 0.1, 0.01).unwrap();
        assert!(sub > full);
    }

    #[test]
    fn screening_sigma_matches_the_closed_form() {
        // AdaPMixED Table 4: λ = 1e-4, N = 100, α = 18; budget 1e-6 per query.
        let sigma = screening_sigma(18.0, 1e-4, 100, 1e-6).unwrap();
        let closed = 1e-4 / 100.0 * (18.0f64 / 1e-6).sqrt();
        assert!((sigma - closed).abs() <= 2.0 * REL_TOL * closed);
        let o = Orders::new(vec![18.0]).unwrap();
        let cost = |s: f64| {
            crate::adapmixed_screening(&o, 1e-4, 100, s)
                .unwrap()
                .epsilons()[0]
        };
        assert!(cost(sigma) <= 1e-6);
        assert!(cost(sigma / (1.0 + 2.0 * REL_TOL)) > 1e-6);
        assert!(screening_sigma(18.0, 1e-4, 100, 0.0).is_err());
    }

    #[test]
    fn bad_calibration_inputs_are_typed_errors() {
        assert!(pmixed_beta(1.0, 4, 1.0, 0.1).is_err());
        assert!(pmixed_beta(2.0, 4, 1.5, 0.1).is_err());
        assert!(pmixed_beta(2.0, 4, 1.0, -0.1).is_err());
        assert!(pmixed_beta(2.0, 4, 1.0, f64::NAN).is_err());
        let o = Orders::integers(8).unwrap();
        assert!(dps_mozo_beta(&o, 1.0, 1e-5, 10, 5, 4).is_err());
        assert!(dps_mozo_beta(&o, 1.0, 1.0, 10, 1, 4).is_err());
        assert!(poisson_gaussian_sigma(&o, 0.01, 10, 0.0, 1e-5).is_err());
    }
}
