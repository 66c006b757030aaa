//! Checkpoints of a [`Trainer`]: the adapter in PEFT format, AdamW's
//! moments, the step, the sampling RNG's state and the evaluation
//! bookkeeping — everything the trajectory depends on, so that a run
//! interrupted and resumed gives bit-for-bit the adapter of an uninterrupted
//! one with the same seed (tested in `tests/integration/train.rs`).
//!
//! Layout: `dir/step-NNNNNNNN/{adapter/, best/, optimizer.safetensors,
//! trainer.json}` and `dir/latest` naming the newest complete one (written
//! last, by rename, so a crash mid-save leaves the previous checkpoint in force).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use privmix_models::LanguageModel;
use rand_chacha::ChaCha20Rng;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::error::TrainError;
use super::host::HostTrainable;
use super::params::LoraParams;
use super::trainer::{History, Trainer};
use crate::lora::{LoraAdapter, LoraBase};
use privmix_models::ModelBackend;

const STATE: &str = "trainer.json";
const OPTIMIZER: &str = "optimizer.safetensors";
const LATEST: &str = "latest";
const FORMAT: u32 = 1;

/// `trainer.json`. Floats that decide the trajectory are stored as bits.
#[derive(Serialize, Deserialize)]
struct State {
    format: u32,
    step: usize,
    adam_t: u64,
    rng_seed: String,
    rng_stream: u64,
    rng_word_pos: String,
    config: serde_json::Value,
    history: History,
    best_step: Option<usize>,
    best_loss_bits: Option<u64>,
    bad_evals: usize,
    stopped_early: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Writes AdamW's moments to `here/optimizer.safetensors` (F32, one tensor each).
pub(super) fn write_moments(
    here: &Path,
    exp_avg: &[f32],
    exp_avg_sq: &[f32],
) -> Result<(), TrainError> {
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (m, v) = (bytes(exp_avg), bytes(exp_avg_sq));
    let views = [
        ("exp_avg", &m, exp_avg.len()),
        ("exp_avg_sq", &v, exp_avg_sq.len()),
    ]
    .into_iter()
    .map(|(name, b, n)| {
        TensorView::new(Dtype::F32, vec![n], b)
            .map(|t| (name.to_string(), t))
            .map_err(|e| TrainError::checkpoint(here, e))
    })
    .collect::<Result<Vec<_>, _>>()?;
    let opt_path = here.join(OPTIMIZER);
    safetensors::serialize_to_file(views, Some(HashMap::new()), &opt_path)
        .map_err(|e| TrainError::checkpoint(&opt_path, e))
}

/// Reads the moments [`write_moments`] wrote, each checked to be F32 `[len]`.
pub(super) fn read_moments(here: &Path, len: usize) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
    let opt_path = here.join(OPTIMIZER);
    let bytes = std::fs::read(&opt_path).map_err(|e| TrainError::checkpoint(&opt_path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| TrainError::checkpoint(&opt_path, e))?;
    let read = |name: &str| -> Result<Vec<f32>, TrainError> {
        let v = st
            .tensor(name)
            .map_err(|e| TrainError::checkpoint(&opt_path, e))?;
        if v.dtype() != Dtype::F32 || v.shape() != [len] {
            return Err(TrainError::checkpoint(
                &opt_path,
                format!(
                    "{name}: {:?} {:?}, expected F32 [{len}]",
                    v.dtype(),
                    v.shape()
                ),
            ));
        }
        Ok(v.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    Ok((read("exp_avg")?, read("exp_avg_sq")?))
}

/// Writes `state` as `here/state_file`, then points `dir/latest` at `here` atomically
/// (write and rename) and removes the older `step-*` folders: a checkpoint counts only
/// once complete.
pub(super) fn commit<S: Serialize>(
    dir: &Path,
    here: &Path,
    state_file: &str,
    state: &S,
) -> Result<(), TrainError> {
    let io = |p: &Path, e: std::io::Error| TrainError::checkpoint(p, e);
    let state_path = here.join(state_file);
    let text =
        serde_json::to_string_pretty(state).map_err(|e| TrainError::checkpoint(&state_path, e))?;
    std::fs::write(&state_path, text).map_err(|e| io(&state_path, e))?;
    let name = here
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| TrainError::checkpoint(here, "a checkpoint folder has no name"))?;
    let tmp = dir.join(".latest.tmp");
    std::fs::write(&tmp, &name).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, dir.join(LATEST)).map_err(|e| io(dir, e))?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let f = e.file_name();
            let f = f.to_string_lossy();
            if f.starts_with("step-") && f != name.as_str() {
                std::fs::remove_dir_all(e.path()).ok();
            }
        }
    }
    Ok(())
}

/// The checkpoint folder `dir/latest` names, its state file's path, and the state.
pub(super) fn read_latest<S: DeserializeOwned>(
    dir: &Path,
    state_file: &str,
) -> Result<(PathBuf, PathBuf, S), TrainError> {
    let latest = dir.join(LATEST);
    let name = std::fs::read_to_string(&latest).map_err(|e| TrainError::checkpoint(&latest, e))?;
    let here = dir.join(name.trim());
    let state_path = here.join(state_file);
    let text =
        std::fs::read_to_string(&state_path).map_err(|e| TrainError::checkpoint(&state_path, e))?;
    let state = serde_json::from_str(&text).map_err(|e| TrainError::checkpoint(&state_path, e))?;
    Ok((here, state_path, state))
}

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    Trainer<'m, B, M>
{
    /// Writes a checkpoint of the current state into `dir` (see the module
    /// doc for the layout) and returns the checkpoint's own folder.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf, TrainError> {
        let dir = dir.as_ref();
        let here = dir.join(format!("step-{:08}", self.step));
        let io = |p: &Path, e: std::io::Error| TrainError::checkpoint(p, e);
        std::fs::create_dir_all(&here).map_err(|e| io(&here, e))?;
        let adapter: LoraAdapter<B::InnerBackend> =
            self.params.to_adapter(&self.base, &self.device)?;
        adapter.save_peft(here.join("adapter"))?;
        if let Some((_, _, p)) = &self.best {
            let best: LoraAdapter<B::InnerBackend> = p.to_adapter(&self.base, &self.device)?;
            best.save_peft(here.join("best"))?;
        }
        write_moments(&here, &self.opt.exp_avg, &self.opt.exp_avg_sq)?;
        let state = State {
            format: FORMAT,
            step: self.step,
            adam_t: self.opt.t,
            rng_seed: hex(&self.rng.get_seed()),
            rng_stream: self.rng.get_stream(),
            rng_word_pos: self.rng.get_word_pos().to_string(),
            config: self.config.fingerprint(),
            history: self.history.clone(),
            best_step: self.best.as_ref().map(|b| b.0),
            best_loss_bits: self.best.as_ref().map(|b| b.1.to_bits()),
            bad_evals: self.bad_evals,
            stopped_early: self.stopped_early,
        };
        commit(dir, &here, STATE, &state)?;
        Ok(here)
    }

    /// A trainer restored from the checkpoint `dir/latest` points to, for the
    /// same model, data and configuration (a different configuration is a
    /// [`TrainError::Checkpoint`]).
    pub fn resume(
        model: &'m M,
        train: Vec<Vec<u32>>,
        held_out: Vec<Vec<u32>>,
        config: TrainConfig,
        dir: impl AsRef<Path>,
    ) -> Result<Self, TrainError> {
        let (here, state_path, state): (_, _, State) = read_latest(dir.as_ref(), STATE)?;
        let bad = |m: String| Err(TrainError::checkpoint(&state_path, m));
        if state.format != FORMAT {
            return bad(format!("format {} (expected {FORMAT})", state.format));
        }
        if state.config != config.fingerprint() {
            return bad("saved under another training configuration".into());
        }
        let mut t = Self::new(model, train, held_out, config)?;
        let adapter: LoraAdapter<B::InnerBackend> =
            LoraAdapter::load_peft(here.join("adapter"), &t.base, &t.device)?;
        t.params = LoraParams::from_adapter(&adapter, &t.base)?;
        if t.params.config() != &t.config.lora {
            return bad("the adapter's configuration differs from the run's".into());
        }
        t.best = match (state.best_step, state.best_loss_bits) {
            (Some(s), Some(bits)) => {
                let best: LoraAdapter<B::InnerBackend> =
                    LoraAdapter::load_peft(here.join("best"), &t.base, &t.device)?;
                Some((
                    s,
                    f64::from_bits(bits),
                    LoraParams::from_adapter(&best, &t.base)?,
                ))
            }
            (None, None) => None,
            _ => return bad("best step without best loss".into()),
        };
        (t.opt.exp_avg, t.opt.exp_avg_sq) = read_moments(&here, t.params.len())?;
        t.opt.t = state.adam_t;
        let seed = unhex(&state.rng_seed)
            .ok_or_else(|| TrainError::checkpoint(&state_path, "bad rng_seed"))?;
        let pos: u128 = state
            .rng_word_pos
            .parse()
            .map_err(|_| TrainError::checkpoint(&state_path, "bad rng_word_pos"))?;
        let mut rng = <ChaCha20Rng as rand::SeedableRng>::from_seed(seed);
        rng.set_stream(state.rng_stream);
        rng.set_word_pos(pos);
        t.rng = rng;
        t.step = state.step;
        t.history = state.history;
        t.bad_evals = state.bad_evals;
        t.stopped_early = state.stopped_early;
        Ok(t)
    }
}
