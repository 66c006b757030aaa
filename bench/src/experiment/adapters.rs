//! The fine-tuned adapters of a run, read from the cache only when a part
//! that is not cached needs them, and their validation losses, cached like
//! the adapters (CBOR, every float kept bit for bit): a restart whose parts are all cached reads no adapter and
//! runs no forward.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use privmix_ensemble::lora::{BaseShapes, LoraAdapter};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{LoadOptions, Model};
use serde_json::json;

use super::config::ExperimentConfig;
use crate::Backend;
use crate::cache_key::{CacheKey, data_sha256, path_sha256, write_entry};
use crate::error::BenchError;

/// A fine-tuned adapter: trained by this run (in memory), or complete in the
/// cache and read from its folder when [`Adapter::load`] is called.
#[derive(Clone)]
pub enum Adapter {
    /// Trained by this run.
    Trained(LoraAdapter<Backend>),
    /// A complete cache entry (its metadata written) at `dir`, for a base
    /// model of `base`'s shapes.
    Cached {
        /// The entry's folder.
        dir: PathBuf,
        /// The shapes the adapter is checked against when read.
        base: BaseShapes,
    },
}

/// Adapters read from the cache by this process (what a test reads to check
/// that a run whose parts are all cached reads none).
static READ_FROM_CACHE: AtomicUsize = AtomicUsize::new(0);

/// How many adapters this process has read from the cache so far.
pub fn adapters_read() -> usize {
    READ_FROM_CACHE.load(Ordering::Relaxed)
}

impl Adapter {
    /// The adapter, read from its folder when cached.
    ///
    /// Errors: the cached files cannot be read or do not fit the base model.
    pub fn load(&self) -> Result<LoraAdapter<Backend>, BenchError> {
        match self {
            Self::Trained(a) => Ok(a.clone()),
            Self::Cached { dir, base } => {
                READ_FROM_CACHE.fetch_add(1, Ordering::Relaxed);
                Ok(LoraAdapter::load_peft(dir, base, &Default::default())?)
            }
        }
    }
}

/// Every adapter of `adapters`, read where cached.
pub fn load_all(adapters: &[Adapter]) -> Result<Vec<LoraAdapter<Backend>>, BenchError> {
    adapters.iter().map(Adapter::load).collect()
}

/// Mean validation loss of the public model (first) and of each adapter, from
/// one batched teacher-forced pass per block.
pub fn validation_losses(
    model_path: &Path,
    adapters: &[LoraAdapter<Backend>],
    blocks: &[Vec<u32>],
) -> Result<(f64, Vec<f64>), BenchError> {
    if blocks.is_empty() {
        return Err(BenchError::Config("no validation block".into()));
    }
    let model = Model::<Backend>::load(LoadOptions::path(model_path, &Default::default()))?;
    let runner = EnsembleRunner::new(model, adapters)?;
    let layout = RowLayout::public_and_members(adapters.len());
    let mut sums = vec![0.0f64; adapters.len() + 1];
    let mut count = 0usize;
    for block in blocks {
        let scores = runner.score_block(&layout, block)?;
        for (r, sum) in sums.iter_mut().enumerate() {
            *sum -= scores.row(r).iter().map(|&v| f64::from(v)).sum::<f64>();
        }
        count += scores.positions();
    }
    let mean: Vec<f64> = sums.iter().map(|s| s / count as f64).collect();
    Ok((mean[0], mean[1..].to_vec()))
}

/// [`validation_losses`] of the public model and of `adapters` (whose cache
/// keys are `keys`) on `blocks`, from the cache when an earlier run computed
/// them for the same adapters (keyed on the results version, the adapters'
/// keys, the base model's and the blocks' SHA-256); else computed (the
/// adapters read) and kept.
pub fn cached_validation_losses(
    config: &ExperimentConfig,
    adapters: &[Adapter],
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<(f64, Vec<f64>), BenchError> {
    let key = CacheKey::new(
        "validation",
        &json!({ "adapters": keys }),
        vec![path_sha256(&config.model)?],
        data_sha256(&blocks)?,
    )?;
    let path = config
        .cache_dir
        .join(format!("validation-{}.cbor", key.digest()));
    if path.is_file() {
        let file = std::fs::File::open(&path).map_err(|e| BenchError::io(&path, e))?;
        let losses: (f64, Vec<f64>) = ciborium::from_reader(std::io::BufReader::new(file))
            .map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))?;
        if losses.1.len() != adapters.len() {
            return Err(BenchError::Config(format!(
                "{}: {} losses for {} adapters",
                path.display(),
                losses.1.len(),
                adapters.len()
            )));
        }
        return Ok(losses);
    }
    let losses = validation_losses(&config.model, &load_all(adapters)?, blocks)?;
    let mut bytes = Vec::new();
    ciborium::into_writer(&losses, &mut bytes)
        .map_err(|e| BenchError::Config(format!("cannot encode validation losses: {e}")))?;
    write_entry(&path, &bytes)?;
    Ok(losses)
}
