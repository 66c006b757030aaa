//! The Llama step held in host memory (plain burn-flex, a quantised copy of
//! every projection, at most 8 new tokens per row) computes what burn's
//! tensor ops compute. The tensor path runs here under `Autodiff<Flex>`,
//! which takes the same GGUF weights dequantised and never the host path:
//! the two differ only in the order of f32 sums.

use crate::runtime_support;

use burn::backend::{Autodiff, Flex};
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
