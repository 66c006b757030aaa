//! The decode loop: every active request decoded together, one batched forward per step.
//!
//! One thread owns the model, its members, the batched decoder and the ledger store.
//! Requests arrive on a channel; at each step boundary new ones are prefilled under a
//! per-step budget of prompt tokens (`admission.rs`: prompts that fit prefilled
//! together in one forward, longer ones in chunks over several steps), and their rows
//! (public model + members, as their mechanism's layout says) appended to the batch,
//! and finished ones leave it (the last requests' rows taking their places, so that
//! the KV cache moves only those). A step then runs:
//!
//! 1. every active request's mechanism on its own rows, all in one parallel region
//!    (`draw.rs`): charges recorded, tokens drawn, nothing released;
//! 2. the step's charges committed to the store together, in request order, through
//!    the step loop every driver shares (`privmix_mechanisms::step_loop`, committing
//!    to `step_sink::StoreSink`: one `commit_step`, one write and one sync, or one
//!    transaction; each request's tenant budget and the total checked in turn), a
//!    refused charge dropping that request's token alone;
//! 3. the committed tokens released: detokenised incrementally (`detok.rs`) and sent;
//! 4. one forward over all rows, computing everyone's next rows.
//!
//! No token leaves before the commit that covers it has returned. What leaves this
//! thread is what the client is owed: released tokens, the stop reason, and usage
//! figures made of token counts and data-independent charges. The mechanisms'
//! calibration (their radius) is a function of the configuration alone and is done
//! once, when the loop starts.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use burn::tensor::backend::Backend;
use privmix_accountant::{PrivacyBudget, RdpCurve};
use privmix_ensemble::lora::LoraBase;
use privmix_ensemble::rows::LogProbRows;
use privmix_ensemble::runner::{Decoder, EnsembleRunner};
use privmix_mechanisms::step_loop::{self, Drawn, Settled};
use privmix_models::{LanguageModel, Tokenizer};

use crate::args::MechanismParams;
use crate::error::CliError;
use crate::ledger_store::{LedgerStore, PendingCharge, StoreError};
use crate::setup::{MechanismPlan, calibrated_radius};
use crate::step_sink::StoreSink;

use super::admission::{Admission, Prefilled};
use super::detok::Detokeniser;
use super::draw::{self, MechanismState, StepInput};
pub use super::job::{EngineConfig, Event, Finish, Job, Note, PrivacyUsage, Usage};

use super::phases::{Phase, PhaseTimes};

/// A request being decoded.
struct Active {
    job: Job,
    /// Its mechanism, generator and reused buffers.
    mech: MechanismState,
    /// Its rows in the batch: `first..first + rows`.
    rows: usize,
    /// The log-probabilities its next step reads, and the row they start at.
    current: Arc<LogProbRows>,
    current_first: usize,
    /// Not yet in the batch: which of the step's prefilled decoders holds its rows
    /// (from `current_first` on), appended at the step's end.
    joining: Option<usize>,
    /// The released tokens and their text.
    detok: Detokeniser,
    /// Charged tokens: the released ones plus an end-of-turn token that stopped it.
    charged_tokens: usize,
    /// Text decoded so far and how much of it was sent.
    text: String,
    sent: usize,
    charged: RdpCurve,
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
    let mut batch: Option<Decoder<'_, B, M>> = None;
    let mut active: Vec<Active> = Vec::new();
    let mut admission = Admission::default();
    let mut closed = false;
    let mut times = PhaseTimes::new(config.phase_timings);
    // The calibration is a function of the configuration alone: done once.
    let params = calibrated_params(config, runner.num_members(), store.orders())?;
    loop {
        // Receive new requests at the step boundary (block when there is nothing to
        // do), then prefill under the step's budget.
        if !closed && active.is_empty() && admission.is_idle() {
            match jobs.recv() {
                Ok(job) => admission.push(job),
                Err(_) => closed = true,
            }
        }
        while !closed {
            match jobs.try_recv() {
                Ok(job) => admission.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => closed = true,
            }
        }
        let t = times.start();
        let room = config.max_batch.saturating_sub(active.len());
        let orders = store.orders().clone();
        let admitted = admission.step(runner, config, &params, &orders, room)?;
        let mut prefilled = admitted.decoders;
        active.extend(admitted.ready.into_iter().map(|p| Active::new(p, &orders)));
        times.add_since(Phase::Admit, t);
        if active.is_empty() {
            times.print();
            if closed && admission.is_idle() {
                return Ok(());
            }
            continue;
        }

        // Every request's mechanism in one parallel region: charges recorded, tokens
        // drawn, nothing released.
        let t = times.start();
        for a in &mut active {
            if a.steps == 0 {
                let _ = a.job.events.send(Note::Started(Instant::now()));
            }
            a.mech.drawn = Drawn::idle();
        }
        let vocab = active[0].current.vocab();
        let inputs: Vec<StepInput<'_>> = active
            .iter_mut()
            .filter(|a| !a.job.events.is_closed())
            .map(|a| {
                let start = a.current_first * vocab;
                let Active {
                    mech,
                    current,
                    rows,
                    job,
                    ..
                } = a;
                StepInput {
                    state: mech,
                    log_probs: &current.as_flat()[start..start + *rows * vocab],
                    temperature: job.temperature,
                }
            })
            .collect();
        draw::step_all(inputs, vocab, &orders);
        times.add_since(Phase::Mechanism, t);

        // The step's charges, committed in request order before any token is released.
        let t = times.start();
        let committed = commit_step(&mut active, store);
        times.add_since(Phase::Ledger, t);

        // Release: each request's token (where its charge was committed), its text, its
        // end; one note per request and step.
        let t = times.start();
        let mut released = 0;
        for (a, outcome) in active.iter_mut().zip(committed) {
            released += usize::from(matches!(outcome, Settled::Released { .. }));
            release_step(a, outcome, tokenizer, store, config)?;
        }
        times.add_since(Phase::Release, t);

        // Leave, join, then one forward for everyone still decoding.
        let t = times.start();
        let (kept, keep_rows) = leave_order(std::mem::take(&mut active));
        // The rows each prefilled decoder keeps: those of its requests still decoding.
        let mut joining: Vec<Vec<usize>> = vec![Vec::new(); prefilled.len()];
        for mut a in kept {
            if let Some(d) = a.joining.take() {
                joining[d].extend(a.current_first..a.current_first + a.rows);
            }
            active.push(a);
        }
        if let Some(b) = &mut batch {
            if keep_rows.is_empty() {
                batch = None;
            } else if keep_rows.len() < b.layout().len()
                || keep_rows.iter().enumerate().any(|(i, &r)| i != r)
            {
                b.leave(&keep_rows)?;
            }
        }
        for (mut d, keep) in prefilled.drain(..).zip(joining) {
            if keep.is_empty() {
                continue;
            }
            if keep.len() < d.len() {
                d.retain_rows(&keep)?;
            }
            match &mut batch {
                Some(b) => b.append(d)?,
                None => batch = Some(d),
            }
        }
        times.add_since(Phase::JoinLeave, t);
        let t = times.start();
        let mut forward_rows = 0;
        if let Some(b) = &mut batch {
            forward_rows = b.layout().len();
            let mut tokens = Vec::with_capacity(b.layout().len());
            for a in &active {
                let last = *a.detok.tokens().last().ok_or_else(|| {
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
        times.add_since(Phase::Forward, t);
        times.step_done(forward_rows, released);
    }
}

/// The requests that go on decoding, in their new batch order (those in the batch,
/// then those joining it), and the batch rows to keep in that order. Where every
/// request has as many rows, a finished request's place is taken by the last
/// requests' rows, so that the cache moves only those (each kept row `r` lands at
/// an index at most `r`); otherwise the rows stay in order.
fn leave_order(active: Vec<Active>) -> (Vec<Active>, Vec<usize>) {
    let mut batched: Vec<Option<(usize, Active)>> = Vec::new();
    let mut joining = Vec::new();
    let mut first = 0;
    for a in active {
        if a.joining.is_some() {
            if a.finished.is_none() {
                joining.push(a);
            }
            continue;
        }
        let start = first;
        first += a.rows;
        batched.push(a.finished.is_none().then_some((start, a)));
    }
    let staying = batched.iter().flatten().count();
    let uniform = batched
        .iter()
        .flatten()
        .map(|(_, a)| a.rows)
        .collect::<Vec<_>>()
        .windows(2)
        .all(|w| w[0] == w[1]);
    let mut order = Vec::with_capacity(staying + joining.len());
    if uniform {
        let mut tail: Vec<(usize, Active)> = batched
            .drain(staying.min(batched.len())..)
            .flatten()
            .collect();
        for slot in batched {
            match slot {
                Some(x) => order.push(x),
                None => order.extend(tail.pop()),
            }
        }
        order.extend(tail);
    } else {
        order.extend(batched.into_iter().flatten());
    }
    let keep: Vec<usize> = order
        .iter()
        .flat_map(|(start, a)| *start..*start + a.rows)
        .collect();
    let mut kept: Vec<Active> = order.into_iter().map(|(_, a)| a).collect();
    kept.extend(joining);
    (kept, keep)
}

/// The mechanism parameters with the radius calibrated (where the mechanism
/// calibrates one and none was given): a function of the configuration, the
/// number of members and the ledger's orders only, computed once for every request.
fn calibrated_params(
    config: &EngineConfig,
    members: usize,
    orders: &privmix_accountant::Orders,
) -> Result<MechanismParams, CliError> {
    let mut params = config.params.clone();
    if params.radius.is_none() {
        params.radius = calibrated_radius(&MechanismPlan {
            kind: config.mechanism,
            params: &config.params,
            members,
            epsilon: config.request_epsilon,
            spent: None,
            delta: config.delta,
            queries: config.max_tokens,
            orders,
        })?;
    }
    Ok(params)
}

impl Active {
    /// A prefilled request, before its first step (charges counted at `orders`).
    fn new(p: Prefilled, orders: &privmix_accountant::Orders) -> Self {
        Self {
            job: p.job,
            mech: p.mech,
            rows: p.rows,
            current: p.current,
            current_first: p.first,
            joining: Some(p.decoder),
            detok: Detokeniser::default(),
            charged_tokens: 0,
            text: String::new(),
            sent: 0,
            charged: RdpCurve::zero(orders.clone()),
            finished: None,
            steps: 0,
            outbox: Vec::new(),
        }
    }
}

/// What the commit of a step's charges left a request: its token, where it may be
/// released.
type Committed = Settled<usize, PendingCharge>;

/// Commits every request's recorded charges to the store as one step of the step loop
/// (`privmix_mechanisms::step_loop::commit`), in request order
/// (`LedgerStore::commit_step`: one write and one sync for a file ledger, one
/// transaction for PostgreSQL), each request's charges as one under its tenant, the
/// tenant's and the total budget checked in turn: nothing of the step has been
/// released yet, and a token is unsealed only where its request's charge was
/// committed. A store failure leaves the step's charged requests unrecorded (none of
/// their tokens leaves; they fail); the server goes on.
fn commit_step(active: &mut [Active], store: &mut dyn LedgerStore) -> Vec<Committed> {
    let drawn = active
        .iter_mut()
        .map(|a| {
            let tenant = a.job.tenant.as_ref();
            std::mem::replace(&mut a.mech.drawn, Drawn::idle())
                .map_charge(|account| account.into_charge(tenant))
        })
        .collect();
    step_loop::commit(drawn, &mut StoreSink(store)).settled
}

/// Releases one request's step (its token if committed, its text, its end) and
/// sends the step's note ([`Note::Started`] was sent before its first step).
fn release_step(
    a: &mut Active,
    committed: Committed,
    tokenizer: &Tokenizer,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
) -> Result<(), CliError> {
    let result = step_events(a, committed, tokenizer, store, config);
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

/// The step's events, into `a.outbox`.
fn step_events(
    a: &mut Active,
    committed: Committed,
    tokenizer: &Tokenizer,
    store: &mut dyn LedgerStore,
    config: &EngineConfig,
) -> Result<(), CliError> {
    let token = match committed {
        Settled::Idle => {
            // The client left: stop decoding it (everything released so far was
            // charged).
            a.finished = Some(Finish::Stop);
            return Ok(());
        }
        Settled::Failed(e) => {
            // A row failed the checks or the mechanism failed: this request fails,
            // naming the kind of problem only; the server goes on.
            a.outbox.push(Event::Failed(e.public_description()));
            a.finished = Some(Finish::Stop);
            return Ok(());
        }
        Settled::Unrecorded => {
            // The store failed: this request fails; the server goes on.
            a.outbox.push(Event::Failed(
                "the privacy ledger could not record this step's charges; its token was not released".into(),
            ));
            a.finished = Some(Finish::Stop);
            return Ok(());
        }
        Settled::Refused(message) => {
            if a.charged_tokens == 0 {
                a.outbox.push(Event::Refused { message });
                a.finished = Some(Finish::BudgetExhausted);
            } else {
                // The tokens released so far were charged: send the text still held
                // back (an incomplete character, a possible stop string's start).
                flush_rest(a, tokenizer)?;
                finish(a, Finish::BudgetExhausted, store, config)?;
            }
            return Ok(());
        }
        Settled::Released { output, charge } => {
            if let Some(charge) = charge {
                let curve = charge.cost.curve(store.orders())?;
                a.charged = a.charged.compose(&curve)?;
            }
            output
        }
    };
    a.charged_tokens += 1;
    let token = u32::try_from(token)
        .map_err(|_| CliError::arg("--model", "a token index does not fit in u32"))?;
    if config.stop_ids.contains(&token) {
        flush_rest(a, tokenizer)?;
        return finish(a, Finish::Stop, store, config);
    }
    let piece = a.detok.push(tokenizer, token)?;
    a.text.push_str(&piece);
    if let Some(cut) = stop_position(&a.text, &a.job.stop) {
        a.text.truncate(cut);
        flush(a, true);
        return finish(a, Finish::Stop, store, config);
    }
    flush(a, false);
    if a.detok.tokens().len() as u64 >= a.job.max_tokens {
        flush_rest(a, tokenizer)?;
        return finish(a, Finish::Length, store, config);
    }
    Ok(())
}

/// At a request's end: decodes what the detokeniser still holds, cuts the text at
/// a stop string, and sends everything not yet sent (every ending whose tokens were
/// charged goes through here, so no paid-for text is held back).
fn flush_rest(a: &mut Active, tokenizer: &Tokenizer) -> Result<(), CliError> {
    a.text.push_str(&a.detok.finish(tokenizer)?);
    if let Some(cut) = stop_position(&a.text, &a.job.stop) {
        a.text.truncate(cut.max(a.sent));
    }
    flush(a, true);
    Ok(())
}

/// Sends the text not yet sent. Unless `all`, holds back a tail that could still
/// become a stop string (the detokeniser holds back incomplete characters).
fn flush(a: &mut Active, all: bool) {
    let mut end = a.text.len();
    if !all {
        end = end.min(a.text.len() - held_back(&a.text, &a.job.stop));
    }
    if end > a.sent && a.text.is_char_boundary(a.sent) && a.text.is_char_boundary(end) {
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

fn finish(
    a: &mut Active,
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
