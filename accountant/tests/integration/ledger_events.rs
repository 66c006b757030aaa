//! Events in ledger records: charged, read back, re-accounted; and files of
//! format version 2 (a golden file written before events existed) still open,
//! read and take plain charges, but refuse event charges.

use crate::ledger_support;

use ledger_support::{TempDir, bits, compose_all, small_orders};
use privmix_accountant::{
    DpEvent, EntryKind, FORMAT_VERSION, Ledger, LedgerError, LedgerReader, Orders, PrivacyBudget,
    ProtectedSet, RdpCurve, verify,
};

#[test]
fn charged_events_are_read_back_and_re_accounted() {
    let dir = TempDir::new("events");
    let path = dir.file("run.ledger");
    let orders = small_orders();
    let mut ledger = Ledger::create(&path, orders.clone(), None).unwrap();
    assert_eq!(ledger.format_version(), FORMAT_VERSION);
    let step = DpEvent::gaussian(1.0)
        .unwrap()
        .poisson_sampled(0.01)
        .unwrap();
    let measured = RdpCurve::from_fn(orders.clone(), |a| a / 1000.0).unwrap();
    let r = ledger.charge_event(&step, "sgd-0").unwrap();
    assert_eq!(r.sequence, 0);
    ledger.charge(&measured, "measured").unwrap();
    ledger.charge_event(&step, "sgd-1").unwrap();
    let spent = ledger.spent().clone();
    drop(ledger);

    // The records carry the events; the plain charge carries none.
    let entries: Vec<_> = LedgerReader::open(&path)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let events: Vec<_> = entries.iter().map(|e| e.event().cloned()).collect();
    assert_eq!(events, [Some(step.clone()), None, Some(step.clone())]);
    let EntryKind::Charge { curve, .. } = &entries[0].kind else {
        panic!("a charge")
    };
    assert_eq!(curve, &step.rdp(&orders).unwrap());

    // The whole run as one event: re-accounted at the ledger's orders it
    // gives back the ledger's total.
    let ledger = Ledger::open(&path).unwrap();
    let run = ledger.events().unwrap();
    assert_eq!(
        run,
        DpEvent::Composed(vec![
            step.clone(),
            DpEvent::DataDependent(measured.clone()),
            step.clone()
        ])
    );
    assert_eq!(bits(&run.rdp(&orders).unwrap()), bits(&spent));
    // At finer orders: the events are evaluated exactly there, the plain
    // charge is read from the next recorded order above; ε at δ is no worse.
    let fine = Orders::integers(64).unwrap();
    let again = run.rdp(&fine).unwrap();
    let delta = 1e-6;
    assert!(again.epsilon(delta).unwrap().epsilon <= spent.epsilon(delta).unwrap().epsilon);
    assert_eq!(verify(&path).unwrap().charges, 3);
}

/// `tests/golden/ledger_v2.ledger` was written by the version 2 build (commit
/// a81c99d, before events existed) with `Ledger::create_protecting`: orders
/// [1.5, 2, 4, 16, 64], budget (1, 1e-5), protected set {sha256:aa,
/// sha256:bb}, a charge α/800 labelled `gaussian-0`, the budget raised to
/// (2, 1e-5), the same charge labelled `gaussian-2`.
#[test]
fn version_2_files_are_read_and_appended_to_without_events() {
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ledger_v2.ledger");
    let dir = TempDir::new("v2");
    let path = dir.file("old.ledger");
    std::fs::copy(&golden, &path).unwrap();
    let orders = small_orders();
    assert_eq!(orders.as_slice(), &[1.5, 2.0, 4.0, 16.0, 64.0]);
    let charge = RdpCurve::from_fn(orders.clone(), |a| a / 800.0).unwrap();

    let summary = verify(&path).unwrap();
    assert_eq!(summary.version, 2);
    assert!(summary.created_ms.is_some());
    assert_eq!(
        summary.protected_set,
        Some(ProtectedSet::new(["sha256:aa", "sha256:bb"]).unwrap())
    );
    assert_eq!((summary.records, summary.charges), (3, 2));
    assert_eq!(summary.budget, Some(PrivacyBudget::new(2.0, 1e-5).unwrap()));
    assert_eq!(
        bits(&summary.spent),
        bits(&compose_all(&orders, [&charge, &charge]))
    );
    let labels: Vec<_> = LedgerReader::open(&path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter_map(|e| match e.kind {
            EntryKind::Charge { label, .. } => Some(label),
            _ => None,
        })
        .collect();
    assert_eq!(labels, ["gaussian-0", "gaussian-2"]);

    let mut ledger = Ledger::open(&path).unwrap();
    assert_eq!(ledger.format_version(), 2);
    // No events in this version: refused, nothing written.
    let event = DpEvent::gaussian(10.0).unwrap();
    assert!(matches!(
        ledger.charge_event(&event, "gaussian-3"),
        Err(LedgerError::EventsNeedVersion { version: 2, .. })
    ));
    // Plain charges append in the file's own version.
    ledger.charge(&charge, "gaussian-3").unwrap();
    // Its run, as an event, holds the plain charges as data-dependent curves.
    let run = ledger.events().unwrap();
    assert_eq!(
        run,
        DpEvent::Composed(vec![DpEvent::DataDependent(charge.clone()); 3])
    );
    drop(ledger);
    let bytes = std::fs::read(&path).unwrap();
    let golden_bytes = std::fs::read(&golden).unwrap();
    assert_eq!(&bytes[..golden_bytes.len()], golden_bytes.as_slice());
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!((reopened.format_version(), reopened.charges()), (2, 3));
}
