//! The coins, exercised: each sampler the verifier's laws assume exact is tested
//! against its exact law with Pearson's chi-square goodness-of-fit test
//! (`verifier/stats.rs`), at a fixed seed.
//!
//! Every test uses significance level 10⁻³ and states its power as computed by
//! `stats::detectable` (the noncentral chi-square approximation of Pearson's statistic,
//! noncentrality `n·χ²(p₁‖p₀)`): the smallest χ²-distance `χ²(p₁‖p₀)` of an
//! alternative law p₁ detected with probability ≥ 0.99, and the total variation above
//! which every alternative is detected with that power (`TV ≤ ½√χ²`). The test
//! `stated_powers_are_the_computed_ones` recomputes each stated value, so the comments
//! cannot drift from the code.
//!
//! | sampler (entry point) | draws n | bins | χ² detected at power 0.99 | TV |
//! |---|---|---|---|---|
//! | Poisson draw of PMixED's `release` (N = 3, q = 0.3) | 20 000 | 8 subsets | 2.27e-3 | 0.024 |
//! | `sample_index` (V = 6, one zero mass) | 100 000 | 5 | 4.01e-4 | 0.010 |
//! | token of `EnsembleMechanism::step` (SubMix) | 50 000 | 4 | 7.59e-4 | 0.014 |
//! | `sample_discrete_gaussian` (σ = 1.5) | 100 000 | 9 | 4.69e-4 | 0.011 |
//! | `gaussian_on_grid` (σ = 0.25, g = 1/16: 4 units, AdaPMixED's verifier grid) | 100 000 | 15 | 5.41e-4 | 0.012 |
//! | `sample_discrete_laplace` (scale 2) | 100 000 | 11 | 4.95e-4 | 0.011 |
//! | `sample_bernoulli` (p = 0.3) | 100 000 | 2 | 3.16e-4 | 0.009 |
//!
//! For example, the Bernoulli test detects any p₁ with |p₁ − 0.3| ≥ 0.0082 with power
//! ≥ 0.99 (χ²(p₁‖p₀) = δ²/(p(1−p)) = 3.16e-4 at δ = 0.0082). A fixed seed makes each test
//! deterministic: it passes or fails the same way on every run.
//!
//! Zero-mass outcomes (a token of mass 0, a subset of probability 0) must never be
//! drawn: those are checked exactly, not statistically.

use crate::verifier;

use privmix_accountant::Orders;
use privmix_mechanisms::noise::{
    gaussian_on_grid, sample_bernoulli, sample_discrete_gaussian, sample_discrete_laplace,
};
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, SubMix, SubmixConfig,
    Unbudgeted, sample_index,
};
use verifier::pmixed::{Mixtures, average, poisson};
use verifier::stats::{assert_fits, detectable};

const LEVEL: f64 = 1e-3;
const POWER: f64 = 0.99;

/// The stated χ²-distance detected at power 0.99 for (bins, draws) (module table).
const STATED: [(usize, usize, f64); 7] = [
    (8, 20_000, 2.27e-3),
    (5, 100_000, 4.01e-4),
    (4, 50_000, 7.59e-4),
    (9, 100_000, 4.69e-4),
    (15, 100_000, 5.41e-4),
    (11, 100_000, 4.95e-4),
    (2, 100_000, 3.16e-4),
];

#[test]
fn stated_powers_are_the_computed_ones() {
    for (bins, n, stated) in STATED {
        let d = detectable(bins, n, LEVEL, POWER);
        assert!(
            (d - stated).abs() <= 0.01 * stated,
            "{bins} bins, {n} draws: detectable χ² {d:.3e}, stated {stated:.3e}"
        );
        let tv = 0.5 * d.sqrt();
        println!("{bins} bins, {n} draws: χ² {d:.3e}, TV {tv:.4}");
    }
    // The statistics themselves: the chi-square quantile at 10⁻³ for 1 and 7 degrees
    // of freedom (tables: 10.828, 24.322).
    assert!((verifier::stats::chi2_critical(1.0, 1e-3) - 10.828).abs() < 1e-3);
    assert!((verifier::stats::chi2_critical(7.0, 1e-3) - 24.322).abs() < 1e-3);
}

/// PMixED's Poisson draw as `release` makes it: N = 3 distinguishable members, each
/// release identified with the subset whose average of checked mixtures it equals (the
/// verifier's recomputation, `verifier/pmixed.rs`), counted against `q^|S|(1−q)^{3−|S|}`.
#[test]
fn pmixed_release_draws_the_poisson_law() {
    let (alpha_c, radius, q) = (8.0, 2.0, 0.3);
    let public = vec![0.25; 4];
    let members = [
        vec![0.7, 0.1, 0.1, 0.1],
        vec![0.1, 0.7, 0.1, 0.1],
        vec![0.1, 0.1, 0.7, 0.1],
    ];
    let mut mixtures = Mixtures::default();
    let own: Vec<Vec<f64>> = members
        .iter()
        .map(|m| mixtures.get(alpha_c, radius, &public, m))
        .collect();
    let expected: Vec<Vec<f64>> = (0u32..8)
        .map(|mask| {
            let rows: Vec<Vec<f64>> = (0..3)
                .filter(|&i| mask >> i & 1 == 1)
                .map(|i| own[i].clone())
                .collect();
            if rows.is_empty() {
                public.clone()
            } else {
                average(&rows, 4)
            }
        })
        .collect();
    let e = Ensemble::from_probabilities(&public, &members.concat()).unwrap();
    let mut mech = Pmixed::new(PmixedConfig::new(alpha_c, radius, q).unwrap());
    let mut account = Unbudgeted::new(Orders::new(vec![2.0]).unwrap());
    let mut rng = PrivacyRng::from_seed(2024);
    let n = 20_000;
    let mut counts = [0u64; 8];
    for _ in 0..n {
        let d = mech
            .release(&e, &mut rng, &mut account)
            .unwrap()
            .distribution;
        let matching: Vec<usize> = (0..8)
            .filter(|&m| {
                d.iter()
                    .zip(&expected[m])
                    .all(|(a, b)| (a - b).abs() < 1e-9)
            })
            .collect();
        assert_eq!(matching.len(), 1, "release {d:?} is no subset's");
        counts[matching[0]] += 1;
    }
    let p: Vec<f64> = (0u32..8).map(|m| poisson(m, 3, q)).collect();
    assert_fits("PMixED's Poisson draw", &counts, &p, LEVEL);
}

/// `sample_index` on a vector with a zero mass (never drawn) and uneven masses.
#[test]
fn sample_index_draws_its_law() {
    let p = [0.3, 0.0, 0.25, 0.2, 0.15, 0.1];
    let mut rng = PrivacyRng::from_seed(7);
    let mut counts = [0u64; 6];
    for _ in 0..100_000 {
        counts[sample_index(&p, &mut rng).unwrap()] += 1;
    }
    assert_eq!(counts[1], 0, "drew a token of mass 0");
    let bins: Vec<u64> = [0, 2, 3, 4, 5].iter().map(|&i| counts[i]).collect();
    let law: Vec<f64> = [0, 2, 3, 4, 5].iter().map(|&i| p[i]).collect();
    assert_fits("sample_index", &bins, &law, LEVEL);
}

/// The token coin as a mechanism's `step` draws it (SubMix, whose release has no coin):
/// the tokens against the released distribution.
#[test]
fn a_step_draws_its_token_from_the_released_law() {
    let public = [0.4, 0.3, 0.2, 0.1];
    let members = [
        [0.1, 0.2, 0.3, 0.4],
        [0.25, 0.25, 0.25, 0.25],
        [0.7, 0.1, 0.1, 0.1],
        [0.4, 0.3, 0.2, 0.1],
    ]
    .concat();
    let e = Ensemble::from_probabilities(&public, &members).unwrap();
    let mut mech = SubMix::new(SubmixConfig::new(2, 2.0, 1.0, 8.0, 1.0).unwrap());
    let mut account = Unbudgeted::new(Orders::new(vec![2.0]).unwrap());
    let mut rng = PrivacyRng::from_seed(11);
    let law = mech
        .release(&e, &mut rng, &mut account)
        .unwrap()
        .distribution;
    let mut counts = [0u64; 4];
    for _ in 0..50_000 {
        counts[mech.step(&e, &mut rng, &mut account).unwrap().token] += 1;
    }
    assert_fits("a SubMix step's token", &counts, &law, LEVEL);
}

/// Counts of integer draws in the bins `≤ lo`, `lo+1 … hi−1`, `≥ hi`, and their exact
/// probabilities under the unnormalised weight `w` (summed over |z| ≤ 200: the mass
/// beyond is below 1e-300 of the total for the laws used).
fn integer_bins(draws: &[i64], lo: i64, hi: i64, w: impl Fn(i64) -> f64) -> (Vec<u64>, Vec<f64>) {
    let bin = |z: i64| (z.clamp(lo, hi) - lo) as usize;
    let mut counts = vec![0u64; (hi - lo + 1) as usize];
    for &z in draws {
        counts[bin(z)] += 1;
    }
    let mut law = vec![0.0; counts.len()];
    for z in -200..=200 {
        law[bin(z)] += w(z);
    }
    (counts, law)
}

#[test]
fn discrete_gaussian_draws_its_law() {
    let sigma: f64 = 1.5;
    let mut rng = PrivacyRng::from_seed(13);
    let draws: Vec<i64> = (0..100_000)
        .map(|_| sample_discrete_gaussian(sigma, &mut rng).unwrap())
        .collect();
    let (counts, law) = integer_bins(&draws, -4, 4, |z| {
        (-(z as f64).powi(2) / (2.0 * sigma * sigma)).exp()
    });
    assert_fits("sample_discrete_gaussian", &counts, &law, LEVEL);
}

/// The screening noise as AdaPMixED adds it: `gaussian_on_grid` at the verifier's grid
/// (σ = 0.25, g = 1/16, so 4 grid units), read back in grid units from a zero query.
#[test]
fn gaussian_on_grid_draws_its_law() {
    let (sigma, g) = (0.25, 0.0625);
    let units = sigma / g;
    let mut rng = PrivacyRng::from_seed(17);
    let mut draws = Vec::with_capacity(100_000);
    for _ in 0..50_000 {
        for x in gaussian_on_grid(&[0.0, 0.0], sigma, g, &mut rng).unwrap() {
            let z = x / g;
            assert_eq!(z, z.round(), "off the grid: {x}");
            draws.push(z as i64);
        }
    }
    let (counts, law) = integer_bins(&draws, -7, 7, |z| {
        (-(z as f64).powi(2) / (2.0 * units * units)).exp()
    });
    assert_fits("gaussian_on_grid", &counts, &law, LEVEL);
}

#[test]
fn discrete_laplace_draws_its_law() {
    let scale = 2.0;
    let mut rng = PrivacyRng::from_seed(19);
    let draws: Vec<i64> = (0..100_000)
        .map(|_| sample_discrete_laplace(scale, &mut rng).unwrap())
        .collect();
    let (counts, law) = integer_bins(&draws, -5, 5, |z| (-(z.abs() as f64) / scale).exp());
    assert_fits("sample_discrete_laplace", &counts, &law, LEVEL);
}

#[test]
fn bernoulli_draws_its_law() {
    let mut rng = PrivacyRng::from_seed(23);
    let mut counts = [0u64; 2];
    for _ in 0..100_000 {
        counts[sample_bernoulli(0.3, &mut rng).unwrap() as usize] += 1;
    }
    assert_fits("sample_bernoulli", &counts, &[0.7, 0.3], LEVEL);
    // The extremes are exact.
    assert!(!sample_bernoulli(0.0, &mut rng).unwrap());
    assert!(sample_bernoulli(1.0, &mut rng).unwrap());
}
