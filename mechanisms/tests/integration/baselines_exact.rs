//! Baselines: charges checked against exact divergences of what they release.
//!
//! * Subsample-and-aggregate releases the average rounded to a grid plus
//!   i.i.d. discrete Laplace noise: the released integer vector is ε-DP with ε
//!   the L1 distance of the two rounded averages (grid units) over the scale;
//!   that ε, for removal neighbours, must be within the charged sensitivity,
//!   and the charge at each order at least the pure-DP bound's floor (the
//!   exact token laws are checked in `verify_noise_baselines.rs`).
//! * GNMax releases an argmax of a discrete-Gaussian-noised vote histogram: the
//!   histogram's divergence is at most `α‖Δ‖²/(2σ²)` (integer shifts);
//!   checked for removal and replacement neighbours.

use privmix_accountant::{Budget, Orders, RdpCurve};
use privmix_mechanisms::baselines::{
    Gnmax, NonPrivateEnsemble, PublicOnly, SubsampleAggregateLaplace, laplace_rdp_at,
};
use privmix_mechanisms::{
    Account, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, Unbudgeted,
};
use proptest::prelude::*;

const ORDERS: [f64; 8] = [1.1, 1.5, 2.0, 4.0, 8.0, 18.0, 64.0, 256.0];

fn distribution(v: usize) -> impl Strategy<Value = Vec<f64>> {
    (prop::collection::vec(0.0f64..1.0, v), 1u32..10).prop_map(|(w, p)| {
        let mut w: Vec<f64> = w.into_iter().map(|x| x.powi(p as i32)).collect();
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    })
}

fn ensemble_and_replacement() -> impl Strategy<Value = (Ensemble, Vec<f64>)> {
    (2usize..=16, 1usize..=8).prop_flat_map(|(v, n)| {
        (
            distribution(v),
            prop::collection::vec(distribution(v), n),
            distribution(v),
        )
            .prop_map(|(p0, rows, other)| {
                (
                    Ensemble::from_probabilities(&p0, &rows.concat()).unwrap(),
                    other,
                )
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn laplace_release_sensitivity_is_within_the_charge(
        (e, _) in ensemble_and_replacement(),
        scale in prop::sample::select(vec![0.01, 0.1, 1.0, 10.0]),
    ) {
        let mech = SubsampleAggregateLaplace::new(scale).unwrap();
        let g = mech.granularity();
        let charged = mech.sensitivity(e.len(), e.vocab()).unwrap();
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let curve = mech.curve(&orders, e.len(), e.vocab()).unwrap();
        let grid = |d: &Ensemble| -> Vec<f64> {
            SubsampleAggregateLaplace::average(d).unwrap().iter().map(|x| (x / g).round()).collect()
        };
        let centre = grid(&e);
        let neighbours: Vec<Ensemble> = if e.len() > 1 {
            (0..e.len()).map(|i| e.without_member(i)).collect()
        } else {
            Vec::new() // a 0-member neighbour has no average to release
        };
        for d in neighbours {
            let l1: f64 = centre.iter().zip(grid(&d)).map(|(x, y)| (x - y).abs()).sum();
            prop_assert!(l1 * g <= charged, "{} > {}", l1 * g, charged);
            // The charge is the pure-DP curve of ε = Δ₁/b, at least the
            // Laplace curve of the same ratio at every order.
            for (&a, &eps) in ORDERS.iter().zip(curve.epsilons()) {
                prop_assert!(laplace_rdp_at(a, l1 * g / scale) <= eps * (1.0 + 1e-12));
            }
        }
    }

    #[test]
    fn gnmax_histogram_sensitivity_is_within_the_charge(
        (e, replacement) in ensemble_and_replacement(),
        sigma in prop::sample::select(vec![0.5, 1.0, 4.0, 40.0]),
    ) {
        let mech = Gnmax::new(sigma).unwrap();
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let curve = mech.curve(&orders).unwrap();
        let h = Gnmax::votes(&e).unwrap();
        let v = e.vocab();
        for i in 0..e.len() {
            // Replace member i by another distribution.
            let mut rows = e.members().to_vec();
            rows[i * v..(i + 1) * v].copy_from_slice(&replacement);
            let swapped = Ensemble::from_probabilities(e.public(), &rows).unwrap();
            let mut neighbours = vec![swapped];
            if e.len() > 1 {
                neighbours.push(e.without_member(i));
            }
            for d in neighbours {
                let h2 = Gnmax::votes(&d).unwrap();
                let sq: f64 = h.iter().zip(&h2).map(|(a, b)| (a - b).powi(2)).sum();
                prop_assert!(sq <= 2.0);
                for (&a, &eps) in ORDERS.iter().zip(curve.epsilons()) {
                    prop_assert!(a * sq / (2.0 * sigma * sigma) <= eps);
                }
            }
        }
    }
}

#[test]
fn charges_are_honest_and_budgets_see_them() {
    let orders = Orders::new(ORDERS.to_vec()).unwrap();
    let e = Ensemble::from_probabilities(&[0.5, 0.5], &[0.9, 0.1, 0.2, 0.8]).unwrap();
    let mut rng = PrivacyRng::from_seed(11);
    let mut budget = Budget::new(orders.clone(), 1.0, 1e-5).unwrap();
    // The non-private ensemble charges +∞: a budget refuses, nothing is released.
    assert!(matches!(
        NonPrivateEnsemble.step(&e, &mut rng, &mut budget),
        Err(MechanismError::ChargeRefused(_))
    ));
    assert_eq!(budget.spent(), &RdpCurve::zero(orders.clone()));
    let mut open = Unbudgeted::new(orders.clone());
    let out = NonPrivateEnsemble.step(&e, &mut rng, &mut open).unwrap();
    assert!(out.charge.epsilons().iter().all(|&x| x == f64::INFINITY));
    // The public model costs nothing.
    let out = PublicOnly.step(&e, &mut rng, &mut budget).unwrap();
    assert!(out.charge.epsilons().iter().all(|&x| x == 0.0));
    // GNMax and Laplace charge their curves through the account.
    let mut g = Gnmax::new(2.0).unwrap();
    let out = g.step(&e, &mut rng, &mut open).unwrap();
    assert_eq!(
        out.charge.at(2.0).unwrap(),
        g.curve(&orders).unwrap().at(2.0).unwrap()
    );
    assert!(out.charge.at(2.0).unwrap() >= 0.5);
    let mut l = SubsampleAggregateLaplace::new(1.0).unwrap();
    let out = l.step(&e, &mut rng, &mut open).unwrap();
    assert!(out.token < 2);
    assert!(
        SubsampleAggregateLaplace::new(1.0)
            .unwrap()
            .curve(&orders, 2, 2)
            .unwrap()
            .at(2.0)
            .unwrap()
            >= 0.5
    );
    assert_eq!(open.orders(), &orders);
}
