//! The PLD accountant against its peers: dp_accounting's PLD accountant and
//! Microsoft's PRV accountant on a DP-SGD grid (tests/golden/pld_values.py,
//! output in pld_values.txt), dp_accounting's own PLD test values, and the
//! closed form of the composed Gaussian used by prv_accountant's tests.
#![allow(clippy::excessive_precision)]

use privmix_accountant::pld::{DEFAULT_DISCRETIZATION, PldError, PrivacyLossDistribution};
use privmix_accountant::{Orders, dp_sgd_epsilon, poisson_subsampled_gaussian};

/// One line of pld_values.txt.
struct Reference {
    sigma: f64,
    q: f64,
    steps: u64,
    delta: f64,
    pld: f64,
    prv_lower: f64,
    prv_upper: f64,
}

fn references() -> Vec<Reference> {
    include_str!("../golden/pld_values.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            let f = |i: usize| v[i].parse::<f64>().unwrap();
            Reference {
                sigma: f(0),
                q: f(1),
                steps: v[2].parse().unwrap(),
                delta: f(3),
                pld: f(4),
                prv_lower: f(5),
                prv_upper: f(7),
            }
        })
        .collect()
}

/// On every DP-SGD setting of the fixture, at dp_accounting's grid (1e-4):
/// * ours ≥ the PRV accountant's *lower* bound on the true ε (a proven bound,
///   so ours being an upper bound can be checked against it);
/// * ours ≥ dp_accounting's PLD ε minus its test tolerance (1e-3 absolute,
///   `pld_privacy_accountant_test.py`), and at most 1 % + 1e-3 above it;
/// * ours ≤ the RDP accountant's ε for the same setting (dp_accounting's orders).
#[test]
fn dp_sgd_grid_against_dp_accounting_and_prv() {
    let orders = Orders::dp_accounting_default();
    let refs = references();
    assert_eq!(refs.len(), 20);
    let mut i = 0;
    while i < refs.len() {
        let r = &refs[i];
        let composed = PrivacyLossDistribution::poisson_subsampled_gaussian(
            r.sigma,
            r.q,
            DEFAULT_DISCRETIZATION,
        )
        .unwrap()
        .self_compose(r.steps)
        .unwrap();
        let rdp = poisson_subsampled_gaussian(&orders, r.q, r.sigma)
            .unwrap()
            .self_compose(r.steps);
        // The fixture lists each setting at two δ in a row.
        for r in refs[i..]
            .iter()
            .take_while(|s| s.sigma == r.sigma && s.q == r.q && s.steps == r.steps)
        {
            let ours = composed.epsilon(r.delta).unwrap();
            let rdp_eps = rdp.epsilon(r.delta).unwrap().epsilon;
            let tag = format!("σ={} q={} T={} δ={}", r.sigma, r.q, r.steps, r.delta);
            assert!(
                ours >= r.prv_lower,
                "{tag}: {ours} below PRV's lower bound {}",
                r.prv_lower
            );
            assert!(
                ours >= r.pld - 1e-3,
                "{tag}: {ours} vs dp_accounting {}",
                r.pld
            );
            assert!(
                ours <= r.pld * 1.01 + 1e-3,
                "{tag}: {ours} vs dp_accounting {}",
                r.pld
            );
            // Where the FFT allowance (at +∞) is far below δ, ours is also within
            // the PRV accountant's upper bound; at T = 10⁴ and δ = 1e-7 the
            // allowance (~1e-8) costs up to 0.4 % of ε (see the module docs).
            if composed.infinity_mass() <= 1e-3 * r.delta {
                assert!(
                    ours <= r.prv_upper + 1e-3,
                    "{tag}: {ours} vs PRV upper {}",
                    r.prv_upper
                );
            }
            assert!(ours <= rdp_eps, "{tag}: {ours} above RDP {rdp_eps}");
            i += 1;
        }
    }
}

/// dp_accounting 0.6.0, `dp_accounting/pld/pld_privacy_accountant_test.py`:
/// `test_gaussian_basic` (σ = √3, composed 1 + 2 times: δ(1) = 0.126936,
/// ε(0.126936) = 1, both to 1e-3) and `test_poisson_subsampled_gaussian` /
/// `test_self_composed_subsampled_gaussian` (q = 0.2, σ = 0.5, 3 times:
/// δ(1) = 0.15594, ε(0.15594) = 1, both to 1e-3).
#[test]
fn dp_accounting_pld_test_values() {
    let g = PrivacyLossDistribution::gaussian(3f64.sqrt(), DEFAULT_DISCRETIZATION).unwrap();
    let g3 = g.compose(&g.self_compose(2).unwrap()).unwrap();
    let d = g3.delta(1.0).unwrap();
    assert!((d - 0.126936).abs() <= 1e-3, "{d}");
    let e = g3.epsilon(0.126936).unwrap();
    assert!((e - 1.0).abs() <= 1e-3, "{e}");

    let s = PrivacyLossDistribution::poisson_subsampled_gaussian(0.5, 0.2, DEFAULT_DISCRETIZATION)
        .unwrap();
    let once_then_twice = s.compose(&s.self_compose(2).unwrap()).unwrap();
    let thrice = s.self_compose(3).unwrap();
    for pld in [&once_then_twice, &thrice] {
        let d = pld.delta(1.0).unwrap();
        assert!((d - 0.15594).abs() <= 1e-3, "{d}");
        let e = pld.epsilon(0.15594).unwrap();
        assert!((e - 1.0).abs() <= 1e-3, "{e}");
    }
}

/// The T-fold Gaussian is the Gaussian with μ = √T/σ, whose exact profile is
/// `δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)` (Balle & Wang 2018, Thm 8; the
/// closed form prv_accountant's `test_accountant.py` checks against, at
/// σ = 100, T = 10⁴, ε = 4). Ours must be above it and close.
#[test]
fn composed_gaussian_against_the_closed_form() {
    let phi = |x: f64| 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
    let exact =
        |eps: f64, mu: f64| phi(-eps / mu + mu / 2.0) - eps.exp() * phi(-eps / mu - mu / 2.0);
    for (sigma, steps, eps) in [
        (100.0, 10_000u64, 4.0),
        (100.0, 10_000, 1.0),
        (2.0, 50, 1.5),
        (5.0, 400, 2.0),
    ] {
        let mu = (steps as f64).sqrt() / sigma;
        let pld = PrivacyLossDistribution::gaussian(sigma, DEFAULT_DISCRETIZATION)
            .unwrap()
            .self_compose(steps)
            .unwrap();
        let ours = pld.delta(eps).unwrap();
        let want = exact(eps, mu);
        assert!(
            ours >= want,
            "σ={sigma} T={steps} ε={eps}: {ours} below exact {want}"
        );
        assert!(
            ours <= want * 1.002 + 1e-9,
            "σ={sigma} T={steps} ε={eps}: {ours} vs {want}"
        );
    }
}

/// Composition agrees with itself: T steps as one power or as a chain. The two
/// differ only by their error allowances and truncation, which sit at +∞, so
/// their δ agree to within the larger +∞ mass.
#[test]
fn self_compose_agrees_with_repeated_compose() {
    let step = PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.1, 1e-3).unwrap();
    let power = step.self_compose(8).unwrap();
    let mut chain = step.clone();
    for _ in 1..8 {
        chain = chain.compose(&step).unwrap();
    }
    let slack = power.infinity_mass().max(chain.infinity_mass()) + 1e-12;
    for eps in [0.0, 0.5, 1.0, 2.0, 3.0] {
        let (a, b) = (power.delta(eps).unwrap(), chain.delta(eps).unwrap());
        assert!((a - b).abs() <= slack, "{eps}: {a} vs {b}");
    }
    let (a, b) = (power.epsilon(1e-5).unwrap(), chain.epsilon(1e-5).unwrap());
    assert!((a - b).abs() <= 1e-4 * a, "{a} vs {b}");
}

/// A finer grid can only tighten ε (both are upper bounds), and the default
/// grid is within 0.5 % of a 10× finer one on a DP-SGD setting.
#[test]
fn finer_grid_is_tighter_and_close() {
    let eps = |h: f64| {
        PrivacyLossDistribution::poisson_subsampled_gaussian(1.1, 0.02, h)
            .unwrap()
            .self_compose(500)
            .unwrap()
            .epsilon(1e-5)
            .unwrap()
    };
    let (coarse, fine) = (eps(1e-3), eps(1e-4));
    assert!(fine <= coarse, "{fine} vs {coarse}");
    assert!(coarse <= fine * 1.005, "{fine} vs {coarse}");
}

#[test]
fn trivial_cases() {
    let id = PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.0, 1e-3).unwrap();
    assert_eq!(id.epsilon(1e-5).unwrap(), 0.0);
    assert!(id.delta(0.0).unwrap() < 1e-15);
    let none = PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.3, 1e-3)
        .unwrap()
        .self_compose(0)
        .unwrap();
    assert_eq!(none.epsilon(1e-5).unwrap(), 0.0);
    // Reported δ is monotone in ε and ε monotone in δ.
    let p = PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.3, 1e-3)
        .unwrap()
        .self_compose(10)
        .unwrap();
    let mut last = f64::INFINITY;
    for e in [0.0, 0.5, 1.0, 2.0, 4.0] {
        let d = p.delta(e).unwrap();
        assert!(d <= last);
        last = d;
    }
    assert!(p.epsilon(1e-3).unwrap() <= p.epsilon(1e-6).unwrap());
    // ε then δ gives back at most δ.
    let e = p.epsilon(1e-4).unwrap();
    assert!(p.delta(e).unwrap() <= 1e-4);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let bad = |r: Result<PrivacyLossDistribution, PldError>, name: &str| {
        assert!(
            matches!(r, Err(PldError::InvalidParameter { name: n, .. }) if n == name),
            "{name}"
        );
    };
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(0.0, 0.1, 1e-3),
        "sigma",
    );
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(f64::NAN, 0.1, 1e-3),
        "sigma",
    );
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 1.5, 1e-3),
        "q",
    );
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, -0.1, 1e-3),
        "q",
    );
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.1, 0.0),
        "discretization",
    );
    bad(
        PrivacyLossDistribution::poisson_subsampled_gaussian(1.0, 0.1, f64::INFINITY),
        "discretization",
    );
    let p = PrivacyLossDistribution::gaussian(1.0, 1e-3).unwrap();
    for d in [0.0, 1.0, -1.0, f64::NAN] {
        assert!(matches!(
            p.epsilon(d),
            Err(PldError::InvalidParameter { name: "delta", .. })
        ));
    }
    for e in [-1.0, f64::NAN] {
        assert!(matches!(
            p.delta(e),
            Err(PldError::InvalidParameter {
                name: "epsilon",
                ..
            })
        ));
    }
    let other = PrivacyLossDistribution::gaussian(1.0, 1e-2).unwrap();
    assert!(matches!(p.compose(&other), Err(PldError::GridMismatch(..))));
    // A grid that would need more than MAX_FFT_LEN values.
    assert!(matches!(
        PrivacyLossDistribution::gaussian(1e-3, 1e-8),
        Err(PldError::TooLarge { .. })
    ));
    assert!(dp_sgd_epsilon(1.0, 0.01, 10, 2.0).is_err());
}
