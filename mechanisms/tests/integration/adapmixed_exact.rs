//! AdaPMixED's parts, checked against exact computations on small ensembles (the
//! whole mechanism is checked by the transcript verifier, `verify_adapmixed.rs`).
//!
//! (a) The f64 screening vector's L2 sensitivity between D and every changed-member
//!     neighbour is at most the proof's `√2·λ_s(1 + ν)/N + 2E` (its real-arithmetic
//!     √2·λ_s/N enlarged for the rows' masses and the f64 sums; `src/adapmixed/proof.md`,
//!     "Per-step losses against W"), the premise of the charged Gaussian screening cost.
//! (b) The private answer is PMixED over every member.
//! (c) The paper's data-dependent loss (running sum; reported, never charged) equals
//!     a brute-force recomputation from rebuilt averages.
//! (a) computes the norm with upward rounding and compares it with the proven bound
//! without slack; (b) is compared exactly, (c) within a relative 1e-9 (plus 1e-13) for
//! the f64 rounding of the divergences.

use privmix_accountant::Orders;
use privmix_mechanisms::{Adapmixed, AdapmixedConfig, Ensemble, Pmixed, PmixedConfig, bounds};
use privmix_renyi::round::{add_up, div_up, mul_up, sqrt_up, sub_up, usize_down};
use privmix_renyi::{Order, symmetric_divergence};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};

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

/// The L2 distance between two f64 vectors, rounded up.
fn l2_distance_up(a: &[f64], b: &[f64]) -> f64 {
    let squares = a.iter().zip(b).fold(0.0, |acc, (&x, &y)| {
        let d = sub_up(x.max(y), x.min(y));
        add_up(acc, mul_up(d, d))
    });
    sqrt_up(squares)
}

/// The bound `proof.md` ("Per-step losses against W") proves for the f64 screening
/// vectors of two corpora that differ in one member, before the grid rounding:
/// `√2·λ_s(1 + ν)/N + 2E`, with `1 + ν` a bound on each row's exact mass
/// ([`bounds::row_mass_deviation`]) and E the f64 error of the screening sum on each
/// side ([`bounds::screening_sum_error`]), rounded up. This is the sensitivity the
/// screening is charged at, less the grid's `√k·g`.
fn proven_screening_sensitivity(screen_lambda: f64, members: usize, k: usize) -> f64 {
    let exact = div_up(
        mul_up(
            mul_up(sqrt_up(2.0), screen_lambda),
            add_up(1.0, bounds::row_mass_deviation()),
        ),
        usize_down(members),
    );
    add_up(exact, mul_up(2.0, bounds::screening_sum_error(members, k)))
}

/// (a) for one ensemble: every changed-member neighbour's f64 screening vector is
/// within the proven sensitivity, and the charged cost is the Gaussian mechanism's
/// at least at it.
fn check_screening_sensitivity(
    e: &Ensemble,
    top_k: usize,
    screen_lambda: f64,
) -> Result<(), TestCaseError> {
    let mech = Adapmixed::new(config(18.0, 3.6, top_k, screen_lambda)).unwrap();
    let s = mech.screening_vector(e).unwrap();
    let k = s.indices.len();
    let bound = proven_screening_sensitivity(screen_lambda, e.len(), k);
    for i in 0..e.len() {
        // Member i changed to the public model, and to the last member's rows.
        let mut rows: Vec<f64> = e.members().to_vec();
        let v = e.vocab();
        let last = e.member(e.len() - 1).to_vec();
        rows[i * v..(i + 1) * v].copy_from_slice(&last);
        let mut emptied: Vec<f64> = e.members().to_vec();
        emptied[i * v..(i + 1) * v].copy_from_slice(e.public());
        for rows in [emptied, rows] {
            let d = Ensemble::from_probabilities(e.public(), &rows).unwrap();
            let s_d = mech.screening_vector(&d).unwrap();
            prop_assert_eq!(&s.indices, &s_d.indices);
            let norm = l2_distance_up(&s.values, &s_d.values);
            prop_assert!(norm <= bound, "‖Δ‖₂ = {} > {}", norm, bound);
        }
        let d = e.without_member(i);
        let s_i = mech.screening_vector(&d).unwrap();
        prop_assert_eq!(&s.indices, &s_i.indices);
    }
    // The charged screening cost is the Gaussian mechanism at (at least) that
    // sensitivity: α·Δ²/(2σ²), σ = 1e-2.
    let orders = Orders::new(ORDERS.to_vec()).unwrap();
    let cost = mech.config().screening_cost(&orders, e.len()).unwrap();
    for (&a, &c) in ORDERS.iter().zip(cost.epsilons()) {
        prop_assert!(c >= a * bound * bound / (2.0 * 1e-4));
    }
    Ok(())
}

/// Issue 39 §3 item 7: with an unpinned seed, the test's former bound (√2·λ_s/N with a
/// relative 1e-12 slack) failed on this case by 1.6e-12 relative: the f64 screening
/// sums round. The proof's sensitivity is enlarged for that rounding (`1 + ν` and
/// `2E`), and the charge uses the enlarged value, so the excess is charged for.
#[test]
fn the_rounding_excess_is_within_the_charged_screening_sensitivity() {
    let e = Ensemble::from_probabilities(&[1.0, 0.0], &[0.0, 1.0, 0.0, 1.0, 1.0, 0.0]).unwrap();
    let mech = Adapmixed::new(config(18.0, 3.6, 19, 1e-4)).unwrap();
    let s = mech.screening_vector(&e).unwrap();
    let changed =
        Ensemble::from_probabilities(&[1.0, 0.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0]).unwrap();
    let norm = l2_distance_up(&s.values, &mech.screening_vector(&changed).unwrap().values);
    // Past the real-arithmetic √2·λ_s/N ...
    assert!(norm > 2f64.sqrt() * 1e-4 / 3.0, "{norm}");
    // ... and within the proven, charged one.
    assert!(norm <= proven_screening_sensitivity(1e-4, 3, 2), "{norm}");
    check_screening_sensitivity(&e, 19, 1e-4).unwrap();
}

/// The committed regressions beside this file
/// (`adapmixed_exact.proptest-regressions`) are read before new cases.
fn with_regressions(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(cases)
    }
}

proptest! {
    #![proptest_config(with_regressions(128))]

    #[test]
    fn screening_sensitivity_is_at_most_sqrt2_lambda_over_n(
        e in ensemble(),
        top_k in 1usize..20,
        screen_lambda in prop::sample::select(vec![1e-4, 0.01, 0.5, 1.0]),
    ) {
        check_screening_sensitivity(&e, top_k, screen_lambda)?;
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
