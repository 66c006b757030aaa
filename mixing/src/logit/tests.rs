use super::*;
use crate::LAMBDA_TOLERANCE;
use privmix_renyi::test_rows::uniforms;

fn order(a: f64) -> Order {
    Order::new(a).unwrap()
}

fn logits(len: usize, seed: u64, scale: f64) -> Vec<f64> {
    uniforms(seed)
        .take(len)
        .map(|u| scale * (u - 0.5))
        .collect()
}

/// `Dsym` from the exponential-family form `A(s) = log Σ exp(l₀ + sT)` (independent of
/// privmix-renyi): forward `[A(αλ) − αA(λ) + (α−1)A(0)]/(α−1)`, reverse
/// `[A((1−α)λ) − αA(0) + (α−1)A(λ)]/(α−1)`.
fn dsym_family(l1: &[f64], l0: &[f64], lambda: f64, alpha: f64) -> f64 {
    let a = |s: f64| {
        let z: Vec<f64> = l0.iter().zip(l1).map(|(&b, &t)| b + s * (t - b)).collect();
        log_sum_exp(&z)
    };
    let e = alpha - 1.0;
    let forward = (a(alpha * lambda) - alpha * a(lambda) + e * a(0.0)) / e;
    let reverse = (a(-e * lambda) - alpha * a(0.0) + e * a(lambda)) / e;
    forward.max(reverse)
}

#[test]
fn agrees_with_the_exponential_family_form() {
    for &alpha in &[2.0, 6.5, 18.0] {
        for seed in 1..6 {
            let l0 = logits(60, seed, 12.0);
            let l1: Vec<f64> = l0
                .iter()
                .zip(logits(60, seed + 40, 6.0))
                .map(|(a, b)| a + b)
                .collect();
            let b = 0.05 * alpha;
            let (mut lo, mut hi) = (0.0, DEFAULT_LOGIT_UPPER);
            for _ in 0..200 {
                let mid = 0.5 * (lo + hi);
                if dsym_family(&l1, &l0, mid, alpha) <= b {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            let sol = logit_mixing_lambda(&l1, &l0, order(alpha), b).unwrap();
            assert!(sol.value <= b);
            if sol.violated_at.is_none() {
                assert!(lo > DEFAULT_LOGIT_UPPER - 1e-9);
                continue;
            }
            assert!(
                (sol.lambda - lo).abs() <= LAMBDA_TOLERANCE + 1e-11,
                "α {alpha} seed {seed}: {sol:?} vs {lo}"
            );
            assert!(sol.evaluations <= 9, "α {alpha} seed {seed}: {sol:?}");
        }
    }
}

#[test]
fn slopes_match_finite_differences() {
    let l0 = logits(25, 3, 10.0);
    let l1 = logits(25, 4, 10.0);
    for alpha in [order(1.5), order(18.0), Order::Infinite] {
        let m = LogitMixing::new(&l1, &l0, alpha, 1.0).unwrap();
        for &x in &[0.1, 0.5, 1.0, 1.4] {
            let h = 1e-6;
            let e = m.evaluate(x).unwrap();
            let active = if e.parts[0].value >= e.parts[1].value {
                e.parts[0]
            } else {
                e.parts[1]
            };
            let slope = active.slope;
            let fd = (m.constraint(x + h).unwrap() - m.constraint(x - h).unwrap()) / (2.0 * h);
            assert!(
                (slope - fd).abs() <= 1e-5 * (1.0 + fd.abs()),
                "{alpha:?} λ {x}: {slope} vs {fd}"
            );
        }
    }
}

#[test]
fn monotone_beyond_one() {
    let l0 = logits(40, 8, 16.0);
    let l1 = logits(40, 9, 16.0);
    for alpha in [order(1.1), order(4.0), order(18.0), Order::Infinite] {
        let m = LogitMixing::new(&l1, &l0, alpha, 1.0).unwrap();
        let values: Vec<f64> = (0..=150)
            .map(|i| m.constraint(i as f64 / 100.0).unwrap())
            .collect();
        assert_eq!(values[0], 0.0);
        assert!(
            values.windows(2).all(|w| w[1] > w[0]),
            "{alpha:?}: {values:?}"
        );
    }
}

#[test]
fn identical_or_shifted_logits_give_the_upper_end() {
    let l0 = logits(10, 1, 8.0);
    let sol = logit_mixing_lambda(&l0, &l0, order(18.0), 0.0).unwrap();
    assert_eq!((sol.lambda, sol.value, sol.violated_at), (1.5, 0.0, None));
    let m = LogitMixing::new(&l0, &l0, order(18.0), 0.0)
        .unwrap()
        .with_upper_end(4.0)
        .unwrap();
    assert_eq!(m.solve().unwrap().lambda, 4.0);
    // A constant shift leaves softmax unchanged (up to rounding of the shift).
    let shifted: Vec<f64> = l0.iter().map(|l| l + 3.0).collect();
    assert_eq!(
        logit_mixing_lambda(&shifted, &l0, order(18.0), 1e-12)
            .unwrap()
            .lambda,
        1.5
    );
    // A zero bound with different logits gives exactly 0.
    let sol = logit_mixing_lambda(&logits(10, 2, 8.0), &l0, order(18.0), 0.0).unwrap();
    assert_eq!((sol.lambda, sol.value), (0.0, 0.0));
}

#[test]
fn mixed_distribution_is_the_evaluated_one() {
    let l0 = logits(30, 5, 10.0);
    let l1 = logits(30, 6, 10.0);
    let m = LogitMixing::new(&l1, &l0, order(18.0), 0.9).unwrap();
    let sol = m.solve().unwrap();
    let lp = m.mixed_log_probs(sol.lambda).unwrap();
    let lq = log_softmax(&l0).unwrap();
    let d = divergence_log(&lp, &lq, order(18.0))
        .unwrap()
        .max(divergence_log(&lq, &lp, order(18.0)).unwrap());
    assert_eq!(d, sol.value);
    assert_eq!(m.mixed_logits(0.0).unwrap(), l0);
    assert_eq!(m.upper_end(), DEFAULT_LOGIT_UPPER);
}

#[test]
fn rejects_bad_input() {
    let a = [1.0, 2.0];
    let alpha = order(2.0);
    assert_eq!(
        logit_mixing_lambda(&[1.0, f64::NEG_INFINITY], &a, alpha, 1.0),
        Err(MixingError::NonFiniteLogit {
            index: 1,
            value: f64::NEG_INFINITY
        })
    );
    assert_eq!(
        logit_mixing_lambda(&a, &[1.0], alpha, 1.0),
        Err(MixingError::LengthMismatch { left: 2, right: 1 })
    );
    assert_eq!(
        logit_mixing_lambda(&[], &[], alpha, 1.0),
        Err(MixingError::Empty)
    );
    assert_eq!(
        logit_mixing_lambda(&a, &a, alpha, f64::NEG_INFINITY),
        Err(MixingError::InvalidBound(f64::NEG_INFINITY))
    );
    assert!(matches!(
        logit_mixing_lambda(&[f64::MAX, 0.0], &[-f64::MAX, 0.0], alpha, 1.0),
        Err(MixingError::NonFiniteLogit { index: 0, .. })
    ));
    let m = LogitMixing::new(&a, &a, alpha, 1.0).unwrap();
    assert_eq!(
        m.mixed_logits(1.6),
        Err(MixingError::LambdaOutOfRange {
            lambda: 1.6,
            upper: 1.5
        })
    );
    assert!(m.constraint(f64::NAN).is_err());
    assert!(matches!(
        m.clone().with_upper_end(f64::INFINITY),
        Err(MixingError::InvalidUpperEnd(_))
    ));
    let log_p = log_softmax(&[0.0, 0.0]).unwrap();
    assert_eq!(log_p, vec![-(2.0f64.ln()); 2]);
}

#[test]
fn log_softmax_stays_normalised_near_the_largest_logits() {
    // `max + ln Σ` would absorb ln 3 at this magnitude and give three zeros (sum 3).
    let lp = log_softmax(&[-1.5e308, -1.5e308, -1.5e308]).unwrap();
    let sum: f64 = lp.iter().map(|x| x.exp()).sum();
    assert!((sum - 1.0).abs() < 1e-15, "{lp:?}");
    // A difference that overflows is a probability that underflows to 0.
    let lp = log_softmax(&[1e308, -1e308, 0.0]).unwrap();
    assert_eq!(lp, vec![0.0, f64::NEG_INFINITY, -1e308]);
    // Mixing logits of that size solves instead of failing validation downstream.
    let sol = logit_mixing_lambda(
        &[-1e308, -1e308, -1e308],
        &[1e300, 3.0, 0.0],
        Order::Infinite,
        0.5,
    )
    .unwrap();
    assert!(sol.value <= 0.5);
}
