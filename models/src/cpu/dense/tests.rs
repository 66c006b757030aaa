use crate::cpu::gemm::{few_rows_matmul, few_rows_times_weight_rows};
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use proptest::prelude::*;

/// The exact dot products, in f64.
fn reference(x: &[f32], rows: usize, w: &[f32], k: usize, out: usize) -> Vec<(f64, f64)> {
    let mut y = Vec::with_capacity(rows * out);
    for r in 0..rows {
        for o in 0..out {
            let (mut s, mut abs) = (0.0f64, 0.0f64);
            for j in 0..k {
                let p = f64::from(x[r * k + j]) * f64::from(w[o * k + j]);
                s += p;
                abs += p.abs();
            }
            y.push((s, abs));
        }
    }
    y
}

/// Each output within `γ_k Σ|w_j x_j|` of the exact sum (Higham Thm 3.1;
/// FMA only tightens it), `γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`, plus the
/// final rounding to f32.
fn check(x: &[f32], rows: usize, w: &[f32], k: usize, out: usize, got: &[f32]) {
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = (k + 1) as f64 * u / (1.0 - (k + 1) as f64 * u);
    for (i, ((exact, abs), g)) in reference(x, rows, w, k, out).iter().zip(got).enumerate() {
        let diff = (f64::from(*g) - exact).abs();
        assert!(
            diff <= gamma * abs + f64::from(f32::MIN_POSITIVE),
            "output {i}: {g} vs exact {exact} (bound {})",
            gamma * abs
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn matches_exact_dot_products(
        rows in 1usize..=11,
        k in 1usize..=70,
        out in 1usize..=140,
        seed in any::<u64>(),
    ) {
        let fill = |n: usize, s: u64| -> Vec<f32> {
            (0..n)
                .map(|j| {
                    let h = (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ s;
                    ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                })
                .collect()
        };
        let (x, w) = (fill(rows * k, seed), fill(out * k, seed.rotate_left(17)));
        let y = few_rows_times_weight_rows(&x, rows, &w, k, out);
        prop_assert_eq!(y.len(), rows * out);
        check(&x, rows, &w, k, out, &y);
    }
}

#[test]
fn tensor_path_takes_flex_views_and_declines_other_layouts() {
    let dev = Default::default();
    let (o, i, rows) = (130, 37, 5);
    let w: Vec<f32> = (0..o * i)
        .map(|j| ((j * 31 % 97) as f32 - 48.0) / 53.0)
        .collect();
    let xs: Vec<f32> = (0..rows * i).map(|j| (j % 13) as f32 / 4.0 - 1.5).collect();
    let weight = Tensor::<Flex, 2>::from_data(TensorData::new(w.clone(), [o, i]), &dev);
    let x = Tensor::<Flex, 2>::from_data(TensorData::new(xs.clone(), [rows, i]), &dev);
    let y = few_rows_matmul(&x, &weight.clone().transpose()).expect("flex [out, in] view");
    assert_eq!(y.dims(), [rows, o]);
    check(&xs, rows, &w, i, o, &y.into_data().to_vec::<f32>().unwrap());
    // A contiguous [in, out] weight (GPT-2's Conv1D layout) is not rows of W.
    let in_out = weight.clone().transpose().into_data();
    let in_out = Tensor::<Flex, 2>::from_data(in_out, &dev);
    assert!(few_rows_matmul(&x, &in_out).is_none());
    // A column slice of the view is a block of W's rows, mid-buffer.
    let part = weight.clone().transpose().narrow(1, 64, 40);
    let y = few_rows_matmul(&x, &part).expect("narrowed view");
    check(
        &xs,
        rows,
        &w[64 * i..104 * i],
        i,
        40,
        &y.into_data().to_vec::<f32>().unwrap(),
    );
    // Under autodiff the weight has a host view too, but a product made
    // outside the graph would lose its gradients: burn's matmul takes it.
    type Ad = burn::backend::Autodiff<Flex>;
    let ad_weight = Tensor::<Ad, 2>::from_inner(weight).transpose();
    let ad_x = Tensor::<Ad, 2>::from_inner(x).require_grad();
    assert!(few_rows_matmul(&ad_x, &ad_weight).is_none());
}
