//! `privmix train`: a provider's private text turned into N LoRA members that
//! `privmix generate` and `privmix serve` load, or into the DP-SGD baseline.
//!
//! Users are partitioned at the user level (each user's data in exactly one
//! member) by a seeded hash of the user id, as the ensemble mechanisms'
//! privacy argument needs ("Differentially Private Next-Token Prediction of
//! Large Language Models", arXiv 2403.15638; "Submix: Practical Private
//! Prediction for Large-Scale Language Models", arXiv 2201.00971). Each
//! member's users are cut into fixed-length blocks, a seeded fraction of the
//! blocks is held out for the held-out loss (and early stopping), and a LoRA
//! ("LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685)
//! is fine-tuned with AdamW.
//!
//! Layout of `--out`: `member-000/ …` PEFT folders with a README.md model
//! card each (or `dp-sgd/` with `--dp-sgd`), `manifest.json` (see
//! [`manifest`]), and while training `checkpoints/` (the run's fingerprint in
//! `run.json`, one resumable checkpoint folder per member), removed once the
//! manifest is written. A rerun with the same arguments and data continues
//! where the last one stopped; a rerun with anything else is refused.

mod args;
mod card;
mod dp;
mod driver;
pub(crate) mod error;
mod input;
pub mod manifest;
mod members;
mod prepared;

use std::path::Path;

use privmix_ensemble::lora::KNOWN_TARGET_MODULES;
use privmix_models::gguf::GgufFile;
use privmix_models::{LanguageModel, LoadOptions, Model, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use args::TrainArgs;
use error::TrainCmdError;
use prepared::{CHECKPOINTS, Prepared, TrainBackend};

use crate::error::CliError;
use manifest::{
    BaseModel, DpSgdParams, Identity, MANIFEST_FILE, RunConfig, data_hash, differences,
    file_sha256, fingerprint, model_identity, read_json, read_manifest, write_json_atomic,
};

/// The run's fingerprint inside [`CHECKPOINTS`].
const RUN_FILE: &str = "run.json";
/// Format tag of [`RUN_FILE`].
const RUN_FORMAT: &str = "privmix-train-run/1";

/// `checkpoints/run.json`: the fingerprint of the run in progress.
#[derive(Debug, Serialize, Deserialize)]
struct RunState {
    format: String,
    fingerprint: Value,
}

/// What `--out` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutState {
    /// Nothing yet: a new run.
    Fresh,
    /// An unfinished run with the same fingerprint.
    Resume,
    /// A finished run with the same fingerprint.
    Finished,
}

/// Runs `privmix train`.
pub fn run(args: &TrainArgs) -> Result<(), CliError> {
    check_flags(args)?;
    let corpus = input::read_corpus(&args.data)?;
    let (tokenizer, tokenizer_identity) = load_tokenizer(args)?;
    let bos = bos_of(&tokenizer)?;
    let config = run_config(args, bos);
    let model_sha256 = model_identity(&args.model)?;
    let name = args
        .base_model_name
        .clone()
        .unwrap_or_else(|| args.model.display().to_string());
    let data_sha256 = data_hash(
        corpus
            .users()
            .iter()
            .map(|u| (u.id.as_str(), u.text.as_str())),
    );
    let print = fingerprint(
        &model_sha256,
        &tokenizer_identity.sha256,
        &data_sha256,
        &name,
        &config,
    );
    // The partition first: a seed that leaves a member without users is refused
    // before anything is written.
    let shards = match args.members {
        Some(n) => Some(members::partition(&corpus, args.seed, n)?),
        None => None,
    };
    let state = prepare_out(&args.out, &print)?;
    if state == OutState::Finished {
        eprintln!(
            "privmix: {} already holds this run, finished (see {}); nothing to do",
            args.out.display(),
            args.out.join(MANIFEST_FILE).display()
        );
        return Ok(());
    }
    let device = Default::default();
    let model =
        Model::<TrainBackend>::load(LoadOptions::path(&args.model, &device)).map_err(|source| {
            CliError::Model {
                path: args.model.clone(),
                source,
            }
        })?;
    if tokenizer.vocab_size() > model.vocab_size() {
        return Err(CliError::Tokenizer(format!(
            "the tokenizer has {} tokens but the model {} has a vocabulary of {}",
            tokenizer.vocab_size(),
            args.model.display(),
            model.vocab_size()
        )));
    }
    let prepared = Prepared {
        corpus,
        tokenizer,
        config,
        base: BaseModel {
            path: args.model.display().to_string(),
            name,
            sha256: model_sha256,
        },
        tokenizer_identity,
        data_sha256,
        out: args.out.clone(),
    };
    let finished = match shards {
        Some(shards) => members::train(&prepared, &model, &shards, args)?,
        None => dp::train(&prepared, &model, args.checkpoint_every, args.stop_at_step)?,
    };
    if finished {
        let checkpoints = args.out.join(CHECKPOINTS);
        std::fs::remove_dir_all(&checkpoints).map_err(|source| CliError::Io {
            what: format!("removing {}", checkpoints.display()),
            source,
        })?;
    }
    Ok(())
}

/// Ranges and combinations clap does not check.
fn check_flags(a: &TrainArgs) -> Result<(), CliError> {
    if a.members == Some(0) {
        return Err(CliError::arg("--members", "must be at least 1"));
    }
    if !(0.0..1.0).contains(&a.holdout) {
        return Err(CliError::arg(
            "--holdout",
            format!("{} is not in [0, 1)", a.holdout),
        ));
    }
    if a.block_size < 2 {
        return Err(CliError::arg(
            "--block-size",
            "a block needs at least 2 tokens (an input and a target)",
        ));
    }
    for (flag, v) in [
        ("--rank", a.rank),
        ("--batch", a.batch),
        ("--grad-accum", a.grad_accum),
        ("--eval-blocks", a.eval_blocks),
    ] {
        if v == 0 {
            return Err(CliError::arg(flag, "must be at least 1"));
        }
    }
    for (flag, v) in [
        ("--steps", a.steps),
        ("--eval-every", a.eval_every),
        ("--patience", a.patience),
        ("--checkpoint-every", a.checkpoint_every),
        ("--stop-at-step", a.stop_at_step),
    ] {
        if v == Some(0) {
            return Err(CliError::arg(flag, "must be at least 1"));
        }
    }
    if !(a.epochs > 0.0 && a.epochs.is_finite()) {
        return Err(CliError::arg(
            "--epochs",
            format!("{} is not positive and finite", a.epochs),
        ));
    }
    if !(a.lr > 0.0 && a.lr.is_finite()) {
        return Err(CliError::arg(
            "--lr",
            format!("{} is not positive and finite", a.lr),
        ));
    }
    if !(a.alpha.is_finite()) {
        return Err(CliError::arg("--alpha", "not a finite number"));
    }
    if !(0.0..1.0).contains(&a.dropout) {
        return Err(CliError::arg(
            "--dropout",
            format!("{} is not in [0, 1)", a.dropout),
        ));
    }
    if !(a.weight_decay >= 0.0 && a.weight_decay.is_finite()) {
        return Err(CliError::arg(
            "--weight-decay",
            format!("{} is not a finite number ≥ 0", a.weight_decay),
        ));
    }
    if let Some(m) = a
        .target_modules
        .iter()
        .find(|m| !KNOWN_TARGET_MODULES.contains(&m.as_str()))
    {
        return Err(CliError::arg(
            "--target-modules",
            format!(
                "{m:?} is not a projection privmix adapts (one of {})",
                KNOWN_TARGET_MODULES.join(", ")
            ),
        ));
    }
    if a.patience.is_some() && a.holdout == 0.0 {
        return Err(CliError::arg(
            "--patience",
            "early stopping watches the held-out loss: needs --holdout > 0",
        ));
    }
    if a.dp_sgd {
        // Every release DP-SGD's accounting does not cover is refused: a choice of
        // step by held-out loss, or gradients averaged outside the clipped sum.
        if a.patience.is_some() {
            return Err(CliError::arg(
                "--patience",
                "not with --dp-sgd: early stopping on the held-out loss is a data-dependent choice the DP-SGD accounting does not cover",
            ));
        }
        if a.eval_every.is_some() {
            return Err(CliError::arg(
                "--eval-every",
                "not with --dp-sgd: the held-out loss is measured once, at the end",
            ));
        }
        if a.grad_accum != 1 {
            return Err(CliError::arg(
                "--grad-accum",
                "not with --dp-sgd: each DP-SGD step is one Poisson batch",
            ));
        }
        let epsilon = a.epsilon.unwrap_or(f64::NAN);
        if !(epsilon > 0.0 && epsilon.is_finite()) {
            return Err(CliError::arg(
                "--epsilon",
                format!("{epsilon} is not positive and finite"),
            ));
        }
        let delta = a.delta.unwrap_or(dp::DEFAULT_DELTA);
        if !(delta > 0.0 && delta < 1.0) {
            return Err(CliError::arg(
                "--delta",
                format!("{delta} is not in (0, 1)"),
            ));
        }
        let clip = a.clip_norm.unwrap_or(dp::DEFAULT_CLIP_NORM);
        if !(clip > 0.0 && clip.is_finite()) {
            return Err(CliError::arg(
                "--clip-norm",
                format!("{clip} is not positive and finite"),
            ));
        }
    }
    Ok(())
}

/// The flags as the recorded configuration.
fn run_config(a: &TrainArgs, bos: Option<u32>) -> RunConfig {
    RunConfig {
        members: a.members.unwrap_or(1),
        seed: a.seed,
        holdout: a.holdout,
        block_size: a.block_size,
        bos,
        rank: a.rank,
        alpha: a.alpha,
        dropout: a.dropout,
        target_modules: a.target_modules.clone(),
        learning_rate: a.lr,
        warmup_steps: a.warmup,
        weight_decay: a.weight_decay,
        steps: a.steps,
        epochs: a.epochs,
        batch_size: a.batch,
        grad_accum: a.grad_accum,
        eval_every: a.eval_every,
        eval_blocks: a.eval_blocks,
        patience: a.patience,
        dp_sgd: a.dp_sgd.then(|| DpSgdParams {
            epsilon: a.epsilon.unwrap_or(f64::NAN),
            delta: a.delta.unwrap_or(dp::DEFAULT_DELTA),
            clip_norm: a.clip_norm.unwrap_or(dp::DEFAULT_CLIP_NORM),
        }),
    }
}

/// The tokenizer (`--tokenizer`, else the GGUF's vocabulary, else the folder's
/// tokenizer.json) and its identity.
fn load_tokenizer(a: &TrainArgs) -> Result<(Tokenizer, Identity), CliError> {
    let tok_err = |e: privmix_models::ModelError| CliError::Tokenizer(e.to_string());
    let file = match &a.tokenizer {
        Some(path) => Some(path.clone()),
        None if a.model.is_dir() => {
            let file = a.model.join("tokenizer.json");
            if !file.is_file() {
                return Err(CliError::arg(
                    "--tokenizer",
                    format!(
                        "the model folder {} has no tokenizer.json: pass --tokenizer <tokenizer.json>",
                        a.model.display()
                    ),
                ));
            }
            Some(file)
        }
        None => None,
    };
    match file {
        Some(path) => {
            let tokenizer = Tokenizer::from_file(&path).map_err(tok_err)?;
            let identity = Identity {
                sha256: file_sha256(&path)?,
                path: Some(path.display().to_string()),
            };
            Ok((tokenizer, identity))
        }
        None => {
            let gguf = GgufFile::open(&a.model).map_err(|e| CliError::Model {
                path: a.model.clone(),
                source: e.into(),
            })?;
            let tokenizer = Tokenizer::from_gguf(&gguf).map_err(tok_err)?;
            let identity = Identity {
                path: None,
                sha256: file_sha256(&a.model)?,
            };
            Ok((tokenizer, identity))
        }
    }
}

/// The id every block starts with: the tokenizer's BOS when its encodings
/// start with it (as the base model saw in pretraining), else none.
fn bos_of(tokenizer: &Tokenizer) -> Result<Option<u32>, CliError> {
    let specials = tokenizer
        .encode("", true)
        .map_err(|e| CliError::Tokenizer(e.to_string()))?;
    Ok(tokenizer.bos_id().filter(|b| specials.first() == Some(b)))
}

/// Checks `out` against the run's fingerprint `print`: a finished run with the
/// same fingerprint, an unfinished one to resume, or a fresh folder (then
/// `checkpoints/run.json` is written). Anything else is refused.
fn prepare_out(out: &Path, print: &Value) -> Result<OutState, CliError> {
    let mismatch = |recorded: &Value| -> Result<(), CliError> {
        let differences = differences(recorded, print);
        if differences.is_empty() {
            Ok(())
        } else {
            Err(TrainCmdError::RunMismatch {
                out: out.to_path_buf(),
                differences,
            }
            .into())
        }
    };
    if out.join(MANIFEST_FILE).is_file() {
        mismatch(&read_manifest(out)?.fingerprint())?;
        return Ok(OutState::Finished);
    }
    let checkpoints = out.join(CHECKPOINTS);
    let run_file = checkpoints.join(RUN_FILE);
    if run_file.is_file() {
        let state: RunState = read_json(&run_file)?;
        if state.format != RUN_FORMAT {
            return Err(TrainCmdError::State {
                path: run_file,
                reason: format!("format {:?}, expected {RUN_FORMAT:?}", state.format),
            }
            .into());
        }
        // A run that failed before any member was checkpointed (a flag the base
        // model cannot take, say) left only run.json: nothing can be mixed, so
        // the new run replaces it.
        if state.fingerprint == *print || !only_run_file(out, &checkpoints) {
            mismatch(&state.fingerprint)?;
            return Ok(OutState::Resume);
        }
        write_json_atomic(
            &run_file,
            &RunState {
                format: RUN_FORMAT.into(),
                fingerprint: print.clone(),
            },
        )?;
        return Ok(OutState::Fresh);
    }
    let io = |what: String| move |source| CliError::Io { what, source };
    if out.exists() {
        let mut entries =
            std::fs::read_dir(out).map_err(io(format!("reading --out {}", out.display())))?;
        if entries.next().is_some() {
            return Err(TrainCmdError::NotARun(out.to_path_buf()).into());
        }
    }
    std::fs::create_dir_all(&checkpoints)
        .map_err(io(format!("creating {}", checkpoints.display())))?;
    write_json_atomic(
        &run_file,
        &RunState {
            format: RUN_FORMAT.into(),
            fingerprint: print.clone(),
        },
    )?;
    Ok(OutState::Fresh)
}

/// Whether `out` holds nothing but `checkpoints/run.json`.
fn only_run_file(out: &Path, checkpoints: &Path) -> bool {
    let names = |dir: &Path| -> Option<Vec<std::ffi::OsString>> {
        let entries = std::fs::read_dir(dir).ok()?;
        entries.map(|e| e.ok().map(|e| e.file_name())).collect()
    };
    names(out).is_some_and(|n| n == [CHECKPOINTS])
        && names(checkpoints).is_some_and(|n| n == [RUN_FILE])
}
