//! The two hardware limits a decode step sits between, measured here, and
//! what they imply for the ensemble step bench (`ensemble/benches/step.rs`) on SmolLM2
//! (`models-cache/smollm2.gguf`, from `cargo xtask fetch-models`):
//!
//! - **Memory.** A step reads every projection's weights once, however many
//!   rows it has, so a one-row step takes at least (weight bytes) /
//!   (streaming read bandwidth).
//! - **Multiply-adds.** A step's products multiply every weight by every
//!   row, so with f32 activations nine rows (the public model + 8 members)
//!   take at least 9 · (weights) / (f32 FMA rate).
//!
//! Their quotient bounds the N = 8 ratio from below for an f32-activation
//! step measured against a single-row step that runs at memory speed,
//! before any LoRA update, attention or norm is counted.
//!
//! `cargo run --release -p privmix-models --example bounds`
//!
//! The FMA rate is the best of 3 runs of a register-only loop of 12
//! independent chains of f32 FMAs (pulp's widest vectors: AVX-512 here),
//! on one thread and on every thread. The bandwidth is the best of 3 sums
//! of a 512 MB buffer, split over one thread and over every thread.

use std::time::Instant;

use privmix_models::gguf::GgufFile;
use pulp::{Simd, WithSimd};

/// Independent FMA chains: enough to cover the FMA latency on every pipe.
const CHAINS: usize = 12;

/// FMAs (vector instructions) per thread per run.
const ITERATIONS: usize = 40_000_000;

/// `ITERATIONS` × `CHAINS` vector FMAs; returns a sum so nothing is dropped.
struct FmaLoop;

impl WithSimd for FmaLoop {
    type Output = (f32, usize);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> (f32, usize) {
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        let m = simd.splat_f32s(std::hint::black_box(0.999_999_9));
        let c = simd.splat_f32s(std::hint::black_box(1e-7));
        let mut acc = [simd.splat_f32s(1.0); CHAINS];
        for _ in 0..ITERATIONS {
            for a in &mut acc {
                *a = simd.mul_add_e_f32s(*a, m, c);
            }
        }
        let total = acc
            .iter()
            .fold(simd.splat_f32s(0.0), |s, a| simd.add_f32s(s, *a));
        (simd.reduce_sum_f32s(total), lanes)
    }
}

/// Multiply-adds per second (f32 lanes) over `threads` threads.
fn fma_rate(threads: usize) -> f64 {
    let start = Instant::now();
    let lanes = std::thread::scope(|s| {
        let runs: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| pulp::Arch::new().dispatch(FmaLoop)))
            .collect();
        runs.into_iter()
            .map(|r| {
                let (sum, lanes) = r.join().expect("FMA thread");
                std::hint::black_box(sum);
                lanes
            })
            .max()
            .unwrap_or(1)
    });
    (threads * ITERATIONS * CHAINS * lanes) as f64 / start.elapsed().as_secs_f64()
}

/// Bytes per second read from `buf` split over `threads` threads.
fn bandwidth(buf: &[f32], threads: usize) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for part in buf.chunks(buf.len().div_ceil(threads)) {
            s.spawn(move || {
                let mut acc = [0.0f32; 16];
                for c in part.chunks_exact(16) {
                    for (a, x) in acc.iter_mut().zip(c) {
                        *a += x;
                    }
                }
                std::hint::black_box(acc);
            });
        }
    });
    std::mem::size_of_val(buf) as f64 / start.elapsed().as_secs_f64()
}

fn best(f: impl Fn() -> f64) -> f64 {
    (0..3).map(|_| f()).fold(0.0, f64::max)
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fma_1 = best(|| fma_rate(1));
    let fma_all = best(|| fma_rate(threads));
    let buf: Vec<f32> = (0..128 << 20).map(|i| (i % 7) as f32).collect();
    let bw_1 = best(|| bandwidth(&buf, 1));
    let bw_all = best(|| bandwidth(&buf, threads));
    println!(
        "f32 FMA rate: {:.1} G/s on 1 thread, {:.1} G/s on {threads}",
        fma_1 / 1e9,
        fma_all / 1e9
    );
    println!(
        "streaming reads: {:.1} GB/s on 1 thread, {:.1} GB/s on {threads}",
        bw_1 / 1e9,
        bw_all / 1e9
    );

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models-cache/smollm2.gguf");
    let Ok(gguf) = GgufFile::open(path) else {
        println!("{path} absent (cargo xtask fetch-models): no SmolLM2 figures");
        return;
    };
    // The multiplied weights: every matrix (the tied embedding is the head).
    let (weights, bytes) = gguf
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .fold((0u64, 0u64), |(w, b), t| (w + t.n_elements, b + t.n_bytes));
    let single_ms = bytes as f64 / bw_all * 1e3;
    let nine_ms = 9.0 * weights as f64 / fma_all * 1e3;
    println!(
        "SmolLM2: {weights} weights in {:.1} MB: one row reads them in ≥ {single_ms:.2} ms; \
         nine rows multiply them in f32 in ≥ {nine_ms:.2} ms; quotient {:.2}",
        bytes as f64 / 1e6,
        nine_ms / single_ms
    );
}
