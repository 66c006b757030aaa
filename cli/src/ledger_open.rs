//! Opening the ledger a `generate` run charges.
//!
//! Two rules keep a budget meaningful:
//!
//! - A ledger charges only for the adapter set it was created for: its header
//!   records the set's identity (see `protected.rs`), and a ledger recording
//!   another set, or none (format 1, written before sets were recorded), is
//!   refused. Creating a ledger is announced on stderr with the set and time.
//! - The budget changes only through `privmix ledger raise`, an explicit,
//!   recorded act: `--epsilon`/`--delta` create a ledger's budget, and for an
//!   existing ledger may only repeat it.

use std::path::Path;

use privmix_accountant::{Ledger, LedgerError, Orders, PrivacyBudget, ProtectedSet};

use crate::error::CliError;
use crate::ledger_common::{DEFAULT_DELTA, utc};

/// The ledger a run will charge: an existing one, opened and checked, or the
/// budget of one to create once the model and adapters have loaded (so that a
/// run failing on bad input leaves no new ledger behind).
#[derive(Debug)]
pub enum LedgerPlan {
    /// An existing ledger protecting the run's adapters, with its budget.
    Open(Ledger, PrivacyBudget),
    /// No ledger yet: create one with this budget.
    Create(PrivacyBudget),
}

/// Opens and checks the ledger at `path` for a run over the adapters
/// `protected`, or, when absent, checks that `--epsilon` (with `delta`)
/// gives the budget to create it with.
pub fn prepare(
    path: &Path,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<LedgerPlan, CliError> {
    if path.exists() {
        let ledger = Ledger::open(path).map_err(|e| CliError::ledger(path, e))?;
        let budget = check_existing(&ledger, protected, epsilon, delta)?;
        return Ok(LedgerPlan::Open(ledger, budget));
    }
    let Some(eps) = epsilon else {
        return Err(CliError::arg(
            "--epsilon",
            format!(
                "ledger {} does not exist yet: pass --epsilon (and --delta) to create it with a budget",
                path.display()
            ),
        ));
    };
    let budget = PrivacyBudget::new(eps, delta.unwrap_or(DEFAULT_DELTA))
        .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    Ok(LedgerPlan::Create(budget))
}

/// The ledger of `plan`: the opened one, or a new one at `path` protecting
/// `protected` (dp_accounting's default orders), announced on stderr.
pub fn finish(
    plan: LedgerPlan,
    path: &Path,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<(Ledger, PrivacyBudget), CliError> {
    let budget = match plan {
        LedgerPlan::Open(ledger, budget) => return Ok((ledger, budget)),
        LedgerPlan::Create(budget) => budget,
    };
    let orders = Orders::dp_accounting_default();
    match Ledger::create_protecting(path, orders, Some(budget), protected.clone()) {
        Ok(ledger) => {
            announce(&ledger, budget);
            Ok((ledger, budget))
        }
        // Created by another process in between: use theirs, checked like any other.
        Err(LedgerError::AlreadyExists(_)) => {
            let ledger = Ledger::open(path).map_err(|e| CliError::ledger(path, e))?;
            let budget = check_existing(&ledger, protected, epsilon, delta)?;
            Ok((ledger, budget))
        }
        Err(e) => Err(CliError::ledger(path, e)),
    }
}

/// An existing ledger must protect `protected`, have a budget, and the flags
/// may only repeat that budget. Returns the budget.
fn check_existing(
    ledger: &Ledger,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<PrivacyBudget, CliError> {
    let path = ledger.path();
    ledger
        .check_protects(protected)
        .map_err(|e| CliError::ledger(path, e))?;
    let budget = ledger.budget().ok_or_else(|| {
        CliError::arg(
            "--ledger",
            format!(
                "ledger {} has no budget: set one with `privmix ledger raise {} --epsilon E`",
                path.display(),
                path.display()
            ),
        )
    })?;
    check_requested(path, budget, epsilon, delta)?;
    Ok(budget)
}

/// `--epsilon`/`--delta` against an existing ledger's budget: above it (in ε or
/// δ) is [`CliError::BudgetRaiseNeeded`], saying how to raise it; below it is
/// refused too (the ledger's budget is the one in force: omit the flags).
fn check_requested(
    path: &Path,
    budget: PrivacyBudget,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<(), CliError> {
    if epsilon.is_none() && delta.is_none() {
        return Ok(());
    }
    let requested = PrivacyBudget::new(
        epsilon.unwrap_or(budget.epsilon()),
        delta.unwrap_or(budget.delta()),
    )
    .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    if requested == budget {
        return Ok(());
    }
    if requested.epsilon() > budget.epsilon() || requested.delta() > budget.delta() {
        return Err(CliError::BudgetRaiseNeeded {
            path: path.to_path_buf(),
            recorded: budget,
            requested,
        });
    }
    Err(CliError::arg(
        "--epsilon/--delta",
        format!(
            "ledger {} has the budget ε = {}, δ = {}; the flags may only repeat it (omit them to use it); a budget changes only with `privmix ledger raise`",
            path.display(),
            budget.epsilon(),
            budget.delta()
        ),
    ))
}

/// Creating a ledger is visible: printed once, on stderr.
fn announce(ledger: &Ledger, budget: PrivacyBudget) {
    let when = ledger.created_ms().map_or_else(|| "?".into(), utc);
    let set = ledger
        .protected_set()
        .map_or_else(|| "no adapter set".into(), ToString::to_string);
    eprintln!(
        "privmix: created ledger {} at {when} with the budget ε = {}, δ = {}, protecting {set}",
        ledger.path().display(),
        budget.epsilon(),
        budget.delta()
    );
}
