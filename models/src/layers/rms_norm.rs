//! Root-mean-square layer normalisation (Zhang & Sennrich 2019).

use burn::tensor::{Tensor, backend::Backend};

/// `y = x / √(mean(x²) + ε) · g` over the last dimension.
///
/// `g` is the *effective* gain: Llama checkpoints store it directly; Gemma
/// checkpoints store `w` with `g = 1 + w` (HF `GemmaRMSNorm` computes
/// `(1 + w)` in f32), and llama.cpp's converter stores Gemma's `1 + w` already
/// added. The loader resolves that once ([`crate::weights::WeightSource::norm_gain`]),
/// so this struct has one convention.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    gain: Tensor<B, 1>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// A norm with effective gain `gain` (`[dim]`) and epsilon `eps`.
    pub fn new(gain: Tensor<B, 1>, eps: f64) -> Self {
        Self { gain, eps }
    }

    /// Normalises over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let ms = x.clone().powi_scalar(2).mean_dim(D - 1);
        let inv = (ms + self.eps).sqrt().recip();
        x * inv * self.gain.clone().unsqueeze::<D>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn normalises_rows_to_unit_rms_times_gain() {
        let dev = Default::default();
        let x = Tensor::<Flex, 2>::from_floats([[3.0f32, 4.0], [0.0, 2.0]], &dev);
        let norm = RmsNorm::new(Tensor::from_floats([1.0f32, 2.0], &dev), 0.0);
        let y = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        // Row 0: rms = √12.5; row 1: rms = √2.
        let r0 = 12.5f32.sqrt();
        let r1 = 2.0f32.sqrt();
        let want = [3.0 / r0, 8.0 / r0, 0.0, 4.0 / r1];
        for (g, w) in y.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}
