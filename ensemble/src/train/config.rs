//! Hyper-parameters of LoRA fine-tuning.

use serde_json::{Value, json};

use super::adamw::AdamWConfig;
use super::error::TrainError;
use crate::lora::LoraConfig;

/// How to fine-tune one member: the adapter's shape (rank, alpha, dropout,
/// target modules from [`LoraConfig`]), AdamW with a linear warmup/decay
/// schedule, batch and accumulation, evaluation and early stopping.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Adapter shape; `lora_dropout` is applied to the adapter's input.
    pub lora: LoraConfig,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Warmup steps (linear from 0).
    pub warmup_steps: usize,
    /// Optimizer steps in all (the schedule decays to 0 there).
    pub total_steps: usize,
    /// Blocks per micro-batch (drawn without replacement each micro-batch).
    pub batch_size: usize,
    /// Micro-batches averaged per optimizer step.
    pub grad_accum: usize,
    /// AdamW moments and weight decay.
    pub adamw: AdamWConfig,
    /// Seed of initialisation, batch sampling and dropout.
    pub seed: u64,
    /// Evaluate the held-out loss every this many steps (0: never).
    pub eval_every: usize,
    /// At most this many held-out blocks per evaluation (the first ones).
    pub eval_blocks: usize,
    /// Stop after this many evaluations without a new best held-out loss.
    pub patience: Option<usize>,
    /// Save a checkpoint every this many steps when a checkpoint folder is set (0: only at the end).
    pub checkpoint_every: usize,
    /// Show a progress bar on a terminal (never drawn when stderr is not one).
    pub progress: bool,
}

impl TrainConfig {
    /// A configuration with common defaults: lr 2e-4, no warmup, batch 1, no
    /// accumulation, AdamW defaults, no evaluation, no progress bar.
    pub fn new(lora: LoraConfig, total_steps: usize, seed: u64) -> Self {
        Self {
            lora,
            learning_rate: 2e-4,
            warmup_steps: 0,
            total_steps,
            batch_size: 1,
            grad_accum: 1,
            adamw: AdamWConfig::default(),
            seed,
            eval_every: 0,
            eval_blocks: usize::MAX,
            patience: None,
            checkpoint_every: 0,
            progress: false,
        }
    }

    /// Checks every range.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.lora.validate()?;
        self.adamw.validate()?;
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return Err(TrainError::bad(
                "learning_rate",
                format!("{}", self.learning_rate),
            ));
        }
        for (name, v) in [
            ("total_steps", self.total_steps),
            ("batch_size", self.batch_size),
            ("grad_accum", self.grad_accum),
            ("eval_blocks", self.eval_blocks),
        ] {
            if v == 0 {
                return Err(TrainError::bad(name, "must be at least 1"));
            }
        }
        if self.patience == Some(0) {
            return Err(TrainError::bad("patience", "must be at least 1"));
        }
        Ok(())
    }

    /// Everything that decides the trajectory, as JSON (a checkpoint refuses
    /// to resume under another one). `progress` and `checkpoint_every` do not.
    pub fn fingerprint(&self) -> Value {
        json!({
            "lora": self.lora.to_json(),
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "adamw": serde_json::to_value(self.adamw).unwrap_or(Value::Null),
            "seed": self.seed,
            "eval_every": self.eval_every,
            "eval_blocks": self.eval_blocks,
            "patience": self.patience,
        })
    }
}
