//! One decode step of the public model + N LoRA members over SmolLM2-135M
//! (models-cache/smollm2.gguf, fetched by `cargo xtask fetch-models`; the
//! bench says so and does nothing when the file is absent), after a 32-token
//! context, with random rank-4 adapters on all seven projections:
//!
//! - `baseline_single_model`: one row, the base model alone;
//! - `ensemble_n{N}`: the N + 1 rows in one batched forward (EnsembleRunner);
//! - `separate_n{N}`: N + 1 single-row forwards, one per member (N ≤ 8);
//! - `prefill_n8`: a new decoder's prefill of the context, 9 rows × 32 tokens;
//! - `ensemble_n8_q_v`: the N = 8 ensemble with rank-4 adapters on `q_proj`
//!   and `v_proj` only: PEFT's default targets for Llama, which the PMixED
//!   reference code gets by leaving `target_modules` unset
//!   (`fine_tune_ensemble.py`: `LoraConfig(r=4, lora_alpha=32, ...)`);
//! - `ensemble_n8_f16_factors`: the N = 8 ensemble with the members'
//!   factors held in f16 ([`FactorPrecision::F16`]: half the bytes read per
//!   step, each factor entry rounded to f16 once);
//! - `ensemble_n8_f16`: f16 factors and an f16 KV cache
//!   ([`KvPrecision::F16`], llama.cpp's default cache type), beside
//!   `baseline_single_model_f16_kv`, the single model with an f16 cache;
//! - `no_adapters_n8`: the same nine rows with no adapter on any (the public
//!   model on every row): what the N = 8 step costs before any update, a
//!   floor for every adapter configuration.
//!
//! The group `ensemble_decode_step_smollm2_int8_activations` repeats every
//! row with the model loaded with [`DecodeProducts::Int8Activations`]:
//! products take 8-bit activations, as llama.cpp's CPU kernels do (the
//! baseline, the ensembles and the separate forwards alike).
//!
//! Each decode figure is the time per step of a decode loop: from a copy of
//! the state after the context (made outside the timing), [`STEPS`]
//! consecutive steps, each appending its token to the caches, as generation
//! does; the copy is dropped outside the timing too. Why not one step per
//! copy: a copy of the 9-row caches is 27 MB, and criterion's batches of
//! copies (hundreds of MB, freed inside the timed routine) then cost the
//! ensemble more in page faults and frees than a decode loop ever pays.
//!
//! Each group also prints `paired` lines: the five N = 8 steps above over
//! the single-model step (`ensemble_n8_f16` over the single model with an
//! f16 cache as well), from 40 rounds that time the single models and then
//! each of them within a second (see [`paired_ratios`]).
//!
//! Target (not asserted): `ensemble_n8` ≤ 2.5 × the baseline,
//! each group against its own baseline. Why the two groups land on either
//! side of it: a one-row step is bound by reading the weights once (96.4 MB),
//! the nine-row step's products by multiplying every weight by nine rows
//! (`cargo run --release -p privmix-models --example bounds` measures both
//! bounds on the machine at hand), before any update, attention or norm; with 8-bit
//! activations a `vpdpbusd` does 64 multiply-adds where an FMA does 16.
//! llama.cpp's CPU kernels take 8-bit activations for these weights too.
//! Backend: flex (CPU); `--features wgpu` or `--features cuda` selects a GPU.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use criterion::{Bencher, Criterion, criterion_group, criterion_main};
use privmix_ensemble::lora::{LLAMA_TARGET_MODULES, LoraAdapter, LoraBase, LoraConfig};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::{Decoder, EnsembleRunner};
use privmix_ensemble::stacked::FactorPrecision;
use privmix_models::{
    Batch, DecodeProducts, KvCache, KvPrecision, LanguageModel, LinearDelta, LoadOptions, Model,
};

#[cfg(feature = "cuda")]
type B = privmix_models::CudaBackend;
#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
type B = privmix_models::WgpuBackend;
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
type B = burn::backend::Flex;

const CONTEXT: usize = 32;
const MEMBERS: [usize; 5] = [1, 2, 4, 8, 16];
const SEPARATE_UP_TO: usize = 8;
/// The ensemble size whose prefill of the context is timed too.
const PREFILL_BENCHED: usize = 8;
/// Consecutive decode steps per timed run.
const STEPS: usize = 8;
const PAIRED: usize = 8;
const PAIRED_ROUNDS: usize = 40;

/// Reports the time per step of [`STEPS`] consecutive `step`s on a fresh
/// `setup()` state, the setup and the state's drop untimed.
fn per_step<T>(b: &mut Bencher<'_>, setup: impl Fn() -> T, mut step: impl FnMut(&mut T)) {
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let mut state = setup();
            let start = Instant::now();
            for _ in 0..STEPS {
                step(&mut state);
            }
            total += start.elapsed();
            drop(state);
        }
        total / STEPS as u32
    })
}

fn context() -> Vec<u32> {
    (0..CONTEXT as u32)
        .map(|i| (i * 1543 + 17) % 49_000)
        .collect()
}

/// A single-row cache in `precision` after the context, with an optional
/// adapter.
fn prefilled(
    model: &Model<B>,
    delta: Option<&dyn LinearDelta<B>>,
    precision: KvPrecision,
) -> KvCache<B> {
    let mut cache = model.new_cache_with(1, precision);
    let batch = Batch::single(&context()).unwrap();
    let _: Tensor<B, 2> = model.logits_last(&batch, &mut cache, delta).unwrap();
    cache
}

fn step(model: &Model<B>, cache: &mut KvCache<B>, delta: Option<&dyn LinearDelta<B>>) -> Vec<f32> {
    let batch = Batch::single(&[42]).unwrap();
    let l = model.logits_last(&batch, cache, delta).unwrap();
    l.into_data().to_vec::<f32>().unwrap()
}

/// [`per_step`] of an ensemble decoder's steps from its state after the context.
fn decode_steps(b: &mut Bencher<'_>, dec: &Decoder<'_, B, Model<B>>) {
    per_step(
        b,
        || dec.clone(),
        |d| {
            std::hint::black_box(d.next_log_probs(42).unwrap());
        },
    )
}

fn bench(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/smollm2.gguf");
    if !path.is_file() {
        eprintln!(
            "skipping ensemble step bench: {} absent (run `cargo xtask fetch-models`)",
            path.display()
        );
        return;
    }
    #[cfg(all(feature = "wgpu", not(feature = "cuda")))]
    let device = privmix_models::open_wgpu_device().expect("wgpu device");
    #[cfg(not(all(feature = "wgpu", not(feature = "cuda"))))]
    let device = Default::default();
    for (group, products) in [
        (
            "ensemble_decode_step_smollm2",
            DecodeProducts::F32Activations,
        ),
        (
            "ensemble_decode_step_smollm2_int8_activations",
            DecodeProducts::Int8Activations,
        ),
    ] {
        let model = Model::<B>::load(LoadOptions::path(&path, &device).decode_products(products))
            .expect("SmolLM2 GGUF");
        bench_group(c, group, &model, &device);
    }
}

/// The group's rows for `model`.
fn bench_group(c: &mut Criterion, group: &str, model: &Model<B>, device: &burn::tensor::Device<B>) {
    let base = model.base_shapes().unwrap();
    let config = LoraConfig::new(4, 8.0, &LLAMA_TARGET_MODULES).unwrap();
    let max_n = MEMBERS[MEMBERS.len() - 1];
    let adapters: Vec<LoraAdapter<B>> = (0..max_n as u64)
        .map(|s| LoraAdapter::random(config.clone(), &base, 0.02, s, device).unwrap())
        .collect();

    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let cache = prefilled(model, None, KvPrecision::F32);
    let cache_f16 = prefilled(model, None, KvPrecision::F16);
    for (name, cache) in [
        ("baseline_single_model", &cache),
        ("baseline_single_model_f16_kv", &cache_f16),
    ] {
        g.bench_function(name, |b| {
            per_step(
                b,
                || cache.clone(),
                |cache| {
                    std::hint::black_box(step(model, cache, None));
                },
            )
        });
    }

    for &n in &MEMBERS {
        let runner = EnsembleRunner::new(model.clone(), &adapters[..n]).unwrap();
        let mut dec = runner.decoder(RowLayout::public_and_members(n)).unwrap();
        if n == PREFILL_BENCHED {
            g.bench_function(format!("prefill_n{n}"), |b| {
                b.iter(|| {
                    let mut d = runner.decoder(RowLayout::public_and_members(n)).unwrap();
                    d.prefill(&context()).unwrap()
                })
            });
        }
        dec.prefill(&context()).unwrap();
        g.bench_function(format!("ensemble_n{n}"), |b| decode_steps(b, &dec));
        if n == PAIRED {
            let config = LoraConfig::new(4, 8.0, &["q_proj", "v_proj"]).unwrap();
            let light: Vec<LoraAdapter<B>> = (0..n as u64)
                .map(|s| LoraAdapter::random(config.clone(), &base, 0.02, s, device).unwrap())
                .collect();
            let light_runner = EnsembleRunner::new(model.clone(), &light).unwrap();
            let mut q_v = light_runner
                .decoder(RowLayout::public_and_members(n))
                .unwrap();
            q_v.prefill(&context()).unwrap();
            g.bench_function(format!("ensemble_n{n}_q_v"), |b| decode_steps(b, &q_v));
            let half_runner =
                EnsembleRunner::with_precision(model.clone(), &adapters[..n], FactorPrecision::F16)
                    .unwrap();
            let mut half = half_runner
                .decoder(RowLayout::public_and_members(n))
                .unwrap();
            half.prefill(&context()).unwrap();
            g.bench_function(format!("ensemble_n{n}_f16_factors"), |b| {
                decode_steps(b, &half)
            });
            let f16_runner = half_runner.clone().with_kv_precision(KvPrecision::F16);
            let mut f16 = f16_runner
                .decoder(RowLayout::public_and_members(n))
                .unwrap();
            f16.prefill(&context()).unwrap();
            g.bench_function(format!("ensemble_n{n}_f16"), |b| decode_steps(b, &f16));
            // The step's N + 1 rows with no adapter on any: the public model
            // nine times over, what the ensemble costs before its updates.
            let mut bare = runner.decoder(RowLayout::public_only(n + 1)).unwrap();
            bare.prefill(&context()).unwrap();
            g.bench_function(format!("no_adapters_n{n}"), |b| decode_steps(b, &bare));
            paired_ratios(
                group,
                model,
                [&cache, &cache_f16],
                &[
                    (format!("ensemble_n{n}"), &dec, 0),
                    (format!("ensemble_n{n}_q_v"), &q_v, 0),
                    (format!("ensemble_n{n}_f16_factors"), &half, 0),
                    (format!("ensemble_n{n}_f16"), &f16, 1),
                    (format!("no_adapters_n{n}"), &bare, 0),
                ],
            );
        }
        if n <= SEPARATE_UP_TO {
            let caches: Vec<KvCache<B>> = std::iter::once(None)
                .chain(adapters[..n].iter().map(Some))
                .map(|a| prefilled(model, a.map(|a| a as &dyn LinearDelta<B>), KvPrecision::F32))
                .collect();
            g.bench_function(format!("separate_n{n}"), |b| {
                per_step(
                    b,
                    || caches.clone(),
                    |caches| {
                        for (i, cache) in caches.iter_mut().enumerate() {
                            let delta = i
                                .checked_sub(1)
                                .map(|m| &adapters[m] as &dyn LinearDelta<B>);
                            std::hint::black_box(step(model, cache, delta));
                        }
                    },
                )
            });
        }
    }
    g.finish();
}

/// A decoder timed in [`paired_ratios`]: its name, itself, and the index of
/// its single-model baseline.
type Paired<'a> = (String, &'a Decoder<'a, B, Model<B>>, usize);

/// Prints each decoder's step over its single-model step (`(name, decoder,
/// b)`: over the single model's step from cache `singles[b]`) from
/// [`PAIRED_ROUNDS`] rounds that time each single model, then every decoder
/// in turn (each a decode loop of [`STEPS`] steps from a fresh copy, as the
/// criterion rows time them): the ratio of the medians, and the median of
/// the rounds' own ratios with its quartiles.
///
/// Why beside criterion's rows: those time one function after another, and
/// on a shared machine whose speed drifts over minutes the baseline and the
/// ensemble can be timed in different phases; here they run within a second
/// of each other, many times over.
fn paired_ratios(
    group: &str,
    model: &Model<B>,
    singles: [&KvCache<B>; 2],
    decoders: &[Paired<'_>],
) {
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..STEPS {
            f();
        }
        start.elapsed().as_secs_f64() * 1e3 / STEPS as f64
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut single = [Vec::new(), Vec::new()];
    let mut steps = vec![Vec::new(); decoders.len()];
    for _ in 0..PAIRED_ROUNDS {
        for (times, cache) in single.iter_mut().zip(singles) {
            let mut c = cache.clone();
            times.push(time(&mut || {
                std::hint::black_box(step(model, &mut c, None));
            }));
        }
        for ((_, dec, _), times) in decoders.iter().zip(&mut steps) {
            let mut d = (*dec).clone();
            times.push(time(&mut || {
                std::hint::black_box(d.next_log_probs(42).unwrap());
            }));
        }
    }
    for (name, times) in ["single-model step", "single-model step, f16 KV cache"]
        .iter()
        .zip(&single)
    {
        println!(
            "{group}/paired: {name} {:.3} ms (median of {PAIRED_ROUNDS} rounds)",
            median(times.clone())
        );
    }
    for ((name, _, b), times) in decoders.iter().zip(steps) {
        let base = &single[*b];
        let mut ratios: Vec<f64> = times.iter().zip(base).map(|(t, s)| t / s).collect();
        ratios.sort_by(f64::total_cmp);
        let quartile = |q: usize| ratios[(ratios.len() - 1) * q / 4];
        let over = if *b == 0 {
            ""
        } else {
            " (over the f16-KV single step)"
        };
        println!(
            "{group}/paired: {name} step {:.3} ms, ratio of medians {:.2}{over}, rounds' \
             ratios median {:.2} (quartiles {:.2}–{:.2})",
            median(times.clone()),
            median(times) / median(base.clone()),
            quartile(2),
            quartile(1),
            quartile(3),
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
