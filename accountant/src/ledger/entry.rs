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
    /// The file's format version (1 to 3; see `ledger/format.rs`).
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
}
