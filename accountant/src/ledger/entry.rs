//! What a ledger holds, as read back: its header and its records. Written by
//! `ledger.rs`, encoded and decoded by `ledger/format.rs`, streamed by
//! `ledger/reader.rs`.

use super::budget::PrivacyBudget;
use super::protected::ProtectedSet;
use crate::{DpEvent, Orders, RdpCurve};

/// What a ledger's header says: fixed when the ledger is created.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LedgerHeader {
    /// The file's format version (1 to 4; see `ledger/format.rs`).
    pub version: u32,
    /// The orders every charge is measured at.
    pub orders: Orders,
    /// The budget the ledger was created with (later budget records may
    /// change it).
    pub initial_budget: Option<PrivacyBudget>,
    /// When the ledger was created, in milliseconds since the Unix epoch (the
    /// creator's clock); `None` in version 1 files, which did not record it.
    pub created_ms: Option<u64>,
    /// The private members the ledger accounts for; `None` when its creator
    /// named none (every version 1 file).
    pub protected_set: Option<ProtectedSet>,
}

/// One record of a ledger.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LedgerEntry {
    /// Position in the ledger: 0 for the first record, then one more each.
    pub sequence: u64,
    /// When it was written, in milliseconds since the Unix epoch (the
    /// writer's clock; informational only).
    pub time_ms: u64,
    /// What the record says.
    pub kind: EntryKind,
    /// For a charge made with `Ledger::charge_event`, the event it paid
    /// for (its curve at the ledger's orders is the charge's curve); `None`
    /// for other records.
    pub event: Option<DpEvent>,
}

impl LedgerEntry {
    /// The event this record charged, if it was charged as one.
    pub fn event(&self) -> Option<&DpEvent> {
        self.event.as_ref()
    }
}

/// What a ledger record says.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A charge: the RDP curve of one mechanism run, and its label.
    Charge {
        /// The charged curve, bit-exact as it was passed to `charge`.
        curve: RdpCurve,
        /// The caller's label (e.g. the mechanism's name).
        label: String,
    },
    /// From here on the ledger's budget is this (or none).
    Budget(Option<PrivacyBudget>),
    /// The charges of one decoding step (format version 4): each run's curve
    /// charged `count` times in turn, the runs in order.
    Step(Vec<StepRun>),
}

/// Charges of a step record: one curve charged `count` times under one label.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StepRun {
    /// The curve of one charge, bit-exact as it was charged.
    pub curve: RdpCurve,
    /// The event it was charged as, if it was (its curve at the ledger's orders
    /// is `curve`).
    pub event: Option<DpEvent>,
    /// The label of each of these charges.
    pub label: String,
    /// How many charges of `curve` in a row (at least 1).
    pub count: u32,
}

impl StepRun {
    /// The run as an event: its event (or, for a curve charged without one,
    /// [`DpEvent::DataDependent`] of the curve) composed `count` times.
    pub fn to_event(&self) -> DpEvent {
        let one = self
            .event
            .clone()
            .unwrap_or_else(|| DpEvent::DataDependent(self.curve.clone()));
        if self.count == 1 {
            one
        } else {
            DpEvent::SelfComposed {
                event: Box::new(one),
                count: u64::from(self.count),
            }
        }
    }

    /// `spent` with this run's charges composed onto it in turn (each composition
    /// rounded up, as `count` charge records would be).
    pub fn compose_onto(&self, spent: &RdpCurve) -> Result<RdpCurve, crate::AccountantError> {
        let mut total = spent.compose(&self.curve)?;
        for _ in 1..self.count {
            total = total.compose(&self.curve)?;
        }
        Ok(total)
    }
}
