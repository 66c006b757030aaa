use super::*;
use crate::account::Unbudgeted;

fn ensemble() -> Ensemble {
    Ensemble::from_probabilities(
        &[0.5, 0.3, 0.2],
        &[0.1, 0.2, 0.7, 0.6, 0.3, 0.1, 0.5, 0.3, 0.2],
    )
    .unwrap()
}

#[test]
fn identical_members_get_lambda_one_and_public_draws_are_p0() {
    let e = ensemble();
    let p = Pmixed::new(PmixedConfig::new(8.0, 0.1, 1.0).unwrap());
    let out = p.output_distribution(&e, &[2]).unwrap();
    assert_eq!(out.solutions[0].lambda, 1.0);
    assert_eq!(out.distribution, e.public());
    assert_eq!(
        p.output_distribution(&e, &[]).unwrap().distribution,
        e.public()
    );
    assert!(p.output_distribution(&e, &[1, 1]).is_err());
    assert!(p.output_distribution(&e, &[3]).is_err());
}

#[test]
fn step_charges_the_cached_curve_and_is_reproducible() {
    let e = ensemble();
    let orders = Orders::integers(8).unwrap();
    let mut p = Pmixed::new(PmixedConfig::new(8.0, 0.1, 0.5).unwrap());
    let mut acc = Unbudgeted::new(orders.clone());
    let mut r1 = PrivacyRng::from_seed(3);
    let mut r2 = PrivacyRng::from_seed(3);
    let a: Vec<_> = (0..20)
        .map(|_| p.step(&e, &mut r1, &mut acc).unwrap())
        .collect();
    let b: Vec<_> = (0..20)
        .map(|_| p.step(&e, &mut r2, &mut acc).unwrap())
        .collect();
    assert_eq!(a, b);
    assert_eq!(a[0].charge, p.config().curve(&orders, 3).unwrap());
    assert_eq!(acc.charges(), 40);
    let empty = Ensemble::from_probabilities(&[0.5, 0.5], &[]).unwrap();
    assert!(matches!(
        p.step(&empty, &mut r1, &mut acc),
        Err(MechanismError::EmptyEnsemble)
    ));
}

#[test]
fn calibration_returns_a_feasible_radius_that_is_nearly_maximal() {
    let orders = Orders::dp_accounting_default();
    let c = PmixedConfig::calibrate(8.0, 1e-5, 1000, 0.2, 100, 36.0, &orders).unwrap();
    let spent = |b: f64| {
        pmixed_curve(&orders, 36.0, b, 100, 0.2)
            .unwrap()
            .self_compose(1000)
            .epsilon(1e-5)
            .unwrap()
            .epsilon
    };
    assert!(c.radius() > 0.0 && spent(c.radius()) <= 8.0);
    assert!(spent(c.radius() * (1.0 + 1e-8)) > 8.0);
    let high = Orders::new(vec![30.0, 40.0]).unwrap();
    assert!(PmixedConfig::calibrate(8.0, 1e-5, 10, 0.2, 10, 36.0, &high).is_err());
    assert!(PmixedConfig::calibrate(0.0, 1e-5, 10, 0.2, 10, 36.0, &orders).is_err());
    assert!(PmixedConfig::calibrate(1.0, 1.0, 10, 0.2, 10, 36.0, &orders).is_err());
    assert!(PmixedConfig::calibrate(1.0, 1e-5, 0, 0.2, 10, 36.0, &orders).is_err());
    assert!(PmixedConfig::calibrate(1.0, 1e-5, 10, 1.2, 10, 36.0, &orders).is_err());
}

/// When no order the enforcement order allows (α ≤ α_c²/(2α_c − 1) ≈ 9.26 at
/// α_c = 18) converts below ε = 1 at δ = 1e-5 — ln(1/δ)/(α − 1) alone is above 1 —
/// no positive radius fits: the calibration says so with b = 0 at once, instead of
/// bisecting the radius down to the smallest subnormal.
#[test]
fn calibration_with_no_feasible_radius_gives_zero_at_once() {
    let orders = Orders::dp_accounting_default();
    let c = PmixedConfig::calibrate(1.0, 1e-5, 16, 1.0, 2, 18.0, &orders).unwrap();
    assert_eq!(c.radius(), 0.0);
    let curve = pmixed_curve(&orders, 18.0, 1e-300, 2, 1.0).unwrap();
    assert!(curve.self_compose(16).epsilon(1e-5).unwrap().epsilon > 1.0);
    // That 0 is found in a few probes, not by halving into the subnormals, is
    // `largest_feasible`'s own test (privmix-accountant's calibrate module).
}

/// After a spent curve the radius fits the composed curve, not the budget less
/// the spent ε: the run plus what was spent stays within ε and a slightly
/// larger radius would not; with nothing spent it is `calibrate`'s radius.
#[test]
fn calibration_after_a_spent_curve_fits_the_composition() {
    let orders = Orders::dp_accounting_default();
    let spent_run = |b: f64, k: u64| {
        pmixed_curve(&orders, 36.0, b, 2, 1.0)
            .unwrap()
            .self_compose(k)
    };
    // A first run of 5 queries calibrated to ε = 8 spent about 2.5.
    let first = PmixedConfig::calibrate(2.5, 1e-5, 5, 1.0, 2, 36.0, &orders).unwrap();
    let spent = spent_run(first.radius(), 5);
    let e_spent = spent.epsilon(1e-5).unwrap().epsilon;
    assert!(e_spent > 2.0 && e_spent <= 2.5);
    let c = PmixedConfig::calibrate_after(&spent, 8.0, 1e-5, 3, 1.0, 2, 36.0).unwrap();
    let total = |b: f64| {
        spent
            .compose(&spent_run(b, 3))
            .unwrap()
            .epsilon(1e-5)
            .unwrap()
            .epsilon
    };
    assert!(total(c.radius()) <= 8.0);
    assert!(total(c.radius() * (1.0 + 1e-8)) > 8.0);
    // Larger than the radius for the whole budget, smaller than for nothing spent.
    let whole = PmixedConfig::calibrate(8.0, 1e-5, 3, 1.0, 2, 36.0, &orders).unwrap();
    assert!(c.radius() < whole.radius());
    let zero = RdpCurve::zero(orders.clone());
    let after_nothing = PmixedConfig::calibrate_after(&zero, 8.0, 1e-5, 3, 1.0, 2, 36.0).unwrap();
    assert_eq!(after_nothing.radius(), whole.radius());
    // Nothing left: refused.
    let all = spent_run(whole.radius(), 10);
    assert!(PmixedConfig::calibrate_after(&all, 8.0, 1e-5, 1, 1.0, 2, 36.0).is_err());
}

#[test]
fn temperature_sharpens_and_keeps_zeros() {
    let e = Ensemble::from_probabilities(&[0.5, 0.5, 0.0], &[0.8, 0.2, 0.0]).unwrap();
    let t = temper(&e, 0.5).unwrap();
    assert!((t.member(0)[0] - 0.64 / 0.68).abs() < 1e-15);
    assert_eq!(t.member(0)[2], 0.0);
    assert!(temper(&e, 0.0).is_err());
    assert!(temper(&e, f64::NAN).is_err());
}
