//! The ledger's error type: every way opening, charging or reading can fail.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use super::budget::PrivacyBudget;
use super::protected::ProtectedSet;
use crate::{AccountantError, EpsilonDelta};

/// What went wrong with a ledger.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// An accounting step failed (orders differ, an invalid δ, …).
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// The operating system refused a read, write, sync or lock.
    #[error("I/O error on ledger {path}: {source}")]
    Io {
        /// The ledger file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// [`Ledger::create`](super::Ledger::create) never overwrites a file.
    #[error("ledger {0} already exists")]
    AlreadyExists(PathBuf),
    /// Another handle, in this or another process, holds the ledger open.
    #[error("ledger {0} is locked: another process or handle has it open")]
    Locked(PathBuf),
    /// The file does not start with the ledger magic bytes.
    #[error("{0} is not a privmix ledger (its first bytes are not the ledger magic)")]
    NotALedger(PathBuf),
    /// The file was written in a format version this build cannot read.
    #[error("ledger {path} has format version {found}; this build reads versions 1 to {supported}")]
    UnsupportedVersion {
        /// The ledger file.
        path: PathBuf,
        /// The version in the file's header.
        found: u32,
        /// The newest version this build reads (and the one it writes).
        supported: u32,
    },
    /// Damage that cannot be a torn final write (see the module docs): the
    /// ledger refuses to open rather than silently drop a charge.
    #[error("ledger {path} is corrupt at byte {offset}: {reason}")]
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// Byte offset of the damaged header or record.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// The charge would take the spent ε (at the budget's δ) above the budget;
    /// nothing was written.
    #[error(
        "charge refused: it would spend ε = {} at δ = {} (order {}), over the budget ε = {}",
        would_spend.epsilon, would_spend.delta, would_spend.order, budget.epsilon()
    )]
    BudgetExceeded {
        /// The budget in force.
        budget: PrivacyBudget,
        /// The total the charge would have led to, converted at the budget's δ.
        would_spend: EpsilonDelta,
    },
    /// A new budget is below what the ledger has already spent.
    #[error(
        "budget ε = {} at δ = {} is below the ε = {} already spent",
        budget.epsilon(), budget.delta(), spent.epsilon
    )]
    BudgetBelowSpent {
        /// The refused budget.
        budget: PrivacyBudget,
        /// What the ledger has spent, converted at the refused budget's δ.
        spent: EpsilonDelta,
    },
    /// Labels are stored with a length bound so a record's size is bounded.
    #[error("label is {len} bytes long; the limit is {max}")]
    LabelTooLong {
        /// The label's length in bytes.
        len: usize,
        /// The limit, [`MAX_LABEL_BYTES`](super::MAX_LABEL_BYTES).
        max: usize,
    },
    /// A budget other than the one the ledger records was asked for when
    /// opening it; a budget changes only through
    /// [`Ledger::set_budget`](super::Ledger::set_budget), an explicit and
    /// recorded act.
    #[error(
        "ledger {path} records the budget {}, not the {} asked for; change a budget explicitly with Ledger::set_budget (privmix ledger raise), which records it",
        budget_text(recorded),
        budget_text(requested)
    )]
    BudgetDiffers {
        /// The ledger file.
        path: PathBuf,
        /// The budget in force.
        recorded: Option<PrivacyBudget>,
        /// The budget asked for.
        requested: Option<PrivacyBudget>,
    },
    /// A protected-set identity is malformed (see
    /// [`ProtectedSet::new`](super::ProtectedSet::new)).
    #[error("bad protected set: {0}")]
    BadProtectedSet(String),
    /// The ledger accounts for other private members than the caller loads:
    /// charging it would spend the loaded data against another data set's
    /// budget.
    #[error(
        "ledger {path} protects a different set of private members: it records {recorded}, this run loads {loaded}{}",
        recorded.difference_text(loaded)
    )]
    ProtectedSetDiffers {
        /// The ledger file.
        path: PathBuf,
        /// The set in the ledger's header.
        recorded: ProtectedSet,
        /// The set the caller loads.
        loaded: ProtectedSet,
    },
    /// The ledger names no protected set (a version 1 file, or one created
    /// without a set), so it cannot say which private data it accounts for.
    #[error(
        "ledger {path} (format version {version}) does not record which private members it protects, so it cannot be charged for these; start a new ledger (the spending recorded in this one still counts against whatever data it was used with)"
    )]
    NoProtectedSet {
        /// The ledger file.
        path: PathBuf,
        /// The file's format version.
        version: u32,
    },
    /// Events are recorded from format version 3 on; this older file is
    /// appended to in its own version, which has no event records. Charge
    /// the event's curve with `Ledger::charge` instead, or start a new ledger.
    #[error(
        "ledger {path} has format version {version}, which cannot record events (version 3 and later can); charge the curve instead or start a new ledger"
    )]
    EventsNeedVersion {
        /// The ledger file.
        path: PathBuf,
        /// The file's format version.
        version: u32,
    },
    /// An event's encoding is longer than a record may hold.
    #[error("the event's encoding is {len} bytes long; the limit is {max}")]
    EventTooLarge {
        /// The encoding's length in bytes.
        len: usize,
        /// The limit, [`MAX_EVENT_BYTES`](super::MAX_EVENT_BYTES).
        max: usize,
    },
    /// An earlier append or sync failed, so the file's tail is in an unknown
    /// state; this handle writes nothing more. Reopening recovers.
    #[error("an earlier write to ledger {0} failed; drop this handle and reopen the ledger")]
    Poisoned(PathBuf),
}

/// `ε = …, δ = …` or `none`, for messages.
fn budget_text(b: &Option<PrivacyBudget>) -> String {
    match b {
        Some(b) => format!("ε = {}, δ = {}", b.epsilon(), b.delta()),
        None => "none".into(),
    }
}

impl LedgerError {
    /// Wraps an I/O error with the ledger's path.
    pub(crate) fn io(path: &std::path::Path, source: io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A [`LedgerError::Corrupt`] at `offset`.
    pub(crate) fn corrupt(path: &std::path::Path, offset: u64, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }
}
