//! The adapter being trained: its factors as autodiff leaves, applied
//! through the models' [`LinearDelta`] hook with PEFT's LoRA dropout, and
//! the gradient read back into the flat host layout.

use std::collections::HashMap;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use privmix_models::runtime::to_vec;
use privmix_models::{LinearDelta, Site};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::error::TrainError;
use super::loss::mean_nll;
use super::params::LoraParams;
use privmix_models::LanguageModel;

/// Mean next-token loss of `model` + `params` on `blocks` and its gradient
/// with respect to every adapter parameter (flat, in `params`' layout).
pub(crate) fn loss_and_gradient<B: AutodiffBackend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    params: &LoraParams,
    blocks: &[&Vec<u32>],
    dropout: Option<Dropout>,
    device: &B::Device,
) -> Result<(f64, Vec<f32>), TrainError> {
    let t = Trainable::<B>::new(params, dropout, device);
    let loss = mean_nll(model, blocks, Some(&t))?;
    let value = f64::from(to_vec(loss.clone())?[0]);
    let grads = loss.backward();
    Ok((value, t.gradient(params, &grads)?))
}

/// Dropout on the adapter's input (PEFT: `B(A(dropout(x))) · scale`), with
/// masks drawn from a ChaCha8 stream keyed by `(seed, pass, site)`: the
/// same pass of the same run draws the same masks, with no state to save.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dropout {
    pub p: f64,
    pub seed: u64,
    pub pass: u64,
}

/// LoRA factors as `require_grad` leaves of the autodiff graph.
pub(crate) struct Trainable<B: AutodiffBackend> {
    scale: f64,
    factors: HashMap<Site, (Tensor<B, 2>, Tensor<B, 2>)>,
    dropout: Option<Dropout>,
    device: B::Device,
}

impl<B: AutodiffBackend> Trainable<B> {
    /// Leaves holding `params`' values; `dropout` with `p > 0` masks inputs.
    pub fn new(params: &LoraParams, dropout: Option<Dropout>, device: &B::Device) -> Self {
        let r = params.config().r;
        let factors = params
            .layout()
            .iter()
            .map(|l| {
                let (a, b) = params.factors(l);
                let a =
                    Tensor::<B, 2>::from_data(TensorData::new(a.to_vec(), [l.fan_in, r]), device)
                        .require_grad();
                let b =
                    Tensor::<B, 2>::from_data(TensorData::new(b.to_vec(), [r, l.fan_out]), device)
                        .require_grad();
                (l.site, (a, b))
            })
            .collect();
        Self {
            scale: params.config().scale(),
            factors,
            dropout: dropout.filter(|d| d.p > 0.0),
            device: device.clone(),
        }
    }

    /// The gradient of every parameter, flat in `params`' layout (zero where
    /// the graph did not reach).
    pub fn gradient(
        &self,
        params: &LoraParams,
        grads: &B::Gradients,
    ) -> Result<Vec<f32>, TrainError> {
        let mut out = vec![0.0f32; params.len()];
        for l in params.layout() {
            let (a, b) = &self.factors[&l.site];
            if let Some(g) = a.grad(grads) {
                out[l.a_offset..l.b_offset].copy_from_slice(&to_vec(g)?);
            }
            if let Some(g) = b.grad(grads) {
                let g = to_vec(g)?;
                out[l.b_offset..l.b_offset + g.len()].copy_from_slice(&g);
            }
        }
        Ok(out)
    }

    fn mask(&self, d: &Dropout, site: Site, dims: [usize; 3]) -> Tensor<B, 3> {
        let values = dropout_mask(d, site, dims.iter().product());
        Tensor::from_data(TensorData::new(values, dims), &self.device)
    }
}

/// The first `n` entries of `site`'s dropout mask in pass `d` (row-major
/// over `[rows, seq, width]` of the adapter's input): `1 / (1 − p)` where
/// the input is kept, 0 where dropped. The host step draws the same masks.
pub(crate) fn dropout_mask(d: &Dropout, site: Site, n: usize) -> Vec<f32> {
    let key = (site.layer as u64) << 8 | site.module as u64;
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&d.seed.to_le_bytes());
    seed[8..16].copy_from_slice(&d.pass.to_le_bytes());
    seed[16..24].copy_from_slice(&key.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(seed);
    let keep = 1.0 - d.p;
    (0..n)
        .map(|_| {
            if rng.random::<f64>() < keep {
                (1.0 / keep) as f32
            } else {
                0.0
            }
        })
        .collect()
}

impl<B: AutodiffBackend> LinearDelta<B> for Trainable<B> {
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        let (a, b) = self.factors.get(&site)?;
        let [rows, seq, width] = x.dims();
        let out = b.dims()[1];
        let x = match &self.dropout {
            Some(d) => x.clone() * self.mask(d, site, [rows, seq, width]),
            None => x.clone(),
        };
        let y = x
            .reshape([rows * seq, width])
            .matmul(a.clone())
            .matmul(b.clone())
            .mul_scalar(self.scale);
        Some(y.reshape([rows, seq, out]))
    }
}
