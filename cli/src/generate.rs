//! `privmix generate`: private text generation, one charged step per released token.
//!
//! Every token is released only after the mechanism has charged its cost to the account
//! (the ledger's `charge` returns only once the record is synced), so the ledger always
//! covers what was printed. A charge the budget cannot pay stops the run: before the first
//! token that is an error (the budget is exhausted), later it ends the text early.
//!
//! What is printed is the released tokens, the ε the ledger has recorded as spent, and
//! the stop reason: never a λ, a data-dependent loss or any other step diagnostic, which
//! are functions of the private data the ledger does not charge for.
//!
//! A private run draws its coins from the OS-seeded generator. `--seed` makes every draw
//! predictable, so a seeded run is an experiment: it needs `--no-privacy`, refuses
//! `--ledger`, and its output says `"private": false` (the text footer says NOT private).

use std::io::Write;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_accountant::{Orders, PrivacyBudget};
use privmix_mechanisms::{Account, Ensemble, MechanismError, PrivacyRng, Rows, Unbudgeted};
use privmix_models::{LanguageModel, Tokenizer};
use serde_json::json;

use crate::args::{GenerateArgs, MechanismKind};
use crate::error::CliError;
use crate::ledger_open::{DEFAULT_DELTA, LedgerPlan, finish, prepare};
use crate::pacing::Pacer;
use crate::protected::protected_set;
use crate::setup::{MechanismPlan, build_mechanism, check_vocab, load_runner, load_tokenizer};

/// Why generation ended.
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

/// Runs `privmix generate`.
pub fn run(args: &GenerateArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.max_tokens == 0 {
        return Err(CliError::arg("--max-tokens", "must be at least 1"));
    }
    check_privacy_flags(args)?;
    if let Some(ms) = args.step_time_ms {
        Pacer::new(Instant::now(), ms)?;
    }

    // The ledger first: refuse before loading any model when it protects another
    // adapter set or its budget is spent (hashing the adapters reads only their files).
    // Duplicate members are refused with or without a ledger.
    let protected = protected_set(&args.model.adapters)?;
    let plan = match &args.ledger {
        Some(path) => Some(prepare(path, &protected, args.epsilon, args.delta)?),
        None => None,
    };
    if let Some(LedgerPlan::Open(ledger, budget)) = &plan {
        let spent = ledger
            .spent_epsilon(budget.delta())
            .map_err(|e| CliError::ledger(ledger.path(), e))?;
        if kind != MechanismKind::Public && spent.epsilon >= budget.epsilon() {
            return Err(exhausted(ledger.path(), spent.epsilon, *budget, kind));
        }
    }

    let runner = load_runner(&args.model)?;
    let tokenizer = load_tokenizer(&args.model)?;
    if let Some(t) = &tokenizer {
        check_vocab(t, &runner, &args.model.model)?;
    }
    let prompt = prompt_ids(args, tokenizer.as_ref())?;
    let vocab = runner.model().vocab_size();
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(CliError::arg(
            "--prompt-ids",
            format!("token id {bad} is outside the model's vocabulary of {vocab}"),
        ));
    }
    let stop_token = if args.no_stop {
        None
    } else {
        tokenizer.as_ref().and_then(Tokenizer::eos_id)
    };
    // Everything loaded: only now is a new ledger created.
    let mut ledger_and_budget = match (plan, &args.ledger) {
        (Some(plan), Some(path)) => Some(finish(plan, path, &protected, args.epsilon, args.delta)?),
        _ => None,
    };
    let private = ledger_and_budget.is_some();

    let default_orders = Orders::dp_accounting_default();
    let (epsilon, delta) = match &ledger_and_budget {
        Some((_, b)) => (b.epsilon(), b.delta()),
        None => (
            args.epsilon.unwrap_or(8.0),
            args.delta.unwrap_or(DEFAULT_DELTA),
        ),
    };
    let orders = match &ledger_and_budget {
        Some((l, _)) => l.orders().clone(),
        None => default_orders,
    };
    let (mut mechanism, layout) = build_mechanism(&MechanismPlan {
        kind,
        params: &args.model.params,
        members: runner.num_members(),
        epsilon,
        delta,
        queries: args.max_tokens as u64,
        orders: &orders,
    })?;
    let mut rng = match args.seed {
        Some(seed) => PrivacyRng::from_seed(seed),
        None => PrivacyRng::from_os()?,
    };
    let mut unbudgeted = Unbudgeted::new(orders);

    let bar = progress_bar(args.max_tokens as u64);
    let mut out = std::io::stdout().lock();
    let io = |source| CliError::Io {
        what: "writing to stdout".into(),
        source,
    };
    let mut decoder = runner.decoder(layout)?;
    let mut rows = decoder.prefill(&prompt)?;
    let pacer = match args.step_time_ms {
        Some(ms) => Some(Pacer::new(Instant::now(), ms)?),
        None => None,
    };
    let mut generated: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut stop = Stop::MaxTokens;
    // The last step's ensemble, whose buffers the next one reuses.
    let mut last: Option<Ensemble> = None;
    for index in 0..args.max_tokens {
        let ensemble = Ensemble::renew_or_new(
            last.take(),
            Rows::LogProbF32(rows.row(0)),
            Rows::LogProbF32(rows.member_rows()),
        )?;
        let account: &mut dyn Account = match &mut ledger_and_budget {
            Some((ledger, _)) => ledger,
            None => &mut unbudgeted,
        };
        let outcome = match mechanism.step(&ensemble, &mut rng, account) {
            Ok(outcome) => outcome,
            Err(MechanismError::ChargeRefused(_)) => {
                if let Some((ledger, budget)) = &ledger_and_budget
                    && generated.is_empty()
                {
                    let spent = ledger
                        .spent_epsilon(budget.delta())
                        .map_err(|e| CliError::ledger(ledger.path(), e))?;
                    bar.finish_and_clear();
                    return Err(exhausted(ledger.path(), spent.epsilon, *budget, kind));
                }
                // The end of the stream is released on the schedule too.
                if let Some(pacer) = &pacer
                    && let Err(e) = pacer.pace(index)
                {
                    bar.finish_and_clear();
                    return Err(e);
                }
                stop = Stop::Budget;
                break;
            }
            Err(e) => return Err(e.into()),
        };
        let token = u32::try_from(outcome.token)
            .map_err(|_| CliError::arg("--model", "a token index does not fit in u32"))?;
        generated.push(token);
        let spent = spent_epsilon(&ledger_and_budget, &unbudgeted, delta)?;
        let piece = match &tokenizer {
            Some(t) => {
                let text = t
                    .decode(&generated)
                    .map_err(|e| CliError::Tokenizer(e.to_string()))?;
                // Print what the new token added; a token that completes a character changes
                // only the tail, so print from the first byte that differs.
                let common = common_prefix(&printed, &text);
                let piece = text[common..].to_string();
                printed = text;
                Some(piece)
            }
            None => None,
        };
        if let Some(pacer) = &pacer
            && let Err(e) = pacer.pace(index)
        {
            bar.finish_and_clear();
            return Err(e);
        }
        if args.json {
            let line = json!({
                "index": index,
                "token": token,
                "text": piece,
                "epsilon": finite(spent),
                "delta": delta,
                "private": private,
            });
            writeln!(out, "{line}").map_err(io)?;
        } else {
            match &piece {
                Some(p) => write!(out, "{p}").map_err(io)?,
                None => write!(out, "{}{token}", if index == 0 { "" } else { " " }).map_err(io)?,
            }
        }
        out.flush().map_err(io)?;
        bar.set_position(index as u64 + 1);
        bar.set_message(format!("ε spent {spent:.6} (δ = {delta:e})"));
        if Some(token) == stop_token {
            stop = Stop::EndOfSequence;
            break;
        }
        if index + 1 < args.max_tokens {
            rows = decoder.next_log_probs(token)?;
        }
        last = Some(ensemble);
    }
    bar.finish_and_clear();
    let spent = spent_epsilon(&ledger_and_budget, &unbudgeted, delta)?;
    let budget_epsilon = ledger_and_budget.as_ref().map(|(_, b)| b.epsilon());
    if args.json {
        let line = json!({
            "done": true,
            "mechanism": kind.name(),
            "tokens": generated.len(),
            "token_ids": generated,
            "text": tokenizer.as_ref().map(|_| printed.clone()),
            "stop": stop.name(),
            "epsilon": finite(spent),
            "delta": delta,
            "budget_epsilon": budget_epsilon,
            "private": private,
        });
        writeln!(out, "{line}").map_err(io)?;
    } else {
        writeln!(out).map_err(io)?;
    }
    out.flush().map_err(io)?;
    match budget_epsilon {
        Some(b) => eprintln!(
            "privmix: {} tokens with {}, spent ε = {spent} at δ = {delta} of the budget ε = {b}; stopped: {}",
            generated.len(),
            kind.name(),
            stop.name()
        ),
        None => eprintln!(
            "privmix: {} tokens with {}; NOT private (--no-privacy: nothing charged to a ledger; these tokens would cost ε = {spent} at δ = {delta}); stopped: {}",
            generated.len(),
            kind.name(),
            stop.name()
        ),
    }
    Ok(())
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
            "a private run needs a ledger file to charge (created if absent); --no-privacy runs without one, NOT privately",
        ));
    }
    Ok(())
}

fn exhausted(
    path: &std::path::Path,
    spent: f64,
    budget: PrivacyBudget,
    kind: MechanismKind,
) -> CliError {
    CliError::BudgetExhausted {
        path: path.to_path_buf(),
        spent,
        delta: budget.delta(),
        budget: budget.epsilon(),
        mechanism: kind.name(),
    }
}

fn spent_epsilon(
    ledger: &Option<(privmix_accountant::Ledger, PrivacyBudget)>,
    unbudgeted: &Unbudgeted,
    delta: f64,
) -> Result<f64, CliError> {
    match ledger {
        Some((l, b)) => Ok(l
            .spent_epsilon(b.delta())
            .map_err(|e| CliError::ledger(l.path(), e))?
            .epsilon),
        None => Ok(unbudgeted.spent().epsilon(delta)?.epsilon),
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

fn prompt_ids(args: &GenerateArgs, tokenizer: Option<&Tokenizer>) -> Result<Vec<u32>, CliError> {
    let ids = match (&args.prompt_ids, &args.prompt, tokenizer) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(text), Some(t)) => t
            .encode(text, true)
            .map_err(|e| CliError::Tokenizer(e.to_string()))?,
        (None, Some(_), None) => return Err(CliError::NoTokenizer),
        (None, None, Some(t)) => t.bos_id().into_iter().collect(),
        (None, None, None) => return Err(CliError::NoTokenizer),
    };
    if ids.is_empty() {
        return Err(CliError::arg(
            "--prompt",
            "the prompt is empty and the tokenizer has no BOS token to start from",
        ));
    }
    Ok(ids)
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{pos}/{len} tokens, {msg}") {
        bar.set_style(style);
    }
    bar
}
