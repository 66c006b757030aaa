//! A store as the `Account` mechanisms charge through, for one tenant (or none).

use privmix_accountant::{LedgerError, Orders, RdpCurve};
use privmix_mechanisms::{Account, MechanismError};

use super::{LedgerStore, StoreError, StoreReceipt, Tenant};

/// Charges a store on behalf of `tenant`, and adds up what it charged (so a server
/// can tell a request the ε it spent).
///
/// A budget refusal is [`MechanismError::ChargeRefused`] (the token is not released
/// and the mechanism stops as at the end of a budget). Any other failure is a
/// [`MechanismError::Ledger`], never a refusal: the file store's own ledger error, or,
/// for PostgreSQL, an I/O error on the ledger carrying the [`StoreError`] (also kept
/// in [`Self::last_error`]).
pub struct StoreAccount<'a> {
    store: &'a mut dyn LedgerStore,
    tenant: Option<&'a Tenant>,
    charged: RdpCurve,
    charges: u64,
    last_receipt: Option<StoreReceipt>,
    last_error: Option<String>,
}

impl<'a> StoreAccount<'a> {
    /// An account charging `store` for `tenant`, having charged nothing yet.
    pub fn new(store: &'a mut dyn LedgerStore, tenant: Option<&'a Tenant>) -> Self {
        let charged = RdpCurve::zero(store.orders().clone());
        Self {
            store,
            tenant,
            charged,
            charges: 0,
            last_receipt: None,
            last_error: None,
        }
    }

    /// The composition (rounded up) of every charge this account recorded.
    pub fn charged(&self) -> &RdpCurve {
        &self.charged
    }

    /// How many charges this account recorded.
    pub fn charges(&self) -> u64 {
        self.charges
    }

    /// The receipt of the last charge recorded.
    pub fn last_receipt(&self) -> Option<&StoreReceipt> {
        self.last_receipt.as_ref()
    }

    /// The message of the last failure (refusals included), if any.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
}

impl std::fmt::Debug for StoreAccount<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreAccount")
            .field("store", &self.store.describe())
            .field("tenant", &self.tenant.map(|t| &t.name))
            .field("charges", &self.charges)
            .finish_non_exhaustive()
    }
}

impl Account for StoreAccount<'_> {
    fn orders(&self) -> &Orders {
        self.store.orders()
    }

    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError> {
        match self.store.charge_receipt(self.tenant, curve, label) {
            Ok(receipt) => {
                self.charged = self.charged.compose(curve)?;
                self.charges += 1;
                self.last_receipt = Some(receipt);
                Ok(())
            }
            Err(e) => {
                self.last_error = Some(e.to_string());
                Err(mechanism_error(e, &self.store.describe()))
            }
        }
    }
}

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
