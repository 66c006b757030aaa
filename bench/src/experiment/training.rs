//! What each seed row is trained with: the members' learning rate tuned over
//! a grid (the DP-SGD sweep's, so neither side gets more tuning), and, when
//! the plan asks for training variance, each seed row's own members, DP-SGD
//! models and fine-tuned model.

use crate::Backend;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::{LanguageModel, LoadOptions, Model};

use super::adapters::load_all;
use super::config::ExperimentConfig;
use super::data::ExperimentData;
use super::members::{TrainedMembers, train_members};
use crate::error::BenchError;

/// Training seeds of consecutive seed rows lie this far apart (members take
/// `seed + i`, DP-SGD `seed + 1000`, the fine-tuned model `seed + 2000`).
pub const SEED_ROW_STRIDE: u64 = 10_000;

/// The members' learning rates tried and the mean validation loss of each
/// (nats per token), in the order tried.
pub type LearningRateSweep = Vec<(f64, f64)>;

/// Seed row 0's training: the members fine-tuned at each of
/// `config.member_learning_rates` (cached like any member), the rate with the
/// lowest mean validation loss chosen, then everything trained with it.
/// Returns the configuration with the chosen rate, its training, and the sweep
/// (empty where there was no grid).
pub fn tune_and_train(
    config: &ExperimentConfig,
    data: &ExperimentData,
    progress: bool,
) -> Result<(ExperimentConfig, TrainedMembers, LearningRateSweep), BenchError> {
    let mut chosen = config.clone();
    let mut sweep = Vec::new();
    // What the trials read from earlier runs' caches, and whether all of it.
    let (mut reused, mut cached) = (0.0, true);
    for &lr in &config.member_learning_rates {
        let mut trial = config.clone();
        trial.training.learning_rate = lr;
        trial.dp_sgd = None;
        trial.fine_tuned = false;
        let trained = train_members(&trial, data, progress)?;
        reused += trained.reused_seconds;
        cached &= trained.cached;
        let losses = &trained.validation.1;
        sweep.push((lr, losses.iter().sum::<f64>() / losses.len().max(1) as f64));
    }
    if let Some(&(lr, _)) = sweep.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        chosen.training.learning_rate = lr;
    }
    let mut trained = train_members(&chosen, data, progress)?;
    if !sweep.is_empty() {
        // The chosen members are the sweep's, trained or read above: counted
        // there, not again as work of an earlier run.
        trained.reused_seconds += reused - trained.members_reused_seconds;
        trained.members_reused_seconds = 0.0;
        trained.cached &= cached;
    }
    Ok((chosen, trained, sweep))
}

/// The configuration of seed row `row` ≥ 1 when each row trains its own
/// models: its training seeds moved by `row ×` [`SEED_ROW_STRIDE`], DP-SGD
/// trained at row 0's chosen learning rate and epochs only (the sweep is not
/// repeated).
pub fn seed_row_config(
    chosen: &ExperimentConfig,
    row: usize,
    row0: &TrainedMembers,
) -> ExperimentConfig {
    let mut c = chosen.clone();
    c.training_seed_offset = row as u64 * SEED_ROW_STRIDE;
    if let (Some(dp), Some((run, _))) = (c.dp_sgd.as_mut(), row0.dp_sgd.first()) {
        dp.learning_rates = vec![run.learning_rate];
        dp.epochs = vec![run.epochs];
    }
    c
}

/// The runner over the public model and every adapter of `trained` (those
/// cached read now), in the order scoring reads them: members, DP-SGD models,
/// the fine-tuned model.
pub fn runner_for(
    config: &ExperimentConfig,
    trained: &TrainedMembers,
) -> Result<EnsembleRunner<Backend, Model<Backend>>, BenchError> {
    let model = Model::<Backend>::load(LoadOptions::path(&config.model, &Default::default()))?;
    let mut adapters = trained.members.clone();
    adapters.extend(trained.dp_sgd.iter().map(|(_, a)| a.clone()));
    adapters.extend(trained.fine_tuned.iter().cloned());
    Ok(EnsembleRunner::new(model, &load_all(&adapters)?)?)
}

/// The runner over a training's adapters, built (its cached adapters read)
/// when a part that is not cached first needs it, so that a run whose parts
/// are all cached reads no adapter.
pub(crate) struct LazyRunner<'a> {
    config: &'a ExperimentConfig,
    trained: &'a TrainedMembers,
    /// The tokenizer's vocabulary, which the model's must hold.
    tokenizer_vocab: usize,
    runner: Option<EnsembleRunner<Backend, Model<Backend>>>,
}

impl<'a> LazyRunner<'a> {
    /// The runner of `trained` (trained with `config`), not built yet.
    pub fn new(
        config: &'a ExperimentConfig,
        trained: &'a TrainedMembers,
        tokenizer_vocab: usize,
    ) -> Self {
        Self {
            config,
            trained,
            tokenizer_vocab,
            runner: None,
        }
    }

    /// The runner ([`runner_for`], built on the first call) and the model's
    /// vocabulary.
    ///
    /// Errors: an adapter or the model cannot be read; the tokenizer has more
    /// tokens than the model.
    pub fn get(&mut self) -> Result<(&EnsembleRunner<Backend, Model<Backend>>, usize), BenchError> {
        let runner = match self.runner.take() {
            Some(runner) => runner,
            None => {
                let runner = runner_for(self.config, self.trained)?;
                let vocab = runner.model().vocab_size();
                if self.tokenizer_vocab > vocab {
                    return Err(BenchError::Config(format!(
                        "the tokenizer has {} tokens, the model only {vocab}",
                        self.tokenizer_vocab,
                    )));
                }
                runner
            }
        };
        let runner = self.runner.insert(runner);
        let vocab = runner.model().vocab_size();
        Ok((runner, vocab))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Consecutive rows' training seeds (members up to N < 1000, DP-SGD at
    /// +1000, fine-tuned at +2000) never meet.
    #[test]
    fn seed_rows_train_apart() {
        let seeds = |row: u64| {
            let base = row * SEED_ROW_STRIDE;
            (base..base + 999).chain([base + 1000, base + 2000])
        };
        let row0: Vec<u64> = seeds(0).collect();
        assert!(seeds(1).all(|s| !row0.contains(&s)));
    }
}
