//! Step commits: the charges of one decoding step of every request, recorded together.
//!
//! A step runs each request's mechanism with a [`StepAccount`], which only collects what
//! the mechanism charges (`serve` and `generate` both collect with it); then [`super::LedgerStore::commit_step`] records every request's
//! charge at once (one write and one `fdatasync` for a file ledger, one transaction for
//! PostgreSQL), checking the budgets in request order, so that a refusal drops only that
//! request's charge. Only then are the step's tokens released: charge-before-release
//! holds because no token leaves before the commit that covers it returns.
//!
//! A token drawn under a charge the commit refuses is dropped, never released; the
//! mechanism's own state may have counted that charge, which can only make its later
//! choices more conservative.

use privmix_accountant::{DpEvent, Orders, RdpCurve};
use privmix_mechanisms::{Account, MechanismError};

use super::{StoreError, Tenant};

/// What a charge costs: a curve at the store's orders, or an event (charged as its
/// curve at the store's orders).
#[derive(Debug, Clone, PartialEq)]
pub enum Cost {
    /// An RDP curve.
    Curve(RdpCurve),
    /// A structured event (a file ledger records the event itself).
    Event(DpEvent),
}

impl Cost {
    /// Its RDP curve at `orders`.
    pub fn curve(&self, orders: &Orders) -> Result<RdpCurve, StoreError> {
        match self {
            Self::Curve(c) if c.orders() == orders => Ok(c.clone()),
            Self::Curve(_) => Err(privmix_accountant::AccountantError::OrdersDiffer.into()),
            Self::Event(e) => Ok(e.rdp(orders)?),
        }
    }
}

/// One request's charge in a step: who pays, what, and the label.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    /// The tenant, if any (its budget is checked with the total).
    pub tenant: Option<Tenant>,
    /// The cost.
    pub cost: Cost,
    /// The label (the mechanism's name).
    pub label: String,
}

/// Collects what one request's mechanism charges during a step, accepting it for now:
/// [`super::LedgerStore::commit_step`] decides. Several charges in one step become one (composed), so a request's
/// step is recorded, or refused, as a whole.
#[derive(Debug)]
pub struct StepAccount {
    orders: Orders,
    costs: Vec<Cost>,
    label: String,
}

impl StepAccount {
    /// An account over `orders` that has collected nothing.
    pub fn new(orders: Orders) -> Self {
        Self {
            orders,
            costs: Vec::new(),
            label: String::new(),
        }
    }

    /// What the mechanism charged this step, as one charge for `tenant`; `None` when it
    /// charged nothing.
    pub fn into_charge(self, tenant: Option<&Tenant>) -> Option<PendingCharge> {
        let mut costs = self.costs;
        let cost = match costs.len() {
            0 => return None,
            1 => costs.pop()?,
            _ => Cost::Event(DpEvent::Composed(
                costs
                    .into_iter()
                    .map(|c| match c {
                        Cost::Event(e) => e,
                        Cost::Curve(c) => DpEvent::DataDependent(c),
                    })
                    .collect(),
            )),
        };
        Some(PendingCharge {
            tenant: tenant.cloned(),
            cost,
            label: self.label,
        })
    }
}

impl Account for StepAccount {
    fn orders(&self) -> &Orders {
        &self.orders
    }

    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError> {
        if curve.orders() != &self.orders {
            return Err(privmix_accountant::AccountantError::OrdersDiffer.into());
        }
        self.costs.push(Cost::Curve(curve.clone()));
        label.clone_into(&mut self.label);
        Ok(())
    }

    fn charge_event(&mut self, event: &DpEvent, label: &str) -> Result<(), MechanismError> {
        event.rdp(&self.orders)?;
        self.costs.push(Cost::Event(event.clone()));
        label.clone_into(&mut self.label);
        Ok(())
    }
}
