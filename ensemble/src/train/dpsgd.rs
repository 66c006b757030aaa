//! DP-SGD LoRA fine-tuning: the training-time baseline the PMixED/AdaPMixED
//! ("Differentially Private Next-Token Prediction of Large Language Models",
//! arXiv 2403.15638; "Adaptively Private Next-Token Prediction of Large
//! Language Models", arXiv 2410.02016) and SubMix ("Submix: Practical Private
//! Prediction for Large-Scale Language Models", arXiv 2201.00971) papers
//! compare against.
//!
//! # Where the coins come from
//!
//! The guarantee rests on two random choices the adversary must not predict:
//! which examples each step's Poisson draw includes (amplification by
//! subsampling assumes the draw is secret) and the Gaussian noise. A generator
//! seeded with a known value makes both computable, and then the released
//! adapter is a deterministic function of the data with no privacy at all. So
//! they come from [`NoiseSource::Os`] by default: ChaCha20 seeded by the
//! operating system. [`NoiseSource::Seeded`] exists for reproducible
//! experiments only and must never protect real data. The PEFT initialisation
//! and LoRA dropout stay on [`DpSgdConfig::seed`]: the guarantee holds for any
//! fixed initialisation and any dropout mask (each example's gradient is
//! clipped whatever the mask), so they need no secrecy.

use burn::tensor::backend::AutodiffBackend;
use privmix_models::LanguageModel;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::adamw::{AdamW, AdamWConfig, linear_schedule};
use super::error::TrainError;
use super::host::{Group, HostSlot, HostTrainable, StepPath};
use super::loss::check_blocks;
use super::params::LoraParams;
use super::privacy::{DpSgdEpsilon, DpSgdNoise, clip_to_norm, dp_sgd_epsilon, poisson_sample};
use super::trainable::{Dropout, block_losses_and_gradients};

/// Examples per batched pass of the host step (bounds its memory: the
/// logits alone take `examples × seq × vocab` floats).
const HOST_EXAMPLES: usize = 8;

/// Examples per batched pass of burn autodiff (each with its own copy of
/// the factors; bounds the pass's memory).
const AUTODIFF_EXAMPLES: usize = 16;
use crate::lora::{BaseShapes, LoraAdapter, LoraBase, LoraConfig};
use privmix_models::ModelBackend;

/// Where the privacy-relevant coins (Poisson sampling and Gaussian noise) come
/// from; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NoiseSource {
    /// ChaCha20 seeded by the operating system's entropy source: the only
    /// choice that protects real data (the default).
    #[default]
    Os,
    /// ChaCha20 seeded with this value: reproducible, for experiments and
    /// tests only. Anyone who knows the seed can recompute the noise and the
    /// batches, so the trained adapter has NO privacy guarantee.
    Seeded(u64),
}

impl NoiseSource {
    /// The generator this source gives.
    pub(crate) fn rng(self) -> Result<ChaCha20Rng, TrainError> {
        match self {
            Self::Os => ChaCha20Rng::try_from_os_rng().map_err(|e| {
                TrainError::bad(
                    "noise",
                    format!("the operating system's entropy source is unavailable: {e}"),
                )
            }),
            Self::Seeded(seed) => Ok(ChaCha20Rng::seed_from_u64(seed)),
        }
    }
}

/// DP-SGD hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct DpSgdConfig {
    /// Adapter shape (dropout is applied per example, a function of that example alone).
    pub lora: LoraConfig,
    /// Peak learning rate (linear warmup/decay as in [`super::TrainConfig`]).
    pub learning_rate: f64,
    /// Warmup steps.
    pub warmup_steps: usize,
    /// Steps T (each one Poisson-subsampled Gaussian release).
    pub total_steps: usize,
    /// Poisson sampling rate q, in `(0, 1]`.
    pub sampling_rate: f64,
    /// Per-example clip norm C (> 0).
    pub clip_norm: f64,
    /// Noise multiplier σ (> 0): noise std on the sum is σ·C.
    pub noise_multiplier: f64,
    /// δ at which ε is reported, in `(0, 1)`.
    pub delta: f64,
    /// AdamW on the privatised gradient (post-processing).
    pub adamw: AdamWConfig,
    /// Seed of the PEFT initialisation and of LoRA dropout (not private).
    pub seed: u64,
    /// Source of the Poisson sampling and the Gaussian noise: the OS by
    /// default; a fixed seed only for experiments.
    pub noise: NoiseSource,
}

impl DpSgdConfig {
    /// Checks every range.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.lora.validate()?;
        self.adamw.validate()?;
        let positive = |name, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(TrainError::bad(
                    name,
                    format!("{v} is not positive and finite"),
                ))
            }
        };
        positive("learning_rate", self.learning_rate)?;
        positive("clip_norm", self.clip_norm)?;
        positive("noise_multiplier", self.noise_multiplier)?;
        if !(self.sampling_rate > 0.0 && self.sampling_rate <= 1.0) {
            return Err(TrainError::bad(
                "sampling_rate",
                format!("{} is not in (0, 1]", self.sampling_rate),
            ));
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return Err(TrainError::bad(
                "delta",
                format!("{} is not in (0, 1)", self.delta),
            ));
        }
        if self.total_steps == 0 {
            return Err(TrainError::bad("total_steps", "must be at least 1"));
        }
        Ok(())
    }
}

/// What one DP-SGD step did (for monitoring; the batch size and losses are
/// not private outputs — only the parameters are).
#[derive(Debug, Clone, PartialEq)]
pub struct DpSgdStep {
    /// Examples the Poisson draw included.
    pub batch: usize,
    /// How many of them had their gradient clipped.
    pub clipped: usize,
    /// Mean loss over the included examples (NaN for an empty draw).
    pub mean_loss: f64,
}

/// DP-SGD (Abadi et al. 2016) on a LoRA adapter, example-level: an example
/// is one training block. Each step Poisson-samples blocks at rate q,
/// computes every included block's gradient alone (a batch of one per
/// backward), clips it to norm C, rounds it to a fine grid and adds it to an
/// integer sum, adds the exact discrete Gaussian noise of parameter σ·Δ' (Δ' =
/// C plus the rounding, [`super::DpSgdNoise`]), divides by the expected batch
/// `q·n` and takes an AdamW step.
///
/// Guarantee: the sequence of adapters is (ε, δ)-DP with respect to adding
/// or removing one block, for the ε of [`DpSgdTrainer::epsilon`]
/// (Poisson-subsampled Gaussian RDP composed over the steps taken). For
/// user-level DP give each user one block (`UserUnit::Block` users cut to
/// one block each), or group-privacy-scale ε. The guarantee needs
/// [`NoiseSource::Os`] (see the module docs). The coins are floating-point safe
/// (exact Bernoulli sampling, the exact discrete Gaussian; proof in
/// `train/privacy.md`), so Mironov's attack ("On Significance of the Least
/// Significant Bits for Differential Privacy", CCS 2012) finds no artefact of
/// the data in the noise's low bits.
pub struct DpSgdTrainer<'m, B: AutodiffBackend, M: LanguageModel<B> + LoraBase> {
    pub(crate) model: &'m M,
    pub(crate) base: BaseShapes,
    pub(crate) config: DpSgdConfig,
    pub(crate) data: Vec<Vec<u32>>,
    pub(crate) params: LoraParams,
    pub(crate) opt: AdamW,
    /// Poisson sampling and noise ([`DpSgdConfig::noise`]).
    pub(crate) private_rng: ChaCha20Rng,
    pub(crate) step: usize,
    pub(crate) device: B::Device,
    /// The host step's copy of the model (see [`StepPath`]).
    pub(crate) host: HostSlot,
}

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    DpSgdTrainer<'m, B, M>
{
    /// A fresh run (PEFT initialisation from [`DpSgdConfig::seed`], sampling
    /// and noise from [`DpSgdConfig::noise`]).
    pub fn new(model: &'m M, data: Vec<Vec<u32>>, config: DpSgdConfig) -> Result<Self, TrainError> {
        config.validate()?;
        check_blocks(&data)?;
        let base = model.base_shapes()?;
        let mut init_rng = ChaCha20Rng::seed_from_u64(config.seed);
        let params = LoraParams::init(&config.lora, &base, &mut init_rng)?;
        let opt = AdamW::new(config.adamw, params.len())?;
        let private_rng = config.noise.rng()?;
        Ok(Self {
            model,
            base,
            data,
            params,
            opt,
            private_rng,
            step: 0,
            device: model.device(),
            host: HostSlot::default(),
            config,
        })
    }

    /// Computes the per-example gradients on `path` ([`StepPath::Fastest`]
    /// by default: the host step, all examples of a step in one batched
    /// pass, where the model allows it).
    pub fn with_step_path(mut self, path: StepPath) -> Self {
        self.host = HostSlot::new(path);
        self
    }

    /// Whether the steps run the host step rather than burn autodiff.
    pub fn uses_host_step(&self) -> Result<bool, TrainError> {
        Ok(self.host.get::<B, M>(self.model)?.is_some())
    }

    /// Each picked example's mean loss and gradient, in order. Example `i`'s
    /// dropout pass is `(step, i)`: a function of the step and of the example's own
    /// index, never of its position in the draw (which would make every later
    /// example's mask, and so its gradient, depend on whether an earlier one was
    /// drawn, beyond the one example the sensitivity allows for).
    fn per_example(&self, picked: &[usize]) -> Result<Vec<(f64, Vec<f32>)>, TrainError> {
        let c = &self.config;
        let dropout = |k: usize| Dropout {
            p: c.lora.lora_dropout,
            seed: c.seed,
            pass: (self.step as u64) << 32 | k as u64,
        };
        if let Some(host) = self.host.get::<B, M>(self.model)? {
            let mut out = Vec::with_capacity(picked.len());
            for ids in picked.chunks(HOST_EXAMPLES) {
                let blocks: Vec<&Vec<u32>> = ids.iter().map(|&i| &self.data[i]).collect();
                let groups: Vec<Group> = ids
                    .iter()
                    .map(|&i| Group::new(&self.params, 1, Some(dropout(i))))
                    .collect();
                out.extend(privmix_models::threads::on_hot_pool(|| {
                    host.losses_and_gradients(&blocks, &groups)
                })?);
            }
            return Ok(out);
        }
        // burn autodiff: a batch of examples per pass, each through its own
        // copy of the factors (`PerRowTrainable`), so that each copy's
        // gradient is its example's.
        let mut out = Vec::with_capacity(picked.len());
        for ids in picked.chunks(AUTODIFF_EXAMPLES) {
            let blocks: Vec<&Vec<u32>> = ids.iter().map(|&i| &self.data[i]).collect();
            let passes: Vec<Dropout> = ids.iter().map(|&i| dropout(i)).collect();
            out.extend(block_losses_and_gradients(
                self.model,
                &self.params,
                &blocks,
                &passes,
                &self.device,
            )?);
        }
        Ok(out)
    }

    /// One DP-SGD step (an empty Poisson draw still releases noise and counts).
    pub fn step(&mut self) -> Result<DpSgdStep, TrainError> {
        let c = &self.config;
        let lr = linear_schedule(c.learning_rate, self.step, c.warmup_steps, c.total_steps);
        let c = c.clone();
        let picked = poisson_sample(self.data.len(), c.sampling_rate, &mut self.private_rng)?;
        // The clipped gradients rounded to the noise's grid and summed as integers
        // (exactly); the noise's sensitivity includes the rounding (`privacy.md`).
        let noise = DpSgdNoise::new(c.clip_norm, c.noise_multiplier, self.params.len())?;
        let mut sum = vec![0i64; self.params.len()];
        let (mut clipped, mut loss) = (0, 0.0);
        for (l, mut g) in self.per_example(&picked)? {
            if clip_to_norm(&mut g, c.clip_norm)? > c.clip_norm {
                clipped += 1;
            }
            loss += l;
            noise.accumulate(&mut sum, &noise.to_grid(&g)?)?;
        }
        let expected = c.sampling_rate * self.data.len() as f64;
        let sum = noise.release(&sum, expected, &mut self.private_rng)?;
        self.opt.step(self.params.values_mut(), &sum, lr)?;
        self.step += 1;
        Ok(DpSgdStep {
            batch: picked.len(),
            clipped,
            mean_loss: if picked.is_empty() {
                f64::NAN
            } else {
                loss / picked.len() as f64
            },
        })
    }

    /// Runs the remaining steps; returns every step's record.
    pub fn run(&mut self) -> Result<Vec<DpSgdStep>, TrainError> {
        let mut out = Vec::new();
        while self.step < self.config.total_steps {
            out.push(self.step()?);
        }
        Ok(out)
    }

    /// Steps taken.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// ε (at the configured δ) spent by the steps taken so far
    /// ([`dp_sgd_epsilon`] for the steps taken).
    pub fn epsilon(&self) -> Result<DpSgdEpsilon, TrainError> {
        let c = &self.config;
        dp_sgd_epsilon(
            c.sampling_rate,
            c.noise_multiplier,
            self.step as u64,
            c.delta,
        )
    }

    /// The current parameters.
    pub fn params(&self) -> &LoraParams {
        &self.params
    }

    /// The current adapter on backend `C`.
    pub fn adapter<C: burn::tensor::backend::Backend<Device = B::Device>>(
        &self,
    ) -> Result<LoraAdapter<C>, TrainError> {
        self.params.to_adapter(&self.base, &self.device)
    }
}
