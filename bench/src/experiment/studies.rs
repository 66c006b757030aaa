//! The studies that explain PMixED's gap to DP-SGD, scored on each seed's
//! queries beside the main table (the same forwards, their own randomness):
//! - **the queries curve**: PMixED at fixed ε calibrated to the seed's first
//!   16, 64, 254 and 1016 queries, with the public model and the non-private
//!   ensemble on the same queries. A private-prediction deployment answers a
//!   bounded number of queries; the curve shows where, if anywhere, PMixED
//!   wins at the same ε. The table's DP-SGD model at each of those ε (where
//!   the run trains one) is read on the same first queries, so PMixED is
//!   compared with DP-SGD like for like;
//! - **the attribution ablation**, at the largest ε over all the seed's
//!   queries: one change per row — the paper's own accounting (a diagnostic,
//!   not a DP guarantee: [`PMIXED_PAPER`]), then each enforcement order α_c,
//!   then each ensemble size N ([`members_row`]: a run of its own over the
//!   main table's first seeds, members trained on proportionally more records
//!   where the corpus allows).
//!
//! Each row is summarised over seeds like the main table (geometric mean of
//! the perplexities with the t-interval of their logarithms), with its mean λ
//! (a private diagnostic).

use privmix_accountant::Orders;
use serde::{Deserialize, Serialize};

use super::config::ExperimentConfig;
pub use super::contenders::PMIXED_PAPER;
use super::contenders::{
    Contender, MechanismResult, pmixed_contender, pmixed_paper_contender, reference_contenders,
};
use super::scoring::{StudyContender, StudyScorer};
use crate::error::BenchError;
use crate::stats::Interval;

pub use super::config::StudyPlan;

/// Which study a row belongs to.
pub const QUERIES: &str = "queries curve";
/// The ablation's study name.
pub const ABLATION: &str = "attribution ablation";

/// What one row of a study is, before it is scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyKey {
    /// [`QUERIES`] or [`ABLATION`].
    pub study: String,
    /// The change this row makes, in words.
    pub change: String,
    /// Queries answered per seed.
    pub queries: u64,
}

/// One row of a study over the seeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StudyRow {
    /// The row.
    pub key: StudyKey,
    /// `public`, `ensemble`, `pmixed`, `dp-sgd` or [`PMIXED_PAPER`].
    pub mechanism: String,
    /// Target ε (None: public, ensemble).
    pub target_epsilon: Option<f64>,
    /// Perplexity over seeds (geometric; None: infinite on a seed).
    pub perplexity: Option<Interval>,
    /// Each seed's perplexity.
    pub perplexity_per_seed: Vec<f64>,
    /// ε spent, over seeds (for [`PMIXED_PAPER`]: what the proven bound
    /// charges for its radius; None: infinite).
    pub spent_epsilon: Option<Interval>,
    /// Mean λ over the seeds' queries (a private diagnostic).
    pub mean_lambda: f64,
    /// Seed 0's parameters (the calibrated radius).
    pub parameters: String,
}

/// The studies' contenders for a seed of `seed_queries` queries, with what
/// each row is, in the same order for every seed.
pub(crate) fn study_contenders(
    config: &ExperimentConfig,
    plan: &StudyPlan,
    seed_queries: u64,
    orders: &Orders,
) -> Result<(Vec<StudyContender>, Vec<StudyKey>), BenchError> {
    study_rows(config, plan, seed_queries, orders, true)
}

/// What each row of [`study_contenders`] is, without calibrating any
/// contender (what a run whose scored parts are all cached needs).
pub(crate) fn study_keys(
    config: &ExperimentConfig,
    plan: &StudyPlan,
    seed_queries: u64,
    orders: &Orders,
) -> Result<Vec<StudyKey>, BenchError> {
    Ok(study_rows(config, plan, seed_queries, orders, false)?.1)
}

/// The study rows' keys and, with `build`, their contenders.
fn study_rows(
    config: &ExperimentConfig,
    plan: &StudyPlan,
    seed_queries: u64,
    orders: &Orders,
    build: bool,
) -> Result<(Vec<StudyContender>, Vec<StudyKey>), BenchError> {
    let mut contenders = Vec::new();
    let mut keys = Vec::new();
    let mut push = |scorer: Option<StudyScorer>, key: StudyKey| {
        if let Some(scorer) = scorer {
            contenders.push(StudyContender {
                limit: key.queries,
                scorer,
            });
        }
        keys.push(key);
    };
    let mechanism = |c: Result<Contender, BenchError>| -> Result<StudyScorer, BenchError> {
        Ok(StudyScorer::Mechanism(Box::new(c?)))
    };
    let alpha_c = config.scoring.pmixed_alpha_c;
    for &k in plan.query_counts.iter().filter(|&&k| k <= seed_queries) {
        let key = || StudyKey {
            study: QUERIES.into(),
            change: format!("{k} queries"),
            queries: k,
        };
        for c in reference_contenders(config, orders) {
            push(build.then(|| StudyScorer::Mechanism(Box::new(c))), key());
        }
        for &eps in &plan.query_epsilons {
            let c = build
                .then(|| mechanism(pmixed_contender(config, eps, k, alpha_c, orders)))
                .transpose()?;
            push(c, key());
        }
        // DP-SGD on the same queries, where the table trained it at that ε:
        // the curve's comparison is then like for like.
        for &eps in plan
            .query_epsilons
            .iter()
            .filter(|e| has_dp_sgd(config, **e))
        {
            let scorer = StudyScorer::DpSgd {
                target_epsilon: eps,
                score: Default::default(),
            };
            push(build.then_some(scorer), key());
        }
    }
    let top = config.largest_epsilon();
    let key = |change: String| StudyKey {
        study: ABLATION.into(),
        change,
        queries: seed_queries,
    };
    if plan.paper_accounting {
        let c = build
            .then(|| mechanism(pmixed_paper_contender(config, top, seed_queries, orders)))
            .transpose()?;
        push(c, key("the paper's accounting (not a DP guarantee)".into()));
    }
    for &alpha_c in &plan.alpha_cs {
        let c = build
            .then(|| mechanism(pmixed_contender(config, top, seed_queries, alpha_c, orders)))
            .transpose()?;
        push(c, key(format!("α_c = {alpha_c}")));
    }
    Ok((contenders, keys))
}

/// Whether the run trains a DP-SGD model at target `eps` (one per ε of the table).
fn has_dp_sgd(config: &ExperimentConfig, eps: f64) -> bool {
    config.dp_sgd.is_some() && config.epsilons.contains(&eps)
}

/// Each row over the seeds (`seeds[s][j]`: seed s's result of row j).
pub fn summarise_studies(
    keys: &[StudyKey],
    seeds: &[Vec<MechanismResult>],
) -> Result<Vec<StudyRow>, BenchError> {
    keys.iter()
        .enumerate()
        .map(|(j, key)| {
            let runs: Vec<&MechanismResult> = seeds.iter().filter_map(|s| s.get(j)).collect();
            let first = runs
                .first()
                .ok_or_else(|| BenchError::Config("a study row with no seed".into()))?;
            if runs.len() != seeds.len() {
                return Err(BenchError::Config("seeds ran different studies".into()));
            }
            let ppl: Vec<f64> = runs.iter().map(|r| r.perplexity).collect();
            let spent: Option<Vec<f64>> = runs.iter().map(|r| r.spent_epsilon).collect();
            let lambdas: Vec<f64> = runs.iter().flat_map(|r| r.lambda_trace.clone()).collect();
            Ok(StudyRow {
                key: key.clone(),
                mechanism: first.mechanism.clone(),
                target_epsilon: first.target_epsilon,
                perplexity: Interval::geometric(&ppl).ok(),
                perplexity_per_seed: ppl,
                spent_epsilon: spent.and_then(|v| Interval::of(&v).ok()),
                mean_lambda: lambdas.iter().sum::<f64>() / lambdas.len().max(1) as f64,
                parameters: first.parameters.clone(),
            })
        })
        .collect()
}

/// The configuration of the ablation's run at `n` members: the main run's
/// (its tuned learning rate included) at its largest ε only, over its first
/// `plan.members_seeds` seeds, the record cap scaled by n / N so that each
/// member keeps about as many records (the corpus caps it), one set of members
/// for all seeds, and nothing else (no DP-SGD, baselines, canaries, long
/// deployment or studies).
pub fn members_config(config: &ExperimentConfig, plan: &StudyPlan, n: usize) -> ExperimentConfig {
    ExperimentConfig {
        members: n,
        max_records: config
            .max_records
            .map(|m| (m * n).div_ceil(config.members.max(1))),
        seeds: plan.members_seeds.clamp(1, config.seeds.max(1)),
        epsilons: vec![config.largest_epsilon()],
        dp_sgd: None,
        prediction_baselines: false,
        canary: None,
        fine_tuned: false,
        training_per_seed: false,
        member_learning_rates: Vec::new(),
        training_seed_offset: 0,
        long_queries: 0,
        studies: None,
        ..config.clone()
    }
}

/// The ablation's row of the run `r` at N members: its PMixED at its ε.
pub fn members_row(r: &super::ExperimentResults) -> Result<StudyRow, BenchError> {
    let top = r.config.largest_epsilon();
    let row = r
        .row("pmixed", Some(top))
        .ok_or_else(|| BenchError::Config("the N ablation's run has no PMixED row".into()))?;
    let lambdas: Vec<f64> = r
        .seeds
        .iter()
        .flatten()
        .filter(|m| m.mechanism == "pmixed")
        .flat_map(|m| m.lambda_trace.iter().copied())
        .collect();
    let records: usize = r.member_blocks.iter().sum();
    Ok(StudyRow {
        key: StudyKey {
            study: ABLATION.into(),
            change: format!(
                "N = {} ({records} records, about {} a member)",
                r.config.members,
                records / r.config.members.max(1)
            ),
            queries: row.queries,
        },
        mechanism: row.mechanism.clone(),
        target_epsilon: row.target_epsilon,
        perplexity: row.perplexity,
        perplexity_per_seed: row.perplexity_per_seed.clone(),
        spent_epsilon: row.spent_epsilon,
        mean_lambda: lambdas.iter().sum::<f64>() / lambdas.len().max(1) as f64,
        parameters: row.parameters.clone(),
    })
}
