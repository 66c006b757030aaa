//! AdaPMixED steps: decisions, reproducibility, refusals and extreme inputs.

use privmix_accountant::{Budget, Orders, RdpCurve};
use privmix_mechanisms::baselines::PublicOnly;
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng,
    PublicReason, Unbudgeted,
};

fn orders() -> Orders {
    Orders::new(vec![2.0, 4.0, 8.0, 18.0, 32.0]).unwrap()
}

fn ensemble() -> Ensemble {
    Ensemble::from_probabilities(
        &[0.4, 0.3, 0.2, 0.1],
        &[
            0.1, 0.2, 0.3, 0.4, //
            0.4, 0.3, 0.2, 0.1, //
            0.7, 0.1, 0.1, 0.1, //
        ],
    )
    .unwrap()
}

fn always_private() -> AdapmixedConfig {
    AdapmixedConfig {
        threshold: f64::INFINITY,
        ..AdapmixedConfig::default()
    }
}

#[test]
fn identical_members_get_lambda_one_and_no_data_dependent_loss() {
    let m = [0.35, 0.3, 0.2, 0.15];
    let e = Ensemble::from_probabilities(&[0.4, 0.3, 0.2, 0.1], &m.repeat(4)).unwrap();
    let mut mech = Adapmixed::new(always_private()).unwrap();
    let answer = mech.private_answer(&e).unwrap();
    assert!(answer.solutions.iter().all(|s| s.lambda == 1.0));
    let losses = mech
        .data_dependent_losses(&e, &answer, &[2.0, 18.0])
        .unwrap();
    assert!(losses.iter().all(|&l| l <= 1e-14), "{losses:?}");
}

#[test]
fn the_charge_is_the_same_on_corpora_that_differ_in_one_member() {
    // Finding: with p₀ = [.5, .5], A = [.9, .1], B = p₀, the paper's per-token charge
    // is 0.2694 at α = 18 on {A, B, B} and exactly 0 on {B, B} (its leave-one-out loss
    // is 0): the printed ε told the corpora apart. Now a query's charge depends on N,
    // the configuration and the number of queries charged before it only.
    let p0 = [0.5, 0.5];
    let a = [0.9, 0.1];
    let with_a = Ensemble::from_probabilities(&p0, &[a, p0, p0].concat()).unwrap();
    let without = Ensemble::from_probabilities(&p0, &[p0, p0, p0].concat()).unwrap();
    let paper = {
        let mut m = Adapmixed::new(always_private()).unwrap();
        let ans = m.private_answer(&with_a).unwrap();
        m.data_dependent_losses(&with_a, &ans, &[18.0]).unwrap()[0]
    };
    assert!((paper - 0.2694).abs() < 1e-3, "{paper}");
    let charges = |e: &Ensemble| {
        let mut m = Adapmixed::new(always_private()).unwrap();
        let mut acc = Unbudgeted::new(orders());
        let mut rng = PrivacyRng::from_seed(9);
        (0..5)
            .map(|_| m.step(e, &mut rng, &mut acc).unwrap().charge)
            .collect::<Vec<_>>()
    };
    assert_eq!(charges(&with_a), charges(&without));
}

#[test]
fn same_seed_same_tokens_and_charges() {
    let e = ensemble();
    let run = |seed| {
        let mut mech = Adapmixed::new(AdapmixedConfig::default()).unwrap();
        let mut acc = Unbudgeted::new(orders());
        let mut rng = PrivacyRng::from_seed(seed);
        (0..30)
            .map(|_| mech.step(&e, &mut rng, &mut acc).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
}

#[test]
fn screening_routes_by_threshold() {
    let e = ensemble();
    let mut acc = Unbudgeted::new(orders());
    let mut rng = PrivacyRng::from_seed(2);
    let mut public = Adapmixed::new(AdapmixedConfig {
        threshold: 0.0,
        sigma: 0.5,
        ..AdapmixedConfig::default()
    })
    .unwrap();
    let out = public.step(&e, &mut rng, &mut acc).unwrap();
    assert_eq!(out.diagnostics.public_reason, Some(PublicReason::Screened));
    // A screened query charges what a private one does: the charge is taken before
    // the screening, so its size cannot follow the decision (issue 39, §2).
    let screened = out.charge.at(2.0).unwrap();
    assert!(screened > 0.0);
    let mut private = Adapmixed::new(AdapmixedConfig {
        sigma: 0.5,
        ..always_private()
    })
    .unwrap();
    let mut acc = Unbudgeted::new(orders());
    let out = private.step(&e, &mut rng, &mut acc).unwrap();
    assert_eq!(out.diagnostics.public_reason, None);
    assert_eq!(out.diagnostics.lambdas.len(), 3);
    assert_eq!(out.charge.at(2.0).unwrap(), screened);
    // Negative noisy entries are clipped; all-negative answers publicly.
    let s = private.screening_vector(&e).unwrap();
    let d = private.decide(&e, &s.indices, &[-1.0; 4]).unwrap();
    assert!(!d.answer_privately && d.divergence == f64::INFINITY);
    let d = private.decide(&e, &s.indices, &s.values).unwrap();
    assert!(d.answer_privately && d.divergence.is_finite());
    assert!(private.decide(&e, &s.indices, &[0.0; 3]).is_err());
}

#[test]
fn exhausted_budget_refuses_and_the_driver_falls_back_to_the_public_model() {
    let e = ensemble();
    let mut rng = PrivacyRng::from_seed(3);
    let mut mech = Adapmixed::new(always_private()).unwrap();
    let mut budget = Budget::new(orders(), 0.5, 1e-5).unwrap();
    let mut accepted = 0;
    let refused = loop {
        let before = budget.clone();
        match mech.step(&e, &mut rng, &mut budget) {
            Ok(_) => accepted += 1,
            Err(MechanismError::ChargeRefused(msg)) => {
                assert_eq!(budget, before, "a refused charge changes nothing");
                break msg;
            }
            Err(other) => panic!("{other}"),
        }
        assert!(accepted < 10_000);
    };
    assert!(!refused.is_empty());
    let fallback = PublicOnly.step(&e, &mut rng, &mut budget).unwrap();
    assert_eq!(
        fallback.diagnostics.public_reason,
        Some(PublicReason::PublicOnly)
    );
    assert!(budget.spent_epsilon(1e-5).unwrap().epsilon <= 0.5);
}

#[test]
fn one_hot_and_tiny_inputs_never_give_nan() {
    let e = Ensemble::from_probabilities(
        &[1e-300, 1.0 - 2e-300, 1e-300],
        &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1e-300, 1.0 - 1e-300, 0.0],
    )
    .unwrap();
    let mut mech = Adapmixed::new(always_private()).unwrap();
    let mut acc = Unbudgeted::new(orders());
    let mut rng = PrivacyRng::from_seed(4);
    for _ in 0..20 {
        let out = mech.step(&e, &mut rng, &mut acc).unwrap();
        assert!(out.charge.epsilons().iter().all(|x| !x.is_nan()));
        assert!(out.diagnostics.lambdas.iter().all(|l| l.is_finite()));
    }
}

#[test]
fn bad_configurations_and_ensembles_are_typed_errors() {
    let bad = |c: AdapmixedConfig| Adapmixed::new(c).is_err();
    let d = AdapmixedConfig::default;
    assert!(bad(AdapmixedConfig {
        alpha_c: 1.0,
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        radius: -1.0,
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        screen_order: 0.5,
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        screen_lambda: 2.0,
        ..d()
    }));
    assert!(bad(AdapmixedConfig { sigma: 0.0, ..d() }));
    assert!(bad(AdapmixedConfig {
        threshold: f64::NAN,
        ..d()
    }));
    assert!(bad(AdapmixedConfig { top_k: 0, ..d() }));
    assert!(bad(AdapmixedConfig {
        tracked_orders: Some(vec![]),
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        tracked_orders: Some(vec![1.0]),
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        tracked_orders: Some(vec![2.0, 19.0]),
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        filter_budget: Some(vec![1.0]),
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        screen_granularity: 0.3,
        ..d()
    }));
    let mut mech = Adapmixed::new(d()).unwrap();
    let mut acc = Unbudgeted::new(orders());
    let mut rng = PrivacyRng::from_seed(5);
    let empty = Ensemble::from_probabilities(&[0.5, 0.5], &[]).unwrap();
    assert!(matches!(
        mech.step(&empty, &mut rng, &mut acc),
        Err(MechanismError::EmptyEnsemble)
    ));
    // The ensemble size is fixed for a run.
    let two = Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5, 0.6, 0.4]).unwrap();
    let three = Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5, 0.6, 0.4, 0.1, 0.9]).unwrap();
    mech.step(&two, &mut rng, &mut acc).unwrap();
    assert!(matches!(
        mech.step(&three, &mut rng, &mut acc),
        Err(MechanismError::InvalidParameter {
            name: "members",
            ..
        })
    ));
}

#[test]
fn the_filter_bounds_the_whole_run_and_members_far_from_p0_leave() {
    let e = ensemble();
    let config = always_private()
        .with_calibrated_filter(2.0, 1e-5, 3, &orders())
        .unwrap();
    let mut mech = Adapmixed::new(config).unwrap();
    let mut acc = Unbudgeted::new(orders());
    let mut rng = PrivacyRng::from_seed(7);
    for _ in 0..400 {
        mech.step(&e, &mut rng, &mut acc).unwrap();
    }
    // However many queries, the account stays within the calibrated (ε, δ).
    let spent = acc.spent().epsilon(1e-5).unwrap().epsilon;
    assert!(spent <= 2.0 + 1e-9, "{spent}");
    // Member 2 ([.7, .1, .1, .1]) is the farthest from p₀ and leaves first.
    let active = mech.active_members().unwrap().to_vec();
    assert!(!active[2], "{active:?}");
}

/// After a spent curve the filter fits what is left: the spent curve composed
/// with the whole run stays within ε at δ, however many queries the run answers;
/// a filter calibrated to the whole budget, ignoring what was spent, overruns it.
#[test]
fn the_filter_after_a_spent_curve_fits_the_composition() {
    let e = ensemble();
    // What earlier runs spent: about ε = 1.6 of 2 at δ = 1e-5.
    let spent = RdpCurve::from_fn(orders(), |a| a / 20.0).unwrap();
    let before = spent.epsilon(1e-5).unwrap().epsilon;
    assert!(before > 1.0 && before < 2.0, "{before}");
    let run = |config: AdapmixedConfig| {
        let mut mech = Adapmixed::new(config).unwrap();
        let mut account = Unbudgeted::new(orders());
        let mut rng = PrivacyRng::from_seed(11);
        for _ in 0..400 {
            mech.step(&e, &mut rng, &mut account).unwrap();
        }
        spent
            .compose(account.spent())
            .unwrap()
            .epsilon(1e-5)
            .unwrap()
            .epsilon
    };
    let after = always_private()
        .with_calibrated_filter_after(&spent, 2.0, 1e-5, 3)
        .unwrap();
    let total = run(after);
    assert!(total <= 2.0 && total > before, "{total}");
    let whole = always_private()
        .with_calibrated_filter(2.0, 1e-5, 3, &orders())
        .unwrap();
    let overrun = run(whole);
    assert!(overrun > 2.0, "{overrun}");
    // The whole budget already spent: refused.
    let all = spent.self_compose(10);
    assert!(
        always_private()
            .with_calibrated_filter_after(&all, 2.0, 1e-5, 3)
            .is_err()
    );
}
