//! Tests of [`super`].

use super::*;
use burn::backend::Flex;
use burn::tensor::TensorData;

/// The parallel column split computes each output as a dot product over
/// the same `in` terms as one matmul. For one row both go to gemm's gemv
/// kernel, which sums each output in the same order: bit-identical. For
/// more rows gemm may block the sum differently, so outputs may differ by
/// reordering alone: each order is within `γ_k Σ|w_j x_j|` of the exact
/// sum (`γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`, Higham, *Accuracy and
/// Stability*, Thm 3.1), hence within `2 γ_k Σ|w_j x_j|` of each other
/// (the bias is added identically on both sides).
#[test]
fn column_split_equals_one_matmul_exactly() {
    let dev = Default::default();
    let (o, i) = (200, 576); // 115 200 weights: above SPLIT_MIN_WEIGHTS
    let w: Vec<f32> = (0..o * i)
        .map(|j| ((j * 7919 % 1013) as f32 - 506.0) / 977.0)
        .collect();
    let bias: Vec<f32> = (0..o).map(|j| j as f32 / 7.0).collect();
    // In GPT-2's `[in, out]` layout, which the few-rows kernel declines
    // (its rows are not W's rows), so the column split answers.
    let w_in_out: Vec<f32> = (0..i * o).map(|j| w[(j % o) * i + j / o]).collect();
    let lin = Linear::<Flex>::from_in_out(
        Tensor::from_data(TensorData::new(w_in_out, [i, o]), &dev),
        Some(Tensor::from_data(TensorData::new(bias, [o]), &dev)),
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for rows in [1, 3] {
        let xs: Vec<f32> = (0..rows * i).map(|j| (j % 17) as f32 / 5.0 - 1.5).collect();
        let x = Tensor::<Flex, 3>::from_data(TensorData::new(xs.clone(), [1, rows, i]), &dev);
        let (split, chunks) =
            pool.install(|| (lin.forward_base(x.clone()), lin.parallel_chunks(rows)));
        assert_eq!(chunks, Some(2));
        let plain = x.reshape([rows, i]).matmul(lin.weight_t().clone())
            + lin.bias().unwrap().clone().unsqueeze::<2>();
        assert_eq!(split.dims(), [1, rows, o]);
        let split = split.into_data().to_vec::<f32>().unwrap();
        let plain = plain.into_data().to_vec::<f32>().unwrap();
        if rows == 1 {
            assert_eq!(split, plain);
        }
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = i as f64 * u / (1.0 - i as f64 * u);
        for (r, (gr, pr)) in split.chunks(o).zip(plain.chunks(o)).enumerate() {
            for (c, (g, p)) in gr.iter().zip(pr).enumerate() {
                let abs_sum: f64 = (0..i)
                    .map(|j| f64::from((w[c * i + j] * xs[r * i + j]).abs()))
                    .sum();
                let diff = (f64::from(*g) - f64::from(*p)).abs();
                assert!(diff <= 2.0 * gamma * abs_sum, "row {r} col {c}: {g} vs {p}");
            }
        }
    }
}

/// A delta with a host form that adds `site.layer + x[row, 0]` to every
/// output of a row, counting its calls; `delta` is never to be used.
struct HostOnly(std::sync::atomic::AtomicUsize);

impl LinearDelta<Flex> for HostOnly {
    fn delta(&self, _: Site, _: &Tensor<Flex, 3>) -> Option<Tensor<Flex, 3>> {
        panic!("the host form should have served")
    }

    fn add_host(&self, site: Site, x: &[f32], batch: usize, y: &mut [f32]) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (rows, inp) = (batch * 2, x.len() / (batch * 2));
        let out = y.len() / rows;
        for r in 0..rows {
            for o in 0..out {
                y[r * out + o] += site.layer as f32 + x[r * inp];
            }
        }
        true
    }
}

/// On plain flex a few rows through a quantised weight take the host
/// path: the delta's host form is added to exactly the base product.
#[test]
fn quantised_decode_adds_the_host_delta() {
    use crate::gguf::GgmlType;
    let dev = Default::default();
    let (o, i) = (40, 64);
    let mut raw = Vec::new();
    for blk in 0..o * i / 32 {
        raw.extend(half::f16::from_f32(0.01 * (1 + blk % 5) as f32).to_le_bytes());
        raw.extend((0..32).map(|j| ((blk * 31 + j * 7) % 255) as u8));
    }
    let q = crate::cpu::BlockWeight::from_ggml(GgmlType::Q8_0, &raw, o, i)
        .unwrap()
        .unwrap();
    let dense: Vec<f32> = (0..o).flat_map(|r| q.row(r)).collect();
    let lin = Linear::<Flex>::new(
        Tensor::from_data(TensorData::new(dense, [o, i]), &dev),
        None,
    )
    .with_quantized(q);
    assert!(lin.is_quantized());
    let xs: Vec<f32> = (0..3 * 2 * i)
        .map(|j| (j % 13) as f32 / 6.0 - 1.0)
        .collect();
    let x = Tensor::<Flex, 3>::from_data(TensorData::new(xs.clone(), [3, 2, i]), &dev);
    let site = Site {
        layer: 5,
        module: Projection::Up,
    };
    let hook = HostOnly(std::sync::atomic::AtomicUsize::new(0));
    let got = lin
        .forward(x.clone(), site, Some(&hook))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(hook.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    let base = lin.forward_base(x).into_data().to_vec::<f32>().unwrap();
    for (k, (g, b)) in got.iter().zip(&base).enumerate() {
        assert_eq!(*g, b + (5.0 + xs[(k / o) * i]), "entry {k}");
    }
}
