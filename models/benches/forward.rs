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
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use privmix_models::{Batch, LanguageModel, Model};

fn forward(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut group = c.benchmark_group("forward");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));

    let tiny =
        Model::<Flex>::load(dir.join("tests/fixtures/hf/llama"), &Default::default()).unwrap();
    let tokens: Vec<u32> = (3..15).collect();
    let batch = Batch::single(&tokens).unwrap();
    group.bench_function("tiny_llama_prefill_12", |b| {
        b.iter(|| tiny.logits_all(&batch).unwrap())
    });

    let smollm2 = dir.join("../models-cache/smollm2.gguf");
    if smollm2.is_file() {
        let model = Model::<Flex>::load(&smollm2, &Default::default()).unwrap();
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

criterion_group!(benches, forward);
criterion_main!(benches);
