//! The on-disk layout of a ledger file, and nothing else: encoding and
//! checking bytes. All integers and floats are little-endian; floats are stored
//! bit-exactly, so a total recomputed from the file equals the one in memory.
//!
//! ```text
//! header  = MAGIC "PRIVMIX-LEDGER" (14 B) | version u32 | len u32 | crc u32 | payload (len B)
//!           payload (versions 2, 3) = n u32 | n × order f64 | budget (17 B)
//!                                 | created unix time ms u64 | protected set
//!           payload (version 1) = n u32 | n × order f64 | budget (17 B)
//!           crc = CRC-32 of every header byte before it and of the payload
//! protected set = flag u8 (0 none, 1 some) | [count u32 | count × (len u16 | identity, ASCII)]
//! record  = len u32 | crc u32 | payload (len B)      crc = CRC-32 of len's 4 bytes ‖ payload
//!           payload = kind u8 | sequence u64 | unix time ms u64 | body
//!           charge body = n × RDP value f64 | label len u16 | label (UTF-8)
//!           event charge body (version 3) = charge body | event len u32 | event
//!           step body (version 4) = defs u16 | defs × definition | runs u16 | runs × run
//!           budget body = 17 B
//! definition = n × RDP value f64 | event flag u8 (0 none, 1 some) | [event len u32 | event]
//! run     = definition number u32 | count u32 | label len u16 | label (UTF-8)
//! budget  = flag u8 (0 none, 1 some) | ε f64 | δ f64
//! ```
//!
//! The event encoding is in `ledger/event_codec.rs`. Record kinds: 1 charge,
//! 2 budget, 3 event charge (a charge that also records the `DpEvent` it
//! paid for; its RDP values are the event's curve at the ledger's orders),
//! 4 step (the charges of one decoding step of many requests).
//!
//! Version 4 added the step record. A step record first defines charges not
//! defined before: each definition gets the next definition number of the
//! file (0, 1, … in file order, across records), and holds the charge's curve
//! and, when it was charged as one, the `DpEvent` (its curve at the ledger's
//! orders). Then come its runs: a run charges definition `d` `count` times
//! under one label, each time composed onto the total in turn (rounded up), so
//! a step record accounts exactly as `count` charge records would, in the same
//! order. A server's steps charge the same few definitions over and over: a
//! step of many requests costs a few bytes per request, not a curve per token.
//! A run may name only a definition made in its own record or before it.
//! Versions 1 to 3 never hold a step record; steps are written to them as
//! ordinary charge records (in one write).
//!
//! Version 3 added the event charge record; its header is version 2's. A
//! version 1 or 2 file is appended to in its own version, so it never holds an
//! event charge (one there is corruption) and charging an event to it is
//! refused (`LedgerError::EventsNeedVersion`): an older build must still read
//! every file it wrote.
//!
//! Version 2 added the creation time and the protected set (which private
//! members the ledger accounts for, see `protected.rs`) to the header; records
//! are the same in both versions. Version 1 files are still read, and appended
//! to, as ledgers with no creation time and no protected set: their charges
//! are never lost, and a caller that needs to know what a ledger protects
//! (privmix's command line) refuses to charge them.
//!
//! The record's length is inside its checksum, so a damaged length is caught
//! like damaged contents. The largest record is bounded (the label and the
//! event are), which bounds how many bytes one torn write can leave behind
//! (see `reader.rs`).

use std::io::Read;
use std::path::Path;

use super::budget::PrivacyBudget;
use super::entry::{EntryKind, LedgerEntry, LedgerHeader, StepRun};
use super::error::LedgerError;
use super::event_codec::{self, MAX_EVENT_BYTES};
use super::protected::{MAX_MEMBER_ID_BYTES, MAX_PROTECTED_MEMBERS, ProtectedSet};
use crate::{DpEvent, Orders, RdpCurve};

/// The first bytes of every ledger file.
pub(crate) const MAGIC: &[u8; 14] = b"PRIVMIX-LEDGER";
/// The format version written by this build.
pub const VERSION: u32 = 4;
/// The oldest format version this build still reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// Longest label a charge may carry, in bytes.
pub const MAX_LABEL_BYTES: usize = 1024;
/// Most orders a header may list (guards allocation when reading a bad file).
const MAX_ORDERS: usize = 1 << 16;
const HEADER_PREFIX_LEN: usize = MAGIC.len() + 12;
const BUDGET_LEN: usize = 17;
/// Length of a record's `len | crc` prefix.
pub(crate) const FRAME_PREFIX_LEN: usize = 8;
/// Bytes of a payload before its body: kind, sequence, timestamp.
const PAYLOAD_PREFIX_LEN: usize = 17;
const KIND_CHARGE: u8 = 1;
const KIND_BUDGET: u8 = 2;
const KIND_EVENT_CHARGE: u8 = 3;
const KIND_STEP: u8 = 4;
/// The first version whose files may hold event charges.
pub(crate) const FIRST_EVENT_VERSION: u32 = 3;
/// The first version whose files may hold step records.
pub(crate) const FIRST_STEP_VERSION: u32 = 4;
/// Most definitions one step record makes (a larger step is written as several
/// records, in one write).
pub const MAX_STEP_DEFINITIONS: usize = 4;
/// Most runs one step record holds.
pub const MAX_STEP_RUNS: usize = 64;
/// Longest definition over `n` orders: values, flag, event length and event.
fn max_definition_len(n_orders: usize) -> usize {
    8 * n_orders + 1 + 4 + MAX_EVENT_BYTES
}
/// Most definitions one file makes; a charge not yet defined when a file has
/// this many is written as a charge record (this bounds what a reader keeps).
pub const MAX_DEFINITIONS: usize = 256;
/// Longest run: definition, count, label length and label.
const MAX_RUN_LEN: usize = 4 + 4 + 2 + MAX_LABEL_BYTES;

/// The largest payload a record over `n_orders` orders can have in a file of
/// `version` (event charges, from version 3, are the longest).
pub(crate) fn max_payload_len(n_orders: usize, version: u32) -> usize {
    let charge = 8 * n_orders + 2 + MAX_LABEL_BYTES;
    let event = if version >= FIRST_EVENT_VERSION {
        4 + MAX_EVENT_BYTES
    } else {
        0
    };
    let step = if version >= FIRST_STEP_VERSION {
        2 + MAX_STEP_DEFINITIONS * max_definition_len(n_orders) + 2 + MAX_STEP_RUNS * MAX_RUN_LEN
    } else {
        0
    };
    PAYLOAD_PREFIX_LEN + (charge + event).max(BUDGET_LEN).max(step)
}

/// The header bytes of a new ledger (format [`VERSION`]).
pub(crate) fn encode_header(
    orders: &Orders,
    budget: Option<PrivacyBudget>,
    created_ms: u64,
    protected: Option<&ProtectedSet>,
) -> Vec<u8> {
    let mut payload = orders_and_budget(orders, budget);
    payload.extend_from_slice(&created_ms.to_le_bytes());
    match protected {
        None => payload.push(0),
        Some(set) => {
            payload.push(1);
            let count = u32::try_from(set.len()).expect("a protected set is checked to be small");
            payload.extend_from_slice(&count.to_le_bytes());
            for member in set.members() {
                let len = u16::try_from(member.len()).expect("member identities are short");
                payload.extend_from_slice(&len.to_le_bytes());
                payload.extend_from_slice(member.as_bytes());
            }
        }
    }
    frame_header(VERSION, &payload)
}

/// The header bytes a version 1 build wrote (for tests of old files).
#[cfg(test)]
pub(crate) fn encode_header_v1(orders: &Orders, budget: Option<PrivacyBudget>) -> Vec<u8> {
    frame_header(1, &orders_and_budget(orders, budget))
}

/// The header bytes a version 2 build wrote, which version 3 keeps (for
/// tests of old files).
#[cfg(test)]
pub(crate) fn encode_header_v2(orders: &Orders) -> Vec<u8> {
    let v3 = encode_header(orders, None, 0, None);
    frame_header(2, &v3[HEADER_PREFIX_LEN..])
}

/// `n | orders | budget`, the start of every version's header payload.
fn orders_and_budget(orders: &Orders, budget: Option<PrivacyBudget>) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + 8 * orders.len() + BUDGET_LEN);
    let n = u32::try_from(orders.len()).expect("an order set is far below 2^32 orders");
    payload.extend_from_slice(&n.to_le_bytes());
    for order in orders.as_slice() {
        payload.extend_from_slice(&order.to_le_bytes());
    }
    encode_budget(&mut payload, budget);
    payload
}

/// `MAGIC | version | len | crc | payload`.
fn frame_header(version: u32, payload: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_PREFIX_LEN + payload.len());
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header);
    hasher.update(payload);
    header.extend_from_slice(&hasher.finalize().to_le_bytes());
    header.extend_from_slice(payload);
    header
}

/// The longest header payload a version can have.
fn max_header_payload(version: u32) -> usize {
    let v1 = 4 + 8 * MAX_ORDERS + BUDGET_LEN;
    if version == 1 {
        v1
    } else {
        v1 + 8 + 1 + 4 + MAX_PROTECTED_MEMBERS * (2 + MAX_MEMBER_ID_BYTES)
    }
}

/// Reads and checks a header; returns what it says and its length in bytes.
/// The header is complete before a ledger file appears under its name (see
/// `Ledger::create`), so any damage is corruption.
pub(crate) fn read_header(
    input: &mut impl Read,
    path: &Path,
) -> Result<(LedgerHeader, u64), LedgerError> {
    let corrupt = |reason: &str| LedgerError::corrupt(path, 0, format!("header: {reason}"));
    let mut prefix = Vec::with_capacity(HEADER_PREFIX_LEN);
    read_up_to(input, HEADER_PREFIX_LEN, &mut prefix, path)?;
    if !prefix.starts_with(&MAGIC[..prefix.len().min(MAGIC.len())]) || prefix.is_empty() {
        return Err(LedgerError::NotALedger(path.to_path_buf()));
    }
    if prefix.len() < HEADER_PREFIX_LEN {
        return Err(corrupt("file ends inside the header"));
    }
    let version = u32_at(&prefix, MAGIC.len());
    if !(OLDEST_READABLE_VERSION..=VERSION).contains(&version) {
        return Err(LedgerError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    let len = u32_at(&prefix, MAGIC.len() + 4) as usize;
    if len > max_header_payload(version) {
        return Err(corrupt("length field out of range"));
    }
    let mut payload = Vec::with_capacity(len);
    read_up_to(input, len, &mut payload, path)?;
    if payload.len() < len {
        return Err(corrupt("file ends inside the header"));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&prefix[..MAGIC.len() + 8]);
    hasher.update(&payload);
    if hasher.finalize() != u32_at(&prefix, MAGIC.len() + 8) {
        return Err(corrupt("checksum mismatch"));
    }
    let n = if len >= 4 {
        u32_at(&payload, 0) as usize
    } else {
        0
    };
    let fixed = 4 + 8 * n + BUDGET_LEN;
    let fits = match version {
        1 => len == fixed,
        _ => len > fixed + 8,
    };
    if n == 0 || n > MAX_ORDERS || !fits {
        return Err(corrupt("order count does not match the header length"));
    }
    let stored: Vec<f64> = (0..n).map(|i| f64_at(&payload, 4 + 8 * i)).collect();
    let orders = Orders::new(stored.clone()).map_err(|e| corrupt(&e.to_string()))?;
    if orders.as_slice() != stored.as_slice() {
        return Err(corrupt("orders are not sorted and distinct"));
    }
    let initial_budget = decode_budget(&payload[4 + 8 * n..fixed]).map_err(corrupt)?;
    let (created_ms, protected_set) = if version == 1 {
        (None, None)
    } else {
        let created = u64_at(&payload, fixed);
        let set = decode_protected(&payload[fixed + 8..]).map_err(|r| corrupt(&r))?;
        (Some(created), set)
    };
    let header = LedgerHeader {
        version,
        orders,
        initial_budget,
        created_ms,
        protected_set,
    };
    Ok((header, (HEADER_PREFIX_LEN + len) as u64))
}

/// Decodes `flag | [count | members]`, which must fill `bytes` exactly.
fn decode_protected(bytes: &[u8]) -> Result<Option<ProtectedSet>, String> {
    let short = || "protected set runs past the header".to_string();
    match bytes.first() {
        Some(0) if bytes.len() == 1 => return Ok(None),
        Some(0) => return Err("bytes after an absent protected set".into()),
        Some(1) => {}
        Some(_) => return Err("unknown protected-set flag".into()),
        None => return Err(short()),
    }
    if bytes.len() < 5 {
        return Err(short());
    }
    let count = u32_at(bytes, 1) as usize;
    if count > MAX_PROTECTED_MEMBERS {
        return Err("protected set has too many members".into());
    }
    let mut at = 5;
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        if bytes.len() < at + 2 {
            return Err(short());
        }
        let len = usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
        at += 2;
        if bytes.len() < at + len {
            return Err(short());
        }
        let member = std::str::from_utf8(&bytes[at..at + len])
            .map_err(|_| "a protected member's identity is not UTF-8".to_string())?;
        members.push(member.to_owned());
        at += len;
    }
    if at != bytes.len() {
        return Err("bytes after the protected set".into());
    }
    let set = ProtectedSet::checked(members.clone())
        .map_err(|m| LedgerError::BadProtectedSet(m).to_string())?;
    if set.members() != members.as_slice() {
        return Err("protected members are not in canonical order".into());
    }
    Ok(Some(set))
}

/// A complete record: `len | crc | payload`.
pub(crate) fn encode_frame(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_le_bytes();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len);
    hasher.update(payload);
    let mut frame = Vec::with_capacity(FRAME_PREFIX_LEN + payload.len());
    frame.extend_from_slice(&len);
    frame.extend_from_slice(&hasher.finalize().to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The payload of a charge record.
pub(crate) fn charge_payload(sequence: u64, time_ms: u64, values: &[f64], label: &str) -> Vec<u8> {
    let mut p = payload_prefix(
        KIND_CHARGE,
        sequence,
        time_ms,
        8 * values.len() + 2 + label.len(),
    );
    for v in values {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let label_len = u16::try_from(label.len()).expect("labels are checked against MAX_LABEL_BYTES");
    p.extend_from_slice(&label_len.to_le_bytes());
    p.extend_from_slice(label.as_bytes());
    p
}

/// The payload of an event charge record: a charge record's body followed
/// by the event's encoding (at most [`MAX_EVENT_BYTES`], checked by the caller).
pub(crate) fn event_charge_payload(
    sequence: u64,
    time_ms: u64,
    values: &[f64],
    label: &str,
    event: &[u8],
) -> Vec<u8> {
    let mut p = charge_payload(sequence, time_ms, values, label);
    p[0] = KIND_EVENT_CHARGE;
    let len = u32::try_from(event.len()).expect("events are checked against MAX_EVENT_BYTES");
    p.extend_from_slice(&len.to_le_bytes());
    p.extend_from_slice(event);
    p
}

/// The payload of a budget record.
pub(crate) fn budget_payload(
    sequence: u64,
    time_ms: u64,
    budget: Option<PrivacyBudget>,
) -> Vec<u8> {
    let mut p = payload_prefix(KIND_BUDGET, sequence, time_ms, BUDGET_LEN);
    encode_budget(&mut p, budget);
    p
}

/// A charge a step record defines: its curve's values and, when it was
/// charged as one, its event's encoding.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DefinitionBytes {
    /// `n × f64 | flag | [len | event]`, as stored.
    pub(crate) bytes: Vec<u8>,
}

impl DefinitionBytes {
    /// The stored form of a definition of `values` (with `event`'s encoding, at
    /// most [`MAX_EVENT_BYTES`], checked by the caller).
    pub(crate) fn new(values: &[f64], event: Option<&[u8]>) -> Self {
        let mut bytes = Vec::with_capacity(8 * values.len() + 5 + event.map_or(0, <[u8]>::len));
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        match event {
            None => bytes.push(0),
            Some(e) => {
                bytes.push(1);
                let len =
                    u32::try_from(e.len()).expect("events are checked against MAX_EVENT_BYTES");
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(e);
            }
        }
        Self { bytes }
    }
}

/// One run of a step record: definition `definition` charged `count` times
/// under `label`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RunRef<'a> {
    pub(crate) definition: u32,
    pub(crate) count: u32,
    pub(crate) label: &'a str,
}

/// The payload of a step record: the definitions it makes (at most
/// [`MAX_STEP_DEFINITIONS`]) and its runs (at most [`MAX_STEP_RUNS`]; labels
/// checked against [`MAX_LABEL_BYTES`] by the caller).
pub(crate) fn step_payload(
    sequence: u64,
    time_ms: u64,
    definitions: &[&DefinitionBytes],
    runs: &[RunRef<'_>],
) -> Vec<u8> {
    let body = 4
        + definitions.iter().map(|d| d.bytes.len()).sum::<usize>()
        + runs.iter().map(|r| 10 + r.label.len()).sum::<usize>();
    let mut p = payload_prefix(KIND_STEP, sequence, time_ms, body);
    let defs = u16::try_from(definitions.len()).expect("at most MAX_STEP_DEFINITIONS");
    p.extend_from_slice(&defs.to_le_bytes());
    for d in definitions {
        p.extend_from_slice(&d.bytes);
    }
    let n = u16::try_from(runs.len()).expect("at most MAX_STEP_RUNS");
    p.extend_from_slice(&n.to_le_bytes());
    for r in runs {
        p.extend_from_slice(&r.definition.to_le_bytes());
        p.extend_from_slice(&r.count.to_le_bytes());
        let len = u16::try_from(r.label.len()).expect("labels are checked against MAX_LABEL_BYTES");
        p.extend_from_slice(&len.to_le_bytes());
        p.extend_from_slice(r.label.as_bytes());
    }
    p
}

/// A definition as read back: its bytes (to recognise it when it is charged
/// again), its curve and its event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Definition {
    pub(crate) bytes: DefinitionBytes,
    pub(crate) curve: RdpCurve,
    pub(crate) event: Option<DpEvent>,
}

/// Decodes a step body, adding its definitions to `definitions` (the file's,
/// so far); a run naming a definition not yet made is an error.
fn decode_step(
    body: &[u8],
    orders: &Orders,
    definitions: &mut Vec<Definition>,
) -> Result<EntryKind, String> {
    let n = orders.len();
    let mut at = 0usize;
    let short = || "step record ends early".to_string();
    let take = |at: &mut usize, len: usize| -> Result<std::ops::Range<usize>, String> {
        let end = at
            .checked_add(len)
            .filter(|&e| e <= body.len())
            .ok_or_else(short)?;
        let range = *at..end;
        *at = end;
        Ok(range)
    };
    let r = take(&mut at, 2)?;
    let defs = usize::from(u16::from_le_bytes([body[r.start], body[r.start + 1]]));
    if defs > MAX_STEP_DEFINITIONS {
        return Err("step record makes too many definitions".into());
    }
    for _ in 0..defs {
        if definitions.len() >= MAX_DEFINITIONS {
            return Err("step record makes more definitions than a file may hold".into());
        }
        let start = at;
        let values = take(&mut at, 8 * n)?;
        let values: Vec<f64> = (0..n).map(|i| f64_at(body, values.start + 8 * i)).collect();
        let curve = RdpCurve::new(orders.clone(), values).map_err(|e| e.to_string())?;
        let flag = body[take(&mut at, 1)?.start];
        let event = match flag {
            0 => None,
            1 => {
                let len = u32_at(body, take(&mut at, 4)?.start) as usize;
                if len > MAX_EVENT_BYTES {
                    return Err("step definition's event is too long".into());
                }
                let e = take(&mut at, len)?;
                let event = event_codec::decode(&body[e])
                    .map_err(|reason| format!("step definition: {reason}"))?;
                Some(event)
            }
            _ => return Err("unknown step definition flag".into()),
        };
        definitions.push(Definition {
            bytes: DefinitionBytes {
                bytes: body[start..at].to_vec(),
            },
            curve,
            event,
        });
    }
    let r = take(&mut at, 2)?;
    let count = usize::from(u16::from_le_bytes([body[r.start], body[r.start + 1]]));
    if count > MAX_STEP_RUNS {
        return Err("step record has too many runs".into());
    }
    let mut runs = Vec::with_capacity(count);
    for _ in 0..count {
        let d = u32_at(body, take(&mut at, 4)?.start) as usize;
        let times = u32_at(body, take(&mut at, 4)?.start);
        let r = take(&mut at, 2)?;
        let len = usize::from(u16::from_le_bytes([body[r.start], body[r.start + 1]]));
        if len > MAX_LABEL_BYTES {
            return Err("step run's label is too long".into());
        }
        let label = std::str::from_utf8(&body[take(&mut at, len)?])
            .map_err(|_| "step run's label is not UTF-8".to_string())?
            .to_owned();
        let definition = definitions
            .get(d)
            .ok_or_else(|| format!("step run names definition {d}, which is not made before it"))?;
        if times == 0 {
            return Err("step run charges nothing".into());
        }
        runs.push(StepRun {
            curve: definition.curve.clone(),
            event: definition.event.clone(),
            label,
            count: times,
        });
    }
    if runs.is_empty() {
        return Err("step record has no run".into());
    }
    if at != body.len() {
        return Err("bytes after the step record's runs".into());
    }
    Ok(EntryKind::Step(runs))
}

/// What the bytes at a record's start hold.
#[derive(Debug)]
pub(crate) enum Frame<'a> {
    /// Length in range, all bytes present, checksum right.
    Intact {
        /// The checked payload.
        payload: &'a [u8],
    },
    /// Anything else: what a torn write or damage leaves.
    Damaged(&'static str),
}

/// Checks the record starting at `bytes[0]`; `bytes` may run past its end.
pub(crate) fn check_frame(bytes: &[u8], max_payload: usize) -> Frame<'_> {
    if bytes.len() < FRAME_PREFIX_LEN {
        return Frame::Damaged("file ends inside a record's length and checksum");
    }
    let len = u32_at(bytes, 0) as usize;
    if !(PAYLOAD_PREFIX_LEN..=max_payload).contains(&len) {
        return Frame::Damaged("record length out of range");
    }
    let frame_len = FRAME_PREFIX_LEN + len;
    if bytes.len() < frame_len {
        return Frame::Damaged("file ends inside a record");
    }
    let payload = &bytes[FRAME_PREFIX_LEN..frame_len];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..4]);
    hasher.update(payload);
    if hasher.finalize() != u32_at(bytes, 4) {
        return Frame::Damaged("record checksum mismatch");
    }
    Frame::Intact { payload }
}

/// The sequence number of a checked payload.
pub(crate) fn payload_sequence(payload: &[u8]) -> u64 {
    u64_at(payload, 1)
}

/// Decodes a checked payload. An error here means the record was *written*
/// wrong (its checksum holds), never that it was torn.
pub(crate) fn decode_payload(
    payload: &[u8],
    orders: &Orders,
    version: u32,
    definitions: &mut Vec<Definition>,
) -> Result<LedgerEntry, String> {
    let sequence = payload_sequence(payload);
    let time_ms = u64_at(payload, 9);
    let body = &payload[PAYLOAD_PREFIX_LEN..];
    let (kind, event) = match payload[0] {
        KIND_CHARGE => (decode_charge(body, orders, body.len())?, None),
        KIND_EVENT_CHARGE if version >= FIRST_EVENT_VERSION => {
            let n = orders.len();
            if body.len() < 8 * n + 2 {
                return Err("event charge record too short for the ledger's orders".into());
            }
            let label_len = usize::from(u16::from_le_bytes([body[8 * n], body[8 * n + 1]]));
            let charge_len = 8 * n + 2 + label_len;
            if body.len() < charge_len + 4 {
                return Err("event charge record too short for its label and event length".into());
            }
            let event_len = u32_at(body, charge_len) as usize;
            if event_len > MAX_EVENT_BYTES || body.len() != charge_len + 4 + event_len {
                return Err("event charge record length does not match its event length".into());
            }
            let kind = decode_charge(body, orders, charge_len)?;
            let event = event_codec::decode(&body[charge_len + 4..])
                .map_err(|reason| format!("event charge: {reason}"))?;
            (kind, Some(event))
        }
        KIND_STEP if version >= FIRST_STEP_VERSION => {
            (decode_step(body, orders, definitions)?, None)
        }
        KIND_BUDGET if body.len() == BUDGET_LEN => (
            EntryKind::Budget(decode_budget(body).map_err(str::to_owned)?),
            None,
        ),
        KIND_BUDGET => return Err("budget record has the wrong length".into()),
        other => return Err(format!("unknown record kind {other}")),
    };
    Ok(LedgerEntry {
        sequence,
        time_ms,
        kind,
        event,
    })
}

/// Decodes `values | label len | label`, which must be `len` bytes of `body`.
fn decode_charge(body: &[u8], orders: &Orders, len: usize) -> Result<EntryKind, String> {
    let n = orders.len();
    if body.len() < 8 * n + 2 {
        return Err("charge record too short for the ledger's orders".into());
    }
    let label_len = usize::from(u16::from_le_bytes([body[8 * n], body[8 * n + 1]]));
    if len != 8 * n + 2 + label_len {
        return Err("charge record length does not match its label length".into());
    }
    let values = (0..n).map(|i| f64_at(body, 8 * i)).collect();
    let curve = RdpCurve::new(orders.clone(), values).map_err(|e| e.to_string())?;
    let label = std::str::from_utf8(&body[8 * n + 2..len])
        .map_err(|_| "charge label is not UTF-8".to_string())?
        .to_owned();
    Ok(EntryKind::Charge { curve, label })
}

fn payload_prefix(kind: u8, sequence: u64, time_ms: u64, body_len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(PAYLOAD_PREFIX_LEN + body_len);
    p.push(kind);
    p.extend_from_slice(&sequence.to_le_bytes());
    p.extend_from_slice(&time_ms.to_le_bytes());
    p
}

fn encode_budget(out: &mut Vec<u8>, budget: Option<PrivacyBudget>) {
    let (flag, eps, delta) = budget.map_or((0u8, 0.0, 0.0), |b| (1, b.epsilon(), b.delta()));
    out.push(flag);
    out.extend_from_slice(&f64::to_le_bytes(eps));
    out.extend_from_slice(&f64::to_le_bytes(delta));
}

fn decode_budget(bytes: &[u8]) -> Result<Option<PrivacyBudget>, &'static str> {
    match bytes[0] {
        0 => Ok(None),
        1 => PrivacyBudget::new(f64_at(bytes, 1), f64_at(bytes, 9))
            .map(Some)
            .map_err(|_| "stored budget is not a valid (ε, δ)"),
        _ => Err("unknown budget flag"),
    }
}

/// Reads until `want` bytes are in `out` or the input ends.
fn read_up_to(
    input: &mut impl Read,
    want: usize,
    out: &mut Vec<u8>,
    path: &Path,
) -> Result<(), LedgerError> {
    input
        .take(want as u64)
        .read_to_end(out)
        .map(drop)
        .map_err(|e| LedgerError::io(path, e))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_bits(u64_at(b, at))
}
