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

mod card;
mod dp;
mod error;
mod input;
pub mod manifest;
mod members;

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use clap::Args;
use privmix_ensemble::data::{Corpus, DataError, cut_blocks};
use privmix_ensemble::lora::KNOWN_TARGET_MODULES;
use privmix_models::gguf::GgufFile;
use privmix_models::{LanguageModel, Model, Tokenizer};
use rand::SeedableRng;
use rand::seq::index;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::TrainCmdError;

use crate::error::CliError;
use manifest::{
    BaseModel, DpSgdParams, Identity, MANIFEST_FILE, RunConfig, data_hash, differences,
    file_sha256, fingerprint, model_identity, read_json, read_manifest, write_json_atomic,
};

/// The backend members are trained on (CPU, reverse-mode autodiff).
type TrainBackend = Autodiff<Flex>;

/// Folder of the run's checkpoints inside `--out`.
const CHECKPOINTS: &str = "checkpoints";
/// Written by the trainers into a checkpoint folder that holds a checkpoint.
const LATEST_FILE: &str = "latest";
/// The run's fingerprint inside [`CHECKPOINTS`].
const RUN_FILE: &str = "run.json";
/// Format tag of [`RUN_FILE`].
const RUN_FORMAT: &str = "privmix-train-run/1";

/// `privmix train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The private data: JSON lines {"user": …, "text": …} (a file, or - for stdin), or a
    /// folder with one text file per user (the file name is the user id). A user's records
    /// are joined, in order, with a blank line between them.
    #[arg(long)]
    pub data: PathBuf,
    /// Base model: a Hugging Face folder (config.json + safetensors) or a GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// tokenizer.json to use (default: the GGUF's own vocabulary, or tokenizer.json in the
    /// model folder).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// base_model_name_or_path written into each adapter_config.json, e.g. the Hub name
    /// Python peft should load the base model by (default: --model as given).
    #[arg(long)]
    pub base_model_name: Option<String>,
    /// Output folder: member-000/ … (or dp-sgd/), manifest.json, and checkpoints/ while
    /// training. Rerunning with the same arguments continues an interrupted run.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of members N: users are partitioned into N disjoint shards, one LoRA each.
    #[arg(long, required_unless_present = "dp_sgd", conflicts_with = "dp_sgd")]
    pub members: Option<usize>,
    /// Seed of the partition (member = sha256(seed ‖ user) mod N), the held-out split,
    /// the adapters' initialisation and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of each member's blocks held out (never trained on) for the held-out loss,
    /// in [0, 1).
    #[arg(long, default_value_t = 0.1)]
    pub holdout: f64,
    /// LoRA rank r.
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// LoRA alpha (the update is scaled by alpha / r).
    #[arg(long, default_value_t = 16.0)]
    pub alpha: f64,
    /// LoRA dropout on the adapter's input during training, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Projections to adapt, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj; GPT-2: c_attn, c_proj, c_fc).
    #[arg(long, value_delimiter = ',', default_value = "q_proj,v_proj")]
    pub target_modules: Vec<String>,
    /// Peak learning rate of AdamW (linear warmup, then linear decay to 0).
    #[arg(long, default_value_t = 2e-4)]
    pub lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Optimizer steps per member (default: from --epochs).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Passes over each member's training blocks, when --steps is not given (DP-SGD: the
    /// expected number of passes, steps = epochs / q).
    #[arg(long, default_value_t = 1.0)]
    pub epochs: f64,
    /// Blocks per batch (DP-SGD: the expected Poisson batch, q = batch / blocks).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Batches whose gradients are averaged per optimizer step (not with --dp-sgd).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Tokens per training block (a block never mixes two users).
    #[arg(long, default_value_t = 512)]
    pub block_size: usize,
    /// Measure the held-out loss every N steps (default: a tenth of the run).
    #[arg(long, value_name = "N")]
    pub eval_every: Option<usize>,
    /// At most this many held-out blocks per evaluation.
    #[arg(long, default_value_t = 64)]
    pub eval_blocks: usize,
    /// Stop a member after this many evaluations in a row without a better held-out loss,
    /// and keep the best adapter.
    #[arg(long)]
    pub patience: Option<usize>,
    /// Save a checkpoint every N steps (default: at every evaluation, or every tenth of the
    /// run without one).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Stop every unfinished member (or the DP-SGD run) at step N and leave its checkpoint
    /// (an interrupted run); rerun without it to continue.
    #[arg(long, value_name = "N")]
    pub stop_at_step: Option<usize>,
    /// Train the DP-SGD baseline instead of members: one adapter on all the data, with
    /// per-example clipping and Gaussian noise calibrated to --epsilon.
    #[arg(long, requires = "epsilon")]
    pub dp_sgd: bool,
    /// DP-SGD: target ε (the noise multiplier is the smallest whose ε at --delta over the
    /// planned steps is at most this).
    #[arg(long, requires = "dp_sgd")]
    pub epsilon: Option<f64>,
    /// DP-SGD: δ (default 1e-5).
    #[arg(long, requires = "dp_sgd")]
    pub delta: Option<f64>,
    /// DP-SGD: per-example gradient clip norm C (default 1).
    #[arg(long, requires = "dp_sgd")]
    pub clip_norm: Option<f64>,
}

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

/// Everything loaded and checked before training.
pub(crate) struct Prepared {
    pub corpus: Corpus,
    pub tokenizer: Tokenizer,
    pub config: RunConfig,
    pub base: BaseModel,
    pub tokenizer_identity: Identity,
    pub data_sha256: String,
    pub out: PathBuf,
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
        Model::<TrainBackend>::load(&args.model, &device).map_err(|source| CliError::Model {
            path: args.model.clone(),
            source,
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

/// A shard's users cut into blocks.
pub(crate) struct ShardBlocks {
    /// Tokens of the users' texts.
    pub tokens: u64,
    /// Blocks, user by user in id order.
    pub blocks: Vec<Vec<u32>>,
}

/// `users` (sorted ids of `corpus`) tokenised and cut into blocks of
/// `block_size` (each user's incomplete tail dropped, a block never spanning
/// two users).
pub(crate) fn shard_blocks(
    p: &Prepared,
    users: &[String],
    member: &str,
) -> Result<ShardBlocks, CliError> {
    let mut tokens = 0u64;
    let mut blocks = Vec::new();
    for id in users {
        let text = p
            .corpus
            .get(id)
            .map(|u| u.text.as_str())
            .unwrap_or_default();
        let ids = p
            .tokenizer
            .encode(text, false)
            .map_err(|e| TrainCmdError::Data {
                what: format!("tokenizing user {id:?}"),
                source: DataError::Tokenizer(e.to_string()),
            })?;
        tokens += ids.len() as u64;
        blocks.extend(
            cut_blocks(&ids, p.config.block_size, p.config.bos).map_err(|source| {
                TrainCmdError::Data {
                    what: "cutting blocks".into(),
                    source,
                }
            })?,
        );
    }
    if blocks.is_empty() {
        return Err(TrainCmdError::NoBlocks {
            member: member.to_string(),
            users: users.len(),
            tokens,
            block_size: p.config.block_size,
        }
        .into());
    }
    Ok(ShardBlocks { tokens, blocks })
}

/// `blocks` split into (training, held-out): `⌈fraction · n⌉` blocks, chosen
/// by a ChaCha20 stream seeded with `seed`, are held out, never all of them
/// (a single block is never held out); both keep their order.
pub(crate) fn split_holdout(
    blocks: Vec<Vec<u32>>,
    fraction: f64,
    seed: u64,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let n = blocks.len();
    let held = ((fraction * n as f64).ceil() as usize).min(n.saturating_sub(1));
    if held == 0 {
        return (blocks, Vec::new());
    }
    let mut chosen = vec![false; n];
    for i in index::sample(&mut ChaCha20Rng::seed_from_u64(seed), n, held) {
        chosen[i] = true;
    }
    let (mut train, mut out) = (Vec::new(), Vec::new());
    for (block, c) in blocks.into_iter().zip(chosen) {
        if c {
            out.push(block);
        } else {
            train.push(block);
        }
    }
    (train, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdout_takes_the_ceiling_and_never_everything() {
        let blocks: Vec<Vec<u32>> = (0..10).map(|i| vec![i, i]).collect();
        let (t, h) = split_holdout(blocks.clone(), 0.15, 3);
        assert_eq!((t.len(), h.len()), (8, 2));
        let mut all: Vec<Vec<u32>> = t.iter().chain(&h).cloned().collect();
        all.sort();
        assert_eq!(all, blocks);
        assert_eq!(split_holdout(blocks.clone(), 0.15, 3), (t, h));
        let (t, h) = split_holdout(blocks[..1].to_vec(), 0.5, 3);
        assert_eq!((t.len(), h.len()), (1, 0));
        let (t, h) = split_holdout(blocks.clone(), 0.0, 3);
        assert_eq!((t.len(), h.len()), (10, 0));
    }
}
