//! The proven data-independent RDP bound of PMixED (and of the per-step losses of
//! AdaPMixED's filter and of privmix's SubMix).
//!
//! # Privacy unit and adjacency
//! The privacy unit is a user (or a record) whose data lies in the training shard of
//! exactly one member. Adding, removing or replacing that unit retrains that one member,
//! so at the level of the mechanism's inputs **one member's next-token distributions
//! change arbitrarily** (an emptied shard gives the public model); the number of
//! members N is public and fixed (*changed-member* adjacency, both directions).
//!
//! # The bound
//! Each member's λᵢ enforces `Dsym_{α_c}(p̄ᵢ, p₀) ≤ b` at one *enforcement order* α_c.
//! Mironov's weak triangle inequality ("Rényi Differential Privacy", arXiv:1702.07476,
//! Prop. 11) through p₀ puts a changed member's two mixtures within `c·b`,
//! `c = (2α_c − 1)/(α_c − 1)`, at every order `α ≤ α_max = α_c²/(2α_c − 1)`; joint
//! convexity of `Σ P^α Q^{1−α}` over the average and over the Poisson draw gives
//!
//! `ε(α) = ln(1 + w·(e^{(α−1)cb} − 1))/(α − 1)`, `w = (1 − (1−q)^N)/N`,
//!
//! and +∞ above α_max. privmix charges the smaller of this and the second-order bound
//! of [`second_order_bound_up`] (the binomial expansion of Wang, Balle &
//! Kasiviswanathan, arXiv:1808.00087 Thm 9, with moments certified by duality),
//! which is second order in w. The paper's `4βα` bound (arXiv:2410.02016 Thm 3.1) is not
//! proven as used (`tests/integration/pmixed_paper_bound.rs` keeps a counterexample); the
//! accountant's `privmix_accountant::pmixed_query` keeps its formula for reports only.
//! The full argument, step by step, is in `proof.md` beside this file
//! (`src/pmixed/proof.md`).
//!
//! # Rounding
//! Every returned value is rounded up with `privmix_renyi::round` (exact-directed
//! arithmetic, libm results moved one ulp outward under the faithful-libm assumption
//! documented there). The charged curve, [`pmixed_curve`], is the real-arithmetic bound
//! [`pmixed_bound_at`] plus [`averaging_slack`]: what the f64 rows' masses and the f64
//! sum and division that average the drawn members' mixtures can add to the divergence
//! of the token law actually sampled (`proof.md`, "Rounding").

use privmix_accountant::{Orders, RdpCurve};
use privmix_renyi::round::{
    add_up, div_down, div_up, exp_down, exp_m1_up, exp_up, ln_1p_down, ln_1p_up, ln_up, mul_down,
    mul_up, sub_down, sub_up, u64_down, u64_up,
};

use crate::MechanismError;

pub use super::averaging::{
    MAX_VOCAB, averaging_log_ratio, averaging_slack, gamma_up, row_mass_deviation,
    screening_sum_error,
};
pub use super::second_order::{
    MAX_SECOND_ORDER, log_moment_up, moment_bound_up, second_order_bound_up,
};

/// Checks an enforcement order α_c: finite and > 1.
pub fn check_enforcement_order(alpha_c: f64) -> Result<(), MechanismError> {
    if alpha_c.is_finite() && alpha_c > 1.0 {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name: "alpha_c",
            value: alpha_c,
            reason: "the enforcement order must be finite and > 1",
        })
    }
}

/// Checks a radius b: finite and ≥ 0.
pub fn check_radius(radius: f64) -> Result<(), MechanismError> {
    if radius.is_finite() && radius >= 0.0 {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name: "radius",
            value: radius,
            reason: "the radius b must be finite and ≥ 0",
        })
    }
}

/// Checks a sampling probability q ∈ [0, 1].
pub fn check_probability(name: &'static str, q: f64) -> Result<(), MechanismError> {
    if (0.0..=1.0).contains(&q) {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name,
            value: q,
            reason: "a probability must lie in [0, 1]",
        })
    }
}

/// `α_max = α_c²/(2α_c − 1)`, rounded *down*: the largest order at which the
/// weak triangle inequality is used (orders above it are charged +∞).
pub fn max_accounted_order(alpha_c: f64) -> f64 {
    div_down(
        mul_down(alpha_c, alpha_c),
        sub_up(mul_up(2.0, alpha_c), 1.0),
    )
}

/// `c = (2α_c − 1)/(α_c − 1) = 1 + α_c/(α_c − 1)`, rounded up.
pub fn triangle_coefficient(alpha_c: f64) -> f64 {
    div_up(sub_up(mul_up(2.0, alpha_c), 1.0), sub_down(alpha_c, 1.0))
}

/// `w = (1 − (1 − q)^N)/N` rounded up: the weight of a changed member in the
/// Poisson-subsampled average (`proof.md`, Step 3); `1/N` at q = 1, 0 at q = 0.
pub fn changed_member_weight(members: u64, q: f64) -> f64 {
    if members == 0 || q == 0.0 {
        return 0.0;
    }
    let inverse = div_up(1.0, u64_down(members));
    if q == 1.0 {
        return inverse;
    }
    // (1 − q)^N = exp(N·ln(1 − q)) rounded down; ln(1 − q) < 0, so the product with
    // N rounded up in magnitude is rounded down.
    let exponent = mul_down(u64_up(members), ln_1p_down(-q));
    let keep = exp_down(exponent).max(0.0);
    let w = div_up(sub_up(1.0, keep), u64_down(members));
    // w ≤ min(q, 1/N) exactly (Bernoulli's inequality); keep the tighter of the two.
    w.min(inverse).min(q)
}

/// The proven per-query bound of PMixED under changed-member adjacency at order α:
/// the smaller of the first-order bound [`first_order_bound_at`] and the second-order
/// bound [`second_order_bound_up`] (`proof.md`, "The second-order bound"), both
/// rounded up; +∞ above α_max. `members = 0` or b = 0 or q = 0 give 0 (the output is
/// p₀ whatever the data).
pub fn pmixed_bound_at(alpha: f64, alpha_c: f64, radius: f64, members: u64, q: f64) -> f64 {
    let first = first_order_bound_at(alpha, alpha_c, radius, members, q);
    if first == 0.0 || first == f64::INFINITY {
        return first;
    }
    let w = changed_member_weight(members, q);
    first.min(second_order_bound_up(
        alpha, alpha_c, radius, radius, w, false,
    ))
}

/// The first-order (joint-convexity) bound of PMixED at order α:
/// `ln(1 + w·(e^{(α−1)cb} − 1))/(α − 1)` with `w` = [`changed_member_weight`],
/// rounded up; +∞ above α_max (`proof.md`, Steps 1–3).
pub fn first_order_bound_at(alpha: f64, alpha_c: f64, radius: f64, members: u64, q: f64) -> f64 {
    let w = changed_member_weight(members, q);
    if w == 0.0 || radius == 0.0 {
        return 0.0;
    }
    if alpha > max_accounted_order(alpha_c) {
        return f64::INFINITY;
    }
    mixture_bound_up(alpha, mul_up(triangle_coefficient(alpha_c), radius), w)
}

/// `ln(1 + w·(e^{(α−1)d} − 1))/(α − 1)` rounded up, for d ≥ 0 and w ∈ (0, 1]: the
/// RDP at order α of an average in which one component of weight w moves to a
/// distribution within `D_α ≤ d` of its old one (joint convexity, `proof.md` Step 2).
pub fn mixture_bound_up(alpha: f64, d: f64, w: f64) -> f64 {
    if d == 0.0 || w == 0.0 {
        return 0.0;
    }
    let x = mul_up(sub_up(alpha, 1.0), d);
    let numerator = if x == f64::INFINITY {
        f64::INFINITY
    } else if x <= 700.0 {
        ln_1p_up(mul_up(w, exp_m1_up(x)))
    } else {
        // x + ln w + ln(1 + (1/w − 1)·e^{−x}), stable where eˣ overflows.
        let tail = ln_1p_up(mul_up(sub_up(div_up(1.0, w), 1.0), exp_up(-x)));
        add_up(add_up(x, ln_up(w)), tail)
    };
    div_up(numerator, sub_down(alpha, 1.0).max(f64::MIN_POSITIVE))
}

/// The charged per-query value at order α: [`pmixed_bound_at`] plus
/// [`averaging_slack`]`(α, members)`, rounded up (`+∞` stays `+∞`). 0 when no member
/// can be drawn (`members = 0` or q = 0): the output is then p₀ itself, with no
/// arithmetic, on every dataset. At b = 0 the bound is 0 but the slack is still
/// charged: every certified distribution is p₀, yet the f64 rows averaged need not be
/// p₀ bit for bit.
pub fn pmixed_charge_at(alpha: f64, alpha_c: f64, radius: f64, members: u64, q: f64) -> f64 {
    if changed_member_weight(members, q) == 0.0 {
        return 0.0;
    }
    let bound = pmixed_bound_at(alpha, alpha_c, radius, members, q);
    if bound == f64::INFINITY {
        return bound;
    }
    add_up(bound, averaging_slack(alpha, members))
}

/// PMixED's per-query RDP curve under changed-member adjacency, as charged
/// ([`pmixed_charge_at`] at every order of `orders`: the proven bound plus the f64
/// averaging slack), computed once per configuration.
pub fn pmixed_curve(
    orders: &Orders,
    alpha_c: f64,
    radius: f64,
    members: u64,
    q: f64,
) -> Result<RdpCurve, MechanismError> {
    check_enforcement_order(alpha_c)?;
    check_radius(radius)?;
    check_probability("q", q)?;
    Ok(RdpCurve::from_fn(orders.clone(), |a| {
        pmixed_charge_at(a, alpha_c, radius, members, q)
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficient_and_max_order_match_closed_forms() {
        // α_c = 36: α_max = 1296/71 ≈ 18.2535, c = 71/35.
        let a = max_accounted_order(36.0);
        assert!(a <= 1296.0 / 71.0 && a > 18.25);
        let c = triangle_coefficient(36.0);
        assert!((71.0 / 35.0..71.0 / 35.0 + 1e-14).contains(&c));
        // c > 2 always, → 2 as α_c → ∞.
        assert!(triangle_coefficient(1e6) > 2.0);
    }

    #[test]
    fn weight_matches_the_closed_form_and_its_limits() {
        for (n, q) in [(1u64, 0.5f64), (2, 0.3), (10, 0.1), (100, 0.01), (7, 0.999)] {
            let exact = (1.0 - (1.0 - q).powi(n as i32)) / n as f64;
            let got = changed_member_weight(n, q);
            assert!(
                got >= exact && got <= exact * (1.0 + 1e-12),
                "{n} {q}: {got} {exact}"
            );
        }
        let quarter = changed_member_weight(4, 1.0);
        assert!((0.25..0.25 + 1e-15).contains(&quarter), "{quarter}");
        assert_eq!(changed_member_weight(4, 0.0), 0.0);
        assert_eq!(changed_member_weight(0, 0.5), 0.0);
        // Tiny q: w ≈ q, never above it.
        assert!(changed_member_weight(1000, 1e-300) <= 1e-300);
    }

    #[test]
    fn bound_matches_formula_and_is_ordered() {
        let (ac, b): (f64, f64) = (36.0, 0.05);
        let c: f64 = 71.0 / 35.0;
        let a: f64 = 8.0;
        for m in 1..6u64 {
            let exact = ((m as f64 - 1.0 + ((a - 1.0) * c * b).exp()) / m as f64).ln() / (a - 1.0);
            let got = first_order_bound_at(a, ac, b, m, 1.0);
            assert!(
                got >= exact && got <= exact * (1.0 + 1e-13),
                "{got} {exact}"
            );
        }
        // One member alone: the whole triangle bound c·b.
        let one = first_order_bound_at(a, ac, b, 1, 1.0);
        assert!(one >= c * b && one <= c * b * (1.0 + 1e-13), "{one}");
        // Non-increasing in N, non-decreasing in q.
        assert!(
            first_order_bound_at(4.0, ac, b, 3, 1.0) <= first_order_bound_at(4.0, ac, b, 2, 1.0)
        );
        assert!(
            first_order_bound_at(4.0, ac, b, 3, 0.5) <= first_order_bound_at(4.0, ac, b, 3, 1.0)
        );
        assert_eq!(first_order_bound_at(19.0, ac, b, 3, 1.0), f64::INFINITY);
        assert_eq!(first_order_bound_at(19.0, ac, b, 1, 1.0), f64::INFINITY);
        assert_eq!(first_order_bound_at(4.0, ac, 0.0, 3, 1.0), 0.0);
        assert_eq!(first_order_bound_at(4.0, ac, b, 3, 0.0), 0.0);
        // Huge exponents stay finite and ≈ c·b + ln w.
        // α_c = 3: c = 5/2, α_max = 9/5; at α = 3/2, N = 2: ε = 2.5e4 − 2·ln 2 (to 1e-12).
        let big = first_order_bound_at(1.5, 3.0, 1e4, 2, 1.0);
        let expect = 2.5e4 - 2.0 * 2f64.ln();
        assert!(big >= expect && big <= expect + 1e-8, "{big}");
    }

    #[test]
    fn subsampled_curve_is_finite_below_alpha_max_and_infinite_above() {
        let orders = Orders::dp_accounting_default();
        let curve = pmixed_curve(&orders, 36.0, 0.05, 100, 0.1).unwrap();
        let full = pmixed_curve(&orders, 36.0, 0.05, 100, 1.0).unwrap();
        for ((&a, &e), &f) in orders
            .as_slice()
            .iter()
            .zip(curve.epsilons())
            .zip(full.epsilons())
        {
            assert!(!e.is_nan());
            if a <= max_accounted_order(36.0) {
                assert!(e.is_finite() && e <= f, "order {a}: {e} vs {f}");
            } else {
                assert_eq!(e, f64::INFINITY, "order {a}");
            }
        }
        assert_eq!(
            pmixed_curve(&orders, 36.0, 0.05, 4, 0.0).unwrap(),
            RdpCurve::zero(orders.clone())
        );
    }

    #[test]
    fn the_charge_is_the_bound_plus_exactly_the_averaging_slack() {
        let orders = Orders::new(vec![1.25, 2.0, 8.0, 18.0, 19.0]).unwrap();
        for (n, q, b) in [(100u64, 0.1f64, 0.05f64), (3, 1.0, 0.5), (1, 1.0, 1e-3)] {
            let curve = pmixed_curve(&orders, 36.0, b, n, q).unwrap();
            for (&a, &charged) in orders.as_slice().iter().zip(curve.epsilons()) {
                let bound = pmixed_bound_at(a, 36.0, b, n, q);
                if bound == f64::INFINITY {
                    assert_eq!(charged, f64::INFINITY, "order {a}");
                    continue;
                }
                let slack = averaging_slack(a, n);
                assert_eq!(charged, add_up(bound, slack), "order {a}");
                assert!(
                    charged > bound && slack > 0.0 && slack < 1e-8,
                    "{a}: {slack}"
                );
            }
        }
        // No member can be drawn: p₀ is released as it is, nothing to add.
        assert_eq!(pmixed_charge_at(2.0, 36.0, 0.05, 4, 0.0), 0.0);
        assert_eq!(pmixed_charge_at(2.0, 36.0, 0.05, 0, 1.0), 0.0);
        // b = 0: the bound is 0, the slack is still charged.
        assert_eq!(
            pmixed_charge_at(2.0, 36.0, 0.0, 4, 1.0),
            averaging_slack(2.0, 4)
        );
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let o = Orders::default();
        assert!(pmixed_curve(&o, 1.0, 0.1, 2, 1.0).is_err());
        assert!(pmixed_curve(&o, f64::NAN, 0.1, 2, 1.0).is_err());
        assert!(pmixed_curve(&o, 4.0, -0.1, 2, 1.0).is_err());
        assert!(pmixed_curve(&o, 4.0, f64::INFINITY, 2, 1.0).is_err());
        assert!(pmixed_curve(&o, 4.0, 0.1, 2, 1.5).is_err());
        assert!(pmixed_curve(&o, 4.0, 0.1, 2, -0.1).is_err());
    }
}
