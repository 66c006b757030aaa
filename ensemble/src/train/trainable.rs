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
use super::loss::{block_mean_nll, mean_nll};
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

/// Each block's own mean next-token loss and its gradient with respect to
/// every adapter parameter, as [`loss_and_gradient`] gives for that block
/// alone (with `dropout[k]` for block `k`; empty: none), from one batched
/// forward and backward pass through [`PerRowTrainable`]: DP-SGD's
/// per-example gradients where the host step does not serve the model.
pub(crate) fn block_losses_and_gradients<B: AutodiffBackend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    params: &LoraParams,
    blocks: &[&Vec<u32>],
    dropout: &[Dropout],
    device: &B::Device,
) -> Result<Vec<(f64, Vec<f32>)>, TrainError> {
    if !dropout.is_empty() && dropout.len() != blocks.len() {
        return Err(TrainError::BadData(format!(
            "{} dropout passes for {} blocks",
            dropout.len(),
            blocks.len()
        )));
    }
    let t = PerRowTrainable::<B>::new(params, blocks.len(), dropout, device);
    let losses = block_mean_nll(model, blocks, Some(&t))?;
    let values = to_vec(losses.clone())?;
    // Copy k meets only block k's loss, so the sum's gradient with respect
    // to copy k is block k's own gradient.
    let grads = losses.sum().backward();
    let gradients = t.gradients(params, &grads)?;
    Ok(values.into_iter().map(f64::from).zip(gradients).collect())
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

/// One copy of the LoRA factors per row of the batch, each an autodiff leaf
/// (`[rows, fan_in, r]` and `[rows, r, fan_out]`, every copy equal to the
/// parameters): row `k` goes through copy `k` only, with its own dropout
/// pass, so each copy's gradient is its row's own.
pub(crate) struct PerRowTrainable<B: AutodiffBackend> {
    scale: f64,
    rows: usize,
    factors: HashMap<Site, (Tensor<B, 3>, Tensor<B, 3>)>,
    dropout: Vec<Dropout>,
    device: B::Device,
}

impl<B: AutodiffBackend> PerRowTrainable<B> {
    /// `rows` copies of `params`' factors; `dropout[k]` (with `p > 0`) masks
    /// row `k`'s inputs, none when empty.
    pub fn new(params: &LoraParams, rows: usize, dropout: &[Dropout], device: &B::Device) -> Self {
        let r = params.config().r;
        let stacked = |values: &[f32], dims: [usize; 2]| {
            let data: Vec<f32> = (0..rows).flat_map(|_| values.iter().copied()).collect();
            Tensor::<B, 3>::from_data(TensorData::new(data, [rows, dims[0], dims[1]]), device)
                .require_grad()
        };
        let factors = params
            .layout()
            .iter()
            .map(|l| {
                let (a, b) = params.factors(l);
                (
                    l.site,
                    (stacked(a, [l.fan_in, r]), stacked(b, [r, l.fan_out])),
                )
            })
            .collect();
        Self {
            scale: params.config().scale(),
            rows,
            factors,
            dropout: if dropout.iter().all(|d| d.p > 0.0) {
                dropout.to_vec()
            } else {
                Vec::new()
            },
            device: device.clone(),
        }
    }

    /// Each row's gradient, flat in `params`' layout (zero where the graph
    /// did not reach).
    pub fn gradients(
        &self,
        params: &LoraParams,
        grads: &B::Gradients,
    ) -> Result<Vec<Vec<f32>>, TrainError> {
        let mut out = vec![vec![0.0f32; params.len()]; self.rows];
        for l in params.layout() {
            let (a, b) = &self.factors[&l.site];
            if let Some(g) = a.grad(grads) {
                let g = to_vec(g)?;
                let per = l.b_offset - l.a_offset;
                for (row, chunk) in out.iter_mut().zip(g.chunks(per)) {
                    row[l.a_offset..l.b_offset].copy_from_slice(chunk);
                }
            }
            if let Some(g) = b.grad(grads) {
                let g = to_vec(g)?;
                let per = params.config().r * l.fan_out;
                for (row, chunk) in out.iter_mut().zip(g.chunks(per)) {
                    row[l.b_offset..l.b_offset + per].copy_from_slice(chunk);
                }
            }
        }
        Ok(out)
    }
}

impl<B: AutodiffBackend> LinearDelta<B> for PerRowTrainable<B> {
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        let (a, b) = self.factors.get(&site)?;
        let [rows, seq, width] = x.dims();
        // Built for this batch's rows (`block_losses_and_gradients`).
        debug_assert_eq!(rows, self.rows);
        let x = if self.dropout.is_empty() {
            x.clone()
        } else {
            let mask: Vec<f32> = self
                .dropout
                .iter()
                .flat_map(|d| dropout_mask(d, site, seq * width))
                .collect();
            x.clone()
                * Tensor::<B, 3>::from_data(TensorData::new(mask, [rows, seq, width]), &self.device)
        };
        Some(x.matmul(a.clone()).matmul(b.clone()).mul_scalar(self.scale))
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::backend::{Autodiff, Flex};
    use privmix_models::{LoadOptions, Model};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::lora::{LoraBase, LoraConfig};

    type AB = Autodiff<Flex>;

    /// One batched pass through per-row copies of the factors gives each
    /// block the loss and gradient of a pass over that block alone (the
    /// reference, one [`Trainable`] per block), with and without dropout.
    /// Tolerances: losses to 2e-5 relative, each gradient to 2e-4 of its
    /// largest entry (f32 sums in other orders).
    #[test]
    fn per_row_copies_give_each_block_its_own_gradient() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/llama");
        let model = Model::<AB>::load(LoadOptions::path(&dir, &Default::default())).unwrap();
        let device = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let blocks: Vec<Vec<u32>> = (0..3)
            .map(|_| (0..9).map(|_| rng.random_range(0..256)).collect())
            .collect();
        let refs: Vec<&Vec<u32>> = blocks.iter().collect();
        for p in [0.0, 0.2] {
            let mut cfg = LoraConfig::new(4, 8.0, &["q_proj", "v_proj", "down_proj"]).unwrap();
            cfg.lora_dropout = p;
            let mut params =
                LoraParams::init(&cfg, &model.base_shapes().unwrap(), &mut rng).unwrap();
            for v in params.values_mut() {
                *v = rng.random_range(-0.2..0.2);
            }
            let passes: Vec<Dropout> = (0..blocks.len() as u64)
                .map(|pass| Dropout { p, seed: 11, pass })
                .collect();
            let batched =
                block_losses_and_gradients(&model, &params, &refs, &passes, &device).unwrap();
            assert_eq!(batched.len(), blocks.len());
            for (k, (loss, grad)) in batched.iter().enumerate() {
                let (want_loss, want) =
                    loss_and_gradient(&model, &params, &[refs[k]], Some(passes[k]), &device)
                        .unwrap();
                assert!(
                    (loss - want_loss).abs() <= 2e-5 * want_loss.abs(),
                    "p {p}, block {k}: loss {loss} vs {want_loss}"
                );
                let scale = want.iter().fold(0.0f32, |m, g| m.max(g.abs()));
                assert!(scale > 0.0);
                let worst = grad
                    .iter()
                    .zip(&want)
                    .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst <= 2e-4 * scale,
                    "p {p}, block {k}: {worst} of {scale}"
                );
            }
        }
        // Dropout passes that do not match the blocks are an error.
        let err = block_losses_and_gradients(
            &model,
            &LoraParams::init(
                &LoraConfig::new(4, 8.0, &["q_proj"]).unwrap(),
                &model.base_shapes().unwrap(),
                &mut rng,
            )
            .unwrap(),
            &refs,
            &[Dropout {
                p: 0.1,
                seed: 1,
                pass: 0,
            }],
            &device,
        );
        assert!(err.is_err());
    }
}
