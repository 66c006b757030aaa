//! The Laplace and randomized-response curves against 50-digit values
//! computed independently by `tests/golden/laplace_rr.py` (quadrature and the
//! closed forms of Mironov, arXiv:1702.07476, Props. 5 and 6; the categorical
//! divergence term by term), stored in `tests/golden/laplace_rr.out`.

use privmix_accountant::{Orders, laplace, randomized_response};

const GOLDEN: &str = include_str!("../golden/laplace_rr.out");

/// Checks `got` is an upper bound on `want` (up to `want`'s own rounding to
/// f64) and close to it: the closed forms lose at most a few ulps of their
/// largest log term (tens of ulps at most) to cancellation, divided by α − 1.
fn check(what: &str, got: f64, want: f64, alpha: f64, largest_term: f64) {
    assert!(got >= want * (1.0 - 1e-15), "{what}: {got} below {want}");
    let slack = 1e-13 * want + 1e-14 * (1.0 + largest_term.abs()) / (alpha - 1.0);
    assert!(
        got - want <= slack,
        "{what}: {got} vs {want} (slack {slack:e})"
    );
}

#[test]
fn laplace_and_randomized_response_match_the_golden_values() {
    let mut checked = (0, 0);
    for line in GOLDEN.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f[i].parse::<f64>().unwrap();
        match f[0] {
            "laplace" => {
                let (b, alpha, want) = (num(1), num(2), num(3));
                let orders = Orders::new(vec![alpha]).unwrap();
                let got = laplace(&orders, b).unwrap().epsilons()[0];
                check(line, got, want, alpha, (alpha - 1.0) / b + alpha / b);
                checked.0 += 1;
            }
            "rr" => {
                let (eps, k, alpha, want) = (num(1), f[2].parse().unwrap(), num(3), num(4));
                let orders = Orders::new(vec![alpha]).unwrap();
                let got = randomized_response(&orders, eps, k).unwrap().epsilons()[0];
                check(line, got, want, alpha, alpha * eps + (k as f64).ln());
                checked.1 += 1;
            }
            other => panic!("unknown golden line kind {other}"),
        }
    }
    assert_eq!(checked, (36, 120));
}
