use super::*;
use crate::LAMBDA_TOLERANCE;
use privmix_renyi::test_rows::uniforms;

fn order(a: f64) -> Order {
    Order::new(a).unwrap()
}

/// Pseudo-random distribution with a Zipf-like profile, perturbed by `seed`.
fn distribution(len: usize, seed: u64, skew: f64) -> Vec<f64> {
    let mut v: Vec<f64> = uniforms(seed)
        .take(len)
        .enumerate()
        .map(|(i, u)| (1.0 + u * skew) / (i as f64 + 1.0))
        .collect();
    let s: f64 = v.iter().sum();
    v.iter_mut().for_each(|x| *x /= s);
    v
}

/// The direct textbook formula in f64 (independent of privmix-renyi's kernels), fine for
/// the moderate inputs used here.
fn dsym_direct(p: &[f64], q: &[f64], lambda: f64, alpha: f64) -> f64 {
    let m: Vec<f64> = p
        .iter()
        .zip(q)
        .map(|(&p, &q)| lambda * p + (1.0 - lambda) * q)
        .collect();
    let d = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x.powf(alpha) * y.powf(1.0 - alpha))
            .sum::<f64>()
            .ln()
            / (alpha - 1.0)
    };
    d(&m, q).max(d(q, &m))
}

/// 200 bisection steps on the direct formula.
fn reference_root(p: &[f64], q: &[f64], alpha: f64, bound: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if dsym_direct(p, q, mid, alpha) <= bound {
            lo = mid
        } else {
            hi = mid
        }
    }
    lo
}

#[test]
fn infinite_order_closed_form() {
    // α = ∞: exp(D(m‖q)) = 1 + λ(r_max − 1), exp(D(q‖m)) = 1/(1 − λ(1 − r_min)) with
    // r = p/q, so λ* = min((e^b − 1)/(r_max − 1), (1 − e^{−b})/(1 − r_min)).
    for seed in 1..6 {
        let q = distribution(40, seed, 3.0);
        let p = distribution(40, seed + 100, 30.0);
        let r: Vec<f64> = p.iter().zip(&q).map(|(a, b)| a / b).collect();
        let r_max = r.iter().copied().fold(0.0, f64::max);
        let r_min = r.iter().copied().fold(f64::INFINITY, f64::min);
        for b in [0.01_f64, 0.2, 1.0] {
            let exact = (b.exp_m1() / (r_max - 1.0)).min(-(-b).exp_m1() / (1.0 - r_min));
            let sol = pmixed_lambda(&p, &q, Order::Infinite, b).unwrap();
            if exact >= 1.0 {
                assert_eq!(sol.lambda, 1.0);
                continue;
            }
            assert!(sol.value <= b);
            assert!(
                (sol.lambda - exact).abs() <= LAMBDA_TOLERANCE + 1e-12,
                "{sol:?} vs {exact}"
            );
            assert!(sol.evaluations <= 8, "{sol:?}");
        }
    }
}

#[test]
fn agrees_with_an_independent_evaluator() {
    for &alpha in &[1.5, 2.0, 7.25, 18.0] {
        for seed in 1..5 {
            let q = distribution(30, seed, 2.0);
            let p = distribution(30, seed + 7, 12.0);
            let b = 0.2 * alpha / 4.0;
            let sol = pmixed_lambda(&p, &q, order(alpha), b).unwrap();
            let root = reference_root(&p, &q, alpha, b);
            if sol.violated_at.is_none() {
                assert!(root > 1.0 - 1e-12);
                continue;
            }
            assert!(
                (sol.lambda - root).abs() <= LAMBDA_TOLERANCE + 1e-12,
                "α {alpha} seed {seed}: {sol:?} vs {root}"
            );
            assert!(sol.evaluations <= 9, "α {alpha} seed {seed}: {sol:?}");
        }
    }
}

#[test]
fn identical_inputs_give_one_and_mismatch_gives_zero() {
    let q = distribution(16, 3, 1.0);
    let sol = pmixed_lambda(&q, &q, order(18.0), 1e-12).unwrap();
    assert_eq!(
        (sol.lambda, sol.violated_at, sol.evaluations),
        (1.0, None, 1)
    );
    // p puts mass where q has none: D(m ‖ q) = ∞ for every λ > 0.
    let q = [0.5, 0.5, 0.0];
    let p = [0.2, 0.2, 0.6];
    let sol = pmixed_lambda(&p, &q, order(18.0), 3.6).unwrap();
    assert_eq!(
        (sol.lambda, sol.value, sol.violated_at, sol.evaluations),
        (0.0, 0.0, Some(LAMBDA_TOLERANCE), 3)
    );
    // An infinite bound admits everything, even an infinite divergence.
    let sol = pmixed_lambda(&p, &q, order(18.0), f64::INFINITY).unwrap();
    assert_eq!(
        (sol.lambda, sol.value, sol.violated_at, sol.evaluations),
        (1.0, f64::INFINITY, None, 1)
    );
    // A zero bound: λ = 0 exactly (the constraint is strictly increasing).
    let sol = pmixed_lambda(&q, &p, order(18.0), 0.0).unwrap();
    assert_eq!(
        (sol.lambda, sol.value, sol.violated_at),
        (0.0, 0.0, Some(1.0))
    );
    // q puts mass where p has none: only λ = 1 is infinite.
    let sol = pmixed_lambda(&q, &p, order(18.0), 0.5).unwrap();
    assert!(
        sol.lambda > 0.0 && sol.lambda < 1.0 && sol.value <= 0.5,
        "{sol:?}"
    );
}

#[test]
fn mixture_matches_the_evaluated_constraint() {
    let q = distribution(50, 9, 2.0);
    let p = distribution(50, 10, 20.0);
    let proj = PmixedProjection::new(&p, &q, order(18.0), 3.6).unwrap();
    let sol = proj.solve().unwrap();
    assert_eq!(proj.constraint(sol.lambda).unwrap(), sol.value);
    let mix = proj.mixture(sol.lambda).unwrap();
    let direct = privmix_renyi::symmetric_divergence(&mix, &q, order(18.0)).unwrap();
    assert!(
        (direct - sol.value).abs() <= 1e-12 * (1.0 + sol.value),
        "{direct} vs {sol:?}"
    );
    assert!(proj.mixture(1.5).is_err() && proj.constraint(f64::NAN).is_err());
}

#[test]
fn batch_matches_rows_and_names_bad_rows() {
    let q = distribution(20, 1, 1.0);
    let rows: Vec<f64> = (0..5)
        .flat_map(|s| distribution(20, s + 50, 10.0))
        .collect();
    let batch = pmixed_lambdas(&rows, &q, order(18.0), 3.6).unwrap();
    for (i, sol) in batch.iter().enumerate() {
        assert_eq!(
            *sol,
            pmixed_lambda(&rows[i * 20..(i + 1) * 20], &q, order(18.0), 3.6).unwrap()
        );
    }
    assert_eq!(
        pmixed_lambdas(&rows[..30], &q, order(2.0), 1.0),
        Err(MixingError::RaggedBatch {
            len: 30,
            row_len: 20
        })
    );
    assert_eq!(
        pmixed_lambdas(&rows, &[], order(2.0), 1.0),
        Err(MixingError::Empty)
    );
    let mut bad = rows.clone();
    bad[45] = -0.1;
    bad[85] = f64::NAN;
    match pmixed_lambdas(&bad, &q, order(2.0), 1.0) {
        Err(MixingError::Row { row: 2, source }) => {
            assert!(matches!(*source, MixingError::Renyi(_)))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn rejects_bad_parameters() {
    let q = [0.5, 0.5];
    assert_eq!(
        pmixed_lambda(&q, &q, order(2.0), -0.5),
        Err(MixingError::InvalidBound(-0.5))
    );
    assert!(matches!(
        pmixed_lambda(&q, &q, Order::Finite(0.5), 1.0),
        Err(MixingError::Renyi(_))
    ));
    assert!(matches!(
        pmixed_lambda(&q, &[0.5, 0.6], order(2.0), 1.0),
        Err(MixingError::Renyi(_))
    ));
}

/// Zipf-like public logits and private logits perturbed by N(0, σ²) noise: shaped like a
/// language model's next-token distributions.
fn language_model_pair(len: usize, sigma: f64, state: &mut u64) -> (Vec<f64>, Vec<f64>) {
    let mut uniform = || {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut normal = || {
        let (a, b) = (uniform().max(1e-300), uniform());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    };
    let softmax = |z: &[f64]| {
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|x| (x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect::<Vec<f64>>()
    };
    let z0: Vec<f64> = (0..len)
        .map(|i| -1.1 * ((i + 1) as f64).ln() + 0.5 * normal())
        .collect();
    let z1: Vec<f64> = z0.iter().map(|&z| z + sigma * normal()).collect();
    (softmax(&z1), softmax(&z0))
}

#[test]
fn language_model_shaped_inputs_take_a_handful_of_passes() {
    // Orders and bounds of PMixED/AdaPMixED (α = 18, βα = 3.6 and 0.36) and of small
    // orders; σ from near-public to far-from-public private models. Each solve must cost at
    // most 8 evaluations (20-step bisection costs 21), and close its bracket.
    let mut state = 5u64;
    for &(alpha, b) in &[
        (18.0, 3.6),
        (18.0, 0.36),
        (2.0, 0.01),
        (2.0, 0.4),
        (6.0, 1.2),
    ] {
        for &sigma in &[0.3, 1.0, 3.0] {
            for _ in 0..3 {
                let (p, q) = language_model_pair(2000, sigma, &mut state);
                let proj = PmixedProjection::new(&p, &q, order(alpha), b).unwrap();
                let sol = proj.solve().unwrap();
                assert!(sol.evaluations <= 8, "α {alpha} b {b} σ {sigma}: {sol:?}");
                assert!(sol.value <= b && proj.constraint(sol.lambda).unwrap() == sol.value);
                if let Some(hi) = sol.violated_at {
                    assert!(
                        hi - sol.lambda <= LAMBDA_TOLERANCE && proj.constraint(hi).unwrap() > b
                    );
                }
            }
        }
    }
}

#[test]
fn public_validated_once_gives_the_same_projection() {
    let q = distribution(300, 11, 3.0);
    let public = ValidatedRow::new(&q).unwrap();
    for (seed, alpha) in [(1, 2.0), (2, 18.0), (3, 36.0), (4, 7.5), (5, f64::INFINITY)] {
        let p = distribution(300, seed, 2.0);
        let old = PmixedProjection::new(&p, &q, order(alpha), 1.5).unwrap();
        let new = PmixedProjection::with_public(&p, &public, order(alpha), 1.5).unwrap();
        assert_eq!(old.solve().unwrap(), new.solve().unwrap(), "α = {alpha}");
        let private = ValidatedRow::new(&p).unwrap();
        let rows = PmixedProjection::from_rows(&private, &public, order(alpha), 1.5).unwrap();
        assert_eq!(old.solve().unwrap(), rows.solve().unwrap(), "α = {alpha}");
    }
    // The private row is still validated, and the lengths checked.
    let bad = vec![0.5; 300];
    assert!(PmixedProjection::with_public(&bad, &public, order(2.0), 1.0).is_err());
    let short = distribution(299, 1, 2.0);
    assert!(PmixedProjection::with_public(&short, &public, order(2.0), 1.0).is_err());
    assert!(ValidatedRow::new(&bad).is_err());
    let short = ValidatedRow::new(&short).unwrap();
    assert!(PmixedProjection::from_rows(&short, &public, order(2.0), 1.0).is_err());
}
