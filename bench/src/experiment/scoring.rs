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
use super::members::TrainedMembers;
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

/// A contender of a study ([`super::studies`]): it answers the seed's first
/// `limit` queries only.
pub(crate) struct StudyContender {
    /// Queries it answers, from the seed's first.
    pub limit: u64,
    /// The mechanism with its own account.
    pub contender: Contender,
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
    let mut dp_nll = vec![(0.0f64, 0.0f64, Vec::new(), Vec::new()); dp];
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
            let ensemble = Ensemble::renew_or_new(
                last.take(),
                Rows::LogProbF32(&flat[..v]),
                Rows::LogProbF32(&flat[v..(n + 1) * v]),
            )?;
            let target = block[i + 1] as usize;
            for c in &mut contenders {
                c.observe(&ensemble, target, &mut rng)?;
            }
            for s in &mut studies {
                if s.contender.queries() < s.limit {
                    s.contender.observe(&ensemble, target, &mut study_rng)?;
                    if s.contender.queries() == s.limit || i + 1 == steps.len() {
                        s.contender.end_block();
                    }
                }
            }
            last = Some(ensemble);
            for (k, (nll, total, _, greedy)) in dp_nll.iter_mut().enumerate() {
                let row = &flat[(n + 1 + k) * v..(n + 2 + k) * v];
                let lp = f64::from(row[target]);
                *nll -= lp;
                *total -= lp;
                let mode = row
                    .iter()
                    .enumerate()
                    .fold(0, |best, (j, &x)| if x > row[best] { j } else { best });
                greedy.push(mode == target);
            }
        }
        for c in &mut contenders {
            c.end_block();
        }
        for (nll, _, ppl, _) in &mut dp_nll {
            ppl.push((*nll / steps.len() as f64).exp());
            *nll = 0.0;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut results = contenders
        .into_iter()
        .map(Contender::finish)
        .collect::<Result<Vec<_>, _>>()?;
    let mut dp_nll = dp_nll.into_iter();
    for ((run, _), (_, total, ppl, greedy)) in trained.dp_sgd.iter().zip(dp_nll.by_ref()) {
        let parameters = format!(
            "lr {}, {} epochs = {} steps, q {:.4}, σ {:.4}, clip {}, LoRA as the members; ε by {}",
            run.learning_rate,
            run.epochs,
            run.steps,
            run.q,
            run.sigma,
            config.dp_sgd.as_ref().map_or(1.0, |d| d.clip),
            run.accountant
        );
        let privacy = (Some(run.target_epsilon), Some(run.epsilon));
        results.push(model_row(
            "dp-sgd", privacy, total, queries, ppl, greedy, parameters,
        ));
    }
    if let Some((_, total, ppl, greedy)) = dp_nll.next() {
        let plan = &config.training;
        let parameters = format!(
            "one LoRA on every training record, no privacy (rank {}, {} epochs, lr {})",
            plan.rank, plan.epochs, plan.learning_rate
        );
        results.push(model_row(
            FINE_TUNED,
            (None, None),
            total,
            queries,
            ppl,
            greedy,
            parameters,
        ));
    }
    let studied = studies
        .into_iter()
        .map(|s| s.contender.finish())
        .collect::<Result<Vec<_>, _>>()?;
    Ok((results, studied))
}

/// The row of a model scored directly (a DP-SGD model, the fine-tuned one): every query
/// answered by it, its NLL summed in `total`; `privacy` is its target and spent ε.
fn model_row(
    mechanism: &str,
    privacy: (Option<f64>, Option<f64>),
    total: f64,
    queries: u64,
    block_perplexities: Vec<f64>,
    greedy_hits: Vec<bool>,
    parameters: String,
) -> MechanismResult {
    MechanismResult {
        mechanism: mechanism.into(),
        target_epsilon: privacy.0,
        perplexity: (total / queries as f64).exp(),
        block_perplexities,
        greedy_hits,
        screening_epsilon: None,
        queries,
        private_answers: queries,
        screened: 0,
        stopped: 0,
        spent_epsilon: privacy.1,
        spent_trace: Vec::new(),
        lambda_trace: Vec::new(),
        parameters,
        seconds: 0.0,
    }
}

/// The row of the non-private model fine-tuned on every training record.
pub const FINE_TUNED: &str = "fine-tuned";

/// Keys the studies' randomness apart from the seed's main stream.
const STUDY_KEY: u64 = 0x5354_5544_4945_5321;
