//! The norm a decoder block applies: RMSNorm (Llama, Gemma) or LayerNorm
//! with a bias (GPT-2), one type for the block operations to take.

use burn::tensor::{Tensor, backend::Backend};

use super::layer_norm::LayerNorm;
use super::rms_norm::RmsNorm;

/// One of a decoder's norms.
#[derive(Debug, Clone)]
pub enum Norm<B: Backend> {
    /// Root-mean-square norm with a gain ([`RmsNorm`]).
    Rms(RmsNorm<B>),
    /// Mean-centring norm with a gain and a bias ([`LayerNorm`]).
    Layer(LayerNorm<B>),
}

impl<B: Backend> Norm<B> {
    /// Normalises over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Norm::Rms(n) => n.forward(x),
            Norm::Layer(n) => n.forward(x),
        }
    }

    /// The RMSNorm, if this is one.
    pub fn as_rms(&self) -> Option<&RmsNorm<B>> {
        match self {
            Norm::Rms(n) => Some(n),
            Norm::Layer(_) => None,
        }
    }

    /// [`Norm::forward`] of the rows of `x` (row-major) in host memory, into
    /// `out` (as long as `x`), with the same f32 steps (the host block
    /// operations' norm, and the host training step's).
    #[cfg(feature = "flex")]
    pub fn forward_host_into(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Norm::Rms(n) => n.forward_host_into(x, out),
            Norm::Layer(n) => n.forward_host_into(x, out),
        }
    }
}

impl<B: Backend> From<RmsNorm<B>> for Norm<B> {
    fn from(n: RmsNorm<B>) -> Self {
        Norm::Rms(n)
    }
}

impl<B: Backend> From<LayerNorm<B>> for Norm<B> {
    fn from(n: LayerNorm<B>) -> Self {
        Norm::Layer(n)
    }
}
