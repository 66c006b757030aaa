//! One fine-tuning step on SmolLM2-135M (models-cache/smollm2.gguf, fetched
//! by `cargo xtask fetch-models`; the bench says so and does nothing when
//! the file is absent): LoRA rank 8, alpha 16, on `q_proj` and `v_proj`,
//! 4 blocks × 128 input tokens, AdamW; threads are rayon's.
//!
//! - `host_step`: [`Trainer::step`] on the default path (the host step:
//!   forward, hand-written backward, AdamW);
//! - `baseline_autodiff_step`: the same step on burn autodiff
//!   ([`StepPath::Autodiff`]), so the report gives the host step's ratio;
//! - `dpsgd_host_step`: a DP-SGD step over the same 4 blocks (sampling rate
//!   1), per-example gradients in one batched pass, clipped, noised.
//!
//! `cargo xtask bench --train-only` compares the same step with PyTorch +
//! PEFT in the same run.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use criterion::{Criterion, criterion_group, criterion_main};
use privmix_ensemble::lora::LoraConfig;
use privmix_ensemble::train::{
    DpSgdConfig, DpSgdTrainer, NoiseSource, StepPath, TrainConfig, Trainer,
};
use privmix_models::{LanguageModel, LoadOptions, Model};

type AB = Autodiff<Flex>;

const ROWS: usize = 4;
const SEQ: usize = 128;
/// Steps each trainer may take (criterion decides how many it times).
const MAX_STEPS: usize = 1_000_000;

fn blocks(vocab: usize) -> Vec<Vec<u32>> {
    (0..ROWS)
        .map(|r| {
            (0..=SEQ)
                .map(|i| ((1 + 1009 * r + 7919 * i) % vocab) as u32)
                .collect()
        })
        .collect()
}

fn lora() -> LoraConfig {
    LoraConfig::new(8, 16.0, &["q_proj", "v_proj"]).expect("LoRA configuration")
}

fn bench(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/smollm2.gguf");
    if !path.is_file() {
        eprintln!(
            "{} is absent (cargo xtask fetch-models): nothing to bench",
            path.display()
        );
        return;
    }
    let model = Model::<AB>::load(LoadOptions::path(&path, &Default::default())).expect("SmolLM2");
    let data = blocks(model.vocab_size());
    let mut g = c.benchmark_group("train_step_smollm2_r8_qv_4x128");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    for (id, path) in [
        ("host_step", StepPath::Fastest),
        ("baseline_autodiff_step", StepPath::Autodiff),
    ] {
        let mut cfg = TrainConfig::new(lora(), MAX_STEPS, 1);
        cfg.batch_size = ROWS;
        let mut t = Trainer::<AB, _>::new(&model, data.clone(), vec![], cfg)
            .expect("trainer")
            .with_step_path(path);
        t.step().expect("warm-up step");
        g.bench_function(id, |b| b.iter(|| t.step().expect("step")));
    }
    let cfg = DpSgdConfig {
        lora: lora(),
        learning_rate: 2e-4,
        warmup_steps: 0,
        total_steps: MAX_STEPS,
        sampling_rate: 1.0,
        clip_norm: 1.0,
        noise_multiplier: 1.0,
        delta: 1e-5,
        adamw: Default::default(),
        seed: 1,
        noise: NoiseSource::Seeded(2),
    };
    let mut t = DpSgdTrainer::<AB, _>::new(&model, data, cfg).expect("DP-SGD trainer");
    t.step().expect("warm-up step");
    g.bench_function("dpsgd_host_step", |b| b.iter(|| t.step().expect("step")));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
