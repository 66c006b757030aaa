//! `privmix ledger show|verify|export|raise|tenant-budget`, for a ledger file or a PostgreSQL ledger
//! (`postgres://…`). `show`, `verify` and `export` are read-only views (a file is read
//! without its lock and nothing is written: a torn final write is reported, not
//! removed; PostgreSQL is read in one read-only snapshot); `raise` is the one way to
//! change a budget, and it is recorded with its time.

use std::io::Write;

use privmix_accountant::{EntryKind, LedgerReader, PrivacyBudget, RdpCurve, verify};
use serde_json::{Map, Value, json};

use crate::args::LedgerAction;
use crate::error::CliError;
use crate::ledger_common::{DEFAULT_DELTA, utc};
use crate::ledger_store::{
    PostgresStore, Record, Snapshot, StoreError, StoreFormat, StoreSpec, open_existing,
    snapshot_of_file, split_label,
};

/// Runs `privmix ledger …`.
pub fn run(action: &LedgerAction) -> Result<(), CliError> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match action {
        LedgerAction::Show {
            ledger,
            delta,
            json,
        } => show(&mut out, ledger, *delta, *json),
        LedgerAction::Verify { ledger } => verify_cmd(&mut out, ledger),
        LedgerAction::Export { ledger } => export(&mut out, ledger),
        LedgerAction::Raise {
            ledger,
            epsilon,
            delta,
        } => raise(&mut out, ledger, *epsilon, *delta),
        LedgerAction::TenantBudget {
            ledger,
            tenant,
            epsilon,
            delta,
        } => tenant_budget(&mut out, ledger, tenant, *epsilon, *delta),
    };
    out.flush().map_err(write_failed)?;
    result
}

fn write_failed(source: std::io::Error) -> CliError {
    CliError::Io {
        what: "writing to stdout".into(),
        source,
    }
}

/// `writeln!` onto the output, a failed write a [`CliError::Io`].
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).map_err(write_failed)?
    };
}

fn budget_text(b: Option<PrivacyBudget>) -> String {
    b.map_or_else(
        || "none".into(),
        |b| format!("ε = {}, δ = {}", b.epsilon(), b.delta()),
    )
}

/// The snapshot of the ledger `spec`, read without writing.
fn read_snapshot(spec: &str) -> Result<Snapshot, CliError> {
    Ok(match StoreSpec::parse(spec)? {
        StoreSpec::File(path) => snapshot_of_file(&path)?,
        StoreSpec::Postgres { url, .. } => {
            use crate::ledger_store::LedgerStore;
            PostgresStore::open(&url)?.snapshot()?
        }
    })
}

/// `privmix ledger show`: the text report, or with `json` one JSON object.
pub fn show(
    out: &mut dyn Write,
    spec: &str,
    delta: Option<f64>,
    json: bool,
) -> Result<(), CliError> {
    let s = read_snapshot(spec)?;
    let delta = delta
        .or(s.budget.map(|b| b.delta()))
        .unwrap_or(DEFAULT_DELTA);
    if json {
        let value = show_json(&s, delta)?;
        say!(out, "{value}");
        return Ok(());
    }
    let spent = s.spent.epsilon(delta)?;
    say!(out, "ledger   {}", s.store);
    match s.format {
        StoreFormat::File { version, .. } => say!(out, "format   version {version}"),
        StoreFormat::Postgres { schema_version } => {
            say!(out, "format   PostgreSQL, schema version {schema_version}")
        }
    }
    match s.created_ms {
        Some(ms) => say!(out, "created  {}", utc(ms)),
        None => say!(out, "created  (not recorded: format version 1)"),
    }
    match &s.protected_set {
        Some(set) => {
            let n = set.len();
            say!(
                out,
                "protects {n} member adapter{}",
                if n == 1 { "" } else { "s" }
            );
            for m in set.members() {
                say!(out, "         {m}");
            }
        }
        None => say!(
            out,
            "protects (no adapter set recorded: cannot be charged by privmix generate)"
        ),
    }
    say!(out, "budget   {}", budget_text(s.budget));
    // The budget's history: the one it was created with, then every change in order.
    let created = s.created_ms.map_or_else(|| "creation".into(), utc);
    say!(
        out,
        "history  {} (at creation, {created})",
        budget_text(s.initial_budget)
    );
    for change in &s.history {
        say!(
            out,
            "         {} (record {}, {}, after {} charges)",
            budget_text(change.budget),
            change.sequence,
            utc(change.time_ms),
            change.after_charges
        );
    }
    say!(out, "charges  {}", s.charges);
    say!(
        out,
        "spent    ε = {} at δ = {delta} (order {})",
        spent.epsilon,
        spent.order
    );
    if let Some(b) = s.budget {
        let left = b.epsilon() - s.spent.epsilon(b.delta())?.epsilon;
        say!(out, "left     ε ≈ {} at δ = {}", left.max(0.0), b.delta());
    }
    if !s.tenants.is_empty() {
        say!(out, "tenants  {}", s.tenants.len());
        for (name, t) in &s.tenants {
            let e = t.spent.epsilon(delta)?;
            let own = s.tenant_budgets.get(name).map_or_else(String::new, |b| {
                format!(" (its budget {})", budget_text(Some(*b)))
            });
            say!(
                out,
                "         {name}: {} charges, ε = {} at δ = {delta}{own}",
                t.charges,
                e.epsilon
            );
        }
    }
    if !s.leases.is_empty() {
        say!(
            out,
            "leases   {} (reserved and counted as spent; an open lease's unspent part is given back only when its replica stops cleanly)",
            s.leases.len()
        );
        for l in &s.leases {
            say!(
                out,
                "         {} ({}, {}): reserved ε = {} in {} reservations, spent ε = {} in {} charges, at δ = {delta}{}",
                l.id,
                l.replica,
                l.tenant
                    .as_deref()
                    .map_or_else(|| "no tenant".into(), |t| format!("tenant {t}")),
                l.reserved.epsilon(delta)?.epsilon,
                l.reservations,
                l.used.epsilon(delta)?.epsilon,
                l.charges,
                if l.closed {
                    " (closed, its unspent part given back)"
                } else {
                    ""
                }
            );
        }
    }
    say!(
        out,
        "orders   {} (from {} to {})",
        s.orders.len(),
        s.orders.as_slice()[0],
        s.orders.as_slice()[s.orders.len() - 1]
    );
    Ok(())
}

/// `ε`, δ and the order that gave it, as JSON.
fn spent_json(curve: &RdpCurve, delta: f64) -> Result<Value, CliError> {
    let e = curve.epsilon(delta)?;
    Ok(json!({ "epsilon": number(e.epsilon), "delta": e.delta, "order": number(e.order) }))
}

/// The object `privmix ledger show --json` prints.
fn show_json(s: &Snapshot, delta: f64) -> Result<Value, CliError> {
    let format = match s.format {
        StoreFormat::File {
            version,
            torn_tail_bytes,
        } => json!({ "kind": "file", "version": version, "torn_tail_bytes": torn_tail_bytes }),
        StoreFormat::Postgres { schema_version } => {
            json!({ "kind": "postgres", "schema_version": schema_version })
        }
    };
    let history: Vec<Value> = s
        .history
        .iter()
        .map(|c| {
            json!({
                "sequence": c.sequence,
                "time_ms": c.time_ms,
                "budget": budget_json(c.budget),
                "after_charges": c.after_charges,
            })
        })
        .collect();
    let mut tenants = Map::new();
    for (name, t) in &s.tenants {
        tenants.insert(
            name.clone(),
            json!({
                "charges": t.charges,
                "spent": spent_json(&t.spent, delta)?,
                "budget": budget_json(s.tenant_budgets.get(name).copied()),
            }),
        );
    }
    // Tenants with a budget and no charge yet.
    for (name, b) in &s.tenant_budgets {
        if !tenants.contains_key(name) {
            tenants.insert(
                name.clone(),
                json!({ "charges": 0, "spent": Value::Null, "budget": budget_json(Some(*b)) }),
            );
        }
    }
    let left = match s.budget {
        Some(b) => number((b.epsilon() - s.spent.epsilon(b.delta())?.epsilon).max(0.0)),
        None => Value::Null,
    };
    let leases = s
        .leases
        .iter()
        .map(|l| {
            Ok(json!({
                "id": l.id,
                "replica": l.replica,
                "tenant": l.tenant,
                "reserved": spent_json(&l.reserved, delta)?,
                "used": spent_json(&l.used, delta)?,
                "charges": l.charges,
                "reservations": l.reservations,
                "closed": l.closed,
            }))
        })
        .collect::<Result<Vec<Value>, CliError>>()?;
    Ok(json!({
        "ledger": s.store,
        "format": format,
        "created_ms": s.created_ms,
        "created": s.created_ms.map(utc),
        "protected_set": s.protected_set.as_ref().map(|p| p.members().to_vec()),
        "budget": budget_json(s.budget),
        "initial_budget": budget_json(s.initial_budget),
        "history": history,
        "charges": s.charges,
        "spent": spent_json(&s.spent, delta)?,
        "left": left,
        "tenants": tenants,
        "leases": leases,
        "orders": s.orders.as_slice().iter().map(|&a| number(a)).collect::<Vec<_>>(),
    }))
}

/// `privmix ledger verify`: every record checked, nothing changed.
pub fn verify_cmd(out: &mut dyn Write, spec: &str) -> Result<(), CliError> {
    match StoreSpec::parse(spec)? {
        StoreSpec::File(path) => {
            let s = verify(&path).map_err(|e| CliError::ledger(&path, e))?;
            say!(
                out,
                "ok: {} records ({} charges), {} bytes intact, {} bytes of a torn final write",
                s.records,
                s.charges,
                s.valid_len,
                s.torn_tail_bytes
            );
        }
        StoreSpec::Postgres { url, .. } => {
            let v = PostgresStore::open(&url)?.verify()?;
            say!(
                out,
                "ok: {} records ({} charges, {} tenants, {} leases that spent {} charges); the totals are the composition of their charges, each lease within its reservations",
                v.records,
                v.charges,
                v.tenants,
                v.leases,
                v.lease_charges
            );
        }
    }
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

fn epsilons_json(curve: &RdpCurve) -> Vec<Value> {
    curve.epsilons().iter().map(|&e| number(e)).collect()
}

/// `privmix ledger export`: the header, then every record, one JSON object a line.
pub fn export(out: &mut dyn Write, spec: &str) -> Result<(), CliError> {
    match StoreSpec::parse(spec)? {
        StoreSpec::File(path) => export_file(out, &path),
        StoreSpec::Postgres { url, .. } => {
            use crate::ledger_store::LedgerStore;
            let mut store = PostgresStore::open(&url)?;
            let s = store.snapshot()?;
            let header = json!({
                "kind": "header",
                "format": "postgres",
                "schema_version": match s.format {
                    StoreFormat::Postgres { schema_version } => schema_version,
                    StoreFormat::File { .. } => 0,
                },
                "created_ms": s.created_ms,
                "protected_set": s.protected_set.as_ref().map(|p| p.members().to_vec()),
                "budget": budget_json(s.initial_budget),
                "orders": s.orders.as_slice().iter().map(|&a| number(a)).collect::<Vec<_>>(),
            });
            say!(out, "{header}");
            let mut each = |record: Record| -> Result<(), StoreError> {
                let line = match record {
                    Record::Charge {
                        sequence,
                        time_ms,
                        tenant,
                        label,
                        count,
                        curve,
                        event,
                        lease,
                    } => json!({
                        "kind": "charge",
                        "sequence": sequence,
                        "time_ms": time_ms,
                        "tenant": tenant,
                        "label": label,
                        "count": count,
                        "event": event,
                        "lease": lease,
                        "epsilons": epsilons_json(&curve),
                    }),
                    Record::Release {
                        sequence,
                        time_ms,
                        tenant,
                        lease,
                        unspent,
                    } => json!({
                        "kind": "release",
                        "sequence": sequence,
                        "time_ms": time_ms,
                        "tenant": tenant,
                        "lease": lease,
                        "epsilons": epsilons_json(&unspent),
                    }),
                    Record::Budget(c) => json!({
                        "kind": "budget",
                        "sequence": c.sequence,
                        "time_ms": c.time_ms,
                        "epsilon": c.budget.map(|b| b.epsilon()),
                        "delta": c.budget.map(|b| b.delta()),
                    }),
                };
                writeln!(out, "{line}")
                    .map_err(|e| StoreError::Backend(format!("writing to stdout: {e}")))
            };
            store.for_each_record(&mut each)?;
            Ok(())
        }
    }
}

fn export_file(out: &mut dyn Write, path: &std::path::Path) -> Result<(), CliError> {
    let reader = LedgerReader::open(path).map_err(|e| CliError::ledger(path, e))?;
    let header = reader.header();
    say!(
        out,
        "{}",
        json!({
            "kind": "header",
            "version": header.version,
            "created_ms": header.created_ms,
            "protected_set": header.protected_set.as_ref().map(|s| s.members().to_vec()),
            "budget": budget_json(header.initial_budget),
            "orders": header.orders.as_slice().iter().map(|&a| number(a)).collect::<Vec<_>>(),
        })
    );
    for entry in reader {
        let entry = entry.map_err(|e| CliError::ledger(path, e))?;
        let line = match &entry.kind {
            EntryKind::Charge { curve, label } => {
                let (tenant, label) = split_label(label);
                json!({
                    "kind": "charge",
                    "sequence": entry.sequence,
                    "time_ms": entry.time_ms,
                    "tenant": tenant,
                    "label": label,
                    "epsilons": epsilons_json(curve),
                    // The event the charge paid for (format 3 ledgers), to re-account
                    // the run with another method; null for a measured curve.
                    "event": entry.event().map(serde_json::to_value).transpose().map_err(|e| {
                        CliError::Io {
                            what: format!("writing charge {}'s event", entry.sequence),
                            source: e.into(),
                        }
                    })?,
                })
            }
            EntryKind::Step(runs) => {
                let runs = runs
                    .iter()
                    .map(|run| {
                        let (tenant, label) = split_label(&run.label);
                        let event = run.event.as_ref().map(serde_json::to_value).transpose();
                        Ok(json!({
                            "tenant": tenant,
                            "label": label,
                            "count": run.count,
                            "epsilons": epsilons_json(&run.curve),
                            "event": event.map_err(|e| CliError::Io {
                                what: format!("writing step {}'s event", entry.sequence),
                                source: e.into(),
                            })?,
                        }))
                    })
                    .collect::<Result<Vec<_>, CliError>>()?;
                // One decoding step: each run's curve charged `count` times in turn.
                json!({
                    "kind": "step",
                    "sequence": entry.sequence,
                    "time_ms": entry.time_ms,
                    "runs": runs,
                })
            }
            EntryKind::Budget(b) => json!({
                "kind": "budget",
                "sequence": entry.sequence,
                "time_ms": entry.time_ms,
                "epsilon": b.map(|b| b.epsilon()),
                "delta": b.map(|b| b.delta()),
            }),
            _ => json!({ "kind": "unknown", "sequence": entry.sequence }),
        };
        say!(out, "{line}");
    }
    Ok(())
}

/// `privmix ledger tenant-budget`: sets a tenant's own budget in a PostgreSQL ledger, as
/// a timestamped record; refused below what the tenant has spent (a typed error).
pub fn tenant_budget(
    out: &mut dyn Write,
    spec: &str,
    tenant: &str,
    epsilon: f64,
    delta: Option<f64>,
) -> Result<(), CliError> {
    let mut store = open_existing(spec)?;
    let delta = delta
        .or(store.budget().map(|b| b.delta()))
        .unwrap_or(DEFAULT_DELTA);
    let budget = PrivacyBudget::new(epsilon, delta)
        .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    store.set_tenant_budget(tenant, budget)?;
    say!(
        out,
        "ledger {}: tenant {tenant}'s budget is {}",
        store.describe(),
        budget_text(Some(budget))
    );
    Ok(())
}

/// `privmix ledger raise`: sets the budget of an existing ledger, as a timestamped
/// record. The store refuses a budget below what it has already spent (a typed
/// error); the same budget again writes nothing.
pub fn raise(
    out: &mut dyn Write,
    spec: &str,
    epsilon: f64,
    delta: Option<f64>,
) -> Result<(), CliError> {
    let mut store = open_existing(spec)?;
    let old = store.budget();
    let delta = delta.or(old.map(|b| b.delta())).unwrap_or(DEFAULT_DELTA);
    let new = PrivacyBudget::new(epsilon, delta)
        .map_err(|e| CliError::arg("--epsilon/--delta", e.to_string()))?;
    if old == Some(new) {
        say!(
            out,
            "ledger {}: the budget is already {}; nothing written",
            store.describe(),
            budget_text(old)
        );
        return Ok(());
    }
    let sequence = store.raise(new)?;
    say!(
        out,
        "ledger {}: budget {} -> {} (record {sequence})",
        store.describe(),
        budget_text(old),
        budget_text(Some(new))
    );
    Ok(())
}
