//! [`MeanGradient`]: plain LoRA fine-tuning of one member on its part's
//! blocks ([`Trainer`]) — micro-batches drawn without replacement from a
//! seeded stream, their mean gradient accumulated, held-out evaluation with
//! patience and the best adapter kept.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use privmix_models::runtime::to_vec;
use privmix_models::{LanguageModel, ModelBackend};
use rand::seq::index;
use rand_chacha::ChaCha20Rng;
use serde_json::Value;

use super::checkpoint::{State, rng_from_state, rng_state};
use super::config::TrainConfig;
use super::error::TrainError;
use super::host::{Group, HostTrainable};
use super::loss::{check_blocks, mean_nll};
use super::params::LoraParams;
use super::report::{History, TrainReport};
use super::trainable::{Dropout, loss_and_gradient};
use super::trainer::{GradientRule, LoraTrainer, Schedule, Start};
use crate::lora::{LoraAdapter, LoraBase};

/// The plain gradient rule: each step the mean gradient of `grad_accum`
/// micro-batches of `batch_size` blocks, drawn without replacement from the
/// ChaCha20 stream seeded by [`TrainConfig::seed`] (after the adapter's
/// initialisation); held-out evaluation every `eval_every` steps with
/// patience. No privacy guarantee: the adapter is a function of the data.
pub struct MeanGradient {
    pub(crate) config: TrainConfig,
    pub(crate) held_out: Vec<Vec<u32>>,
    pub(crate) rng: ChaCha20Rng,
    pub(crate) history: History,
    pub(crate) best: Option<(usize, f64, LoraParams)>,
    pub(crate) bad_evals: usize,
    pub(crate) stopped_early: bool,
}

/// Fine-tunes one LoRA adapter by next-token cross-entropy on fixed-length
/// blocks with AdamW, a linear warmup/decay schedule, gradient accumulation,
/// held-out evaluation with patience, and checkpoints that resume to the
/// bit-identical trajectory (see [`LoraTrainer::save_checkpoint`]).
pub type Trainer<'m, B, M> = LoraTrainer<'m, B, M, MeanGradient>;

impl GradientRule for MeanGradient {
    type Step = f64;
    const WHAT: &'static str = "training";

    fn schedule(&self) -> Schedule {
        let c = &self.config;
        Schedule {
            learning_rate: c.learning_rate,
            warmup_steps: c.warmup_steps,
            total_steps: c.total_steps,
        }
    }

    fn fingerprint(&self) -> Value {
        self.config.fingerprint()
    }

    /// `grad_accum` micro-batches, gradients averaged, one AdamW update.
    fn take_step<'m, B, M>(t: &mut LoraTrainer<'m, B, M, Self>) -> Result<f64, TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        let (accum, len) = (t.rule.config.grad_accum, t.params.len());
        let mut grad = vec![0.0f32; len];
        let mut loss = 0.0f64;
        for micro in 0..accum {
            let (picked, dropout) = t.draw(micro);
            let blocks: Vec<&Vec<u32>> = picked.iter().map(|&i| &t.train[i]).collect();
            let (l, g) = t.loss_and_gradient(&blocks, Some(dropout))?;
            accumulate(&mut loss, &mut grad, l, &g, accum);
        }
        t.apply(loss, &grad)
    }

    /// The held-out evaluation and early stopping when due.
    fn after_step<'m, B, M>(t: &mut LoraTrainer<'m, B, M, Self>, _: &f64) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        let every = t.rule.config.eval_every;
        if every > 0
            && t.step.is_multiple_of(every)
            && let Some(e) = t.evaluate()?
        {
            t.rule.record_eval(t.step, &t.params, e);
        }
        Ok(())
    }

    fn stopped(&self) -> bool {
        self.stopped_early
    }

    fn message(&self, loss: &f64) -> String {
        match self.history.eval_loss.last() {
            Some((_, e)) => format!("loss {loss:.4} held-out {e:.4}"),
            None => format!("loss {loss:.4}"),
        }
    }

    /// The sampling stream, the losses, the best adapter (`best/`) and the
    /// early-stopping count.
    fn save<'m, B, M>(
        t: &LoraTrainer<'m, B, M, Self>,
        here: &Path,
        state: &mut State,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        let r = &t.rule;
        if let Some((_, _, p)) = &r.best {
            let best: LoraAdapter<B::InnerBackend> = p.to_adapter(&t.base, &t.device)?;
            best.save_peft(here.join("best"))?;
        }
        (state.rng_seed, state.rng_stream, state.rng_word_pos) = rng_state(&r.rng);
        state.history = r.history.clone();
        state.best_step = r.best.as_ref().map(|b| b.0);
        state.best_loss_bits = r.best.as_ref().map(|b| b.1.to_bits());
        state.bad_evals = r.bad_evals;
        state.stopped_early = r.stopped_early;
        Ok(())
    }

    fn restore<'m, B, M>(
        t: &mut LoraTrainer<'m, B, M, Self>,
        here: &Path,
        state: State,
        state_path: &Path,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    {
        t.rule.best = match (state.best_step, state.best_loss_bits) {
            (Some(s), Some(bits)) => Some((s, f64::from_bits(bits), t.load_params(here, "best")?)),
            (None, None) => None,
            _ => {
                return Err(TrainError::checkpoint(
                    state_path,
                    "best step without best loss",
                ));
            }
        };
        t.rule.rng = rng_from_state(&state, state_path)?;
        t.rule.history = state.history;
        t.rule.bad_evals = state.bad_evals;
        t.rule.stopped_early = state.stopped_early;
        Ok(())
    }
}

impl MeanGradient {
    fn record_eval(&mut self, step: usize, params: &LoraParams, loss: f64) {
        self.history.eval_loss.push((step, loss));
        let best = self.best.as_ref().map(|(_, b, _)| *b);
        match patience_verdict(best, self.bad_evals, self.config.patience, loss) {
            Verdict::Improved => {
                self.best = Some((step, loss, params.clone()));
                self.bad_evals = 0;
            }
            Verdict::NoBetter { stop } => {
                self.bad_evals += 1;
                self.stopped_early = stop;
            }
        }
    }
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
        let start = Start::new(model, &config.lora, config.adamw, config.seed)?;
        let (every, progress) = (config.checkpoint_every, config.progress);
        let rule = MeanGradient {
            held_out,
            rng: start.seeded.clone(),
            history: History::default(),
            best: None,
            bad_evals: 0,
            stopped_early: false,
            config,
        };
        Ok(Self::from_start(model, train, start, rule)
            .with_checkpoint_every(every)
            .with_progress(progress))
    }

    /// A trainer restored from the checkpoint `dir/latest` points to, for the
    /// same model, data and configuration (a different configuration is a
    /// [`TrainError::Checkpoint`]).
    pub fn resume(
        model: &'m M,
        train: Vec<Vec<u32>>,
        held_out: Vec<Vec<u32>>,
        config: TrainConfig,
        dir: impl AsRef<Path>,
    ) -> Result<Self, TrainError> {
        Self::new(model, train, held_out, config)?.restore_from(dir.as_ref())
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.rule.config
    }

    /// The adapter with the best held-out loss so far (the current one when
    /// nothing was evaluated).
    pub fn best_adapter<C: burn::tensor::backend::Backend<Device = B::Device>>(
        &self,
    ) -> Result<LoraAdapter<C>, TrainError> {
        match &self.rule.best {
            Some((_, _, p)) => p.to_adapter(&self.base, &self.device),
            None => self.adapter(),
        }
    }

    /// Micro-batch `micro` of the current step: the training blocks drawn
    /// (without replacement) from the ChaCha20 stream, and the dropout pass.
    pub(crate) fn draw(&mut self, micro: usize) -> (Vec<usize>, Dropout) {
        let c = &self.rule.config;
        let take = c.batch_size.min(self.train.len());
        let picked = index::sample(&mut self.rule.rng, self.train.len(), take).into_vec();
        let dropout = Dropout {
            p: c.lora.lora_dropout,
            seed: c.seed,
            pass: (self.step * c.grad_accum + micro) as u64,
        };
        (picked, dropout)
    }

    /// Ends a step: the mean loss and gradient of its micro-batches checked
    /// finite, one AdamW update at the scheduled learning rate.
    pub(crate) fn apply(&mut self, loss: f64, grad: &[f32]) -> Result<f64, TrainError> {
        if !loss.is_finite() {
            return Err(TrainError::NonFinite("loss", self.step));
        }
        self.update(grad)?;
        self.rule.history.train_loss.push(loss);
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
        let c = &self.rule.config;
        let held_out = &self.rule.held_out;
        let n = held_out.len().min(c.eval_blocks);
        if n == 0 {
            return Ok(None);
        }
        let mut total = 0.0;
        if let Some(host) = self.host.get::<B, M>(self.model)? {
            for chunk in held_out[..n].chunks(c.batch_size) {
                let blocks: Vec<&Vec<u32>> = chunk.iter().collect();
                let groups = [Group::new(&self.params, blocks.len(), None)];
                let l = privmix_models::threads::on_hot_pool(|| host.losses(&blocks, &groups))?;
                total += l[0] * chunk.len() as f64;
            }
            return Ok(Some(total / n as f64));
        }
        let adapter: LoraAdapter<B> = self.params.to_adapter(&self.base, &self.device)?;
        for chunk in held_out[..n].chunks(c.batch_size) {
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
        self.run_until(self.rule.config.total_steps)
    }

    /// As [`Trainer::run`] but stops after step `until` (≤ `total_steps`), as
    /// an interrupted run would; the schedule still follows `total_steps`.
    pub fn run_until(&mut self, until: usize) -> Result<TrainReport, TrainError> {
        self.run_steps(until)?;
        Ok(self.report())
    }

    /// The report of the run so far.
    pub fn report(&self) -> TrainReport {
        let r = &self.rule;
        TrainReport {
            steps: self.step,
            history: r.history.clone(),
            best: r.best.as_ref().map(|(s, l, _)| (*s, *l)),
            stopped_early: r.stopped_early,
        }
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

    /// The seeded trajectory is the mean-gradient rule written out step by
    /// step from its parts, bit for bit: the adapter initialised from `seed`
    /// and the batches drawn from the same stream after it, each
    /// micro-batch's gradient (dropout pass `step · grad_accum + micro`)
    /// averaged over the step's micro-batches, one AdamW update on the
    /// schedule.
    #[test]
    fn the_trajectory_is_the_rule_step_by_step() {
        use burn::backend::{Autodiff, Flex};
        use privmix_models::{LoadOptions, Model};
        use rand::SeedableRng;
        use rand::seq::index;
        use rand_chacha::ChaCha20Rng;

        use crate::lora::{LoraBase, LoraConfig};
        use crate::train::trainable::{Dropout, loss_and_gradient};
        use crate::train::{AdamW, LoraParams, StepPath, TrainConfig, Trainer, linear_schedule};

        type AB = Autodiff<Flex>;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../models/tests/fixtures/hf/llama");
        let model: Model<AB> = Model::load(LoadOptions::path(dir, &Default::default())).unwrap();
        let mut lora = LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]).unwrap();
        lora.lora_dropout = 0.1;
        let mut c = TrainConfig::new(lora, 3, 5);
        c.learning_rate = 1e-2;
        c.warmup_steps = 1;
        c.batch_size = 2;
        c.grad_accum = 2;
        let data: Vec<Vec<u32>> = (0..5u32)
            .map(|k| (0..8u32).map(|i| 10 + (k * 7 + i * 3) % 64).collect())
            .collect();
        let mut trainer = Trainer::<AB, _>::new(&model, data.clone(), Vec::new(), c.clone())
            .unwrap()
            .with_step_path(StepPath::Autodiff);
        trainer.run().unwrap();

        let base = model.base_shapes().unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(c.seed);
        let mut params = LoraParams::init(&c.lora, &base, &mut rng).unwrap();
        let mut opt = AdamW::new(c.adamw, params.len()).unwrap();
        for step in 0..c.total_steps {
            let mut grad = vec![0.0f32; params.len()];
            for micro in 0..c.grad_accum {
                let picked = index::sample(&mut rng, data.len(), c.batch_size).into_vec();
                let blocks: Vec<&Vec<u32>> = picked.iter().map(|&i| &data[i]).collect();
                let dropout = Dropout {
                    p: 0.1,
                    seed: c.seed,
                    pass: (step * c.grad_accum + micro) as u64,
                };
                let (_, g) =
                    loss_and_gradient(&model, &params, &blocks, Some(dropout), &Default::default())
                        .unwrap();
                for (acc, x) in grad.iter_mut().zip(&g) {
                    *acc += x / c.grad_accum as f32;
                }
            }
            let lr = linear_schedule(c.learning_rate, step, c.warmup_steps, c.total_steps);
            opt.step(params.values_mut(), &grad, lr).unwrap();
        }
        assert_eq!(trainer.params().values(), params.values());
    }
}
