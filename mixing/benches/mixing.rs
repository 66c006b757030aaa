//! λ solvers against the reference implementations' search and against one plain pass.
//!
//! Groups (each with one `baseline_…`, as `cargo xtask bench` reports ratios to it):
//! * `pmixed_lambda_vs_bisection_{near,far}`: one PMixED λ at V = 50257 (GPT-2's
//!   vocabulary), α = 18, b = βα = 3.6, for a private model near the public one and one
//!   far from it, against `baseline_bisection20`: the scipy-style search of the public
//!   PMixED code (check λ = 1, then 20 halvings of [0, 1], return the lower end) on the same
//!   f64 evaluator.
//! * `pmixed_lambda_vs_pass`: the "far" solve and a single constraint evaluation against
//!   `baseline_streaming_pass`, one plain f64 sum over the private row: the solve's cost in
//!   units of "reading the row once".
//! * `logit_mixing_vs_bisection`: DPS-MOZO's logit λ on a top-60 support, α = 18.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use privmix_mixing::{LogitMixing, PmixedProjection, pmixed_lambda};
use privmix_renyi::{Order, SymmetricMixture};

const VOCAB: usize = 50_257;
const ALPHA: f64 = 18.0;
const BOUND: f64 = 0.2 * ALPHA;

/// splitmix64, for reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next_f64().max(1e-300), self.next_f64());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

fn softmax(z: &[f64]) -> Vec<f64> {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|&x| (x - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Zipf-like public logits and a private model whose logits differ by N(0, σ²) noise:
/// shaped like a language model's next-token distributions.
fn language_model_pair(len: usize, sigma: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng(seed);
    let z0: Vec<f64> = (0..len)
        .map(|i| -1.1 * ((i + 1) as f64).ln() + 0.5 * rng.normal())
        .collect();
    let z1: Vec<f64> = z0.iter().map(|&z| z + sigma * rng.normal()).collect();
    (z1, z0)
}

fn bisection20(p: &[f64], q: &[f64], alpha: Order, bound: f64) -> f64 {
    let path = SymmetricMixture::new(p, q, alpha).unwrap();
    let f = |x: f64| path.evaluate(x).unwrap().max();
    if f(1.0) <= bound {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..20 {
        let mid = 0.5 * (lo + hi);
        if f(mid) <= bound { lo = mid } else { hi = mid }
    }
    lo
}

fn benches(c: &mut Criterion) {
    let alpha = Order::new(ALPHA).unwrap();
    // σ = 1: a private model close to the public one (λ near 1); σ = 3: far from it
    // (λ of a few hundredths, the harder search).
    for (name, sigma) in [("near", 1.0), ("far", 3.0)] {
        let (z1, z0) = language_model_pair(VOCAB, sigma, 7);
        let (p, q) = (softmax(&z1), softmax(&z0));
        let sol = pmixed_lambda(&p, &q, alpha, BOUND).unwrap();
        let bis = bisection20(&p, &q, alpha, BOUND);
        eprintln!("pmixed {name} V={VOCAB} α={ALPHA} b={BOUND}: {sol:?}; bisection20 λ = {bis}");
        let mut g = c.benchmark_group(format!("pmixed_lambda_vs_bisection_{name}"));
        g.sample_size(10)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_millis(500));
        g.bench_function("baseline_bisection20", |b| {
            b.iter(|| bisection20(black_box(&p), black_box(&q), alpha, BOUND))
        });
        g.bench_function("safeguarded_newton", |b| {
            b.iter(|| pmixed_lambda(black_box(&p), black_box(&q), alpha, BOUND))
        });
        g.finish();
    }

    let (z1, z0) = language_model_pair(VOCAB, 3.0, 7);
    let (p, q) = (softmax(&z1), softmax(&z0));
    let mut g = c.benchmark_group("pmixed_lambda_vs_pass");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.bench_function("baseline_streaming_pass", |b| {
        b.iter(|| black_box(&p).iter().sum::<f64>())
    });
    let projection = PmixedProjection::new(&p, &q, alpha, BOUND).unwrap();
    g.bench_function("one_constraint_evaluation", |b| {
        b.iter(|| projection.constraint(black_box(0.3)))
    });
    g.bench_function("safeguarded_newton", |b| {
        b.iter(|| pmixed_lambda(black_box(&p), black_box(&q), alpha, BOUND))
    });
    g.finish();

    let (l1, l0) = language_model_pair(60, 1.0, 11);
    let logit = LogitMixing::new(&l1, &l0, alpha, BOUND).unwrap();
    eprintln!(
        "logit mixing k=60 α={ALPHA} b={BOUND}: {:?}",
        logit.solve().unwrap()
    );
    let mut g = c.benchmark_group("logit_mixing_vs_bisection");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    g.bench_function("baseline_bisection20", |b| {
        b.iter(|| {
            let f = |x: f64| logit.constraint(x).unwrap();
            if f(1.5) <= BOUND {
                return 1.5;
            }
            let (mut lo, mut hi) = (0.0, 1.5);
            for _ in 0..20 {
                let mid = 0.5 * (lo + hi);
                if f(mid) <= BOUND { lo = mid } else { hi = mid }
            }
            lo
        })
    });
    g.bench_function("safeguarded_newton", |b| {
        b.iter(|| {
            LogitMixing::new(black_box(&l1), black_box(&l0), alpha, BOUND)
                .unwrap()
                .solve()
        })
    });
    g.finish();
}

criterion_group!(mixing, benches);
criterion_main!(mixing);
