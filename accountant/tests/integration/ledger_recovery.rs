//! Crash recovery on hand-damaged files: a torn final record (cut at every
//! byte, or filled with garbage) is dropped and never costs an acknowledged
//! charge; damage anywhere before the last record refuses to open.

use crate::ledger_support;

use std::path::Path;

use ledger_support::{TempDir, bits, charge_for, compose_all, label_for, small_orders};
use privmix_accountant::{DpEvent, Ledger, LedgerError, Orders, PrivacyBudget, RdpCurve, verify};

/// A ledger with a budget record in the middle and event charges among the
/// charges; returns the file's bytes, the
/// end offset of the header and of every record, and each record's charge
/// (`None` for the budget record).
fn build(
    dir: &TempDir,
    orders: &Orders,
    records: u64,
) -> (Vec<u8>, Vec<u64>, Vec<Option<RdpCurve>>) {
    let path = dir.file("source");
    let mut ledger = Ledger::create(&path, orders.clone(), None).unwrap();
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    let mut ends = vec![len(&path)];
    let mut charges = Vec::new();
    for s in 0..records {
        if s == 2 {
            ledger
                .set_budget(Some(PrivacyBudget::new(100.0, 1e-6).unwrap()))
                .unwrap();
            charges.push(None);
        } else if s % 3 == 1 {
            // An event charge: a longer record holding the event's encoding.
            let event = DpEvent::Measured(charge_for(orders, s))
                .poisson_sampled(0.5)
                .unwrap();
            ledger.charge_event(&event, &label_for(s)).unwrap();
            charges.push(Some(event.rdp(orders).unwrap()));
        } else {
            let curve = charge_for(orders, s);
            ledger.charge(&curve, &label_for(s)).unwrap();
            charges.push(Some(curve));
        }
        ends.push(len(&path));
    }
    drop(ledger);
    (std::fs::read(&path).unwrap(), ends, charges)
}

/// Opens `bytes` as a ledger and checks it holds exactly the first `kept`
/// records and was truncated to their end; with `append`, also that it
/// accepts and keeps a new charge (each costs an fsync, so loops sample it).
fn assert_recovers(
    dir: &TempDir,
    bytes: &[u8],
    ends: &[u64],
    charges: &[Option<RdpCurve>],
    kept: usize,
    orders: &Orders,
    append: bool,
) {
    let path = dir.file("damaged");
    std::fs::write(&path, bytes).unwrap();
    let torn = bytes.len() as u64 - ends[kept];
    assert_eq!(verify(&path).unwrap().torn_tail_bytes, torn);
    let mut ledger = Ledger::open(&path).unwrap();
    let expected = compose_all(orders, charges[..kept].iter().flatten());
    assert_eq!(ledger.next_sequence(), kept as u64);
    assert_eq!(bits(ledger.spent()), bits(&expected));
    assert_eq!(ledger.recovered_torn_bytes(), torn);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), ends[kept]);
    if !append {
        return;
    }
    let extra = charge_for(orders, 99);
    ledger.charge(&extra, "after recovery").unwrap();
    drop(ledger);
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.next_sequence(), kept as u64 + 1);
    assert_eq!(
        bits(reopened.spent()),
        bits(&expected.compose(&extra).unwrap())
    );
    assert_eq!(reopened.recovered_torn_bytes(), 0);
}

#[test]
fn cutting_the_file_anywhere_keeps_every_complete_record() {
    let dir = TempDir::new("cut");
    let orders = small_orders();
    let (bytes, ends, charges) = build(&dir, &orders, 6);
    for cut in ends[0]..=*ends.last().unwrap() {
        // Records that end at or before the cut were complete.
        let kept = ends[1..].iter().filter(|&&e| e <= cut).count();
        let append = cut % 8 == 0 || ends.contains(&cut);
        assert_recovers(
            &dir,
            &bytes[..cut as usize],
            &ends,
            &charges,
            kept,
            &orders,
            append,
        );
    }
}

#[test]
fn a_torn_last_record_with_many_orders_is_dropped_at_every_byte() {
    let dir = TempDir::new("cutbig");
    let orders = Orders::dp_accounting_default();
    let (bytes, ends, charges) = build(&dir, &orders, 4);
    let (start, end) = (ends[3], ends[4]);
    assert!(end - start > 1000, "a default-orders record is over 1 KB");
    for cut in start..end {
        let append = (cut - start) % 64 == 0 || cut == end - 1;
        assert_recovers(
            &dir,
            &bytes[..cut as usize],
            &ends,
            &charges,
            3,
            &orders,
            append,
        );
    }
}

#[test]
fn a_last_record_that_reached_disk_as_garbage_is_dropped() {
    // Out-of-order writeback can leave the file extended with zeros or
    // stale bytes instead of a prefix; the length field is then garbage too.
    let dir = TempDir::new("garbage");
    let orders = small_orders();
    let (bytes, ends, charges) = build(&dir, &orders, 5);
    let start = ends[4] as usize;
    for fill in [0x00u8, 0xff, 0x5a] {
        let mut damaged = bytes.clone();
        damaged[start..].fill(fill);
        assert_recovers(&dir, &damaged, &ends, &charges, 4, &orders, true);
        // Zeros past the record's end, as from a size update without data.
        let mut longer = damaged.clone();
        longer.extend(std::iter::repeat_n(fill, 40));
        assert_recovers(&dir, &longer, &ends, &charges, 4, &orders, true);
    }
}

#[test]
fn damage_before_the_last_record_refuses_to_open_and_changes_nothing() {
    let dir = TempDir::new("flip");
    let orders = small_orders();
    let (bytes, ends, _) = build(&dir, &orders, 5);
    let path = dir.file("damaged");
    // Every byte of every record but the last (the second-to-last is the
    // hardest: only the intact record after it shows the damage is not a tail).
    for at in ends[0]..ends[4] {
        let mut damaged = bytes.clone();
        damaged[at as usize] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        for result in [Ledger::open(&path).err(), verify(&path).err()] {
            assert!(
                matches!(result, Some(LedgerError::Corrupt { .. })),
                "flip at byte {at}: {result:?}"
            );
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            damaged,
            "a refused open changed the file"
        );
    }
}

#[test]
fn damage_to_the_header_refuses_to_open() {
    let dir = TempDir::new("header");
    let (bytes, ends, _) = build(&dir, &small_orders(), 3);
    let path = dir.file("damaged");
    for at in 0..ends[0] as usize {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        assert!(
            matches!(
                Ledger::open(&path),
                Err(LedgerError::Corrupt { .. }
                    | LedgerError::NotALedger(_)
                    | LedgerError::UnsupportedVersion { .. })
            ),
            "flip at header byte {at} went unnoticed"
        );
    }
}

#[test]
fn damage_confined_to_the_last_record_is_indistinguishable_from_a_torn_write() {
    // The documented limit of the format: a flipped byte in the final record
    // looks exactly like a torn write, so it is dropped (reported as torn bytes).
    let dir = TempDir::new("lastflip");
    let orders = small_orders();
    let (bytes, ends, charges) = build(&dir, &orders, 4);
    let mut damaged = bytes.clone();
    damaged[ends[3] as usize + 20] ^= 0x01;
    assert_recovers(&dir, &damaged, &ends, &charges, 3, &orders, true);
}
