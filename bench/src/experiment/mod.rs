//! The privacy–utility experiment of the papers' Tables 1–2: a public model,
//! N LoRA members fine-tuned on disjoint user-level parts of a private corpus,
//! and the perplexity of every mechanism on held-out blocks at several ε.
//!
//! The pipeline (each step in its own file):
//! 1. [`data`]: the corpus is partitioned at the user level into N/2 parts of two
//!    halves each; member `2k + h` is trained on half `h` of part `k`, so the N
//!    members see disjoint users (PMixED, AdaPMixED) and SubMix finds its two
//!    halves per part among the same members. Held-out users give the
//!    evaluation blocks.
//! 2. [`members`]: LoRA fine-tuning of each member, and DP-SGD LoRA on all the
//!    training users at each ε (the training-time baseline), cached on disk by a
//!    hash of everything that decides the weights.
//! 3. [`scoring`]: one batched teacher-forced forward per held-out block gives the
//!    public, member and DP-SGD rows; every mechanism is run over the positions
//!    in order with its own account (so budgets run out, SubMix STOPs and
//!    AdaPMixED screens as they would when serving), and perplexity is read from
//!    the distribution each step would have sampled.

pub mod canary;
mod config;
mod contenders;
pub mod data;
pub mod members;
pub mod scoring;

use std::time::Instant;

use burn::backend::Flex;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{LanguageModel, Model, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
pub use config::ExperimentConfig;
pub use data::{ExperimentData, prepare_data};
pub use members::{TrainedMembers, TrainingPlan, train_members};
pub use scoring::{MechanismResult, ScoringPlan, score_mechanisms};

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentResults {
    /// The configuration that produced these results.
    pub config: ExperimentConfig,
    /// Users in the corpus, in training parts and held out.
    pub users: (usize, usize, usize),
    /// Training blocks per member.
    pub member_blocks: Vec<usize>,
    /// Held-out loss of each member before and after fine-tuning (nats per token).
    pub member_losses: Vec<(f64, f64)>,
    /// Whether the members came from the cache.
    pub members_cached: bool,
    /// ε of each DP-SGD model as its accountant reports it (rounded up), by target.
    pub dp_sgd_epsilons: Vec<(f64, f64)>,
    /// One entry per mechanism and target ε.
    pub results: Vec<MechanismResult>,
    /// Seconds spent in each stage: data, training, scoring.
    pub seconds: (f64, f64, f64),
    /// The canary-extraction audit, when run.
    pub canary: Option<canary::CanaryAudit>,
}

/// Runs the whole experiment; `progress` shows bars on a terminal.
pub fn run(config: &ExperimentConfig, progress: bool) -> Result<ExperimentResults, BenchError> {
    if config.members < 2 || !config.members.is_multiple_of(2) {
        return Err(BenchError::Config(format!(
            "members must be even and at least 2 (N/2 SubMix parts of two halves); got {}",
            config.members
        )));
    }
    if config.epsilons.is_empty() {
        return Err(BenchError::Config("no target ε given".into()));
    }
    let t0 = Instant::now();
    let device = Default::default();
    let tokenizer = load_tokenizer(config)?;
    let data = prepare_data(config, &tokenizer)?;
    let t_data = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let trained = train_members(config, &data, progress)?;
    let t_train = t1.elapsed().as_secs_f64();

    let t2 = Instant::now();
    let model = Model::<Flex>::load(&config.model, &device)?;
    if tokenizer.vocab_size() > model.vocab_size() {
        return Err(BenchError::Config(format!(
            "the tokenizer has {} tokens, the model only {}",
            tokenizer.vocab_size(),
            model.vocab_size()
        )));
    }
    let mut adapters = trained.members.clone();
    adapters.extend(trained.dp_sgd.iter().map(|(_, a, _)| a.clone()));
    let runner = EnsembleRunner::new(model, &adapters)?;
    let results = score_mechanisms(config, &runner, &data.eval, &trained, progress)?;
    let t_score = t2.elapsed().as_secs_f64();
    let canary = match &config.canary {
        Some(plan) => Some(canary::canary_audit(
            config, plan, &tokenizer, &data, progress,
        )?),
        None => None,
    };

    Ok(ExperimentResults {
        config: config.clone(),
        users: (
            data.users,
            data.users - data.held_out_users,
            data.held_out_users,
        ),
        member_blocks: data.members.iter().map(Vec::len).collect(),
        member_losses: trained.losses.clone(),
        members_cached: trained.cached,
        dp_sgd_epsilons: trained.dp_sgd.iter().map(|(t, _, e)| (*t, *e)).collect(),
        results,
        seconds: (t_data, t_train, t_score),
        canary,
    })
}

/// The tokenizer of the run: the configured file, the folder's tokenizer.json, or
/// the GGUF's own vocabulary.
pub fn load_tokenizer(config: &ExperimentConfig) -> Result<Tokenizer, BenchError> {
    tokenizer_for(&config.model, config.tokenizer.as_deref())
}

/// The tokenizer for `model`: `tokenizer` when given, else the folder's
/// tokenizer.json, else the GGUF's own vocabulary.
pub fn tokenizer_for(
    model: &std::path::Path,
    tokenizer: Option<&std::path::Path>,
) -> Result<Tokenizer, BenchError> {
    if let Some(path) = tokenizer {
        return Ok(Tokenizer::from_file(path)?);
    }
    if model.is_dir() {
        return Ok(Tokenizer::from_file(model.join("tokenizer.json"))?);
    }
    let gguf =
        privmix_models::gguf::GgufFile::open(model).map_err(privmix_models::ModelError::from)?;
    Ok(Tokenizer::from_gguf(&gguf)?)
}
