//! AdaPMixED's charges, checked against exact computations on small ensembles.
//!
//! (a) The screening vector's L2 sensitivity between D and every neighbour
//!     (one member removed) is at most √2·λ_s/N — the premise of the Gaussian
//!     screening cost. (b) Conditioned on answering privately, Dsym between the
//!     exact outputs on D and on every neighbour is at most the private part of
//!     the charge at every order where it is finite. (c) The data-dependent loss
//!     (running sum) equals a brute-force recomputation from rebuilt averages.
//! Slack: a relative 1e-12 for f64 rounding of the computed norm/divergence.

use privmix_accountant::{Orders, adapmixed_screening};
use privmix_mechanisms::{Adapmixed, AdapmixedConfig, Ensemble, Pmixed, PmixedConfig};
use privmix_renyi::{Order, symmetric_divergence};
use proptest::prelude::*;

const ORDERS: [f64; 10] = [1.1, 1.5, 2.0, 3.0, 4.0, 6.0, 9.0, 12.0, 18.0, 32.0];

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

fn ensemble() -> impl Strategy<Value = Ensemble> {
    (2usize..=16, 2usize..=8).prop_flat_map(|(v, n)| {
        (distribution(v), prop::collection::vec(distribution(v), n))
            .prop_map(|(p0, rows)| Ensemble::from_probabilities(&p0, &rows.concat()).unwrap())
    })
}

fn config(alpha_c: f64, radius: f64, top_k: usize, screen_lambda: f64) -> AdapmixedConfig {
    AdapmixedConfig {
        alpha_c,
        radius,
        top_k,
        screen_lambda,
        ..AdapmixedConfig::default()
    }
}

/// The exact private-branch output on `e` (any N ≥ 1): PMixED with every member.
fn private_output(e: &Ensemble, alpha_c: f64, radius: f64) -> Vec<f64> {
    let all: Vec<usize> = (0..e.len()).collect();
    Pmixed::new(PmixedConfig::new(alpha_c, radius, 1.0).unwrap())
        .output_distribution(e, &all)
        .unwrap()
        .distribution
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn screening_sensitivity_is_at_most_sqrt2_lambda_over_n(
        e in ensemble(),
        top_k in 1usize..20,
        screen_lambda in prop::sample::select(vec![1e-4, 0.01, 0.5, 1.0]),
    ) {
        let mech = Adapmixed::new(config(18.0, 3.6, top_k, screen_lambda)).unwrap();
        let s = mech.screening_vector(&e).unwrap();
        let n = e.len() as f64;
        let bound = 2f64.sqrt() * screen_lambda / n;
        for i in 0..e.len() {
            let d = e.without_member(i);
            let s_i = mech.screening_vector(&d).unwrap();
            prop_assert_eq!(&s.indices, &s_i.indices);
            let norm = s.values.iter().zip(&s_i.values).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
            prop_assert!(norm * (1.0 - 1e-12) <= bound, "‖Δ‖₂ = {} > {}", norm, bound);
        }
        // The charged screening cost is the Gaussian mechanism at that sensitivity.
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let cost = adapmixed_screening(&orders, screen_lambda, e.len() as u64, 1e-2).unwrap();
        for (&a, &c) in ORDERS.iter().zip(cost.epsilons()) {
            prop_assert!(c >= a * bound * bound / (2.0 * 1e-4));
        }
    }

    #[test]
    fn private_branch_respects_its_charge_and_matches_brute_force(
        e in ensemble(),
        alpha_c in prop::sample::select(vec![2.0, 4.0, 8.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.01, 0.1, 0.5, 3.6]),
    ) {
        let mut mech = Adapmixed::new(config(alpha_c, radius, 60, 1e-4)).unwrap();
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let answer = mech.private_answer(&e).unwrap();
        prop_assert_eq!(&answer.distribution, &private_output(&e, alpha_c, radius));
        let charge = mech.private_charge(&e, &answer, &orders).unwrap();
        let losses = mech.data_dependent_losses(&e, &answer, &ORDERS).unwrap();
        for (k, (&a, &eps)) in ORDERS.iter().zip(charge.epsilons()).enumerate() {
            prop_assert!(!eps.is_nan());
            let order = Order::new(a).unwrap();
            let mut brute = 0.0f64;
            for i in 0..e.len() {
                let out_i = private_output(&e.without_member(i), alpha_c, radius);
                let d = symmetric_divergence(&answer.distribution, &out_i, order).unwrap();
                brute = brute.max(d);
                if eps.is_finite() {
                    prop_assert!(d * (1.0 - 1e-12) <= eps, "α {}: Dsym {} > charged {}", a, d, eps);
                }
            }
            let got = losses[k];
            prop_assert!(
                (got - brute).abs() <= 1e-9 * brute + 1e-13 || got == brute,
                "α {}: running-sum loss {} vs brute force {}", a, got, brute
            );
        }
    }
}
