//! Transactions: serializable writes retried on serialization failures and deadlocks,
//! and consistent read-only reads.

use std::time::Duration;

use postgres::{IsolationLevel, Transaction};

use super::connection::Connection;
use super::error::{Fail, fail, pg, postgres_error};
use crate::ledger_store::StoreError;

/// How many transactions a charge or a raise tries before giving up.
const MAX_ATTEMPTS: u32 = 32;

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

/// Runs `body` in a serializable transaction and commits it, retrying
/// serialization failures and deadlocks. `Ok` only after `COMMIT` returned.
pub(super) fn serializable<T>(
    conn: &mut Connection,
    mut body: impl FnMut(&mut Transaction<'_>) -> Result<T, Fail>,
) -> Result<T, StoreError> {
    let describe = conn.describe.clone();
    for attempt in 1..=MAX_ATTEMPTS {
        let client = conn.client()?;
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::Serializable)
            .start()
            .map_err(|e| postgres_error(&describe, "starting a transaction", e))?;
        let out = match body(&mut tx) {
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

/// Runs `body` in a read-only REPEATABLE READ transaction: everything it reads is
/// one consistent snapshot of the ledger. `verify`, `snapshot` and the record listing
/// all read through this.
pub(super) fn read_only<T>(
    conn: &mut Connection,
    body: impl FnOnce(&mut Transaction<'_>) -> Result<T, Fail>,
) -> Result<T, StoreError> {
    let describe = conn.describe.clone();
    let client = conn.client()?;
    let read = (|| -> Result<T, Fail> {
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(pg("starting a read"))?;
        let out = body(&mut tx)?;
        tx.commit().map_err(pg("ending a read"))?;
        Ok(out)
    })();
    read.map_err(|f| fail(&describe, f))
}
