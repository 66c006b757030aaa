//! PMixED's charge, checked against EXACT output distributions.
//!
//! For random small ensembles (V ≤ 16, N ≤ 8), the token distribution of PMixED
//! is computed exactly — Poisson subsampling integrated out by enumerating all
//! 2^N subsets with their probabilities — on the dataset and on every
//! changed-member neighbour (member i replaced by the public model or by another
//! member's distribution), and `Dsym_α` between them (privmix-renyi, f64) must
//! not exceed the charged ε(α) at every order where the charge is finite. The
//! only slack allowed is a relative 1e-12 on the computed divergence, for the
//! divergence kernel's own f64 rounding (its documented relative error is a
//! few times 1e-15 at these sizes).

use privmix_accountant::Orders;
use privmix_mechanisms::exact::pmixed_exact_output;
use privmix_mechanisms::{Ensemble, Pmixed, PmixedConfig};
use privmix_renyi::{Order, symmetric_divergence};
use proptest::prelude::*;

const ORDERS: [f64; 14] = [
    1.1, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 18.0, 24.0, 32.0, 48.0, 64.0,
];

/// A distribution with a chosen shape: flat-ish, peaked, with exact zeros, or
/// with 1e-300 entries.
fn distribution(v: usize) -> impl Strategy<Value = Vec<f64>> {
    (prop::collection::vec(0.0f64..1.0, v), 0u8..4, 1u32..8).prop_map(|(w, shape, power)| {
        let mut w: Vec<f64> = w.into_iter().map(|x| x.powi(power as i32)).collect();
        match shape {
            1 => w.iter_mut().filter(|x| **x < 0.3).for_each(|x| *x = 0.0),
            2 => w.iter_mut().filter(|x| **x < 0.3).for_each(|x| *x = 1e-300),
            _ => {}
        }
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    })
}

fn ensemble() -> impl Strategy<Value = (Vec<f64>, Vec<f64>, usize)> {
    (2usize..=16, 1usize..=8).prop_flat_map(|(v, n)| {
        (
            distribution(v),
            prop::collection::vec(distribution(v), n).prop_map(|rows| rows.concat()),
            Just(n),
        )
    })
}

fn check(public: &[f64], members: &[f64], alpha_c: f64, radius: f64, q: f64) {
    let e = Ensemble::from_probabilities(public, members).unwrap();
    let mech = Pmixed::new(PmixedConfig::new(alpha_c, radius, q).unwrap());
    let orders = Orders::new(ORDERS.to_vec()).unwrap();
    let curve = mech.config().curve(&orders, e.len() as u64).unwrap();
    let out = pmixed_exact_output(&mech, &e).unwrap();
    let v = e.vocab();
    let mut neighbours = Vec::new();
    for i in 0..e.len() {
        for with in std::iter::once(e.public()).chain((0..e.len()).map(|j| e.member(j))) {
            let mut rows = e.members().to_vec();
            rows[i * v..(i + 1) * v].copy_from_slice(with);
            neighbours.push((i, Ensemble::from_probabilities(e.public(), &rows).unwrap()));
        }
    }
    for (i, neighbour) in neighbours {
        let out_i = pmixed_exact_output(&mech, &neighbour).unwrap();
        for (&alpha, &eps) in ORDERS.iter().zip(curve.epsilons()) {
            assert!(!eps.is_nan());
            if eps == f64::INFINITY {
                continue;
            }
            let d = symmetric_divergence(&out, &out_i, Order::new(alpha).unwrap()).unwrap();
            assert!(
                d * (1.0 - 1e-12) <= eps,
                "α = {alpha}, α_c = {alpha_c}, b = {radius}, q = {q}, N = {}, member {i}: Dsym {d} > charged {eps}",
                e.len()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn exact_outputs_respect_the_charge(
        (public, members, _n) in ensemble(),
        alpha_c in prop::sample::select(vec![1.5, 2.0, 4.0, 8.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.001, 0.01, 0.1, 0.5, 2.0, 8.0]),
        q in prop::sample::select(vec![1.0, 0.9, 0.5, 0.1]),
    ) {
        check(&public, &members, alpha_c, radius, q);
    }
}

#[test]
fn identical_members_cost_nothing_observable_and_one_hot_inputs_stay_finite() {
    // Members equal to p₀: λ = 1, output p₀ on every neighbour, Dsym = 0.
    let p0 = [0.25, 0.25, 0.5];
    check(&p0, &p0.repeat(3), 4.0, 0.1, 0.5);
    // One-hot members and 1e-300 entries never give NaN.
    let public = [1e-300, 1.0 - 2e-300, 1e-300];
    let members = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0];
    check(&public, &members, 8.0, 0.5, 1.0);
    check(&public, &members, 8.0, 0.5, 0.3);
    let e = Ensemble::from_probabilities(&public, &members).unwrap();
    let mech = Pmixed::new(PmixedConfig::new(8.0, 0.5, 1.0).unwrap());
    let out = mech.output_distribution(&e, &[0, 1, 2]).unwrap();
    assert!(out.distribution.iter().all(|x| x.is_finite() && *x >= 0.0));
    assert!(out.solutions.iter().all(|s| s.lambda.is_finite()));
}
