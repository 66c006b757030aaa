//! Property tests: the algebra of curves, amplification and conversion.

use privmix_accountant::{
    AccountantError, Budget, Orders, REL_TOL, RdpCurve, dps_mozo_beta, dps_mozo_total, pmixed_beta,
    pmixed_query, pmixed_subsampled, poisson_subsampled_gaussian, without_replacement_gaussian,
};
use proptest::prelude::*;

/// A mixed set of fractional and integer orders, small enough for quick cases.
fn orders() -> Orders {
    Orders::new(vec![
        1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.5, 8.0, 12.0, 16.0, 32.0,
    ])
    .unwrap()
}

/// Non-decreasing curves (as every true RDP curve is), with values spanning
/// several magnitudes.
fn curve() -> impl Strategy<Value = RdpCurve> {
    (
        1e-4f64..1.0,
        0.0f64..2.0,
        prop::collection::vec(0.0f64..1.0, 11),
    )
        .prop_map(|(scale, power, jitter)| {
            let o = orders();
            let mut acc = 0.0f64;
            let values = o
                .as_slice()
                .iter()
                .zip(jitter)
                .map(|(&a, j)| {
                    acc = acc.max(scale * a.powf(power) * (1.0 + j));
                    acc
                })
                .collect();
            RdpCurve::new(o, values).unwrap()
        })
}

proptest! {
    #[test]
    fn composition_is_additive_and_rounds_up(a in curve(), b in curve()) {
        let c = a.compose(&b).unwrap();
        for ((x, y), z) in a.epsilons().iter().zip(b.epsilons()).zip(c.epsilons()) {
            prop_assert!(*z >= x + y);
            prop_assert!(*z <= (x + y) * (1.0 + 4.0 * f64::EPSILON));
        }
        // Commutative, and self-composition is repeated composition.
        prop_assert_eq!(&c, &b.compose(&a).unwrap());
        let three = a.compose(&a).unwrap().compose(&a).unwrap();
        for (s, t) in a.self_compose(3).epsilons().iter().zip(three.epsilons()) {
            prop_assert!((s - t).abs() <= 8.0 * f64::EPSILON * t);
        }
    }

    #[test]
    fn subsampling_never_hurts(base in curve(), q in 0.0f64..=1.0) {
        let p = base.poisson_subsampled(q).unwrap();
        let w = base.sampled_without_replacement(q).unwrap();
        for ((b, x), y) in base.epsilons().iter().zip(p.epsilons()).zip(w.epsilons()) {
            prop_assert!(x <= b && y <= b);
            prop_assert!(*x >= 0.0 && *y >= 0.0);
        }
    }

    #[test]
    fn subsampling_is_non_decreasing_in_q(base in curve(), q1 in 0.0f64..=1.0, q2 in 0.0f64..=1.0) {
        let (lo, hi) = if q1 <= q2 { (q1, q2) } else { (q2, q1) };
        let (pl, ph) = (base.poisson_subsampled(lo).unwrap(), base.poisson_subsampled(hi).unwrap());
        let (wl, wh) = (
            base.sampled_without_replacement(lo).unwrap(),
            base.sampled_without_replacement(hi).unwrap(),
        );
        for i in 0..base.epsilons().len() {
            prop_assert!(pl.epsilons()[i] <= ph.epsilons()[i] * (1.0 + 1e-12) + 1e-300);
            prop_assert!(wl.epsilons()[i] <= wh.epsilons()[i] * (1.0 + 1e-12) + 1e-300);
        }
    }

    #[test]
    fn subsampled_gaussian_is_below_the_gaussian_and_monotone_in_q(
        sigma in 0.3f64..20.0, q1 in 0.0f64..=1.0, q2 in 0.0f64..=1.0,
    ) {
        let (lo, hi) = if q1 <= q2 { (q1, q2) } else { (q2, q1) };
        let o = orders();
        let full = poisson_subsampled_gaussian(&o, 1.0, sigma).unwrap();
        let (a, b) = (
            poisson_subsampled_gaussian(&o, lo, sigma).unwrap(),
            poisson_subsampled_gaussian(&o, hi, sigma).unwrap(),
        );
        let w = without_replacement_gaussian(&o, hi, sigma).unwrap();
        for i in 0..o.len() {
            prop_assert!(b.epsilons()[i] <= full.epsilons()[i]);
            prop_assert!(w.epsilons()[i] <= full.epsilons()[i]);
            // Bounds carry ~1e-15 absolute slack in ln A; allow it.
            prop_assert!(a.epsilons()[i] <= b.epsilons()[i] * (1.0 + 1e-9) + 1e-13);
        }
    }

    #[test]
    fn epsilon_and_delta_invert_each_other(base in curve(), log_delta in -30.0f64..-0.1) {
        let delta = log_delta.exp();
        let e = base.epsilon(delta).unwrap();
        prop_assert!(e.epsilon >= 0.0);
        let back = base.delta_with_order(e.epsilon).unwrap();
        // Rounding is upward on both legs: δ comes back at most a hair above.
        prop_assert!(back.delta <= delta * (1.0 + 1e-9), "{} > {}", back.delta, delta);
        if e.epsilon > 0.0 {
            prop_assert!(back.delta >= delta * (1.0 - 1e-6), "{} ≪ {}", back.delta, delta);
        }
        // And the other way: ε(δ(ε)) ≤ ε up to rounding.
        let eps = e.epsilon + 0.5;
        let d = base.delta(eps).unwrap();
        if d > 0.0 && d < 1.0 {
            prop_assert!(base.epsilon(d).unwrap().epsilon <= eps * (1.0 + 1e-9) + 1e-12);
        }
    }

    #[test]
    fn a_budget_never_overspends(charges in prop::collection::vec(curve(), 1..12), limit in 0.1f64..20.0) {
        let mut b = Budget::new(orders(), limit, 1e-6).unwrap();
        for c in &charges {
            let before = b.clone();
            match b.try_charge(c) {
                Ok(spent) => prop_assert!(spent.epsilon <= limit),
                Err(AccountantError::BudgetExceeded { .. }) => prop_assert_eq!(&b, &before),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
            prop_assert!(b.spent_epsilon(1e-6).unwrap().epsilon <= limit);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn pmixed_beta_is_feasible_and_maximal(
        alpha in 1.5f64..64.0, members in 1u64..200, budget in 1e-4f64..2.0,
    ) {
        let o = Orders::new(vec![alpha]).unwrap();
        let beta = pmixed_beta(alpha, members, 1.0, budget).unwrap();
        let cost = |b: f64| pmixed_query(&o, b, members).unwrap().epsilons()[0];
        prop_assert!(cost(beta) <= budget);
        prop_assert!(cost(beta * (1.0 + 2.0 * REL_TOL)) > budget);
    }

    #[test]
    fn subsampled_pmixed_beta_is_feasible_and_maximal(
        alpha in 2u32..24, q in 0.01f64..0.9, budget in 1e-3f64..1.0,
    ) {
        let alpha = f64::from(alpha);
        let o = Orders::new(vec![alpha]).unwrap();
        let beta = pmixed_beta(alpha, 8, q, budget).unwrap();
        let cost = |b: f64| pmixed_subsampled(&o, b, q).unwrap().epsilons()[0];
        prop_assert!(cost(beta) <= budget);
        prop_assert!(cost(beta * (1.0 + 2.0 * REL_TOL)) > budget);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn dps_mozo_beta_is_feasible_and_maximal(
        epsilon in 0.5f64..8.0, tokens in 1u64..5_000, shots in 1u64..8,
    ) {
        let o = Orders::new(vec![1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0]).unwrap();
        let (delta, dataset) = (1e-5, 1_000u64);
        let beta = dps_mozo_beta(&o, epsilon, delta, tokens, shots, dataset).unwrap();
        let q = shots as f64 / dataset as f64;
        let eps = |b: f64| dps_mozo_total(&o, b, q, tokens).unwrap().epsilon(delta).unwrap().epsilon;
        prop_assert!(eps(beta) <= epsilon);
        prop_assert!(eps(beta * (1.0 + 2.0 * REL_TOL)) > epsilon);
    }
}

proptest! {
    /// Laplace and randomized response: 0 ≤ ε(α) ≤ the pure-DP value,
    /// non-decreasing in the order (as every Rényi divergence is), and a
    /// larger scale (a smaller ε) never costs more.
    #[test]
    fn laplace_and_randomized_response_curves_are_ordered(
        b in 0.01f64..100.0,
        eps in 0.0f64..10.0,
        k in 2u64..1000,
        more in 1.0f64..4.0,
    ) {
        let o = orders();
        let lap = privmix_accountant::laplace(&o, b).unwrap();
        let lap_wider = privmix_accountant::laplace(&o, b * more).unwrap();
        let rr = privmix_accountant::randomized_response(&o, eps, k).unwrap();
        let rr_tighter = privmix_accountant::randomized_response(&o, eps / more, k).unwrap();
        for c in [&lap, &rr] {
            prop_assert!(c.epsilons().windows(2).all(|w| w[0] <= w[1] * (1.0 + 1e-12) + 1e-15));
        }
        prop_assert!(lap.epsilons().iter().all(|&e| (0.0..=1.0 / b * (1.0 + 1e-15)).contains(&e)));
        prop_assert!(rr.epsilons().iter().all(|&e| (0.0..=eps).contains(&e)));
        for (w, n) in lap_wider.epsilons().iter().zip(lap.epsilons()) {
            prop_assert!(*w <= n * (1.0 + 1e-12) + 1e-15);
        }
        for (t, n) in rr_tighter.epsilons().iter().zip(rr.epsilons()) {
            prop_assert!(*t <= n * (1.0 + 1e-12) + 1e-15);
        }
    }

    /// An event's sampled curve never exceeds its unsampled one, and a
    /// self-composed event costs exactly the scaled curve.
    #[test]
    fn sampled_events_never_cost_more(
        b in 0.05f64..20.0,
        q in 0.0f64..1.0,
        count in 0u64..1000,
    ) {
        use privmix_accountant::DpEvent;
        let o = orders();
        let leaf = DpEvent::laplace(b).unwrap();
        let plain = leaf.rdp(&o).unwrap();
        let sampled = leaf.clone().poisson_sampled(q).unwrap().rdp(&o).unwrap();
        for (s, p) in sampled.epsilons().iter().zip(plain.epsilons()) {
            prop_assert!(s <= p);
        }
        let repeated = leaf.self_composed(count).unwrap().rdp(&o).unwrap();
        prop_assert_eq!(repeated, plain.self_compose(count));
    }
}
