//! The scoring forward has the same bits at every thread count: the
//! teacher-forced full distributions of [`EnsembleRunner::score_block_full`]
//! (what the privacy-utility report scores its mechanisms on, f32
//! activations, f32 factors and KV cache) computed in rayon pools of 1, 2,
//! 3, 4 and 7 threads, compared bit for bit with the 2-thread pool's.
//!
//! Why it holds: every split of the forward over rayon's threads either
//! gives each thread whole rows or whole output columns, each element
//! computed by the same single-threaded call whatever the split (the
//! quantised products' column runs, the members' row updates, attention's
//! rows), or hands one `gemm` call rayon's threads: `gemm` fixes its blocking
//! of the sum by the call's shape and only deals its fixed micro-tiles out
//! to the threads (burn-flex's products of more rows, attention's products).
//!
//! Blocks of two lengths per model take both product routes of f32
//! activations: rows × tokens up to the plan's `few_rows_max` (24) read the
//! quantised blocks through the CPU kernels, more go through burn's gemm.
//! SmolLM2 (hidden 576, MLP 1536, vocabulary 49152) takes the forward's
//! splits at the report's model size (skipped, with a line saying so,
//! without its GGUF); burn's products at its shapes, up to 300 rows, are
//! checked on their own too.

use std::path::PathBuf;

use crate::lora_support;

use lora_support::*;
use privmix_ensemble::lora::{LLAMA_TARGET_MODULES, LoraAdapter, LoraConfig};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{LanguageModel, LoadOptions, Model};

/// The thread counts compared; the reference is 2, the count the committed
/// results cache was computed with.
const THREADS: [usize; 5] = [2, 1, 3, 4, 7];

/// The bits of `runner`'s full distributions of every block, row by row,
/// computed in a pool of `threads` threads.
fn scored_bits(
    runner: &EnsembleRunner<B, Model<B>>,
    layout: &RowLayout,
    blocks: &[Vec<u32>],
    threads: usize,
) -> Vec<u32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    pool.install(|| {
        blocks
            .iter()
            .flat_map(|block| runner.score_block_full(layout, block).expect("scoring"))
            .flat_map(|rows| {
                (0..rows.rows())
                    .flat_map(|r| rows.row(r).iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            })
            .collect()
    })
}

/// Asserts that every pool of [`THREADS`] scores `blocks` with the
/// 2-thread pool's bits.
fn same_bits_at_every_thread_count(
    runner: &EnsembleRunner<B, Model<B>>,
    layout: &RowLayout,
    blocks: &[Vec<u32>],
    what: &str,
) {
    let want = scored_bits(runner, layout, blocks, THREADS[0]);
    assert!(!want.is_empty());
    assert!(
        want.iter().all(|&b| f32::from_bits(b).is_finite()),
        "{what}: a log-probability is not finite"
    );
    for threads in &THREADS[1..] {
        let got = scored_bits(runner, layout, blocks, *threads);
        assert_eq!(got.len(), want.len(), "{what}: {threads} threads");
        let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            differ,
            0,
            "{what}: {differ} of {} log-probabilities differ in {threads} threads from 2",
            want.len()
        );
    }
}

/// `len` token ids below `vocab`, spread over the vocabulary.
fn block(len: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// Random members with every projection adapted (rank `r`, seeds from 11).
fn random_members(model: &Model<B>, n: usize, r: usize) -> Vec<LoraAdapter<B>> {
    let config = LoraConfig::new(r, 2.0 * r as f64, &LLAMA_TARGET_MODULES).unwrap();
    (0..n)
        .map(|i| LoraAdapter::random(config.clone(), &base_of(model), 0.05, 11 + i as u64, &dev()))
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The tiny Llama (safetensors and its Q8_0 GGUF) with the PEFT fixtures'
/// members and a random one: 4 rows, blocks of 4 and 11 scored positions.
#[test]
fn tiny_llama_scoring_does_not_depend_on_the_thread_count() {
    let gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gguf/llama_q8_0.gguf");
    let models = [
        ("safetensors", tiny_llama()),
        (
            "Q8_0 GGUF",
            Model::load(LoadOptions::path(&gguf, &dev())).unwrap(),
        ),
    ];
    for (what, model) in models {
        let base = base_of(&model);
        let mut members = vec![load_adapter("full", &base), load_adapter("rslora", &base)];
        members.extend(random_members(&model, 1, 3));
        let vocab = model.vocab_size();
        let runner = EnsembleRunner::new(model, &members).unwrap();
        let layout = RowLayout::public_and_members(members.len());
        let blocks = [block(5, vocab, 0), block(12, vocab, 1)];
        same_bits_at_every_thread_count(&runner, &layout, &blocks, what);
    }
}

/// SmolLM2-135M (Q4_1 GGUF) with two random rank-8 members: 3 rows, a block
/// of 8 scored positions (24 rows × tokens: the quantised f32-activation
/// kernels) and one of 16 (48: burn's gemm, split over the threads).
#[test]
fn smollm2_scoring_does_not_depend_on_the_thread_count() {
    let path = std::env::var_os("PRIVMIX_MODELS_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache"),
            PathBuf::from,
        )
        .join("smollm2.gguf");
    if !path.is_file() {
        println!("skipped: {} absent", path.display());
        return;
    }
    let model = Model::<B>::load(LoadOptions::path(&path, &dev())).expect("load SmolLM2");
    let members = random_members(&model, 2, 8);
    let vocab = model.vocab_size();
    let runner = EnsembleRunner::new(model, &members).unwrap();
    let layout = RowLayout::public_and_members(members.len());
    let blocks = [block(9, vocab, 0), block(17, vocab, 1)];
    same_bits_at_every_thread_count(&runner, &layout, &blocks, "SmolLM2");
}

/// `len` values in [-1, 1) from a fixed linear congruential sequence.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// burn's product `x Wᵀ` (`W: [out, in]` read transposed, as a projection
/// multiplies by its weight) at SmolLM2's projection shapes, for 16 to 300
/// rows (the output head for the fewer rows only, to stay fast): the same
/// bits in every pool of [`THREADS`].
#[test]
fn products_at_smollm2_shapes_do_not_depend_on_the_thread_count() {
    use burn::tensor::{Tensor, TensorData};
    let shapes: [(usize, usize, &[usize]); 4] = [
        (576, 576, &[16, 25, 100, 300]),
        (576, 1536, &[16, 25, 100, 300]),
        (1536, 576, &[16, 25, 100, 300]),
        (576, 49152, &[16, 25]),
    ];
    for (inp, out, rows) in shapes {
        let w =
            Tensor::<B, 2>::from_data(TensorData::new(values(out * inp, 1), [out, inp]), &dev());
        for &m in rows {
            let x = Tensor::<B, 2>::from_data(
                TensorData::new(values(m * inp, m as u64), [m, inp]),
                &dev(),
            );
            let product = |threads: usize| -> Vec<u32> {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a rayon pool");
                let y = pool.install(|| x.clone().matmul(w.clone().transpose()));
                let y: Vec<f32> = y.into_data().to_vec().unwrap();
                y.iter().map(|v| v.to_bits()).collect()
            };
            let want = product(THREADS[0]);
            for &threads in &THREADS[1..] {
                assert!(
                    product(threads) == want,
                    "[{m}, {inp}] × [{inp}, {out}]: {threads} threads differ from 2"
                );
            }
        }
    }
}
