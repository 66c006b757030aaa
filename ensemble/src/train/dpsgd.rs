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

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use privmix_models::{LanguageModel, ModelBackend};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde_json::Value;

use super::adamw::AdamWConfig;
use super::checkpoint::State;
use super::error::TrainError;
use super::host::{Group, HostTrainable};
use super::loss::check_blocks;
use super::privacy::{DpSgdEpsilon, DpSgdNoise, clip_to_norm, dp_sgd_epsilon, poisson_sample};
use super::trainable::{Dropout, block_losses_and_gradients};
use super::trainer::{GradientRule, LoraTrainer, Schedule, Start};

/// Examples per batched pass of the host step (bounds its memory: the
/// logits alone take `examples × seq × vocab` floats).
const HOST_EXAMPLES: usize = 8;

/// Examples per batched pass of burn autodiff (each with its own copy of
/// the factors; bounds the pass's memory).
const AUTODIFF_EXAMPLES: usize = 16;

use crate::lora::{LoraBase, LoraConfig};

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

/// The DP-SGD gradient rule (see [`DpSgdTrainer`] for what it does and its
/// guarantee): the configuration and the generator of the Poisson sampling
/// and the noise ([`DpSgdConfig::noise`]), which no checkpoint ever holds.
pub struct DpSgd {
    pub(crate) config: DpSgdConfig,
    /// Poisson sampling and noise ([`DpSgdConfig::noise`]).
    pub(crate) private_rng: ChaCha20Rng,
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
/// or removing one block, for the ε of [`LoraTrainer::epsilon`]
/// (Poisson-subsampled Gaussian RDP composed over the steps taken). For
/// user-level DP give each user one block (`UserUnit::Block` users cut to
/// one block each), or group-privacy-scale ε. The guarantee needs
/// [`NoiseSource::Os`] (see the module docs). The coins are floating-point safe
/// (exact Bernoulli sampling, the exact discrete Gaussian; proof in
/// `train/privacy.md`), so Mironov's attack ("On Significance of the Least
/// Significant Bits for Differential Privacy", CCS 2012) finds no artefact of
/// the data in the noise's low bits.
pub type DpSgdTrainer<'m, B, M> = LoraTrainer<'m, B, M, DpSgd>;

impl GradientRule for DpSgd {
    type Step = DpSgdStep;
    const WHAT: &'static str = "DP-SGD";

    fn schedule(&self) -> Schedule {
        let c = &self.config;
        Schedule {
            learning_rate: c.learning_rate,
            warmup_steps: c.warmup_steps,
            total_steps: c.total_steps,
        }
    }

    fn fingerprint(&self) -> Value {
        self.config.fingerprint()
    }

    /// One DP-SGD step (an empty Poisson draw still releases noise and counts).
    fn take_step<'m, B, M>(t: &mut LoraTrainer<'m, B, M, Self>) -> Result<DpSgdStep, TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        let c = t.rule.config.clone();
        let picked = poisson_sample(t.train.len(), c.sampling_rate, &mut t.rule.private_rng)?;
        // The clipped gradients rounded to the noise's grid and summed as integers
        // (exactly); the noise's sensitivity includes the rounding (`privacy.md`).
        let noise = DpSgdNoise::new(c.clip_norm, c.noise_multiplier, t.params.len())?;
        let mut sum = vec![0i64; t.params.len()];
        let (mut clipped, mut loss) = (0, 0.0);
        for (l, mut g) in t.per_example(&picked)? {
            if clip_to_norm(&mut g, c.clip_norm)? > c.clip_norm {
                clipped += 1;
            }
            loss += l;
            noise.accumulate(&mut sum, &noise.to_grid(&g)?)?;
        }
        let expected = c.sampling_rate * t.train.len() as f64;
        let sum = noise.release(&sum, expected, &mut t.rule.private_rng)?;
        t.update(&sum)?;
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

    fn after_step<'m, B, M>(
        _: &mut LoraTrainer<'m, B, M, Self>,
        _: &DpSgdStep,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        Ok(())
    }

    fn stopped(&self) -> bool {
        false
    }

    fn message(&self, s: &DpSgdStep) -> String {
        format!("batch {} loss {:.4}", s.batch, s.mean_loss)
    }

    /// Nothing beyond the shared state: neither the generator (see
    /// `dpsgd_checkpoint.rs`) nor any loss (not privatised).
    fn save<'m, B, M>(
        _: &LoraTrainer<'m, B, M, Self>,
        _: &Path,
        _: &mut State,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        Ok(())
    }

    /// Fresh coins for the remaining steps (see `dpsgd_checkpoint.rs`).
    fn restore<'m, B, M>(
        t: &mut LoraTrainer<'m, B, M, Self>,
        _: &Path,
        state: State,
        _: &Path,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        t.rule.private_rng = resumed_coins(t.rule.config.noise, state.step)?;
        Ok(())
    }
}

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    DpSgdTrainer<'m, B, M>
{
    /// A fresh run (PEFT initialisation from [`DpSgdConfig::seed`], sampling
    /// and noise from [`DpSgdConfig::noise`]).
    pub fn new(model: &'m M, data: Vec<Vec<u32>>, config: DpSgdConfig) -> Result<Self, TrainError> {
        config.validate()?;
        check_blocks(&data)?;
        let start = Start::new(model, &config.lora, config.adamw, config.seed)?;
        let private_rng = config.noise.rng()?;
        let rule = DpSgd {
            config,
            private_rng,
        };
        Ok(Self::from_start(model, data, start, rule))
    }

    /// A trainer restored from the checkpoint `dir/latest` names, for the same
    /// model, data and configuration (another configuration is a
    /// [`TrainError::Checkpoint`]), with fresh sampling and noise coins (see
    /// the module doc of `dpsgd_checkpoint.rs`). Reads the checkpoints of
    /// this version and those DP-SGD runs wrote before (`dpsgd.json`).
    pub fn resume(
        model: &'m M,
        data: Vec<Vec<u32>>,
        config: DpSgdConfig,
        dir: impl AsRef<Path>,
    ) -> Result<Self, TrainError> {
        Self::new(model, data, config)?.restore_from(dir.as_ref())
    }

    /// The configuration.
    pub fn config(&self) -> &DpSgdConfig {
        &self.rule.config
    }

    /// Each picked example's mean loss and gradient, in order. Example `i`'s
    /// dropout pass is `(step, i)`: a function of the step and of the example's own
    /// index, never of its position in the draw (which would make every later
    /// example's mask, and so its gradient, depend on whether an earlier one was
    /// drawn, beyond the one example the sensitivity allows for).
    fn per_example(&self, picked: &[usize]) -> Result<Vec<(f64, Vec<f32>)>, TrainError> {
        let c = &self.rule.config;
        let dropout = |k: usize| Dropout {
            p: c.lora.lora_dropout,
            seed: c.seed,
            pass: (self.step as u64) << 32 | k as u64,
        };
        if let Some(host) = self.host.get::<B, M>(self.model)? {
            let mut out = Vec::with_capacity(picked.len());
            for ids in picked.chunks(HOST_EXAMPLES) {
                let blocks: Vec<&Vec<u32>> = ids.iter().map(|&i| &self.train[i]).collect();
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
            let blocks: Vec<&Vec<u32>> = ids.iter().map(|&i| &self.train[i]).collect();
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

    /// Runs the remaining steps (with the progress bar and checkpoints when
    /// set); returns every step's record.
    pub fn run(&mut self) -> Result<Vec<DpSgdStep>, TrainError> {
        self.run_steps(usize::MAX)
    }

    /// As `run` but stops after step `until` (≤ `total_steps`), as
    /// an interrupted run would; the schedule and the accounting still follow
    /// `total_steps`.
    pub fn run_until(&mut self, until: usize) -> Result<Vec<DpSgdStep>, TrainError> {
        self.run_steps(until)
    }

    /// ε (at the configured δ) spent by the steps taken so far
    /// ([`dp_sgd_epsilon`] for the steps taken).
    pub fn epsilon(&self) -> Result<DpSgdEpsilon, TrainError> {
        let c = &self.rule.config;
        dp_sgd_epsilon(
            c.sampling_rate,
            c.noise_multiplier,
            self.step as u64,
            c.delta,
        )
    }
}

/// The sampling and noise generator of a run resumed at step `step`: the
/// operating system's again for [`NoiseSource::Os`], stream `step` of the
/// seeded generator for [`NoiseSource::Seeded`].
fn resumed_coins(noise: NoiseSource, step: usize) -> Result<ChaCha20Rng, TrainError> {
    match noise {
        NoiseSource::Os => noise.rng(),
        NoiseSource::Seeded(seed) => {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            rng.set_stream(step as u64);
            Ok(rng)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::backend::{Autodiff, Flex};
    use privmix_models::{LoadOptions, Model};

    use super::*;
    use crate::train::{AdamW, LoraParams, StepPath, linear_schedule};

    type AB = Autodiff<Flex>;

    /// The seeded DP-SGD trajectory is the rule written out step by step
    /// from its parts, bit for bit: the adapter initialised from `seed`;
    /// each step a Poisson draw and then the noise from one seeded stream,
    /// each drawn example's gradient (dropout pass `(step, example)`)
    /// clipped, put on the noise's grid and summed, the noise released on
    /// the sum over the expected batch, one AdamW update on the schedule.
    #[test]
    fn the_trajectory_is_the_rule_step_by_step() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/llama");
        let model: Model<AB> = Model::load(LoadOptions::path(dir, &Default::default())).unwrap();
        let mut lora = LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]).unwrap();
        lora.lora_dropout = 0.1;
        let c = DpSgdConfig {
            lora,
            learning_rate: 1e-2,
            warmup_steps: 1,
            total_steps: 3,
            sampling_rate: 0.5,
            clip_norm: 0.5,
            noise_multiplier: 1.0,
            delta: 1e-5,
            adamw: AdamWConfig::default(),
            seed: 4,
            noise: NoiseSource::Seeded(9),
        };
        let data: Vec<Vec<u32>> = (0..6u32)
            .map(|k| (0..8u32).map(|i| 10 + (k * 7 + i * 5) % 64).collect())
            .collect();
        let mut trainer = DpSgdTrainer::<AB, _>::new(&model, data.clone(), c.clone())
            .unwrap()
            .with_step_path(StepPath::Autodiff);
        trainer.run().unwrap();

        let base = model.base_shapes().unwrap();
        let mut params =
            LoraParams::init(&c.lora, &base, &mut ChaCha20Rng::seed_from_u64(c.seed)).unwrap();
        let mut opt = AdamW::new(c.adamw, params.len()).unwrap();
        let mut coins = ChaCha20Rng::seed_from_u64(9);
        let noise = DpSgdNoise::new(c.clip_norm, c.noise_multiplier, params.len()).unwrap();
        for step in 0..c.total_steps {
            let picked = poisson_sample(data.len(), c.sampling_rate, &mut coins).unwrap();
            let blocks: Vec<&Vec<u32>> = picked.iter().map(|&i| &data[i]).collect();
            let passes: Vec<Dropout> = picked
                .iter()
                .map(|&i| Dropout {
                    p: 0.1,
                    seed: c.seed,
                    pass: (step as u64) << 32 | i as u64,
                })
                .collect();
            let grads = if picked.is_empty() {
                Vec::new()
            } else {
                block_losses_and_gradients(&model, &params, &blocks, &passes, &Default::default())
                    .unwrap()
            };
            let mut sum = vec![0i64; params.len()];
            for (_, mut g) in grads {
                clip_to_norm(&mut g, c.clip_norm).unwrap();
                noise
                    .accumulate(&mut sum, &noise.to_grid(&g).unwrap())
                    .unwrap();
            }
            let expected = c.sampling_rate * data.len() as f64;
            let released = noise.release(&sum, expected, &mut coins).unwrap();
            let lr = linear_schedule(c.learning_rate, step, c.warmup_steps, c.total_steps);
            opt.step(params.values_mut(), &released, lr).unwrap();
        }
        assert_eq!(trainer.params().values(), params.values());
        assert_eq!(trainer.opt, opt);
    }
}
