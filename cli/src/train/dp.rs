//! `--dp-sgd`: the training-time baseline of the PMixED and SubMix papers,
//! one LoRA adapter on all the data with DP-SGD ("Deep Learning with
//! Differential Privacy", arXiv 1607.00133): Poisson sampling at rate
//! q = batch / blocks (an exact Bernoulli(q) per block), per-example clipping
//! to C, the exact discrete Gaussian of parameter σ·Δ' on the clipped sum
//! rounded to a fine grid (Δ' = C plus the rounding; see
//! `privmix_ensemble::train::DpSgdNoise`), with σ the smallest the accountant
//! finds for the target ε at δ over the planned steps. Sampling and noise come from the operating system's
//! entropy, never from `--seed` (a known seed would make the noise computable).
//!
//! The unit of the guarantee is one training block (add/remove). The run is
//! checkpointed under `checkpoints/dp-sgd/` and a rerun continues it, the
//! remaining steps drawing fresh coins from the operating system (see
//! `privmix_ensemble::train::DpSgdTrainer::resume`: the accounting is that of
//! one run of the planned steps). The trainer, its checkpoints, progress and
//! output files go the members' road (`driver.rs`).

use burn::backend::Flex;
use privmix_ensemble::lora::LoraAdapter;
use privmix_ensemble::train::{
    AdamWConfig, DpSgdConfig, DpSgdTrainer, NoiseSource, dp_sgd_sigma, mean_nll,
};
use privmix_models::Model;
use privmix_models::runtime::to_vec;

use super::card::dp_sgd_card;
use super::driver::{
    fmt_loss, open, stopped, training_failed, write_adapter, write_card, write_manifest,
};
use super::manifest::{DpSgdRecord, RunKind, derive_seed};
use super::members::lora_config;
use super::prepared::{CHECKPOINTS, Prepared, TrainBackend, shard_blocks, split_holdout};
use crate::error::CliError;

/// δ when `--delta` is not given.
pub const DEFAULT_DELTA: f64 = 1e-5;
/// Clip norm C when `--clip-norm` is not given.
pub const DEFAULT_CLIP_NORM: f64 = 1.0;
/// The adapter's folder in `--out`.
const DP_DIR: &str = "dp-sgd";
/// What ε protects, for the manifest.
const UNIT: &str = "one training block (add/remove)";

/// Trains the DP-SGD adapter (from its checkpoint when there is one) and
/// writes it, its card and the manifest; returns `false` when `stop_at_step`
/// stopped it first (a checkpoint is left).
pub(crate) fn train(
    p: &Prepared,
    model: &Model<TrainBackend>,
    checkpoint_every: Option<usize>,
    stop_at_step: Option<usize>,
) -> Result<bool, CliError> {
    let c = &p.config;
    let Some(dp) = &c.dp_sgd else {
        return Err(CliError::arg("--dp-sgd", "no DP-SGD parameters were set"));
    };
    let fail = training_failed(DP_DIR);
    let mut users: Vec<String> = p.corpus.users().iter().map(|u| u.id.clone()).collect();
    users.sort();
    let shard = shard_blocks(p, &users, DP_DIR)?;
    let (train, held) = split_holdout(shard.blocks, c.holdout, derive_seed(c.seed, "holdout", 0));
    let n = train.len();
    let q = (c.batch_size as f64 / n as f64).min(1.0);
    let steps = c
        .steps
        .unwrap_or_else(|| (c.epochs / q).ceil() as usize)
        .max(1);
    let sigma = dp_sgd_sigma(dp.epsilon, dp.delta, steps as u64, q).map_err(&fail)?;
    let config = DpSgdConfig {
        lora: lora_config(p)?,
        learning_rate: c.learning_rate,
        warmup_steps: c.warmup_steps,
        total_steps: steps,
        sampling_rate: q,
        clip_norm: dp.clip_norm,
        noise_multiplier: sigma,
        delta: dp.delta,
        adamw: AdamWConfig {
            weight_decay: c.weight_decay,
            ..AdamWConfig::default()
        },
        seed: derive_seed(c.seed, "train", 0),
        noise: NoiseSource::Os,
    };
    eprintln!(
        "{DP_DIR}: {n} training blocks, q = {q}, {steps} steps, noise multiplier σ = {sigma:.4} for ε = {} at δ = {}",
        dp.epsilon, dp.delta
    );
    let checkpoints = p.out.join(CHECKPOINTS).join(DP_DIR);
    let every = checkpoint_every.unwrap_or(steps.div_ceil(10).max(1));
    let mut trainer = open(DP_DIR, &checkpoints, every, steps, |resume| match resume {
        Some(dir) => DpSgdTrainer::<TrainBackend, _>::resume(model, train, config, dir),
        None => DpSgdTrainer::<TrainBackend, _>::new(model, train, config),
    })?;
    trainer
        .run_until(stop_at_step.unwrap_or(steps))
        .map_err(&fail)?;
    if trainer.step_count() < steps {
        stopped(DP_DIR, trainer.step_count(), steps, &checkpoints);
        eprintln!("privmix: rerun the same command without --stop-at-step to continue");
        return Ok(false);
    }
    let spent = trainer.epsilon().map_err(&fail)?;

    // The held-out loss is for the provider: it reads the held-out data
    // outside DP-SGD's accounting, so it goes to the manifest, not the card.
    let held_out_loss = if held.is_empty() {
        None
    } else {
        let adapter: LoraAdapter<TrainBackend> = trainer.adapter().map_err(&fail)?;
        let take = held.len().min(c.eval_blocks);
        let mut total = 0.0;
        for chunk in held[..take].chunks(c.batch_size) {
            let refs: Vec<&Vec<u32>> = chunk.iter().collect();
            let l = mean_nll(model, &refs, Some(&adapter)).map_err(&fail)?;
            let v = to_vec(l).map_err(|e| fail(e.into()))?;
            total += f64::from(v[0]) * chunk.len() as f64;
        }
        Some(total / take as f64)
    };

    let adapter: LoraAdapter<Flex> = trainer.adapter().map_err(&fail)?;
    let (dir, adapter_sha256) = write_adapter(p, DP_DIR, &adapter)?;
    let record = DpSgdRecord {
        path: DP_DIR.into(),
        adapter_sha256,
        target_epsilon: dp.epsilon,
        epsilon: spent.epsilon,
        delta: dp.delta,
        unit: UNIT.into(),
        noise_multiplier: sigma,
        sampling_rate: q,
        clip_norm: dp.clip_norm,
        steps: trainer.step_count(),
        tokens: shard.tokens,
        train_blocks: n,
        held_out_blocks: held.len(),
        held_out_loss,
    };
    write_card(&dir, &dp_sgd_card(&record, c, &p.base))?;
    let path = write_manifest(p, RunKind::DpSgd, None, Vec::new(), Some(record))?;
    eprintln!(
        "{DP_DIR}: ε = {} at δ = {} (asked for ε = {}) after {steps} steps, per training block; held-out loss {}",
        spent.epsilon,
        dp.delta,
        dp.epsilon,
        fmt_loss(held_out_loss)
    );
    eprintln!("privmix: {} and {} written", dir.display(), path.display());
    Ok(true)
}
