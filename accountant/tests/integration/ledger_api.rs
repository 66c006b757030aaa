//! The ledger's everyday behaviour: creating, charging, reopening, locking,
//! listing, and the typed errors for misuse.

use crate::ledger_support;

use ledger_support::{TempDir, bits, charge_for, compose_all, label_for, small_orders};
use privmix_accountant::{
    AccountantError, EntryKind, FORMAT_VERSION, Ledger, LedgerError, Orders, RdpCurve, verify,
};

#[test]
fn reopening_restores_the_exact_total_and_every_record() {
    let dir = TempDir::new("reopen");
    let path = dir.file("ledger");
    let orders = small_orders();
    let mut ledger = Ledger::create(&path, orders.clone(), None).unwrap();
    let curves: Vec<RdpCurve> = (0..10).map(|s| charge_for(&orders, s)).collect();
    for (s, c) in curves.iter().enumerate() {
        let receipt = ledger.charge(c, &label_for(s as u64)).unwrap();
        assert_eq!(receipt.sequence, s as u64);
        assert_eq!(receipt.spent, None, "no budget, no conversion");
    }
    let expected = compose_all(&orders, &curves);
    assert_eq!(bits(ledger.spent()), bits(&expected));
    drop(ledger);

    let ledger = Ledger::open(&path).unwrap();
    assert_eq!(ledger.charges(), 10);
    assert_eq!(ledger.next_sequence(), 10);
    assert_eq!(ledger.recovered_torn_bytes(), 0);
    assert_eq!(bits(ledger.spent()), bits(&expected));
    assert_eq!(
        ledger.spent_epsilon(1e-5).unwrap(),
        expected.epsilon(1e-5).unwrap()
    );
    let entries: Vec<_> = ledger.entries().unwrap().map(Result::unwrap).collect();
    assert_eq!(entries.len(), 10);
    for (s, entry) in entries.iter().enumerate() {
        assert_eq!(entry.sequence, s as u64);
        let EntryKind::Charge { curve, label } = &entry.kind else {
            panic!("record {s} is not a charge");
        };
        assert_eq!(label, &label_for(s as u64));
        assert_eq!(bits(curve), bits(&curves[s]));
    }
}

#[test]
fn create_never_overwrites_and_leaves_no_staging_file() {
    let dir = TempDir::new("create");
    let path = dir.file("ledger");
    std::fs::write(&path, b"precious").unwrap();
    assert!(matches!(
        Ledger::create(&path, small_orders(), None),
        Err(LedgerError::AlreadyExists(p)) if p == path
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");

    let other = dir.file("other");
    let mut ledger = Ledger::create(&other, small_orders(), None).unwrap();
    ledger.charge(&charge_for(&small_orders(), 0), "x").unwrap();
    drop(ledger);
    assert!(matches!(
        Ledger::create(&other, small_orders(), None),
        Err(LedgerError::AlreadyExists(_))
    ));
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ledger", "other"]);
    assert_eq!(Ledger::open(&other).unwrap().charges(), 1);
}

#[test]
fn a_second_handle_in_the_same_process_is_refused_until_the_first_drops() {
    let dir = TempDir::new("lock");
    let path = dir.file("ledger");
    let mut first = Ledger::create(&path, small_orders(), None).unwrap();
    assert!(matches!(Ledger::open(&path), Err(LedgerError::Locked(p)) if p == path));
    assert!(matches!(
        Ledger::open_or_create(&path, small_orders(), None),
        Err(LedgerError::Locked(_))
    ));
    first.charge(&charge_for(&small_orders(), 0), "a").unwrap();
    // Reading takes no lock.
    assert_eq!(verify(&path).unwrap().charges, 1);
    drop(first);
    let mut second = Ledger::open(&path).unwrap();
    second.charge(&charge_for(&small_orders(), 1), "b").unwrap();
    assert_eq!(second.charges(), 2);
}

#[test]
fn charges_over_other_orders_are_refused_without_writing() {
    let dir = TempDir::new("orders");
    let path = dir.file("ledger");
    let mut ledger = Ledger::create(&path, small_orders(), None).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let other = Orders::integers(8).unwrap();
    let curve = RdpCurve::zero(other.clone());
    assert!(matches!(
        ledger.charge(&curve, "wrong"),
        Err(LedgerError::Accountant(AccountantError::OrdersDiffer))
    ));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    assert_eq!(ledger.next_sequence(), 0);
    drop(ledger);
    assert!(matches!(
        Ledger::open_or_create(&path, other, None),
        Err(LedgerError::Accountant(AccountantError::OrdersDiffer))
    ));
}

#[test]
fn open_or_create_creates_once_then_opens() {
    let dir = TempDir::new("ooc");
    let path = dir.file("ledger");
    let mut ledger = Ledger::open_or_create(&path, small_orders(), None).unwrap();
    ledger.charge(&charge_for(&small_orders(), 0), "a").unwrap();
    drop(ledger);
    let ledger = Ledger::open_or_create(&path, small_orders(), None).unwrap();
    assert_eq!(ledger.charges(), 1);
}

#[test]
fn files_that_are_not_ledgers_get_typed_errors() {
    let dir = TempDir::new("notledger");
    let missing = dir.file("missing");
    assert!(matches!(
        Ledger::open(&missing),
        Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound
    ));
    let empty = dir.file("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        Ledger::open(&empty),
        Err(LedgerError::NotALedger(_))
    ));
    let text = dir.file("text");
    std::fs::write(&text, b"hello, this is not a ledger at all").unwrap();
    assert!(matches!(
        Ledger::open(&text),
        Err(LedgerError::NotALedger(_))
    ));
    assert!(matches!(verify(&text), Err(LedgerError::NotALedger(_))));

    // A future format version is refused, not misread.
    let newer = dir.file("newer");
    drop(Ledger::create(&newer, small_orders(), None).unwrap());
    let mut bytes = std::fs::read(&newer).unwrap();
    bytes[14..18].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&newer, bytes).unwrap();
    assert!(matches!(
        Ledger::open(&newer),
        Err(LedgerError::UnsupportedVersion {
            found,
            supported: FORMAT_VERSION,
            ..
        }) if found == FORMAT_VERSION + 1
    ));
}

#[test]
fn infinite_and_zero_charges_are_recorded_exactly() {
    let dir = TempDir::new("inf");
    let path = dir.file("ledger");
    let orders = small_orders();
    let mut ledger = Ledger::create(&path, orders.clone(), None).unwrap();
    let mut values = vec![0.5; orders.len()];
    values[0] = f64::INFINITY;
    let partly_infinite = RdpCurve::new(orders.clone(), values).unwrap();
    ledger
        .charge(&RdpCurve::zero(orders.clone()), "nothing")
        .unwrap();
    ledger
        .charge(&partly_infinite, "no bound at the lowest order")
        .unwrap();
    let expected = bits(ledger.spent());
    drop(ledger);
    let ledger = Ledger::open(&path).unwrap();
    assert_eq!(bits(ledger.spent()), expected);
    assert_eq!(ledger.spent().epsilons()[0], f64::INFINITY);
}
