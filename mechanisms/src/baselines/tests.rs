use super::*;

#[test]
fn laplace_rdp_matches_mpmath_and_rounds_up() {
    // mpmath (dps 40) of Mironov's Table II formula, as the nearest f64:
    // log(a/(2a-1)*exp((a-1)*t) + (a-1)/(2a-1)*exp(-a*t))/(a-1).
    let golden = [
        (2.0, 1.0, 0.619_123_629_998_592_8),
        (1.5, 0.1, 0.007_247_485_389_328_535),
        (18.0, 0.02, 0.003_506_100_522_649_583_6),
        (64.0, 3.0, 2.989_122_158_680_969_8),
        (2.0, 50.0, 49.594_534_891_891_83),
    ];
    for (a, t, want) in golden {
        let got = laplace_rdp_at(a, t);
        assert!(
            got >= want && got <= want * (1.0 + 1e-12),
            "α {a}, t {t}: {got} vs {want}"
        );
    }
    assert_eq!(laplace_rdp_at(2.0, 0.0), 0.0);
    assert!(laplace_rdp_at(2.0, 1e6).is_finite());
}

#[test]
fn bad_parameters_and_empty_ensembles_are_errors() {
    assert!(SubsampleAggregateLaplace::new(0.0).is_err());
    assert!(SubsampleAggregateLaplace::new(f64::NAN).is_err());
    assert!(Gnmax::new(-1.0).is_err());
    let e = Ensemble::from_probabilities(&[0.5, 0.5], &[]).unwrap();
    assert!(matches!(
        Gnmax::votes(&e),
        Err(MechanismError::EmptyEnsemble)
    ));
    let s = SubsampleAggregateLaplace::new(1.0).unwrap();
    assert!(s.curve(&Orders::default(), 0, 2).is_err());
    assert!(s.curve(&Orders::default(), 1, 0).is_err());
    assert!(SubsampleAggregateLaplace::with_granularity(1.0, 0.3).is_err());
    assert!(s.noisy_average(&e, &[0.0, 0.0]).is_err());
    let e = Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5]).unwrap();
    assert!(s.noisy_average(&e, &[0.0]).is_err());
}

#[test]
fn votes_break_ties_low_and_count_each_member_once() {
    let e = Ensemble::from_probabilities(
        &[0.25; 4],
        &[0.4, 0.4, 0.1, 0.1, 0.0, 0.0, 0.0, 1.0, 0.1, 0.2, 0.3, 0.4],
    )
    .unwrap();
    assert_eq!(Gnmax::votes(&e).unwrap(), vec![1.0, 0.0, 0.0, 2.0]);
}
