//! The tables, their creation, and the upgrade from older schema versions.

use postgres::{Client, GenericClient, Transaction};
use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet};

use super::codec::{budget_columns, budget_of, u64_of};
use super::error::{Fail, pg};
use crate::ledger_store::StoreError;

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i32 = 3;

/// The key of everyone's spending in `privmix_spent` (not a valid tenant name).
pub(super) const TOTAL_KEY: &str = "*";

/// The advisory lock key creation holds, so that replicas creating the ledger at
/// once do not race on `CREATE TABLE`: "privmixl" in ASCII.
const CREATE_LOCK_KEY: i64 = 0x7072_6976_6d69_786c;

/// The tables of schema version 1, as its builds wrote them. A fresh ledger is made
/// of these and every upgrade in [`UPGRADES`], in order, so that each table's
/// definition is written once and a fresh database and an upgraded one are the same.
const SCHEMA_1: &str = "
CREATE TABLE privmix_ledger (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version integer NOT NULL,
    orders float8[] NOT NULL,
    initial_epsilon float8,
    initial_delta float8,
    budget_epsilon float8,
    budget_delta float8,
    protected_set text[],
    created_at timestamptz NOT NULL,
    next_sequence bigint NOT NULL CHECK (next_sequence >= 0),
    charges bigint NOT NULL CHECK (charges >= 0),
    CHECK ((initial_epsilon IS NULL) = (initial_delta IS NULL)),
    CHECK ((budget_epsilon IS NULL) = (budget_delta IS NULL))
);
CREATE TABLE privmix_spent (
    tenant text PRIMARY KEY,
    curve float8[] NOT NULL,
    charges bigint NOT NULL CHECK (charges >= 0)
);
CREATE TABLE privmix_charges (
    sequence bigint PRIMARY KEY,
    tenant text,
    label text NOT NULL,
    curve float8[] NOT NULL,
    at timestamptz NOT NULL
);
CREATE TABLE privmix_budgets (
    sequence bigint PRIMARY KEY,
    epsilon float8,
    delta float8,
    at timestamptz NOT NULL,
    after_charges bigint NOT NULL,
    CHECK ((epsilon IS NULL) = (delta IS NULL))
);
";

/// What turns the tables of schema version 1 into version 2's: costs are stored once
/// and a charge row names one with a count; the rows already there keep their curves
/// (cost NULL, count 1).
const TABLES_1_TO_2: &str = "
CREATE TABLE privmix_costs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    curve float8[] NOT NULL,
    event bytea NOT NULL
);
CREATE INDEX privmix_costs_event ON privmix_costs USING hash (event);
ALTER TABLE privmix_charges
    ALTER COLUMN curve DROP NOT NULL,
    ADD COLUMN cost bigint REFERENCES privmix_costs (id),
    ADD COLUMN count bigint NOT NULL DEFAULT 1 CHECK (count >= 1),
    ADD CHECK ((curve IS NULL) <> (cost IS NULL));
";

/// What turns the tables of schema version 2 into version 3's: budget leases (a lease
/// row each, its reservations charge rows naming it) and tenants' budgets.
const TABLES_2_TO_3: &str = "
CREATE TABLE privmix_tenant_budgets (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant text NOT NULL,
    epsilon float8 NOT NULL,
    delta float8 NOT NULL,
    at timestamptz NOT NULL,
    after_records bigint NOT NULL CHECK (after_records >= 0)
);
CREATE TABLE privmix_leases (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    replica text NOT NULL,
    tenant text,
    reserved float8[] NOT NULL,
    used float8[] NOT NULL,
    charges bigint NOT NULL CHECK (charges >= 0),
    opened_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
ALTER TABLE privmix_charges ADD COLUMN lease bigint REFERENCES privmix_leases (id);
";

/// The upgrades of the tables, by the version each starts from; each leads to the next
/// version, the last to [`SCHEMA_VERSION`].
const UPGRADES: [(i32, &str); 2] = [(1, TABLES_1_TO_2), (2, TABLES_2_TO_3)];
const _: () = assert!(UPGRADES[UPGRADES.len() - 1].0 + 1 == SCHEMA_VERSION);

/// The header as read from `privmix_ledger`.
pub(super) struct Header {
    pub(super) orders: Orders,
    pub(super) initial_budget: Option<PrivacyBudget>,
    pub(super) budget: Option<PrivacyBudget>,
    pub(super) protected_set: Option<ProtectedSet>,
    pub(super) created_ms: u64,
    pub(super) next_sequence: u64,
    pub(super) charges: u64,
}

/// Creates the tables when absent, then a new ledger's header and total, inside
/// `tx` and under the creation lock, so that replicas creating the ledger at once do
/// not race; [`StoreError::AlreadyExists`] when the database holds a ledger.
pub(super) fn create_in(
    tx: &mut Transaction<'_>,
    describe: &str,
    orders: &Orders,
    budget: Option<PrivacyBudget>,
    protected: Option<&ProtectedSet>,
) -> Result<(), Fail> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK_KEY])
        .map_err(pg("locking for creation"))?;
    let tables_exist: bool = tx
        .query_one("SELECT to_regclass('privmix_ledger') IS NOT NULL", &[])
        .map_err(pg("looking for the tables"))?
        .get(0);
    if !tables_exist {
        tx.batch_execute(SCHEMA_1)
            .map_err(pg("creating the tables"))?;
        for (_, tables) in UPGRADES {
            tx.batch_execute(tables)
                .map_err(pg("creating the tables"))?;
        }
    }
    let existing: i64 = tx
        .query_one("SELECT count(*) FROM privmix_ledger", &[])
        .map_err(pg("looking for a ledger"))?
        .get(0);
    if existing > 0 {
        return Err(Fail::Store(StoreError::AlreadyExists {
            store: describe.to_owned(),
        }));
    }
    let (eps, delta) = budget_columns(budget);
    let members = protected.map(|s| s.members().to_vec());
    tx.execute(
        "INSERT INTO privmix_ledger (schema_version, orders, initial_epsilon, initial_delta,
             budget_epsilon, budget_delta, protected_set, created_at, next_sequence, charges)
         VALUES ($1, $2, $3, $4, $3, $4, $5, clock_timestamp(), 0, 0)",
        &[&SCHEMA_VERSION, &orders.as_slice(), &eps, &delta, &members],
    )
    .map_err(pg("writing the header"))?;
    let zero = vec![0.0f64; orders.len()];
    tx.execute(
        "INSERT INTO privmix_spent (tenant, curve, charges) VALUES ($1, $2, 0)",
        &[&TOTAL_KEY, &zero],
    )
    .map_err(pg("writing the total"))?;
    Ok(())
}

/// Upgrades a database of an older schema version to this build's (see the module docs), in
/// one transaction under the creation lock and an exclusive lock on the header, so
/// that replicas opening it at once upgrade it once. Any other version is left for
/// [`read_header`] to refuse.
pub(super) fn upgrade(client: &mut Client) -> Result<(), Fail> {
    fn version(c: &mut impl GenericClient) -> Result<Option<i32>, Fail> {
        Ok(
            c.query_opt("SELECT schema_version FROM privmix_ledger", &[])
                .map_err(pg("reading the schema version"))?
                .map(|row| row.get(0)),
        )
    }
    if version(client)?.is_none_or(|v| v >= SCHEMA_VERSION) {
        return Ok(());
    }
    let mut tx = client.transaction().map_err(pg("starting the upgrade"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK_KEY])
        .map_err(pg("locking for the upgrade"))?;
    tx.batch_execute("LOCK TABLE privmix_ledger IN ACCESS EXCLUSIVE MODE")
        .map_err(pg("locking for the upgrade"))?;
    for (from, tables) in UPGRADES {
        if version(&mut tx)? == Some(from) {
            tx.batch_execute(tables)
                .map_err(pg("upgrading the schema"))?;
            tx.execute(
                "UPDATE privmix_ledger SET schema_version = $1",
                &[&(from + 1)],
            )
            .map_err(pg("upgrading the schema"))?;
        }
    }
    tx.commit().map_err(pg("committing the upgrade"))
}

/// The header row, or `None` when the table is empty.
pub(super) fn read_header(
    client: &mut impl GenericClient,
    describe: &str,
) -> Result<Option<Header>, Fail> {
    let Some(row) = client
        .query_opt("SELECT schema_version FROM privmix_ledger", &[])
        .map_err(pg("reading the header"))?
    else {
        return Ok(None);
    };
    let version: i32 = row.get(0);
    if version != SCHEMA_VERSION {
        return Err(Fail::Store(StoreError::UnsupportedSchema {
            store: describe.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        }));
    }
    let row = client
        .query_one(
            concat!(
                "SELECT orders, initial_epsilon, initial_delta, budget_epsilon, budget_delta,
                        protected_set, ",
                ms!("created_at"),
                ", next_sequence, charges FROM privmix_ledger"
            ),
            &[],
        )
        .map_err(pg("reading the header"))?;
    let bad = |reason: String| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason,
        })
    };
    let stored: Vec<f64> = row
        .try_get(0)
        .map_err(|e| bad(format!("its orders cannot be read: {e}")))?;
    let orders = Orders::new(stored.clone()).map_err(|e| bad(format!("its orders: {e}")))?;
    if orders.as_slice() != stored.as_slice() {
        return Err(bad("its orders are not sorted and distinct".into()));
    }
    let protected_set = match row.get::<_, Option<Vec<String>>>(5) {
        None => None,
        Some(members) => {
            let set = ProtectedSet::new(members.clone())
                .map_err(|e| bad(format!("its protected set: {e}")))?;
            if set.members() != members.as_slice() {
                return Err(bad("its protected set is not in canonical order".into()));
            }
            Some(set)
        }
    };
    Ok(Some(Header {
        orders,
        initial_budget: budget_of(&row, 1, 2, describe)?,
        budget: budget_of(&row, 3, 4, describe)?,
        protected_set,
        created_ms: u64_of(row.get(6), "created_at", describe)?,
        next_sequence: u64_of(row.get(7), "next_sequence", describe)?,
        charges: u64_of(row.get(8), "charges", describe)?,
    }))
}
