//! The PostgreSQL store: one ledger shared by several `privmix serve` replicas.
//!
//! # Tables (schema version 2)
//!
//! ```text
//! privmix_ledger   one row: schema_version, orders float8[], the initial and the current
//!                  budget (ε, δ; both NULL for none), protected_set text[] (NULL: none),
//!                  created_at, next_sequence (records so far), charges
//! privmix_spent    tenant text PRIMARY KEY, curve float8[], charges: each tenant's
//!                  composed spending, and everyone's under the reserved key `*`
//! privmix_costs    each distinct cost once: id, curve float8[] (its RDP curve at the
//!                  ledger's orders), event bytea (the data-independent `DpEvent` in the
//!                  file ledger's encoding; empty for a measured curve without one)
//! privmix_charges  append-only: sequence PRIMARY KEY, tenant (NULL: none), label,
//!                  cost (a privmix_costs id), count (charges of that cost in a row),
//!                  curve float8[] (only in rows of schema version 1, whose cost is
//!                  NULL and count 1), at
//! privmix_budgets  every budget change: sequence PRIMARY KEY, ε, δ, at, after_charges
//! ```
//!
//! A step commit writes one `privmix_charges` row per run of consecutive accepted
//! charges with the same tenant, label and cost: a step of eight requests of one tenant
//! under the same mechanism is one row of a few dozen bytes, whatever the curve's size,
//! and a cost's curve is stored once per ledger. Replay (`verify`, `export`) composes a
//! run's curve `count` times in turn with `RdpCurve::compose`, rounded up — the very
//! operations the writer made, so the totals read back equal the stored totals bit for
//! bit. A cost's stored curve must not be below its event's curve as this build computes
//! it, order by order; `verify` checks that, so a record never under-counts its event.
//!
//! A database of schema version 1 (one row and one curve per charge) is upgraded in
//! place the first time a build of version 2 opens it, in one transaction: the new
//! table and columns are added and every existing row is read as it was (a charge of
//! its own curve, count 1). A build of version 1 refuses the upgraded database
//! ([`StoreError::UnsupportedSchema`]).
//!
//! They are created when absent, in the first schema of the connection's `search_path`
//! (a URL's `options=-c search_path=…` gives a ledger its own schema). Floats travel in
//! PostgreSQL's binary format, so curves are stored bit for bit.
//!
//! # A charge is one serializable transaction
//!
//! `START TRANSACTION ISOLATION LEVEL SERIALIZABLE`, then `LOCK TABLE privmix_ledger IN
//! SHARE ROW EXCLUSIVE MODE` before any read: the lock is taken before the transaction's
//! snapshot, so charges queue on it instead of failing each other's serialization (the
//! pattern PostgreSQL's `LOCK` documentation gives for serializable writers). It then
//! reads the header, the total and the tenants' spending `FOR UPDATE`, composes each
//! charge of the step in turn onto both with `RdpCurve::compose` (rounded up), checks the
//! tenant's budget and the total budget by `RdpCurve::epsilon` exactly as the file ledger
//! does (a refused charge is dropped and the next one checked), updates the spending rows
//! and the header's counters, appends the runs, and commits. A
//! serialization failure or deadlock (SQLSTATE 40001, 40P01) rolls back everything and
//! is retried, a bounded number of times. Records are numbered under the lock, so record
//! order is commit order, and the stored total is the composition of the committed
//! charges in that order.
//!
//! `charge` returns `Ok` only after `COMMIT` returns, and opening refuses a server with
//! `fsync` or `synchronous_commit` off, where `COMMIT` can return before the commit
//! record is flushed. A replica that dies inside the transaction leaves nothing behind
//! (PostgreSQL aborts a transaction whose connection is gone); one that dies after
//! sending `COMMIT` may leave a charge it never acknowledged, an over-count, which is
//! safe.
//!
//! # Blocking
//!
//! This uses the synchronous `postgres` client, which runs its own small tokio runtime:
//! create, use and drop a store on a blocking thread (`tokio::task::spawn_blocking`),
//! never on an async task.
//!
//! Connections are made without TLS (this build links no TLS library): reach the server
//! over a Unix socket or a trusted network.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, IsolationLevel, NoTls, Row, Transaction};
use privmix_accountant::{DpEvent, Orders, PrivacyBudget, ProtectedSet, RdpCurve};

use super::snapshot::{BudgetChange, Record, Snapshot, StoreFormat, TenantSpent};
use super::step::{Cost, PendingCharge};
use super::{LedgerStore, StepOutcomes, StoreError, check_budget, check_tenant_name};
#[cfg(test)]
use super::{StoreReceipt, Tenant};

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i32 = 2;
/// The key of everyone's spending in `privmix_spent` (not a valid tenant name).
const TOTAL_KEY: &str = "*";
/// How many transactions a charge or a raise tries before giving up.
const MAX_ATTEMPTS: u32 = 32;
/// The advisory lock key creation holds, so that replicas creating the ledger at
/// once do not race on `CREATE TABLE`: "privmixl" in ASCII.
const CREATE_LOCK_KEY: i64 = 0x7072_6976_6d69_786c;
/// Longest label, in bytes (the file ledger's limit).
const MAX_LABEL_BYTES: usize = privmix_accountant::MAX_LABEL_BYTES;
/// A session stuck inside a transaction (a hung replica) is ended by the server after
/// this long, releasing the lock every charge takes.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS privmix_ledger (
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
CREATE TABLE IF NOT EXISTS privmix_spent (
    tenant text PRIMARY KEY,
    curve float8[] NOT NULL,
    charges bigint NOT NULL CHECK (charges >= 0)
);
CREATE TABLE IF NOT EXISTS privmix_costs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    curve float8[] NOT NULL,
    event bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS privmix_costs_event ON privmix_costs USING hash (event);
CREATE TABLE IF NOT EXISTS privmix_charges (
    sequence bigint PRIMARY KEY,
    tenant text,
    label text NOT NULL,
    curve float8[],
    cost bigint REFERENCES privmix_costs (id),
    count bigint NOT NULL DEFAULT 1 CHECK (count >= 1),
    at timestamptz NOT NULL,
    CHECK ((curve IS NULL) <> (cost IS NULL))
);
CREATE TABLE IF NOT EXISTS privmix_budgets (
    sequence bigint PRIMARY KEY,
    epsilon float8,
    delta float8,
    at timestamptz NOT NULL,
    after_charges bigint NOT NULL,
    CHECK ((epsilon IS NULL) = (delta IS NULL))
);
";

/// What upgrades a database of schema version 1 to version 2 (see the module docs):
/// costs are stored once and a charge row names one with a count; the rows already
/// there keep their curves (cost NULL, count 1).
const UPGRADE_1_TO_2: &str = "
CREATE TABLE IF NOT EXISTS privmix_costs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    curve float8[] NOT NULL,
    event bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS privmix_costs_event ON privmix_costs USING hash (event);
ALTER TABLE privmix_charges
    ALTER COLUMN curve DROP NOT NULL,
    ADD COLUMN cost bigint REFERENCES privmix_costs (id),
    ADD COLUMN count bigint NOT NULL DEFAULT 1 CHECK (count >= 1),
    ADD CHECK ((curve IS NULL) <> (cost IS NULL));
UPDATE privmix_ledger SET schema_version = 2;
";

/// Milliseconds since the Unix epoch of a `timestamptz` column, in SQL.
macro_rules! ms {
    ($column:literal) => {
        concat!("floor(extract(epoch FROM ", $column, ") * 1000)::int8")
    };
}

/// A PostgreSQL ledger. See the module docs.
pub struct PostgresStore {
    config: Config,
    describe: String,
    client: Option<Client>,
    orders: Orders,
    budget: Option<PrivacyBudget>,
    protected_set: Option<ProtectedSet>,
    /// The ids of the costs this handle has seen committed, by [`Prepared::key`].
    cost_ids: HashMap<Vec<u8>, i64>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("store", &self.describe)
            .field("orders", &self.orders.len())
            .field("budget", &self.budget)
            .field("protected_set", &self.protected_set)
            .finish_non_exhaustive()
    }
}

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

/// Whether `spec` names a PostgreSQL ledger.
pub fn is_postgres_url(spec: &str) -> bool {
    let lower = spec.get(..13).unwrap_or(spec).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// Parses a `postgres://…` URL. The error never repeats the URL (it may hold a
/// password).
pub fn parse_url(url: &str) -> Result<Config, StoreError> {
    url.parse::<Config>().map_err(|e| StoreError::BadSpec {
        reason: format!("not a valid PostgreSQL URL ({e})"),
    })
}

/// The URL of `config` without its password: `postgresql://user@host:port/db`, with a
/// Unix socket directory as `?host=` and the session options when set.
pub fn describe_config(config: &Config) -> String {
    use postgres::config::Host;
    let ports = config.get_ports();
    let port_of = |i: usize| ports.get(i).or_else(|| ports.first()).copied();
    let mut tcp = Vec::new();
    let mut sockets = Vec::new();
    for (i, host) in config.get_hosts().iter().enumerate() {
        match host {
            Host::Tcp(name) => {
                let name = if name.contains(':') {
                    format!("[{name}]")
                } else {
                    name.clone()
                };
                tcp.push(match port_of(i) {
                    Some(p) => format!("{name}:{p}"),
                    None => name,
                });
            }
            Host::Unix(dir) => sockets.push(match port_of(i) {
                Some(p) => format!("{} (port {p})", dir.display()),
                None => dir.display().to_string(),
            }),
        }
    }
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or("");
    let mut out = format!("postgresql://{user}{}/{db}", tcp.join(","));
    let mut params = Vec::new();
    for socket in sockets {
        params.push(format!("host={socket}"));
    }
    if let Some(options) = config.get_options() {
        params.push(format!("options={options}"));
    }
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// A failure inside a transaction: the driver's (maybe retryable) or the store's.
enum Fail {
    Pg(&'static str, postgres::Error),
    Store(StoreError),
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl From<privmix_accountant::AccountantError> for Fail {
    fn from(e: privmix_accountant::AccountantError) -> Self {
        Self::Store(e.into())
    }
}

/// Wraps a driver error with what was being done.
fn pg(during: &'static str) -> impl Fn(postgres::Error) -> Fail {
    move |e| Fail::Pg(during, e)
}

/// A serialization failure or a deadlock: the transaction was rolled back and may be
/// tried again.
fn retryable(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// A pause before retry `attempt` (from 1): exponential up to 64 ms, scaled by a
/// factor in [0.5, 1.5) from the clock and the thread, so that colliding replicas do
/// not retry in step.
fn backoff(attempt: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let spread = 0.5 + (h.finish() % 1024) as f64 / 1024.0;
    let base_us = 1000u64 << attempt.min(6);
    Duration::from_micros((base_us as f64 * spread) as u64)
}

/// The header as read from `privmix_ledger`.
struct Header {
    orders: Orders,
    initial_budget: Option<PrivacyBudget>,
    budget: Option<PrivacyBudget>,
    protected_set: Option<ProtectedSet>,
    created_ms: u64,
    next_sequence: u64,
    charges: u64,
}

impl PostgresStore {
    /// Opens the existing ledger at `url`; [`StoreError::NotFound`] when the database
    /// holds none.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let config = parse_url(url)?;
        let describe = describe_config(&config);
        let mut client = connect(&config, &describe)?;
        let exists: bool = client
            .query_one("SELECT to_regclass('privmix_ledger') IS NOT NULL", &[])
            .map_err(|e| postgres_error(&describe, "looking for the ledger's tables", e))?
            .get(0);
        if !exists {
            return Err(StoreError::NotFound { store: describe });
        }
        upgrade(&mut client).map_err(|f| fail(&describe, f))?;
        let header = read_header(&mut client, &describe)
            .map_err(|f| fail(&describe, f))?
            .ok_or_else(|| StoreError::NotFound {
                store: describe.clone(),
            })?;
        Ok(Self {
            config,
            describe,
            client: Some(client),
            orders: header.orders,
            budget: header.budget,
            protected_set: header.protected_set,
            cost_ids: HashMap::new(),
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
        let config = parse_url(url)?;
        let describe = describe_config(&config);
        let mut client = connect(&config, &describe)?;
        let created = (|| -> Result<(), Fail> {
            let mut tx = client.transaction().map_err(pg("starting the creation"))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK_KEY])
                .map_err(pg("locking for creation"))?;
            tx.batch_execute(SCHEMA)
                .map_err(pg("creating the tables"))?;
            let existing: i64 = tx
                .query_one("SELECT count(*) FROM privmix_ledger", &[])
                .map_err(pg("looking for a ledger"))?
                .get(0);
            if existing > 0 {
                return Err(Fail::Store(StoreError::AlreadyExists {
                    store: describe.clone(),
                }));
            }
            let (eps, delta) = budget_columns(budget);
            let members = protected.as_ref().map(|s| s.members().to_vec());
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
            tx.commit().map_err(pg("committing the creation"))
        })();
        created.map_err(|f| fail(&describe, f))?;
        Ok(Self {
            config,
            describe,
            client: Some(client),
            orders,
            budget,
            protected_set: protected,
            cost_ids: HashMap::new(),
        })
    }

    /// Calls `each` with every record, in sequence order, read in one consistent
    /// snapshot.
    pub fn for_each_record(
        &mut self,
        each: &mut dyn FnMut(Record) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let describe = self.describe.clone();
        let orders = self.orders.clone();
        let client = self.client()?;
        let read = (|| -> Result<(), Fail> {
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .map_err(pg("starting a read"))?;
            let costs = read_costs(&mut tx, &orders, &describe)?;
            {
                let mut rows = tx
                    .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
                    .map_err(pg("reading the records"))?;
                while let Some(row) = rows.next().map_err(pg("reading the records"))? {
                    each(record_of(&row, &orders, &costs, &describe)?)?;
                }
            }
            tx.commit().map_err(pg("ending a read"))
        })();
        read.map_err(|f| fail(&describe, f))
    }

    /// Checks every invariant the ledger keeps: records numbered 0, 1, … without a
    /// gap; the stored total and each tenant's spending equal to the composition of
    /// their charges in record order, bit for bit; the counters; the budget history
    /// ending at the budget in force; and every charge within the total budget in force
    /// when it was recorded. Anything else is [`StoreError::Inconsistent`].
    pub fn verify(&mut self) -> Result<PgVerified, StoreError> {
        let describe = self.describe.clone();
        let orders = self.orders.clone();
        let client = self.client()?;
        let checked = (|| -> Result<PgVerified, Fail> {
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .map_err(pg("starting a read"))?;
            let header = read_header(&mut tx, &describe)?.ok_or_else(|| StoreError::NotFound {
                store: describe.clone(),
            })?;
            let bad = |reason: String| {
                Fail::Store(StoreError::Inconsistent {
                    store: describe.clone(),
                    reason,
                })
            };
            let mut total = RdpCurve::zero(orders.clone());
            let mut tenants: BTreeMap<String, TenantSpent> = BTreeMap::new();
            let mut budget = header.initial_budget;
            let mut records = 0u64;
            let mut charges = 0u64;
            let costs = read_costs(&mut tx, &orders, &describe)?;
            {
                let mut rows = tx
                    .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
                    .map_err(pg("reading the records"))?;
                while let Some(row) = rows.next().map_err(pg("reading the records"))? {
                    match record_of(&row, &orders, &costs, &describe)? {
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
            let stored = read_spent_rows(&mut tx, &orders, &describe)?;
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
            tx.commit().map_err(pg("ending a read"))?;
            Ok(PgVerified {
                records,
                charges,
                tenants: tenants.len(),
            })
        })();
        checked.map_err(|f| fail(&describe, f))
    }

    /// A step commit (see [`LedgerStore::commit_step`]): every charge checked and
    /// encoded, then one serializable transaction.
    fn commit(&mut self, charges: &[PendingCharge]) -> Result<Committed, StoreError> {
        let prepared = charges
            .iter()
            .map(|c| Prepared::new(c, &self.orders))
            .collect::<Result<Vec<_>, _>>()?;
        let describe = self.describe.clone();
        let known = std::mem::take(&mut self.cost_ids);
        let committed = self
            .serializable(|tx, orders| commit_charges(tx, orders, &describe, &prepared, &known));
        self.cost_ids = known;
        let committed = committed?;
        // Only now are the new costs' ids in the database for every later transaction.
        self.cost_ids.extend(committed.new_costs.iter().cloned());
        self.budget = committed.budget;
        Ok(committed)
    }

    /// The connection, made again if it was lost (checking the server again).
    fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.client = Some(connect(&self.config, &self.describe)?);
        }
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Backend(format!("ledger {}: no connection", self.describe)))
    }

    /// Runs `body` in a serializable transaction and commits it, retrying
    /// serialization failures and deadlocks. `Ok` only after `COMMIT` returned.
    fn serializable<T>(
        &mut self,
        mut body: impl FnMut(&mut Transaction<'_>, &Orders) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        let describe = self.describe.clone();
        let orders = self.orders.clone();
        for attempt in 1..=MAX_ATTEMPTS {
            let client = self.client()?;
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start()
                .map_err(|e| postgres_error(&describe, "starting a transaction", e))?;
            let out = match body(&mut tx, &orders) {
                Ok(out) => out,
                // Dropping `tx` rolls back.
                Err(Fail::Pg(_, e)) if retryable(&e) => {
                    drop(tx);
                    std::thread::sleep(backoff(attempt));
                    continue;
                }
                Err(f) => return Err(fail(&describe, f)),
            };
            match tx.commit() {
                Ok(()) => return Ok(out),
                Err(e) if retryable(&e) => std::thread::sleep(backoff(attempt)),
                Err(e) => return Err(postgres_error(&describe, "committing", e)),
            }
        }
        Err(StoreError::Contention {
            store: describe,
            attempts: MAX_ATTEMPTS,
        })
    }
}

impl LedgerStore for PostgresStore {
    fn describe(&self) -> String {
        self.describe.clone()
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
        let describe = self.describe.clone();
        let key = tenant.unwrap_or(TOTAL_KEY);
        let client = self.client()?;
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
        receipt_of(committed, tenant, self.budget, &self.describe)
    }

    fn commit_step(&mut self, charges: &[PendingCharge]) -> Result<StepOutcomes, StoreError> {
        Ok(self.commit(charges)?.outcomes)
    }

    fn raise(&mut self, budget: PrivacyBudget) -> Result<u64, StoreError> {
        let describe = self.describe.clone();
        let sequence = self.serializable(|tx, orders| {
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
            let spent = curve_of(orders, row.get(0), &describe)?;
            if charges > 0 {
                let at_delta = spent.epsilon(budget.delta())?;
                if at_delta.epsilon > budget.epsilon() {
                    return Err(Fail::Store(StoreError::BudgetBelowSpent {
                        store: describe.clone(),
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
            u64_of(sequence, "next_sequence", &describe)
        })?;
        self.budget = Some(budget);
        Ok(sequence)
    }

    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        let describe = self.describe.clone();
        let orders = self.orders.clone();
        let client = self.client()?;
        let snap = (|| -> Result<Snapshot, Fail> {
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .map_err(pg("starting a read"))?;
            let header = read_header(&mut tx, &describe)?.ok_or_else(|| StoreError::NotFound {
                store: describe.clone(),
            })?;
            let mut rows = read_spent_rows(&mut tx, &orders, &describe)?;
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
            tx.commit().map_err(pg("ending a read"))?;
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
            })
        })();
        let snap = snap.map_err(|f| fail(&describe, f))?;
        self.budget = snap.budget;
        Ok(snap)
    }
}

/// The receipt of a one-charge step.
#[cfg(test)]
fn receipt_of(
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
struct Prepared<'a> {
    charge: &'a PendingCharge,
    curve: RdpCurve,
    /// The event's encoding; empty for a measured curve.
    event: Vec<u8>,
    /// The cost's identity: the curve's bits, then the event's encoding.
    key: Vec<u8>,
}

impl<'a> Prepared<'a> {
    fn new(charge: &'a PendingCharge, orders: &Orders) -> Result<Self, StoreError> {
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
        })
    }

    fn tenant(&self) -> Option<&'a str> {
        self.charge.tenant.as_ref().map(|t| t.name.as_str())
    }
}

/// What a step commit's transaction did.
struct Committed {
    outcomes: StepOutcomes,
    /// The total budget read under the lock.
    budget: Option<PrivacyBudget>,
    /// The costs it stored, by key (valid only once the transaction commits).
    new_costs: Vec<(Vec<u8>, i64)>,
    /// The first record number it wrote, if it wrote any.
    #[cfg_attr(not(test), allow(dead_code))]
    first_sequence: Option<u64>,
    /// The spending after it, by key (`*` and the tenants it charged).
    #[cfg_attr(not(test), allow(dead_code))]
    spent: BTreeMap<String, (RdpCurve, i64)>,
}

/// The steps of one step commit inside `tx` (everything but the commit): the charge
/// transaction of the module docs, each charge of the step checked in turn on what the
/// ones before it left, a refused one skipped; then one row per run of consecutive
/// accepted charges with the same tenant, label and cost. `known` are the cost ids
/// already committed.
fn commit_charges(
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
            match check_budget(
                || format!("tenant {}", t.name),
                tenant_spent,
                &p.curve,
                t.budget,
            ) {
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
                    && prepared[*start].key == p.key =>
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
            "INSERT INTO privmix_charges (sequence, tenant, label, cost, count, at)
             VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
            &[&sequence, &p.tenant(), &p.charge.label, &cost, &count],
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

/// A stored cost: its curve and the event it was computed from, if any.
struct StoredCost {
    curve: RdpCurve,
    event: Option<DpEvent>,
}

/// Every row of `privmix_costs`, by id, each checked: a curve over the ledger's orders,
/// a valid event, and the curve not below the event's curve at any order (a record
/// never under-counts its event).
fn read_costs(
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
const RECORDS_SQL: &str = concat!(
    "SELECT sequence, ",
    ms!("at"),
    ", tenant, label, curve, cost, count, NULL::float8, NULL::float8, NULL::int8
     FROM privmix_charges
     UNION ALL
     SELECT sequence, ",
    ms!("at"),
    ", NULL, NULL, NULL, NULL, NULL, epsilon, delta, after_charges FROM privmix_budgets
     ORDER BY 1"
);

fn record_of(
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
    })
}

fn budget_change_of(row: &Row, describe: &str) -> Result<BudgetChange, Fail> {
    Ok(BudgetChange {
        sequence: u64_of(row.get(0), "sequence", describe)?,
        time_ms: u64_of(row.get(1), "time", describe)?,
        budget: budget_of(row, 2, 3, describe)?,
        after_charges: u64_of(row.get(4), "after_charges", describe)?,
    })
}

/// Every row of `privmix_spent`, by key.
fn read_spent_rows(
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

/// Connects and checks that a commit the server acknowledges is on disk.
fn connect(config: &Config, describe: &str) -> Result<Client, StoreError> {
    let mut config = config.clone();
    if config.get_application_name().is_none() {
        config.application_name("privmix");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(30));
    }
    let mut client = config
        .connect(NoTls)
        .map_err(|e| postgres_error(describe, "connecting", e))?;
    for setting in ["fsync", "synchronous_commit"] {
        let value: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .map_err(|e| postgres_error(describe, "reading the server's settings", e))?
            .get(0);
        // `synchronous_commit` = local, remote_write or remote_apply also wait for the
        // local flush; only `off` does not.
        if value == "off" {
            return Err(StoreError::UnsafeServer {
                store: describe.to_owned(),
                setting,
                value,
            });
        }
    }
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'"
        ))
        .map_err(|e| postgres_error(describe, "setting the session", e))?;
    Ok(client)
}

/// Upgrades a database of schema version 1 to this build's (see the module docs), in
/// one transaction under the creation lock and an exclusive lock on the header, so
/// that replicas opening it at once upgrade it once. Any other version is left for
/// [`read_header`] to refuse.
fn upgrade(client: &mut Client) -> Result<(), Fail> {
    fn version(c: &mut impl GenericClient) -> Result<Option<i32>, Fail> {
        Ok(
            c.query_opt("SELECT schema_version FROM privmix_ledger", &[])
                .map_err(pg("reading the schema version"))?
                .map(|row| row.get(0)),
        )
    }
    if version(client)? != Some(1) {
        return Ok(());
    }
    let mut tx = client.transaction().map_err(pg("starting the upgrade"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK_KEY])
        .map_err(pg("locking for the upgrade"))?;
    tx.batch_execute("LOCK TABLE privmix_ledger IN ACCESS EXCLUSIVE MODE")
        .map_err(pg("locking for the upgrade"))?;
    if version(&mut tx)? == Some(1) {
        tx.batch_execute(UPGRADE_1_TO_2)
            .map_err(pg("upgrading the schema"))?;
    }
    tx.commit().map_err(pg("committing the upgrade"))
}

/// The header row, or `None` when the table is empty.
fn read_header(client: &mut impl GenericClient, describe: &str) -> Result<Option<Header>, Fail> {
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

/// The budget in columns `eps` and `delta` of `row` (both NULL: none).
fn budget_of(
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

fn budget_columns(budget: Option<PrivacyBudget>) -> (Option<f64>, Option<f64>) {
    budget.map_or((None, None), |b| (Some(b.epsilon()), Some(b.delta())))
}

/// A stored curve over `orders`.
fn curve_of(orders: &Orders, values: Vec<f64>, describe: &str) -> Result<RdpCurve, Fail> {
    RdpCurve::new(orders.clone(), values).map_err(|e| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: format!("a stored curve: {e}"),
        })
    })
}

fn u64_of(value: i64, what: &str, describe: &str) -> Result<u64, Fail> {
    u64::try_from(value).map_err(|_| {
        Fail::Store(StoreError::Inconsistent {
            store: describe.to_owned(),
            reason: format!("{what} is negative ({value})"),
        })
    })
}

/// A label the table can hold, within the file ledger's length limit.
fn check_label(label: &str) -> Result<(), StoreError> {
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

fn postgres_error(describe: &str, during: &'static str, source: postgres::Error) -> StoreError {
    StoreError::Postgres {
        store: describe.to_owned(),
        during,
        source,
    }
}

fn fail(describe: &str, f: Fail) -> StoreError {
    match f {
        Fail::Pg(during, e) => postgres_error(describe, during, e),
        Fail::Store(e) => e,
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only access to the transaction's steps, to stop a charge between its
    //! writes and its commit as a crashing replica would.

    use super::*;

    /// Connects to `url` and runs a charge's steps in a serializable transaction, then
    /// abandons the connection without COMMIT or ROLLBACK (the transaction object is
    /// forgotten and the socket closed), as a replica killed mid-transaction does.
    /// Returns what the steps computed, or their error text. `before_abandon` runs while
    /// the transaction still holds its locks.
    pub fn charge_then_die(
        url: &str,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
        before_abandon: impl FnOnce(),
    ) -> Result<StoreReceipt, String> {
        let config = parse_url(url).map_err(|e| e.to_string())?;
        let describe = describe_config(&config);
        let mut client = connect(&config, &describe).map_err(|e| e.to_string())?;
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::Serializable)
            .start()
            .map_err(|e| e.to_string())?;
        let orders = curve.orders().clone();
        let charge = PendingCharge {
            tenant: tenant.cloned(),
            cost: Cost::Curve(curve.clone()),
            label: label.to_owned(),
        };
        let prepared = [Prepared::new(&charge, &orders).map_err(|e| e.to_string())?];
        let out = commit_charges(&mut tx, &orders, &describe, &prepared, &HashMap::new());
        before_abandon();
        // No rollback message: the server learns of the end only from the closed socket.
        std::mem::forget(tx);
        drop(client);
        let committed = out.map_err(|f| fail(&describe, f).to_string())?;
        let budget = committed.budget;
        receipt_of(committed, tenant, budget, &describe).map_err(|e| e.to_string())
    }
}
