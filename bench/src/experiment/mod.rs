//! The privacy–utility experiment of the papers' Tables 1–2: a public model,
//! N LoRA members fine-tuned on disjoint shares of a private corpus, and the
//! perplexity of every mechanism on held-out blocks at several ε, repeated over
//! seeds.
//!
//! The pipeline (each step in its own file):
//! 1. [`data`]: every privacy unit (a training record, or a user) goes to one
//!    member by a keyed hash of its id; member 2k and 2k + 1 are SubMix's part
//!    k. Held-out plays give each seed's evaluation blocks (disjoint across
//!    seeds) and the validation blocks.
//! 2. [`members`]: LoRA fine-tuning of each member for a number of epochs, and
//!    DP-SGD LoRA on all the training records: a learning-rate × epochs sweep at
//!    the largest ε, validated, then the chosen setting at every ε with σ from
//!    the accountant — all cached on disk by a hash of what decides the weights.
//! 3. [`scoring`]: per seed, one batched teacher-forced forward per held-out
//!    block gives the public, member and DP-SGD rows; every mechanism is run
//!    over the positions in order with its own account (so budgets run out,
//!    SubMix STOPs and AdaPMixED screens as they would when serving), and
//!    perplexity is read from the law of the token each step would release
//!    ([`induced`] for the S&A-Laplace and GNMax baselines).
//! 4. [`summarize`]: each figure as its mean over seeds with a 95% interval.
//! 5. [`long`]: optionally, one long deployment at the largest ε (the AdaPMixED
//!    paper's 99,840 queries), its interval over consecutive runs of its blocks.
//! 6. [`studies`]: optionally, the queries curve and the attribution ablation,
//!    scored on each seed's forwards beside the main table.
//!
//! Each scored part (a seed row with its study rows, the long deployment, the
//! canary audit, and so each run the ablation and the user-level table make)
//! is cached when it is done (`scored_cache.rs`), so that a run stopped part-way resumes at the
//! first part not done.

pub mod adapters;
pub mod canary;
mod config;
mod contenders;
pub mod data;
pub mod induced;
pub mod long;
pub mod members;
pub mod paper_accounting;
mod scored_cache;
pub mod scoring;
pub mod studies;
pub mod training;

use std::time::Instant;

use crate::Backend;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{Model, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::stats::Interval;
pub use config::{DpSgdPlan, ExperimentConfig};
pub use data::{ExperimentData, PrivacyUnit, parse_unit, prepare_data};
pub use members::{DpSgdRun, TrainedMembers, TrainingPlan, train_members};
pub use scoring::{MechanismResult, ScoringPlan, score_mechanisms};

/// One mechanism at one target ε over all seeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SummaryRow {
    /// Mechanism name.
    pub mechanism: String,
    /// Target ε (None: the public model, the non-private ensemble).
    pub target_epsilon: Option<f64>,
    /// Perplexity over seeds: the geometric mean with the 95% t-interval of the
    /// seeds' log-perplexities mapped back ([`Interval::geometric`]; None:
    /// infinite on a seed).
    pub perplexity: Option<Interval>,
    /// Each seed's perplexity.
    pub perplexity_per_seed: Vec<f64>,
    /// Spent ε with its interval over seeds (None: no finite guarantee).
    pub spent_epsilon: Option<Interval>,
    /// Queries per seed.
    pub queries: u64,
    /// Shares of all queries answered privately, screened, and after the budget ran out.
    pub shares: (f64, f64, f64),
    /// AdaPMixED: the screening's ε over each seed's queries, with its interval.
    pub screening_epsilon: Option<Interval>,
    /// The parameters of seed 0's run.
    pub parameters: String,
}

/// A scored part of a run (a seed row with its study rows, the long
/// deployment): computed by this run or read from the cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScoredPart {
    /// Which part (`seed row 1`, `long deployment`, `N = 32: seed row 0`).
    pub part: String,
    /// Whether it was read from the cache (computed by an earlier run).
    pub cached: bool,
    /// Seconds it took when it was computed (by this run or the earlier one).
    pub seconds: f64,
    /// The commit that computed it (provenance; None: not recorded).
    pub commit: Option<String>,
}

/// A seed row's scored results: the main table's, then its study rows'.
type ScoredSeed = (Vec<MechanismResult>, Vec<MechanismResult>);

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentResults {
    /// The configuration that produced these results.
    pub config: ExperimentConfig,
    /// The privacy unit, in words.
    pub unit: String,
    /// Units trained on.
    pub units: usize,
    /// Plays held out for evaluation and validation.
    pub held_out_plays: Vec<String>,
    /// Training blocks per member.
    pub member_blocks: Vec<usize>,
    /// Optimizer steps per member.
    pub member_steps: Vec<usize>,
    /// Validation loss of the public model and of each member (nats per token).
    pub validation: (f64, Vec<f64>),
    /// Whether the members came from the cache.
    pub members_cached: bool,
    /// Seconds the adapters loaded from the cache took to train when they were
    /// trained (by an earlier run): compute this run reused.
    #[serde(default)]
    pub reused_training_seconds: f64,
    /// The members' learning rates tried, with each one's mean validation
    /// loss (empty: no grid; the chosen one is in the configuration).
    #[serde(default)]
    pub member_lr_sweep: training::LearningRateSweep,
    /// Every point of the DP-SGD sweep.
    pub dp_sgd_sweep: Vec<DpSgdRun>,
    /// The DP-SGD models of the table, one per target ε.
    pub dp_sgd: Vec<DpSgdRun>,
    /// Each seed's results, one entry per mechanism and target ε.
    pub seeds: Vec<Vec<MechanismResult>>,
    /// Each mechanism and target over the seeds.
    pub summary: Vec<SummaryRow>,
    /// `(phase, seconds)` of this experiment.
    pub phases: Vec<(String, f64)>,
    /// The canary-extraction audit, when run.
    pub canary: Option<canary::CanaryAudit>,
    /// The long deployment, when asked for (`long_queries`).
    #[serde(default)]
    pub long_deployment: Option<long::LongDeployment>,
    /// The studies' rows (empty: not run).
    #[serde(default)]
    pub studies: Vec<studies::StudyRow>,
    /// Each scored part, in the order the run reached it, with whether it came
    /// from the cache and what it cost when computed (the ablation's runs at
    /// other N included).
    #[serde(default)]
    pub scored_parts: Vec<ScoredPart>,
    /// What `--verify-cache` recomputed of the scored parts and how it compared
    /// with the cache (None: not asked, or the part was not cached).
    #[serde(default)]
    pub scored_check: Option<String>,
    /// What `--verify-cache` recomputed of the validation entries (seed row
    /// 0's members') and how it compared (None: not asked, or the entry was
    /// made by this run).
    #[serde(default)]
    pub validation_check: Option<String>,
    /// Adapters this run read from the cache (0 where every part it needed
    /// was cached: it trained nothing and scored nothing).
    #[serde(default)]
    pub adapters_read: usize,
    /// Adapters this run trained (0 where every part it needed was in the
    /// results cache, whatever the adapter cache held).
    #[serde(default)]
    pub adapters_trained: usize,
}

impl ExperimentResults {
    /// The summary row of `mechanism` at `target`.
    pub fn row(&self, mechanism: &str, target: Option<f64>) -> Option<&SummaryRow> {
        self.summary
            .iter()
            .find(|r| r.mechanism == mechanism && r.target_epsilon == target)
    }

    /// Seconds the scored parts read from the cache took when an earlier run
    /// computed them: compute this run reused.
    pub fn reused_scoring_seconds(&self) -> f64 {
        self.scored_parts
            .iter()
            .filter(|p| p.cached)
            .map(|p| p.seconds)
            .sum()
    }
}

/// The summary rows from each seed's results (same mechanisms in the same order).
pub fn summarize(seeds: &[Vec<MechanismResult>]) -> Result<Vec<SummaryRow>, BenchError> {
    let Some(first) = seeds.first() else {
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    for (k, m) in first.iter().enumerate() {
        let runs: Vec<&MechanismResult> = seeds.iter().filter_map(|s| s.get(k)).collect();
        if runs.len() != seeds.len()
            || runs
                .iter()
                .any(|r| r.mechanism != m.mechanism || r.target_epsilon != m.target_epsilon)
        {
            return Err(BenchError::Config(
                "seeds scored different mechanisms".into(),
            ));
        }
        let ppl: Vec<f64> = runs.iter().map(|r| r.perplexity).collect();
        let spent: Option<Vec<f64>> = runs.iter().map(|r| r.spent_epsilon).collect();
        let screening: Option<Vec<f64>> = runs.iter().map(|r| r.screening_epsilon).collect();
        let total: u64 = runs.iter().map(|r| r.queries).sum();
        let share = |f: fn(&MechanismResult) -> u64| {
            runs.iter().map(|r| f(r)).sum::<u64>() as f64 / total.max(1) as f64
        };
        rows.push(SummaryRow {
            mechanism: m.mechanism.clone(),
            target_epsilon: m.target_epsilon,
            perplexity: Interval::geometric(&ppl).ok(),
            perplexity_per_seed: ppl,
            spent_epsilon: spent.and_then(|v| Interval::of(&v).ok()),
            queries: m.queries,
            shares: (
                share(|r| r.private_answers),
                share(|r| r.screened),
                share(|r| r.stopped),
            ),
            screening_epsilon: screening.and_then(|v| Interval::of(&v).ok()),
            parameters: m.parameters.clone(),
        });
    }
    Ok(rows)
}

/// Runs the whole experiment; `progress` shows bars on a terminal.
pub fn run(config: &ExperimentConfig, progress: bool) -> Result<ExperimentResults, BenchError> {
    run_verified(config, progress, false)
}

/// [`run`]; with `verify_cache`, seed row 0, when it comes from the cache, is
/// also scored again and must equal its entry bit for bit (else an error: the
/// cache holds results its key no longer describes).
pub fn run_verified(
    config: &ExperimentConfig,
    progress: bool,
    verify_cache: bool,
) -> Result<ExperimentResults, BenchError> {
    if config.members < 2 || !config.members.is_multiple_of(2) {
        return Err(BenchError::Config(format!(
            "members must be even and at least 2 (N/2 SubMix parts of two halves); got {}",
            config.members
        )));
    }
    if config.epsilons.is_empty() {
        return Err(BenchError::Config("no target ε given".into()));
    }
    let mut phases = Vec::new();
    let t0 = Instant::now();
    let (read_before, trained_before) = (adapters::adapters_read(), adapters::adapters_trained());
    let tokenizer = load_tokenizer(config)?;
    if let Some(plan) = &config.canary {
        canary::check_canaries(plan, config.seed, &tokenizer)?;
    }
    let data = prepare_data(config, &tokenizer)?;
    phases.push(("data".to_string(), t0.elapsed().as_secs_f64()));

    let t1 = Instant::now();
    let (chosen, trained, member_lr_sweep) = training::tune_and_train(config, &data, progress)?;
    let config = &chosen;
    phases.push((
        format!(
            "training ({} members{}{})",
            config.members,
            if trained.dp_sgd.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} DP-SGD models",
                    trained.dp_sgd_sweep.len() + trained.dp_sgd.len() - 1
                )
            },
            if trained.cached {
                ", from the cache"
            } else {
                ""
            }
        ),
        t1.elapsed().as_secs_f64(),
    ));

    let t2 = Instant::now();
    let tokenizer_vocab = tokenizer.vocab_size();
    let mut runner = training::LazyRunner::new(config, &trained, tokenizer_vocab);
    let (mut row_training_seconds, mut reused_seconds, mut all_cached) =
        (0.0, trained.reused_seconds, trained.cached);
    let mut seeds = Vec::with_capacity(data.eval.len());
    let orders = privmix_accountant::Orders::dp_accounting_default();
    // Every seed runs the same study rows: sized to the smallest seed.
    let seed_queries = data
        .eval
        .iter()
        .map(|e| e.iter().map(|b| b.len() as u64 - 1).sum::<u64>())
        .min()
        .unwrap_or(0);
    let study_keys = match &config.studies {
        Some(plan) => studies::study_keys(config, plan, seed_queries, &orders)?,
        None => Vec::new(),
    };
    let mut study_seeds = Vec::new();
    let cache = scored_cache::ScoredCache::new(config)?;
    let (mut scored_parts, mut scored_check, mut validation_check) = (Vec::new(), None, None);
    for (s, eval) in data.eval.iter().enumerate() {
        // The study contenders of a scoring (fresh for each: they keep accounts).
        let studies = || match &config.studies {
            Some(plan) => studies::study_contenders(config, plan, seed_queries, &orders),
            None => Ok((Vec::new(), Vec::new())),
        };
        // Seed row s ≥ 1 trains its own models when the plan asks for
        // training variance; row 0 is the training above.
        let own = if config.training_per_seed && s > 0 {
            let t = Instant::now();
            let row = training::seed_row_config(config, s, &trained);
            let row_trained = train_members(&row, &data, progress)?;
            row_training_seconds += t.elapsed().as_secs_f64();
            reused_seconds += row_trained.reused_seconds;
            all_cached &= row_trained.cached;
            Some((row, row_trained))
        } else {
            None
        };
        let mut own_runner = own
            .as_ref()
            .map(|(row, t)| training::LazyRunner::new(row, t, tokenizer_vocab));
        let row_trained = own.as_ref().map_or(&trained, |(_, t)| t);
        let row_seed = config.seed.wrapping_add(s as u64);
        let mut score = || -> Result<ScoredSeed, BenchError> {
            let (row_runner, vocab) = match own_runner.as_mut() {
                Some(r) => r.get()?,
                None => runner.get()?,
            };
            scoring::score_seed(
                config,
                row_runner,
                vocab,
                eval,
                row_trained,
                row_seed,
                progress,
                studies()?.0,
            )
        };
        let part = format!("seed-{s}");
        let key = cache.key(
            &part,
            row_seed,
            &row_trained.adapter_keys,
            serde_json::json!({ "seed_queries": seed_queries }),
            eval,
        )?;
        let (main, studied) = match cache.get::<ScoredSeed>(&part, &key)? {
            Some(hit) => {
                if verify_cache && s == 0 {
                    scored_check = Some(verify_scored_seed(&hit, score()?)?);
                    if trained.validation_cached {
                        let n = trained.members.len();
                        validation_check = Some(adapters::verify_validation(
                            config,
                            "seed row 0's members",
                            &trained.members,
                            &trained.adapter_keys[..n],
                            &data.validation,
                        )?);
                    }
                }
                scored_parts.push(ScoredPart {
                    part: format!("seed row {s}"),
                    cached: true,
                    seconds: hit.seconds,
                    commit: hit.commit,
                });
                hit.value
            }
            None => {
                let t = Instant::now();
                let scored = score()?;
                let seconds = t.elapsed().as_secs_f64();
                cache.put(&part, &key, &scored, seconds)?;
                scored_parts.push(ScoredPart {
                    part: format!("seed row {s}"),
                    cached: false,
                    seconds,
                    commit: None,
                });
                scored
            }
        };
        seeds.push(main);
        study_seeds.push(studied);
    }
    let mut studies = studies::summarise_studies(&study_keys, &study_seeds)?;
    if row_training_seconds > 0.0 {
        phases.push((
            format!(
                "training of seed rows 1–{} (their own members and DP-SGD models{})",
                seeds.len() - 1,
                if all_cached { ", from the cache" } else { "" }
            ),
            row_training_seconds,
        ));
    }
    phases.push((
        format!(
            "scoring ({} seeds, {} from the cache)",
            seeds.len(),
            scored_parts.iter().filter(|p| p.cached).count()
        ),
        t2.elapsed().as_secs_f64() - row_training_seconds,
    ));
    let long_deployment = if data.long.is_empty() {
        None
    } else {
        let t = Instant::now();
        let key = cache.key(
            "long",
            config.seed ^ LONG_DEPLOYMENT_KEY,
            &trained.adapter_keys,
            serde_json::json!({ "long_queries": config.long_queries }),
            &data.long,
        )?;
        let (d, part) = match cache.get::<long::LongDeployment>("long", &key)? {
            Some(hit) => (
                hit.value,
                ScoredPart {
                    part: "long deployment".into(),
                    cached: true,
                    seconds: hit.seconds,
                    commit: hit.commit,
                },
            ),
            None => {
                let (runner, vocab) = runner.get()?;
                let d =
                    score_long_deployment(config, runner, vocab, &data.long, &trained, progress)?;
                let seconds = t.elapsed().as_secs_f64();
                cache.put("long", &key, &d, seconds)?;
                let part = ScoredPart {
                    part: "long deployment".into(),
                    cached: false,
                    seconds,
                    commit: None,
                };
                (d, part)
            }
        };
        phases.push((
            format!(
                "long deployment ({} queries{})",
                d.queries,
                if part.cached { ", from the cache" } else { "" }
            ),
            t.elapsed().as_secs_f64(),
        ));
        scored_parts.push(part);
        Some(d)
    };
    drop(runner);
    let canary = match &config.canary {
        Some(plan) => {
            let t3 = Instant::now();
            let (audit, part) = canary_part(config, plan, &tokenizer, &data, &cache, progress)?;
            phases.push((
                format!(
                    "canary audit{}",
                    if part.cached { " (from the cache)" } else { "" }
                ),
                t3.elapsed().as_secs_f64(),
            ));
            scored_parts.push(part);
            Some(audit)
        }
        None => None,
    };
    if let Some(plan) = &config.studies {
        for &n in &plan.members {
            let t = Instant::now();
            let r = run(&studies::members_config(config, plan, n), progress)?;
            studies.push(studies::members_row(&r)?);
            reused_seconds += r.reused_training_seconds;
            scored_parts.extend(r.scored_parts.into_iter().map(|p| ScoredPart {
                part: format!("ablation N = {n}: {}", p.part),
                ..p
            }));
            phases.push((
                format!("ablation run at N = {n}"),
                t.elapsed().as_secs_f64(),
            ));
        }
    }
    let summary = summarize(&seeds)?;
    Ok(ExperimentResults {
        config: config.clone(),
        unit: data.unit.describe(),
        units: data.units,
        held_out_plays: data.held_out_plays.clone(),
        member_blocks: data.members.iter().map(Vec::len).collect(),
        member_steps: trained.member_steps.clone(),
        validation: trained.validation.clone(),
        members_cached: all_cached,
        reused_training_seconds: reused_seconds,
        member_lr_sweep,
        dp_sgd_sweep: trained.dp_sgd_sweep.clone(),
        dp_sgd: trained.dp_sgd.iter().map(|(r, _)| r.clone()).collect(),
        seeds,
        summary,
        phases,
        canary,
        long_deployment,
        studies,
        scored_parts,
        scored_check,
        validation_check,
        adapters_read: adapters::adapters_read() - read_before,
        adapters_trained: adapters::adapters_trained() - trained_before,
    })
}

/// The canary audit: its members trained or found in the cache, then its
/// scoring read from the cache when an earlier run made it under the same key
/// (the audit's plan, its members' cache keys, the canary tokens it scores),
/// else computed (its members read) and kept.
fn canary_part(
    config: &ExperimentConfig,
    plan: &canary::CanaryPlan,
    tokenizer: &Tokenizer,
    data: &ExperimentData,
    cache: &scored_cache::ScoredCache,
    progress: bool,
) -> Result<(canary::CanaryAudit, ScoredPart), BenchError> {
    let members = canary::audit_members(config, plan, tokenizer, data, progress)?;
    let key = cache.key(
        "canary",
        config.seed,
        &members.trained.adapter_keys,
        serde_json::json!({ "canary": plan }),
        &members.scored_tokens(),
    )?;
    let part = |cached, seconds, commit| ScoredPart {
        part: "canary audit".into(),
        cached,
        seconds,
        commit,
    };
    if let Some(hit) = cache.get::<canary::CanaryAudit>("canary", &key)? {
        return Ok((hit.value, part(true, hit.seconds, hit.commit)));
    }
    let t = Instant::now();
    let audit = members.score(config, plan)?;
    let seconds = t.elapsed().as_secs_f64();
    cache.put("canary", &key, &audit, seconds)?;
    Ok((audit, part(false, seconds, None)))
}

/// `--verify-cache` for the scored parts: `again`, seed row 0 scored now, must
/// equal its cache entry `hit` bit for bit (the seconds each mechanism took
/// aside). Returns what it found; an error when they differ on the kind of
/// machine that made the entry (elsewhere the difference is stated:
/// [`crate::run_info::machine_difference`]).
fn verify_scored_seed(
    hit: &scored_cache::Cached<ScoredSeed>,
    again: ScoredSeed,
) -> Result<String, BenchError> {
    let untimed = |scored: &ScoredSeed| {
        let mut scored = scored.clone();
        for r in scored.0.iter_mut().chain(scored.1.iter_mut()) {
            r.seconds = 0.0;
        }
        scored_cache::encode(&scored)
    };
    let made_by = hit.commit.as_deref().unwrap_or("an unrecorded commit");
    let rows = again.0.len() + again.1.len();
    if untimed(&hit.value)? != untimed(&again)? {
        if let Some(elsewhere) =
            crate::run_info::machine_difference(hit.machine.as_deref(), "scored seed row 0")
        {
            return Ok(format!("{elsewhere} (made by {made_by})"));
        }
        return Err(BenchError::Config(format!(
            "--verify-cache: scored seed row 0 recomputed differs from its cache entry (made \
             by {made_by}): the cache holds results its key no longer describes (bump \
             RESULTS_VERSION in bench/src/cache_key.rs)"
        )));
    }
    Ok(format!(
        "scored seed row 0 recomputed ({rows} rows): bit for bit equal to its cache entry \
         (made by {made_by})"
    ))
}

/// Scores the long deployment: the public model, the non-private ensemble,
/// PMixED, AdaPMixED and SubMix at the largest target ε, calibrated to all its
/// queries, and the DP-SGD models; randomness from a seed apart from every
/// repetition's.
fn score_long_deployment(
    config: &ExperimentConfig,
    runner: &EnsembleRunner<Backend, Model<Backend>>,
    vocab: usize,
    blocks: &[Vec<u32>],
    trained: &TrainedMembers,
    progress: bool,
) -> Result<long::LongDeployment, BenchError> {
    let top = config.largest_epsilon();
    let long_config = ExperimentConfig {
        epsilons: vec![top],
        prediction_baselines: false,
        ..config.clone()
    };
    let mut results = score_mechanisms(
        &long_config,
        runner,
        vocab,
        blocks,
        trained,
        config.seed ^ LONG_DEPLOYMENT_KEY,
        progress,
    )?;
    // Per-query traces of ~10⁵ queries stay out of the JSON; the chunks keep the shape.
    for r in &mut results {
        r.spent_trace.clear();
        r.lambda_trace.clear();
        r.greedy_hits.clear();
    }
    let block_queries: Vec<u64> = blocks.iter().map(|b| b.len() as u64 - 1).collect();
    long::LongDeployment::summarise(&results, &block_queries)
}

/// Keys the long deployment's randomness apart from the repetitions' seeds.
const LONG_DEPLOYMENT_KEY: u64 = 0x4c4f_4e47_4445_504c;

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
