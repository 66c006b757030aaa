//! The store: a handle on one PostgreSQL ledger.

use std::collections::HashMap;
use std::fmt;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet, RdpCurve};

use super::charge::{Committed, Prepared, commit_charges, raise_in, set_tenant_budget_in};
use super::codec::{
    RECORDS_SQL, budget_change_of, budget_of, curve_of, read_costs, read_leases, read_spent_rows,
    read_tenant_budgets, record_of,
};
use super::connection::Connection;
use super::error::{Fail, fail, pg, postgres_error};
use super::lease::Leases;
use super::retry::{read_only, serializable};
use super::schema::{SCHEMA_VERSION, TOTAL_KEY, create_in, read_header, upgrade};
use super::verify::{PgVerified, verify_in};
use crate::ledger_store::snapshot::{Record, Snapshot, StoreFormat};
use crate::ledger_store::step::PendingCharge;
use crate::ledger_store::{LedgerStore, StepOutcomes, StoreError, check_tenant_name};
#[cfg(test)]
use crate::ledger_store::{StoreReceipt, Tenant, step::Cost};

/// A PostgreSQL ledger. See the module docs.
pub struct PostgresStore {
    conn: Connection,
    orders: Orders,
    budget: Option<PrivacyBudget>,
    protected_set: Option<ProtectedSet>,
    /// The ids of the costs this handle has seen committed, by their key (a curve's
    /// bits, then its event's encoding).
    cost_ids: HashMap<Vec<u8>, i64>,
    /// The budget leases step commits spend from, when this handle uses them.
    leases: Option<Leases>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("store", &self.conn.describe)
            .field("orders", &self.orders.len())
            .field("budget", &self.budget)
            .field("protected_set", &self.protected_set)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// How many step commits waited on a lease's reservation, after every renewal
    /// under way was taken in; `None` without leases.
    #[cfg(test)]
    pub(crate) fn lease_waits_settled(&mut self) -> Result<Option<u64>, StoreError> {
        match &mut self.leases {
            Some(leases) => {
                leases.settle()?;
                Ok(Some(leases.waited()))
            }
            None => Ok(None),
        }
    }

    /// Opens the existing ledger at `url`; [`StoreError::NotFound`] when the database
    /// holds none. A ledger of schema version 1 is upgraded first (see the module docs).
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let mut conn = Connection::open(url)?;
        let describe = conn.describe.clone();
        let client = conn.client()?;
        let exists: bool = client
            .query_one("SELECT to_regclass('privmix_ledger') IS NOT NULL", &[])
            .map_err(|e| postgres_error(&describe, "looking for the ledger's tables", e))?
            .get(0);
        if !exists {
            return Err(StoreError::NotFound { store: describe });
        }
        upgrade(client).map_err(|f| fail(&describe, f))?;
        let header = read_header(client, &describe)
            .map_err(|f| fail(&describe, f))?
            .ok_or_else(|| StoreError::NotFound {
                store: describe.clone(),
            })?;
        Ok(Self {
            conn,
            orders: header.orders,
            budget: header.budget,
            protected_set: header.protected_set,
            cost_ids: HashMap::new(),
            leases: None,
        })
    }

    /// Creates a ledger at `url` (its tables, when absent, and its header) over
    /// `orders`, with `budget` and the protected set `protected`; refuses with
    /// [`StoreError::AlreadyExists`] when the database already holds one.
    pub fn create(
        url: &str,
        orders: Orders,
        budget: Option<PrivacyBudget>,
        protected: Option<ProtectedSet>,
    ) -> Result<Self, StoreError> {
        let mut conn = Connection::open(url)?;
        let describe = conn.describe.clone();
        let client = conn.client()?;
        let created = (|| -> Result<(), Fail> {
            let mut tx = client.transaction().map_err(pg("starting the creation"))?;
            create_in(&mut tx, &describe, &orders, budget, protected.as_ref())?;
            tx.commit().map_err(pg("committing the creation"))
        })();
        created.map_err(|f| fail(&describe, f))?;
        Ok(Self {
            conn,
            orders,
            budget,
            protected_set: protected,
            cost_ids: HashMap::new(),
            leases: None,
        })
    }

    /// Calls `each` with every record, in sequence order, read in one consistent
    /// snapshot.
    pub fn for_each_record(
        &mut self,
        each: &mut dyn FnMut(Record) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        read_only(&mut self.conn, |tx| {
            let costs = read_costs(tx, &orders, &describe)?;
            let mut rows = tx
                .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
                .map_err(pg("reading the records"))?;
            while let Some(row) = rows.next().map_err(pg("reading the records"))? {
                each(record_of(&row, &orders, &costs, &describe)?)?;
            }
            Ok(())
        })
    }

    /// Checks every invariant the ledger keeps: records numbered 0, 1, … without a
    /// gap; the stored total and each tenant's spending equal to the composition of
    /// their charges in record order, bit for bit; each stored cost's curve not below
    /// its event's; the counters; the budget history ending at the budget in force; and
    /// every charge within the total budget in force when it was recorded. Anything
    /// else is [`StoreError::Inconsistent`].
    pub fn verify(&mut self) -> Result<PgVerified, StoreError> {
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        read_only(&mut self.conn, |tx| verify_in(tx, &orders, &describe))
    }

    /// A step commit (see [`LedgerStore::commit_step`]): every charge checked and
    /// encoded, then one serializable transaction.
    fn commit(&mut self, charges: &[PendingCharge]) -> Result<Committed, StoreError> {
        let prepared = charges
            .iter()
            .map(|c| Prepared::new(c, &self.orders))
            .collect::<Result<Vec<_>, _>>()?;
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        let known = &self.cost_ids;
        let committed = serializable(&mut self.conn, |tx| {
            commit_charges(tx, &orders, &describe, &prepared, known)
        })?;
        // Only now are the new costs' ids in the database for every later transaction.
        self.cost_ids.extend(committed.new_costs.iter().cloned());
        self.budget = committed.budget;
        Ok(committed)
    }
}

impl LedgerStore for PostgresStore {
    fn describe(&self) -> String {
        self.conn.describe.clone()
    }

    fn orders(&self) -> &Orders {
        &self.orders
    }

    fn budget(&self) -> Option<PrivacyBudget> {
        self.budget
    }

    fn protected_set(&self) -> Option<&ProtectedSet> {
        self.protected_set.as_ref()
    }

    fn spent(&mut self, tenant: Option<&str>) -> Result<RdpCurve, StoreError> {
        let describe = self.conn.describe.clone();
        let key = tenant.unwrap_or(TOTAL_KEY);
        let client = self.conn.client()?;
        let row = client
            .query_one(
                "SELECT h.budget_epsilon, h.budget_delta, s.curve
                 FROM privmix_ledger h LEFT JOIN privmix_spent s ON s.tenant = $1",
                &[&key],
            )
            .map_err(|e| postgres_error(&describe, "reading the spending", e))?;
        let budget = budget_of(&row, 0, 1, &describe).map_err(|f| fail(&describe, f))?;
        let curve: Option<Vec<f64>> = row.get(2);
        self.budget = budget;
        match curve {
            Some(values) => {
                curve_of(&self.orders, values, &describe).map_err(|f| fail(&describe, f))
            }
            None if tenant.is_some() => Ok(RdpCurve::zero(self.orders.clone())),
            None => Err(StoreError::Inconsistent {
                store: describe,
                reason: "the total's spending row is missing".into(),
            }),
        }
    }

    #[cfg(test)]
    fn charge_receipt(
        &mut self,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
    ) -> Result<StoreReceipt, StoreError> {
        // One charge is a step of one: the same path.
        let charge = PendingCharge {
            tenant: tenant.cloned(),
            cost: Cost::Curve(curve.clone()),
            label: label.to_owned(),
        };
        let committed = self.commit(std::slice::from_ref(&charge))?;
        super::charge::receipt_of(committed, tenant, self.budget, &self.conn.describe)
    }

    fn commit_step(&mut self, charges: &[PendingCharge]) -> Result<StepOutcomes, StoreError> {
        let Some(leases) = &mut self.leases else {
            return Ok(self.commit(charges)?.outcomes);
        };
        let prepared = charges
            .iter()
            .map(|c| Prepared::new(c, &self.orders))
            .collect::<Result<Vec<_>, _>>()?;
        let (outcomes, budget) =
            leases.commit(&mut self.conn, &self.orders, &mut self.cost_ids, &prepared)?;
        if let Some(budget) = budget {
            self.budget = budget;
        }
        Ok(outcomes)
    }

    fn set_tenant_budget(&mut self, tenant: &str, budget: PrivacyBudget) -> Result<(), StoreError> {
        check_tenant_name(tenant)?;
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        serializable(&mut self.conn, |tx| {
            set_tenant_budget_in(tx, &orders, &describe, tenant, budget)
        })
    }

    fn use_leases(&mut self, per_reservation: u64) -> Result<(), StoreError> {
        let replica = format!(
            "pid {} from {} ms",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        );
        self.leases = Some(Leases::new(replica, per_reservation)?);
        Ok(())
    }

    fn close_leases(&mut self) -> Result<(), StoreError> {
        match &mut self.leases {
            Some(leases) => leases.close(&mut self.conn, &self.orders),
            None => Ok(()),
        }
    }

    fn raise(&mut self, budget: PrivacyBudget) -> Result<u64, StoreError> {
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        let sequence = serializable(&mut self.conn, |tx| {
            raise_in(tx, &orders, &describe, budget)
        })?;
        self.budget = Some(budget);
        Ok(sequence)
    }

    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        let describe = self.conn.describe.clone();
        let orders = self.orders.clone();
        let snap = read_only(&mut self.conn, |tx| {
            let header = read_header(tx, &describe)?.ok_or_else(|| StoreError::NotFound {
                store: describe.clone(),
            })?;
            let mut rows = read_spent_rows(tx, &orders, &describe)?;
            let total = rows
                .remove(TOTAL_KEY)
                .ok_or_else(|| StoreError::Inconsistent {
                    store: describe.clone(),
                    reason: "the total's spending row is missing".into(),
                })?;
            let history = tx
                .query(
                    concat!(
                        "SELECT sequence, ",
                        ms!("at"),
                        ", epsilon, delta, after_charges FROM privmix_budgets ORDER BY sequence"
                    ),
                    &[],
                )
                .map_err(pg("reading the budget history"))?
                .iter()
                .map(|row| budget_change_of(row, &describe))
                .collect::<Result<Vec<_>, Fail>>()?;
            Ok(Snapshot {
                store: describe.clone(),
                format: StoreFormat::Postgres {
                    schema_version: SCHEMA_VERSION,
                },
                created_ms: Some(header.created_ms),
                protected_set: header.protected_set,
                orders: header.orders,
                initial_budget: header.initial_budget,
                budget: header.budget,
                history,
                charges: header.charges,
                spent: total.spent,
                tenants: rows,
                leases: read_leases(tx, &orders, &describe)?,
                tenant_budgets: read_tenant_budgets(tx, None, &describe)?,
            })
        })?;
        self.budget = snap.budget;
        Ok(snap)
    }
}
