//! The decode loop: every active request decoded together, one batched forward per step.
//!
//! One thread owns the model, its members, the batched decoder and the ledger store.
//! Requests arrive on a channel; at each step boundary new ones are prefilled and their
//! rows (public model + members, as their mechanism's layout says) appended to the
//! batch, and finished ones leave it. A step then runs, for every active request in
//! turn, its own mechanism on its own rows: the mechanism charges the store (durably,
//! the total and the tenant's budget checked in one atomic step) and only then is the
//! token sent to the client. One forward over all rows computes everyone's next rows.
//!
//! What leaves this thread is what the client is owed: released tokens, the stop
//! reason, and usage figures made of token counts and data-independent charges.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use burn::tensor::backend::Backend;
use privmix_accountant::{PrivacyBudget, RdpCurve};
use privmix_ensemble::lora::LoraBase;
use privmix_ensemble::rows::LogProbRows;
use privmix_ensemble::runner::{Decoder, EnsembleRunner};
use privmix_mechanisms::{Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, Rows};
use privmix_models::{LanguageModel, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::args::MechanismParams;
use crate::error::CliError;
use crate::ledger_store::{LedgerStore, StoreAccount, StoreError, Tenant};
use crate::setup::{MechanismPlan, build_mechanism};
use crate::temper::temper_log_probs;

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
    /// Token ids that end a turn.
    pub stop_ids: Vec<u32>,
    /// δ at which usage is reported.
    pub delta: f64,
    /// `--step-time-ms` is set: every step's note carries the usage so far.
    pub paced: bool,
}

/// A request being decoded.
struct Active<'a, B: Backend, M> {
    job: Job,
    mechanism: Box<dyn EnsembleMechanism>,
    /// Its rows in the batch: `first..first + rows`.
    rows: usize,
    /// The log-probabilities its next step reads, and the row they start at.
    current: Arc<LogProbRows>,
    current_first: usize,
    /// Not yet in the batch: its own decoder, appended at the step's end.
    pending: Option<Decoder<'a, B, M>>,
    generated: Vec<u32>,
    /// Charged tokens: `generated` plus an end-of-turn token that stopped it.
    charged_tokens: usize,
    /// Text decoded so far and how much of it was sent.
    text: String,
    sent: usize,
    charged: RdpCurve,
    ensemble: Option<Ensemble>,
    finished: Option<Finish>,
    /// Steps taken.
    steps: usize,
    /// The events of the step in progress.
    outbox: Vec<Event>,
}

/// Runs the decode loop until `jobs` is closed and every request has finished.
pub fn run<B, M>(
    runner: &EnsembleRunner<B, M>,
    tokenizer: &Tokenizer,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
    jobs: &Receiver<Job>,
) -> Result<(), CliError>
where
    B: Backend,
    M: LanguageModel<B> + LoraBase,
{
    let mut rng = PrivacyRng::from_os()?;
    let mut batch: Option<Decoder<'_, B, M>> = None;
    let mut active: Vec<Active<'_, B, M>> = Vec::new();
    let mut closed = false;
    loop {
        // Admit new requests at the step boundary (block when idle).
        while active.len() < config.max_batch && !closed {
            let job = if active.is_empty() {
                match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            };
            if let Some(a) = admit(runner, store, config, job)? {
                active.push(a);
            }
        }
        if active.is_empty() {
            if closed {
                return Ok(());
            }
            continue;
        }

        // One mechanism step per request, each charged before its token is sent.
        for a in &mut active {
            step_request(a, tokenizer, store, config, &mut rng)?;
        }

        // Leave, join, then one forward for everyone still decoding.
        let mut keep_rows = Vec::new();
        let mut first = 0;
        let mut still = Vec::with_capacity(active.len());
        let mut joining = Vec::new();
        for mut a in active.drain(..) {
            let in_batch = a.pending.is_none();
            if a.finished.is_some() {
                if in_batch {
                    first += a.rows;
                }
                continue;
            }
            if in_batch {
                keep_rows.extend(first..first + a.rows);
                first += a.rows;
                still.push(a);
            } else {
                joining.push(a.pending.take());
                still.push(a);
            }
        }
        if let Some(b) = &mut batch {
            if keep_rows.is_empty() {
                batch = None;
            } else if keep_rows.len() < b.layout().len() {
                b.retain_rows(&keep_rows)?;
            }
        }
        for d in joining.into_iter().flatten() {
            match &mut batch {
                Some(b) => b.append(d)?,
                None => batch = Some(d),
            }
        }
        active = still;
        if let Some(b) = &mut batch {
            let mut tokens = Vec::with_capacity(b.layout().len());
            for a in &active {
                let last = *a.generated.last().ok_or_else(|| {
                    CliError::arg("serve", "internal: an active request with no token")
                })?;
                tokens.extend(std::iter::repeat_n(last, a.rows));
            }
            let out = Arc::new(b.next_log_probs_rows(&tokens)?);
            let mut first = 0;
            for a in &mut active {
                a.current = Arc::clone(&out);
                a.current_first = first;
                first += a.rows;
            }
        }
    }
}

/// Prefills a new request with its own decoder, or refuses it when a budget is already
/// spent (nothing computed from private data, nothing charged).
fn admit<'a, B, M>(
    runner: &'a EnsembleRunner<B, M>,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
    job: Job,
) -> Result<Option<Active<'a, B, M>>, CliError>
where
    B: Backend,
    M: LanguageModel<B> + LoraBase,
{
    if job.events.is_closed() {
        return Ok(None);
    }
    let orders = store.orders().clone();
    let built = build_mechanism(&MechanismPlan {
        kind: config.mechanism,
        params: &config.params,
        members: runner.num_members(),
        epsilon: config.request_epsilon,
        spent: None,
        delta: config.delta,
        queries: config.max_tokens,
        orders: &orders,
    });
    let (mechanism, layout) = match built {
        Ok(x) => x,
        Err(e) => {
            let _ = job.events.send(Note::Now(Event::Failed(e.to_string())));
            return Ok(None);
        }
    };
    let rows = layout.len();
    let mut decoder = runner.decoder(layout)?;
    let current = match decoder.prefill(&job.prompt) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            let _ = job.events.send(Note::Now(Event::Failed(e.to_string())));
            return Ok(None);
        }
    };
    Ok(Some(Active {
        job,
        mechanism,
        rows,
        current,
        current_first: 0,
        pending: Some(decoder),
        generated: Vec::new(),
        charged_tokens: 0,
        text: String::new(),
        sent: 0,
        charged: RdpCurve::zero(orders),
        ensemble: None,
        finished: None,
        steps: 0,
        outbox: Vec::new(),
    }))
}

/// One mechanism step of one request: charge, then send the step's note (one per
/// step, [`Note::Started`] before the first).
fn step_request<B: Backend, M>(
    a: &mut Active<'_, B, M>,
    tokenizer: &Tokenizer,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
    rng: &mut PrivacyRng,
) -> Result<(), CliError> {
    if a.steps == 0 {
        let _ = a.job.events.send(Note::Started(Instant::now()));
    }
    let result = step_events(a, tokenizer, store, config, rng);
    let events = std::mem::take(&mut a.outbox);
    let usage = config.paced.then(|| Usage {
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: a.charged_tokens,
        privacy: PrivacyUsage {
            epsilon_spent: a
                .charged
                .epsilon(config.delta)
                .map_or(f64::INFINITY, |e| e.epsilon),
            delta: config.delta,
            total_epsilon_left: None,
            tenant_epsilon_left: None,
        },
    });
    let _ = a.job.events.send(Note::Step {
        k: a.steps,
        events,
        usage,
    });
    a.steps += 1;
    result
}

/// The step itself: its events go to `a.outbox`.
fn step_events<B: Backend, M>(
    a: &mut Active<'_, B, M>,
    tokenizer: &Tokenizer,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
    rng: &mut PrivacyRng,
) -> Result<(), CliError> {
    if a.job.events.is_closed() {
        // The client left: stop decoding it (everything released so far was charged).
        a.finished = Some(Finish::Stop);
        return Ok(());
    }
    let vocab = a.current.vocab();
    let start = a.current_first * vocab;
    let flat = &a.current.as_flat()[start..start + a.rows * vocab];
    let mut tempered = Vec::new();
    let flat = if a.job.temperature == 1.0 {
        flat
    } else {
        temper_log_probs(flat, vocab, a.job.temperature, &mut tempered);
        &tempered[..]
    };
    let ensemble = match Ensemble::renew_or_new(
        a.ensemble.take(),
        Rows::LogProbF32(&flat[..vocab]),
        Rows::LogProbF32(&flat[vocab..]),
    ) {
        Ok(e) => e,
        Err(e) => {
            // A member's row failed the checks (a non-finite entry, …): this request
            // fails, naming the kind of problem only; the server goes on.
            a.outbox.push(Event::Failed(e.public_description()));
            a.finished = Some(Finish::Stop);
            return Ok(());
        }
    };
    let mut account = StoreAccount::new(store, a.job.tenant.as_ref());
    let stepped = a.mechanism.step(&ensemble, rng, &mut account);
    a.charged = a.charged.compose(account.charged())?;
    let outcome = match stepped {
        Ok(o) => o,
        Err(MechanismError::ChargeRefused(message)) => {
            if a.charged_tokens == 0 {
                a.outbox.push(Event::Refused { message });
                a.finished = Some(Finish::BudgetExhausted);
            } else {
                finish(a, Finish::BudgetExhausted, store, config)?;
            }
            return Ok(());
        }
        Err(e) => {
            a.outbox.push(Event::Failed(e.public_description()));
            a.finished = Some(Finish::Stop);
            return Ok(());
        }
    };
    a.ensemble = Some(ensemble);
    a.charged_tokens += 1;
    let token = u32::try_from(outcome.token)
        .map_err(|_| CliError::arg("--model", "a token index does not fit in u32"))?;
    if config.stop_ids.contains(&token) {
        flush(a, true);
        return finish(a, Finish::Stop, store, config);
    }
    a.generated.push(token);
    a.text = tokenizer
        .decode(&a.generated)
        .map_err(|e| CliError::Tokenizer(e.to_string()))?;
    if let Some(cut) = stop_position(&a.text, &a.job.stop) {
        a.text.truncate(cut);
        flush(a, true);
        return finish(a, Finish::Stop, store, config);
    }
    flush(a, false);
    if a.generated.len() as u64 >= a.job.max_tokens {
        flush(a, true);
        return finish(a, Finish::Length, store, config);
    }
    Ok(())
}

/// Sends the text not yet sent. Unless `all`, holds back a tail that could still
/// become a stop string, and a tail that is not yet whole characters (the decoder's
/// replacement character for an incomplete byte sequence).
fn flush<B: Backend, M>(a: &mut Active<'_, B, M>, all: bool) {
    let mut end = a.text.len();
    if !all {
        end = end.min(a.text.len() - held_back(&a.text, &a.job.stop));
        while end > a.sent && a.text[..end].ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
    }
    // The decoded text may change below what was sent only for an incomplete character,
    // which is held back above; keep the sent prefix as the reference.
    if end > a.sent && a.text.is_char_boundary(a.sent) {
        let piece = a.text[a.sent..end].to_string();
        a.sent = end;
        a.outbox.push(Event::Text(piece));
    }
}

/// Byte length of the longest suffix of `text` that is a proper prefix of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            if text.ends_with(&s[..i]) {
                hold = hold.max(i);
            }
        }
    }
    hold
}

/// Where the first stop string starts in `text`, if one occurs.
fn stop_position(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter_map(|s| text.find(s.as_str())).min()
}

fn finish<B: Backend, M>(
    a: &mut Active<'_, B, M>,
    why: Finish,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
) -> Result<(), CliError> {
    a.finished = Some(why);
    let delta = config.delta;
    let epsilon_spent = a.charged.epsilon(delta)?.epsilon;
    let left = |spent: Result<RdpCurve, StoreError>, budget: Option<PrivacyBudget>| {
        let b = budget?;
        let spent = spent.ok()?.epsilon(b.delta()).ok()?.epsilon;
        Some((b.epsilon() - spent).max(0.0))
    };
    let total_epsilon_left = left(store.spent(None), store.budget());
    let tenant_epsilon_left = a
        .job
        .tenant
        .as_ref()
        .and_then(|t| left(store.spent(Some(&t.name)), t.budget));
    let usage = Usage {
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: a.charged_tokens,
        privacy: PrivacyUsage {
            epsilon_spent,
            delta,
            total_epsilon_left,
            tenant_epsilon_left,
        },
    };
    a.outbox.push(Event::Done { finish: why, usage });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_hold_back_only_possible_prefixes() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abcEN", &stops), 2);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(stop_position("ab\n\ncd END", &stops), Some(2));
        assert_eq!(stop_position("abc", &stops), None);
    }
}
