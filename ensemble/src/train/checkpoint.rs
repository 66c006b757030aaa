//! The checkpoints of a `LoraTrainer`, one format whatever its gradient rule
//! (`LoraTrainer::save_checkpoint` writes them, its `resume`s read them):
//! the adapter in PEFT format, AdamW's moments, the step and the rule's
//! configuration fingerprint, plus what the rule keeps — for the mean
//! gradient the sampling RNG's state and the evaluation bookkeeping, so that
//! a run interrupted and resumed gives bit-for-bit the adapter of an
//! uninterrupted one with the same seed (tested in
//! `tests/integration/train.rs`); for DP-SGD nothing more (its coins are never
//! saved: see `dpsgd_checkpoint.rs`).
//!
//! Layout: `dir/step-NNNNNNNN/{adapter/, best/, optimizer.safetensors,
//! trainer.json}` and `dir/latest` naming the newest complete one (written
//! last, by rename, so a crash mid-save leaves the previous checkpoint in
//! force). DP-SGD checkpoints written before the two trainers were merged
//! name their state `dpsgd.json` (the same fields, minus the mean
//! gradient's); they are read as they are.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand_chacha::ChaCha20Rng;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::report::History;

const STATE: &str = "trainer.json";
/// The state file of DP-SGD checkpoints written before the merge (format 1).
const LEGACY_DP_STATE: &str = "dpsgd.json";
const OPTIMIZER: &str = "optimizer.safetensors";
const LATEST: &str = "latest";
/// The format `trainer.json` states (unchanged by the merge: the mean
/// gradient's fields are as before, DP-SGD's file holds the shared ones).
pub(crate) const FORMAT: u32 = 1;

/// `trainer.json`. Floats that decide the trajectory are stored as bits. The
/// shared part first; the rest is the mean gradient's (absent for DP-SGD,
/// whose sampling and noise generator must never be written down).
#[derive(Serialize, Deserialize)]
pub struct State {
    pub(crate) format: u32,
    pub(crate) step: usize,
    pub(crate) adam_t: u64,
    pub(crate) config: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rng_seed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rng_stream: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rng_word_pos: Option<String>,
    #[serde(default)]
    pub(crate) history: History,
    #[serde(default)]
    pub(crate) best_step: Option<usize>,
    #[serde(default)]
    pub(crate) best_loss_bits: Option<u64>,
    #[serde(default)]
    pub(crate) bad_evals: usize,
    #[serde(default)]
    pub(crate) stopped_early: bool,
}

/// A ChaCha20 generator's position, as [`State`] stores it.
pub(crate) fn rng_state(rng: &ChaCha20Rng) -> (Option<String>, Option<u64>, Option<String>) {
    (
        Some(hex(&rng.get_seed())),
        Some(rng.get_stream()),
        Some(rng.get_word_pos().to_string()),
    )
}

/// The generator [`rng_state`] stored in `state` (read from `state_path`).
pub(crate) fn rng_from_state(state: &State, state_path: &Path) -> Result<ChaCha20Rng, TrainError> {
    let bad = |m: &str| TrainError::checkpoint(state_path, m);
    let (Some(seed), Some(stream), Some(pos)) =
        (&state.rng_seed, state.rng_stream, &state.rng_word_pos)
    else {
        return Err(bad(
            "no sampling stream (rng_seed, rng_stream, rng_word_pos)",
        ));
    };
    let seed = unhex(seed).ok_or_else(|| bad("bad rng_seed"))?;
    let pos: u128 = pos.parse().map_err(|_| bad("bad rng_word_pos"))?;
    let mut rng = <ChaCha20Rng as rand::SeedableRng>::from_seed(seed);
    rng.set_stream(stream);
    rng.set_word_pos(pos);
    Ok(rng)
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
pub(crate) fn write_moments(
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
pub(crate) fn read_moments(here: &Path, len: usize) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
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
pub(crate) fn commit(dir: &Path, here: &Path, state: &State) -> Result<(), TrainError> {
    let io = |p: &Path, e: std::io::Error| TrainError::checkpoint(p, e);
    let state_path = here.join(STATE);
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

/// The checkpoint folder `dir/latest` names, its state file's path, and the
/// state (`trainer.json`, or a DP-SGD checkpoint's `dpsgd.json` from before the merge).
pub(crate) fn read_latest(dir: &Path) -> Result<(PathBuf, PathBuf, State), TrainError> {
    let latest = dir.join(LATEST);
    let name = std::fs::read_to_string(&latest).map_err(|e| TrainError::checkpoint(&latest, e))?;
    let here = dir.join(name.trim());
    let mut state_path = here.join(STATE);
    if !state_path.is_file() && here.join(LEGACY_DP_STATE).is_file() {
        state_path = here.join(LEGACY_DP_STATE);
    }
    let text =
        std::fs::read_to_string(&state_path).map_err(|e| TrainError::checkpoint(&state_path, e))?;
    let state = serde_json::from_str(&text).map_err(|e| TrainError::checkpoint(&state_path, e))?;
    Ok((here, state_path, state))
}
