//! `privmix ledger show|verify|export`: read-only views of a ledger file (no lock taken,
//! nothing written; a torn final write is reported, not removed).

use std::path::Path;

use privmix_accountant::{EntryKind, LedgerReader, verify};
use serde_json::{Value, json};

use crate::args::LedgerAction;
use crate::error::CliError;

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
    }
}

fn show(path: &Path, delta: Option<f64>) -> Result<(), CliError> {
    let s = verify(path).map_err(|e| CliError::ledger(path, e))?;
    let delta = delta.or(s.budget.map(|b| b.delta())).unwrap_or(1e-5);
    let spent = s.spent.epsilon(delta)?;
    println!("ledger   {}", path.display());
    match s.budget {
        Some(b) => println!("budget   ε = {}, δ = {}", b.epsilon(), b.delta()),
        None => println!("budget   none"),
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

fn export(path: &Path) -> Result<(), CliError> {
    let reader = LedgerReader::open(path).map_err(|e| CliError::ledger(path, e))?;
    let orders: Vec<Value> = reader
        .orders()
        .as_slice()
        .iter()
        .map(|&a| number(a))
        .collect();
    println!("{}", json!({ "kind": "header", "orders": orders }));
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
