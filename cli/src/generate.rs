//! `privmix generate`: private text generation, one charged step per released token.
//!
//! Every token is released only after the mechanism has charged its cost to the account
//! (the ledger's `charge` returns only once the record is synced), so the ledger always
//! covers what was printed. A charge the budget cannot pay stops the run: before the first
//! token that is an error (the budget is exhausted), later it ends the text early.

use std::io::Write;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_accountant::{Orders, PrivacyBudget};
use privmix_mechanisms::{Account, Ensemble, MechanismError, PrivacyRng, Rows, Unbudgeted};
use privmix_models::{LanguageModel, Tokenizer};
use serde_json::json;

use crate::args::{GenerateArgs, MechanismKind};
use crate::error::CliError;
use crate::ledger_open::open_budgeted;
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
    if kind == MechanismKind::Ensemble && !args.no_privacy {
        return Err(CliError::arg(
            "--mechanism",
            "ensemble has no privacy guarantee: pass --no-privacy (it is never charged to a ledger)",
        ));
    }
    if args.no_privacy && !matches!(kind, MechanismKind::Ensemble | MechanismKind::Public) {
        return Err(CliError::arg(
            "--no-privacy",
            format!(
                "{} reads private data: give it a --ledger and a budget",
                kind.name()
            ),
        ));
    }
    if args.no_privacy && args.ledger.is_some() {
        return Err(CliError::arg("--no-privacy", "conflicts with --ledger"));
    }

    // The ledger first: refuse before loading anything when its budget is spent.
    let mut ledger_and_budget = match &args.ledger {
        Some(path) => Some(open_budgeted(path, args.epsilon, args.delta)?),
        None if args.no_privacy => None,
        None => {
            return Err(CliError::arg(
                "--ledger",
                "a private mechanism needs a ledger file to charge (created if absent)",
            ));
        }
    };
    if let Some((ledger, budget)) = &ledger_and_budget {
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

    let default_orders = Orders::dp_accounting_default();
    let (epsilon, delta) = match &ledger_and_budget {
        Some((_, b)) => (b.epsilon(), b.delta()),
        None => (1.0, args.delta),
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
        if args.json {
            let line = json!({
                "index": index,
                "token": token,
                "text": piece,
                "epsilon": finite(spent),
                "delta": delta,
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
        });
        writeln!(out, "{line}").map_err(io)?;
    } else {
        writeln!(out).map_err(io)?;
    }
    out.flush().map_err(io)?;
    let budget_note = budget_epsilon.map_or(String::new(), |b| format!(" of the budget ε = {b}"));
    eprintln!(
        "privmix: {} tokens with {}, spent ε = {spent} at δ = {delta}{budget_note}; stopped: {}",
        generated.len(),
        kind.name(),
        stop.name()
    );
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
