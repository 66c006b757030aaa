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
    /// `gain` in host memory, read on first use by `RmsNorm::forward_host_into`.
    #[cfg(feature = "flex")]
    host_gain: std::sync::Arc<std::sync::OnceLock<Vec<f32>>>,
}

impl<B: Backend> RmsNorm<B> {
    /// A norm with effective gain `gain` (`[dim]`) and epsilon `eps`.
    pub fn new(gain: Tensor<B, 1>, eps: f64) -> Self {
        Self {
            gain,
            eps,
            #[cfg(feature = "flex")]
            host_gain: Default::default(),
        }
    }

    /// The effective gain `g`, `[dim]`.
    pub fn gain(&self) -> &Tensor<B, 1> {
        &self.gain
    }

    /// The epsilon added to the mean of squares.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// Normalises over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let ms = x.clone().powi_scalar(2).mean_dim(D - 1);
        let inv = (ms + self.eps).sqrt().recip();
        x * inv * self.gain.clone().unsqueeze::<D>()
    }

    /// [`RmsNorm::forward`] of the rows of `x` (row-major, each as wide as
    /// the gain) in host memory, into `out` (as long as `x`), with the same
    /// f32 steps: the mean of squares, `+ ε`, the square root's reciprocal,
    /// `x · inv`, `· g`. Only the order of the mean's sum may differ from
    /// burn's.
    #[cfg(feature = "flex")]
    pub(crate) fn forward_host_into(&self, x: &[f32], out: &mut [f32]) {
        let gain = self
            .host_gain
            .get_or_init(|| crate::runtime::to_vec(self.gain.clone()).expect("f32 gain"));
        rms_norm_host(x, gain, self.eps as f32, out);
    }
}

/// RMSNorm of the rows of `x` (row-major, each as wide as `gain`) into
/// `out`, in host memory: the kernel of [`RmsNorm`]'s host form, for
/// callers that hold the gain as host values (the host training step; its
/// backward pass is [`crate::ops::backward::rms_norm_backward`]).
#[cfg(feature = "flex")]
pub fn rms_norm_host(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    crate::cpu::dispatch::vectorize(HostNorm { x, out, gain, eps });
}

/// `1 / √(mean(x²) + ε)` of one row, the sum of squares in 16 fixed lanes
/// reduced in a fixed order (plain multiplies and adds, never fused): the
/// same bits on every CPU. A sum whose lane count followed the SIMD level
/// (16 on AVX-512, 8 on AVX2) moved the norm by an ulp between machines,
/// and 8-bit activations turn such an ulp into a different rounding
/// downstream. The forward and backward passes share it, so the backward
/// pass sees the very factor the forward pass applied.
#[inline(always)]
pub fn inverse_rms(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in lanes.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let mut sum = 0.0f32;
    for a in lanes {
        sum += a;
    }
    for v in tail {
        sum += v * v;
    }
    let ms = sum / row.len().max(1) as f32;
    (ms + eps).sqrt().recip()
}

/// [`RmsNorm::forward_host_into`] inside a `pulp` dispatch: the sums of
/// squares in 16 independent lanes (which vectorise at any SIMD level, unlike one
/// sequential sum), reduced in a fixed order so that the result does not depend on
/// the CPU.
#[cfg(feature = "flex")]
struct HostNorm<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
    gain: &'a [f32],
    eps: f32,
}

#[cfg(feature = "flex")]
impl pulp::WithSimd for HostNorm<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let HostNorm { x, out, gain, eps } = self;
        let width = gain.len().max(1);
        for (row, out) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            let inv = inverse_rms(row, eps);
            for ((o, v), g) in out.iter_mut().zip(row).zip(gain) {
                *o = v * inv * g;
            }
        }
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

    #[cfg(feature = "flex")]
    #[test]
    fn host_form_agrees_with_the_tensor_form() {
        let dev = Default::default();
        let xs: Vec<f32> = (0..3 * 40)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        let gain: Vec<f32> = (0..40).map(|i| 0.5 + i as f32 / 40.0).collect();
        let norm = RmsNorm::new(Tensor::<Flex, 1>::from_floats(gain.as_slice(), &dev), 1e-5);
        let x =
            Tensor::<Flex, 2>::from_data(burn::tensor::TensorData::new(xs.clone(), [3, 40]), &dev);
        let want = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        let mut got = vec![0.0; xs.len()];
        norm.forward_host_into(&xs, &mut got);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}
