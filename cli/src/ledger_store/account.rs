//! A store's failures as the mechanisms' errors.

use privmix_accountant::LedgerError;
use privmix_mechanisms::MechanismError;

use super::StoreError;

/// The mechanism error for a store failure: a refusal stays a refusal; everything else
/// becomes a ledger failure.
pub fn mechanism_error(e: StoreError, store: &str) -> MechanismError {
    match e {
        e @ StoreError::Refused { .. } => MechanismError::ChargeRefused(e.to_string()),
        StoreError::File { source, .. } => MechanismError::Ledger(source),
        StoreError::Accountant(e) => MechanismError::Accountant(e),
        other => MechanismError::Ledger(LedgerError::Io {
            path: store.into(),
            source: std::io::Error::other(other),
        }),
    }
}
