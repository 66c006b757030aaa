//! Forward-pass timings on the CPU backend (burn-flex): the tiny HF Llama
//! fixture (prefill of 12 tokens) and, when `models-cache/smollm2.gguf` is
//! present, SmolLM2-135M prefill of 32 tokens and one cached decode step
//! after 32 tokens (the unit of generation and of private prediction).
//!
//! `cargo bench -p privmix-models --bench forward`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use privmix_models::layers::linear::Linear;
use privmix_models::{Batch, LanguageModel, LoadOptions, Model};
use rayon::prelude::*;

fn forward(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut group = c.benchmark_group("forward");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));

    let tiny = Model::<Flex>::load(LoadOptions::path(
        dir.join("tests/fixtures/hf/llama"),
        &Default::default(),
    ))
    .unwrap();
    let tokens: Vec<u32> = (3..15).collect();
    let batch = Batch::single(&tokens).unwrap();
    group.bench_function("tiny_llama_prefill_12", |b| {
        b.iter(|| tiny.logits_all(&batch).unwrap())
    });

    let smollm2 = dir.join("../models-cache/smollm2.gguf");
    if smollm2.is_file() {
        let model = Model::<Flex>::load(LoadOptions::path(&smollm2, &Default::default())).unwrap();
        let prompt: Vec<u32> = (0..32).map(|i| 100 + 37 * i).collect();
        let batch = Batch::single(&prompt).unwrap();
        group.bench_function("smollm2_prefill_32", |b| {
            b.iter(|| model.logits_all(&batch).unwrap())
        });
        let mut cache = model.new_cache(1);
        model.forward(&batch, &mut cache, None).unwrap();
        let step = Batch::single(&[42]).unwrap();
        group.bench_function("smollm2_decode_after_32", |b| {
            b.iter_batched(
                || cache.clone(),
                |mut c| model.logits_last(&step, &mut c, None).unwrap(),
                BatchSize::SmallInput,
            )
        });
    } else {
        println!("skipped SmolLM2: {} absent", smollm2.display());
    }
    group.finish();
}

/// A plain single-threaded f32 matrix-vector product `y = W x` over a
/// row-major `[out, in]` `W` (eight independent accumulators so that LLVM
/// vectorises it): what reading the weights once costs without burn.
fn plain_matvec(w: &[f32], x: &[f32], y: &mut [f32]) {
    let k = x.len();
    for (yo, row) in y.iter_mut().zip(w.chunks_exact(k)) {
        let mut acc = [0.0f32; 8];
        for (r, xs) in row.chunks_exact(8).zip(x.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += r[l] * xs[l];
            }
        }
        let tail: f32 = row[k / 8 * 8..]
            .iter()
            .zip(&x[k / 8 * 8..])
            .map(|(a, b)| a * b)
            .sum();
        *yo = acc.iter().sum::<f32>() + tail;
    }
}

/// One row times SmolLM2's tied head (`[1, 576] × [576, 49152]`, 113 MB of
/// f32 weights): burn-flex's matmul on the transposed view (one thread, gemm's
/// gemv), [`Linear::forward_base`] (columns split over rayon's threads), and
/// a plain loop on one thread (`baseline_plain_matvec`) and on all threads.
fn matvec_head(c: &mut Criterion) {
    let (k, n) = (576, 49152);
    let mut group = c.benchmark_group("matvec_head");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Bytes((k * n * 4) as u64));
    let w: Vec<f32> = (0..k * n)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1e4)
        .collect();
    let x: Vec<f32> = (0..k).map(|i| (i % 13) as f32 / 13.0).collect();
    let mut y = vec![0.0f32; n];
    group.bench_function("baseline_plain_matvec", |b| {
        b.iter(|| plain_matvec(&w, &x, &mut y))
    });
    group.bench_function("plain_matvec_rayon", |b| {
        b.iter(|| {
            y.par_chunks_mut(n / rayon::current_num_threads().max(1))
                .enumerate()
                .for_each(|(c, ys)| {
                    let start = c * (n / rayon::current_num_threads().max(1));
                    plain_matvec(&w[start * k..(start + ys.len()) * k], &x, ys)
                })
        })
    });
    let dev = Default::default();
    let wt = Tensor::<Flex, 2>::from_data(TensorData::new(w.clone(), [n, k]), &dev);
    let xt = Tensor::<Flex, 3>::from_data(TensorData::new(x.clone(), [1, 1, k]), &dev);
    let lin = Linear::new(wt, None);
    group.bench_function("burn_matmul_one_thread", |b| {
        b.iter(|| {
            xt.clone()
                .reshape([1, k])
                .matmul(lin.weight_t().clone())
                .into_data()
        })
    });
    group.bench_function("linear_forward_base", |b| {
        b.iter(|| lin.forward_base(xt.clone()).into_data())
    });
    group.finish();
}

/// `[rows, in] × [in, out]` in burn-flex for the two layouts a `Linear` can
/// hold: the transposed view of the checkpoint's `[out, in]` weight, and a
/// contiguous `[in, out]` copy; for SmolLM2's MLP (`576 → 1536`) and tied
/// head (`576 → 49152`) shapes and 1, 8 and 32 rows.
fn matmul_layout(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_layout");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    let dev = Default::default();
    for (k, n) in [(576, 1536), (576, 49152)] {
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1e4)
            .collect();
        let view = Tensor::<Flex, 2>::from_data(TensorData::new(w, [n, k]), &dev).transpose();
        let contiguous = Tensor::<Flex, 2>::from_data(view.clone().into_data(), &dev);
        for rows in [1, 8, 32] {
            let x = Tensor::<Flex, 2>::from_data(
                TensorData::new(
                    (0..rows * k)
                        .map(|i| (i % 13) as f32 / 13.0)
                        .collect::<Vec<_>>(),
                    [rows, k],
                ),
                &dev,
            );
            for (name, wt) in [("view", &view), ("contiguous", &contiguous)] {
                group.bench_function(format!("{name}_{k}x{n}_rows{rows}"), |b| {
                    b.iter(|| x.clone().matmul(wt.clone()).into_data())
                });
            }
        }
    }
    group.finish();
}

/// The quantised decode kernels on one SmolLM2 MLP projection's shape
/// (`[1536, 576]`, Q4_1) for 1 row (a decode step) and 9 rows (the public
/// model and 8 members), on the calling thread alone and with rayon's pool:
/// f32 activations (`rows*`) and 8-bit activations (`int8_rows*`).
fn quantized(c: &mut Criterion) {
    use privmix_models::cpu::BlockWeight;
    use privmix_models::cpu::TiledWeight;
    use privmix_models::gguf::GgmlType;
    let mut group = c.benchmark_group("quantized_q4_1_1536x576");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2));
    let (o, i) = (1536, 576);
    let mut raw = Vec::with_capacity(o * i / 32 * 20);
    for blk in 0..o * i / 32 {
        raw.extend(half::f16::from_f32(0.01).to_le_bytes());
        raw.extend(half::f16::from_f32(-0.05).to_le_bytes());
        raw.extend((0..16).map(|j| ((blk * 31 + j * 7) % 256) as u8));
    }
    let w = BlockWeight::from_ggml(GgmlType::Q4_1, &raw, o, i)
        .unwrap()
        .unwrap();
    let int8 = TiledWeight::from_blocks(&w).unwrap();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for rows in [1, 9] {
        let x: Vec<f32> = (0..rows * i).map(|j| (j % 17) as f32 / 8.0 - 1.0).collect();
        group.bench_function(format!("rows{rows}_pool"), |b| {
            b.iter(|| w.matmul(&x, rows))
        });
        group.bench_function(format!("rows{rows}_one_thread"), |b| {
            b.iter(|| one.install(|| w.matmul(&x, rows)))
        });
        group.bench_function(format!("int8_rows{rows}_pool"), |b| {
            b.iter(|| int8.matmul(&x, rows))
        });
        group.bench_function(format!("int8_rows{rows}_one_thread"), |b| {
            b.iter(|| one.install(|| int8.matmul(&x, rows)))
        });
    }
    group.finish();
}

/// The tile × 8-bit product at each row count a serving step has (9 rows:
/// one request of the public model and 8 members; 72: 8 requests; 288: 32)
/// and around the AMX kernel's smallest row count (16, 32), by the AMX int8
/// kernel and by the AVX-512 VNNI one, on one thread: SmolLM2's MLP up
/// (`[1536, 576]`, Q4_1) and down (`[576, 1536]`, Q8_0) shapes. Where the
/// CPU or process has no AMX both names run the VNNI kernel. The rows
/// ending `_cpu_time` time the VNNI kernel in the thread's CPU time.
fn tiles_q8_isa(c: &mut Criterion) {
    use privmix_models::cpu::{BlockWeight, Isa, TiledWeight};
    use privmix_models::gguf::GgmlType;
    let mut group = c.benchmark_group("tiles_q8_isa");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (ty, o, i) in [(GgmlType::Q4_1, 1536, 576), (GgmlType::Q8_0, 576, 1536)] {
        let mut raw = Vec::new();
        for blk in 0..o * i / 32 {
            raw.extend(half::f16::from_f32(0.01).to_le_bytes());
            if ty == GgmlType::Q4_1 {
                raw.extend(half::f16::from_f32(-0.05).to_le_bytes());
                raw.extend((0..16).map(|j| ((blk * 31 + j * 7) % 256) as u8));
            } else {
                raw.extend((0..32).map(|j| ((blk * 31 + j * 7) % 256) as u8));
            }
        }
        let w = BlockWeight::from_ggml(ty, &raw, o, i).unwrap().unwrap();
        let tiled = TiledWeight::from_blocks(&w).unwrap();
        for rows in [9, 16, 32, 72, 288] {
            let x: Vec<f32> = (0..rows * i).map(|j| (j % 17) as f32 / 8.0 - 1.0).collect();
            for isa in [Isa::AmxInt8, Isa::Avx512Vnni] {
                let name = format!("{}_{o}x{i}_rows{rows}_{isa}", ty.name());
                group.bench_function(name, |b| {
                    b.iter(|| one.install(|| tiled.matmul_at_isa(&x, rows, isa)))
                });
            }
            // The same product timed in the thread's CPU time, which the
            // other processes of a loaded machine do not inflate.
            let name = format!("{}_{o}x{i}_rows{rows}_avx512-vnni_cpu_time", ty.name());
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    one.install(|| {
                        let start = thread_cpu_time();
                        for _ in 0..iters {
                            std::hint::black_box(tiled.matmul_at_isa(&x, rows, Isa::Avx512Vnni));
                        }
                        thread_cpu_time() - start
                    })
                })
            });
        }
    }
    group.finish();
}

/// The calling thread's CPU time (Linux: `CLOCK_THREAD_CPUTIME_ID`;
/// elsewhere the time since the first call, wall-clock).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec`, which `ts` is.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn thread_cpu_time() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

criterion_group!(
    benches,
    forward,
    matvec_head,
    matmul_layout,
    quantized,
    tiles_q8_isa
);
criterion_main!(benches);
