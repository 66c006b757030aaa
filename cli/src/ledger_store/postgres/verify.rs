//! `verify`: every record replayed, and every invariant the ledger keeps checked.

use std::collections::BTreeMap;

use postgres::Transaction;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use privmix_accountant::{Orders, PrivacyBudget, RdpCurve};

use super::codec::{
    RECORDS_SQL, read_costs, read_leases, read_spent_rows, read_tenant_budget_changes, record_of,
};
use super::error::{Fail, pg};
use super::lease::{give_back, unspent};
use super::schema::{TOTAL_KEY, read_header};
use crate::ledger_store::StoreError;
use crate::ledger_store::snapshot::{Record, TenantSpent};

/// What `PostgresStore::verify` checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PgVerified {
    /// Records (charges and budget changes).
    pub records: u64,
    /// Charges.
    pub charges: u64,
    /// Tenants with at least one charge.
    pub tenants: usize,
    /// Budget leases.
    pub leases: usize,
    /// Charges spent from the leases (as last written; not in `charges`, which counts
    /// each reservation as one).
    pub lease_charges: u64,
}

/// Checks every invariant the ledger keeps, reading through `tx` (see
/// [`super::PostgresStore::verify`]).
pub(super) fn verify_in(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
) -> Result<PgVerified, Fail> {
    let header = read_header(tx, describe)?.ok_or_else(|| StoreError::NotFound {
        store: describe.to_owned(),
    })?;
    let bad = |reason: String| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason,
        })
    };
    let mut total = RdpCurve::zero(orders.clone());
    let mut tenants: BTreeMap<String, TenantSpent> = BTreeMap::new();
    let mut budget = header.initial_budget;
    let mut records = 0u64;
    let mut charges = 0u64;
    // Each lease's reservations composed in record order, and its tenant.
    let mut reservations: BTreeMap<u64, (RdpCurve, Option<String>)> = BTreeMap::new();
    // What each closed lease gave back, by lease.
    let mut released: BTreeMap<u64, RdpCurve> = BTreeMap::new();
    let costs = read_costs(tx, orders, describe)?;
    // Tenants' budget changes, applied in turn where they were recorded.
    let mut tenant_budgets = TenantBudgetReplay {
        changes: read_tenant_budget_changes(tx, describe)?,
        next: 0,
        in_force: BTreeMap::new(),
    };

    {
        let mut rows = tx
            .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
            .map_err(pg("reading the records"))?;
        while let Some(row) = rows.next().map_err(pg("reading the records"))? {
            tenant_budgets.apply_through(records, &tenants, describe)?;
            match record_of(&row, orders, &costs, describe)? {
                Record::Charge {
                    sequence,
                    tenant,
                    curve,
                    count,
                    lease,
                    ..
                } => {
                    if sequence != records {
                        return Err(bad(format!(
                            "record {records} is missing (the next is {sequence})"
                        )));
                    }
                    // A run's charges in turn, as the writer composed them;
                    // the spend only grows, so checking after the run's last
                    // charge checks each.
                    for _ in 0..count {
                        total = total.compose(&curve)?;
                    }
                    if let Some(id) = lease {
                        if released.contains_key(&id) {
                            return Err(bad(format!(
                                "charge {sequence} reserves for lease {id} after it closed"
                            )));
                        }
                        let zero = (RdpCurve::zero(orders.clone()), tenant.clone());
                        let (reserved, _) = reservations.entry(id).or_insert(zero);
                        for _ in 0..count {
                            *reserved = reserved.compose(&curve)?;
                        }
                    }
                    if let Some(b) = budget {
                        let spent = total.epsilon(b.delta())?;
                        if spent.epsilon > b.epsilon() {
                            return Err(bad(format!(
                                "charge {sequence} took the spent ε to {} over the budget ε = {} in force",
                                spent.epsilon,
                                b.epsilon()
                            )));
                        }
                    }
                    if let Some(name) = tenant {
                        let t = tenants.entry(name.clone()).or_insert_with(|| TenantSpent {
                            charges: 0,
                            spent: RdpCurve::zero(orders.clone()),
                        });
                        for _ in 0..count {
                            t.spent = t.spent.compose(&curve)?;
                        }
                        t.charges += count;
                        if let Some(b) = tenant_budgets.in_force.get(&name) {
                            let spent = t.spent.epsilon(b.delta())?;
                            if spent.epsilon > b.epsilon() {
                                return Err(bad(format!(
                                    "charge {sequence} took tenant {name}'s ε to {} over its budget ε = {}",
                                    spent.epsilon,
                                    b.epsilon()
                                )));
                            }
                        }
                    }
                    charges += count;
                }
                Record::Release {
                    sequence,
                    tenant,
                    lease,
                    unspent,
                    ..
                } => {
                    if sequence != records {
                        return Err(bad(format!(
                            "record {records} is missing (the next is {sequence})"
                        )));
                    }
                    // A lease closes once, after its reservations, giving back at most
                    // its reservation less its use (checked below, against the use
                    // written when it closed).
                    if released.insert(lease, unspent.clone()).is_some() {
                        return Err(bad(format!("lease {lease} is closed twice")));
                    }
                    match reservations.get(&lease) {
                        Some((_, t)) if *t == tenant => {}
                        _ => {
                            return Err(bad(format!(
                                "release {sequence} closes lease {lease}, which reserved nothing for its tenant"
                            )));
                        }
                    }
                    total = give_back(&total, &unspent)?;
                    if let Some(name) = tenant {
                        let t = tenants.get_mut(&name).ok_or_else(|| {
                            bad(format!(
                                "release {sequence} gives back to {name}, who has no charge"
                            ))
                        })?;
                        t.spent = give_back(&t.spent, &unspent)?;
                    }
                }
                Record::Budget(change) => {
                    if change.sequence != records {
                        return Err(bad(format!(
                            "record {records} is missing (the next is {})",
                            change.sequence
                        )));
                    }
                    if change.after_charges != charges {
                        return Err(bad(format!(
                            "budget record {} says {} charges came before it, not {charges}",
                            change.sequence, change.after_charges
                        )));
                    }
                    budget = change.budget;
                }
            }
            records += 1;
        }
    }
    tenant_budgets.apply_through(records, &tenants, describe)?;
    if tenant_budgets.next != tenant_budgets.changes.len() {
        return Err(bad(
            "a tenant's budget is recorded after more records than the ledger holds".into(),
        ));
    }
    if records != header.next_sequence || charges != header.charges {
        return Err(bad(format!(
            "the header counts {} records and {} charges; the tables hold {records} and {charges}",
            header.next_sequence, header.charges
        )));
    }
    if budget != header.budget {
        return Err(bad(
            "the budget in force is not the last one its history records".into(),
        ));
    }
    let stored = read_spent_rows(tx, orders, describe)?;
    let mut expected = tenants.clone();
    expected.insert(
        TOTAL_KEY.into(),
        TenantSpent {
            charges,
            spent: total,
        },
    );
    for (key, want) in &expected {
        match stored.get(key) {
            Some(got) if got == want => {}
            Some(_) => {
                return Err(bad(format!(
                    "the stored spending of {key:?} is not the composition of its charges"
                )));
            }
            None => return Err(bad(format!("no spending row for {key:?}"))),
        }
    }
    if let Some(extra) = stored.keys().find(|k| !expected.contains_key(*k)) {
        return Err(bad(format!(
            "a spending row for {extra:?}, who has no charge"
        )));
    }
    // Each lease: its reserved curve is the composition of its reservations, bit for
    // bit, for its own tenant; what it spent is within what it reserved at every order.
    let leases = read_leases(tx, orders, describe)?;
    let mut lease_charges = 0u64;
    for lease in &leases {
        let (reserved, tenant) = reservations
            .remove(&lease.id)
            .unwrap_or_else(|| (RdpCurve::zero(orders.clone()), lease.tenant.clone()));
        let within = |curve: &RdpCurve| {
            lease
                .used
                .epsilons()
                .iter()
                .zip(curve.epsilons())
                .all(|(used, reserved)| used <= reserved)
        };
        if tenant != lease.tenant {
            return Err(bad(format!(
                "lease {} does not hold what its reservations recorded",
                lease.id
            )));
        }
        match released.remove(&lease.id) {
            // Closed: its reservation reduced to its use, which stays within what its
            // reservations recorded, and what it gave back is exactly their
            // difference rounded down.
            Some(gave) => {
                if !lease.closed || lease.reserved != lease.used {
                    return Err(bad(format!(
                        "lease {} was released but does not hold its use as its reservation",
                        lease.id
                    )));
                }
                if !within(&reserved) {
                    return Err(bad(format!(
                        "lease {} spent more than it reserved",
                        lease.id
                    )));
                }
                if gave != unspent(&reserved, &lease.used)? {
                    return Err(bad(format!(
                        "lease {} gave back other than its reservation less its use",
                        lease.id
                    )));
                }
            }
            None if lease.closed || reserved != lease.reserved => {
                return Err(bad(format!(
                    "lease {} does not hold what its reservations recorded",
                    lease.id
                )));
            }
            None => {}
        }
        if !within(&lease.reserved) {
            return Err(bad(format!(
                "lease {} spent more than it reserved",
                lease.id
            )));
        }
        lease_charges += lease.charges;
    }
    if let Some(id) = reservations.keys().chain(released.keys()).next() {
        return Err(bad(format!(
            "reservations name lease {id}, which is not stored"
        )));
    }
    Ok(PgVerified {
        records,
        charges,
        tenants: tenants.len(),
        leases: leases.len(),
        lease_charges,
    })
}

/// The tenants' budget changes replayed in record order: every change, the next one
/// to apply, and each tenant's budget in force.
struct TenantBudgetReplay {
    changes: Vec<(String, PrivacyBudget, u64)>,
    next: usize,
    in_force: BTreeMap<String, PrivacyBudget>,
}

impl TenantBudgetReplay {
    /// Applies the changes recorded after at most `records` records, in order: each
    /// must not be below what its tenant had spent.
    fn apply_through(
        &mut self,
        records: u64,
        tenants: &BTreeMap<String, TenantSpent>,
        describe: &str,
    ) -> Result<(), Fail> {
        while let Some((name, b, after)) = self.changes.get(self.next) {
            if *after > records {
                break;
            }
            if let Some(t) = tenants.get(name)
                && t.spent.epsilon(b.delta())?.epsilon > b.epsilon()
            {
                return Err(Fail::Store(StoreError::Inconsistent {
                    store: describe.to_owned(),
                    reason: format!(
                        "tenant {name}'s budget was set to ε = {} below what it had spent",
                        b.epsilon()
                    ),
                }));
            }
            self.in_force.insert(name.clone(), *b);
            self.next += 1;
        }
        Ok(())
    }
}
