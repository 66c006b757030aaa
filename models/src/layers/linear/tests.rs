//! Tests of [`super`].

use super::*;
use burn::backend::Flex;
use burn::tensor::TensorData;

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
