//! Format version 2: the header names the protected set and the creation
//! time; they round-trip through every way of reading a ledger, a ledger
//! refuses to vouch for another set, version 1 files (a golden file written
//! by the version 1 build) are still read and appended to without a set, and
//! damage to the new header fields is still detected.

use crate::ledger_support;

use ledger_support::{TempDir, bits, charge_for, compose_all, label_for, small_orders};
use privmix_accountant::{
    EntryKind, FORMAT_VERSION, Ledger, LedgerError, LedgerReader, PrivacyBudget, ProtectedSet,
    RdpCurve, verify,
};

fn members(ids: &[&str]) -> ProtectedSet {
    ProtectedSet::new(ids.iter().copied()).unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn the_protected_set_and_creation_time_round_trip() {
    let dir = TempDir::new("protected");
    let path = dir.file("ledger");
    let orders = small_orders();
    let set = members(&["sha256:bb", "sha256:aa", "sha256:cc"]);
    let budget = PrivacyBudget::new(3.0, 1e-6).unwrap();
    let before = now_ms();
    let mut ledger =
        Ledger::create_protecting(&path, orders.clone(), Some(budget), set.clone()).unwrap();
    let after = now_ms();
    let created = ledger.created_ms().unwrap();
    assert!((before..=after).contains(&created));
    assert_eq!(ledger.format_version(), FORMAT_VERSION);
    assert_eq!(ledger.protected_set(), Some(&set));
    for s in 0..3 {
        ledger
            .charge(&charge_for(&orders, s), &label_for(s))
            .unwrap();
    }
    drop(ledger);

    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.protected_set(), Some(&set));
    assert_eq!(reopened.created_ms(), Some(created));
    assert_eq!(reopened.format_version(), FORMAT_VERSION);
    assert_eq!(reopened.charges(), 3);
    drop(reopened);
    let summary = verify(&path).unwrap();
    assert_eq!(summary.protected_set, Some(set.clone()));
    assert_eq!(
        (summary.version, summary.created_ms),
        (FORMAT_VERSION, Some(created))
    );
    let reader = LedgerReader::open(&path).unwrap();
    assert_eq!(reader.header().protected_set, Some(set.clone()));
    assert_eq!(reader.header().initial_budget, Some(budget));
    assert_eq!(reader.count(), 3);
}

#[test]
fn a_ledger_vouches_only_for_its_own_set() {
    let dir = TempDir::new("vouch");
    let orders = small_orders();
    let set = members(&["sha256:aa", "sha256:bb"]);
    let path = dir.file("ledger");
    let ledger = Ledger::create_protecting(&path, orders.clone(), None, set.clone()).unwrap();
    // The same members in another order are the same set.
    ledger
        .check_protects(&members(&["sha256:bb", "sha256:aa"]))
        .unwrap();
    // A member swapped, dropped, added or repeated is another set, named in the error.
    for other in [
        members(&["sha256:aa", "sha256:cc"]),
        members(&["sha256:aa"]),
        members(&["sha256:aa", "sha256:bb", "sha256:cc"]),
        members(&["sha256:aa", "sha256:bb", "sha256:bb"]),
    ] {
        let err = ledger.check_protects(&other).unwrap_err();
        let message = err.to_string();
        match &err {
            LedgerError::ProtectedSetDiffers {
                recorded, loaded, ..
            } => {
                assert_eq!((recorded, loaded), (&set, &other));
            }
            e => panic!("expected ProtectedSetDiffers, got {e:?}"),
        }
        assert!(message.contains(&set.to_string()), "{message}");
        assert!(message.contains(&other.to_string()), "{message}");
        assert!(message.contains(path.to_str().unwrap()), "{message}");
    }
    let err = ledger
        .check_protects(&members(&["sha256:aa", "sha256:cc"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("only in the ledger: [sha256:bb]")
            && err.contains("only in this run: [sha256:cc]"),
        "{err}"
    );
    drop(ledger);

    // A ledger made without a set vouches for none.
    let bare = Ledger::create(dir.file("bare"), orders, None).unwrap();
    assert_eq!(bare.protected_set(), None);
    assert!(matches!(
        bare.check_protects(&set),
        Err(LedgerError::NoProtectedSet {
            version: FORMAT_VERSION,
            ..
        })
    ));
}

/// `tests/golden/ledger_v1.ledger` was written by the version 1 build
/// (commit 9e08774): orders [1.5, 2, 4, 16, 64], budget (1, 1e-5), a charge
/// α/800 labelled `gaussian-0`, the budget raised to (2, 1e-5), the same
/// charge labelled `gaussian-2`.
#[test]
fn version_1_files_are_read_and_appended_to_without_a_set() {
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ledger_v1.ledger");
    let dir = TempDir::new("v1");
    let path = dir.file("old.ledger");
    std::fs::copy(&golden, &path).unwrap();
    let orders = small_orders();
    let charge = RdpCurve::from_fn(orders.clone(), |a| a / 800.0).unwrap();

    let summary = verify(&path).unwrap();
    assert_eq!((summary.version, summary.created_ms), (1, None));
    assert_eq!(summary.protected_set, None);
    assert_eq!((summary.records, summary.charges), (3, 2));
    assert_eq!(summary.budget, Some(PrivacyBudget::new(2.0, 1e-5).unwrap()));
    assert_eq!(
        bits(&summary.spent),
        bits(&compose_all(&orders, [&charge, &charge]))
    );
    let history: Vec<_> = LedgerReader::open(&path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter_map(|e| match e.kind {
            EntryKind::Budget(b) => Some(b),
            _ => None,
        })
        .collect();
    assert_eq!(history, [Some(PrivacyBudget::new(2.0, 1e-5).unwrap())]);

    let mut ledger = Ledger::open(&path).unwrap();
    assert_eq!(ledger.format_version(), 1);
    assert_eq!(ledger.created_ms(), None);
    assert!(matches!(
        ledger.check_protects(&members(&["sha256:aa"])),
        Err(LedgerError::NoProtectedSet { version: 1, .. })
    ));
    // Its charges still count, and new ones append in the same record format.
    ledger.charge(&charge, "gaussian-3").unwrap();
    drop(ledger);
    let bytes = std::fs::read(&path).unwrap();
    let golden_bytes = std::fs::read(&golden).unwrap();
    assert_eq!(&bytes[..golden_bytes.len()], golden_bytes.as_slice());
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.format_version(), 1);
    assert_eq!(reopened.charges(), 3);
    assert_eq!(
        bits(reopened.spent()),
        bits(&compose_all(&orders, [&charge, &charge, &charge]))
    );
}

/// Every single-bit flip anywhere in a version 2 header (its set and time
/// included) makes the file unreadable, never a ledger with another set; a
/// flip inside an earlier record is corruption, not a torn tail.
#[test]
fn damage_to_a_version_2_ledger_is_still_detected() {
    let dir = TempDir::new("damage2");
    let path = dir.file("ledger");
    let orders = small_orders();
    let set = members(&["sha256:0123", "sha256:4567"]);
    let mut ledger = Ledger::create_protecting(
        &path,
        orders.clone(),
        Some(PrivacyBudget::new(50.0, 1e-6).unwrap()),
        set.clone(),
    )
    .unwrap();
    let header_len = std::fs::metadata(&path).unwrap().len() as usize;
    for s in 0..3 {
        ledger
            .charge(&charge_for(&orders, s), &label_for(s))
            .unwrap();
    }
    drop(ledger);
    let bytes = std::fs::read(&path).unwrap();
    let damaged = dir.file("damaged");
    for i in 0..header_len {
        for bit in [0, 3, 7] {
            let mut bad = bytes.clone();
            bad[i] ^= 1 << bit;
            std::fs::write(&damaged, &bad).unwrap();
            match Ledger::open(&damaged) {
                Err(
                    LedgerError::Corrupt { .. }
                    | LedgerError::NotALedger(_)
                    | LedgerError::UnsupportedVersion { .. },
                ) => {}
                other => panic!("flip of bit {bit} at header byte {i}: {other:?}"),
            }
        }
    }
    // A flip in the first record (two intact records follow it).
    let mut bad = bytes.clone();
    bad[header_len + 12] ^= 1;
    std::fs::write(&damaged, &bad).unwrap();
    assert!(matches!(
        Ledger::open(&damaged),
        Err(LedgerError::Corrupt { .. })
    ));
    // The intact file still opens with its set.
    assert_eq!(Ledger::open(&path).unwrap().protected_set(), Some(&set));
}

#[test]
fn bad_member_identities_are_typed_errors() {
    for bad in [
        vec![String::new()],
        vec!["two words".into()],
        vec!["x".repeat(257)],
    ] {
        assert!(matches!(
            ProtectedSet::new(bad),
            Err(LedgerError::BadProtectedSet(_))
        ));
    }
}
