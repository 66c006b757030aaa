//! Where a step's charge goes before its token is released.

use privmix_accountant::{Orders, RdpCurve};

use crate::MechanismError;

/// A privacy account: an in-memory budget, a durable ledger, or both.
///
/// `charge` must make the charge permanent (a ledger syncs it to disk) before it
/// returns `Ok`, and must refuse — returning [`MechanismError::ChargeRefused`]
/// and recording nothing — a charge that would exceed the account's budget.
pub trait Account {
    /// The orders charges must be expressed at.
    fn orders(&self) -> &Orders;
    /// Records a charge, or refuses it.
    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError>;
}
