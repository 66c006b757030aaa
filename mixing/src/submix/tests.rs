use super::*;
use crate::LAMBDA_TOLERANCE;

#[test]
fn alpha_two_two_point_closed_form() {
    // α = 2, two outcomes: with u = λ(h − p₀), v = λ(h' − p₀) (first coordinates, the
    // second ones negated), S = Σ m²/n = (p + u)²/(p + v) + (1−p−u)²/(1−p−v); solve
    // S(λ) = e^β by bisection in the test itself (an independent evaluator).
    let (h, hp, p0) = ([0.8, 0.2], [0.3, 0.7], [0.5, 0.5]);
    let s = |l: f64| {
        let (m, n) = (l * h[0] + (1.0 - l) * p0[0], l * hp[0] + (1.0 - l) * p0[0]);
        (m * m / n + (1.0 - m) * (1.0 - m) / (1.0 - n)).ln()
    };
    let beta = 0.3;
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if s(mid) <= beta { lo = mid } else { hi = mid }
    }
    let sol = submix_lambda(&h, &hp, &p0, Order::new(2.0).unwrap(), beta).unwrap();
    assert!(
        sol.lambda <= lo + 1e-13 && lo - sol.lambda <= LAMBDA_TOLERANCE,
        "{sol:?} vs {lo}"
    );
    assert!(sol.evaluations <= 8, "{sol:?}");
}

#[test]
fn equal_halves_give_the_upper_end_even_at_zero_bound() {
    let (h, p0) = ([0.1, 0.6, 0.3], [0.3, 0.3, 0.4]);
    let hp = h;
    let sol = submix_lambda(&h, &hp, &p0, Order::new(2.0).unwrap(), 0.0).unwrap();
    assert_eq!((sol.lambda, sol.value, sol.violated_at), (1.0, 0.0, None));
    let sol = submix_lambda(&h, &[0.2, 0.5, 0.3], &p0, Order::new(2.0).unwrap(), 0.0).unwrap();
    assert_eq!(sol.lambda, 0.0);
}

#[test]
fn errors_are_typed() {
    let x = [0.5, 0.5];
    let alpha = Order::new(2.0).unwrap();
    assert_eq!(
        submix_lambda(&x, &x, &x, alpha, -1.0),
        Err(MixingError::InvalidBound(-1.0))
    );
    assert!(matches!(
        submix_lambda(&x, &[1.0], &x, alpha, 1.0),
        Err(MixingError::Renyi(_))
    ));
    let s = SubmixPairProjection::new(&x, &x, &x, alpha, 1.0).unwrap();
    assert!(matches!(s.constraint(1.5), Err(MixingError::Renyi(_))));
}
