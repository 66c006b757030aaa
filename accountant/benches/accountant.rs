//! Accountant benches: (ε, δ) conversion over dp_accounting's default orders,
//! and amplification of a curve by subsampling.
//!
//! Run: `cargo bench -p privmix-accountant --bench accountant`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use privmix_accountant::{Orders, RdpCurve, poisson_subsampled_gaussian};

fn conversion(c: &mut Criterion) {
    let orders = Orders::dp_accounting_default();
    let curve = RdpCurve::from_fn(orders, |a| 2250.0 * a / (2.0 * 1.5 * 1.5)).unwrap();
    let mut group = c.benchmark_group("conversion");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2));
    group.bench_function("epsilon_default_orders", |b| {
        b.iter(|| black_box(&curve).epsilon(black_box(1e-5)).unwrap())
    });
    group.bench_function("delta_default_orders", |b| {
        b.iter(|| black_box(&curve).delta(black_box(3.0)).unwrap())
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
    group.bench_function("poisson_general_default_orders", |b| {
        b.iter(|| {
            black_box(&curve)
                .poisson_subsampled(black_box(0.04))
                .unwrap()
        })
    });
    group.bench_function("poisson_gaussian_default_orders", |b| {
        b.iter(|| poisson_subsampled_gaussian(black_box(&orders), 0.04, 1.5).unwrap())
    });
    group.finish();
}

criterion_group!(benches, conversion, subsampling);
criterion_main!(benches);
