//! Charging: a step's charges checked in order under the ledger's lock and appended as
//! runs naming stored costs; and budget changes.

use std::collections::{BTreeMap, HashMap};

use postgres::Transaction;
use privmix_accountant::{Orders, PrivacyBudget, RdpCurve};

use super::codec::{budget_columns, budget_of, check_label, curve_of, read_tenant_budgets, u64_of};
use super::error::{Fail, pg};
use super::schema::TOTAL_KEY;
use crate::ledger_store::step::{Cost, PendingCharge};
use crate::ledger_store::{StepOutcomes, StoreError, check_budget, check_tenant_name};
#[cfg(test)]
use crate::ledger_store::{StoreReceipt, Tenant};

/// The receipt of a one-charge step.
#[cfg(test)]
pub(super) fn receipt_of(
    committed: Committed,
    tenant: Option<&Tenant>,
    budget: Option<PrivacyBudget>,
    describe: &str,
) -> Result<StoreReceipt, StoreError> {
    if let Some(Err(_)) = committed.outcomes.first() {
        let mut outcomes = committed.outcomes;
        return Err(outcomes.remove(0).unwrap_err());
    }
    let sequence = committed
        .first_sequence
        .ok_or_else(|| StoreError::Backend(format!("ledger {describe}: nothing was recorded")))?;
    let spent = match budget {
        Some(b) => Some(committed.spent[TOTAL_KEY].0.epsilon(b.delta())?),
        None => None,
    };
    let tenant_spent = match tenant.and_then(|t| Some((&t.name, t.budget?))) {
        Some((name, b)) => Some(committed.spent[name].0.epsilon(b.delta())?),
        None => None,
    };
    Ok(StoreReceipt {
        sequence,
        spent,
        tenant_spent,
    })
}

/// One charge of a step, checked and encoded before the transaction.
pub(super) struct Prepared<'a> {
    pub(super) charge: &'a PendingCharge,
    pub(super) curve: RdpCurve,
    /// The event's encoding; empty for a measured curve.
    event: Vec<u8>,
    /// The cost's identity: the curve's bits, then the event's encoding.
    key: Vec<u8>,
    /// The lease this charge reserves for, if it is a reservation.
    pub(super) lease: Option<i64>,
}

impl<'a> Prepared<'a> {
    pub(super) fn new(charge: &'a PendingCharge, orders: &Orders) -> Result<Self, StoreError> {
        check_label(&charge.label)?;
        if let Some(t) = &charge.tenant {
            check_tenant_name(&t.name)?;
        }
        let curve = charge.cost.curve(orders)?;
        let event = match &charge.cost {
            Cost::Event(e) => privmix_accountant::encode_event(e),
            Cost::Curve(_) => Vec::new(),
        };
        let mut key: Vec<u8> = curve
            .epsilons()
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        key.extend_from_slice(&event);
        Ok(Self {
            charge,
            curve,
            event,
            key,
            lease: None,
        })
    }

    pub(super) fn tenant(&self) -> Option<&'a str> {
        self.charge.tenant.as_ref().map(|t| t.name.as_str())
    }
}

/// What a step commit's transaction did.
pub(super) struct Committed {
    pub(super) outcomes: StepOutcomes,
    /// The total budget read under the lock.
    pub(super) budget: Option<PrivacyBudget>,
    /// The costs it stored, by key (valid only once the transaction commits).
    pub(super) new_costs: Vec<(Vec<u8>, i64)>,
    /// The first record number it wrote, if it wrote any.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) first_sequence: Option<u64>,
    /// The spending after it, by key (`*` and the tenants it charged).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) spent: BTreeMap<String, (RdpCurve, i64)>,
}

/// The steps of one step commit inside `tx` (everything but the commit): the charge
/// transaction of the module docs, each charge of the step checked in turn on what the
/// ones before it left, a refused one skipped; then one row per run of consecutive
/// accepted charges with the same tenant, label and cost. `known` are the cost ids
/// already committed.
pub(super) fn commit_charges(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    prepared: &[Prepared<'_>],
    known: &HashMap<Vec<u8>, i64>,
) -> Result<Committed, Fail> {
    tx.batch_execute("LOCK TABLE privmix_ledger IN SHARE ROW EXCLUSIVE MODE")
        .map_err(pg("locking the ledger"))?;
    let h = tx
        .query_one(
            "SELECT budget_epsilon, budget_delta, next_sequence, charges FROM privmix_ledger FOR UPDATE",
            &[],
        )
        .map_err(pg("reading the header"))?;
    let budget = budget_of(&h, 0, 1, describe)?;
    let first: i64 = h.get(2);
    let mut recorded: i64 = h.get(3);
    let mut keys: Vec<&str> = vec![TOTAL_KEY];
    keys.extend(prepared.iter().filter_map(Prepared::tenant));
    let rows = tx
        .query(
            "SELECT tenant, curve, charges FROM privmix_spent WHERE tenant = ANY($1) FOR UPDATE",
            &[&keys],
        )
        .map_err(pg("reading the spending"))?;
    let mut spent: BTreeMap<String, (RdpCurve, i64)> = BTreeMap::new();
    for row in &rows {
        spent.insert(
            row.get(0),
            (curve_of(orders, row.get(1), describe)?, row.get(2)),
        );
    }
    let ledger_budgets = read_tenant_budgets(tx, Some(&keys[1..]), describe)?;
    if !spent.contains_key(TOTAL_KEY) {
        return Err(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: "the total's spending row is missing".into(),
        }
        .into());
    }
    let mut touched: Vec<String> = vec![TOTAL_KEY.to_owned()];
    let mut outcomes = Vec::with_capacity(prepared.len());
    // Runs of accepted charges: (index of the first charge of the run, count).
    let mut runs: Vec<(usize, i64)> = Vec::new();
    for (i, p) in prepared.iter().enumerate() {
        // The tenant's budget first, then the total's, as the file store does.
        let mut tenant_after = None;
        if let Some(t) = &p.charge.tenant {
            let zero = (RdpCurve::zero(orders.clone()), 0);
            let (tenant_spent, n) = spent.get(&t.name).unwrap_or(&zero);
            // The ledger's budget for the tenant, then the caller's (a key file's,
            // for a file ledger), when given: both must pay.
            let checked = check_budget(
                || format!("tenant {}", t.name),
                tenant_spent,
                &p.curve,
                ledger_budgets.get(&t.name).copied(),
            )
            .and_then(|_| {
                check_budget(
                    || format!("tenant {}", t.name),
                    tenant_spent,
                    &p.curve,
                    t.budget,
                )
            });
            match checked {
                Ok((composed, _)) => tenant_after = Some((t.name.clone(), composed, n + 1)),
                Err(e @ StoreError::Refused { .. }) => {
                    outcomes.push(Err(e));
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let (total, n) = &spent[TOTAL_KEY];
        let total_after = match check_budget(|| "total".into(), total, &p.curve, budget) {
            Ok((composed, _)) => (composed, n + 1),
            Err(e @ StoreError::Refused { .. }) => {
                outcomes.push(Err(e));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        spent.insert(TOTAL_KEY.to_owned(), total_after);
        if let Some((name, composed, n)) = tenant_after {
            if !touched.contains(&name) {
                touched.push(name.clone());
            }
            spent.insert(name, (composed, n));
        }
        recorded += 1;
        outcomes.push(Ok(()));
        match runs.last_mut() {
            Some((start, count))
                if prepared[*start].tenant() == p.tenant()
                    && prepared[*start].charge.label == p.charge.label
                    && prepared[*start].key == p.key
                    && prepared[*start].lease == p.lease =>
            {
                *count += 1;
            }
            _ => runs.push((i, 1)),
        }
    }
    let mut new_costs: Vec<(Vec<u8>, i64)> = Vec::new();
    let mut sequence = first;
    for &(start, count) in &runs {
        let p = &prepared[start];
        let cost = match known.get(&p.key).or_else(|| {
            new_costs
                .iter()
                .find(|(k, _)| *k == p.key)
                .map(|(_, id)| id)
        }) {
            Some(&id) => id,
            None => {
                let id = cost_id(tx, orders, describe, p)?;
                new_costs.push((p.key.clone(), id));
                id
            }
        };
        tx.execute(
            "INSERT INTO privmix_charges (sequence, tenant, label, cost, count, lease, at)
             VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())",
            &[
                &sequence,
                &p.tenant(),
                &p.charge.label,
                &cost,
                &count,
                &p.lease,
            ],
        )
        .map_err(pg("appending the charges"))?;
        sequence += 1;
    }
    tx.execute(
        "UPDATE privmix_ledger SET next_sequence = $1, charges = $2",
        &[&sequence, &recorded],
    )
    .map_err(pg("updating the header"))?;
    let upsert = "INSERT INTO privmix_spent (tenant, curve, charges) VALUES ($1, $2, $3)
                  ON CONFLICT (tenant) DO UPDATE SET curve = EXCLUDED.curve, charges = EXCLUDED.charges";
    for key in &touched {
        let (curve, n) = &spent[key];
        tx.execute(upsert, &[key, &curve.epsilons(), n])
            .map_err(pg("updating the spending"))?;
    }
    Ok(Committed {
        outcomes,
        budget,
        new_costs,
        first_sequence: (!runs.is_empty())
            .then(|| u64_of(first, "next_sequence", describe))
            .transpose()?,
        spent,
    })
}

/// The steps of setting `tenant`'s budget inside `tx` (everything but the commit):
/// under the ledger's lock, refused below what the tenant has spent (at its δ), then
/// recorded with its time and the number of records before it.
pub(super) fn set_tenant_budget_in(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    tenant: &str,
    budget: PrivacyBudget,
) -> Result<(), Fail> {
    tx.batch_execute("LOCK TABLE privmix_ledger IN SHARE ROW EXCLUSIVE MODE")
        .map_err(pg("locking the ledger"))?;
    let records: i64 = tx
        .query_one("SELECT next_sequence FROM privmix_ledger FOR UPDATE", &[])
        .map_err(pg("reading the header"))?
        .get(0);
    let spent = tx
        .query_opt(
            "SELECT curve FROM privmix_spent WHERE tenant = $1",
            &[&tenant],
        )
        .map_err(pg("reading the tenant's spending"))?;
    if let Some(row) = spent {
        let spent = curve_of(orders, row.get(0), describe)?.epsilon(budget.delta())?;
        if spent.epsilon > budget.epsilon() {
            return Err(Fail::Store(StoreError::BudgetBelowSpent {
                store: format!("{describe} (tenant {tenant})"),
                budget,
                spent,
            }));
        }
    }
    tx.execute(
        "INSERT INTO privmix_tenant_budgets (tenant, epsilon, delta, at, after_records)
         VALUES ($1, $2, $3, clock_timestamp(), $4)",
        &[&tenant, &budget.epsilon(), &budget.delta(), &records],
    )
    .map_err(pg("recording the tenant's budget"))?;
    Ok(())
}

/// The id of `p`'s cost in `privmix_costs`, stored now if the table lacks it. Called
/// under the ledger's lock, so no other writer stores the same cost meanwhile. The
/// curve is compared bit for bit here (SQL's float equality takes -0 for 0).
fn cost_id(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    p: &Prepared<'_>,
) -> Result<i64, Fail> {
    let rows = tx
        .query(
            "SELECT id, curve FROM privmix_costs WHERE event = $1",
            &[&p.event],
        )
        .map_err(pg("looking up a cost"))?;
    for row in &rows {
        let stored = curve_of(orders, row.get(1), describe)?;
        let same = stored
            .epsilons()
            .iter()
            .zip(p.curve.epsilons())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if same {
            return Ok(row.get(0));
        }
    }
    Ok(tx
        .query_one(
            "INSERT INTO privmix_costs (curve, event) VALUES ($1, $2) RETURNING id",
            &[&p.curve.epsilons(), &p.event],
        )
        .map_err(pg("storing a cost"))?
        .get(0))
}

/// The steps of a budget change inside `tx` (everything but the commit): under the
/// ledger's lock, the new budget is checked against what is spent, then recorded with
/// its time. Returns the budget record's sequence number.
pub(super) fn raise_in(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    budget: PrivacyBudget,
) -> Result<u64, Fail> {
    tx.batch_execute("LOCK TABLE privmix_ledger IN SHARE ROW EXCLUSIVE MODE")
        .map_err(pg("locking the ledger"))?;
    let h = tx
        .query_one(
            "SELECT next_sequence, charges FROM privmix_ledger FOR UPDATE",
            &[],
        )
        .map_err(pg("reading the header"))?;
    let sequence: i64 = h.get(0);
    let charges: i64 = h.get(1);
    let row = tx
        .query_one(
            "SELECT curve FROM privmix_spent WHERE tenant = $1 FOR UPDATE",
            &[&TOTAL_KEY],
        )
        .map_err(pg("reading the total"))?;
    let spent = curve_of(orders, row.get(0), describe)?;
    if charges > 0 {
        let at_delta = spent.epsilon(budget.delta())?;
        if at_delta.epsilon > budget.epsilon() {
            return Err(Fail::Store(StoreError::BudgetBelowSpent {
                store: describe.to_owned(),
                budget,
                spent: at_delta,
            }));
        }
    }
    let (eps, delta) = budget_columns(Some(budget));
    tx.execute(
        "UPDATE privmix_ledger SET budget_epsilon = $1, budget_delta = $2, next_sequence = $3",
        &[&eps, &delta, &(sequence + 1)],
    )
    .map_err(pg("recording the budget"))?;
    tx.execute(
        "INSERT INTO privmix_budgets (sequence, epsilon, delta, at, after_charges)
         VALUES ($1, $2, $3, clock_timestamp(), $4)",
        &[&sequence, &eps, &delta, &charges],
    )
    .map_err(pg("recording the budget"))?;
    u64_of(sequence, "next_sequence", describe)
}
