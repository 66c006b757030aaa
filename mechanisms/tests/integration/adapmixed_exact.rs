//! AdaPMixED's parts, checked against exact computations on small ensembles (the
//! whole mechanism is checked by the transcript verifier, `verify_adapmixed.rs`).
//!
//! (a) The screening vector's L2 sensitivity between D and every changed-member
//!     neighbour is at most √2·λ_s/N — the premise of the Gaussian screening cost.
//! (b) The private answer is PMixED over every member.
//! (c) The paper's data-dependent loss (running sum; reported, never charged) equals
//!     a brute-force recomputation from rebuilt averages.
//! Slack: a relative 1e-12 for f64 rounding of the computed norm/divergence.

use privmix_accountant::Orders;
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
            // Member i changed to the public model, and to the last member's rows.
            let mut rows: Vec<f64> = e.members().to_vec();
            let v = e.vocab();
            let last = e.member(e.len() - 1).to_vec();
            rows[i * v..(i + 1) * v].copy_from_slice(&last);
            for d in [e.without_member(i), Ensemble::from_probabilities(e.public(), &rows).unwrap()] {
            let s_d = mech.screening_vector(&d).unwrap();
            let norm = s.values.iter().zip(&s_d.values).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
            let bound_d = 2f64.sqrt() * screen_lambda / d.len() as f64;
            if d.len() == e.len() {
                prop_assert!(norm * (1.0 - 1e-12) <= bound_d, "‖Δ‖₂ = {} > {}", norm, bound_d);
            }
            }
            let d = e.without_member(i);
            let s_i = mech.screening_vector(&d).unwrap();
            prop_assert_eq!(&s.indices, &s_i.indices);
        }
        // The charged screening cost is the Gaussian mechanism at that sensitivity.
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let cost = mech.config().screening_cost(&orders, e.len()).unwrap();
        for (&a, &c) in ORDERS.iter().zip(cost.epsilons()) {
            prop_assert!(c >= a * bound * bound / (2.0 * 1e-4));
        }
    }

    #[test]
    fn private_branch_is_pmixed_and_the_papers_loss_matches_brute_force(
        e in ensemble(),
        alpha_c in prop::sample::select(vec![2.0, 4.0, 8.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.01, 0.1, 0.5, 3.6]),
    ) {
        let mut mech = Adapmixed::new(config(alpha_c, radius, 60, 1e-4)).unwrap();
        let answer = mech.private_answer(&e).unwrap();
        prop_assert_eq!(&answer.distribution, &private_output(&e, alpha_c, radius));
        let losses = mech.data_dependent_losses(&e, &answer, &ORDERS).unwrap();
        for (k, &a) in ORDERS.iter().enumerate() {
            let order = Order::new(a).unwrap();
            let mut brute = 0.0f64;
            for i in 0..e.len() {
                let out_i = private_output(&e.without_member(i), alpha_c, radius);
                let d = symmetric_divergence(&answer.distribution, &out_i, order).unwrap();
                brute = brute.max(d);
            }
            let got = losses[k];
            prop_assert!(
                (got - brute).abs() <= 1e-9 * brute + 1e-13 || got == brute,
                "α {}: running-sum loss {} vs brute force {}", a, got, brute
            );
        }
    }
}
