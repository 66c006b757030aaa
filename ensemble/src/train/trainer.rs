//! `Trainer`: LoRA fine-tuning of one member on its part's blocks with burn
//! autodiff — base weights frozen, only the adapter's `A`/`B` train.

use std::io::IsTerminal;
use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_models::LanguageModel;
use privmix_models::runtime::to_vec;
use rand::SeedableRng;
use rand::seq::index;
use rand_chacha::ChaCha20Rng;

use super::adamw::{AdamW, linear_schedule};
use super::config::TrainConfig;
use super::error::TrainError;
use super::host::{Group, HostSlot, HostTrainable, StepPath};
use super::loss::{check_blocks, mean_nll};
use super::params::LoraParams;
use super::trainable::{Dropout, loss_and_gradient};
use crate::lora::{BaseShapes, LoraAdapter, LoraBase};
use privmix_models::ModelBackend;

/// Losses seen so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// Mean training loss of each optimizer step (nats per token).
    pub train_loss: Vec<f64>,
    /// `(step, held-out loss)` of each evaluation.
    pub eval_loss: Vec<(usize, f64)>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Optimizer steps done in all (resumed runs included).
    pub steps: usize,
    /// Loss history.
    pub history: History,
    /// The best held-out loss and its step.
    pub best: Option<(usize, f64)>,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
}

/// Fine-tunes one LoRA adapter by next-token cross-entropy on fixed-length
/// blocks (Hu et al. 2022), with AdamW, a linear warmup/decay schedule,
/// gradient accumulation, held-out evaluation with patience, and
/// checkpoints that resume to the bit-identical trajectory (see
/// [`Trainer::save_checkpoint`]).
pub struct Trainer<'m, B: AutodiffBackend, M: LanguageModel<B> + LoraBase> {
    pub(crate) model: &'m M,
    pub(crate) base: BaseShapes,
    pub(crate) config: TrainConfig,
    pub(crate) train: Vec<Vec<u32>>,
    pub(crate) held_out: Vec<Vec<u32>>,
    pub(crate) params: LoraParams,
    pub(crate) opt: AdamW,
    pub(crate) rng: ChaCha20Rng,
    pub(crate) step: usize,
    pub(crate) history: History,
    pub(crate) best: Option<(usize, f64, LoraParams)>,
    pub(crate) bad_evals: usize,
    pub(crate) stopped_early: bool,
    pub(crate) checkpoint_dir: Option<PathBuf>,
    pub(crate) progress_label: Option<String>,
    pub(crate) device: B::Device,
    /// The host step's copy of the model (see [`StepPath`]).
    pub(crate) host: HostSlot,
}

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    Trainer<'m, B, M>
{
    /// A fresh run: adapter initialised as PEFT does from the seed.
    ///
    /// Errors: bad configuration, no training block or blocks of unequal
    /// length ([`TrainError::BadData`]), a base without a LoRA site table.
    pub fn new(
        model: &'m M,
        train: Vec<Vec<u32>>,
        held_out: Vec<Vec<u32>>,
        config: TrainConfig,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        check_blocks(&train)?;
        if !held_out.is_empty() {
            check_blocks(&held_out)?;
        }
        let base = model.base_shapes()?;
        let mut rng = ChaCha20Rng::seed_from_u64(config.seed);
        let params = LoraParams::init(&config.lora, &base, &mut rng)?;
        let opt = AdamW::new(config.adamw, params.len())?;
        Ok(Self {
            model,
            base,
            train,
            held_out,
            params,
            opt,
            rng,
            step: 0,
            history: History::default(),
            best: None,
            bad_evals: 0,
            stopped_early: false,
            checkpoint_dir: None,
            progress_label: None,
            device: model.device(),
            host: HostSlot::default(),
            config,
        })
    }

    /// Computes losses and gradients on `path` ([`StepPath::Fastest`] by
    /// default: the host step where the model allows it). Both paths compute
    /// the same function; the trajectory differs by f32 rounding only.
    pub fn with_step_path(mut self, path: StepPath) -> Self {
        self.host = HostSlot::new(path);
        self
    }

    /// Whether the steps run the host step (building its copy of the
    /// model's weights on the first call) rather than burn autodiff.
    pub fn uses_host_step(&self) -> Result<bool, TrainError> {
        Ok(self.host.get::<B, M>(self.model)?.is_some())
    }

    /// Saves checkpoints into `dir` during [`Trainer::run`] (every
    /// `checkpoint_every` steps, and at the end).
    pub fn with_checkpoints(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoint_dir = Some(dir.into());
        self
    }

    /// Names the run on its progress bar (e.g. the member), shown before the bar.
    pub fn with_progress_label(mut self, label: impl Into<String>) -> Self {
        self.progress_label = Some(label.into());
        self
    }

    /// Optimizer steps done.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// The current parameters.
    pub fn params(&self) -> &LoraParams {
        &self.params
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The current adapter, on backend `C`.
    pub fn adapter<C: burn::tensor::backend::Backend<Device = B::Device>>(
        &self,
    ) -> Result<LoraAdapter<C>, TrainError> {
        self.params.to_adapter(&self.base, &self.device)
    }

    /// The adapter with the best held-out loss so far (the current one when
    /// nothing was evaluated).
    pub fn best_adapter<C: burn::tensor::backend::Backend<Device = B::Device>>(
        &self,
    ) -> Result<LoraAdapter<C>, TrainError> {
        match &self.best {
            Some((_, _, p)) => p.to_adapter(&self.base, &self.device),
            None => self.adapter(),
        }
    }

    /// One optimizer step: `grad_accum` micro-batches of `batch_size` blocks
    /// drawn from the ChaCha20 stream, gradients averaged, one AdamW update
    /// at the scheduled learning rate. Returns the mean training loss.
    pub fn step(&mut self) -> Result<f64, TrainError> {
        let c = &self.config;
        let (accum, len) = (c.grad_accum, self.params.len());
        let mut grad = vec![0.0f32; len];
        let mut loss = 0.0f64;
        for micro in 0..accum {
            let (picked, dropout) = self.draw(micro);
            let blocks: Vec<&Vec<u32>> = picked.iter().map(|&i| &self.train[i]).collect();
            let (l, g) = self.loss_and_gradient(&blocks, Some(dropout))?;
            accumulate(&mut loss, &mut grad, l, &g, accum);
        }
        self.apply(loss, &grad)
    }

    /// Micro-batch `micro` of the current step: the training blocks drawn
    /// (without replacement) from the ChaCha20 stream, and the dropout pass.
    pub(crate) fn draw(&mut self, micro: usize) -> (Vec<usize>, Dropout) {
        let c = &self.config;
        let take = c.batch_size.min(self.train.len());
        let picked = index::sample(&mut self.rng, self.train.len(), take).into_vec();
        let dropout = Dropout {
            p: c.lora.lora_dropout,
            seed: c.seed,
            pass: (self.step * c.grad_accum + micro) as u64,
        };
        (picked, dropout)
    }

    /// Training block `i`.
    pub(crate) fn train_block(&self, i: usize) -> &Vec<u32> {
        &self.train[i]
    }

    /// Ends a step: the mean loss and gradient of its micro-batches checked
    /// finite, one AdamW update at the scheduled learning rate.
    pub(crate) fn apply(&mut self, loss: f64, grad: &[f32]) -> Result<f64, TrainError> {
        let c = &self.config;
        let lr = linear_schedule(c.learning_rate, self.step, c.warmup_steps, c.total_steps);
        if !loss.is_finite() {
            return Err(TrainError::NonFinite("loss", self.step));
        }
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(TrainError::NonFinite("gradient", self.step));
        }
        self.opt.step(self.params.values_mut(), grad, lr)?;
        self.step += 1;
        self.history.train_loss.push(loss);
        Ok(loss)
    }

    /// Loss and flat gradient of the current parameters on `blocks`.
    pub(crate) fn loss_and_gradient(
        &self,
        blocks: &[&Vec<u32>],
        dropout: Option<Dropout>,
    ) -> Result<(f64, Vec<f32>), TrainError> {
        if let Some(host) = self.host.get::<B, M>(self.model)? {
            let groups = [Group::new(&self.params, blocks.len(), dropout)];
            let out = privmix_models::threads::on_hot_pool(|| {
                host.losses_and_gradients(blocks, &groups)
            })?;
            return out
                .into_iter()
                .next()
                .ok_or_else(|| TrainError::BadData("no block".into()));
        }
        loss_and_gradient(self.model, &self.params, blocks, dropout, &self.device)
    }

    /// Mean next-token loss of the current adapter (no dropout) on the first
    /// `eval_blocks` held-out blocks, in batches of `batch_size`; `None`
    /// without held-out blocks.
    pub fn evaluate(&self) -> Result<Option<f64>, TrainError> {
        let n = self.held_out.len().min(self.config.eval_blocks);
        if n == 0 {
            return Ok(None);
        }
        let mut total = 0.0;
        if let Some(host) = self.host.get::<B, M>(self.model)? {
            for chunk in self.held_out[..n].chunks(self.config.batch_size) {
                let blocks: Vec<&Vec<u32>> = chunk.iter().collect();
                let groups = [Group::new(&self.params, blocks.len(), None)];
                let l = privmix_models::threads::on_hot_pool(|| host.losses(&blocks, &groups))?;
                total += l[0] * chunk.len() as f64;
            }
            return Ok(Some(total / n as f64));
        }
        let adapter: LoraAdapter<B> = self.params.to_adapter(&self.base, &self.device)?;
        for chunk in self.held_out[..n].chunks(self.config.batch_size) {
            let blocks: Vec<&Vec<u32>> = chunk.iter().collect();
            let l = mean_nll(self.model, &blocks, Some(&adapter))?;
            total += f64::from(to_vec(l)?[0]) * chunk.len() as f64;
        }
        Ok(Some(total / n as f64))
    }

    /// Runs to `total_steps`, or until early stopping: every `eval_every`
    /// steps the held-out loss is measured; a new best is kept (see
    /// [`Trainer::best_adapter`]), and `patience` evaluations in a row
    /// without one stop the run.
    pub fn run(&mut self) -> Result<TrainReport, TrainError> {
        self.run_until(self.config.total_steps)
    }

    /// As [`Trainer::run`] but stops after step `until` (≤ `total_steps`), as
    /// an interrupted run would; the schedule still follows `total_steps`.
    pub fn run_until(&mut self, until: usize) -> Result<TrainReport, TrainError> {
        let until = until.min(self.config.total_steps);
        let bar = self.progress_bar();
        while self.step < until && !self.stopped_early {
            let loss = self.step()?;
            self.after_step(loss, &bar)?;
        }
        bar.finish_and_clear();
        self.finish()
    }

    /// Whether the run still has a step to take before step `until`.
    pub(crate) fn wants_step(&self, until: usize) -> bool {
        self.step < until.min(self.config.total_steps) && !self.stopped_early
    }

    /// After a step of loss `loss`: the held-out evaluation and early
    /// stopping when due, the progress bar, the periodic checkpoint.
    pub(crate) fn after_step(&mut self, loss: f64, bar: &ProgressBar) -> Result<(), TrainError> {
        let c = &self.config;
        if c.eval_every > 0
            && self.step.is_multiple_of(c.eval_every)
            && let Some(e) = self.evaluate()?
        {
            self.record_eval(e);
        }
        bar.set_position(self.step as u64);
        bar.set_message(match self.history.eval_loss.last() {
            Some((_, e)) => format!("loss {loss:.4} held-out {e:.4}"),
            None => format!("loss {loss:.4}"),
        });
        if let Some(dir) = &self.checkpoint_dir
            && self.config.checkpoint_every > 0
            && self.step.is_multiple_of(self.config.checkpoint_every)
        {
            self.save_checkpoint(dir.clone())?;
        }
        Ok(())
    }

    /// Saves the closing checkpoint of a run (when a folder is set).
    pub(crate) fn finish(&self) -> Result<TrainReport, TrainError> {
        if let Some(dir) = &self.checkpoint_dir {
            self.save_checkpoint(dir.clone())?;
        }
        Ok(self.report())
    }

    fn record_eval(&mut self, loss: f64) {
        self.history.eval_loss.push((self.step, loss));
        let best = self.best.as_ref().map(|(_, b, _)| *b);
        match patience_verdict(best, self.bad_evals, self.config.patience, loss) {
            Verdict::Improved => {
                self.best = Some((self.step, loss, self.params.clone()));
                self.bad_evals = 0;
            }
            Verdict::NoBetter { stop } => {
                self.bad_evals += 1;
                self.stopped_early = stop;
            }
        }
    }

    /// The report of the run so far.
    pub fn report(&self) -> TrainReport {
        TrainReport {
            steps: self.step,
            history: self.history.clone(),
            best: self.best.as_ref().map(|(s, l, _)| (*s, *l)),
            stopped_early: self.stopped_early,
        }
    }

    pub(crate) fn progress_bar(&self) -> ProgressBar {
        let bar = ProgressBar::new(self.config.total_steps as u64);
        if self.config.progress && std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix}{bar:40} {pos}/{len} {elapsed_precise} eta {eta} {msg}",
            ) {
                bar.set_style(style);
            }
            if let Some(label) = &self.progress_label {
                bar.set_prefix(format!("{label} "));
            }
        } else {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_position(self.step as u64);
        bar
    }
}

/// Adds micro-batch loss `l` and gradient `g` into the step's means over
/// `accum` micro-batches.
pub(crate) fn accumulate(loss: &mut f64, grad: &mut [f32], l: f64, g: &[f32], accum: usize) {
    *loss += l / accum as f64;
    for (acc, x) in grad.iter_mut().zip(g) {
        *acc += x / accum as f32;
    }
}

/// What one held-out evaluation means for early stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// A new best (strictly lower than every earlier loss).
    Improved,
    /// Not better; `stop` when this makes `patience` such evaluations in a row.
    NoBetter {
        /// Whether to stop.
        stop: bool,
    },
}

/// Early stopping on held-out loss with patience (`bad_so_far` evaluations
/// in a row already without a new best). A NaN loss is never an improvement.
fn patience_verdict(
    best: Option<f64>,
    bad_so_far: usize,
    patience: Option<usize>,
    loss: f64,
) -> Verdict {
    if best.is_none_or(|b| loss < b) && !loss.is_nan() {
        Verdict::Improved
    } else {
        Verdict::NoBetter {
            stop: patience.is_some_and(|p| bad_so_far + 1 >= p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_counts_evaluations_without_a_new_best() {
        let mut best = None;
        let mut bad = 0;
        let mut stops = Vec::new();
        for (i, loss) in [3.0, 2.0, 2.5, 2.0, 1.0, 1.5, 1.2, 1.1]
            .into_iter()
            .enumerate()
        {
            match patience_verdict(best, bad, Some(3), loss) {
                Verdict::Improved => {
                    best = Some(loss);
                    bad = 0;
                }
                Verdict::NoBetter { stop } => {
                    bad += 1;
                    if stop {
                        stops.push(i);
                    }
                }
            }
        }
        // 2.5 and 2.0 do not beat 2.0; 1.5, 1.2, 1.1 do not beat 1.0: the third stops.
        assert_eq!(stops, vec![7]);
        assert_eq!(best, Some(1.0));
        assert_eq!(
            patience_verdict(Some(1.0), 0, None, 5.0),
            Verdict::NoBetter { stop: false }
        );
        assert_eq!(
            patience_verdict(None, 0, Some(1), f64::NAN),
            Verdict::NoBetter { stop: true }
        );
    }
}
