//! Fine-tuning the members (LoRA) and the DP-SGD baseline, cached on disk.
//!
//! A cached adapter is reused only when the hash of everything that decides its
//! weights — the base model file's name and size, the member's training blocks,
//! the training plan and the seed — names its folder; anything else retrains.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use indicatif::{ProgressBar, ProgressStyle};
use privmix_ensemble::lora::{LoraAdapter, LoraBase, LoraConfig};
use privmix_ensemble::train::{
    DpSgdConfig, DpSgdTrainer, NoiseSource, TrainConfig, Trainer, dp_sgd_epsilon, dp_sgd_sigma,
};
use privmix_models::Model;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::config::ExperimentConfig;
pub use super::config::TrainingPlan;
use super::data::ExperimentData;
use crate::error::BenchError;

type Train = Autodiff<Flex>;

/// The fine-tuned adapters.
pub struct TrainedMembers {
    /// Member adapters, in member order.
    pub members: Vec<LoraAdapter<Flex>>,
    /// Held-out loss of each member before and after fine-tuning.
    pub losses: Vec<(f64, f64)>,
    /// `(target ε, adapter, ε as accounted)` of each DP-SGD model.
    pub dp_sgd: Vec<(f64, LoraAdapter<Flex>, f64)>,
    /// True when every adapter came from the cache.
    pub cached: bool,
}

fn lora_config(plan: &TrainingPlan) -> Result<LoraConfig, BenchError> {
    let targets: Vec<&str> = plan.targets.iter().map(String::as_str).collect();
    Ok(LoraConfig::new(plan.rank, plan.alpha, &targets)?)
}

/// A short hex digest of `value`'s JSON.
fn digest(value: &serde_json::Value) -> String {
    let hash = Sha256::digest(value.to_string().as_bytes());
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The base model's name and the size of its file — or, for an HF folder, of
/// every file in it — for the cache key.
fn model_identity(path: &Path) -> serde_json::Value {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let sizes: Vec<(String, u64)> = match std::fs::read_dir(path) {
        Ok(entries) => {
            let mut v: Vec<(String, u64)> = entries
                .flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        size(&e.path()),
                    )
                })
                .collect();
            v.sort();
            v
        }
        Err(_) => vec![(String::new(), size(path))],
    };
    json!({ "name": path.file_name().map(|n| n.to_string_lossy().into_owned()), "sizes": sizes })
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

/// Fine-tunes (or loads from the cache) every member and DP-SGD model.
pub fn train_members(
    config: &ExperimentConfig,
    data: &ExperimentData,
    progress: bool,
) -> Result<TrainedMembers, BenchError> {
    let device = Default::default();
    let model = Model::<Train>::load(&config.model, &device)?;
    let base = model.base_shapes()?;
    let plan = &config.training;
    let lora = lora_config(plan)?;
    let held: Vec<Vec<u32>> = data.eval.iter().take(4).cloned().collect();
    let mut members = Vec::new();
    let mut losses = Vec::new();
    let mut cached = true;
    for (i, blocks) in data.members.iter().enumerate() {
        let key = json!({
            "model": model_identity(&config.model),
            "blocks": digest(&json!(blocks)),
            "plan": plan,
            "seed": config.seed + i as u64,
        });
        let dir = config
            .cache_dir
            .join(format!("member-{i}-{}", digest(&key)));
        let cached_member = load_cached(&dir, &base)?.and_then(|(adapter, meta)| {
            let loss: (f64, f64) = serde_json::from_value(meta).ok()?;
            Some((adapter, loss))
        });
        let (adapter, loss) = match cached_member {
            Some(found) => found,
            None => {
                cached = false;
                let mut train_config =
                    TrainConfig::new(lora.clone(), plan.steps, config.seed + i as u64);
                train_config.batch_size = plan.batch.min(blocks.len());
                train_config.learning_rate = plan.learning_rate;
                let mut trainer =
                    Trainer::<Train, _>::new(&model, blocks.clone(), held.clone(), train_config)?;
                let before = trainer.evaluate()?.unwrap_or(f64::NAN);
                let pb = bar(
                    plan.steps as u64,
                    &format!("fine-tune member {i}"),
                    progress,
                );
                for _ in 0..plan.steps {
                    trainer.step()?;
                    pb.inc(1);
                }
                pb.finish_and_clear();
                let after = trainer.evaluate()?.unwrap_or(f64::NAN);
                let adapter = trainer.adapter::<Flex>()?;
                save_cached(&dir, &adapter, json!([before, after]))?;
                (adapter, (before, after))
            }
        };
        members.push(adapter);
        losses.push(loss);
    }

    let mut dp_sgd = Vec::new();
    if config.dp_sgd_steps > 0 {
        let all: Vec<Vec<u32>> = data.members.iter().flatten().cloned().collect();
        let q = (config.dp_sgd_batch as f64 / all.len() as f64).min(1.0);
        for &target in &config.epsilons {
            let sigma = dp_sgd_sigma(target, config.delta, config.dp_sgd_steps as u64, q)?;
            let dp_config = DpSgdConfig {
                lora: lora.clone(),
                learning_rate: plan.learning_rate,
                warmup_steps: 0,
                total_steps: config.dp_sgd_steps,
                sampling_rate: q,
                clip_norm: 1.0,
                noise_multiplier: sigma,
                delta: config.delta,
                adamw: Default::default(),
                seed: config.seed + 1000,
                // An experiment: seeded noise and sampling make the run reproducible
                // (and its cached adapter reusable), and give it NO privacy. The ε
                // reported beside it is what the same run costs with OS noise.
                noise: NoiseSource::Seeded(config.seed + 1000),
            };
            let key = json!({
                "model": model_identity(&config.model),
                "blocks": digest(&json!(all)),
                "dp": format!("{dp_config:?}"),
            });
            let dir = config
                .cache_dir
                .join(format!("dp-sgd-{target}-{}", digest(&key)));
            let adapter = match load_cached(&dir, &base)? {
                Some((adapter, _)) => adapter,
                None => {
                    cached = false;
                    let mut trainer =
                        DpSgdTrainer::<Train, _>::new(&model, all.clone(), dp_config)?;
                    let pb = bar(
                        config.dp_sgd_steps as u64,
                        &format!("DP-SGD at ε = {target}"),
                        progress,
                    );
                    for _ in 0..config.dp_sgd_steps {
                        trainer.step()?;
                        pb.inc(1);
                    }
                    pb.finish_and_clear();
                    let adapter = trainer.adapter::<Flex>()?;
                    save_cached(&dir, &adapter, json!({ "sigma": sigma, "q": q }))?;
                    adapter
                }
            };
            // The accountant's ε for the steps the plan runs (whether trained now or
            // loaded: the cache key holds σ, q and the step count).
            let spent = dp_sgd_epsilon(q, sigma, config.dp_sgd_steps as u64, config.delta)?;
            dp_sgd.push((target, adapter, spent.epsilon));
        }
    }
    Ok(TrainedMembers {
        members,
        losses,
        dp_sgd,
        cached,
    })
}

/// Written last into a cached adapter's folder: a folder without it is an
/// interrupted save, and is redone.
const META_FILE: &str = "privmix_meta.json";

fn load_cached(
    dir: &Path,
    base: &privmix_ensemble::lora::BaseShapes,
) -> Result<Option<(LoraAdapter<Flex>, serde_json::Value)>, BenchError> {
    let meta: PathBuf = dir.join(META_FILE);
    if !meta.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&meta).map_err(|e| BenchError::io(&meta, e))?;
    let value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Config(format!("{}: {e}", meta.display())))?;
    let adapter = LoraAdapter::load_peft(dir, base, &Default::default())?;
    Ok(Some((adapter, value)))
}

fn save_cached(
    dir: &Path,
    adapter: &LoraAdapter<Flex>,
    meta: serde_json::Value,
) -> Result<(), BenchError> {
    adapter.save_peft(dir)?;
    let path = dir.join(META_FILE);
    std::fs::write(&path, meta.to_string()).map_err(|e| BenchError::io(&path, e))
}
