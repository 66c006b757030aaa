//! Opening the ledger a `generate` run charges, with the budget the flags ask for.

use std::path::Path;

use privmix_accountant::{Ledger, LedgerError, Orders, PrivacyBudget};

use crate::error::CliError;

/// Opens the ledger at `path`, or creates it with dp_accounting's default orders when
/// absent. `epsilon` (with `delta`) sets the budget: required to create a ledger, and
/// replaces an existing ledger's budget when given (a budget below what is already spent is
/// refused by the ledger). A ledger without a budget is refused: `generate` only charges
/// ledgers with a budget.
pub fn open_budgeted(
    path: &Path,
    epsilon: Option<f64>,
    delta: f64,
) -> Result<(Ledger, PrivacyBudget), CliError> {
    let requested = epsilon
        .map(|e| PrivacyBudget::new(e, delta))
        .transpose()
        .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    let mut ledger = if path.exists() {
        Ledger::open(path).map_err(|e| CliError::ledger(path, e))?
    } else {
        let Some(budget) = requested else {
            return Err(CliError::arg(
                "--epsilon",
                format!(
                    "ledger {} does not exist yet: pass --epsilon (and --delta) to create it with a budget",
                    path.display()
                ),
            ));
        };
        match Ledger::create(path, Orders::dp_accounting_default(), Some(budget)) {
            Ok(ledger) => ledger,
            Err(LedgerError::AlreadyExists(_)) => {
                Ledger::open(path).map_err(|e| CliError::ledger(path, e))?
            }
            Err(e) => return Err(CliError::ledger(path, e)),
        }
    };
    if let Some(budget) = requested
        && ledger.budget() != Some(budget)
    {
        ledger
            .set_budget(Some(budget))
            .map_err(|e| CliError::ledger(path, e))?;
    }
    let budget = ledger.budget().ok_or_else(|| {
        CliError::arg(
            "--epsilon",
            format!(
                "ledger {} has no budget: pass --epsilon (and --delta) to set one",
                path.display()
            ),
        )
    })?;
    Ok((ledger, budget))
}
