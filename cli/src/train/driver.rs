//! What `privmix train` does the same way with and without `--dp-sgd`:
//! a trainer started fresh or resumed from its checkpoint folder, run to
//! `--stop-at-step` with its progress bar and checkpoints, its adapter
//! written as a PEFT folder with a model card, and the manifest.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use privmix_ensemble::lora::LoraAdapter;
use privmix_ensemble::train::{GradientRule, LoraTrainer, TrainError};
use privmix_models::Model;

use super::error::TrainCmdError;
use super::manifest::{
    DataSummary, DpSgdRecord, MANIFEST_FILE, MANIFEST_FORMAT, MemberRecord, PartitionRecord,
    RunKind, TrainManifest, write_json_atomic,
};
use super::prepared::{LATEST_FILE, Prepared, TrainBackend};
use crate::error::CliError;
use crate::protected::adapter_identity;

/// The trainer of the run `name` on the command's backend.
pub(crate) type CliTrainer<'m, R> = LoraTrainer<'m, TrainBackend, Model<TrainBackend>, R>;

/// The failure of run `name` (a member, or `dp-sgd`) as the command reports it.
pub(crate) fn training_failed(name: &str) -> impl Fn(TrainError) -> CliError + '_ {
    move |source| {
        TrainCmdError::Training {
            member: name.to_string(),
            source,
        }
        .into()
    }
}

/// The trainer of run `name`: `make(Some(checkpoints))` resumes it when that
/// folder holds a checkpoint (said on stderr), `make(None)` starts it fresh;
/// set to save its checkpoints there every `every` steps (0: at the end
/// only) and to show its progress bar.
pub(crate) fn open<'m, R: GradientRule>(
    name: &str,
    checkpoints: &Path,
    every: usize,
    total: usize,
    make: impl FnOnce(Option<&Path>) -> Result<CliTrainer<'m, R>, TrainError>,
) -> Result<CliTrainer<'m, R>, CliError> {
    let fail = training_failed(name);
    let trainer = if checkpoints.join(LATEST_FILE).is_file() {
        let t = make(Some(checkpoints)).map_err(&fail)?;
        eprintln!(
            "{name}: resuming from the checkpoint at step {} of {total}",
            t.step_count()
        );
        t
    } else {
        make(None).map_err(&fail)?
    };
    Ok(trainer
        .with_checkpoints(checkpoints)
        .with_checkpoint_every(every)
        .with_progress(true)
        .with_progress_label(name))
}

/// Says on stderr that run `name` stopped at `steps` of `total` with its
/// checkpoint in `checkpoints`.
pub(crate) fn stopped(name: &str, steps: usize, total: usize, checkpoints: &Path) {
    eprintln!(
        "{name}: stopped at step {steps} of {total} (--stop-at-step); checkpoint in {}",
        checkpoints.display()
    );
}

/// Writes `adapter` as the PEFT folder `name` of `--out`; returns the folder
/// and the adapter's identity (the SHA-256 the manifest and card record).
pub(crate) fn write_adapter(
    p: &Prepared,
    name: &str,
    adapter: &LoraAdapter<Flex>,
) -> Result<(PathBuf, String), CliError> {
    let dir = p.out.join(name);
    adapter
        .save_peft(&dir)
        .map_err(|source| TrainCmdError::AdapterWrite {
            path: dir.clone(),
            source,
        })?;
    let sha = adapter_identity(&dir)?;
    Ok((dir, sha))
}

/// Writes the model card `text` as the adapter folder `dir`'s README.md.
pub(crate) fn write_card(dir: &Path, text: &str) -> Result<(), CliError> {
    let readme = dir.join("README.md");
    std::fs::write(&readme, text).map_err(|source| CliError::Io {
        what: format!("writing {}", readme.display()),
        source,
    })
}

/// Writes `--out`'s manifest of a run of `kind`; returns its path.
pub(crate) fn write_manifest(
    p: &Prepared,
    kind: RunKind,
    partition: Option<PartitionRecord>,
    members: Vec<MemberRecord>,
    dp_sgd: Option<DpSgdRecord>,
) -> Result<PathBuf, CliError> {
    let manifest = TrainManifest {
        format: MANIFEST_FORMAT.into(),
        privmix_version: env!("CARGO_PKG_VERSION").into(),
        kind,
        base_model: p.base.clone(),
        tokenizer: p.tokenizer_identity.clone(),
        data: DataSummary {
            users: p.corpus.len(),
            sha256: p.data_sha256.clone(),
        },
        partition,
        config: p.config.clone(),
        members,
        dp_sgd,
    };
    let path = p.out.join(MANIFEST_FILE);
    write_json_atomic(&path, &manifest)?;
    Ok(path)
}

/// A loss for messages.
pub(crate) fn fmt_loss(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.4}"))
}
