//! The batched kernel on the shape every mechanism evaluates per token: 100 ensemble
//! members' next-token distributions (GPT-2 vocabulary, 50 257 entries, f32) against
//! the public model's. Reported beside `baseline_f32_sum`, a plain sequential f32 sum
//! over the same 100 × 50 257 buffer in the same run; `cargo xtask bench` reports the
//! other benches of the group as ratios to it.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use privmix_renyi::{Direction, Order, batched_divergence};

const ROWS: usize = 100;
const VOCAB: usize = 50_257;

/// Softmax of pseudo-random logits (xorshift, Box-Muller, σ = 3): heavy-tailed like a
/// language model's next-token distribution, smallest entries around 1e-10.
fn softmax_rows(rows: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(rows * VOCAB);
    for _ in 0..rows {
        let logits: Vec<f64> = (0..VOCAB)
            .map(|_| {
                let (u, v) = (uniform(), uniform());
                3.0 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
            })
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
        out.extend(logits.iter().map(|l| ((l - max).exp() / z) as f32));
    }
    out
}

fn batched(c: &mut Criterion) {
    let rows = softmax_rows(ROWS, 0x9E37_79B9_7F4A_7C15);
    let reference = softmax_rows(1, 0xD1B5_4A32_D192_ED03);
    let mut group = c.benchmark_group("batched_100x50257");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements((ROWS * VOCAB) as u64));

    group.bench_function("baseline_f32_sum", |b| {
        b.iter(|| black_box(&rows).iter().sum::<f32>())
    });
    let alpha18 = Order::new(18.0).unwrap();
    group.bench_function("forward_alpha18", |b| {
        b.iter(|| batched_divergence(black_box(&rows), &reference, alpha18, Direction::Forward))
    });
    group.bench_function("symmetric_alpha18", |b| {
        b.iter(|| batched_divergence(black_box(&rows), &reference, alpha18, Direction::Symmetric))
    });
    let fractional = Order::new(17.5).unwrap();
    group.bench_function("forward_alpha17.5", |b| {
        b.iter(|| batched_divergence(black_box(&rows), &reference, fractional, Direction::Forward))
    });
    group.finish();
}

criterion_group!(benches, batched);
criterion_main!(benches);
