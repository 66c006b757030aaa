//! The fine-tuned adapters of a run, read from the cache — or trained, when
//! not there — only when a part that is not cached needs them, and their
//! validation losses, cached with the run's small results (CBOR, every float
//! kept bit for bit): a restart whose parts are all in the results cache
//! reads no adapter, trains none and runs no forward, even on a machine
//! whose adapter cache is empty.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use privmix_ensemble::lora::{BaseShapes, LoraAdapter};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{LoadOptions, Model};
use serde_json::json;

use super::config::ExperimentConfig;
use crate::Backend;
use crate::cache_key::{CacheKey, data_sha256, path_sha256, write_entry};
use crate::error::BenchError;

/// A fine-tuned adapter: complete in the cache and read from its folder when
/// [`Adapter::load`] is called, or not trained yet and trained (then cached)
/// when it is first loaded.
#[derive(Clone)]
pub enum Adapter {
    /// Not in the cache: trained on the first [`Adapter::load`].
    Pending(Rc<PendingAdapter>),
    /// A complete cache entry (its metadata written) at `dir`, for a base
    /// model of `base`'s shapes.
    Cached {
        /// The entry's folder.
        dir: PathBuf,
        /// The shapes the adapter is checked against when read.
        base: BaseShapes,
    },
}

/// How a pending adapter is trained.
pub type TrainFn = Box<dyn Fn() -> Result<LoraAdapter<Backend>, BenchError>>;

/// An adapter not in the cache when its run asked for it: trained, and saved
/// at its cache folder, when a part first needs it. A run whose parts are all
/// cached never trains it.
pub struct PendingAdapter {
    /// The cache folder it is saved at once trained.
    dir: PathBuf,
    /// The shapes it is checked against when read back.
    base: BaseShapes,
    /// What its cache entry records (its key; the training seconds and the
    /// commit are added when it is trained).
    meta: serde_json::Value,
    train: TrainFn,
    trained: OnceCell<LoraAdapter<Backend>>,
}

/// Adapters read from the cache by this process (what a test reads to check
/// that a run whose parts are all cached reads none).
static READ_FROM_CACHE: AtomicUsize = AtomicUsize::new(0);

/// Adapters trained by this process.
static TRAINED: AtomicUsize = AtomicUsize::new(0);

/// How many adapters this process has read from the cache so far.
pub fn adapters_read() -> usize {
    READ_FROM_CACHE.load(Ordering::Relaxed)
}

/// How many adapters this process has trained so far.
pub fn adapters_trained() -> usize {
    TRAINED.load(Ordering::Relaxed)
}

impl Adapter {
    /// The adapter cached at `dir` if its entry is complete (with the
    /// seconds its training took when it was made), else a pending one that
    /// `train` makes when first loaded, saved at `dir` with `meta`.
    ///
    /// Errors: the entry's metadata cannot be read.
    pub fn cached_or_pending(
        dir: &Path,
        base: &BaseShapes,
        meta: serde_json::Value,
        train: TrainFn,
    ) -> Result<(Self, Option<f64>), BenchError> {
        if let Some(meta) = cached_meta(dir)? {
            let adapter = Self::Cached {
                dir: dir.to_path_buf(),
                base: base.clone(),
            };
            return Ok((adapter, Some(train_seconds(&meta))));
        }
        let pending = PendingAdapter {
            dir: dir.to_path_buf(),
            base: base.clone(),
            meta,
            train,
            trained: OnceCell::new(),
        };
        Ok((Self::Pending(Rc::new(pending)), None))
    }

    /// The adapter: read from its folder when cached; trained (once, then
    /// saved in the cache) when pending.
    ///
    /// Errors: the cached files cannot be read or do not fit the base model;
    /// training or saving fails.
    pub fn load(&self) -> Result<LoraAdapter<Backend>, BenchError> {
        match self {
            Self::Pending(p) => p.load(),
            Self::Cached { dir, base } => read_cached(dir, base),
        }
    }
}

fn read_cached(dir: &Path, base: &BaseShapes) -> Result<LoraAdapter<Backend>, BenchError> {
    READ_FROM_CACHE.fetch_add(1, Ordering::Relaxed);
    Ok(LoraAdapter::load_peft(dir, base, &Default::default())?)
}

impl PendingAdapter {
    fn load(&self) -> Result<LoraAdapter<Backend>, BenchError> {
        if let Some(adapter) = self.trained.get() {
            return Ok(adapter.clone());
        }
        // Another handle on the same entry (the learning-rate trial's members
        // are the chosen run's) may have trained it since.
        if cached_meta(&self.dir)?.is_some() {
            return read_cached(&self.dir, &self.base);
        }
        let started = Instant::now();
        let adapter = (self.train)()?;
        let mut meta = self.meta.clone();
        meta[TRAIN_SECONDS] = json!(started.elapsed().as_secs_f64());
        meta["commit"] = json!(crate::run_info::commit());
        save_cached(&self.dir, &adapter, meta)?;
        TRAINED.fetch_add(1, Ordering::Relaxed);
        Ok(self.trained.get_or_init(|| adapter).clone())
    }
}

/// Written last into a cached adapter's folder: a folder without it is an
/// interrupted save, and is redone.
const META_FILE: &str = "privmix_meta.json";

/// The metadata key of the seconds an adapter took to train.
const TRAIN_SECONDS: &str = "train_seconds";

/// The training seconds a cached adapter's metadata records (0 where an
/// older run did not record them).
fn train_seconds(meta: &serde_json::Value) -> f64 {
    meta[TRAIN_SECONDS].as_f64().unwrap_or(0.0)
}

/// The metadata of the complete adapter entry at `dir` (None: no entry, or
/// an interrupted one).
pub(crate) fn cached_meta(dir: &Path) -> Result<Option<serde_json::Value>, BenchError> {
    let meta: PathBuf = dir.join(META_FILE);
    if !meta.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&meta).map_err(|e| BenchError::io(&meta, e))?;
    let value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Config(format!("{}: {e}", meta.display())))?;
    Ok(Some(value))
}

/// The adapter cached at `dir` with its metadata (None: not cached).
pub(crate) fn load_cached(
    dir: &Path,
    base: &BaseShapes,
) -> Result<Option<(LoraAdapter<Backend>, serde_json::Value)>, BenchError> {
    let Some(meta) = cached_meta(dir)? else {
        return Ok(None);
    };
    Ok(Some((read_cached(dir, base)?, meta)))
}

/// Saves `adapter` at `dir` with `meta`, written last and atomically: it
/// marks a complete entry.
pub(crate) fn save_cached(
    dir: &Path,
    adapter: &LoraAdapter<Backend>,
    meta: serde_json::Value,
) -> Result<(), BenchError> {
    adapter.save_peft(dir)?;
    write_entry(&dir.join(META_FILE), meta.to_string().as_bytes())
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

/// Relative difference of validation losses below which a recomputed adapter
/// (or validation entry) counts as its cached one where their bits differ.
pub const VERIFY_TOLERANCE: f64 = 1e-6;

/// The relative difference of a recomputed loss `fresh` from its `cached` one
/// (NaN where either is NaN, which no tolerance admits).
pub fn relative_difference(cached: f64, fresh: f64) -> f64 {
    (cached - fresh).abs() / cached.abs().max(f64::MIN_POSITIVE)
}

/// The validation losses of the public model (first) and of each adapter.
pub type ValidationLosses = (f64, Vec<f64>);

/// Where the validation losses of the adapters whose cache keys are `keys`
/// on `blocks` are kept: in the results cache, keyed on the results version,
/// the adapters' keys, the base model's and the blocks' SHA-256.
fn validation_path(
    config: &ExperimentConfig,
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<PathBuf, BenchError> {
    let key = CacheKey::new(
        "validation",
        &json!({ "adapters": keys }),
        vec![path_sha256(&config.model)?],
        data_sha256(&blocks)?,
    )?;
    Ok(config
        .results_dir
        .join(format!("validation-{}.cbor", key.digest())))
}

/// Whether the validation losses of the adapters whose cache keys are `keys`
/// on `blocks` are in the results cache.
pub fn validation_cached(
    config: &ExperimentConfig,
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<bool, BenchError> {
    Ok(validation_path(config, keys, blocks)?.is_file())
}

/// The validation entry of the adapters whose cache keys are `keys` on
/// `blocks` (None: not in the results cache).
pub fn cached_validation(
    config: &ExperimentConfig,
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<Option<ValidationLosses>, BenchError> {
    read_validation(&validation_path(config, keys, blocks)?, keys.len())
}

/// The entry at `path`, for `adapters` adapters (None: not cached).
fn read_validation(path: &Path, adapters: usize) -> Result<Option<ValidationLosses>, BenchError> {
    if !path.is_file() {
        return Ok(None);
    }
    let file = std::fs::File::open(path).map_err(|e| BenchError::io(path, e))?;
    let losses: ValidationLosses = ciborium::from_reader(std::io::BufReader::new(file))
        .map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))?;
    if losses.1.len() != adapters {
        return Err(BenchError::Config(format!(
            "{}: {} losses for {adapters} adapters",
            path.display(),
            losses.1.len(),
        )));
    }
    Ok(Some(losses))
}

/// [`validation_losses`] of the public model and of `adapters` (whose cache
/// keys are `keys`) on `blocks`, from the results cache when an earlier run
/// computed them for the same adapters; else computed (the adapters read, or
/// trained where pending) and kept.
pub fn cached_validation_losses(
    config: &ExperimentConfig,
    adapters: &[Adapter],
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<ValidationLosses, BenchError> {
    let path = validation_path(config, keys, blocks)?;
    if let Some(losses) = read_validation(&path, adapters.len())? {
        return Ok(losses);
    }
    let losses = validation_losses(&config.model, &load_all(adapters)?, blocks)?;
    let mut bytes = Vec::new();
    ciborium::into_writer(&losses, &mut bytes)
        .map_err(|e| BenchError::Config(format!("cannot encode validation losses: {e}")))?;
    write_entry(&path, &bytes)?;
    Ok(losses)
}

/// `--verify-cache` for a validation entry: the losses of `adapters` (keys
/// `keys`) on `blocks` recomputed (the adapters read, or trained where
/// pending) and compared bit for bit with the entry, which must exist.
/// Returns what it found; an error when they differ (the entry holds results
/// its key no longer describes).
pub fn verify_validation(
    config: &ExperimentConfig,
    what: &str,
    adapters: &[Adapter],
    keys: &[String],
    blocks: &[Vec<u32>],
) -> Result<String, BenchError> {
    let path = validation_path(config, keys, blocks)?;
    let Some(cached) = read_validation(&path, adapters.len())? else {
        return Err(BenchError::Config(format!(
            "--verify-cache: the validation losses of {what} are not in the results cache ({})",
            path.display()
        )));
    };
    let again = validation_losses(&config.model, &load_all(adapters)?, blocks)?;
    let bits = |l: &ValidationLosses| {
        std::iter::once(l.0)
            .chain(l.1.iter().copied())
            .map(f64::to_bits)
            .collect::<Vec<_>>()
    };
    if bits(&cached) != bits(&again) {
        // Another kind of machine adds the same sums in another order (the
        // entries do not record their machine): losses within
        // VERIFY_TOLERANCE are stated, not failed.
        let flat =
            |l: &ValidationLosses| std::iter::once(l.0).chain(l.1.clone()).collect::<Vec<_>>();
        let relative: Vec<f64> = flat(&cached)
            .iter()
            .zip(flat(&again))
            .map(|(&a, b)| relative_difference(a, b))
            .collect();
        let worst = relative.iter().copied().fold(0.0_f64, f64::max);
        if relative.iter().all(|&r| r <= VERIFY_TOLERANCE) {
            return Ok(format!(
                "validation losses of {what} recomputed ({} adapters): not bit for bit but \
                 within a relative {worst:.1e} of their entry (at most {:e}; bits are \
                 expected to differ across kinds of machine)",
                adapters.len(),
                VERIFY_TOLERANCE
            ));
        }
        return Err(BenchError::Config(format!(
            "--verify-cache: the validation losses of {what} recomputed ({:?}) differ from \
             their entry ({:?}, {}): the cache holds results its key no longer describes \
             (bump RESULTS_VERSION in bench/src/cache_key.rs)",
            again,
            cached,
            path.display()
        )));
    }
    Ok(format!(
        "validation losses of {what} recomputed ({} adapters): bit for bit equal to their entry",
        adapters.len()
    ))
}
