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
}

impl<B: Backend> LayerNorm<B> {
    /// A norm with gain `gain` and bias `bias` (both `[dim]`) and epsilon `eps`.
    pub fn new(gain: Tensor<B, 1>, bias: Tensor<B, 1>, eps: f64) -> Self {
        Self { gain, bias, eps }
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
}
