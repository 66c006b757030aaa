//! What the engine is given and what it tells a request's handler: a request
//! ([`Job`]), its events and notes, its usage, and the engine's configuration.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::args::MechanismParams;
use crate::ledger_store::Tenant;

/// A request the engine decodes.
#[derive(Debug)]
pub struct Job {
    /// The prompt's token ids (non-empty, checked against the limits).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: u64,
    /// Temperature applied to every model's distribution before the mechanism.
    pub temperature: f64,
    /// Stop strings, applied to the released text.
    pub stop: Vec<String>,
    /// Who pays.
    pub tenant: Option<Tenant>,
    /// Where the request's notes (its events, grouped by step) go.
    pub events: UnboundedSender<Note>,
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// A budget could not pay for the next token (after at least one token).
    BudgetExhausted,
    /// With `--step-time-ms`: a step was not done by its deadline; its token (charged)
    /// is withheld and the request ends at that deadline.
    StepOverran,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::BudgetExhausted => "budget_exhausted",
            Self::StepOverran => "step_overran",
        }
    }
}

/// The privacy part of a request's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivacyUsage {
    /// ε this request's charges compose to at `delta` (rounded up).
    pub epsilon_spent: f64,
    /// δ of the figures.
    pub delta: f64,
    /// ε left of the members' total budget after this request.
    pub total_epsilon_left: Option<f64>,
    /// ε left of the tenant's own budget after this request.
    pub tenant_epsilon_left: Option<f64>,
}

/// Token counts and privacy of a finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated (charged) tokens, an end-of-turn token that stopped the request included.
    pub completion_tokens: usize,
    /// The charges.
    pub privacy: PrivacyUsage,
}

/// What the engine tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A released (already charged) piece of text.
    Text(String),
    /// The request finished.
    Done {
        /// Why.
        finish: Finish,
        /// Its usage.
        usage: Usage,
    },
    /// A budget could not pay for the first token: nothing was released.
    Refused {
        /// The store's message, naming the budget.
        message: String,
    },
    /// The request failed inside the engine; the message is public (a mechanism
    /// error's `public_description`, never a private value).
    Failed(String),
}

impl Event {
    /// Whether the event ends its request.
    pub fn ends(&self) -> bool {
        !matches!(self, Self::Text(_))
    }
}

/// What the engine sends a request's handler (`pace.rs` turns these into the
/// [`Event`]s the client is sent, on the release schedule when there is one).
#[derive(Debug)]
pub enum Note {
    /// The request ended before its first step (it could not be admitted): send at once.
    Now(Event),
    /// The request's first step starts now: the anchor of its release schedule.
    Started(Instant),
    /// What step `k` (from 0) released: possibly nothing (text held back), a piece of
    /// text, and an event that ends the request. One note per step, always.
    Step {
        /// The step.
        k: usize,
        /// Its events, in order.
        events: Vec<Event>,
        /// With a schedule: the usage after this step (the ledger's totals left out),
        /// reported if a later step overruns its deadline.
        usage: Option<Usage>,
    },
}

/// What the engine needs besides the model.
pub struct EngineConfig {
    /// The mechanism and its parameters.
    pub mechanism: crate::args::MechanismKind,
    /// Its parameters (the radius fixed at start-up, data-independently).
    pub params: MechanismParams,
    /// ε a request of `max_tokens` tokens is calibrated to, at the budget's δ.
    pub request_epsilon: f64,
    /// Largest `max_tokens`: the calibration's number of queries.
    pub max_tokens: u64,
    /// Most requests decoded together; more wait in the queue.
    pub max_batch: usize,
    /// Row-tokens of prompt prefilled per step at most (`admission.rs`).
    pub prefill_budget: usize,
    /// Token ids that end a turn.
    pub stop_ids: Vec<u32>,
    /// δ at which usage is reported.
    pub delta: f64,
    /// `--step-time-ms` is set: every step's note carries the usage so far.
    pub paced: bool,
    /// `--phase-timings`: print where the loop's time goes (`phases.rs`).
    pub phase_timings: bool,
}
