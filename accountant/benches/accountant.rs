//! Accountant benches: (ε, δ) conversion over dp_accounting's default orders,
//! and amplification of a curve by subsampling.
//!
//! Each group has a `baseline_*` function: the same formula in plain
//! round-to-nearest f64 without outward rounding or interval enclosures (the
//! way dp_accounting and Opacus evaluate it), so the ratios show what the
//! guaranteed-upper-bound arithmetic costs.
//!
//! Run: `cargo bench -p privmix-accountant --bench accountant`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use privmix_accountant::{
    Orders, RdpCurve, poisson_subsampled_gaussian, without_replacement_gaussian,
};

/// Balle et al. (arXiv:1905.09982)'s ε minimised over orders, in plain f64.
fn naive_epsilon(orders: &[f64], rdp: &[f64], delta: f64) -> f64 {
    orders
        .iter()
        .zip(rdp)
        .map(|(&a, &r)| r + (-1.0 / a).ln_1p() - (delta.ln() + a.ln()) / (a - 1.0))
        .fold(f64::INFINITY, f64::min)
        .max(0.0)
}

/// Zhu & Wang's tight Poisson bound at integer orders, in plain f64
/// log-sum-exp (fractional orders left as they are).
fn naive_poisson(orders: &[f64], rdp: &[f64], q: f64) -> Vec<f64> {
    let eps_at = |j: u32| {
        let i = orders.partition_point(|&a| a < f64::from(j));
        rdp.get(i).copied().unwrap_or(f64::INFINITY)
    };
    orders
        .iter()
        .zip(rdp)
        .map(|(&a, &r)| {
            if a.fract() != 0.0 {
                return r;
            }
            let n = a as u32;
            let mut ln_c = 0.0f64;
            let mut terms = Vec::with_capacity(n as usize + 1);
            for k in 0..=n {
                if k > 0 {
                    ln_c += f64::from(n - k + 1).ln() - f64::from(k).ln();
                }
                let c = if k < 2 {
                    0.0
                } else {
                    f64::from(k - 1) * eps_at(k)
                };
                terms.push(ln_c + f64::from(k) * q.ln() + f64::from(n - k) * (-q).ln_1p() + c);
            }
            let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = terms.iter().map(|t| (t - m).exp()).sum();
            ((m + s.ln()) / (a - 1.0)).min(r)
        })
        .collect()
}

fn conversion(c: &mut Criterion) {
    let orders = Orders::dp_accounting_default();
    let curve = poisson_subsampled_gaussian(&orders, 0.04, 1.5)
        .unwrap()
        .self_compose(2250);
    let mut group = c.benchmark_group("conversion");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2));
    group.bench_function("baseline_naive_f64_epsilon", |b| {
        b.iter(|| {
            naive_epsilon(
                orders.as_slice(),
                black_box(curve.epsilons()),
                black_box(1e-5),
            )
        })
    });
    group.bench_function("epsilon_default_orders", |b| {
        b.iter(|| black_box(&curve).epsilon(black_box(1e-5)).unwrap())
    });
    group.bench_function("delta_default_orders", |b| {
        b.iter(|| black_box(&curve).delta(black_box(7.0)).unwrap())
    });
    group.finish();
}

fn subsampling(c: &mut Criterion) {
    let orders = Orders::dp_accounting_default();
    let curve = RdpCurve::from_fn(orders.clone(), |a| 4.0 * 0.01 * a).unwrap();
    let mut group = c.benchmark_group("subsampling");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.bench_function("baseline_naive_f64_poisson_integer_orders", |b| {
        b.iter(|| {
            naive_poisson(
                orders.as_slice(),
                black_box(curve.epsilons()),
                black_box(0.04),
            )
        })
    });
    group.bench_function("poisson_general_default_orders", |b| {
        b.iter(|| {
            black_box(&curve)
                .poisson_subsampled(black_box(0.04))
                .unwrap()
        })
    });
    group.bench_function("without_replacement_general_default_orders", |b| {
        b.iter(|| {
            black_box(&curve)
                .sampled_without_replacement(black_box(0.04))
                .unwrap()
        })
    });
    group.bench_function("poisson_gaussian_default_orders", |b| {
        b.iter(|| poisson_subsampled_gaussian(black_box(&orders), 0.04, 1.5).unwrap())
    });
    group.bench_function("without_replacement_gaussian_default_orders", |b| {
        b.iter(|| without_replacement_gaussian(black_box(&orders), 0.04, 1.5).unwrap())
    });
    group.finish();
}

criterion_group!(benches, conversion, subsampling);
criterion_main!(benches);
