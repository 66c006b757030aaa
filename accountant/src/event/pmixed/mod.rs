//! PMixED's per-query bound and its Poisson-subsampled form.
//!
//! Flemings, Razaviyayn, Annavaram, "Differentially Private Next-Token
//! Prediction of Large Language Models", arXiv:2403.15638, restated with its
//! proof in "Adaptively Private Next-Token Prediction of Large Language
//! Models", arXiv:2410.02016, §3.2, Thm 3.1 and App. C, Thm C.1. The small
//! ensemble sizes rest on privmix's own argument, [`proof.md`](./proof.md).

use crate::event::check::check_non_negative;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{
    add_up, div_up, exp_m1_up, exp_up, ln_1p_up, ln_down, mul_up, sub_down, sub_up, u64_down,
};

/// `ln((m − 1 + eˣ)/m)` rounded up, for x ≥ 0 and m ≥ 1 (stable for large x).
fn ln_mixture_moment_up(x: f64, m: f64) -> f64 {
    if x <= 700.0 {
        // ln(1 + (eˣ − 1)/m)
        ln_1p_up(div_up(exp_m1_up(x), m))
    } else {
        // x − ln m + ln(1 + (m − 1)e^{−x})
        add_up(sub_up(x, ln_down(m)), ln_1p_up(mul_up(m - 1.0, exp_up(-x))))
    }
}

/// PMixED's per-query bound at one order for an ensemble of `members`,
/// rounded up (see [`pmixed_query`]).
pub(crate) fn pmixed_query_at(alpha: f64, beta: f64, members: u64) -> f64 {
    if beta == 0.0 {
        return 0.0;
    }
    let m = u64_down(members.max(2));
    let am1_lo = sub_down(alpha, 1.0);
    let am1_hi = sub_up(alpha, 1.0);
    // x = 4βα(α − 1), rounded up.
    let x = mul_up(mul_up(mul_up(4.0, beta), alpha), am1_hi);
    div_up(ln_mixture_moment_up(x, m), am1_lo)
}

/// PMixED's data-independent per-query RDP as the paper states it
/// (arXiv:2410.02016, Thm 3.1, proof in App. C, Thm C.1) for an ensemble of
/// `members` models, each projected to `Dsym_α ≤ β·α` of the public model,
/// under add/remove-one-member adjacency.
///
/// Guarantee: `ε(α) = ln((m − 1 + e^{4βα(α−1)})/m)/(α − 1)` with
/// **m = max(members, 2)**, rounded up. Why one- and two-member ensembles are
/// charged the m = 2 value (a 1-member ensemble also neighbours a 2-member
/// one, which the paper's m = 1 case βα ignores), and why that makes the bound
/// non-increasing in m, is written out in [`proof.md`](./proof.md) beside this
/// file. β ≥ 0.
///
/// The triangle-like inequality of the proof needs the member constraint at
/// every order the curve is used at; the mechanism must enforce it there.
///
/// **Caution — the paper's bound, not a proven one.** The triangle-like
/// inequality the proof cites (Steinke 2022, Lemma 33.7) is a zCDP statement
/// whose proof moves to other orders (Hölder); with λ enforced at a single
/// order the bound can fail (privmix-mechanisms keeps a counterexample in
/// `tests/integration/pmixed_paper_bound.rs`). privmix's PMixED and AdaPMixED mechanisms
/// charge the proven bound of `privmix_mechanisms::bounds` (Mironov,
/// arXiv:1702.07476, Prop. 11, from a constraint at one enforcement order);
/// this function stays for comparison with the papers.
pub fn pmixed_query(orders: &Orders, beta: f64, members: u64) -> Result<RdpCurve, AccountantError> {
    check_non_negative("beta", beta)?;
    RdpCurve::from_fn(orders.clone(), |a| pmixed_query_at(a, beta, members))
}

/// PMixED with each member kept independently with probability q per query
/// (arXiv:2410.02016, Alg. 2; amplification by its Thm A.4, which is Zhu &
/// Wang, "Poisson Subsampled Rényi Differential Privacy", ICML 2019, Thm 6).
///
/// Guarantee: the tight Poisson amplification (see
/// [`RdpCurve::poisson_subsampled`]) of the per-query bound, evaluated exactly
/// at every integer order. The subsampled ensemble has a random number of
/// members, possibly 1 or 2, and Thm A.4 needs one base bound for all inputs,
/// so the base is the worst case over ensemble sizes: the m = 2 value of
/// [`pmixed_query`] (which dominates every m; see [`proof.md`](./proof.md)). The paper instead plugs in the
/// full ensemble size N, which the sampled ensemble does not have.
pub fn pmixed_subsampled(orders: &Orders, beta: f64, q: f64) -> Result<RdpCurve, AccountantError> {
    check_non_negative("beta", beta)?;
    crate::amplification::poisson::poisson_amplify_analytic(orders, q, &|a| {
        pmixed_query_at(a, beta, 2)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmixed_matches_thm_3_1_and_is_monotone_in_members() {
        let (alpha, beta) = (18.0f64, 0.001);
        for m in [2u64, 3, 10, 100] {
            // ln((m − 1 + eˣ)/m) = ln(1 + (eˣ − 1)/m), the cancellation-free form.
            let x = 4.0 * beta * alpha * (alpha - 1.0);
            let want = (x.exp_m1() / m as f64).ln_1p() / (alpha - 1.0);
            let got = pmixed_query_at(alpha, beta, m);
            assert!(
                got >= want * (1.0 - 1e-15) && got - want < 1e-13 * want,
                "m = {m}"
            );
        }
        // m = 1 costs what m = 2 costs (its add-a-member neighbour), above βα.
        assert_eq!(
            pmixed_query_at(alpha, beta, 1),
            pmixed_query_at(alpha, beta, 2)
        );
        assert!(pmixed_query_at(alpha, beta, 1) > beta * alpha);
        let mut prev = f64::INFINITY;
        for m in 1..50 {
            let v = pmixed_query_at(alpha, beta, m);
            assert!(v <= prev);
            prev = v;
        }
    }

    #[test]
    fn pmixed_survives_huge_exponents() {
        let v = pmixed_query_at(64.0, 10.0, 5);
        let x = 4.0 * 10.0 * 64.0 * 63.0;
        assert!(v.is_finite() && (v - (x - 5f64.ln()) / 63.0).abs() < 1e-9);
    }
}
