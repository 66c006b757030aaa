//! `privmix ledger show|verify|export|raise`. `show`, `verify` and `export` are read-only
//! views (no lock taken, nothing written; a torn final write is reported, not removed);
//! `raise` is the one way to change a budget, and it is recorded with its time.

use std::path::Path;

use privmix_accountant::{EntryKind, Ledger, LedgerReader, PrivacyBudget, verify};
use serde_json::{Value, json};

use crate::args::LedgerAction;
use crate::error::CliError;
use crate::ledger_open::DEFAULT_DELTA;

/// Runs `privmix ledger …`.
pub fn run(action: &LedgerAction) -> Result<(), CliError> {
    match action {
        LedgerAction::Show { path, delta } => show(path, *delta),
        LedgerAction::Verify { path } => {
            let s = verify(path).map_err(|e| CliError::ledger(path, e))?;
            println!(
                "ok: {} records ({} charges), {} bytes intact, {} bytes of a torn final write",
                s.records, s.charges, s.valid_len, s.torn_tail_bytes
            );
            Ok(())
        }
        LedgerAction::Export { path } => export(path),
        LedgerAction::Raise {
            path,
            epsilon,
            delta,
        } => raise(path, *epsilon, *delta),
    }
}

/// A time in ms since the Unix epoch as RFC 3339 UTC (`2026-01-02T03:04:05.678Z`).
pub fn utc(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the Unix epoch"))
}

fn budget_text(b: Option<PrivacyBudget>) -> String {
    b.map_or_else(
        || "none".into(),
        |b| format!("ε = {}, δ = {}", b.epsilon(), b.delta()),
    )
}

fn show(path: &Path, delta: Option<f64>) -> Result<(), CliError> {
    let s = verify(path).map_err(|e| CliError::ledger(path, e))?;
    let reader = LedgerReader::open(path).map_err(|e| CliError::ledger(path, e))?;
    let header = reader.header().clone();
    let delta = delta
        .or(s.budget.map(|b| b.delta()))
        .unwrap_or(DEFAULT_DELTA);
    let spent = s.spent.epsilon(delta)?;
    println!("ledger   {}", path.display());
    println!("format   version {}", s.version);
    match s.created_ms {
        Some(ms) => println!("created  {}", utc(ms)),
        None => println!("created  (not recorded: format version 1)"),
    }
    match &s.protected_set {
        Some(set) => {
            let n = set.len();
            println!(
                "protects {n} member adapter{}",
                if n == 1 { "" } else { "s" }
            );
            for m in set.members() {
                println!("         {m}");
            }
        }
        None => {
            println!("protects (no adapter set recorded: cannot be charged by privmix generate)")
        }
    }
    match s.budget {
        Some(b) => println!("budget   ε = {}, δ = {}", b.epsilon(), b.delta()),
        None => println!("budget   none"),
    }
    // The budget's history: the header's, then every budget record in order.
    let created = s.created_ms.map_or_else(|| "creation".into(), utc);
    println!(
        "history  {} (at creation, {created})",
        budget_text(header.initial_budget)
    );
    let mut charges = 0u64;
    for entry in reader {
        let entry = entry.map_err(|e| CliError::ledger(path, e))?;
        match entry.kind {
            EntryKind::Charge { .. } => charges += 1,
            EntryKind::Budget(b) => println!(
                "         {} (record {}, {}, after {charges} charges)",
                budget_text(b),
                entry.sequence,
                utc(entry.time_ms)
            ),
            _ => {}
        }
    }
    println!("charges  {}", s.charges);
    println!(
        "spent    ε = {} at δ = {delta} (order {})",
        spent.epsilon, spent.order
    );
    if let Some(b) = s.budget {
        let left = b.epsilon() - s.spent.epsilon(b.delta())?.epsilon;
        println!("left     ε ≈ {} at δ = {}", left.max(0.0), b.delta());
    }
    println!(
        "orders   {} (from {} to {})",
        s.orders.len(),
        s.orders.as_slice()[0],
        s.orders.as_slice()[s.orders.len() - 1]
    );
    Ok(())
}

/// One JSON number, or null for a non-finite value (JSON has no infinity).
fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn budget_json(b: Option<PrivacyBudget>) -> Value {
    b.map_or(
        Value::Null,
        |b| json!({ "epsilon": b.epsilon(), "delta": b.delta() }),
    )
}

fn export(path: &Path) -> Result<(), CliError> {
    let reader = LedgerReader::open(path).map_err(|e| CliError::ledger(path, e))?;
    let header = reader.header();
    let orders: Vec<Value> = header
        .orders
        .as_slice()
        .iter()
        .map(|&a| number(a))
        .collect();
    println!(
        "{}",
        json!({
            "kind": "header",
            "version": header.version,
            "created_ms": header.created_ms,
            "protected_set": header.protected_set.as_ref().map(|s| s.members().to_vec()),
            "budget": budget_json(header.initial_budget),
            "orders": orders,
        })
    );
    for entry in reader {
        let entry = entry.map_err(|e| CliError::ledger(path, e))?;
        let line = match &entry.kind {
            EntryKind::Charge { curve, label } => json!({
                "kind": "charge",
                "sequence": entry.sequence,
                "time_ms": entry.time_ms,
                "label": label,
                "epsilons": curve.epsilons().iter().map(|&e| number(e)).collect::<Vec<_>>(),
            }),
            EntryKind::Budget(b) => json!({
                "kind": "budget",
                "sequence": entry.sequence,
                "time_ms": entry.time_ms,
                "epsilon": b.map(|b| b.epsilon()),
                "delta": b.map(|b| b.delta()),
            }),
            _ => json!({ "kind": "unknown", "sequence": entry.sequence }),
        };
        println!("{line}");
    }
    Ok(())
}

/// Sets the budget of an existing ledger, as a timestamped record. The ledger
/// refuses a budget below what it has already spent (a typed error); the same
/// budget again writes nothing.
fn raise(path: &Path, epsilon: f64, delta: Option<f64>) -> Result<(), CliError> {
    let mut ledger = Ledger::open(path).map_err(|e| CliError::ledger(path, e))?;
    let old = ledger.budget();
    let delta = delta.or(old.map(|b| b.delta())).unwrap_or(DEFAULT_DELTA);
    let new = PrivacyBudget::new(epsilon, delta)
        .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    if old == Some(new) {
        println!(
            "ledger {}: the budget is already {}; nothing written",
            path.display(),
            budget_text(old)
        );
        return Ok(());
    }
    let sequence = ledger.next_sequence();
    ledger
        .set_budget(Some(new))
        .map_err(|e| CliError::ledger(path, e))?;
    println!(
        "ledger {}: budget {} -> {} (record {sequence})",
        path.display(),
        budget_text(old),
        budget_text(Some(new))
    );
    Ok(())
}
