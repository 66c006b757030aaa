//! Layer normalisation (Ba, Kiros & Hinton 2016), as GPT-2 uses it.

use burn::tensor::{Tensor, backend::Backend};

/// `y = (x − mean(x)) / √(var(x) + ε) · g + b` over the last dimension, with
/// the biased variance `mean((x − mean(x))²)`, as `torch.nn.LayerNorm`
/// computes it (HF GPT-2 `ln_1`, `ln_2`, `ln_f`).
#[derive(Debug, Clone)]
pub struct LayerNorm<B: Backend> {
    gain: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
    /// `gain` and `bias` in host memory, read on first use by
    /// `LayerNorm::forward_host_into`.
    #[cfg(feature = "flex")]
    host: std::sync::Arc<std::sync::OnceLock<(Vec<f32>, Vec<f32>)>>,
}

impl<B: Backend> LayerNorm<B> {
    /// A norm with gain `gain` and bias `bias` (both `[dim]`) and epsilon `eps`.
    pub fn new(gain: Tensor<B, 1>, bias: Tensor<B, 1>, eps: f64) -> Self {
        Self {
            gain,
            bias,
            eps,
            #[cfg(feature = "flex")]
            host: Default::default(),
        }
    }

    /// [`LayerNorm::forward`] of the rows of `x` (row-major, each as wide as
    /// the gain) in host memory, into `out` (as long as `x`), with the same
    /// f32 steps: the mean, `x − mean`, the mean of its squares, `+ ε`, the
    /// square root's reciprocal, `· inv`, `· g`, `+ b`. Only the order of
    /// the means' sums may differ from burn's.
    #[cfg(feature = "flex")]
    pub(crate) fn forward_host_into(&self, x: &[f32], out: &mut [f32]) {
        let (gain, bias) = self.host.get_or_init(|| {
            let read = |t: &Tensor<B, 1>| crate::runtime::to_vec(t.clone()).expect("f32 vector");
            (read(&self.gain), read(&self.bias))
        });
        let width = gain.len().max(1);
        let eps = self.eps as f32;
        for (row, out) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            let mean = row.iter().sum::<f32>() / width as f32;
            for (o, v) in out.iter_mut().zip(row) {
                *o = v - mean;
            }
            let var = out.iter().map(|c| c * c).sum::<f32>() / width as f32;
            let inv = (var + eps).sqrt().recip();
            for ((o, g), b) in out.iter_mut().zip(gain).zip(bias) {
                *o = *o * inv * g + b;
            }
        }
    }

    /// Normalises over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let centred = x.clone() - x.mean_dim(D - 1);
        let var = centred.clone().powi_scalar(2).mean_dim(D - 1);
        let inv = (var + self.eps).sqrt().recip();
        centred * inv * self.gain.clone().unsqueeze::<D>() + self.bias.clone().unsqueeze::<D>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn centres_scales_and_shifts_each_row() {
        let dev = Default::default();
        let x = Tensor::<Flex, 2>::from_floats([[1.0f32, 3.0], [4.0, 0.0]], &dev);
        let norm = LayerNorm::new(
            Tensor::from_floats([2.0f32, 3.0], &dev),
            Tensor::from_floats([0.5f32, -1.0], &dev),
            0.0,
        );
        let y = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        // Row 0: mean 2, variance 1, x̂ = [-1, 1]; row 1: mean 2, variance 4,
        // x̂ = [1, -1]; then x̂ · [2, 3] + [0.5, -1].
        for (g, w) in y.iter().zip([-1.5f32, 2.0, 2.5, -4.0]) {
            assert!((g - w).abs() < 1e-6, "{y:?}");
        }
    }

    #[test]
    fn uses_the_biased_variance_and_epsilon() {
        let dev = Default::default();
        let x = Tensor::<Flex, 2>::from_floats([[0.0f32, 0.0, 3.0]], &dev);
        let norm = LayerNorm::new(
            Tensor::from_floats([1.0f32, 1.0, 1.0], &dev),
            Tensor::from_floats([0.0f32, 0.0, 0.0], &dev),
            0.5,
        );
        let y = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        // mean 1, biased variance (1 + 1 + 4) / 3 = 2, so x̂ = (x − 1) / √2.5.
        let s = 2.5f32.sqrt();
        for (g, w) in y.iter().zip([-1.0 / s, -1.0 / s, 2.0 / s]) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn host_form_agrees_with_the_tensor_form() {
        let dev = Default::default();
        let xs: Vec<f32> = (0..3 * 40)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0 + 5.0)
            .collect();
        let gain: Vec<f32> = (0..40).map(|i| 0.5 + i as f32 / 40.0).collect();
        let bias: Vec<f32> = (0..40).map(|i| (i as f32 - 20.0) / 10.0).collect();
        let norm = LayerNorm::new(
            Tensor::<Flex, 1>::from_floats(gain.as_slice(), &dev),
            Tensor::<Flex, 1>::from_floats(bias.as_slice(), &dev),
            1e-5,
        );
        let x =
            Tensor::<Flex, 2>::from_data(burn::tensor::TensorData::new(xs.clone(), [3, 40]), &dev);
        let want = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        let mut got = vec![0.0; xs.len()];
        norm.forward_host_into(&xs, &mut got);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}
