//! Test-only access to the transaction's steps, to stop a charge between its
//! writes and its commit as a crashing replica would.

use std::collections::HashMap;

use postgres::IsolationLevel;
use privmix_accountant::RdpCurve;

use super::charge::{Prepared, commit_charges, receipt_of};
use super::connection::connect;
use super::error::fail;
use super::url::{describe_config, parse_url};
use crate::ledger_store::step::{Cost, PendingCharge};
use crate::ledger_store::{StoreReceipt, Tenant};

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
