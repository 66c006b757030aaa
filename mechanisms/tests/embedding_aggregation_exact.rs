//! Embedding Space Aggregation (Wu et al. 2023): the charge checked against
//! exact divergences of what it releases, on neighbouring datasets (one
//! subset's output replaced by any other vector).
//!
//! * The noisy mean `Ê ~ N(μ, σ²I)`: between equal-covariance Gaussians the
//!   Rényi divergence is exactly `α‖μ − μ'‖²/(2σ²)` (Gil, Alajaji & Linder
//!   2013), for arbitrary (unnormalised, even huge) outputs after clipping.
//! * The released candidate, end to end, in one dimension with candidates
//!   `+1` and `−1`: the answer is `+1` with probability `P(Ê > 0) = Φ(μ/σ)
//!   = erfc(−μ/(σ√2))/2`, so the output distribution is an exact Bernoulli,
//!   and its symmetric divergence must be at most the charge too.

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
        let mut neighbour = outputs.clone();
        neighbour[i] = replacement;
        let (mu, mu2) = (clipped_mean(&outputs).unwrap(), clipped_mean(&neighbour).unwrap());
        let dist2: f64 = mu.iter().zip(&mu2).map(|(a, b)| (a - b).powi(2)).sum();
        let charge = esa.curve(&orders(), outputs.len()).unwrap();
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
        // Each tail from its own erfc, so neither rounds to 0 (|μ/σ| ≤ 20).
        let answer = |outs: &[Vec<f32>]| {
            let x = clipped_mean(outs).unwrap()[0] / (sigma * std::f64::consts::SQRT_2);
            [0.5 * libm::erfc(-x), 0.5 * libm::erfc(x)]
        };
        let (p, p2) = (answer(&outputs), answer(&neighbour));
        let esa = EmbeddingSpaceAggregation::new(sigma).unwrap();
        let charge = esa.curve(&orders(), n).unwrap();
        for (&a, &e) in ORDERS.iter().zip(charge.epsilons()) {
            let d = symmetric_divergence(&p, &p2, Order::new(a).unwrap())
                .unwrap();
            prop_assert!(d <= e, "α {a}: output divergence {d} > charged {e}");
        }
    }
}

/// The one-dimensional answer's frequency agrees with `Φ(μ/σ)`: the release
/// really draws from the distribution the exact test reasons about.
#[test]
fn one_dimensional_answers_follow_the_normal_cdf() {
    let (sigma, outputs) = (0.5, vec![vec![0.2f32], vec![0.4f32]]);
    let esa = EmbeddingSpaceAggregation::new(sigma).unwrap();
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
    let exact = 0.5 * libm::erfc(-0.3 / (sigma * std::f64::consts::SQRT_2));
    // Binomial standard error ≈ 0.003; 5 of them.
    assert!((plus - exact).abs() < 0.016, "{plus} vs {exact}");
}
