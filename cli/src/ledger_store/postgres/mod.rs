//! The PostgreSQL store: one ledger shared by several `privmix serve` replicas.
//!
//! # Tables (schema version 3)
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
//!                  lease (the budget lease a reservation is for; NULL otherwise)
//! privmix_budgets  every budget change: sequence PRIMARY KEY, ε, δ, at, after_charges
//! privmix_leases   budget leases (`lease.rs`): id, replica, tenant (NULL: none),
//!                  reserved float8[] (its reservations composed), used float8[] and
//!                  charges (what it spent, as last written), opened_at, updated_at
//! privmix_tenant_budgets  every change of a tenant's own budget: id, tenant, ε, δ, at,
//!                  after_records; a tenant's charges must fit its last one (and the
//!                  total budget), whichever replica records them
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
//! A database of schema version 1 (one row and one curve per charge) or 2 (no leases)
//! is upgraded in place the first time a build of version 3 opens it, in one
//! transaction: the new tables and columns are added and every existing row is read as
//! it was (a version 1 row is a charge of its own curve, count 1). An older build
//! refuses the upgraded database
//! ([`crate::ledger_store::StoreError::UnsupportedSchema`]).
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
//!
//! # Layout
//!
//! `store.rs` is the handle ([`PostgresStore`]); `schema.rs` the tables, creation and
//! upgrades; `url.rs` URL parsing; `connection.rs` connecting and the server checks;
//! `retry.rs` the serializable (retried) and read-only transactions; `charge.rs` step
//! commits and budget changes; `lease.rs` budget leases; `verify.rs` the replay;
//! `codec.rs` rows to values.

/// Milliseconds since the Unix epoch of a `timestamptz` column, in SQL.
macro_rules! ms {
    ($column:literal) => {
        concat!("floor(extract(epoch FROM ", $column, ") * 1000)::int8")
    };
}

mod charge;
mod codec;
mod connection;
mod error;
mod lease;
mod retry;
mod schema;
mod store;
#[cfg(test)]
pub(crate) mod test_hooks;
mod url;
mod verify;

#[cfg(test)]
pub(crate) use lease::{give_back as give_back_of, unspent as unspent_of};
#[cfg(test)]
pub use schema::SCHEMA_VERSION;
pub use store::PostgresStore;
pub use url::{describe_config, is_postgres_url, parse_url};
