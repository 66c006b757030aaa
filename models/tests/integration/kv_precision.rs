//! Caches holding keys and values in f16 (`KvPrecision::F16`). Two
//! independent implementations of "every key and value rounded to f16" must
//! agree: plain burn-flex keeps the f16 bits in host memory (`half`'s
//! rounding, this crate's attention), `Autodiff<Flex>` keeps burn's f16 cast
//! of the tensors (burn's rounding, eager attention). Checked on every
//! architecture's fixture through a left-padded prefill longer than a host
//! step and decode steps (a sliding window in Gemma 2/3, soft-capping in
//! Gemma 2), and on the Q8_0 GGUF whose steps take the host step. The f16
//! cache really rounds (its logits differ from the f32 cache's) and by
//! little.

use crate::runtime_support;

use burn::backend::{Autodiff, Flex};
use privmix_models::ModelBackend;
use privmix_models::runtime::to_vec;
use privmix_models::{Batch, KvPrecision, LanguageModel, LoadOptions, Model};
use runtime_support::{fixture, max_abs_diff};

/// Logits of a left-padded prefill of two rows (12 and 9 tokens: longer
/// than a host step), then of four decode steps, through a cache in
/// `precision`.
fn steps<B: ModelBackend>(model: &Model<B>, precision: KvPrecision) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<u32>> = vec![
        (0..12).map(|i| (3 + 7 * i) % 97).collect(),
        (0..9).map(|i| (50 + 5 * i) % 97).collect(),
    ];
    let mut cache = model.new_cache_with(rows.len(), precision);
    assert_eq!(cache.precision(), precision);
    let prefill = Batch::left_padded(&rows, 0).unwrap();
    let mut out = vec![to_vec(model.forward(&prefill, &mut cache, None).unwrap()).unwrap()];
    for step in 0..4u32 {
        let next = Batch::new(&[vec![5 + step], vec![40 + 3 * step]]).unwrap();
        out.push(to_vec(model.logits_last(&next, &mut cache, None).unwrap()).unwrap());
    }
    out
}

/// Largest difference over every step; only the prefill's real positions
/// count (padding positions' logits are meaningless).
fn worst(a: &[Vec<f32>], b: &[Vec<f32>], vocab: usize) -> f32 {
    let mut w = 0.0f32;
    for (s, (x, y)) in a.iter().zip(b).enumerate() {
        if s == 0 {
            // Row 0 is all real; row 1's first 3 positions are padding.
            for (r, first) in [(0usize, 0usize), (1, 3)] {
                let at = (r * 12 + first) * vocab..(r + 1) * 12 * vocab;
                w = w.max(max_abs_diff(&x[at.clone()], &y[at]));
            }
        } else {
            w = w.max(max_abs_diff(x, y));
        }
    }
    w
}

/// Host-held f16 cache against the tensor path's, and against f32.
fn check(host: &Model<Flex>, tensors: &Model<Autodiff<Flex>>, vocab: usize, what: &str) {
    let half = steps(host, KvPrecision::F16);
    let rounded = steps(tensors, KvPrecision::F16);
    let d = worst(&half, &rounded, vocab);
    println!("{what}: f16 cache, host vs tensor path max |Δ logit| {d:e}");
    assert!(d < 1e-4, "{what}: host and tensor f16 caches differ by {d}");
    let single = steps(host, KvPrecision::F32);
    let moved = worst(&half, &single, vocab);
    println!("{what}: f16 vs f32 cache max |Δ logit| {moved:e}");
    assert!(
        moved > 1e-6 && moved < 0.05,
        "{what}: f16 rounding moved logits by {moved}"
    );
}

#[test]
fn f16_cache_agrees_across_paths_on_every_architecture() {
    for name in ["llama", "gemma", "gemma2", "gemma3", "gpt2"] {
        let dir = fixture(&format!("hf/{name}"));
        let host = Model::<Flex>::load(LoadOptions::path(&dir, &Default::default())).unwrap();
        let tensors =
            Model::<Autodiff<Flex>>::load(LoadOptions::path(&dir, &Default::default())).unwrap();
        check(&host, &tensors, host.vocab_size(), name);
    }
}

#[test]
fn f16_cache_agrees_across_paths_on_quantised_host_steps() {
    let path = fixture("gguf/llama_q8_0.gguf");
    let host = Model::<Flex>::load(LoadOptions::path(&path, &Default::default())).unwrap();
    let tensors =
        Model::<Autodiff<Flex>>::load(LoadOptions::path(&path, &Default::default())).unwrap();
    check(&host, &tensors, host.vocab_size(), "llama Q8_0 GGUF");
}
