//! [`JointTrainer`]: N members fine-tuned together, each step one batched
//! forward and backward pass over the shared base in which every row goes
//! through its own member's factors (as the ensemble's decode step and
//! DP-SGD's per-example rows do).
//!
//! Each member keeps everything a [`Trainer`] keeps — its own training and
//! held-out blocks, adapter, AdamW moments, sampling stream, evaluations,
//! early stopping and checkpoints — and draws its micro-batches from its own
//! stream exactly as it would alone. The batched pass gives each member the
//! mean loss over its own rows and the gradient of its own factors only
//! (rows never mix: the frozen products act row by row, attention stays
//! inside a row, and each member's factor products read only its rows), so
//! a member's trajectory is the one it has trained alone, up to f32
//! rounding where its rows share a product with other members' rows.
//! Checkpoints are each member's own, in the format [`Trainer::resume`]
//! reads: a joint run interrupted and resumed member by member continues
//! where it stopped.

use std::io::IsTerminal;

use burn::tensor::backend::AutodiffBackend;
use indicatif::{MultiProgress, ProgressDrawTarget};
use privmix_models::LanguageModel;

use super::error::TrainError;
use super::host::{Group, HostSlot, HostTrainable};
use super::mean::{Trainer, accumulate};
use super::report::TrainReport;
use super::trainable::Dropout;
use crate::lora::LoraBase;
use privmix_models::ModelBackend;

/// Members trained together (see the module docs).
pub struct JointTrainer<'m, B: AutodiffBackend, M: LanguageModel<B> + LoraBase> {
    members: Vec<Trainer<'m, B, M>>,
    host: HostSlot,
}

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    JointTrainer<'m, B, M>
{
    /// The members (fresh or resumed [`Trainer`]s) of one base model, all
    /// with one adapter shape (rank, alpha, targets); they share the first
    /// member's step path and one host copy of the model.
    ///
    /// Errors: no member, members of different model instances, adapter
    /// shapes or training block lengths (one batched pass needs one length)
    /// ([`TrainError::BadData`]).
    pub fn new(mut members: Vec<Trainer<'m, B, M>>) -> Result<Self, TrainError> {
        let first = members
            .first()
            .ok_or_else(|| TrainError::BadData("no member to train".into()))?;
        let host = HostSlot::new(first.host.path());
        let (model, lora) = (first.model, first.rule.config.lora.clone());
        let len = first.train.first().map_or(0, Vec::len);
        let same_shape = |t: &Trainer<'m, B, M>| {
            let (a, b) = (&t.rule.config.lora, &lora);
            a.r == b.r && a.scale() == b.scale() && a.target_modules == b.target_modules
        };
        if let Some(k) = members
            .iter()
            .position(|t| !std::ptr::eq(t.model, model) || !same_shape(t))
        {
            return Err(TrainError::BadData(format!(
                "member {k} has another base model or adapter shape than member 0"
            )));
        }
        if let Some(k) = members
            .iter()
            .position(|t| t.train.iter().any(|b| b.len() != len))
        {
            return Err(TrainError::BadData(format!(
                "member {k} has training blocks of another length than member 0's {len} tokens"
            )));
        }
        for t in &mut members {
            t.host = host.clone();
        }
        Ok(Self { members, host })
    }

    /// The members.
    pub fn members(&self) -> &[Trainer<'m, B, M>] {
        &self.members
    }

    /// The members, handed back.
    pub fn into_members(self) -> Vec<Trainer<'m, B, M>> {
        self.members
    }

    /// Whether the steps run the batched host step (otherwise each member
    /// steps alone through burn autodiff).
    pub fn uses_host_step(&self) -> Result<bool, TrainError> {
        Ok(self.host.get::<B, M>(self.members[0].model)?.is_some())
    }

    /// One optimizer step of every member in `which` (indices), together:
    /// micro-batch `i` of every member in one batched pass. Returns each
    /// one's mean training loss, in order.
    pub fn step(&mut self, which: &[usize]) -> Result<Vec<f64>, TrainError> {
        if let Some(&k) = which.iter().find(|&&k| k >= self.members.len()) {
            return Err(TrainError::BadData(format!(
                "no member {k} of {}",
                self.members.len()
            )));
        }
        let model = self.members[0].model;
        let Some(host) = self.host.get::<B, M>(model)? else {
            return which.iter().map(|&k| self.members[k].step()).collect();
        };
        let mut sums: Vec<(f64, Vec<f32>)> = which
            .iter()
            .map(|&k| (0.0, vec![0.0f32; self.members[k].params.len()]))
            .collect();
        let most = which
            .iter()
            .map(|&k| self.members[k].rule.config.grad_accum)
            .max()
            .unwrap_or(0);
        for micro in 0..most {
            // Each member's draw from its own stream, as alone.
            let mut draws: Vec<(usize, Vec<usize>, Dropout)> = Vec::new();
            for (slot, &k) in which.iter().enumerate() {
                if micro < self.members[k].rule.config.grad_accum {
                    let (picked, dropout) = self.members[k].draw(micro);
                    draws.push((slot, picked, dropout));
                }
            }
            let mut blocks = Vec::new();
            let mut groups = Vec::with_capacity(draws.len());
            for (slot, picked, dropout) in &draws {
                let t = &self.members[which[*slot]];
                blocks.extend(picked.iter().map(|&i| &t.train[i]));
                groups.push(Group::new(&t.params, picked.len(), Some(*dropout)));
            }
            let out = privmix_models::threads::on_hot_pool(|| {
                host.losses_and_gradients(&blocks, &groups)
            })?;
            for ((slot, _, _), (l, g)) in draws.iter().zip(out) {
                let accum = self.members[which[*slot]].rule.config.grad_accum;
                let (loss, grad) = &mut sums[*slot];
                accumulate(loss, grad, l, &g, accum);
            }
        }
        which
            .iter()
            .zip(sums)
            .map(|(&k, (loss, grad))| self.members[k].apply(loss, &grad))
            .collect()
    }

    /// Runs every member to its `total_steps` (or early stop), together.
    pub fn run(&mut self) -> Result<Vec<TrainReport>, TrainError> {
        self.run_until(usize::MAX)
    }

    /// As [`JointTrainer::run`] but each member stops after step `until`, as
    /// [`Trainer::run_until`] does: each step takes every member that still
    /// has one; after it, each member evaluates, stops early and saves its
    /// checkpoints on its own schedule, and each saves its closing
    /// checkpoint at the end.
    pub fn run_until(&mut self, until: usize) -> Result<Vec<TrainReport>, TrainError> {
        let multi = MultiProgress::with_draw_target(
            if self.members.iter().any(|t| t.progress) && std::io::stderr().is_terminal() {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        let bars: Vec<_> = self
            .members
            .iter()
            .map(|t| multi.add(t.progress_bar()))
            .collect();
        loop {
            let which: Vec<usize> = (0..self.members.len())
                .filter(|&k| self.members[k].wants_step(until))
                .collect();
            if which.is_empty() {
                break;
            }
            let losses = self.step(&which)?;
            for (&k, loss) in which.iter().zip(losses) {
                self.members[k].after_step(&loss, &bars[k])?;
            }
        }
        for bar in &bars {
            bar.finish_and_clear();
        }
        self.members
            .iter()
            .map(|t| {
                t.finish()?;
                Ok(t.report())
            })
            .collect()
    }
}
