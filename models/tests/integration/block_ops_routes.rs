//! One backend type, three execution plans: burn-flex loaded with each
//! [`Route`]. The host block operations (the fastest route, on decode
//! steps) against the tensor block operations with the CPU kernels, and
//! against burn's ops alone, on a Llama and on a Gemma 3 (per-head q/k
//! norms, sandwich norms, GeGLU, sliding-window layers), both in Q8_0. The
//! routes differ only in the order of f32 sums (and, for burn's ops alone,
//! in multiplying the dequantised weights with gemm).

use crate::runtime_support;

use burn::backend::Flex;
use privmix_models::plan::BlockOpsKind;
use privmix_models::{DecodeProducts, LanguageModel, LoadOptions, Model, Route};
use runtime_support::{fixture, max_abs_diff, prefill_and_decode_steps as steps};

fn routes_agree(file: &str) {
    let path = fixture(file);
    let dev = Default::default();
    let load = |route| {
        Model::<Flex>::load(
            LoadOptions::path(&path, &dev)
                .decode_products(DecodeProducts::default())
                .route(route),
        )
        .unwrap()
    };
    let fastest = load(Route::Fastest);
    println!("{file}: {}", fastest.plan());
    assert_eq!(fastest.plan().block_ops(3, 1), BlockOpsKind::Host);
    assert_eq!(fastest.plan().block_ops(3, 9), BlockOpsKind::Tensor);
    for route in [Route::TensorBlocks, Route::BurnOpsOnly] {
        let other = load(route);
        println!("{file}: {}", other.plan());
        assert_eq!(other.plan().block_ops(3, 1), BlockOpsKind::Tensor);
        assert_eq!(
            other.plan().products.cpu_kernels,
            route == Route::TensorBlocks
        );
        assert_eq!(other.new_cache(1).is_host(), route == Route::TensorBlocks);
        for count in [3, 9] {
            let (got, want) = (steps(&fastest, count), steps(&other, count));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| max_abs_diff(g, w))
                .fold(0.0f32, f32::max);
            println!("{file}, {count} rows, fastest vs {route:?}: max |Δ logit| {worst:e}");
            assert!(worst <= 1e-4, "{route:?}, {count} rows: {worst}");
            // The comparison can fail: the steps' logits move.
            assert!(max_abs_diff(&got[1], &got[2]) > 1e-3);
        }
    }
}

#[test]
fn llama_routes_agree() {
    routes_agree("gguf/llama_q8_0.gguf");
}

#[test]
fn gemma3_routes_agree() {
    routes_agree("gguf/gemma3_q8_0.gguf");
}
