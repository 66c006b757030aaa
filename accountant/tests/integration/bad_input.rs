//! Bad input gets a typed error naming the problem — never a panic, NaN or
//! silent clamp.

use privmix_accountant::{
    AccountantError, Budget, Orders, PartBudgets, RdpCurve, adapmixed_screening, dps_mozo_beta,
    dps_mozo_token, gaussian, pmixed_beta, pmixed_query, poisson_gaussian_sigma,
    poisson_subsampled_gaussian, poisson_subsampled_gaussian_at, random_stopping_epsilon,
    without_replacement_gaussian,
};

fn is_param(r: Result<impl std::fmt::Debug, AccountantError>, want: &str) -> bool {
    matches!(r, Err(AccountantError::InvalidParameter { name, .. }) if name == want)
}

#[test]
fn orders_must_exceed_one() {
    for bad in [1.0, 0.5, -2.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Orders::new(vec![2.0, bad]),
            Err(AccountantError::InvalidOrder(_))
        ));
    }
    assert_eq!(Orders::new(vec![]), Err(AccountantError::EmptyOrders));
    assert!(Orders::integers(1).is_err());
    assert!(matches!(
        poisson_subsampled_gaussian_at(0.1, 1.0, 1.0),
        Err(AccountantError::InvalidOrder(_))
    ));
    assert!(matches!(
        pmixed_beta(0.9, 4, 1.0, 0.1),
        Err(AccountantError::InvalidOrder(_))
    ));
    assert!(PartBudgets::new(1.0, 2, 1.0).is_err());
}

#[test]
fn curves_reject_nan_negative_and_length_mismatch() {
    let o = Orders::new(vec![2.0, 3.0]).unwrap();
    assert!(matches!(
        RdpCurve::new(o.clone(), vec![0.1, f64::NAN]),
        Err(AccountantError::InvalidEpsilon { .. })
    ));
    assert!(matches!(
        RdpCurve::new(o.clone(), vec![-0.1, 0.1]),
        Err(AccountantError::InvalidEpsilon { .. })
    ));
    assert!(matches!(
        RdpCurve::new(o.clone(), vec![0.1]),
        Err(AccountantError::LengthMismatch { .. })
    ));
    let other = RdpCurve::zero(Orders::new(vec![2.0]).unwrap());
    assert_eq!(
        RdpCurve::zero(o.clone()).compose(&other),
        Err(AccountantError::OrdersDiffer)
    );
    assert_eq!(
        RdpCurve::zero(o).at(4.0),
        Err(AccountantError::MissingOrder(4.0))
    );
}

#[test]
fn delta_outside_the_open_unit_interval() {
    let c = gaussian(&Orders::default(), 1.0, 1.0).unwrap();
    for bad in [0.0, 1.0, -1e-9, 2.0, f64::NAN] {
        assert!(is_param(c.epsilon(bad), "delta"));
        assert!(is_param(Budget::new(Orders::default(), 1.0, bad), "delta"));
        assert!(is_param(
            dps_mozo_beta(&Orders::default(), 1.0, bad, 10, 1, 10),
            "delta"
        ));
    }
    assert!(is_param(c.delta(-1.0), "epsilon"));
    assert!(is_param(c.delta(f64::NAN), "epsilon"));
}

#[test]
fn q_outside_the_unit_interval() {
    let o = Orders::default();
    let c = gaussian(&o, 1.0, 1.0).unwrap();
    for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
        assert!(is_param(c.poisson_subsampled(bad), "q"));
        assert!(is_param(c.sampled_without_replacement(bad), "q"));
        assert!(is_param(poisson_subsampled_gaussian(&o, bad, 1.0), "q"));
        assert!(is_param(without_replacement_gaussian(&o, bad, 1.0), "q"));
        assert!(is_param(pmixed_beta(4.0, 4, bad, 0.1), "q"));
    }
}

#[test]
fn sigma_must_be_positive() {
    let o = Orders::default();
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(is_param(gaussian(&o, bad, 1.0), "sigma"));
        assert!(is_param(poisson_subsampled_gaussian(&o, 0.1, bad), "sigma"));
        assert!(is_param(
            without_replacement_gaussian(&o, 0.1, bad),
            "sigma"
        ));
        assert!(is_param(adapmixed_screening(&o, 1e-4, 10, bad), "sigma"));
    }
}

#[test]
fn budgets_and_mechanism_parameters_must_be_non_negative_numbers() {
    let o = Orders::default();
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert!(is_param(Budget::new(o.clone(), bad, 1e-5), "epsilon"));
        assert!(is_param(PartBudgets::new(2.0, 3, bad), "limit"));
        assert!(is_param(pmixed_beta(4.0, 4, 1.0, bad), "per_query_epsilon"));
        assert!(is_param(
            poisson_gaussian_sigma(&o, 0.1, 10, bad, 1e-5),
            "epsilon"
        ));
        assert!(is_param(pmixed_query(&o, bad, 4), "beta"));
        assert!(is_param(dps_mozo_token(&o, bad), "beta"));
        assert!(is_param(adapmixed_screening(&o, bad, 4, 1.0), "lambda"));
        assert!(is_param(gaussian(&o, 1.0, bad), "sensitivity"));
        assert!(is_param(
            random_stopping_epsilon(bad, 10, 2.0),
            "rop_epsilon"
        ));
    }
    assert!(is_param(pmixed_beta(4.0, 4, 1.0, 0.0), "per_query_epsilon"));
}

#[test]
fn a_budget_below_what_was_spent_is_refused() {
    let spent = gaussian(&Orders::default(), 1.0, 1.0)
        .unwrap()
        .self_compose(100);
    let e = spent.epsilon(1e-5).unwrap().epsilon;
    assert!(matches!(
        Budget::with_spent(spent.clone(), e * 0.99, 1e-5),
        Err(AccountantError::BudgetBelowSpent { .. })
    ));
    assert!(Budget::with_spent(spent, e, 1e-5).is_ok());
}
