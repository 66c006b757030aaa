//! What a fine-tuning run reports and its checkpoints keep: the losses seen
//! so far, the steps done, the best held-out loss, early stopping.

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
