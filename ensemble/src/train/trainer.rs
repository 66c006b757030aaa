//! [`LoraTrainer`]: the one LoRA fine-tuning loop, whose gradient rule is a
//! value — [`MeanGradient`](super::MeanGradient) (plain fine-tuning,
//! [`Trainer`](super::Trainer)) or [`DpSgd`](super::DpSgd) (clip each
//! example, add noise, charge the accountant; [`DpSgdTrainer`](super::DpSgdTrainer)).
//! Both share the base model, the adapter's parameters and their PEFT
//! extraction, AdamW on the linear warmup/decay schedule, the host or burn
//! autodiff step, the progress bar, `run`/`run_until` and one checkpoint
//! format (`checkpoint.rs`); the rule brings how a step's gradient is made
//! and what its own state is.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_models::{LanguageModel, ModelBackend};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde_json::Value;

use super::adamw::{AdamW, AdamWConfig, linear_schedule};
use super::checkpoint::{FORMAT, State, commit, read_latest, read_moments, write_moments};
use super::error::TrainError;
use super::host::{HostSlot, HostTrainable, StepPath};
use super::params::LoraParams;
use super::report::History;
use crate::lora::{BaseShapes, LoraAdapter, LoraBase, LoraConfig};

/// The learning-rate schedule of a run: linear warmup from 0 to the peak,
/// then linear decay to 0 at `total_steps` (see [`super::linear_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Warmup steps.
    pub warmup_steps: usize,
    /// Steps in all.
    pub total_steps: usize,
}

/// How a [`LoraTrainer`] turns training blocks into each step's gradient,
/// with the state that needs. Implemented by [`super::MeanGradient`] and
/// [`super::DpSgd`] only.
pub trait GradientRule: Sized {
    /// What one step reports.
    type Step;
    /// Names the rule's configuration in errors ("training", "DP-SGD").
    const WHAT: &'static str;
    /// The learning-rate schedule.
    fn schedule(&self) -> Schedule;
    /// Everything that decides the run (a checkpoint refuses to resume under
    /// another one).
    fn fingerprint(&self) -> Value;
    /// One step: draws the step's examples, computes its gradient and ends
    /// with the shared AdamW update.
    fn take_step<'m, B, M>(t: &mut LoraTrainer<'m, B, M, Self>) -> Result<Self::Step, TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>;
    /// After a step: what the rule does between steps (held-out evaluation
    /// and early stopping for the mean gradient).
    fn after_step<'m, B, M>(
        t: &mut LoraTrainer<'m, B, M, Self>,
        step: &Self::Step,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>;
    /// Whether the rule ended the run early.
    fn stopped(&self) -> bool;
    /// The progress bar's message after `step`.
    fn message(&self, step: &Self::Step) -> String;
    /// Writes the rule's own state into the checkpoint folder `here` and `state`.
    fn save<'m, B, M>(
        t: &LoraTrainer<'m, B, M, Self>,
        here: &Path,
        state: &mut State,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>;
    /// Restores the rule's own state from the checkpoint folder `here`
    /// (`state` read from `state_path`); the shared state is restored already.
    fn restore<'m, B, M>(
        t: &mut LoraTrainer<'m, B, M, Self>,
        here: &Path,
        state: State,
        state_path: &Path,
    ) -> Result<(), TrainError>
    where
        B: AutodiffBackend + ModelBackend,
        M: LanguageModel<B> + LoraBase + HostTrainable<B>;
}

/// Fine-tunes one LoRA adapter of a frozen base model (Hu et al. 2022,
/// "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685)
/// on fixed-length blocks with AdamW; each step's gradient comes from the
/// rule `R` (its guarantee, if any, is the rule's: see [`super::DpSgd`]).
pub struct LoraTrainer<'m, B: AutodiffBackend, M: LanguageModel<B> + LoraBase, R> {
    pub(crate) model: &'m M,
    pub(crate) base: BaseShapes,
    /// The training blocks (DP-SGD's examples).
    pub(crate) train: Vec<Vec<u32>>,
    pub(crate) params: LoraParams,
    pub(crate) opt: AdamW,
    pub(crate) step: usize,
    pub(crate) checkpoint_dir: Option<PathBuf>,
    pub(crate) checkpoint_every: usize,
    pub(crate) progress: bool,
    pub(crate) progress_label: Option<String>,
    pub(crate) device: B::Device,
    /// The host step's copy of the model (see [`StepPath`]).
    pub(crate) host: HostSlot,
    /// How each step's gradient is made, and its state.
    pub(crate) rule: R,
}

/// What a fresh run shares whatever its rule: the base's shapes, the
/// adapter initialised as PEFT does from `seed`, AdamW's zero state, and the
/// seeded generator after the initialisation (the mean gradient samples its
/// batches from it).
pub(crate) struct Start {
    pub(crate) base: BaseShapes,
    pub(crate) params: LoraParams,
    pub(crate) opt: AdamW,
    pub(crate) seeded: ChaCha20Rng,
}

impl Start {
    /// Initialises the adapter of `lora` on `model` from `seed`.
    pub(crate) fn new<B: AutodiffBackend, M: LanguageModel<B> + LoraBase>(
        model: &M,
        lora: &LoraConfig,
        adamw: AdamWConfig,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let base = model.base_shapes()?;
        let mut seeded = ChaCha20Rng::seed_from_u64(seed);
        let params = LoraParams::init(lora, &base, &mut seeded)?;
        let opt = AdamW::new(adamw, params.len())?;
        Ok(Self {
            base,
            params,
            opt,
            seeded,
        })
    }
}

impl<'m, B, M, R> LoraTrainer<'m, B, M, R>
where
    B: AutodiffBackend + ModelBackend,
    M: LanguageModel<B> + LoraBase + HostTrainable<B>,
    R: GradientRule,
{
    /// A fresh trainer of `rule` from `start`.
    pub(crate) fn from_start(model: &'m M, train: Vec<Vec<u32>>, start: Start, rule: R) -> Self {
        Self {
            model,
            base: start.base,
            train,
            params: start.params,
            opt: start.opt,
            step: 0,
            checkpoint_dir: None,
            checkpoint_every: 0,
            progress: false,
            progress_label: None,
            device: model.device(),
            host: HostSlot::default(),
            rule,
        }
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

    /// Saves checkpoints into `dir` during `run`/`run_until` (every
    /// `checkpoint_every` steps, and at the end).
    pub fn with_checkpoints(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoint_dir = Some(dir.into());
        self
    }

    /// Saves a checkpoint every `every` steps (0: only at the end) when a
    /// checkpoint folder is set.
    pub fn with_checkpoint_every(mut self, every: usize) -> Self {
        self.checkpoint_every = every;
        self
    }

    /// Shows a progress bar on a terminal (never drawn when stderr is not one).
    pub fn with_progress(mut self, show: bool) -> Self {
        self.progress = show;
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

    /// The current adapter, on backend `C`.
    pub fn adapter<C: burn::tensor::backend::Backend<Device = B::Device>>(
        &self,
    ) -> Result<LoraAdapter<C>, TrainError> {
        self.params.to_adapter(&self.base, &self.device)
    }

    /// One step of the rule (its draw, its gradient, one AdamW update).
    pub fn step(&mut self) -> Result<R::Step, TrainError> {
        R::take_step(self)
    }

    /// Ends a step: the gradient checked finite, one AdamW update at the
    /// scheduled learning rate.
    pub(crate) fn update(&mut self, grad: &[f32]) -> Result<(), TrainError> {
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(TrainError::NonFinite("gradient", self.step));
        }
        let s = self.rule.schedule();
        let lr = linear_schedule(s.learning_rate, self.step, s.warmup_steps, s.total_steps);
        self.opt.step(self.params.values_mut(), grad, lr)?;
        self.step += 1;
        Ok(())
    }

    /// Runs to step `until` (at most the schedule's `total_steps`, or until
    /// the rule stops early) as an interrupted run would, with the progress
    /// bar and the checkpoints; returns each step's record.
    pub(crate) fn run_steps(&mut self, until: usize) -> Result<Vec<R::Step>, TrainError> {
        let bar = self.progress_bar();
        let mut out = Vec::new();
        while self.wants_step(until) {
            let s = self.step()?;
            self.after_step(&s, &bar)?;
            out.push(s);
        }
        bar.finish_and_clear();
        self.finish()?;
        Ok(out)
    }

    /// Whether the run still has a step to take before step `until`.
    pub(crate) fn wants_step(&self, until: usize) -> bool {
        self.step < until.min(self.rule.schedule().total_steps) && !self.rule.stopped()
    }

    /// After step `s`: the rule's work between steps, the progress bar, the
    /// periodic checkpoint.
    pub(crate) fn after_step(&mut self, s: &R::Step, bar: &ProgressBar) -> Result<(), TrainError> {
        R::after_step(self, s)?;
        bar.set_position(self.step as u64);
        bar.set_message(self.rule.message(s));
        if let Some(dir) = &self.checkpoint_dir
            && self.checkpoint_every > 0
            && self.step.is_multiple_of(self.checkpoint_every)
        {
            self.save_checkpoint(dir.clone())?;
        }
        Ok(())
    }

    /// Saves the closing checkpoint of a run (when a folder is set).
    pub(crate) fn finish(&self) -> Result<(), TrainError> {
        if let Some(dir) = &self.checkpoint_dir {
            self.save_checkpoint(dir.clone())?;
        }
        Ok(())
    }

    pub(crate) fn progress_bar(&self) -> ProgressBar {
        let bar = ProgressBar::new(self.rule.schedule().total_steps as u64);
        if self.progress && std::io::stderr().is_terminal() {
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

    /// Writes a checkpoint of the current state into `dir` and returns the
    /// checkpoint's own folder: `dir/step-NNNNNNNN/{adapter/, best/,
    /// optimizer.safetensors, trainer.json}` and `dir/latest` naming the newest
    /// complete one (written last, by rename, so a crash mid-save leaves the
    /// previous checkpoint in force); older checkpoints there are removed.
    /// Everything the trajectory depends on is saved except what the rule
    /// keeps secret (DP-SGD's coins), so that a mean-gradient run interrupted
    /// and resumed gives bit-for-bit the adapter of an uninterrupted one with
    /// the same seed.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf, TrainError> {
        let dir = dir.as_ref();
        let here = dir.join(format!("step-{:08}", self.step));
        let io = |p: &Path, e: std::io::Error| TrainError::checkpoint(p, e);
        std::fs::create_dir_all(&here).map_err(|e| io(&here, e))?;
        let adapter: LoraAdapter<B::InnerBackend> =
            self.params.to_adapter(&self.base, &self.device)?;
        adapter.save_peft(here.join("adapter"))?;
        write_moments(&here, &self.opt.exp_avg, &self.opt.exp_avg_sq)?;
        let mut state = State {
            format: FORMAT,
            step: self.step,
            adam_t: self.opt.t,
            config: self.rule.fingerprint(),
            rng_seed: None,
            rng_stream: None,
            rng_word_pos: None,
            history: History::default(),
            best_step: None,
            best_loss_bits: None,
            bad_evals: 0,
            stopped_early: false,
        };
        R::save(self, &here, &mut state)?;
        commit(dir, &here, &state)?;
        Ok(here)
    }

    /// The adapter saved in the folder `name` of the checkpoint folder `here`.
    pub(crate) fn load_params(&self, here: &Path, name: &str) -> Result<LoraParams, TrainError> {
        let adapter: LoraAdapter<B::InnerBackend> =
            LoraAdapter::load_peft(here.join(name), &self.base, &self.device)?;
        LoraParams::from_adapter(&adapter, &self.base)
    }

    /// This fresh trainer moved to the checkpoint `dir/latest` names: the
    /// checkpoint must be of this format and of the same configuration
    /// fingerprint (otherwise a [`TrainError::Checkpoint`] says which), its
    /// step within the schedule and its adapter of this one's shape.
    pub(crate) fn restore_from(mut self, dir: &Path) -> Result<Self, TrainError> {
        let (here, state_path, state) = read_latest(dir)?;
        let bad = |m: String| Err(TrainError::checkpoint(&state_path, m));
        if state.format != FORMAT {
            return bad(format!("format {} (expected {FORMAT})", state.format));
        }
        if state.config != self.rule.fingerprint() {
            return bad(format!("saved under another {} configuration", R::WHAT));
        }
        let total = self.rule.schedule().total_steps;
        if state.step > total {
            return bad(format!(
                "step {} is past the run's {total} steps",
                state.step
            ));
        }
        let run_lora = self.params.config().clone();
        self.params = self.load_params(&here, "adapter")?;
        if self.params.config() != &run_lora {
            return bad("the adapter's configuration differs from the run's".into());
        }
        (self.opt.exp_avg, self.opt.exp_avg_sq) = read_moments(&here, self.params.len())?;
        self.opt.t = state.adam_t;
        self.step = state.step;
        R::restore(&mut self, &here, state, &state_path)?;
        Ok(self)
    }
}
