//! Golden values from independent sources:
//!
//! * dp_accounting's own test suite: the randomised-response RDP values of
//!   `rdp_privacy_accountant_test.py` (google/differential-privacy,
//!   `python/dp_accounting/dp_accounting/rdp/rdp_privacy_accountant_test.py`, tests
//!   `test_compute_rdp_randomized_response_replace_special`, `..._replace_one`,
//!   `..._inf_order` and `..._boundary`; file as of commit
//!   d986e7ffc084ba6924d37b738df31f0638c01fe0). Those tests are newer than the
//!   dp_accounting 0.4.4 wheel installed in this environment, whose copy of the file has
//!   no randomised-response tests. The values are exact discrete Rényi divergences of the
//!   explicit vectors written in dp_accounting's `_randomized_response_rdp_replace_one`
//!   and `_randomized_response_rdp_replace_special` docstrings (see `rr` below).
//! * mpmath at 60 digits: `golden/make_golden.py`, output `golden/values.rs`. The
//!   script also measures how far dp_accounting's numbers are from mpmath's
//!   (`RR_UPSTREAM_VS_MPMATH`, 1.6e-15 relative).
//! * Closed forms for two-point distributions.

use privmix_renyi::{
    Direction, Order, batched_divergence, divergence, divergence_log, kl_divergence,
    kl_divergence_log, symmetric_divergence, symmetric_divergence_log,
};

/// The mpmath values carry more digits than f64 holds, on purpose (they are rounded
/// once, by the compiler).
#[allow(
    clippy::excessive_precision,
    clippy::type_complexity,
    clippy::approx_constant
)]
mod golden {
    include!("../golden/values.rs");
}

const ORDERS: [f64; 6] = [1.5, 2.5, 5.0, 50.0, 100.0, f64::INFINITY];

/// dp_accounting's expected values, copied verbatim from the test file cited above:
/// (name, noise_parameter, num_buckets, expected RDP at ORDERS).
const REPLACE_SPECIAL: [(&str, f64, usize, [f64; 6]); 3] = [
    (
        "small_eps",
        0.3,
        10,
        [
            1.5030552584146897,
            1.7801182478869704,
            1.9091969256833639,
            1.9814516798923105,
            1.9846954517418232,
            1.9878743481543455,
        ],
    ),
    (
        "medium_eps",
        0.05,
        20,
        [
            2.8985312222056674,
            2.9615414620514047,
            2.982908949957726,
            2.994685471627712,
            2.9952141594692665,
            2.995732273553991,
        ],
    ),
    (
        "large_eps",
        0.01,
        3,
        [
            3.851345343526459,
            4.334924907685137,
            4.503803908976894,
            4.596895387863428,
            4.601074578835478,
            4.605170185988092,
        ],
    ),
];
const REPLACE_ONE: [(&str, f64, usize, [f64; 6]); 3] = [
    (
        "small_eps",
        0.3,
        10,
        [
            2.6946320226546314,
            2.983865364028855,
            3.11316970070507,
            3.1854244842182466,
            3.1886682560677593,
            3.1918471524802814,
        ],
    ),
    (
        "medium_eps",
        0.05,
        20,
        [
            5.850317703374384,
            5.910360162307462,
            5.930633082131939,
            5.94180620835157,
            5.942307807732949,
            5.942799375126701,
        ],
    ),
    (
        "large_eps",
        0.01,
        3,
        [
            5.684126770932727,
            5.692634596034571,
            5.695421239467805,
            5.696956976543137,
            5.697025920968522,
            5.697093486505405,
        ],
    ),
];

/// Randomised response on k buckets with noise p: P answers bucket 0, Q bucket 1, U is
/// the uniform distribution (the "special" neighbour).
fn rr(p: f64, k: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let keep = 1.0 - p + p / k as f64;
    let mut big_p = vec![p / k as f64; k];
    big_p[0] = keep;
    let mut big_q = vec![p / k as f64; k];
    if k > 1 {
        big_q[1] = keep;
    }
    (big_p, big_q, vec![1.0 / k as f64; k])
}

fn order(a: f64) -> Order {
    Order::new(a).unwrap()
}

fn assert_rel(got: f64, want: f64, rtol: f64, what: &str) {
    if want.is_infinite() || want == 0.0 {
        assert_eq!(got, want, "{what}");
    } else {
        let rel = ((got - want) / want).abs();
        assert!(rel <= rtol, "{what}: got {got}, want {want}, rel {rel:e}");
    }
}

fn logs(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x.ln()).collect()
}

#[test]
fn dp_accounting_randomized_response_replace_one() {
    for (name, noise, k, expected) in REPLACE_ONE {
        let (p, q, _) = rr(noise, k);
        for (a, want) in ORDERS.into_iter().zip(expected) {
            let what = format!("{name} α={a}");
            assert_rel(divergence(&p, &q, order(a)).unwrap(), want, 1e-13, &what);
            assert_rel(
                divergence_log(&logs(&p), &logs(&q), order(a)).unwrap(),
                want,
                1e-13,
                &what,
            );
            let batch = batched_divergence(&p, &q, order(a), Direction::Forward).unwrap();
            assert_rel(batch[0], want, 1e-13, &what);
            // f32 inputs: the vectors themselves move by ~6e-8 relative.
            let (p32, q32): (Vec<f32>, Vec<f32>) = p
                .iter()
                .zip(&q)
                .map(|(&x, &y)| (x as f32, y as f32))
                .unzip();
            assert_rel(divergence(&p32, &q32, order(a)).unwrap(), want, 1e-6, &what);
        }
    }
}

#[test]
fn dp_accounting_randomized_response_replace_special() {
    for (name, noise, k, expected) in REPLACE_SPECIAL {
        let (p, _, u) = rr(noise, k);
        for (a, want) in ORDERS.into_iter().zip(expected) {
            let what = format!("{name} α={a}");
            assert_rel(
                symmetric_divergence(&p, &u, order(a)).unwrap(),
                want,
                1e-13,
                &what,
            );
            let sym_log = symmetric_divergence_log(&logs(&p), &logs(&u), order(a)).unwrap();
            assert_rel(sym_log, want, 1e-13, &what);
            let batch = batched_divergence(&p, &u, order(a), Direction::Symmetric).unwrap();
            assert_rel(batch[0], want, 1e-13, &what);
        }
    }
}

#[test]
#[allow(clippy::approx_constant)] // dp_accounting's value is log 10, copied verbatim
fn dp_accounting_randomized_response_inf_order_and_boundaries() {
    // test_compute_rdp_randomized_response_inf_order: noise 0.1, 10 buckets.
    let (p, q, u) = rr(0.1, 10);
    assert_rel(
        symmetric_divergence(&p, &u, Order::Infinite).unwrap(),
        2.302585092994046,
        1e-13,
        "special ∞",
    );
    assert_rel(
        divergence(&p, &q, Order::Infinite).unwrap(),
        4.51085950651685,
        1e-13,
        "one ∞",
    );
    // test_compute_rdp_randomized_response_boundary, orders 1.1 and 1.2:
    // noise 1 → 0, noise 0 → ∞, one bucket → 0.
    for a in [1.1, 1.2] {
        let (p, q, u) = rr(1.0, 2);
        assert_eq!(divergence(&p, &q, order(a)).unwrap(), 0.0);
        assert_eq!(symmetric_divergence(&p, &u, order(a)).unwrap(), 0.0);
        let (p, q, u) = rr(0.0, 2);
        assert_eq!(divergence(&p, &q, order(a)).unwrap(), f64::INFINITY);
        assert_eq!(
            symmetric_divergence(&p, &u, order(a)).unwrap(),
            f64::INFINITY
        );
        let (p, _, u) = rr(0.1, 1);
        assert_eq!(symmetric_divergence(&p, &u, order(a)).unwrap(), 0.0);
    }
}

#[test]
fn randomized_response_each_direction_against_mpmath() {
    const { assert!(golden::RR_UPSTREAM_VS_MPMATH < 1e-14) };
    for &(name, noise, k, rows) in golden::RR_MPMATH {
        let (p, q, u) = rr(noise, k);
        for &(a, one, fwd, rev) in rows {
            let what = format!("{name} α={a}");
            assert_rel(divergence(&p, &q, order(a)).unwrap(), one, 1e-13, &what);
            assert_rel(divergence(&p, &u, order(a)).unwrap(), fwd, 1e-13, &what);
            assert_rel(divergence(&u, &p, order(a)).unwrap(), rev, 1e-13, &what);
            let rev_batch = batched_divergence(&p, &u, order(a), Direction::Reverse).unwrap();
            assert_rel(rev_batch[0], rev, 1e-13, &what);
        }
    }
}

#[test]
fn small_distributions_against_mpmath() {
    for &(name, p, q, rows) in golden::SMALL_MPMATH {
        for &(a, want) in rows {
            let what = format!("{name} α={a}");
            let (got, got_log) = if a == 1.0 {
                (
                    kl_divergence(p, q).unwrap(),
                    kl_divergence_log(&logs(p), &logs(q)).unwrap(),
                )
            } else {
                (
                    divergence(p, q, order(a)).unwrap(),
                    divergence_log(&logs(p), &logs(q), order(a)).unwrap(),
                )
            };
            assert_rel(got, want, 1e-12, &what);
            assert_rel(got_log, want, 1e-12, &what);
        }
    }
}

/// Closed forms on two points, p = (a, 1−a), q = (b, 1−b).
#[test]
fn two_point_closed_forms() {
    let pairs: [(f64, f64); 5] = [
        (0.75, 0.25),
        (0.9, 0.3),
        (0.5, 0.01),
        (0.01, 0.99),
        (0.3, 0.3),
    ];
    for (a, b) in pairs {
        let (p, q) = ([a, 1.0 - a], [b, 1.0 - b]);
        let what = format!("a={a} b={b}");
        // α = 2: log(1 + χ²) = log(a²/b + (1−a)²/(1−b)).
        let d2 = (a * a / b + (1.0 - a) * (1.0 - a) / (1.0 - b)).ln();
        assert_rel(divergence(&p, &q, order(2.0)).unwrap(), d2, 1e-13, &what);
        // α = 3: ½·log(a³/b² + (1−a)³/(1−b)²).
        let d3 = 0.5 * (a.powi(3) / (b * b) + (1.0 - a).powi(3) / ((1.0 - b) * (1.0 - b))).ln();
        assert_rel(divergence(&p, &q, order(3.0)).unwrap(), d3, 1e-13, &what);
        // α = ∞: log max(a/b, (1−a)/(1−b)).
        let dinf = (a / b).max((1.0 - a) / (1.0 - b)).ln();
        assert_rel(
            divergence(&p, &q, Order::Infinite).unwrap(),
            dinf,
            1e-13,
            &what,
        );
        // KL.
        let kl = a * (a / b).ln() + (1.0 - a) * ((1.0 - a) / (1.0 - b)).ln();
        assert_rel(kl_divergence(&p, &q).unwrap(), kl, 1e-12, &what);
    }
    // A point mass against (b, 1−b): D_α = −log b for every α, KL included.
    for b in [0.5_f64, 0.3, 1e-3, 1e-100] {
        let (p, q) = ([1.0, 0.0], [b, 1.0 - b]);
        for a in [1.5, 2.0, 7.25, 18.0, 1e6, f64::INFINITY] {
            let what = format!("point mass b={b} α={a}");
            assert_rel(divergence(&p, &q, order(a)).unwrap(), -b.ln(), 1e-13, &what);
            assert_rel(
                divergence_log(&logs(&p), &logs(&q), order(a)).unwrap(),
                -b.ln(),
                1e-13,
                &what,
            );
        }
        assert_rel(
            kl_divergence(&p, &q).unwrap(),
            -b.ln(),
            1e-13,
            "point mass KL",
        );
        // The other way round q has mass where the point mass has none: +∞.
        assert_eq!(divergence(&q, &p, order(2.0)).unwrap(), f64::INFINITY);
        assert_eq!(kl_divergence(&q, &p).unwrap(), f64::INFINITY);
    }
}
