//! One AdaPMixED step and one PMixED step at N = 100, V = 50257 (GPT-2's
//! vocabulary), α = 18, beside a plain streaming pass over the same N×V buffer
//! (`baseline_streaming_pass`: one sum per row, the baseline; it is bound by
//! the latency of its chain of additions), the same pass with 16 partial sums per
//! row (`baseline_vectorised_pass`, bound by DRAM bandwidth), and a straightforward
//! implementation
//! (`straightforward_*`: λ by 20-halving bisection after checking λ = 1, as in the
//! reference code; leave-one-out means rebuilt from scratch, O(N²V)).
//!
//! Inputs are synthetic but shaped like language-model outputs: p₀ = softmax of
//! Gaussian logits (scale 3), each member = softmax of p₀'s logits plus
//! independent Gaussian perturbations (scale 1), so λ's are strictly inside (0, 1).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use privmix_accountant::Orders;
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng,
    Rows, Unbudgeted,
};
use privmix_renyi::{Order, symmetric_divergence};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Duration;

const N: usize = 100;
const V: usize = 50_257;
const ALPHA: f64 = 18.0;
/// PMixED enforces λ at α_c = 36 so that its proven bound is finite at α = 18
/// (α_max = 36²/71 ≈ 18.25).
const PMIXED_ALPHA_C: f64 = 36.0;

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

/// The public row and the N member rows (row-major), as a model runtime hands them over.
fn rows() -> (Vec<f64>, Vec<f64>) {
    let mut rng = ChaCha20Rng::seed_from_u64(2024);
    let wide = Normal::new(0.0, 3.0).unwrap();
    let narrow = Normal::new(0.0, 1.0).unwrap();
    let base: Vec<f64> = (0..V).map(|_| wide.sample(&mut rng)).collect();
    let public = softmax(&base);
    let mut members = Vec::with_capacity(N * V);
    for _ in 0..N {
        let l: Vec<f64> = base.iter().map(|b| b + narrow.sample(&mut rng)).collect();
        members.extend(softmax(&l));
    }
    (public, members)
}

/// The reference code's λ: check λ = 1, else 20 halvings of [0, 1], returning the
/// lower bracket; each evaluation builds the mixture and computes Dsym.
fn bisection_lambda(p: &[f64], p0: &[f64], order: Order, bound: f64) -> f64 {
    let mut mix = vec![0.0; p.len()];
    let mut feasible = |l: f64| {
        mix.iter_mut()
            .zip(p.iter().zip(p0))
            .for_each(|(m, (&a, &b))| *m = l * a + (1.0 - l) * b);
        symmetric_divergence(&mix, p0, order).unwrap() <= bound
    };
    if feasible(1.0) {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..20 {
        let mid = (lo + hi) / 2.0;
        if feasible(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn mixtures(e: &Ensemble, lambdas: &[f64]) -> Vec<Vec<f64>> {
    (0..e.len())
        .into_par_iter()
        .map(|i| {
            e.member(i)
                .iter()
                .zip(e.public())
                .map(|(&p, &q)| lambdas[i] * p + (1.0 - lambdas[i]) * q)
                .collect()
        })
        .collect()
}

fn average(rows: &[&Vec<f64>]) -> Vec<f64> {
    let mut avg = vec![0.0; V];
    for r in rows {
        avg.iter_mut().zip(r.iter()).for_each(|(a, &x)| *a += x);
    }
    let n = rows.len() as f64;
    avg.iter_mut().for_each(|a| *a /= n);
    avg
}

fn straightforward_lambdas(e: &Ensemble, alpha_c: f64, bound: f64) -> Vec<f64> {
    let order = Order::new(alpha_c).unwrap();
    (0..e.len())
        .into_par_iter()
        .map(|i| bisection_lambda(e.member(i), e.public(), order, bound))
        .collect()
}

fn straightforward_adapmixed(e: &Ensemble, bound: f64) -> (Vec<f64>, f64) {
    let lambdas = straightforward_lambdas(e, ALPHA, bound);
    let mix = mixtures(e, &lambdas);
    let all: Vec<&Vec<f64>> = mix.iter().collect();
    let p = average(&all);
    let order = Order::new(ALPHA).unwrap();
    let loss = (0..e.len())
        .into_par_iter()
        .map(|i| {
            let others: Vec<&Vec<f64>> = mix
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| m)
                .collect();
            symmetric_divergence(&p, &average(&others), order).unwrap()
        })
        .reduce(|| 0.0, f64::max);
    (p, loss)
}

fn streaming_pass(e: &Ensemble) -> f64 {
    e.members()
        .par_chunks(V)
        .map(|row| row.iter().sum::<f64>())
        .sum()
}

/// The same pass with 16 independent partial sums per row, so that it is bound by
/// memory bandwidth rather than by the latency of one chain of additions (the plain
/// pass above is the baseline; this one is reported beside it so that the
/// ratio to a pass at DRAM speed is visible too).
fn vectorised_pass(e: &Ensemble) -> f64 {
    e.members()
        .par_chunks(V)
        .map(|row| {
            let mut lanes = [0.0_f64; 16];
            let blocks = row.chunks_exact(16);
            let rest: f64 = blocks.remainder().iter().sum();
            for block in blocks {
                for (l, &x) in lanes.iter_mut().zip(block) {
                    *l += x;
                }
            }
            lanes.iter().sum::<f64>() + rest
        })
        .sum()
}

fn benches(c: &mut Criterion) {
    let (public, members) = rows();
    let e = Ensemble::from_probabilities(&public, &members).unwrap();
    let orders = Orders::new(vec![ALPHA]).unwrap();
    let radius = 0.2 * ALPHA; // the paper's β = 0.2 at α = 18

    let mut group = c.benchmark_group("adapmixed_step_n100_v50257");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("baseline_streaming_pass", |b| {
        b.iter(|| black_box(streaming_pass(&e)))
    });
    group.bench_function("baseline_vectorised_pass", |b| {
        b.iter(|| black_box(vectorised_pass(&e)))
    });
    let mut ada = Adapmixed::new(AdapmixedConfig {
        threshold: f64::INFINITY, // always answer privately: the full step
        ..AdapmixedConfig::default()
    })
    .unwrap();
    let mut acc = Unbudgeted::new(orders.clone());
    let mut rng = PrivacyRng::from_seed(7);
    // The λ solves dominate a step: say how many constraint evaluations one takes.
    let evaluations = ada
        .step(&e, &mut rng, &mut acc)
        .unwrap()
        .diagnostics
        .solver_evaluations;
    eprintln!("adapmixed_step: {evaluations} solver evaluations for {N} members");
    group.bench_function("adapmixed_step", |b| {
        b.iter(|| black_box(ada.step(&e, &mut rng, &mut acc).unwrap()))
    });
    // The step's two O(N·V) parts on their own.
    let answer = ada.private_answer(&e).unwrap();
    group.bench_function("part_lambdas_and_mixture", |b| {
        b.iter(|| black_box(ada.private_answer(&e).unwrap()))
    });
    group.bench_function("part_leave_one_out", |b| {
        b.iter(|| black_box(ada.data_dependent_losses(&e, &answer, &[ALPHA]).unwrap()))
    });
    // Not part of a step: checking and converting the rows a runtime hands over
    // (once per token, shared by every mechanism run on them).
    group.bench_function("ensemble_new", |b| {
        b.iter(|| black_box(Ensemble::from_probabilities(&public, &members).unwrap()))
    });
    let mut reused = Some(e.clone());
    group.bench_function("ensemble_renew", |b| {
        b.iter(|| {
            let next = reused
                .take()
                .unwrap()
                .renew(Rows::ProbF64(&public), Rows::ProbF64(&members))
                .unwrap();
            black_box(next.len());
            reused = Some(next);
        })
    });
    group.bench_function("straightforward_adapmixed", |b| {
        b.iter(|| black_box(straightforward_adapmixed(&e, radius)))
    });
    group.finish();

    let mut group = c.benchmark_group("pmixed_step_n100_v50257");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("baseline_streaming_pass", |b| {
        b.iter(|| black_box(streaming_pass(&e)))
    });
    let mut pm = Pmixed::new(PmixedConfig::new(PMIXED_ALPHA_C, radius, 1.0).unwrap());
    group.bench_function("pmixed_step", |b| {
        b.iter(|| black_box(pm.step(&e, &mut rng, &mut acc).unwrap()))
    });
    group.bench_function("straightforward_pmixed", |b| {
        b.iter(|| {
            let lambdas = straightforward_lambdas(&e, PMIXED_ALPHA_C, radius);
            let mix = mixtures(&e, &lambdas);
            black_box(average(&mix.iter().collect::<Vec<_>>()))
        })
    });
    group.finish();
}

criterion_group!(steps, benches);
criterion_main!(steps);
