//! A durable privacy ledger: an append-only file of checksummed charges that
//! survives crashes without ever under-counting what was acknowledged.
//!
//! # Guarantee
//!
//! [`Ledger::charge`] returns `Ok` only after the charge's record is written
//! and synced to stable storage (`fsync`/`fdatasync`). Reopening the ledger
//! after a crash at any point, including in the middle of a write, recovers
//! every acknowledged charge, so the spent total read back is at least the
//! composition of everything acknowledged (it may also include a charge whose
//! sync finished just before the crash, before `Ok` could be returned: an
//! over-count, which is safe). A torn final record was never acknowledged and
//! is dropped; damage anywhere else makes opening fail with
//! [`LedgerError::Corrupt`] instead of silently skipping a charge. The rule
//! that tells the two apart, and its one limit, are in `ledger/reader.rs`.
//!
//! This rests on the storage honouring `fsync` (as every write-ahead log
//! does) and on a single writer, enforced by an exclusive advisory lock
//! (`flock` on Unix, `LockFileEx` on Windows) held for the [`Ledger`]'s life:
//! a second open, from this process or another, gets [`LedgerError::Locked`].
//! (The lock belongs to the open file: a child forked while the ledger is
//! open shares it until its `exec` closes the close-on-exec handle. On
//! Windows the lock is mandatory, so [`verify`] and [`LedgerReader`] cannot
//! read a ledger another handle holds; on Unix they can.)
//!
//! Composition follows Mironov, arXiv:1702.07476, Prop. 1 (RDP values add, rounded up by
//! [`RdpCurve::compose`]); budgets are checked on the (ε, δ) conversion of
//! [`RdpCurve::epsilon`] (Balle et al. (arXiv:1905.09982), Thm 21), which rounds ε up.
//!
//! # What a ledger protects
//!
//! A budget bounds the privacy loss of one body of private data only if
//! every release about that data is charged to the same ledger. A ledger's
//! header can therefore name the private members it accounts for (a
//! [`ProtectedSet`] of caller-chosen identities, e.g. hashes of the members'
//! weight files), written once at creation with the creation time; a caller
//! that loads private data checks it with [`Ledger::check_protects`] before
//! charging.
//!
//! # Budgets change only explicitly
//!
//! The budget is recorded in the header and changed only by
//! [`Ledger::set_budget`], which appends a timestamped budget record (the
//! budget's history is the header's budget followed by those records).
//! [`Ledger::open_or_create`] refuses a budget other than the recorded one
//! rather than silently replacing it.
//!
//! # Events
//!
//! [`Ledger::charge_event`] charges a [`DpEvent`] (its curve at the ledger's
//! orders) and records the event too, so a run can be re-accounted later
//! with another method or finer orders: [`LedgerEntry::event`] gives each
//! record's event and [`Ledger::events`] the whole run as one composed event.
//! The encoding is the ledger's own (`ledger/event_codec.rs`), independent of
//! the `serde` feature.
//!
//! # Steps
//!
//! [`Ledger::charge_step`] records the charges of one decoding step of many
//! requests with one write and one `fdatasync`: each is checked against the
//! budget in memory, in order, a refused one is dropped (and only it), and the
//! accepted ones are written as one step record that names each distinct
//! charge by a number defined once per file, so a step costs a few bytes per
//! request (`ledger/step.rs`). Reading it back composes the same charges in the
//! same order, so the total is bit for bit the one the writer held.
//!
//! The file layout is in `ledger/format.rs`.

mod budget;
mod entry;
mod error;
mod event_codec;
mod format;
mod protected;
mod reader;
mod step;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use budget::{PrivacyBudget, Receipt};
pub use entry::{EntryKind, LedgerEntry, LedgerHeader, StepRun};
pub use error::LedgerError;
pub use event_codec::{EventDecodeError, MAX_EVENT_BYTES, decode_event, encode_event};
pub use format::{
    MAX_DEFINITIONS, MAX_LABEL_BYTES, MAX_STEP_DEFINITIONS, MAX_STEP_RUNS, OLDEST_READABLE_VERSION,
    VERSION as FORMAT_VERSION,
};
pub use protected::{MAX_MEMBER_ID_BYTES, MAX_PROTECTED_MEMBERS, ProtectedSet};
pub use reader::{LedgerReader, LedgerSummary, verify};
pub use step::{StepCharge, StepCost, StepReceipt};

use crate::{AccountantError, DpEvent, EpsilonDelta, Orders, RdpCurve};

/// An open, exclusively locked ledger. See the module docs for its guarantee.
///
/// # Example
///
/// ```
/// use privmix_accountant::{Ledger, LedgerError, Orders, PrivacyBudget, RdpCurve};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("privmix-ledger-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("spent.ledger");
/// # let _ = std::fs::remove_file(&path);
/// let orders = Orders::integers(64)?;
/// let budget = PrivacyBudget::new(1.0, 1e-6)?;
/// let mut ledger = Ledger::open_or_create(&path, orders.clone(), Some(budget))?;
///
/// // The Gaussian mechanism with σ = 10: ε(α) = α / (2σ²) (Mironov, arXiv:1702.07476, Prop. 7).
/// let gaussian = RdpCurve::from_fn(orders, |a| a / 200.0)?;
/// let receipt = ledger.charge(&gaussian, "gaussian σ=10")?;
/// assert_eq!(receipt.sequence, 0);
/// // Only now, after `Ok`, may the answer this charge pays for be released.
///
/// // Charging on, the budget runs out; the refused charge writes nothing.
/// let refused = loop {
///     if let Err(e) = ledger.charge(&gaussian, "gaussian σ=10") {
///         break e;
///     }
/// };
/// assert!(matches!(refused, LedgerError::BudgetExceeded { .. }));
/// let charges = ledger.charges();
/// drop(ledger);
///
/// // After a restart, or a crash, every acknowledged charge is still there.
/// let ledger = Ledger::open(&path)?;
/// assert_eq!(ledger.charges(), charges);
/// assert!(ledger.spent_epsilon(1e-6)?.epsilon <= 1.0);
/// # drop(ledger);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    file: File,
    orders: Orders,
    budget: Option<PrivacyBudget>,
    version: u32,
    created_ms: Option<u64>,
    protected_set: Option<ProtectedSet>,
    spent: RdpCurve,
    charges: u64,
    next_sequence: u64,
    recovered_torn_bytes: u64,
    poisoned: bool,
    /// The file's step definitions by their stored bytes, with their numbers.
    definitions: HashMap<Vec<u8>, u32>,
}

impl Ledger {
    /// Creates a new ledger at `path` for charges over `orders`, optionally with
    /// a budget, naming no protected set (see [`Self::create_protecting`]).
    /// Refuses with [`LedgerError::AlreadyExists`] if `path` exists.
    pub fn create(
        path: impl AsRef<Path>,
        orders: Orders,
        budget: Option<PrivacyBudget>,
    ) -> Result<Self, LedgerError> {
        Self::create_with(path.as_ref(), orders, budget, None)
    }

    /// Creates a new ledger at `path` that accounts for the private members
    /// `protected` (recorded in its header with the creation time, for
    /// [`Self::check_protects`]). Refuses with [`LedgerError::AlreadyExists`]
    /// if `path` exists.
    ///
    /// The header is written and synced under a temporary name in the same
    /// directory, then hard-linked to `path` (which fails if `path` exists) and
    /// the directory is synced: the file appears under its name complete or not
    /// at all. A crash can leave a `.NAME.creating-*` file behind, never a
    /// half-written ledger.
    pub fn create_protecting(
        path: impl AsRef<Path>,
        orders: Orders,
        budget: Option<PrivacyBudget>,
        protected: ProtectedSet,
    ) -> Result<Self, LedgerError> {
        Self::create_with(path.as_ref(), orders, budget, Some(protected))
    }

    fn create_with(
        path: &Path,
        orders: Orders,
        budget: Option<PrivacyBudget>,
        protected_set: Option<ProtectedSet>,
    ) -> Result<Self, LedgerError> {
        let io = |e| LedgerError::io(path, e);
        let created_ms = now_ms();
        let staging = staging_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&staging)
            .map_err(io)?;
        let header = format::encode_header(&orders, budget, created_ms, protected_set.as_ref());
        let linked = (|| {
            lock(&file, path)?;
            (&file).write_all(&header).map_err(io)?;
            file.sync_all().map_err(io)?;
            std::fs::hard_link(&staging, path).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => LedgerError::AlreadyExists(path.to_path_buf()),
                _ => io(e),
            })
        })();
        let removed = std::fs::remove_file(&staging);
        linked?;
        removed.map_err(io)?;
        sync_parent_dir(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            spent: RdpCurve::zero(orders.clone()),
            orders,
            budget,
            version: format::VERSION,
            created_ms: Some(created_ms),
            protected_set,
            charges: 0,
            next_sequence: 0,
            recovered_torn_bytes: 0,
            poisoned: false,
            definitions: HashMap::new(),
        })
    }

    /// Opens an existing ledger: takes the lock, reads and checks every record,
    /// and drops a torn final write by truncating the file to its last intact
    /// record (synced at once).
    ///
    /// Records read back may still be only in the OS cache (a writer killed
    /// between write and sync); they are counted, which can only over-count,
    /// and the next charge's sync makes them durable along with it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref();
        let io = |e| LedgerError::io(path, e);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        lock(&file, path)?;
        let reader_file = file.try_clone().map_err(io)?;
        let summary = LedgerSummary::read(LedgerReader::from_file(reader_file, path)?)?;
        if summary.torn_tail_bytes > 0 {
            file.set_len(summary.valid_len).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        file.seek(SeekFrom::Start(summary.valid_len)).map_err(io)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            orders: summary.orders,
            budget: summary.budget,
            version: summary.version,
            created_ms: summary.created_ms,
            protected_set: summary.protected_set,
            spent: summary.spent,
            charges: summary.charges,
            next_sequence: summary.records,
            recovered_torn_bytes: summary.torn_tail_bytes,
            poisoned: false,
            definitions: step::definition_numbers(&summary.definitions),
        })
    }

    /// Opens the ledger at `path`, creating it with `budget` (and no protected
    /// set) if there is none. An existing ledger must already have `budget`:
    /// a different one is refused with [`LedgerError::BudgetDiffers`] and
    /// nothing is written (a budget changes only through
    /// [`Self::set_budget`]). Orders other than the ledger's are refused with
    /// [`AccountantError::OrdersDiffer`].
    pub fn open_or_create(
        path: impl AsRef<Path>,
        orders: Orders,
        budget: Option<PrivacyBudget>,
    ) -> Result<Self, LedgerError> {
        let path = path.as_ref();
        let ledger = match Self::open(path) {
            Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                match Self::create(path, orders.clone(), budget) {
                    // Created by someone else in between: open theirs.
                    Err(LedgerError::AlreadyExists(_)) => Self::open(path)?,
                    other => other?,
                }
            }
            other => other?,
        };
        if ledger.orders != orders {
            return Err(AccountantError::OrdersDiffer.into());
        }
        if ledger.budget != budget {
            return Err(LedgerError::BudgetDiffers {
                path: path.to_path_buf(),
                recorded: ledger.budget,
                requested: budget,
            });
        }
        Ok(ledger)
    }

    /// Records a charge of `curve` labelled `label`.
    ///
    /// **Contract:** release what the charge pays for (a token, an answer)
    /// only after this returns `Ok`. `Ok` means the record is on stable
    /// storage and will be counted by every later open, whatever crash follows.
    /// On any error nothing was acknowledged: with a budget error or a bad
    /// argument nothing was written; after an I/O error the handle is poisoned
    /// (the unacknowledged record may or may not survive, which can only
    /// over-count) and the ledger must be reopened.
    ///
    /// With a budget, a charge that would take the spent ε at the budget's δ
    /// above the budget's ε is refused with [`LedgerError::BudgetExceeded`].
    pub fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<Receipt, LedgerError> {
        self.charge_with(curve, label, None)
    }

    /// Records a charge of `event`: its curve at the ledger's orders
    /// ([`DpEvent::rdp`]) is charged exactly as [`Self::charge`] charges a
    /// curve (same contract, same budget check), and the record also stores
    /// the event itself, so that the run can be re-accounted later (see
    /// [`Self::events`]).
    ///
    /// Refused with [`LedgerError::EventsNeedVersion`] on a version 1 or 2
    /// file, with [`LedgerError::EventTooLarge`] when the event's encoding
    /// exceeds [`MAX_EVENT_BYTES`], and with [`LedgerError::Accountant`] when
    /// the event is invalid; nothing is written then.
    pub fn charge_event(&mut self, event: &DpEvent, label: &str) -> Result<Receipt, LedgerError> {
        self.check_writable()?;
        if self.version < format::FIRST_EVENT_VERSION {
            return Err(LedgerError::EventsNeedVersion {
                path: self.path.clone(),
                version: self.version,
            });
        }
        let curve = event.rdp(&self.orders)?;
        let mut encoded = Vec::new();
        event_codec::encode(event, &mut encoded);
        if encoded.len() > MAX_EVENT_BYTES {
            return Err(LedgerError::EventTooLarge {
                len: encoded.len(),
                max: MAX_EVENT_BYTES,
            });
        }
        self.charge_with(&curve, label, Some(&encoded))
    }

    /// Every charge so far, composed into one event, read back from the file
    /// (see [`LedgerReader::into_event`] for charges recorded without one).
    pub fn events(&self) -> Result<DpEvent, LedgerError> {
        self.entries()?.into_event()
    }

    fn charge_with(
        &mut self,
        curve: &RdpCurve,
        label: &str,
        event: Option<&[u8]>,
    ) -> Result<Receipt, LedgerError> {
        self.check_writable()?;
        if label.len() > MAX_LABEL_BYTES {
            return Err(LedgerError::LabelTooLong {
                len: label.len(),
                max: MAX_LABEL_BYTES,
            });
        }
        let total = self.spent.compose(curve)?;
        let spent = match self.budget {
            Some(budget) => {
                let would_spend = total.epsilon(budget.delta())?;
                if would_spend.epsilon > budget.epsilon() {
                    return Err(LedgerError::BudgetExceeded {
                        budget,
                        would_spend,
                    });
                }
                Some(would_spend)
            }
            None => None,
        };
        let sequence = self.next_sequence;
        let payload = match event {
            None => format::charge_payload(sequence, now_ms(), curve.epsilons(), label),
            Some(event) => {
                format::event_charge_payload(sequence, now_ms(), curve.epsilons(), label, event)
            }
        };
        self.append(&payload)?;
        self.spent = total;
        self.charges += 1;
        Ok(Receipt { sequence, spent })
    }

    /// Replaces the budget (durably, as a timestamped record: the ledger keeps
    /// its budget history); `None` removes it. A budget
    /// below what is already spent (at its δ) is refused with
    /// [`LedgerError::BudgetBelowSpent`]. A ledger without charges has spent
    /// nothing, so any budget is accepted.
    pub fn set_budget(&mut self, budget: Option<PrivacyBudget>) -> Result<(), LedgerError> {
        self.check_writable()?;
        if let Some(budget) = budget
            && self.charges > 0
        {
            let spent = self.spent.epsilon(budget.delta())?;
            if spent.epsilon > budget.epsilon() {
                return Err(LedgerError::BudgetBelowSpent { budget, spent });
            }
        }
        self.append(&format::budget_payload(
            self.next_sequence,
            now_ms(),
            budget,
        ))?;
        self.budget = budget;
        Ok(())
    }

    /// The composition of every charge so far (rounded up).
    pub fn spent(&self) -> &RdpCurve {
        &self.spent
    }

    /// The spent total as (ε, δ) at `delta`, ε rounded up.
    pub fn spent_epsilon(&self, delta: f64) -> Result<EpsilonDelta, LedgerError> {
        Ok(self.spent.epsilon(delta)?)
    }

    /// The budget in force.
    pub fn budget(&self) -> Option<PrivacyBudget> {
        self.budget
    }

    /// The orders every charge must be measured at.
    pub fn orders(&self) -> &Orders {
        &self.orders
    }

    /// The file's format version (files of an older version are read and
    /// appended to in their own version).
    pub fn format_version(&self) -> u32 {
        self.version
    }

    /// When the ledger was created (ms since the Unix epoch, the creator's
    /// clock); `None` for version 1 files, which did not record it.
    pub fn created_ms(&self) -> Option<u64> {
        self.created_ms
    }

    /// The private members the ledger accounts for, if its header names them.
    pub fn protected_set(&self) -> Option<&ProtectedSet> {
        self.protected_set.as_ref()
    }

    /// Checks that this ledger accounts for exactly the members `loaded`
    /// (same identities, same multiplicities, any order): a caller about to
    /// charge releases computed from `loaded` calls it first. A ledger naming
    /// other members is [`LedgerError::ProtectedSetDiffers`]; one naming none
    /// (a version 1 file, or one made by [`Self::create`]) is
    /// [`LedgerError::NoProtectedSet`].
    pub fn check_protects(&self, loaded: &ProtectedSet) -> Result<(), LedgerError> {
        match &self.protected_set {
            None => Err(LedgerError::NoProtectedSet {
                path: self.path.clone(),
                version: self.version,
            }),
            Some(recorded) if recorded != loaded => Err(LedgerError::ProtectedSetDiffers {
                path: self.path.clone(),
                recorded: recorded.clone(),
                loaded: loaded.clone(),
            }),
            Some(_) => Ok(()),
        }
    }

    /// How many charges the ledger holds.
    pub fn charges(&self) -> u64 {
        self.charges
    }

    /// The sequence number the next record will get.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Bytes of a torn final write that opening dropped (0 if none).
    pub fn recovered_torn_bytes(&self) -> u64 {
        self.recovered_torn_bytes
    }

    /// The ledger's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader over the records on disk (for listing or export); it reads
    /// the file without the lock, which this handle keeps.
    pub fn entries(&self) -> Result<LedgerReader, LedgerError> {
        LedgerReader::open(&self.path)
    }

    fn check_writable(&self) -> Result<(), LedgerError> {
        if self.poisoned {
            return Err(LedgerError::Poisoned(self.path.clone()));
        }
        Ok(())
    }

    /// Writes one record with a single write and syncs it. Any failure
    /// poisons the handle: the tail is then unknown, and writing after it
    /// could bury a torn record in the middle of the file.
    fn append(&mut self, payload: &[u8]) -> Result<(), LedgerError> {
        self.append_frames(&format::encode_frame(payload), 1)
    }

    /// Writes `records` whole records (`frames`, framed) with a single write
    /// and one sync; a failure poisons the handle, as in [`Self::append`].
    fn append_frames(&mut self, frames: &[u8], records: u64) -> Result<(), LedgerError> {
        let written = self
            .file
            .write_all(frames)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            self.poisoned = true;
            return Err(LedgerError::io(&self.path, e));
        }
        self.next_sequence += records;
        Ok(())
    }
}

impl ProtectedSet {
    /// A set from member identities. Each must be 1 to
    /// [`MAX_MEMBER_ID_BYTES`] bytes of printable ASCII other than space
    /// (so that listings stay one line and unambiguous), and there may be at
    /// most [`MAX_PROTECTED_MEMBERS`]; anything else is
    /// [`LedgerError::BadProtectedSet`].
    pub fn new<S: Into<String>>(members: impl IntoIterator<Item = S>) -> Result<Self, LedgerError> {
        Self::checked(members.into_iter().map(Into::into).collect())
            .map_err(LedgerError::BadProtectedSet)
    }
}

/// Takes the exclusive lock.
///
/// A lock that is busy is tried again for up to [`LOCK_PATIENCE`] before the open
/// reports [`LedgerError::Locked`]: a child process spawned by any thread of this
/// process holds a copy of every open file description from fork to exec, and with it
/// the lock of a ledger that was just closed, for that short window.
fn lock(file: &File, path: &Path) -> Result<(), LedgerError> {
    let start = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LedgerError::Locked(path.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(LedgerError::io(path, e)),
        }
    }
}

/// How long an open waits for a busy lock before reporting it held.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// `DIR/.NAME.creating-PID-N-NANOS`, beside `path`, unique within this process.
fn staging_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let pid = std::process::id();
    path.with_file_name(format!(".{name}.creating-{pid}-{n}-{nanos}"))
}

/// Makes a new directory entry durable (Unix; elsewhere the OS offers no
/// directory handle to sync).
fn sync_parent_dir(path: &Path) -> Result<(), LedgerError> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| LedgerError::io(dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
