//! Fine-tuning the members (LoRA) and the DP-SGD baseline, cached on disk.
//!
//! A cached adapter is reused only when its key ([`crate::cache_key`]: the
//! declared results version, the training plan and seed as canonical JSON, the
//! SHA-256 of the base model and of the training blocks) names its folder;
//! anything else retrains. The commit that trained it is recorded in the
//! folder's metadata as provenance, outside the key.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::backend::Autodiff;
use indicatif::{ProgressBar, ProgressStyle};
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_ensemble::train::{
    DpSgdConfig, DpSgdTrainer, NoiseSource, TrainConfig, Trainer, dp_sgd_epsilon, dp_sgd_sigma,
};
use privmix_models::{LoadOptions, Model};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::adapters::{
    Adapter, cached_validation, cached_validation_losses, load_cached, validation_cached,
    validation_losses,
};
use super::config::ExperimentConfig;
pub use super::config::TrainingPlan;
use super::data::ExperimentData;
use crate::Backend;
use crate::cache_key::{CacheKey, data_sha256, path_sha256};
use crate::error::BenchError;

type Train = Autodiff<Backend>;

/// One DP-SGD model: a point of the sweep or a row of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpSgdRun {
    /// Target ε its noise was calibrated to.
    pub target_epsilon: f64,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Passes over the training records.
    pub epochs: f64,
    /// Optimizer steps.
    pub steps: usize,
    /// Poisson sampling rate.
    pub q: f64,
    /// Noise multiplier σ from the accountant for `steps` at `q`.
    pub sigma: f64,
    /// ε the accountant reports for the run, rounded up.
    pub epsilon: f64,
    /// Which accountant gave ε: the RDP of the Poisson-subsampled discrete Gaussian
    /// noise (older caches: the smaller of PLD and RDP).
    pub accountant: String,
    /// ε of the same steps, σ and q by the PLD accountant (of the continuous
    /// Gaussian; None: not computed).
    #[serde(default)]
    pub epsilon_pld: Option<f64>,
    /// Mean loss on the validation blocks (nats per token).
    pub validation_loss: f64,
    /// Whether the sweep chose this learning rate and epoch count.
    pub chosen: bool,
}

/// The fine-tuned adapters.
pub struct TrainedMembers {
    /// Member adapters, in member order.
    pub members: Vec<Adapter>,
    /// Optimizer steps of each member.
    pub member_steps: Vec<usize>,
    /// Validation loss of the public model and of each member (nats per token).
    pub validation: (f64, Vec<f64>),
    /// Whether `validation` came from the results cache (an earlier run's, or
    /// the learning-rate trial's of this run).
    pub validation_cached: bool,
    /// The non-private model fine-tuned on every training record (when asked).
    pub fine_tuned: Option<Adapter>,
    /// `(run, adapter)` of each DP-SGD model of the table, one per target ε.
    pub dp_sgd: Vec<(DpSgdRun, Adapter)>,
    /// Every point of the DP-SGD sweep (at the largest target ε).
    pub dp_sgd_sweep: Vec<DpSgdRun>,
    /// The cache key digest of each adapter, in the runner's order (members,
    /// DP-SGD models of the table, the fine-tuned model): what a scored part
    /// computed with them is keyed on (`scored_cache.rs`).
    pub adapter_keys: Vec<String>,
    /// True when every adapter came from the cache.
    pub cached: bool,
    /// The members' part of `reused_seconds`.
    pub members_reused_seconds: f64,
    /// Seconds the adapters loaded from the cache took to train, as measured
    /// when they were trained (0 for those cached before that was recorded).
    pub reused_seconds: f64,
}

fn lora_config(plan: &TrainingPlan) -> Result<LoraConfig, BenchError> {
    let targets: Vec<&str> = plan.targets.iter().map(String::as_str).collect();
    Ok(LoraConfig::new(plan.rank, plan.alpha, &targets)?)
}

fn bar(len: u64, what: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:28} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Steps of `epochs` passes over `blocks` blocks in batches of `batch`.
fn steps_for(epochs: f64, blocks: usize, batch: usize) -> usize {
    ((epochs * blocks as f64 / batch.max(1) as f64).ceil() as usize).max(1)
}

/// Fine-tunes (or loads from the cache) every member and DP-SGD model.
pub fn train_members(
    config: &ExperimentConfig,
    data: &ExperimentData,
    progress: bool,
) -> Result<TrainedMembers, BenchError> {
    let device = Default::default();
    let model = Rc::new(Model::<Train>::load(LoadOptions::path(
        &config.model,
        &device,
    ))?);
    let base = model.base_shapes()?;
    let plan = &config.training;
    let lora = lora_config(plan)?;
    let mut members = Vec::new();
    let mut member_steps = Vec::new();
    let mut adapter_keys = Vec::new();
    let mut cached = true;
    let mut reused_seconds = 0.0;
    let model_sha256 = vec![path_sha256(&config.model)?];
    for (i, blocks) in data.members.iter().enumerate() {
        let (key, dir, steps) = member_key(config, i, blocks, &model_sha256)?;
        let train = member_training(
            config,
            &model,
            &lora,
            training_seed(config) + i as u64,
            format!("fine-tune member {i}"),
            blocks.clone(),
            progress,
        );
        let (adapter, reused) =
            Adapter::cached_or_pending(&dir, &base, json!({ "steps": steps, "key": key }), train)?;
        match reused {
            Some(seconds) => reused_seconds += seconds,
            None => cached = false,
        }
        members.push(adapter);
        member_steps.push(steps);
        adapter_keys.push(key.digest());
    }
    let members_reused_seconds = reused_seconds;
    let validation_cached = validation_cached(config, &adapter_keys, &data.validation)?;
    let validation = cached_validation_losses(config, &members, &adapter_keys, &data.validation)?;
    let fine_tuned = if config.fine_tuned {
        let all = data.all_records();
        let seed = training_seed(config) + FINE_TUNED_SEED;
        let key = CacheKey::new(
            "fine-tuned",
            &json!({ "plan": plan, "seed": seed }),
            model_sha256.clone(),
            data_sha256(&all)?,
        )?;
        let dir = config
            .cache_dir
            .join(format!("fine-tuned-{}", key.digest()));
        let digest = key.digest();
        let train = member_training(
            config,
            &model,
            &lora,
            seed,
            "fine-tune on all".into(),
            all,
            progress,
        );
        let (adapter, reused) =
            Adapter::cached_or_pending(&dir, &base, json!({ "key": key }), train)?;
        match reused {
            Some(seconds) => reused_seconds += seconds,
            None => cached = false,
        }
        Some((adapter, digest))
    } else {
        None
    };

    let mut dp_sgd = Vec::new();
    let mut dp_sgd_sweep = Vec::new();
    if let Some(dp) = &config.dp_sgd {
        let all = Rc::new(data.all_records());
        let q = (dp.batch as f64 / all.len() as f64).min(1.0);
        let sweep_target = config.largest_epsilon();
        let trainer = DpTraining {
            config,
            model: &model,
            base: &base,
            lora: &lora,
            records: &all,
            q,
            clip: dp.clip,
            progress,
        };
        let mut sweep_adapters = Vec::new();
        let mut sweep_keys = Vec::new();
        for &lr in &dp.learning_rates {
            for &epochs in &dp.epochs {
                let (run, adapter, reused, digest) = trainer.train(sweep_target, lr, epochs)?;
                cached &= reused.is_some();
                reused_seconds += reused.unwrap_or(0.0);
                dp_sgd_sweep.push(run);
                sweep_adapters.push(adapter);
                sweep_keys.push(digest);
            }
        }
        let (_, losses) =
            cached_validation_losses(config, &sweep_adapters, &sweep_keys, &data.validation)?;
        for (run, loss) in dp_sgd_sweep.iter_mut().zip(&losses) {
            run.validation_loss = *loss;
        }
        let best = losses
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .ok_or_else(|| BenchError::Config("an empty DP-SGD sweep".into()))?;
        dp_sgd_sweep[best].chosen = true;
        let chosen = dp_sgd_sweep[best].clone();
        for &target in &config.epsilons {
            if target == sweep_target {
                dp_sgd.push((chosen.clone(), sweep_adapters[best].clone()));
                adapter_keys.push(sweep_keys[best].clone());
                continue;
            }
            let (run, adapter, reused, digest) =
                trainer.train(target, chosen.learning_rate, chosen.epochs)?;
            cached &= reused.is_some();
            reused_seconds += reused.unwrap_or(0.0);
            dp_sgd.push((run, adapter));
            adapter_keys.push(digest);
        }
        let adapters: Vec<_> = dp_sgd.iter().map(|(_, a)| a.clone()).collect();
        let keys = &adapter_keys[adapter_keys.len() - adapters.len()..];
        let (_, losses) = cached_validation_losses(config, &adapters, keys, &data.validation)?;
        for ((run, _), loss) in dp_sgd.iter_mut().zip(losses) {
            run.validation_loss = loss;
            run.chosen = true;
        }
    }
    let fine_tuned = fine_tuned.map(|(adapter, digest)| {
        adapter_keys.push(digest);
        adapter
    });
    Ok(TrainedMembers {
        members,
        member_steps,
        validation,
        validation_cached,
        fine_tuned,
        dp_sgd,
        dp_sgd_sweep,
        adapter_keys,
        cached,
        members_reused_seconds,
        reused_seconds,
    })
}

/// The cache key of member `i` (training `blocks`), its folder and its steps.
fn member_key(
    config: &ExperimentConfig,
    i: usize,
    blocks: &[Vec<u32>],
    model_sha256: &[String],
) -> Result<(CacheKey, PathBuf, usize), BenchError> {
    let plan = &config.training;
    let steps = steps_for(plan.epochs, blocks.len(), plan.batch.min(blocks.len()));
    let key = CacheKey::new(
        "member",
        &json!({ "plan": plan, "seed": training_seed(config) + i as u64 }),
        model_sha256.to_vec(),
        data_sha256(&blocks)?,
    )?;
    let dir = config
        .cache_dir
        .join(format!("member-{i}-{}", key.digest()));
    Ok((key, dir, steps))
}

/// The seed training starts from: the run's, moved by the seed row's offset
/// (so that each seed row's members and DP-SGD models are trained apart).
fn training_seed(config: &ExperimentConfig) -> u64 {
    config.seed.wrapping_add(config.training_seed_offset)
}

/// Added to the run's seed for the non-private model fine-tuned on all records.
const FINE_TUNED_SEED: u64 = 2000;

/// Fine-tunes a LoRA with the members' plan on `blocks`, seeded by `seed`.
fn train_member(
    config: &ExperimentConfig,
    model: &Model<Train>,
    lora: &LoraConfig,
    seed: u64,
    label: &str,
    blocks: &[Vec<u32>],
    progress: bool,
) -> Result<LoraAdapter<Backend>, BenchError> {
    let plan = &config.training;
    let batch = plan.batch.min(blocks.len());
    let steps = steps_for(plan.epochs, blocks.len(), batch);
    let mut train_config = TrainConfig::new(lora.clone(), steps, seed);
    train_config.batch_size = batch;
    train_config.learning_rate = plan.learning_rate;
    let mut trainer = Trainer::<Train, _>::new(model, blocks.to_vec(), Vec::new(), train_config)?;
    let pb = bar(steps as u64, label, progress);
    for _ in 0..steps {
        trainer.step()?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(trainer.adapter::<Backend>()?)
}

/// What trains one member's adapter when a part first needs it
/// ([`train_member`] on what it is given).
fn member_training(
    config: &ExperimentConfig,
    model: &Rc<Model<Train>>,
    lora: &LoraConfig,
    seed: u64,
    label: String,
    blocks: Vec<Vec<u32>>,
    progress: bool,
) -> super::adapters::TrainFn {
    let (config, model, lora) = (config.clone(), Rc::clone(model), lora.clone());
    Box::new(move || train_member(&config, &model, &lora, seed, &label, &blocks, progress))
}

pub use super::adapters::VERIFY_TOLERANCE;

/// `--verify-cache` for the adapters: trains member 0 afresh (its seed and
/// data are the run's) and compares it with its cached adapter, byte for byte
/// and by validation loss. Returns what it found; an error when the adapter
/// is not cached, or when the two differ by more than [`VERIFY_TOLERANCE`] of
/// the loss (a cache entry that its key no longer describes: bump
/// [`crate::cache_key::RESULTS_VERSION`]).
pub fn verify_member_cache(
    config: &ExperimentConfig,
    data: &ExperimentData,
    progress: bool,
) -> Result<String, BenchError> {
    let blocks = data
        .members
        .first()
        .ok_or_else(|| BenchError::Config("no member to verify".into()))?;
    let model = Model::<Train>::load(LoadOptions::path(&config.model, &Default::default()))?;
    let base = model.base_shapes()?;
    let lora = lora_config(&config.training)?;
    let model_sha256 = [path_sha256(&config.model)?];
    let (_, dir, _) = member_key(config, 0, blocks, &model_sha256)?;
    let fresh = || {
        train_member(
            config,
            &model,
            &lora,
            training_seed(config),
            "verify member 0",
            blocks,
            progress,
        )
    };
    let Some((cached, meta)) = load_cached(&dir, &base)? else {
        // A machine without the adapter: member 0 retrained, checked against
        // its validation loss in the results cache.
        let keys = data
            .members
            .iter()
            .enumerate()
            .map(|(i, b)| Ok(member_key(config, i, b, &model_sha256)?.0.digest()))
            .collect::<Result<Vec<_>, BenchError>>()?;
        let Some((_, entry)) = cached_validation(config, &keys, &data.validation)? else {
            return Err(BenchError::Config(format!(
                "--verify-cache: member 0 is neither in the adapter cache ({}) nor are its \
                 validation losses in the results cache",
                dir.display()
            )));
        };
        let (_, losses) = validation_losses(&config.model, &[fresh()?], &data.validation)?;
        return compare_losses(
            "not in the adapter cache; validation loss".into(),
            entry[0],
            losses[0],
            false,
        );
    };
    let fresh = fresh()?;
    let scratch = config.cache_dir.join("verify-member-0.partial");
    let _ = std::fs::remove_dir_all(&scratch);
    fresh.save_peft(&scratch)?;
    let same_bytes = same_files(&dir, &scratch)?;
    let _ = std::fs::remove_dir_all(&scratch);
    let (_, losses) = validation_losses(&config.model, &[cached, fresh], &data.validation)?;
    let made_by = meta["commit"].as_str().unwrap_or("an unrecorded commit");
    let what = format!(
        "{} its cached adapter (made by {made_by}); validation loss",
        if same_bytes {
            "byte for byte equal to"
        } else {
            "not byte for byte equal to"
        },
    );
    compare_losses(what, losses[0], losses[1], same_bytes)
}

/// Member 0 retrained, `what` it was compared with: its validation loss
/// `cached` (the cache's, or its cached adapter's) against `fresh`; an error
/// when they differ by more than [`VERIFY_TOLERANCE`] of the loss and the
/// adapters are not `same_bytes` (a cache entry that its key no longer
/// describes).
fn compare_losses(
    what: String,
    cached: f64,
    fresh: f64,
    same_bytes: bool,
) -> Result<String, BenchError> {
    let relative = super::adapters::relative_difference(cached, fresh);
    let found = format!("member 0 retrained: {what} {cached:.6} cached, {fresh:.6} recomputed");
    if !same_bytes && (relative.is_nan() || relative > VERIFY_TOLERANCE) {
        return Err(BenchError::Config(format!(
            "--verify-cache: {found}: the cache holds results its key no longer describes \
             (bump RESULTS_VERSION in bench/src/cache_key.rs)"
        )));
    }
    Ok(found)
}

/// Whether every file of `b` (an adapter folder) has the same bytes in `a`.
fn same_files(a: &Path, b: &Path) -> Result<bool, BenchError> {
    for entry in std::fs::read_dir(b).map_err(|e| BenchError::io(b, e))? {
        let entry = entry.map_err(|e| BenchError::io(b, e))?;
        let ours = std::fs::read(entry.path()).map_err(|e| BenchError::io(&entry.path(), e))?;
        let theirs = a.join(entry.file_name());
        match std::fs::read(&theirs) {
            Ok(bytes) if bytes == ours => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// What every DP-SGD model of a run shares.
struct DpTraining<'a> {
    config: &'a ExperimentConfig,
    model: &'a Rc<Model<Train>>,
    base: &'a privmix_ensemble::lora::BaseShapes,
    lora: &'a LoraConfig,
    records: &'a Rc<Vec<Vec<u32>>>,
    q: f64,
    clip: f64,
    progress: bool,
}

impl DpTraining<'_> {
    /// Trains (or loads) DP-SGD at `target` ε with `lr` for `epochs`; with the
    /// seconds a cached adapter took to train (None: trained now) and its
    /// cache key's digest.
    fn train(
        &self,
        target: f64,
        lr: f64,
        epochs: f64,
    ) -> Result<(DpSgdRun, Adapter, Option<f64>, String), BenchError> {
        let config = self.config;
        let steps = ((epochs / self.q).ceil() as usize).max(1);
        let sigma = dp_sgd_sigma(target, config.delta, steps as u64, self.q)?;
        let dp_noise_seed = training_seed(config) + 1000;
        let dp_config = DpSgdConfig {
            lora: self.lora.clone(),
            learning_rate: lr,
            warmup_steps: 0,
            total_steps: steps,
            sampling_rate: self.q,
            clip_norm: self.clip,
            noise_multiplier: sigma,
            delta: config.delta,
            adamw: Default::default(),
            seed: training_seed(config) + 1000,
            // An experiment: seeded noise and sampling make the run reproducible
            // (and its cached adapter reusable), and give it NO privacy. The ε
            // reported beside it is what the same run costs with OS noise.
            noise: NoiseSource::Seeded(dp_noise_seed),
        };
        let key = CacheKey::new(
            "dp-sgd",
            &json!({
                "plan": config.training,
                "learning_rate": dp_config.learning_rate,
                "warmup_steps": dp_config.warmup_steps,
                "total_steps": dp_config.total_steps,
                "sampling_rate": dp_config.sampling_rate,
                "clip_norm": dp_config.clip_norm,
                "noise_multiplier": dp_config.noise_multiplier,
                "delta": dp_config.delta,
                "adamw": dp_config.adamw,
                "seed": dp_config.seed,
                "noise_seed": dp_noise_seed,
            }),
            vec![path_sha256(&config.model)?],
            data_sha256(&**self.records)?,
        )?;
        let dir = config
            .cache_dir
            .join(format!("dp-sgd-{target}-{}", key.digest()));
        let digest = key.digest();
        let meta = json!({ "sigma": sigma, "q": self.q, "key": key });
        let (model, records, progress) = (
            Rc::clone(self.model),
            Rc::clone(self.records),
            self.progress,
        );
        let train: super::adapters::TrainFn = Box::new(move || {
            let mut trainer =
                DpSgdTrainer::<Train, _>::new(&*model, records.to_vec(), dp_config.clone())?;
            let pb = bar(
                steps as u64,
                &format!("DP-SGD ε {target} lr {lr} ep {epochs}"),
                progress,
            );
            for _ in 0..steps {
                trainer.step()?;
                pb.inc(1);
            }
            pb.finish_and_clear();
            Ok(trainer.adapter::<Backend>()?)
        });
        let (adapter, reused) = Adapter::cached_or_pending(&dir, self.base, meta, train)?;
        // The accountant's ε for the steps the plan runs (whether trained now or
        // loaded: the cache key holds σ, q and the step count).
        let spent = dp_sgd_epsilon(self.q, sigma, steps as u64, config.delta)?;
        Ok((
            DpSgdRun {
                target_epsilon: target,
                learning_rate: lr,
                epochs,
                steps,
                q: self.q,
                sigma,
                epsilon: spent.epsilon,
                accountant: format!("{:?}", spent.accountant),
                epsilon_pld: privmix_accountant::pld::dp_sgd_epsilon(
                    sigma,
                    self.q,
                    steps as u64,
                    config.delta,
                )
                .ok(),
                validation_loss: f64::NAN,
                chosen: false,
            },
            adapter,
            reused,
            digest,
        ))
    }
}
