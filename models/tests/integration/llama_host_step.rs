//! The Llama and GPT-2 steps held in host memory (plain burn-flex, a
//! quantised copy of every projection, at most 8 new tokens per row) compute
//! what burn's tensor ops compute. The tensor path runs here under
//! `Autodiff<Flex>`, which takes the same GGUF weights dequantised and never
//! the host path: the two differ only in the order of f32 sums (with 8-bit
//! activations, also in the activations' rounding).

use crate::runtime_support;

use burn::backend::{Autodiff, Flex};
use privmix_models::plan::{BlockOpsKind, DecodeProducts, Route};
use privmix_models::{LoadOptions, Model};
use runtime_support::{fixture, max_abs_diff, prefill_and_decode_steps as steps};

/// Three rows and nine. On an AVX-512 CPU the products of `cpu::tiles_f32::
/// TILES_F32_MIN_ROWS` rows or more (each prefill, the nine rows' steps) take the tile
/// kernel and the three rows' steps the lane-split one.
#[test]
fn host_step_equals_the_tensor_path() {
    let path = fixture("gguf/llama_q8_0.gguf");
    let dev = Default::default();
    let host = Model::<Flex>::load(LoadOptions::path(&path, &dev)).unwrap();
    let tensor = Model::<Autodiff<Flex>>::load(LoadOptions::path(&path, &dev)).unwrap();
    for count in [3, 9] {
        let (got, want) = (steps(&host, count), steps(&tensor, count));
        let mut worst: f32 = 0.0;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            worst = worst.max(max_abs_diff(g, w));
        }
        println!("{count} rows, host step vs tensor path: max |Δ logit| {worst:e}");
        assert!(worst <= 1e-4, "{count} rows: {worst}");
        // The comparison can fail: the steps' logits move.
        assert!(max_abs_diff(&got[1], &got[2]) > 1e-3);
    }
}

/// GPT-2's block on the host operations (LayerNorm with bias, the fused
/// query/key/value product split, `gelu_tanh(up)` without a gate, learned
/// positions at embedding) against the tensor block operations: with f32
/// activations against `Autodiff<Flex>` (to summation order); with 8-bit
/// ones (each product's input rounded to 8 bits per block of 32, as
/// llama.cpp's CPU kernels do) against the tensor block operations taking
/// the same 8-bit products on plain flex.
#[test]
fn gpt2_host_step_equals_the_tensor_path() {
    let path = fixture("gguf/gpt2_q8_0.gguf");
    let dev = Default::default();
    let autodiff = Model::<Autodiff<Flex>>::load(LoadOptions::path(&path, &dev)).unwrap();
    let f32_tensor = steps(&autodiff, 3);
    for products in [
        DecodeProducts::F32Activations,
        DecodeProducts::Int8Activations,
    ] {
        let options = || LoadOptions::path(&path, &dev).decode_products(products);
        let host = Model::<Flex>::load(options()).unwrap();
        // Every step here (prefill of at most 5 tokens, then decode steps)
        // runs the host block operations.
        assert_eq!(
            host.plan().block_ops(3, 5),
            BlockOpsKind::Host,
            "{}",
            host.plan()
        );
        let want = match products {
            DecodeProducts::F32Activations => f32_tensor.clone(),
            _ => steps(
                &Model::<Flex>::load(options().route(Route::TensorBlocks)).unwrap(),
                3,
            ),
        };
        let got = steps(&host, 3);
        let mut worst: f32 = 0.0;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            worst = worst.max(max_abs_diff(g, w));
        }
        println!("GPT-2 host step ({products:?}) vs tensor path: max |Δ logit| {worst:e}");
        assert!(worst <= 1e-4, "{products:?}: {worst}");
        assert!(max_abs_diff(&got[1], &got[2]) > 1e-3);
    }
}

/// `log_probs_last_rows` (the head's product straight into the log-softmax, on the
/// host) gives the very bits of `logits_last` then `log_softmax_to_vec` (the head
/// through a tensor), with f32 and with 8-bit activations, over a prefill and a
/// decode step of several rows; and the host head really serves these rows.
#[test]
fn host_log_probs_equal_the_tensor_heads_bits() {
    use privmix_models::runtime::log_softmax_to_vec;
    use privmix_models::{Batch, LanguageModel};
    let path = fixture("gguf/llama_q8_0.gguf");
    let dev = Default::default();
    for products in [
        DecodeProducts::F32Activations,
        DecodeProducts::Int8Activations,
    ] {
        let model =
            Model::<Flex>::load(LoadOptions::path(&path, &dev).decode_products(products)).unwrap();
        let one = Batch::new(&[vec![1]]).unwrap();
        let width = model
            .forward_hidden(&one, &mut model.new_cache(1), None)
            .unwrap()
            .dims()[2];
        assert!(model.head_host(&vec![0.5; 3 * width], 3).is_some());
        let contexts = vec![vec![5u32, 17, 99, 3], vec![9, 8, 7], vec![100, 101]];
        let (mut a, mut b) = (model.new_cache(3), model.new_cache(3));
        for batch in [
            Batch::left_padded(&contexts, 0).unwrap(),
            Batch::new(&[vec![1], vec![250], vec![33]]).unwrap(),
        ] {
            let got = model.log_probs_last_rows(&batch, &mut a, None).unwrap();
            let logits = model.logits_last(&batch, &mut b, None).unwrap();
            let want = log_softmax_to_vec(model.plan(), logits).unwrap();
            assert_eq!(got.len(), 3 * model.vocab_size());
            let same = got
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{products:?}: log-probs differ");
        }
    }
}
