//! Embedding Space Aggregation (Wu et al. 2023): the charge checked against
//! the divergences of what it releases, on neighbouring datasets (one
//! subset's output replaced by any other vector: replace-one adjacency).
//!
//! * The noisy grid point `g·(R + Z)`, Z i.i.d. discrete Gaussian: for integer
//!   shifts its Rényi divergence is at most `α‖g(R − R')‖²/(2σ²)` (Canonne,
//!   Kamath & Steinke, arXiv 2004.00010), for arbitrary (unnormalised, even
//!   huge) outputs after clipping, where `R = round(μ/g)` is the f64 clipped
//!   mean rounded to the grid. The charge must cover the f64 rounding of the
//!   clipping and the mean, and the grid's.
//! * The released candidate, end to end, in one dimension with candidates
//!   `+1` and `−1` on a coarse grid: the answer is `+1` exactly when
//!   `R + Z ≥ 0` (Ê = 0 ties to the first), a lattice sum; its symmetric
//!   divergence must be at most the charge too.

use privmix_accountant::Orders;
use privmix_mechanisms::{EmbeddingSpaceAggregation, PrivacyRng, Unbudgeted, clipped_mean};
use privmix_renyi::{Order, symmetric_divergence};
use proptest::prelude::*;

const ORDERS: [f64; 7] = [1.1, 1.5, 2.0, 4.0, 8.0, 18.0, 64.0];

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// Vectors of any norm (up to 100), including ones the clipping must shrink.
fn vector(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-10.0f32..10.0, dim)
}

fn outputs_and_replacement() -> impl Strategy<Value = (Vec<Vec<f32>>, usize, Vec<f32>)> {
    (1usize..=8, 1usize..=6)
        .prop_flat_map(|(n, d)| (prop::collection::vec(vector(d), n), 0..n, vector(d)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_gaussian_release_never_costs_more_than_charged(
        (outputs, i, replacement) in outputs_and_replacement(),
        sigma in 0.01f64..5.0,
    ) {
        let esa = EmbeddingSpaceAggregation::new(sigma).unwrap();
        let g = esa.granularity();
        let mut neighbour = outputs.clone();
        neighbour[i] = replacement;
        let (mu, mu2) = (clipped_mean(&outputs).unwrap(), clipped_mean(&neighbour).unwrap());
        let dist2: f64 = mu
            .iter()
            .zip(&mu2)
            .map(|(a, b)| (g * ((a / g).round() - (b / g).round())).powi(2))
            .sum();
        let charge = esa.curve(&orders(), outputs.len(), mu.len()).unwrap();
        for (&a, &e) in ORDERS.iter().zip(charge.epsilons()) {
            let exact = a * dist2 / (2.0 * sigma * sigma);
            prop_assert!(exact <= e, "α {a}: exact {exact} > charged {e}");
        }
    }

    #[test]
    fn the_released_answer_never_costs_more_than_charged(
        n in 1usize..=8,
        values in prop::collection::vec(-3.0f32..3.0, 8),
        replacement in -3.0f32..3.0,
        i in 0usize..8,
        sigma in 0.05f64..3.0,
    ) {
        let outputs: Vec<Vec<f32>> = values[..n].iter().map(|&v| vec![v]).collect();
        let mut neighbour = outputs.clone();
        neighbour[i % n] = vec![replacement];
        let g = 1.0 / 16.0;
        let esa = EmbeddingSpaceAggregation::with_granularity(sigma, g).unwrap();
        let (p, p2) = (
            plus_law(&outputs, sigma, g),
            plus_law(&neighbour, sigma, g),
        );
        let charge = esa.curve(&orders(), n, 1).unwrap();
        for (&a, &e) in ORDERS.iter().zip(charge.epsilons()) {
            let d = symmetric_divergence(&p, &p2, Order::new(a).unwrap())
                .unwrap();
            prop_assert!(d <= e, "α {a}: output divergence {d} > charged {e}");
        }
    }
}

/// `[P(R + Z ≥ 0), P(R + Z < 0)]` for `R = round(μ/g)` and Z discrete Gaussian
/// with parameter σ/g, the lattice summed to 40 parameters out (the rest is
/// below 1e-300 of the mass).
fn plus_law(outputs: &[Vec<f32>], sigma: f64, g: f64) -> [f64; 2] {
    let r = (clipped_mean(outputs).unwrap()[0] / g).round() as i64;
    let s = sigma / g;
    let k = (40.0 * s).ceil() as i64 + 1;
    let (mut plus, mut minus) = (0.0, 0.0);
    // Smallest terms first.
    let mut zs: Vec<i64> = (-k..=k).collect();
    zs.sort_by_key(|z| std::cmp::Reverse(z.abs()));
    for z in zs {
        let w = (-((z * z) as f64) / (2.0 * s * s)).exp();
        if r + z >= 0 { plus += w } else { minus += w }
    }
    let total = plus + minus;
    [plus / total, minus / total]
}

/// The one-dimensional answer's frequency agrees with the lattice law: the
/// release really draws from the distribution the exact test reasons about.
#[test]
fn one_dimensional_answers_follow_the_lattice_law() {
    let (sigma, outputs) = (0.5, vec![vec![0.2f32], vec![0.4f32]]);
    let g = 1.0 / 16.0;
    let esa = EmbeddingSpaceAggregation::with_granularity(sigma, g).unwrap();
    let candidates = vec![vec![1.0f32], vec![-1.0f32]];
    let mut rng = PrivacyRng::from_seed(7);
    let mut account = Unbudgeted::new(orders());
    let trials = 20_000;
    let plus = (0..trials)
        .filter(|_| {
            esa.release(&outputs, &candidates, &mut rng, &mut account)
                .unwrap()
                .index
                == 0
        })
        .count() as f64
        / trials as f64;
    let exact = plus_law(&outputs, sigma, g)[0];
    // Binomial standard error ≈ 0.003; 5 of them.
    assert!((plus - exact).abs() < 0.016, "{plus} vs {exact}");
}

/// The reported failure (α 1.5, N = 7, one dimension, σ ≈ 0.491: `exact
/// 0.253549221162308 > charged 0.25354922116230794` when the charge used the
/// f64 2/N): the f64 means of two neighbours (one output +1, the other −1, the
/// rest equal) can be further apart than the f64 2/N, the float sums and
/// division rounding apart. The first such pair in a fixed scan is charged for,
/// before and after the grid rounding.
#[test]
fn means_further_apart_than_two_over_n_are_charged() {
    let n = 7;
    let pair = (1..200_000)
        .map(|k| {
            let rest = (k as f32 * 7.3e-6).fract() * 0.5;
            let outputs: Vec<Vec<f32>> = (0..n)
                .map(|i| vec![if i == 0 { 1.0 } else { rest }])
                .collect();
            let mut neighbour = outputs.clone();
            neighbour[0] = vec![-1.0];
            (outputs, neighbour)
        })
        .find(|(a, b)| {
            (clipped_mean(a).unwrap()[0] - clipped_mean(b).unwrap()[0]).abs() > 2.0f64 / 7.0
        });
    let (outputs, neighbour) = pair.expect("a pair whose f64 means are > 2/N apart");
    let sigma = 0.491;
    let (mu, mu2) = (
        clipped_mean(&outputs).unwrap(),
        clipped_mean(&neighbour).unwrap(),
    );
    let esa = EmbeddingSpaceAggregation::new(sigma).unwrap();
    let g = esa.granularity();
    let charge = esa.curve(&orders(), n, 1).unwrap();
    let rounded = g * ((mu[0] / g).round() - (mu2[0] / g).round());
    for (&a, &e) in ORDERS.iter().zip(charge.epsilons()) {
        for d in [mu[0] - mu2[0], rounded] {
            let exact = a * d * d / (2.0 * sigma * sigma);
            assert!(exact <= e, "α {a}: exact {exact} > charged {e}");
        }
    }
}
