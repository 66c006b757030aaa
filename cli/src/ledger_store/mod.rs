//! Where charges are recorded: the embedded file ledger (`privmix_accountant::Ledger`)
//! or a PostgreSQL ledger shared by several `privmix serve` replicas.
//!
//! Both give the same guarantees: a charge is durable before `charge` returns `Ok`
//! (so a token is released only after its charge would survive a crash), and the
//! budget check and the charge are one atomic step, for the members' total budget and
//! for the tenant's own budget together.

use privmix_accountant::{Orders, PrivacyBudget, RdpCurve};

/// A tenant (an API key's owner) charging a store: its name and its own budget over
/// the same members. The members' total budget is the store's and is enforced too.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// The tenant's name (recorded with each of its charges).
    pub name: String,
    /// Its own budget, if it has one.
    pub budget: Option<PrivacyBudget>,
}

/// Why a store refused or failed a charge.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The charge would take a budget above its ε at its δ; nothing was recorded.
    #[error("privacy budget {budget} exhausted: spent ε = {spent} of ε = {epsilon} at δ = {delta}")]
    Refused {
        /// Which budget: "total" or "tenant <name>".
        budget: String,
        /// ε spent on it so far (rounded up), at `delta`.
        spent: f64,
        /// Its ε.
        epsilon: f64,
        /// Its δ.
        delta: f64,
    },
    /// The store could not be read or written.
    #[error("{0}")]
    Backend(String),
}

/// What a store holds and how it charges.
pub trait LedgerStore: Send {
    /// A description for messages (a file path, or the PostgreSQL URL without password).
    fn describe(&self) -> String;
    /// The orders every charge is expressed at.
    fn orders(&self) -> &Orders;
    /// The members' total budget.
    fn budget(&self) -> Option<PrivacyBudget>;
    /// The composed spend of everyone (`None`) or of one tenant, as recorded now.
    fn spent(&mut self, tenant: Option<&str>) -> Result<RdpCurve, StoreError>;
    /// Records `curve` for `tenant` with `label`, durably, or refuses it when either the
    /// total budget or the tenant's budget could not pay it (then nothing is recorded).
    fn charge(
        &mut self,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
    ) -> Result<(), StoreError>;
}
