use super::*;

fn ensemble(public: &[f64], members: &[f64]) -> Ensemble {
    Ensemble::from_probabilities(public, members).unwrap()
}

#[test]
fn agreeing_halves_are_held_by_the_anchor_and_public_parts_cost_nothing() {
    let p0 = [0.25, 0.25, 0.5];
    let e = ensemble(
        &p0,
        &[
            0.6, 0.2, 0.2, 0.6, 0.2, 0.2, 0.25, 0.25, 0.5, 0.25, 0.25, 0.5,
        ],
    );
    let d = submix_distribution(&e, 2.0, 0.0, 8.0, 0.01).unwrap();
    // Identical halves pass the pair test at any λ; the anchor holds part 0 back.
    assert_eq!(d.pair_lambdas, vec![1.0, 1.0]);
    assert!(d.anchor_lambdas[0] > 0.0 && d.anchor_lambdas[0] < 1.0);
    assert_eq!(d.anchor_lambdas[1], 1.0);
    assert_eq!(d.lambdas[0], d.anchor_lambdas[0]);
    let sum: f64 = d.output.iter().sum();
    assert!((sum - 1.0).abs() < 1e-15);
    // A huge radius leaves the paper's pair test in charge.
    let d = submix_distribution(&e, 2.0, 0.0, 8.0, 1e6).unwrap();
    assert_eq!(d.lambdas, vec![1.0, 1.0]);
    for (x, want) in d.output.iter().zip([0.425, 0.225, 0.35]) {
        assert!((x - want).abs() < 1e-15);
    }
}

#[test]
fn disagreeing_halves_lower_lambda_below_the_anchor() {
    let p0 = [0.5, 0.5];
    let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
    let d = submix_distribution(&e, 2.0, 0.01, 8.0, 10.0).unwrap();
    assert!(d.pair_lambdas[0] < d.anchor_lambdas[0]);
    assert_eq!(d.lambdas[0], d.pair_lambdas[0]);
}

#[test]
fn bad_parameters_are_typed_errors() {
    let p0 = [0.5, 0.5];
    let odd = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8, 0.5, 0.5]);
    assert!(matches!(
        submix_distribution(&odd, 2.0, 0.1, 8.0, 0.1),
        Err(MechanismError::InvalidParameter {
            name: "members",
            ..
        })
    ));
    let empty = ensemble(&p0, &[]);
    assert!(submix_distribution(&empty, 2.0, 0.1, 8.0, 0.1).is_err());
    let e = ensemble(&p0, &[0.9, 0.1, 0.2, 0.8]);
    for (a, b) in [
        (1.0, 0.1),
        (f64::INFINITY, 0.1),
        (f64::NAN, 0.1),
        (2.0, -0.1),
        (2.0, f64::INFINITY),
    ] {
        assert!(matches!(
            submix_distribution(&e, a, b, 8.0, 0.1),
            Err(MechanismError::InvalidParameter { .. })
        ));
    }
    assert!(submix_distribution(&e, 2.0, 0.1, 1.0, 0.1).is_err());
    assert!(submix_distribution(&e, 2.0, 0.1, 8.0, -0.1).is_err());
}
