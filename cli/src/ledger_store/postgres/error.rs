//! Failures inside a transaction, and the store's errors they become.

use crate::ledger_store::StoreError;

/// A failure inside a transaction: the driver's (maybe retryable) or the store's.
pub(super) enum Fail {
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
pub(super) fn pg(during: &'static str) -> impl Fn(postgres::Error) -> Fail {
    move |e| Fail::Pg(during, e)
}

pub(super) fn postgres_error(
    describe: &str,
    during: &'static str,
    source: postgres::Error,
) -> StoreError {
    StoreError::Postgres {
        store: describe.to_owned(),
        during,
        source,
    }
}

pub(super) fn fail(describe: &str, f: Fail) -> StoreError {
    match f {
        Fail::Pg(during, e) => postgres_error(describe, during, e),
        Fail::Store(e) => e,
    }
}
