//! Rows to values and back: records, costs, spending, budgets, curves and labels, each
//! checked as it is read.

use std::collections::{BTreeMap, HashMap};

use postgres::{Row, Transaction};
use privmix_accountant::{DpEvent, Orders, PrivacyBudget, RdpCurve};

use super::error::{Fail, pg};
use crate::ledger_store::StoreError;
use crate::ledger_store::snapshot::{BudgetChange, LeaseUse, Record, TenantSpent};

/// The label of the charge row that closes a lease and gives back its unspent part
/// (a row naming a lease is a reservation unless it carries this label).
pub(super) const RELEASE_LABEL: &str = "lease release";

/// Longest label, in bytes (the file ledger's limit).
const MAX_LABEL_BYTES: usize = privmix_accountant::MAX_LABEL_BYTES;

/// A stored cost: its curve and the event it was computed from, if any.
pub(super) struct StoredCost {
    pub(super) curve: RdpCurve,
    pub(super) event: Option<DpEvent>,
}

/// Every row of `privmix_costs`, by id, each checked: a curve over the ledger's orders,
/// a valid event, and the curve not below the event's curve at any order (a record
/// never under-counts its event).
pub(super) fn read_costs(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
) -> Result<HashMap<i64, StoredCost>, Fail> {
    let bad = |reason: String| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason,
        })
    };
    let rows = tx
        .query("SELECT id, curve, event FROM privmix_costs", &[])
        .map_err(pg("reading the costs"))?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.get(0);
        let curve = curve_of(orders, row.get(1), describe)?;
        let bytes: Vec<u8> = row.get(2);
        let event = if bytes.is_empty() {
            None
        } else {
            let event = privmix_accountant::decode_event(&bytes)
                .map_err(|e| bad(format!("cost {id}: {e}")))?;
            let computed = event.rdp(orders)?;
            if curve
                .epsilons()
                .iter()
                .zip(computed.epsilons())
                .any(|(stored, at_least)| stored < at_least)
            {
                return Err(bad(format!(
                    "cost {id}'s recorded curve is below its event's curve"
                )));
            }
            Some(event)
        };
        out.insert(id, StoredCost { curve, event });
    }
    Ok(out)
}

/// Every record, charges and budget changes, in sequence order.
pub(super) const RECORDS_SQL: &str = concat!(
    "SELECT sequence, ",
    ms!("at"),
    ", tenant, label, curve, cost, count, NULL::float8, NULL::float8, NULL::int8, lease
     FROM privmix_charges
     UNION ALL
     SELECT sequence, ",
    ms!("at"),
    ", NULL, NULL, NULL, NULL, NULL, epsilon, delta, after_charges, NULL FROM privmix_budgets
     ORDER BY 1"
);

pub(super) fn record_of(
    row: &Row,
    orders: &Orders,
    costs: &HashMap<i64, StoredCost>,
    describe: &str,
) -> Result<Record, Fail> {
    let sequence = u64_of(row.get(0), "sequence", describe)?;
    let time_ms = u64_of(row.get(1), "time", describe)?;
    let label: Option<String> = row.get(3);
    let Some(label) = label else {
        return Ok(Record::Budget(BudgetChange {
            sequence,
            time_ms,
            budget: budget_of(row, 7, 8, describe)?,
            after_charges: u64_of(row.get(9), "after_charges", describe)?,
        }));
    };
    // A row of schema version 1 holds its curve; a later one names its cost.
    let (curve, event) = match (
        row.get::<_, Option<Vec<f64>>>(4),
        row.get::<_, Option<i64>>(5),
    ) {
        (Some(values), None) => (curve_of(orders, values, describe)?, None),
        (None, Some(id)) => {
            let cost = costs.get(&id).ok_or_else(|| StoreError::Inconsistent {
                store: describe.to_owned(),
                reason: format!("charge {sequence} names cost {id}, which is not stored"),
            })?;
            (cost.curve.clone(), cost.event.clone())
        }
        _ => {
            return Err(StoreError::Inconsistent {
                store: describe.to_owned(),
                reason: format!("charge {sequence} has both or neither of a curve and a cost"),
            }
            .into());
        }
    };
    let lease = row
        .get::<_, Option<i64>>(10)
        .map(|id| u64_of(id, "lease", describe))
        .transpose()?;
    if let (Some(lease), RELEASE_LABEL) = (lease, label.as_str()) {
        return Ok(Record::Release {
            sequence,
            time_ms,
            tenant: row.get(2),
            lease,
            unspent: curve,
        });
    }
    let count = u64_of(row.get(6), "count", describe)?;
    if count == 0 {
        return Err(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: format!("charge {sequence} has a count of 0"),
        }
        .into());
    }
    Ok(Record::Charge {
        sequence,
        time_ms,
        tenant: row.get(2),
        label,
        count,
        curve,
        event,
        lease,
    })
}

/// Each tenant's budget in force (its last recorded), for every tenant or, given
/// `only`, for those of `only` the ledger records one for.
pub(super) fn read_tenant_budgets(
    tx: &mut Transaction<'_>,
    only: Option<&[&str]>,
    describe: &str,
) -> Result<BTreeMap<String, PrivacyBudget>, Fail> {
    const LAST_OF_EACH: &str = "SELECT DISTINCT ON (tenant) tenant, epsilon, delta \
                                FROM privmix_tenant_budgets";
    let rows = match only {
        Some([]) => return Ok(BTreeMap::new()),
        Some(tenants) => tx.query(
            &format!("{LAST_OF_EACH} WHERE tenant = ANY($1) ORDER BY tenant, id DESC"),
            &[&tenants],
        ),
        None => tx.query(&format!("{LAST_OF_EACH} ORDER BY tenant, id DESC"), &[]),
    }
    .map_err(pg("reading the tenants' budgets"))?;
    let mut out = BTreeMap::new();
    for row in &rows {
        if let Some(b) = budget_of(row, 1, 2, describe)? {
            out.insert(row.get(0), b);
        }
    }
    Ok(out)
}

/// Every change of a tenant's budget, in the order recorded: the tenant, the budget,
/// and how many records came before it.
pub(super) fn read_tenant_budget_changes(
    tx: &mut Transaction<'_>,
    describe: &str,
) -> Result<Vec<(String, PrivacyBudget, u64)>, Fail> {
    let rows = tx
        .query(
            "SELECT tenant, epsilon, delta, after_records FROM privmix_tenant_budgets ORDER BY id",
            &[],
        )
        .map_err(pg("reading the tenants' budgets"))?;
    rows.iter()
        .map(|row| {
            let budget = budget_of(row, 1, 2, describe)?.ok_or_else(|| {
                Fail::Store(StoreError::Inconsistent {
                    store: describe.to_owned(),
                    reason: "a tenant's budget without ε and δ".into(),
                })
            })?;
            Ok((
                row.get(0),
                budget,
                u64_of(row.get(3), "after_records", describe)?,
            ))
        })
        .collect()
}

/// Every row of `privmix_leases`, by id.
pub(super) fn read_leases(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
) -> Result<Vec<LeaseUse>, Fail> {
    let rows = tx
        .query(
            "SELECT id, replica, tenant, reserved, used, charges,
                    (SELECT coalesce(sum(c.count), 0)::int8 FROM privmix_charges c
                     WHERE c.lease = l.id AND c.label <> $1),
                    EXISTS (SELECT 1 FROM privmix_charges c
                            WHERE c.lease = l.id AND c.label = $1)
             FROM privmix_leases l ORDER BY id",
            &[&RELEASE_LABEL],
        )
        .map_err(pg("reading the leases"))?;
    rows.iter()
        .map(|row| {
            Ok(LeaseUse {
                id: u64_of(row.get(0), "a lease id", describe)?,
                replica: row.get(1),
                tenant: row.get(2),
                reserved: curve_of(orders, row.get(3), describe)?,
                used: curve_of(orders, row.get(4), describe)?,
                charges: u64_of(row.get(5), "a lease's charges", describe)?,
                reservations: u64_of(row.get(6), "a lease's reservations", describe)?,
                closed: row.get(7),
            })
        })
        .collect()
}

pub(super) fn budget_change_of(row: &Row, describe: &str) -> Result<BudgetChange, Fail> {
    Ok(BudgetChange {
        sequence: u64_of(row.get(0), "sequence", describe)?,
        time_ms: u64_of(row.get(1), "time", describe)?,
        budget: budget_of(row, 2, 3, describe)?,
        after_charges: u64_of(row.get(4), "after_charges", describe)?,
    })
}

/// Every row of `privmix_spent`, by key.
pub(super) fn read_spent_rows(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
) -> Result<BTreeMap<String, TenantSpent>, Fail> {
    let rows = tx
        .query("SELECT tenant, curve, charges FROM privmix_spent", &[])
        .map_err(pg("reading the spending"))?;
    let mut out = BTreeMap::new();
    for row in &rows {
        out.insert(
            row.get::<_, String>(0),
            TenantSpent {
                charges: u64_of(row.get(2), "charges", describe)?,
                spent: curve_of(orders, row.get(1), describe)?,
            },
        );
    }
    Ok(out)
}

/// The budget in columns `eps` and `delta` of `row` (both NULL: none).
pub(super) fn budget_of(
    row: &Row,
    eps: usize,
    delta: usize,
    describe: &str,
) -> Result<Option<PrivacyBudget>, Fail> {
    let bad = |reason: String| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason,
        })
    };
    match (
        row.get::<_, Option<f64>>(eps),
        row.get::<_, Option<f64>>(delta),
    ) {
        (Some(e), Some(d)) => PrivacyBudget::new(e, d)
            .map(Some)
            .map_err(|e| bad(format!("a stored budget: {e}"))),
        (None, None) => Ok(None),
        _ => Err(bad("a stored budget has only one of ε and δ".into())),
    }
}

pub(super) fn budget_columns(budget: Option<PrivacyBudget>) -> (Option<f64>, Option<f64>) {
    budget.map_or((None, None), |b| (Some(b.epsilon()), Some(b.delta())))
}

/// A stored curve over `orders`.
pub(super) fn curve_of(
    orders: &Orders,
    values: Vec<f64>,
    describe: &str,
) -> Result<RdpCurve, Fail> {
    RdpCurve::new(orders.clone(), values).map_err(|e| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: format!("a stored curve: {e}"),
        })
    })
}

pub(super) fn u64_of(value: i64, what: &str, describe: &str) -> Result<u64, Fail> {
    u64::try_from(value).map_err(|_| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: format!("{what} is negative ({value})"),
        })
    })
}

/// A label the table can hold, within the file ledger's length limit.
pub(super) fn check_label(label: &str) -> Result<(), StoreError> {
    if label.len() > MAX_LABEL_BYTES {
        return Err(StoreError::BadLabel {
            reason: format!(
                "it is {} bytes long; the limit is {MAX_LABEL_BYTES}",
                label.len()
            ),
        });
    }
    if label.contains('\0') {
        return Err(StoreError::BadLabel {
            reason: "it holds a NUL character, which PostgreSQL text cannot".into(),
        });
    }
    Ok(())
}
