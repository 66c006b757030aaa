//! The PostgreSQL store: one ledger shared by several `privmix serve` replicas.
//!
//! # Tables (schema version 1)
//!
//! ```text
//! privmix_ledger   one row: schema_version, orders float8[], the initial and the current
//!                  budget (ε, δ; both NULL for none), protected_set text[] (NULL: none),
//!                  created_at, next_sequence (records so far), charges
//! privmix_spent    tenant text PRIMARY KEY, curve float8[], charges: each tenant's
//!                  composed spending, and everyone's under the reserved key `*`
//! privmix_charges  append-only: sequence PRIMARY KEY, tenant (NULL: none), label,
//!                  curve float8[], at
//! privmix_budgets  every budget change: sequence PRIMARY KEY, ε, δ, at, after_charges
//! ```
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
//! reads the header, the total and the tenant's spending `FOR UPDATE`, composes the
//! charge onto both with `RdpCurve::compose` (rounded up), checks the tenant's budget and
//! the total budget by `RdpCurve::epsilon` exactly as the file ledger does, updates the
//! spending rows and the header's counters, appends the charge, and commits. A
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

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, IsolationLevel, NoTls, Row, Transaction};
use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet, RdpCurve};

use super::snapshot::{BudgetChange, Record, Snapshot, StoreFormat, TenantSpent};
use super::step::PendingCharge;
use super::{LedgerStore, StepOutcomes, StoreError, check_budget, check_tenant_name};
#[cfg(test)]
use super::{StoreReceipt, Tenant};

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i32 = 1;
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
CREATE TABLE IF NOT EXISTS privmix_charges (
    sequence bigint PRIMARY KEY,
    tenant text,
    label text NOT NULL,
    curve float8[] NOT NULL,
    at timestamptz NOT NULL
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
            {
                let mut rows = tx
                    .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
                    .map_err(pg("reading the records"))?;
                while let Some(row) = rows.next().map_err(pg("reading the records"))? {
                    each(record_of(&row, &orders, &describe)?)?;
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
            {
                let mut rows = tx
                    .query_raw(RECORDS_SQL, std::iter::empty::<&dyn ToSql>())
                    .map_err(pg("reading the records"))?;
                while let Some(row) = rows.next().map_err(pg("reading the records"))? {
                    match record_of(&row, &orders, &describe)? {
                        Record::Charge {
                            sequence,
                            tenant,
                            curve,
                            ..
                        } => {
                            if sequence != records {
                                return Err(bad(format!(
                                    "record {records} is missing (the next is {sequence})"
                                )));
                            }
                            total = total.compose(&curve)?;
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
                                match tenants.get_mut(&name) {
                                    Some(t) => {
                                        t.charges += 1;
                                        t.spent = t.spent.compose(&curve)?;
                                    }
                                    None => {
                                        tenants.insert(
                                            name,
                                            TenantSpent {
                                                charges: 1,
                                                spent: curve,
                                            },
                                        );
                                    }
                                }
                            }
                            charges += 1;
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
        if curve.orders() != &self.orders {
            return Err(privmix_accountant::AccountantError::OrdersDiffer.into());
        }
        check_label(label)?;
        if let Some(t) = tenant {
            check_tenant_name(&t.name)?;
        }
        let describe = self.describe.clone();
        let (receipt, budget) = self
            .serializable(|tx, orders| charge_steps(tx, orders, &describe, tenant, curve, label))?;
        self.budget = budget;
        Ok(receipt)
    }

    fn commit_step(&mut self, charges: &[PendingCharge]) -> Result<StepOutcomes, StoreError> {
        let mut curves = Vec::with_capacity(charges.len());
        for charge in charges {
            curves.push(charge.cost.curve(&self.orders)?);
            check_label(&charge.label)?;
            if let Some(t) = &charge.tenant {
                check_tenant_name(&t.name)?;
            }
        }
        let describe = self.describe.clone();
        let (outcomes, budget) =
            self.serializable(|tx, orders| step_steps(tx, orders, &describe, charges, &curves))?;
        self.budget = budget;
        Ok(outcomes)
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

#[cfg(test)]
/// The steps of one charge inside `tx` (everything but the commit). See the module
/// docs. Returns the receipt and the total budget read.
fn charge_steps(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    tenant: Option<&Tenant>,
    curve: &RdpCurve,
    label: &str,
) -> Result<(StoreReceipt, Option<PrivacyBudget>), Fail> {
    // Before any read, so that the transaction's snapshot is taken after the lock.
    tx.batch_execute("LOCK TABLE privmix_ledger IN SHARE ROW EXCLUSIVE MODE")
        .map_err(pg("locking the ledger"))?;
    let h = tx
        .query_one(
            "SELECT budget_epsilon, budget_delta, next_sequence, charges FROM privmix_ledger FOR UPDATE",
            &[],
        )
        .map_err(pg("reading the header"))?;
    let budget = budget_of(&h, 0, 1, describe)?;
    let sequence: i64 = h.get(2);
    let charges: i64 = h.get(3);
    let mut keys = vec![TOTAL_KEY];
    if let Some(t) = tenant {
        keys.push(&t.name);
    }
    let rows = tx
        .query(
            "SELECT tenant, curve, charges FROM privmix_spent WHERE tenant = ANY($1) FOR UPDATE",
            &[&keys],
        )
        .map_err(pg("reading the spending"))?;
    let mut found: BTreeMap<String, (RdpCurve, i64)> = BTreeMap::new();
    for row in &rows {
        let key: String = row.get(0);
        let spent = curve_of(orders, row.get(1), describe)?;
        found.insert(key, (spent, row.get(2)));
    }
    let (total, total_charges) =
        found
            .remove(TOTAL_KEY)
            .ok_or_else(|| StoreError::Inconsistent {
                store: describe.to_owned(),
                reason: "the total's spending row is missing".into(),
            })?;
    // The tenant's budget first, then the total's, as the file store does.
    let tenant_update = match tenant {
        Some(t) => {
            let (spent, n) = found
                .remove(&t.name)
                .unwrap_or_else(|| (RdpCurve::zero(orders.clone()), 0));
            let (composed, at_delta) =
                check_budget(|| format!("tenant {}", t.name), &spent, curve, t.budget)?;
            Some((t.name.as_str(), composed, n + 1, at_delta))
        }
        None => None,
    };
    let (new_total, spent) = check_budget(|| "total".into(), &total, curve, budget)?;

    tx.execute(
        "UPDATE privmix_ledger SET next_sequence = $1, charges = $2",
        &[&(sequence + 1), &(charges + 1)],
    )
    .map_err(pg("updating the header"))?;
    let upsert = "INSERT INTO privmix_spent (tenant, curve, charges) VALUES ($1, $2, $3)
                  ON CONFLICT (tenant) DO UPDATE SET curve = EXCLUDED.curve, charges = EXCLUDED.charges";
    tx.execute(
        upsert,
        &[&TOTAL_KEY, &new_total.epsilons(), &(total_charges + 1)],
    )
    .map_err(pg("updating the total"))?;
    let mut tenant_spent = None;
    if let Some((name, composed, n, at_delta)) = &tenant_update {
        tx.execute(upsert, &[name, &composed.epsilons(), n])
            .map_err(pg("updating the tenant's spending"))?;
        tenant_spent = *at_delta;
    }
    tx.execute(
        "INSERT INTO privmix_charges (sequence, tenant, label, curve, at)
         VALUES ($1, $2, $3, $4, clock_timestamp())",
        &[
            &sequence,
            &tenant.map(|t| t.name.as_str()),
            &label,
            &curve.epsilons(),
        ],
    )
    .map_err(pg("appending the charge"))?;
    let receipt = StoreReceipt {
        sequence: u64_of(sequence, "next_sequence", describe)?,
        spent,
        tenant_spent,
    };
    Ok((receipt, budget))
}

/// The steps of one step commit inside `tx` (everything but the commit): the charge
/// transaction of the module docs for every charge of the step in turn, each checked on
/// what the ones before it left, a refused one skipped. Returns each charge's outcome
/// and the total budget read.
fn step_steps(
    tx: &mut Transaction<'_>,
    orders: &Orders,
    describe: &str,
    charges: &[PendingCharge],
    curves: &[RdpCurve],
) -> Result<(StepOutcomes, Option<PrivacyBudget>), Fail> {
    tx.batch_execute("LOCK TABLE privmix_ledger IN SHARE ROW EXCLUSIVE MODE")
        .map_err(pg("locking the ledger"))?;
    let h = tx
        .query_one(
            "SELECT budget_epsilon, budget_delta, next_sequence, charges FROM privmix_ledger FOR UPDATE",
            &[],
        )
        .map_err(pg("reading the header"))?;
    let budget = budget_of(&h, 0, 1, describe)?;
    let mut sequence: i64 = h.get(2);
    let mut recorded: i64 = h.get(3);
    let mut keys: Vec<&str> = vec![TOTAL_KEY];
    keys.extend(
        charges
            .iter()
            .filter_map(|c| c.tenant.as_ref().map(|t| t.name.as_str())),
    );
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
    let mut outcomes = Vec::with_capacity(charges.len());
    for (charge, curve) in charges.iter().zip(curves) {
        // The tenant's budget first, then the total's, as for one charge.
        let mut tenant_after = None;
        if let Some(t) = &charge.tenant {
            let zero = (RdpCurve::zero(orders.clone()), 0);
            let (tenant_spent, n) = spent.get(&t.name).unwrap_or(&zero);
            match check_budget(
                || format!("tenant {}", t.name),
                tenant_spent,
                curve,
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
        let total_after = match check_budget(|| "total".into(), total, curve, budget) {
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
        tx.execute(
            "INSERT INTO privmix_charges (sequence, tenant, label, curve, at)
             VALUES ($1, $2, $3, $4, clock_timestamp())",
            &[
                &sequence,
                &charge.tenant.as_ref().map(|t| t.name.as_str()),
                &charge.label,
                &curve.epsilons(),
            ],
        )
        .map_err(pg("appending the charge"))?;
        sequence += 1;
        recorded += 1;
        outcomes.push(Ok(()));
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
    Ok((outcomes, budget))
}

/// Every record, charges and budget changes, in sequence order.
const RECORDS_SQL: &str = concat!(
    "SELECT sequence, ",
    ms!("at"),
    ", tenant, label, curve, NULL::float8, NULL::float8, NULL::int8 FROM privmix_charges
     UNION ALL
     SELECT sequence, ",
    ms!("at"),
    ", NULL, NULL, NULL, epsilon, delta, after_charges FROM privmix_budgets
     ORDER BY 1"
);

fn record_of(row: &Row, orders: &Orders, describe: &str) -> Result<Record, Fail> {
    let sequence = u64_of(row.get(0), "sequence", describe)?;
    let time_ms = u64_of(row.get(1), "time", describe)?;
    let label: Option<String> = row.get(3);
    Ok(match label {
        Some(label) => Record::Charge {
            sequence,
            time_ms,
            tenant: row.get(2),
            label,
            curve: curve_of(orders, row.get(4), describe)?,
        },
        None => Record::Budget(BudgetChange {
            sequence,
            time_ms,
            budget: budget_of(row, 5, 6, describe)?,
            after_charges: u64_of(row.get(7), "after_charges", describe)?,
        }),
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
        let out = charge_steps(&mut tx, &orders, &describe, tenant, curve, label);
        before_abandon();
        // No rollback message: the server learns of the end only from the closed socket.
        std::mem::forget(tx);
        drop(client);
        out.map(|(r, _)| r)
            .map_err(|f| fail(&describe, f).to_string())
    }
}
