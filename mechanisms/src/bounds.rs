//! The proven data-independent RDP bound of PMixED and AdaPMixED.
//!
//! # What is enforced
//! Each member's λᵢ enforces one constraint, at the *enforcement order* α_c with
//! radius b: `Dsym_{α_c}(p̄ᵢ, p₀) ≤ b` with `p̄ᵢ = λᵢpᵢ + (1−λᵢ)p₀`. Rényi divergence
//! is non-decreasing in the order (van Erven & Harremoës 2014, Thm 3), so the
//! constraint holds at every order α' ≤ α_c as well.
//!
//! # Why the paper's bound is not charged
//! adapmixed.txt Thm 3.1 (App. C) bounds `D_α(p̄ᵢ ‖ average of the others)` by
//! `4βα` with a "triangle-like inequality" (Thm A.5 = Steinke 2022, Lemma 33.7)
//! applied at one order. That lemma is a zCDP statement: it needs its hypothesis
//! at all orders (its proof moves to other orders through Hölder). λ is enforced
//! at one order only, so `4βα` is not proven as used. The accountant's
//! `pmixed_query` keeps the paper's formula for reports; mechanisms charge this
//! module's bound.
//!
//! # The bound (proof sketch; every step is a published inequality)
//! Weak triangle inequality (Mironov 2017, "Rényi differential privacy", Prop. 11):
//! for p, q > 1 with 1/p + 1/q = 1,
//! `D_α(P‖R) ≤ (α − 1/p)/(α − 1)·D_{pα}(P‖Q) + D_{q(α−1/p)}(Q‖R)`.
//! With `p* = (α_c − 1)/(α_c − α)`: `q(α − 1/p*) = α_c`, the coefficient is
//! `α_c/(α_c − 1)`, and `p*α ≤ α_c` iff `α ≤ α_max = α_c²/(2α_c − 1)`. With
//! Q = p₀ and quasi-convexity (adapmixed Thm A.6: the average of mixtures is
//! within b of p₀ in both directions at α_c), every order `1 < α ≤ α_max` has
//! `D_α(p̄ᵢ ‖ avg) ≤ c·b` and `D_α(avg ‖ p̄ᵢ) ≤ c·b`, `c = (2α_c − 1)/(α_c − 1)`.
//! The paper's Jensen step (eqs. 8–9) and convexity in the second argument
//! (eqs. 10–12) then give, for ensembles of m ≥ 2 and m − 1 members,
//!
//! `ε(α; m) = log((m − 1 + e^{(α−1)·c·b})/m)/(α − 1)`   (both directions).
//!
//! One member against none (the output is p₀): `Dsym_α(p̄₁, p₀) ≤ b` directly,
//! `ε(α; 1) = b` for α ≤ α_c. Above α_max (m ≥ 2) or above α_c nothing is
//! proven: +∞.
//!
//! # Rounding
//! Every returned value is rounded up: `f64::next_up` after each correctly
//! rounded operation, and two ulps after each `exp`/`ln` call (the platform libm
//! is faithful to within one ulp, not correctly rounded).

use privmix_accountant::{Orders, RdpCurve};

use crate::MechanismError;

fn up(x: f64) -> f64 {
    x.next_up()
}

fn down(x: f64) -> f64 {
    x.next_down()
}

fn up2(x: f64) -> f64 {
    x.next_up().next_up()
}

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
    // α_c² rounded down over (2α_c − 1) rounded up, then rounded down.
    let num = down(alpha_c * alpha_c);
    let den = up(up(2.0 * alpha_c) - 1.0);
    down(num / den)
}

/// `c = (2α_c − 1)/(α_c − 1) = 1 + α_c/(α_c − 1)`, rounded up.
pub fn triangle_coefficient(alpha_c: f64) -> f64 {
    let num = up(up(2.0 * alpha_c) - 1.0);
    let den = down(alpha_c - 1.0);
    up(num / den)
}

/// `ln((m − 1 + eˣ)/m)` rounded up, x ≥ 0, m ≥ 1, stable for large x.
fn ln_mixture_moment_up(x: f64, m: f64) -> f64 {
    if x == f64::INFINITY {
        return f64::INFINITY;
    }
    if x <= 700.0 {
        // ln(1 + (eˣ − 1)/m)
        up2(up(up2(x.exp_m1()) / m).ln_1p())
    } else {
        // x − ln m + ln(1 + (m − 1)e^{−x})
        let tail = up2(up(up2((-x).exp()) * (m - 1.0)).ln_1p());
        up(up(x - down(down(m.ln()))) + tail)
    }
}

/// The proven per-query bound `ε(α; m)` of an ensemble of `members` mixtures
/// (each within b of p₀ at α_c) against the same ensemble with one member
/// removed (see the module docs), rounded up. `members = 0` gives 0 (there is
/// no neighbour with fewer members). b = 0 gives 0 (every λ is 0 or the member
/// equals p₀: the output is p₀ whatever the data).
pub fn pmixed_bound_at(alpha: f64, alpha_c: f64, radius: f64, members: u64) -> f64 {
    if members == 0 || radius == 0.0 {
        return 0.0;
    }
    if members == 1 {
        return if alpha <= alpha_c {
            radius
        } else {
            f64::INFINITY
        };
    }
    if alpha > max_accounted_order(alpha_c) {
        return f64::INFINITY;
    }
    let am1_hi = up(alpha - 1.0);
    let am1_lo = down(alpha - 1.0).max(f64::MIN_POSITIVE);
    let cb = up(triangle_coefficient(alpha_c) * radius);
    let x = up(am1_hi * cb);
    let m = members as f64; // exact for m < 2^53; larger m only lowers the bound
    up(ln_mixture_moment_up(x, m) / am1_lo)
}

/// The worst case of [`pmixed_bound_at`] over every pair of neighbouring
/// ensembles with at least `members` members in the larger one: ε(α; max(m, 2)).
///
/// Why max(m, 2): under add/remove-one adjacency an ensemble of one member also
/// neighbours one of two members, and that pair costs ε(α; 2) ≥ b (c ≥ 2 and
/// `(1 + e^{2x})/2 ≥ eˣ`), more than the one-vs-none pair. ε(α; m) is
/// non-increasing in m ≥ 2, so ε(α; max(m, 2)) covers the removal (m vs m − 1)
/// and the addition (m + 1 vs m) neighbours of an m-member ensemble.
pub fn pmixed_worst_neighbour_at(alpha: f64, alpha_c: f64, radius: f64, members: u64) -> f64 {
    pmixed_bound_at(alpha, alpha_c, radius, members.max(2))
}

/// PMixED's per-query RDP curve, computed once per configuration.
///
/// * `q = 1`: every member is used; the charge is ε(α; max(N, 2))
///   ([`pmixed_worst_neighbour_at`]).
/// * `0 < q < 1`: members are Poisson-subsampled, so the base mechanism runs
///   on ensembles of every size (including the pair 2 vs 1 members); its curve
///   is ε(α; 2) = max over sizes, amplified by
///   [`RdpCurve::poisson_subsampled`] (Zhu & Wang 2019, tight, integer orders;
///   adapmixed Thm A.4). The base curve is evaluated at the account's orders
///   and at every integer 2..=⌊α_max⌋, so the amplification reads exact base
///   values at every integer order it needs; orders whose base is +∞ stay +∞.
/// * `q = 0`: no member is ever used: the zero curve.
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
    if q == 0.0 {
        return Ok(RdpCurve::zero(orders.clone()));
    }
    if q == 1.0 {
        return Ok(RdpCurve::from_fn(orders.clone(), |a| {
            pmixed_worst_neighbour_at(a, alpha_c, radius, members)
        })?);
    }
    let alpha_max = max_accounted_order(alpha_c);
    let mut augmented = orders.as_slice().to_vec();
    let top = alpha_max.floor().min(16_384.0) as u32;
    augmented.extend((2..=top).map(f64::from));
    let augmented = Orders::new(augmented)?;
    let base = RdpCurve::from_fn(augmented, |a| pmixed_bound_at(a, alpha_c, radius, 2))?;
    let amplified = base.poisson_subsampled(q)?;
    let values = orders
        .as_slice()
        .iter()
        .map(|&a| amplified.at(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RdpCurve::new(orders.clone(), values)?)
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
    fn bound_matches_formula_and_is_ordered() {
        let (ac, b): (f64, f64) = (36.0, 0.05);
        let c: f64 = 71.0 / 35.0;
        for m in 2..6u64 {
            let a: f64 = 8.0;
            let exact = ((m as f64 - 1.0 + ((a - 1.0) * c * b).exp()) / m as f64).ln() / (a - 1.0);
            let got = pmixed_bound_at(a, ac, b, m);
            assert!(
                got >= exact && got <= exact * (1.0 + 1e-13),
                "{got} {exact}"
            );
        }
        // ε(α;2) ≥ b ≥ ε-at-1 and non-increasing in m.
        assert!(pmixed_bound_at(4.0, ac, b, 2) >= b);
        assert!(pmixed_bound_at(4.0, ac, b, 3) <= pmixed_bound_at(4.0, ac, b, 2));
        assert_eq!(pmixed_bound_at(4.0, ac, b, 1), b);
        assert_eq!(pmixed_bound_at(19.0, ac, b, 3), f64::INFINITY);
        assert_eq!(pmixed_bound_at(36.0, ac, b, 1), b);
        assert_eq!(pmixed_bound_at(37.0, ac, b, 1), f64::INFINITY);
        assert_eq!(pmixed_bound_at(4.0, ac, 0.0, 3), 0.0);
        // Huge exponents stay finite and ≈ c·b.
        // α_c = 3: c = 5/2, α_max = 9/5; at α = 3/2, ε = 2.5e4 − 2·ln 2 (to 1e-12).
        let big = pmixed_bound_at(1.5, 3.0, 1e4, 2);
        let expect = 2.5e4 - 2.0 * 2f64.ln();
        assert!(big >= expect && big <= expect + 1e-8, "{big}");
    }

    #[test]
    fn subsampled_curve_is_finite_below_alpha_max_and_infinite_above() {
        let orders = Orders::dp_accounting_default();
        let curve = pmixed_curve(&orders, 36.0, 0.05, 100, 0.1).unwrap();
        let full = pmixed_curve(&orders, 36.0, 0.05, 2, 1.0).unwrap();
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
        assert!(curve.at(2.0).unwrap() < 0.2 * full.at(2.0).unwrap());
        assert_eq!(
            pmixed_curve(&orders, 36.0, 0.05, 4, 0.0).unwrap(),
            RdpCurve::zero(orders.clone())
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
