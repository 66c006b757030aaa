//! `privmix generate`: private text generation, one charged step per released token.
//!
//! Every token is released only after the mechanism's charge for it is committed to the
//! ledger (`LedgerStore::commit_step` returns only once the record is synced, or the
//! PostgreSQL transaction committed), so the ledger always covers what was printed: each
//! step goes through the shared step loop (`privmix_mechanisms::step_loop`) as a batch of
//! one, committed through `step_sink::StoreSink` as `serve`'s steps are. A charge the budget cannot pay stops the run: before the first
//! token that is an error (the budget is exhausted), later it ends the text early.
//!
//! What is printed is the released tokens, the ε the ledger has recorded as spent, and
//! the stop reason: never a λ, a data-dependent loss or any other step diagnostic, which
//! are functions of the private data the ledger does not charge for.
//!
//! Prompts come from `--prompt`, `--prompt-ids` or `--prompt-file PATH|-` (one text, or
//! JSON lines of texts and conversations with `--jsonl`); they are answered in turn by
//! the model loaded once, under one mechanism (AdaPMixED's member filter spans them
//! all). `--chat` renders each through the tokenizer's chat template. Generation stops
//! at the tokenizer's end-of-turn ids (`Tokenizer::stop_ids`) unless `--no-stop`.
//!
//! A mechanism calibrated to the budget is fitted to what is left of it: the ledger's
//! spent curve composed with this run's queries (`--max-tokens` per prompt) converts to
//! at most the budget's ε at its δ. (RDP composes order by order, so "what is left" is
//! not the budget's ε less the spent ε.)
//!
//! `--temperature` tempers each model's distribution before the mechanism (see
//! `temper.rs`), never the mechanism's output.
//!
//! Exit status: 3 when the budget is exhausted before any token is released, 4 when it
//! runs out later (what was released and each answered prompt's summary are printed).
//!
//! A private run draws its coins from the OS-seeded generator. `--seed` makes every draw
//! predictable, so a seeded run is an experiment: it needs `--no-privacy`, refuses
//! `--ledger`, and its output says `"private": false` (the text footer says NOT private).

use std::io::{StdoutLock, Write};
use std::time::Instant;

use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet};
use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::step_loop::{AlreadyCharged, Drawn, Settled, commit_one};
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, Rows, StepOutcome, Unbudgeted,
};
use privmix_models::{LanguageModel, ModelBackend, Tokenizer};
use serde_json::json;

use crate::args::{GenerateArgs, MechanismKind};
use crate::error::{CliError, EXIT_BUDGET_STOPPED, EXIT_OK};
use crate::ledger_common::DEFAULT_DELTA;
use crate::ledger_store::{
    LedgerStore, PendingCharge, StepAccount, StorePlan, mechanism_error, prepare_store,
};
use crate::pacing::Pacer;
use crate::prompts::{PromptInput, prompt_ids, read_prompts};
use crate::protected::protected_set;
use crate::setup::{
    BackendFn, MechanismPlan, Runner, build_mechanism, check_vocab, load_chat_template,
    load_runner, load_tokenizer, with_backend,
};
use crate::step_sink::StoreSink;
use crate::temper::{check_temperature, tempered_rows};

/// What is left of a ledger's budget below this fraction of it counts as exhausted.
/// A run calibrated to the budget stops within a relative 1e-9 of it (the calibrations'
/// bisection), so a ledger whose budget a run has spent keeps about that much; a run
/// calibrated to such a remainder would answer with the public model's distribution all
/// but exactly.
const NEGLIGIBLE_LEFT: f64 = 1e-6;

/// Why generation of one prompt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    MaxTokens,
    EndOfSequence,
    Budget,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::EndOfSequence => "end_of_sequence",
            Self::Budget => "budget_exhausted",
        }
    }
}

/// How one step of a prompt settled.
enum StepEnd {
    /// Its charge is committed: the token may be released.
    Released(StepOutcome),
    /// A budget refused its charge: the token is dropped and the text ends.
    Refused,
    /// The mechanism or the ledger failed: the run fails.
    Failed(CliError),
}

/// How a run that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Every prompt was answered (to --max-tokens or its end of turn).
    Completed,
    /// The budget ran out after something was released: the text stopped early.
    BudgetStopped,
}

impl RunEnd {
    /// The exit status: 0, or 4 when the budget stopped the text early.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Completed => EXIT_OK,
            Self::BudgetStopped => EXIT_BUDGET_STOPPED,
        }
    }
}

/// Runs `privmix generate`.
pub fn run(args: &GenerateArgs) -> Result<RunEnd, CliError> {
    let kind = args.model.mechanism;
    if args.max_tokens == 0 {
        return Err(CliError::arg("--max-tokens", "must be at least 1"));
    }
    check_temperature(args.model.temperature)?;
    check_privacy_flags(args)?;
    if let Some(ms) = args.step_time_ms {
        Pacer::new(Instant::now(), ms)?;
    }
    // The prompts are read (standard input included) before anything is loaded.
    let inputs = prompt_inputs(args)?;

    // The ledger first: refuse before loading any model when it protects another
    // adapter set or its budget is spent (hashing the adapters reads only their files).
    // Duplicate members are refused with or without a ledger.
    let protected = protected_set(&args.model.adapters)?;
    let mut plan = match &args.ledger {
        Some(spec) => Some(prepare_store(spec, &protected, args.epsilon, args.delta)?),
        None => None,
    };
    if let Some(StorePlan::Open(store, budget)) = &mut plan {
        let spent = store.spent(None)?.epsilon(budget.delta())?;
        if kind != MechanismKind::Public
            && spent.epsilon >= budget.epsilon() * (1.0 - NEGLIGIBLE_LEFT)
        {
            return Err(exhausted(&**store, spent.epsilon, *budget, kind));
        }
    }
    with_backend(
        args.model.backend,
        Generation {
            args,
            inputs,
            protected,
            plan,
        },
    )
}

/// The prompts: `--prompt-ids`, `--prompt`, `--prompt-file`, else the BOS alone.
fn prompt_inputs(args: &GenerateArgs) -> Result<Vec<PromptInput>, CliError> {
    Ok(match (&args.prompt_ids, &args.prompt, &args.prompt_file) {
        (Some(ids), _, _) => vec![PromptInput::Ids(ids.clone())],
        (None, Some(text), _) => vec![PromptInput::Text(text.clone())],
        (None, None, Some(path)) => read_prompts(path, args.jsonl, args.chat)?,
        (None, None, None) => vec![PromptInput::Start],
    })
}

/// A generate run once its arguments and ledger are checked, generic over the backend.
struct Generation<'a> {
    args: &'a GenerateArgs,
    inputs: Vec<PromptInput>,
    protected: ProtectedSet,
    plan: Option<StorePlan>,
}

impl BackendFn<RunEnd> for Generation<'_> {
    fn run<B: ModelBackend>(self, device: B::Device) -> Result<RunEnd, CliError> {
        let Generation {
            args,
            inputs,
            protected,
            plan,
        } = self;
        let kind = args.model.mechanism;
        let runner = load_runner::<B>(&args.model, &device)?;
        let tokenizer = load_tokenizer(&args.model)?;
        if let Some(t) = &tokenizer {
            check_vocab(t, &runner, &args.model.model)?;
        }
        let template = if args.chat {
            Some(load_chat_template(&args.model)?)
        } else {
            None
        };
        // Every prompt is encoded before anything is charged.
        let vocab = runner.model().vocab_size();
        let mut prompts = Vec::with_capacity(inputs.len());
        for input in &inputs {
            let ids = prompt_ids(input, tokenizer.as_ref(), template.as_ref(), true)?;
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(CliError::arg(
                    "--prompt-ids",
                    format!("token id {bad} is outside the model's vocabulary of {vocab}"),
                ));
            }
            prompts.push(ids);
        }
        let stops: Vec<u32> = match (&tokenizer, args.no_stop) {
            (Some(t), false) => t.stop_ids().to_vec(),
            _ => Vec::new(),
        };
        // Everything loaded: only now is a new ledger created.
        let mut ledger = match plan {
            Some(plan) => Some(plan.finish(&protected, args.epsilon, args.delta)?),
            None => None,
        };
        let (epsilon, delta) = match &ledger {
            Some((_, b)) => (b.epsilon(), b.delta()),
            None => (
                args.epsilon.unwrap_or(8.0),
                args.delta.unwrap_or(DEFAULT_DELTA),
            ),
        };
        let orders = match &ledger {
            Some((store, _)) => store.orders().clone(),
            None => Orders::dp_accounting_default(),
        };
        // Calibrated to what is left: the ledger's spent curve composed with this
        // run's queries (every prompt's --max-tokens) fits the budget.
        let spent = match &mut ledger {
            Some((store, _)) => Some(store.spent(None)?),
            None => None,
        };
        let (mechanism, layout) = build_mechanism(&MechanismPlan {
            kind,
            params: &args.model.params,
            members: runner.num_members(),
            epsilon,
            spent: spent.as_ref(),
            delta,
            queries: (args.max_tokens as u64).saturating_mul(prompts.len() as u64),
            orders: &orders,
        })?;
        let rng = match args.seed {
            Some(seed) => PrivacyRng::from_seed(seed),
            None => PrivacyRng::from_os()?,
        };
        let mut session = Session {
            args,
            runner: &runner,
            tokenizer: tokenizer.as_ref(),
            mechanism,
            layout,
            rng,
            unbudgeted: Unbudgeted::new(orders),
            ledger,
            delta,
            stops,
            released: 0,
            out: std::io::stdout().lock(),
        };
        let many = prompts.len() > 1;
        for (index, prompt) in prompts.iter().enumerate() {
            let stop = session.answer(index, prompt, many)?;
            if stop == Stop::Budget {
                let left = prompts.len() - index - 1;
                if left > 0 {
                    eprintln!(
                        "privmix: the budget is exhausted: the {left} prompt(s) after prompt {index} were not answered"
                    );
                }
                return Ok(RunEnd::BudgetStopped);
            }
        }
        Ok(RunEnd::Completed)
    }
}

/// The state one run's prompts share: the model, the mechanism (AdaPMixED's filter
/// spans the whole run), the coins and the account.
struct Session<'a, B: Backend> {
    args: &'a GenerateArgs,
    runner: &'a Runner<B>,
    tokenizer: Option<&'a Tokenizer>,
    mechanism: Box<dyn EnsembleMechanism>,
    layout: RowLayout,
    rng: PrivacyRng,
    unbudgeted: Unbudgeted,
    ledger: Option<(Box<dyn LedgerStore>, PrivacyBudget)>,
    delta: f64,
    stops: Vec<u32>,
    /// Tokens released so far, over all prompts.
    released: usize,
    out: StdoutLock<'static>,
}

impl<B: ModelBackend> Session<'_, B> {
    /// Generates the answer to prompt `index` (token ids `prompt`), printing each
    /// token as it is released and then the prompt's summary; `many`: the run has
    /// several prompts (the stderr summary names the prompt). A budget exhausted
    /// before anything at all was released is an error; later it ends this answer.
    fn answer(&mut self, index: usize, prompt: &[u32], many: bool) -> Result<Stop, CliError> {
        let args = self.args;
        let kind = args.model.mechanism;
        let private = self.ledger.is_some();
        let delta = self.delta;
        let io = |source| CliError::Io {
            what: "writing to stdout".into(),
            source,
        };
        let bar = progress_bar(args.max_tokens as u64);
        let mut decoder = self.runner.decoder(self.layout.clone())?;
        let mut rows = decoder.prefill(prompt)?;
        let pacer = match args.step_time_ms {
            Some(ms) => Some(Pacer::new(Instant::now(), ms)?),
            None => None,
        };
        let mut generated: Vec<u32> = Vec::new();
        let mut printed = String::new();
        let mut stop = Stop::MaxTokens;
        let mut tempered = Vec::new();
        // The last step's ensemble, whose buffers the next one reuses.
        let mut last: Option<Ensemble> = None;
        for step in 0..args.max_tokens {
            let (public, members) = tempered_rows(&rows, args.model.temperature, &mut tempered);
            let ensemble = Ensemble::renew_or_new(
                last.take(),
                Rows::LogProbF32(public),
                Rows::LogProbF32(members),
            )?;
            // The step loop: the mechanism steps, its charge (a private step's, collected)
            // is committed durably, and only then is its token unsealed.
            let outcome = match self.step(&ensemble) {
                StepEnd::Released(outcome) => outcome,
                StepEnd::Refused => {
                    if let Some((store, budget)) = &mut self.ledger
                        && self.released == 0
                    {
                        let spent = store.spent(None)?.epsilon(budget.delta())?;
                        bar.finish_and_clear();
                        return Err(exhausted(&**store, spent.epsilon, *budget, kind));
                    }
                    // The end of the stream is released on the schedule too.
                    if let Some(pacer) = &pacer
                        && let Err(e) = pacer.pace(step)
                    {
                        bar.finish_and_clear();
                        return Err(e);
                    }
                    stop = Stop::Budget;
                    break;
                }
                StepEnd::Failed(e) => return Err(e),
            };
            let token = u32::try_from(outcome.token)
                .map_err(|_| CliError::arg("--model", "a token index does not fit in u32"))?;
            generated.push(token);
            self.released += 1;
            let spent = self.spent_epsilon()?;
            let piece = match self.tokenizer {
                Some(t) => {
                    let text = t
                        .decode(&generated)
                        .map_err(|e| CliError::Tokenizer(e.to_string()))?;
                    // Print what the new token added; a token that completes a character
                    // changes only the tail, so print from the first byte that differs.
                    let common = common_prefix(&printed, &text);
                    let piece = text[common..].to_string();
                    printed = text;
                    Some(piece)
                }
                None => None,
            };
            if let Some(pacer) = &pacer
                && let Err(e) = pacer.pace(step)
            {
                bar.finish_and_clear();
                return Err(e);
            }
            if args.json {
                let line = json!({
                    "prompt": index,
                    "index": step,
                    "token": token,
                    "text": piece,
                    "epsilon": finite(spent),
                    "delta": delta,
                    "private": private,
                });
                writeln!(self.out, "{line}").map_err(io)?;
            } else {
                match &piece {
                    Some(p) => write!(self.out, "{p}").map_err(io)?,
                    None => write!(self.out, "{}{token}", if step == 0 { "" } else { " " })
                        .map_err(io)?,
                }
            }
            self.out.flush().map_err(io)?;
            bar.set_position(step as u64 + 1);
            bar.set_message(format!("ε spent {spent:.6} (δ = {delta:e})"));
            if self.stops.contains(&token) {
                stop = Stop::EndOfSequence;
                break;
            }
            if step + 1 < args.max_tokens {
                rows = decoder.next_log_probs(token)?;
            }
            last = Some(ensemble);
        }
        bar.finish_and_clear();
        let spent = self.spent_epsilon()?;
        let budget_epsilon = self.ledger.as_ref().map(|(_, b)| b.epsilon());
        if args.json {
            let line = json!({
                "prompt": index,
                "prompt_tokens": prompt.len(),
                "done": true,
                "mechanism": kind.name(),
                "tokens": generated.len(),
                "token_ids": generated,
                "text": self.tokenizer.map(|_| printed.clone()),
                "stop": stop.name(),
                "epsilon": finite(spent),
                "delta": delta,
                "budget_epsilon": budget_epsilon,
                "private": private,
            });
            writeln!(self.out, "{line}").map_err(io)?;
        } else {
            writeln!(self.out).map_err(io)?;
        }
        self.out.flush().map_err(io)?;
        let which = if many {
            format!("prompt {index}: ")
        } else {
            String::new()
        };
        match (&self.ledger, budget_epsilon) {
            (Some((store, _)), Some(b)) => {
                eprintln!(
                    "privmix: {which}{} tokens with {}, spent ε = {spent} at δ = {delta} of the budget ε = {b}; stopped: {}",
                    generated.len(),
                    kind.name(),
                    stop.name()
                );
                if stop == Stop::Budget {
                    eprintln!(
                        "privmix: the privacy budget of ledger {} is exhausted: the text stopped early (a larger budget must be set explicitly: privmix ledger raise {} --epsilon E)",
                        store.describe(),
                        store.describe()
                    );
                }
            }
            _ => eprintln!(
                "privmix: {which}{} tokens with {}; NOT private (--no-privacy: nothing charged to a ledger; these tokens would cost ε = {spent} at δ = {delta}); stopped: {}",
                generated.len(),
                kind.name(),
                stop.name()
            ),
        }
        Ok(stop)
    }

    /// One step of the step loop for this batch of one: the mechanism on `ensemble`
    /// (a private step's charge collected, then committed to the ledger store; a run
    /// without a ledger charges the unbudgeted account as it steps), settled.
    fn step(&mut self, ensemble: &Ensemble) -> StepEnd {
        let (settled, commit_error) = match &mut self.ledger {
            Some((store, _)) => {
                let mut account = StepAccount::new(store.orders().clone());
                let stepped = self.mechanism.step(ensemble, &mut self.rng, &mut account);
                let drawn = Drawn::from_step(stepped, account.into_charge(None));
                let describe = store.describe();
                let (settled, error) = commit_one(drawn, &mut StoreSink(&mut **store));
                (settled, error.map(|e| mechanism_error(e, &describe)))
            }
            None => {
                let stepped = self
                    .mechanism
                    .step(ensemble, &mut self.rng, &mut self.unbudgeted);
                let drawn = Drawn::<_, PendingCharge>::from_step(stepped, None);
                (commit_one(drawn, &mut AlreadyCharged).0, None)
            }
        };
        match settled {
            Settled::Released { output, .. } => StepEnd::Released(output),
            Settled::Refused(_) => StepEnd::Refused,
            Settled::Failed(e) => StepEnd::Failed(e.into()),
            Settled::Idle | Settled::Unrecorded => match commit_error {
                // A store's refusal of the whole step is a refusal.
                Some(MechanismError::ChargeRefused(_)) => StepEnd::Refused,
                Some(e) => StepEnd::Failed(e.into()),
                None => StepEnd::Failed(CliError::arg(
                    "--ledger",
                    "internal: a step's charge was neither committed nor refused",
                )),
            },
        }
    }

    /// ε spent so far at δ: the ledger's, or what the unbudgeted account summed.
    fn spent_epsilon(&mut self) -> Result<f64, CliError> {
        match &mut self.ledger {
            Some((store, b)) => Ok(store.spent(None)?.epsilon(b.delta())?.epsilon),
            None => Ok(self.unbudgeted.spent().epsilon(self.delta)?.epsilon),
        }
    }
}

/// The flags that decide whether the run is private: a private run needs a ledger; a
/// run with `--no-privacy` (the ensemble, any seeded run, or an experiment) has none.
fn check_privacy_flags(args: &GenerateArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.seed.is_some() && args.ledger.is_some() {
        return Err(CliError::arg(
            "--seed",
            "a known seed makes every draw predictable, so a seeded run cannot be charged to a ledger: it is an experiment (drop --ledger and pass --no-privacy; its output is marked \"private\": false)",
        ));
    }
    if args.seed.is_some() && !args.no_privacy {
        return Err(CliError::arg(
            "--seed",
            "a seeded run is an experiment with no privacy: pass --no-privacy (its output is marked \"private\": false)",
        ));
    }
    if kind == MechanismKind::Ensemble && !args.no_privacy {
        return Err(CliError::arg(
            "--mechanism",
            "ensemble has no privacy guarantee: pass --no-privacy (it is never charged to a ledger)",
        ));
    }
    if args.no_privacy && args.ledger.is_some() {
        return Err(CliError::arg("--no-privacy", "conflicts with --ledger"));
    }
    if !args.no_privacy && args.ledger.is_none() {
        return Err(CliError::arg(
            "--ledger",
            "a private run needs a ledger to charge (a file, created if absent, or a postgres:// URL); --no-privacy runs without one, NOT privately",
        ));
    }
    Ok(())
}

fn exhausted(
    store: &dyn LedgerStore,
    spent: f64,
    budget: PrivacyBudget,
    kind: MechanismKind,
) -> CliError {
    CliError::BudgetExhausted {
        path: store.describe().into(),
        spent,
        delta: budget.delta(),
        budget: budget.epsilon(),
        mechanism: kind.name(),
    }
}

/// ε as JSON: a number, or null for +∞ (JSON has no infinity).
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{pos}/{len} tokens, {msg}") {
        bar.set_style(style);
    }
    bar
}
