use super::*;
use privmix_accountant::Budget;

fn orders() -> Orders {
    Orders::dp_accounting_default()
}

#[test]
fn sensitivity_is_just_above_two_over_n_and_the_curve_is_gaussian() {
    let esa = EmbeddingSpaceAggregation::new(0.5).unwrap();
    let curve = esa.curve(&orders(), 4, 3).unwrap();
    for (&a, &e) in orders().as_slice().iter().zip(curve.epsilons()) {
        let exact = a * 0.25 / (2.0 * 0.25);
        assert!(
            e > exact && e <= exact * (1.0 + 1e-7),
            "{a}: {e} vs {exact}"
        );
    }
    assert!(sensitivity(0, 3, DEFAULT_GRANULARITY).is_err());
    assert!(sensitivity(3, 0, DEFAULT_GRANULARITY).is_err());
    assert!(sensitivity(3, 3, 0.3).is_err());
    assert!(EmbeddingSpaceAggregation::with_granularity(1.0, 0.75).is_err());
}

#[test]
fn clipping_bounds_every_output_by_one() {
    let mean = clipped_mean(&[vec![3.0, 4.0], vec![0.0, 0.5]]).unwrap();
    assert!((mean[0] - 0.3).abs() < 1e-12 && (mean[1] - 0.65).abs() < 1e-12);
}

#[test]
fn with_little_noise_the_closest_candidate_wins() {
    let esa = EmbeddingSpaceAggregation::new(1e-6).unwrap();
    let outputs = vec![vec![1.0, 0.0, 0.0], vec![0.8, 0.6, 0.0]];
    let candidates = vec![
        vec![0.0, 0.0, 1.0],
        vec![0.9, 0.3, 0.0],
        vec![-1.0, 0.0, 0.0],
    ];
    let mut rng = PrivacyRng::from_seed(1);
    let mut account = crate::Unbudgeted::new(orders());
    let r = esa
        .release(&outputs, &candidates, &mut rng, &mut account)
        .unwrap();
    assert_eq!(r.index, 1);
    assert!(r.similarities[1] > 0.99);
}

#[test]
fn bad_input_is_refused_before_anything_is_charged() {
    let esa = EmbeddingSpaceAggregation::new(1.0).unwrap();
    let mut rng = PrivacyRng::from_seed(0);
    let mut budget = Budget::new(orders(), 1.0, 1e-5).unwrap();
    let good = vec![vec![1.0f32, 0.0]];
    type Rows = Vec<Vec<f32>>;
    let cases: [(Rows, Rows); 5] = [
        (vec![], good.clone()),
        (good.clone(), vec![]),
        (vec![vec![1.0, 0.0], vec![1.0]], good.clone()),
        (vec![vec![f32::NAN, 0.0]], good.clone()),
        (good.clone(), vec![vec![0.0, 0.0]]),
    ];
    for (outputs, candidates) in cases {
        assert!(
            esa.release(&outputs, &candidates, &mut rng, &mut budget)
                .is_err()
        );
    }
    assert!(budget.spent().epsilons().iter().all(|&e| e == 0.0));
    assert!(EmbeddingSpaceAggregation::new(0.0).is_err());
    assert!(EmbeddingSpaceAggregation::new(f64::NAN).is_err());
}

#[test]
fn calibration_fits_the_budget_and_is_minimal() {
    let o = orders();
    let esa = EmbeddingSpaceAggregation::calibrated(&o, 32, 384, 16, 4.0, 1e-5).unwrap();
    let delta = sensitivity(32, 384, DEFAULT_GRANULARITY).unwrap();
    assert!(delta > 2.0 / 32.0 && delta < 2.0 / 32.0 * (1.0 + 1e-5));
    let spent = |sigma: f64| {
        gaussian(&o, sigma, delta)
            .unwrap()
            .self_compose(16)
            .epsilon(1e-5)
            .unwrap()
            .epsilon
    };
    assert!(spent(esa.sigma()) <= 4.0);
    assert!(spent(esa.sigma() * (1.0 - 1e-6)) > 4.0);
}
