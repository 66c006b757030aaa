//! Tests of [`super`]: the host products against the tensor products,
//! for projections with a bias (what a Llama with `attention_bias`, or any
//! architecture with biased projections, runs through).

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};

use super::*;
use crate::gguf::GgmlType;
use crate::layers::Projection;
use crate::ops::tensor::TensorOps;

/// A Q8_0 projection `[out, in]` with its quantised copy, and a bias
/// `(j − 7) / 11` at output `j` if `with_bias`.
fn q8_linear(o: usize, i: usize, seed: usize, with_bias: bool) -> Linear<Flex> {
    let dev = Default::default();
    let mut raw = Vec::new();
    for blk in 0..o * i / 32 {
        raw.extend(half::f16::from_f32(0.01 * (1 + (blk + seed) % 5) as f32).to_le_bytes());
        raw.extend((0..32).map(|j| ((blk * 31 + j * 7 + seed) % 255) as u8));
    }
    let q = crate::cpu::BlockWeight::from_ggml(GgmlType::Q8_0, &raw, o, i)
        .unwrap()
        .unwrap();
    let dense: Vec<f32> = (0..o).flat_map(|r| q.row(r)).collect();
    let bias: Vec<f32> = (0..o).map(|j| (j as f32 - 7.0) / 11.0).collect();
    Linear::<Flex>::new(
        Tensor::from_data(TensorData::new(dense, [o, i]), &dev),
        with_bias.then(|| Tensor::from_data(TensorData::new(bias, [o]), &dev)),
    )
    .with_quantized(q)
}

/// Two biased projections of one `x` (2 rows × 3 tokens): the host
/// operations add each bias to their products as the tensor operations do,
/// up to the order of f32 sums, with and without 8-bit inputs.
#[test]
fn host_products_add_the_bias_as_the_tensor_products_do() {
    let dev = Default::default();
    let (i, rows) = (64, [2, 3]);
    let projections = [q8_linear(48, i, 1, true), q8_linear(32, i, 2, true)];
    let bare = [q8_linear(48, i, 1, false), q8_linear(32, i, 2, false)];
    let site = |module| Site { layer: 0, module };
    let pairs = [
        (&projections[0], site(Projection::Q)),
        (&projections[1], site(Projection::K)),
    ];
    let xs: Vec<f32> = (0..6 * i).map(|j| (j % 13) as f32 / 6.0 - 1.0).collect();
    let x = Tensor::<Flex, 3>::from_data(TensorData::new(xs.clone(), [2, 3, i]), &dev);
    let want = TensorOps::new(None, true).project(&x, pairs);
    let want: Vec<Vec<f32>> = want
        .into_iter()
        .map(|t| crate::runtime::to_vec(t).unwrap())
        .collect();
    for quantize in [false, true] {
        let mut ops = HostOps::<Flex>::new(None, rows, quantize, &dev);
        let host_x = Arc::new(HostRows {
            data: xs.clone(),
            width: i,
            quantized: quantize.then(|| Q8Rows::new(&xs, 6, i)),
        });
        let got = ops.project(&host_x, pairs);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.y.len(), w.len());
            let worst =
                g.y.iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
            // 8-bit inputs round x: only the f32 inputs agree to summation order.
            let bound = if quantize { 0.05 } else { 1e-5 };
            assert!(worst <= bound, "quantize {quantize}: {worst}");
        }
        // The bias is there: the same weights without it give the outputs
        // less the bias.
        let bare_pairs = [
            (&bare[0], site(Projection::Q)),
            (&bare[1], site(Projection::K)),
        ];
        let without = ops.project(&host_x, bare_pairs);
        for (g, w) in got.iter().zip(&without) {
            let width = g.y.len() / 6;
            for (k, (a, b)) in g.y.iter().zip(&w.y).enumerate() {
                let bias = ((k % width) as f32 - 7.0) / 11.0;
                assert!(
                    (a - b - bias).abs() <= 1e-5,
                    "entry {k}: {a} - {b} vs {bias}"
                );
            }
        }
    }
}
