//! The Llama step held in host memory (plain burn-flex, a quantised copy of
//! every projection, at most 8 new tokens per row) computes what burn's
//! tensor ops compute. The tensor path runs here under `Autodiff<Flex>`,
//! which takes the same GGUF weights dequantised and never the host path:
//! the two differ only in the order of f32 sums.

mod runtime_support;

use burn::backend::{Autodiff, Flex};
use privmix_models::runtime::to_vec;
use privmix_models::{Batch, LanguageModel, Model};
use runtime_support::{fixture, max_abs_diff};

/// Logits of a left-padded prefill of three rows (≤ 8 tokens: a host step
/// too), then of four decode steps.
fn steps<B: burn::tensor::backend::Backend>(model: &Model<B>) -> Vec<Vec<f32>> {
    let rows = vec![
        vec![3u32, 17, 9, 44, 2],
        vec![8, 1],
        vec![30, 31, 32, 33, 34],
    ];
    let mut cache = model.new_cache(rows.len());
    let prefill = Batch::left_padded(&rows, 0).unwrap();
    let mut out = vec![to_vec(model.forward(&prefill, &mut cache, None).unwrap()).unwrap()];
    for step in 0..4u32 {
        let next: Vec<Vec<u32>> = (0..3).map(|r| vec![5 + 7 * r + step]).collect();
        let batch = Batch::new(&next).unwrap();
        out.push(to_vec(model.logits_last(&batch, &mut cache, None).unwrap()).unwrap());
    }
    out
}

#[test]
fn host_step_equals_the_tensor_path() {
    let path = fixture("gguf/llama_q8_0.gguf");
    let dev = Default::default();
    let host = Model::<Flex>::load_gguf(&path, &dev).unwrap();
    let tensor = Model::<Autodiff<Flex>>::load_gguf(&path, &dev).unwrap();
    let (got, want) = (steps(&host), steps(&tensor));
    let mut worst: f32 = 0.0;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.len(), w.len());
        worst = worst.max(max_abs_diff(g, w));
    }
    println!("host step vs tensor path: max |Δ logit| {worst:e}");
    assert!(worst <= 1e-4, "{worst}");
    // The comparison can fail: the steps' logits move.
    assert!(max_abs_diff(&got[1], &got[2]) > 1e-3);
}
