//! Reading a ledger back: a streaming reader over its records, crash recovery
//! (telling a torn final write from corruption) and [`verify`].
//!
//! # Torn tail or corruption?
//!
//! A writer appends whole records (one, or a step's few) with a single write
//! and syncs it before acknowledging any of them, and writes nothing after a
//! failed write or sync (the handle is poisoned). So after a crash at most the
//! *last* record can be incomplete, and it was never acknowledged (records of
//! the same write before it may be intact: they were not acknowledged either,
//! and counting them can only over-count). Reading stops at the first
//! record that is not intact (bytes missing, length out of range, checksum
//! wrong). Its damage is taken for a torn write, and dropped, only when both
//!
//! 1. the bytes from it to the end of the file fit in one record of the
//!    largest possible size (one unfinished write cannot leave more), and
//! 2. no intact record with a later sequence number starts anywhere in those
//!    bytes, including when the damaged length field is garbage (a write that
//!    reached the disk out of order, or zero-filled).
//!
//! Otherwise the ledger is corrupt and reading fails with
//! [`LedgerError::Corrupt`]: a charge in the middle is never skipped. An
//! intact record whose contents are wrong (bad sequence number, NaN value,
//! unknown kind) is corruption wherever it is.
//!
//! The one case no file format can tell apart: media damage confined to the
//! final, acknowledged record looks exactly like a torn write, and is dropped.
//! The guarantee is stated for crashes (with storage that honours `fsync`),
//! not for a disk that alters written data.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::budget::PrivacyBudget;
use super::entry::{EntryKind, LedgerEntry, LedgerHeader, StepRun};
use super::error::LedgerError;
use super::format::{self, Frame};
use super::protected::ProtectedSet;
use crate::{DpEvent, Orders, RdpCurve};

/// Streams the records of a ledger file, checking each one; it takes no lock
/// and never writes. After the last `Some`, [`Self::torn_tail_bytes`] says
/// how many bytes of a torn final write were found (and skipped).
#[derive(Debug)]
pub struct LedgerReader {
    path: PathBuf,
    input: BufReader<File>,
    header: LedgerHeader,
    max_payload: usize,
    valid_len: u64,
    next_sequence: u64,
    torn_tail_bytes: u64,
    finished: bool,
    buf: Vec<u8>,
    /// The step definitions read so far, numbered in file order.
    definitions: Vec<format::Definition>,
}

impl LedgerReader {
    /// Opens `path` read-only and checks its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| LedgerError::io(path, e))?;
        Self::from_file(file, path)
    }

    /// A reader over an already opened file, read from its start.
    pub(crate) fn from_file(mut file: File, path: &Path) -> Result<Self, LedgerError> {
        file.seek(SeekFrom::Start(0))
            .map_err(|e| LedgerError::io(path, e))?;
        let mut input = BufReader::new(file);
        let (header, header_len) = format::read_header(&mut input, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            input,
            max_payload: format::max_payload_len(header.orders.len(), header.version),
            header,
            valid_len: header_len,
            next_sequence: 0,
            torn_tail_bytes: 0,
            finished: false,
            buf: Vec::new(),
            definitions: Vec::new(),
        })
    }

    /// The orders every charge in this ledger is measured at.
    pub fn orders(&self) -> &Orders {
        &self.header.orders
    }

    /// The budget written in the header (later budget records may change it).
    pub fn initial_budget(&self) -> Option<PrivacyBudget> {
        self.header.initial_budget
    }

    /// Everything the header says (version, creation time, protected set).
    pub fn header(&self) -> &LedgerHeader {
        &self.header
    }

    /// Bytes of header and intact records read so far.
    pub fn valid_len(&self) -> u64 {
        self.valid_len
    }

    /// Bytes of a torn final write found at the end (0 while reading, or when
    /// the file ends cleanly).
    pub fn torn_tail_bytes(&self) -> u64 {
        self.torn_tail_bytes
    }

    fn next_entry(&mut self) -> Result<Option<LedgerEntry>, LedgerError> {
        loop {
            self.read_frame()?;
            if self.buf.is_empty() {
                return Ok(None);
            }
            match format::check_frame(&self.buf, self.max_payload) {
                Frame::Intact { .. } => break,
                Frame::Damaged(reason) => match self.classify_tail(reason)? {
                    Tail::Torn(bytes) => {
                        self.torn_tail_bytes = bytes;
                        return Ok(None);
                    }
                    // A writer finished the record while we read it: read it again.
                    Tail::Grew => {}
                },
            }
        }
        // Intact, and `read_frame` read exactly one record.
        let payload = &self.buf[format::FRAME_PREFIX_LEN..];
        let sequence = format::payload_sequence(payload);
        if sequence != self.next_sequence {
            return Err(LedgerError::corrupt(
                &self.path,
                self.valid_len,
                format!(
                    "record has sequence number {sequence}, expected {}",
                    self.next_sequence
                ),
            ));
        }
        let entry = format::decode_payload(
            payload,
            &self.header.orders,
            self.header.version,
            &mut self.definitions,
        )
        .map_err(|reason| LedgerError::corrupt(&self.path, self.valid_len, reason))?;
        self.valid_len += self.buf.len() as u64;
        self.next_sequence += 1;
        Ok(Some(entry))
    }

    /// Reads the record at `valid_len` into `buf`: its prefix, then as much
    /// of its payload as its length field claims and the file holds.
    fn read_frame(&mut self) -> Result<(), LedgerError> {
        let io = |e| LedgerError::io(&self.path, e);
        self.buf.clear();
        let mut take = (&mut self.input).take(format::FRAME_PREFIX_LEN as u64);
        take.read_to_end(&mut self.buf).map_err(io)?;
        if self.buf.len() == format::FRAME_PREFIX_LEN {
            let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
            if len <= self.max_payload {
                let mut take = (&mut self.input).take(len as u64);
                take.read_to_end(&mut self.buf).map_err(io)?;
            }
        }
        Ok(())
    }

    /// Decides whether the damaged record at `valid_len` is a torn final
    /// write (the module docs give the rule). Leaves the input positioned at
    /// `valid_len`.
    fn classify_tail(&mut self, reason: &str) -> Result<Tail, LedgerError> {
        let io = |e| LedgerError::io(&self.path, e);
        let start = self.valid_len;
        let max_frame = format::FRAME_PREFIX_LEN + self.max_payload;
        self.input.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut tail = Vec::new();
        let mut take = (&mut self.input).take(max_frame as u64 + 1);
        take.read_to_end(&mut tail).map_err(io)?;
        self.input.seek(SeekFrom::Start(start)).map_err(io)?;
        if let Frame::Intact { .. } = format::check_frame(&tail, self.max_payload) {
            return Ok(Tail::Grew);
        }
        if tail.len() > max_frame {
            return Err(LedgerError::corrupt(
                &self.path,
                start,
                format!("{reason}, and more data follows than one record can hold"),
            ));
        }
        for at in 1..tail.len() {
            if let Frame::Intact { payload } = format::check_frame(&tail[at..], self.max_payload)
                && format::payload_sequence(payload) >= self.next_sequence
            {
                return Err(LedgerError::corrupt(
                    &self.path,
                    start,
                    format!(
                        "{reason}, followed by an intact record at byte {}",
                        start + at as u64
                    ),
                ));
            }
        }
        Ok(Tail::Torn(tail.len() as u64))
    }
}

/// What follows the last intact record, when it is not a clean end of file.
enum Tail {
    /// A torn final write of this many bytes.
    Torn(u64),
    /// The record was completed by a concurrent writer while being read.
    Grew,
}

impl Iterator for LedgerReader {
    type Item = Result<LedgerEntry, LedgerError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let item = self.next_entry().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.finished = true;
        }
        item
    }
}

impl LedgerReader {
    /// The composition of every charge still to be read, as one event: a
    /// [`DpEvent::Composed`] of each charge's recorded event, in file order.
    /// A charge recorded without an event (by `Ledger::charge`, or in a
    /// version 1 or 2 file) enters as [`DpEvent::DataDependent`] of its
    /// curve: where it came from is unknown, so no sampling theorem is
    /// applied to it, and at other orders it is read from above
    /// ([`RdpCurve::bound_at`]).
    ///
    /// Re-accounting this event (e.g. [`DpEvent::rdp`] over finer orders) can
    /// only be as loose as the ledger's own total, or tighter, for the
    /// charges that carry events.
    pub fn into_event(self) -> Result<DpEvent, LedgerError> {
        let mut events = Vec::new();
        for entry in self {
            let entry = entry?;
            match entry.kind {
                EntryKind::Charge { curve, .. } => {
                    events.push(entry.event.unwrap_or(DpEvent::DataDependent(curve)));
                }
                EntryKind::Step(runs) => events.extend(runs.iter().map(StepRun::to_event)),
                EntryKind::Budget(_) => {}
            }
        }
        Ok(DpEvent::Composed(events))
    }
}

/// What a whole ledger file adds up to.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LedgerSummary {
    /// The file's format version.
    pub version: u32,
    /// When the ledger was created (ms since the Unix epoch); `None` for
    /// version 1 files.
    pub created_ms: Option<u64>,
    /// The private members the ledger accounts for, if its header names them.
    pub protected_set: Option<ProtectedSet>,
    /// The orders of every charge.
    pub orders: Orders,
    /// The budget in force after the last record.
    pub budget: Option<PrivacyBudget>,
    /// The composition of every charge, in file order (rounded up).
    pub spent: RdpCurve,
    /// How many charges there are: charge records, and each charge of a step
    /// record's runs.
    pub charges: u64,
    /// How many records of any kind there are (the next sequence number).
    pub records: u64,
    /// Bytes of header and intact records.
    pub valid_len: u64,
    /// Bytes of a torn final write after them (never acknowledged; dropped on open).
    pub torn_tail_bytes: u64,
    /// The step definitions, numbered in file order (for the writer that opens
    /// the file, to charge them again by number).
    pub(crate) definitions: Vec<format::Definition>,
}

impl LedgerSummary {
    /// Reads every record of `reader` and adds up the charges.
    pub(crate) fn read(mut reader: LedgerReader) -> Result<Self, LedgerError> {
        let mut spent = RdpCurve::zero(reader.header.orders.clone());
        let mut budget = reader.header.initial_budget;
        let mut charges = 0;
        for entry in &mut reader {
            match entry?.kind {
                EntryKind::Charge { curve, .. } => {
                    spent = spent.compose(&curve)?;
                    charges += 1;
                }
                EntryKind::Step(runs) => {
                    for run in &runs {
                        spent = run.compose_onto(&spent)?;
                        charges += u64::from(run.count);
                    }
                }
                EntryKind::Budget(b) => budget = b,
            }
        }
        let header = reader.header;
        Ok(Self {
            version: header.version,
            created_ms: header.created_ms,
            protected_set: header.protected_set,
            orders: header.orders,
            budget,
            spent,
            charges,
            records: reader.next_sequence,
            valid_len: reader.valid_len,
            torn_tail_bytes: reader.torn_tail_bytes,
            definitions: reader.definitions,
        })
    }
}

/// Checks a ledger file without locking or changing it: every record's
/// checksum, sequence and contents, and the tail rule of the module docs.
/// A torn final write is reported in [`LedgerSummary::torn_tail_bytes`], not as
/// an error (opening the ledger drops it); any other damage is an error.
pub fn verify(path: impl AsRef<Path>) -> Result<LedgerSummary, LedgerError> {
    LedgerSummary::read(LedgerReader::open(path)?)
}
