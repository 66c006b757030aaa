//! AdaPMixED steps: decisions, reproducibility, refusals and extreme inputs.

use privmix_accountant::{Budget, Orders};
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
    // The charge is then the screening cost plus (essentially) nothing.
    let mut acc = Unbudgeted::new(orders());
    let out = mech
        .step(&e, &mut PrivacyRng::from_seed(1), &mut acc)
        .unwrap();
    let screening = (1e-4f64 / (4.0 * 1e-2)).powi(2) * 18.0;
    assert!(out.charge.at(18.0).unwrap() < screening + 1e-8);
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
    // Only the screening cost: (λ/(Nσ))²·α.
    let expect = (1e-4f64 / (3.0 * 0.5)).powi(2) * 18.0;
    let got = out.charge.at(18.0).unwrap();
    assert!(got >= expect && got <= expect * (1.0 + 1e-12));
    let mut private = Adapmixed::new(always_private()).unwrap();
    let out = private.step(&e, &mut rng, &mut acc).unwrap();
    assert_eq!(out.diagnostics.public_reason, None);
    assert_eq!(out.diagnostics.lambdas.len(), 3);
    assert!(out.diagnostics.data_dependent_loss.unwrap() > 0.0);
    // Negative noisy entries are clipped; all-negative answers publicly.
    let s = private.screening_vector(&e).unwrap();
    let d = private.screen(&e, &s, &[-1.0; 4]).unwrap();
    assert!(!d.answer_privately && d.divergence == f64::INFINITY);
    let d = private.screen(&e, &s, &[0.0; 4]).unwrap();
    assert!(d.answer_privately && d.divergence.is_finite());
    assert!(private.screen(&e, &s, &[0.0; 3]).is_err());
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
        data_dependent_orders: Some(vec![]),
        ..d()
    }));
    assert!(bad(AdapmixedConfig {
        data_dependent_orders: Some(vec![1.0]),
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
    let one = Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5]).unwrap();
    assert!(matches!(
        mech.step(&one, &mut rng, &mut acc),
        Err(MechanismError::InvalidParameter {
            name: "members",
            ..
        })
    ));
}

#[test]
fn listed_data_dependent_orders_carry_down_by_monotonicity() {
    let e = ensemble();
    let orders = orders();
    let mut every = Adapmixed::new(always_private()).unwrap();
    let mut listed = Adapmixed::new(AdapmixedConfig {
        data_dependent_orders: Some(vec![18.0]),
        ..always_private()
    })
    .unwrap();
    let a = every.private_answer(&e).unwrap();
    let c_every = every.private_charge(&e, &a, &orders).unwrap();
    let c_listed = listed.private_charge(&e, &a, &orders).unwrap();
    for (&o, (&x, &y)) in orders
        .as_slice()
        .iter()
        .zip(c_every.epsilons().iter().zip(c_listed.epsilons()))
    {
        assert!(y >= x, "order {o}: a carried value can only be larger");
    }
    assert_eq!(c_every.at(18.0).unwrap(), c_listed.at(18.0).unwrap());
}
