//! Teacher-forced perplexity of every mechanism on the held-out blocks.
//!
//! Convention of the PMixED, AdaPMixED and SubMix evaluations: every position of
//! a block is one query; the mechanism's output distribution given the true
//! prefix is evaluated at the true next token; perplexity is `exp(mean NLL)` per
//! block, then the mean over blocks. Each query is charged to the mechanism's
//! account exactly as if its token had been sampled and released
//! ([`privmix_mechanisms::EnsembleMechanism::release`]), in order, so a budget that runs out, a
//! an AdaPMixED screen or a member leaving its filter affect the later queries as when serving.

use crate::Backend;
use privmix_accountant::Orders;
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::{Ensemble, PrivacyRng, Rows};
use privmix_models::Model;

use super::config::ExperimentConfig;
pub use super::config::ScoringPlan;
pub use super::contenders::MechanismResult;
use super::contenders::{Contender, contenders};
use super::members::{DpSgdRun, TrainedMembers};
use crate::error::BenchError;

/// Scores every mechanism (and each DP-SGD model) on one seed's blocks:
/// fresh contenders calibrated to exactly these queries, randomness from
/// `seed`.
pub fn score_mechanisms(
    config: &ExperimentConfig,
    runner: &EnsembleRunner<Backend, Model<Backend>>,
    vocab: usize,
    eval: &[Vec<u32>],
    trained: &TrainedMembers,
    seed: u64,
    progress: bool,
) -> Result<Vec<MechanismResult>, BenchError> {
    let (results, _) = score_seed(
        config,
        runner,
        vocab,
        eval,
        trained,
        seed,
        progress,
        Vec::new(),
    )?;
    Ok(results)
}

/// A row of a study ([`super::studies`]): it answers the seed's first `limit`
/// queries only.
pub(crate) struct StudyContender {
    /// Queries it answers, from the seed's first.
    pub limit: u64,
    /// What answers them.
    pub scorer: StudyScorer,
}

/// What answers a study row's queries.
pub(crate) enum StudyScorer {
    /// A mechanism with its own account.
    Mechanism(Box<Contender>),
    /// The table's DP-SGD model trained at this target ε, read directly (it
    /// spends nothing per query: its ε was spent in training).
    DpSgd {
        /// The target ε of the model.
        target_epsilon: f64,
        /// Its NLL so far.
        score: ModelScore,
    },
}

impl StudyContender {
    /// Queries answered so far.
    fn answered(&self) -> u64 {
        match &self.scorer {
            StudyScorer::Mechanism(c) => c.queries(),
            StudyScorer::DpSgd { score, .. } => score.queries,
        }
    }

    fn end_block(&mut self) {
        match &mut self.scorer {
            StudyScorer::Mechanism(c) => c.end_block(),
            StudyScorer::DpSgd { score, .. } => score.end_block(),
        }
    }
}

/// The NLL of a model read directly (a DP-SGD model, the fine-tuned one) over
/// the queries it answered, per block and in all, with whether each query's
/// true token was its mode.
#[derive(Default)]
pub(crate) struct ModelScore {
    block_nll: f64,
    block_len: usize,
    total: f64,
    queries: u64,
    block_perplexities: Vec<f64>,
    greedy_hits: Vec<bool>,
}

impl ModelScore {
    /// The model's log-probabilities `row` at the query whose true token is `target`.
    fn observe(&mut self, row: &[f32], target: usize) {
        let lp = f64::from(row[target]);
        self.block_nll -= lp;
        self.total -= lp;
        self.block_len += 1;
        self.queries += 1;
        let mode = row
            .iter()
            .enumerate()
            .fold(0, |best, (j, &x)| if x > row[best] { j } else { best });
        self.greedy_hits.push(mode == target);
    }

    fn end_block(&mut self) {
        self.block_perplexities
            .push((self.block_nll / self.block_len as f64).exp());
        self.block_nll = 0.0;
        self.block_len = 0;
    }

    /// The row of the model named `mechanism`; `privacy` is its target and spent ε.
    fn finish(
        self,
        mechanism: &str,
        privacy: (Option<f64>, Option<f64>),
        parameters: String,
    ) -> MechanismResult {
        MechanismResult {
            mechanism: mechanism.into(),
            target_epsilon: privacy.0,
            perplexity: (self.total / self.queries as f64).exp(),
            block_perplexities: self.block_perplexities,
            greedy_hits: self.greedy_hits,
            screening_epsilon: None,
            queries: self.queries,
            private_answers: self.queries,
            screened: 0,
            stopped: 0,
            spent_epsilon: privacy.1,
            spent_trace: Vec::new(),
            lambda_trace: Vec::new(),
            parameters,
            seconds: 0.0,
        }
    }
}

/// The DP-SGD row's parameters.
fn dp_sgd_parameters(run: &DpSgdRun, config: &ExperimentConfig) -> String {
    format!(
        "lr {}, {} epochs = {} steps, q {:.4}, σ {:.4}, clip {}, LoRA as the members; ε by {}",
        run.learning_rate,
        run.epochs,
        run.steps,
        run.q,
        run.sigma,
        config.dp_sgd.as_ref().map_or(1.0, |d| d.clip),
        run.accountant
    )
}

/// [`score_mechanisms`], and beside it each study contender on the same
/// forwards (its randomness from its own stream, so the main results are those
/// of a run without studies); the studies' results in their order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn score_seed(
    config: &ExperimentConfig,
    runner: &EnsembleRunner<Backend, Model<Backend>>,
    vocab: usize,
    eval: &[Vec<u32>],
    trained: &TrainedMembers,
    seed: u64,
    progress: bool,
    mut studies: Vec<StudyContender>,
) -> Result<(Vec<MechanismResult>, Vec<MechanismResult>), BenchError> {
    let mut study_rng = PrivacyRng::from_seed(seed ^ STUDY_KEY);
    let n = config.members;
    // The adapters after the members: the DP-SGD models, then the fine-tuned one.
    let dp = trained.dp_sgd.len() + usize::from(trained.fine_tuned.is_some());
    if runner.num_members() != n + dp {
        return Err(BenchError::Config(format!(
            "the runner holds {} adapters, {n} members and {dp} DP-SGD and fine-tuned models \
             expected",
            runner.num_members()
        )));
    }
    let layout = RowLayout::public_and_members(n + dp);
    let queries: u64 = eval.iter().map(|b| b.len() as u64 - 1).sum();
    let orders = Orders::dp_accounting_default();
    let mut contenders = contenders(config, queries, vocab, config.prediction_baselines, &orders)?;
    // Each DP-SGD study row's model: its index among the DP-SGD models.
    let study_models = studies
        .iter()
        .map(|s| match &s.scorer {
            StudyScorer::Mechanism(_) => Ok(None),
            StudyScorer::DpSgd { target_epsilon, .. } => trained
                .dp_sgd
                .iter()
                .position(|(run, _)| run.target_epsilon == *target_epsilon)
                .map(Some)
                .ok_or_else(|| {
                    BenchError::Config(format!(
                        "a study row reads the DP-SGD model at ε {target_epsilon}, which was \
                         not trained"
                    ))
                }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut models: Vec<ModelScore> = (0..dp).map(|_| ModelScore::default()).collect();
    let mut rng = PrivacyRng::from_seed(seed);
    let bar = if progress {
        indicatif::ProgressBar::new(eval.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message(format!("scoring seed {seed}"));
    // The last position's ensemble, whose buffers the next one reuses.
    let mut last: Option<Ensemble> = None;
    for block in eval {
        let steps = runner.score_block_full(&layout, block)?;
        for (i, rows) in steps.iter().enumerate() {
            let v = rows.vocab();
            let flat = rows.as_flat();
            // Adapter k's row after the members (the DP-SGD models, then the fine-tuned one).
            let model_row = |k: usize| &flat[(n + 1 + k) * v..(n + 2 + k) * v];
            let ensemble = Ensemble::renew_or_new(
                last.take(),
                Rows::LogProbF32(&flat[..v]),
                Rows::LogProbF32(&flat[v..(n + 1) * v]),
            )?;
            let target = block[i + 1] as usize;
            for c in &mut contenders {
                c.observe(&ensemble, target, &mut rng)?;
            }
            for (s, model) in studies.iter_mut().zip(&study_models) {
                if s.answered() < s.limit {
                    match (&mut s.scorer, model) {
                        (StudyScorer::Mechanism(c), _) => {
                            c.observe(&ensemble, target, &mut study_rng)?;
                        }
                        (StudyScorer::DpSgd { score, .. }, Some(k)) => {
                            score.observe(model_row(*k), target);
                        }
                        (StudyScorer::DpSgd { .. }, None) => {}
                    }
                    if s.answered() == s.limit || i + 1 == steps.len() {
                        s.end_block();
                    }
                }
            }
            last = Some(ensemble);
            for (k, score) in models.iter_mut().enumerate() {
                score.observe(model_row(k), target);
            }
        }
        for c in &mut contenders {
            c.end_block();
        }
        for score in &mut models {
            score.end_block();
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut results = contenders
        .into_iter()
        .map(Contender::finish)
        .collect::<Result<Vec<_>, _>>()?;
    let mut models = models.into_iter();
    for ((run, _), score) in trained.dp_sgd.iter().zip(models.by_ref()) {
        let privacy = (Some(run.target_epsilon), Some(run.epsilon));
        results.push(score.finish("dp-sgd", privacy, dp_sgd_parameters(run, config)));
    }
    if let Some(score) = models.next() {
        let plan = &config.training;
        let parameters = format!(
            "one LoRA on every training record, no privacy (rank {}, {} epochs, lr {})",
            plan.rank, plan.epochs, plan.learning_rate
        );
        results.push(score.finish(FINE_TUNED, (None, None), parameters));
    }
    let studied = studies
        .into_iter()
        .zip(study_models)
        .map(|(s, model)| match (s.scorer, model) {
            (StudyScorer::Mechanism(c), _) => (*c).finish(),
            (StudyScorer::DpSgd { score, .. }, Some(k)) => {
                let run = &trained.dp_sgd[k].0;
                let privacy = (Some(run.target_epsilon), Some(run.epsilon));
                Ok(score.finish("dp-sgd", privacy, dp_sgd_parameters(run, config)))
            }
            (StudyScorer::DpSgd { .. }, None) => Err(BenchError::Config(
                "a DP-SGD study row without its model".into(),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((results, studied))
}

/// The row of the non-private model fine-tuned on every training record.
pub const FINE_TUNED: &str = "fine-tuned";

/// Keys the studies' randomness apart from the seed's main stream.
const STUDY_KEY: u64 = 0x5354_5544_4945_5321;
