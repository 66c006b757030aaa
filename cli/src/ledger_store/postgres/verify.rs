//! `verify`: every record replayed, and every invariant the ledger keeps checked.

use std::collections::BTreeMap;

use postgres::Transaction;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use privmix_accountant::{Orders, RdpCurve};

use super::codec::{RECORDS_SQL, read_costs, read_spent_rows, record_of};
use super::error::{Fail, pg};
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
    let costs = read_costs(tx, orders, describe)?;
    {
        let mut rows = tx
            .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
            .map_err(pg("reading the records"))?;
        while let Some(row) = rows.next().map_err(pg("reading the records"))? {
            match record_of(&row, orders, &costs, describe)? {
                Record::Charge {
                    sequence,
                    tenant,
                    curve,
                    count,
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
                        let t = tenants.entry(name).or_insert_with(|| TenantSpent {
                            charges: 0,
                            spent: RdpCurve::zero(orders.clone()),
                        });
                        for _ in 0..count {
                            t.spent = t.spent.compose(&curve)?;
                        }
                        t.charges += count;
                    }
                    charges += count;
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
    Ok(PgVerified {
        records,
        charges,
        tenants: tenants.len(),
    })
}
