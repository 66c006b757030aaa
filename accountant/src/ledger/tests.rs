//! Unit tests of the byte format and of records that are intact but wrong,
//! which only hand-made bytes can produce.

use std::path::{Path, PathBuf};

use super::format::{self, Frame};
use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("privmix-ledger-unit-{tag}-"))
            .tempdir()
            .unwrap();
        Self(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

fn orders() -> Orders {
    Orders::new(vec![1.5, 2.0, 8.0]).unwrap()
}

fn curve(values: [f64; 3]) -> RdpCurve {
    RdpCurve::new(orders(), values.to_vec()).unwrap()
}

/// Writes a header and the given record payloads, framed.
fn write_ledger(path: &Path, payloads: &[Vec<u8>]) {
    let mut bytes = format::encode_header(&orders(), None, 0, None);
    for p in payloads {
        bytes.extend(format::encode_frame(p));
    }
    std::fs::write(path, bytes).unwrap();
}

fn expect_corrupt(result: Result<Ledger, LedgerError>, needle: &str) {
    match result {
        Err(LedgerError::Corrupt { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "reason {reason:?} lacks {needle:?}"
            )
        }
        other => panic!("expected corruption mentioning {needle:?}, got {other:?}"),
    }
}

fn set() -> ProtectedSet {
    ProtectedSet::new(["sha256:02", "sha256:01", "sha256:02"]).unwrap()
}

#[test]
fn header_round_trips_orders_budget_time_and_set() {
    let budget = PrivacyBudget::new(2.5, 1e-6).unwrap();
    for b in [None, Some(budget)] {
        for s in [
            None,
            Some(set()),
            Some(ProtectedSet::new(Vec::<String>::new()).unwrap()),
        ] {
            let bytes = format::encode_header(&orders(), b, 1_700_000_000_123, s.as_ref());
            let (h, len) = format::read_header(&mut bytes.as_slice(), Path::new("x")).unwrap();
            assert_eq!(h.version, format::VERSION);
            assert_eq!(h.orders, orders());
            assert_eq!(h.initial_budget, b);
            assert_eq!(h.created_ms, Some(1_700_000_000_123));
            assert_eq!(h.protected_set, s);
            assert_eq!(len, bytes.len() as u64);
        }
        // Version 1: no creation time, no set.
        let bytes = format::encode_header_v1(&orders(), b);
        let (h, len) = format::read_header(&mut bytes.as_slice(), Path::new("x")).unwrap();
        assert_eq!((h.version, h.created_ms, h.protected_set), (1, None, None));
        assert_eq!((h.orders, h.initial_budget), (orders(), b));
        assert_eq!(len, bytes.len() as u64);
    }
}

#[test]
fn every_header_byte_is_checked() {
    let budget = Some(PrivacyBudget::new(1.0, 1e-5).unwrap());
    for bytes in [
        format::encode_header(&orders(), budget, 42, Some(&set())),
        format::encode_header(&orders(), budget, 42, None),
        format::encode_header_v1(&orders(), budget),
    ] {
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let got = format::read_header(&mut bad.as_slice(), Path::new("x"));
            assert!(got.is_err(), "flip at header byte {i} went unnoticed");
        }
        for cut in 0..bytes.len() {
            assert!(format::read_header(&mut &bytes[..cut], Path::new("x")).is_err());
        }
    }
}

/// A header whose checksum holds but whose set is malformed (written wrong,
/// not torn) is corruption; versions this build does not know are refused.
#[test]
fn intact_headers_with_bad_sets_or_versions_are_refused() {
    let reframe = |bytes: &[u8], version: u32| {
        // Recompute the checksum over a modified payload.
        let payload = &bytes[26..];
        let mut h = Vec::new();
        h.extend_from_slice(format::MAGIC);
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&h);
        hasher.update(payload);
        h.extend_from_slice(&hasher.finalize().to_le_bytes());
        h.extend_from_slice(payload);
        h
    };
    let good = format::encode_header(&orders(), None, 0, Some(&set()));
    // Members out of canonical order: swap the first two identities' last bytes.
    let mut unsorted = good.clone();
    let first = unsorted.windows(9).position(|w| w == b"sha256:01").unwrap();
    unsorted[first + 8] = b'2';
    unsorted[first + 8 + 11] = b'1';
    let got = format::read_header(&mut reframe(&unsorted, 2).as_slice(), Path::new("x"));
    assert!(
        matches!(&got, Err(LedgerError::Corrupt { reason, .. }) if reason.contains("canonical order")),
        "{got:?}"
    );
    // A trailing byte after the set.
    let mut long = good.clone();
    long.push(0);
    let got = format::read_header(&mut reframe(&long, 2).as_slice(), Path::new("x"));
    assert!(matches!(got, Err(LedgerError::Corrupt { .. })), "{got:?}");
    // Version 5 (from a newer build) and version 0 are refused by number.
    for v in [0, 5] {
        let got = format::read_header(&mut reframe(&good, v).as_slice(), Path::new("x"));
        assert!(
            matches!(got, Err(LedgerError::UnsupportedVersion { found, supported: 4, .. }) if found == v),
            "{got:?}"
        );
    }
}

#[test]
fn charge_payload_round_trips_bit_exact() {
    let values = [0.1 + 0.2, f64::INFINITY, 5e-324];
    let frame = format::encode_frame(&format::charge_payload(7, 1234, &values, "gauß"));
    let Frame::Intact { payload } =
        format::check_frame(&frame, format::max_payload_len(3, format::VERSION))
    else {
        panic!("fresh frame must be intact");
    };
    let entry =
        format::decode_payload(payload, &orders(), format::VERSION, &mut Vec::new()).unwrap();
    assert_eq!((entry.sequence, entry.time_ms), (7, 1234));
    let EntryKind::Charge { curve, label } = entry.kind else {
        panic!("expected a charge")
    };
    assert_eq!(label, "gauß");
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(curve.epsilons()), bits(&values));
}

#[test]
fn every_frame_byte_is_checked() {
    let frame = format::encode_frame(&format::charge_payload(0, 1, &[1.0, 2.0, 3.0], "m"));
    for i in 0..frame.len() {
        for bit in 0..8 {
            let mut bad = frame.clone();
            bad[i] ^= 1 << bit;
            assert!(
                matches!(
                    format::check_frame(&bad, format::max_payload_len(3, format::VERSION)),
                    Frame::Damaged(_)
                ),
                "flip of bit {bit} in byte {i} went unnoticed"
            );
        }
    }
}

#[test]
fn intact_record_with_wrong_sequence_is_corruption() {
    let dir = TempDir::new("seq");
    let path = dir.file("l");
    // Sequence 0, then 2: the checksum holds, the order does not.
    let p0 = format::charge_payload(0, 0, &[1.0, 1.0, 1.0], "a");
    let p2 = format::charge_payload(2, 0, &[1.0, 1.0, 1.0], "b");
    write_ledger(&path, &[p0.clone(), p2]);
    expect_corrupt(Ledger::open(&path), "sequence number 2, expected 1");
    // Even as the last record it is not a torn write.
    write_ledger(&path, &[p0.clone(), p0]);
    expect_corrupt(Ledger::open(&path), "sequence number 0, expected 1");
}

#[test]
fn intact_record_with_bad_contents_is_corruption() {
    let dir = TempDir::new("contents");
    let path = dir.file("l");
    let nan = format::charge_payload(0, 0, &[1.0, f64::NAN, 1.0], "a");
    write_ledger(&path, &[nan]);
    expect_corrupt(Ledger::open(&path), "invalid");
    let mut unknown = format::charge_payload(0, 0, &[1.0, 1.0, 1.0], "a");
    unknown[0] = 9;
    write_ledger(&path, &[unknown]);
    expect_corrupt(Ledger::open(&path), "unknown record kind 9");
    let mut bad_utf8 = format::charge_payload(0, 0, &[1.0, 1.0, 1.0], "ab");
    *bad_utf8.last_mut().unwrap() = 0xff;
    write_ledger(&path, &[bad_utf8]);
    expect_corrupt(Ledger::open(&path), "UTF-8");
    let mut budget = format::budget_payload(0, 0, Some(PrivacyBudget::new(1.0, 0.5).unwrap()));
    let delta_at = budget.len() - 8;
    budget[delta_at..].copy_from_slice(&2.0f64.to_le_bytes());
    write_ledger(&path, &[budget]);
    expect_corrupt(Ledger::open(&path), "budget");
}

#[test]
fn garbage_tail_within_one_record_is_torn_beyond_it_corrupt() {
    let dir = TempDir::new("garbage");
    let path = dir.file("l");
    let good = format::charge_payload(0, 0, &[1.0, 2.0, 3.0], "a");
    let max_frame = format::FRAME_PREFIX_LEN + format::max_payload_len(3, format::VERSION);
    for (fill, len, torn) in [
        (0u8, max_frame, true),
        (0xa5, 9, true),
        (0, max_frame + 1, false),
    ] {
        write_ledger(&path, std::slice::from_ref(&good));
        let clean_len = std::fs::metadata(&path).unwrap().len();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend(std::iter::repeat_n(fill, len));
        std::fs::write(&path, bytes).unwrap();
        let opened = Ledger::open(&path);
        if torn {
            let ledger = opened.unwrap();
            assert_eq!(ledger.charges(), 1);
            assert_eq!(ledger.recovered_torn_bytes(), len as u64);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), clean_len);
        } else {
            expect_corrupt(opened, "more data follows");
        }
    }
    // A torn write whose length field is garbage, followed by an intact record.
    let mut bytes = format::encode_header(&orders(), None, 0, None);
    bytes.extend(format::encode_frame(&good));
    bytes.extend([0xff; 5]);
    bytes.extend(format::encode_frame(&format::charge_payload(
        1, 0, &[1.0; 3], "b",
    )));
    std::fs::write(&path, bytes).unwrap();
    expect_corrupt(Ledger::open(&path), "followed by an intact record");
}

#[test]
fn budgets_are_validated() {
    assert!(PrivacyBudget::new(1.0, 1e-5).is_ok());
    assert!(PrivacyBudget::new(0.0, 0.5).is_ok());
    for (eps, delta) in [
        (-1.0, 1e-5),
        (f64::NAN, 1e-5),
        (f64::INFINITY, 1e-5),
        (1.0, 0.0),
        (1.0, 1.0),
        (1.0, f64::NAN),
    ] {
        assert!(
            matches!(
                PrivacyBudget::new(eps, delta),
                Err(AccountantError::InvalidParameter { .. })
            ),
            "({eps}, {delta}) accepted"
        );
    }
}

#[test]
fn labels_over_the_limit_are_refused_without_writing() {
    let dir = TempDir::new("label");
    let path = dir.file("l");
    let mut ledger = Ledger::create(&path, orders(), None).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let long = "x".repeat(MAX_LABEL_BYTES + 1);
    assert!(matches!(
        ledger.charge(&curve([1.0; 3]), &long),
        Err(LedgerError::LabelTooLong {
            len: 1025,
            max: 1024
        })
    ));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let longest = "y".repeat(MAX_LABEL_BYTES);
    ledger.charge(&curve([1.0; 3]), &longest).unwrap();
    drop(ledger);
    assert_eq!(Ledger::open(&path).unwrap().charges(), 1);
}

// ProtectedSet (ledger/protected.rs, with `new` in ledger.rs).

#[test]
fn order_does_not_matter_repeats_do() {
    let a = ProtectedSet::new(["sha256:bb", "sha256:aa"]).unwrap();
    let b = ProtectedSet::new(["sha256:aa", "sha256:bb"]).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.members(), ["sha256:aa", "sha256:bb"]);
    let twice = ProtectedSet::new(["sha256:aa", "sha256:aa", "sha256:bb"]).unwrap();
    assert_ne!(a, twice);
    assert_eq!(twice.missing_from(&a), ["sha256:aa"]);
    assert!(a.missing_from(&twice).is_empty());
    assert_eq!(a.to_string(), "2 members [sha256:aa, sha256:bb]");
}

#[test]
fn bad_identities_are_typed_errors() {
    for bad in ["", "has space", "tab\t", "é"] {
        assert!(
            matches!(
                ProtectedSet::new([bad]),
                Err(LedgerError::BadProtectedSet(_))
            ),
            "{bad:?} accepted"
        );
    }
    let long = "x".repeat(MAX_MEMBER_ID_BYTES + 1);
    assert!(matches!(
        ProtectedSet::new([long]),
        Err(LedgerError::BadProtectedSet(_))
    ));
    assert!(ProtectedSet::new(["x".repeat(MAX_MEMBER_ID_BYTES)]).is_ok());
    assert!(ProtectedSet::new(Vec::<String>::new()).unwrap().is_empty());
}

/// A small event whose encoding holds every kind of field.
fn an_event() -> DpEvent {
    DpEvent::Composed(vec![
        DpEvent::gaussian(2.0)
            .unwrap()
            .poisson_sampled(0.1)
            .unwrap(),
        DpEvent::randomized_response(0.5, 3).unwrap(),
        DpEvent::DataDependent(curve([0.1, 0.2, 0.3])),
    ])
}

fn event_payload(sequence: u64, event: &DpEvent) -> Vec<u8> {
    let mut encoded = Vec::new();
    super::event_codec::encode(event, &mut encoded);
    let values = event.rdp(&orders()).unwrap();
    format::event_charge_payload(sequence, 5, values.epsilons(), "ev", &encoded)
}

#[test]
fn event_charge_payload_round_trips() {
    let event = an_event();
    let payload = event_payload(3, &event);
    let entry =
        format::decode_payload(&payload, &orders(), format::VERSION, &mut Vec::new()).unwrap();
    assert_eq!(entry.event(), Some(&event));
    let EntryKind::Charge { curve, label } = &entry.kind else {
        panic!("expected a charge")
    };
    assert_eq!(
        (curve, label.as_str()),
        (&event.rdp(&orders()).unwrap(), "ev")
    );
    // Older versions have no such record kind.
    for v in [1, 2] {
        let err = format::decode_payload(&payload, &orders(), v, &mut Vec::new()).unwrap_err();
        assert!(err.contains("unknown record kind 3"), "{err}");
    }
}

#[test]
fn intact_event_charges_with_bad_events_are_corruption() {
    let dir = TempDir::new("events");
    let path = dir.file("l");
    let good = event_payload(0, &an_event());
    let event_at = good.len() - {
        let mut e = Vec::new();
        super::event_codec::encode(&an_event(), &mut e);
        e.len()
    };
    // An unknown tag.
    let mut bad = good.clone();
    bad[event_at] = 200;
    write_ledger(&path, &[bad]);
    expect_corrupt(Ledger::open(&path), "unknown event tag 200");
    // An event length that disagrees with the record's.
    let mut bad = good.clone();
    bad[event_at - 4] ^= 1;
    write_ledger(&path, &[bad]);
    expect_corrupt(Ledger::open(&path), "event length");
    // A parameter out of range: the Gaussian's σ (right after tags 7, 4 and q).
    let mut bad = good.clone();
    let sigma_at = event_at + 1 + 4 + 1 + 8 + 1;
    bad[sigma_at..sigma_at + 8].copy_from_slice(&(-2.0f64).to_le_bytes());
    write_ledger(&path, &[bad]);
    expect_corrupt(Ledger::open(&path), "sigma");
    // The same record is corrupt in a version 2 file, which has no such kind.
    let mut bytes = format::encode_header_v2(&orders());
    bytes.extend(format::encode_frame(&good));
    std::fs::write(&path, bytes).unwrap();
    expect_corrupt(Ledger::open(&path), "unknown record kind 3");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever an intact event charge's event bytes say (random edits, the
    /// checksum recomputed), reading it gives a valid event or a corruption
    /// error, never a panic or an event that fails its own checks.
    #[test]
    fn mutated_event_bytes_read_back_valid_or_corrupt(
        edits in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
        cut in 0usize..8,
    ) {
        let good = event_payload(0, &an_event());
        let mut encoded = Vec::new();
        super::event_codec::encode(&an_event(), &mut encoded);
        let event_at = good.len() - encoded.len();
        let mut event = encoded.clone();
        for (at, byte) in edits {
            let i = at % event.len();
            event[i] = byte;
        }
        event.truncate(event.len() - cut.min(event.len() - 1));
        let mut payload = good[..event_at - 4].to_vec();
        payload.extend_from_slice(&(event.len() as u32).to_le_bytes());
        payload.extend_from_slice(&event);
        match format::decode_payload(&payload, &orders(), format::VERSION, &mut Vec::new()) {
            Ok(entry) => {
                let e = entry.event().expect("an event charge has an event");
                proptest::prop_assert!(e.validate().is_ok());
            }
            Err(reason) => proptest::prop_assert!(reason.starts_with("event charge")),
        }
    }
}

#[test]
fn events_are_charged_recorded_and_refused_on_old_files() {
    let dir = TempDir::new("charge-event");
    let path = dir.file("l");
    let mut ledger = Ledger::create(&path, orders(), None).unwrap();
    let event = an_event();
    ledger.charge_event(&event, "ev").unwrap();
    ledger.charge(&curve([0.5, 0.5, 0.5]), "plain").unwrap();
    assert_eq!(
        ledger.spent(),
        &event
            .rdp(&orders())
            .unwrap()
            .compose(&curve([0.5; 3]))
            .unwrap()
    );
    // An invalid event writes nothing.
    let bad = DpEvent::Laplace { scale: 0.0 };
    assert!(matches!(
        ledger.charge_event(&bad, "bad"),
        Err(LedgerError::Accountant(AccountantError::InvalidParameter {
            name: "scale",
            ..
        }))
    ));
    // An event too large for a record writes nothing.
    let huge = DpEvent::Composed(vec![DpEvent::NoOp; MAX_EVENT_BYTES]);
    assert!(matches!(
        ledger.charge_event(&huge, "huge"),
        Err(LedgerError::EventTooLarge { .. })
    ));
    assert_eq!(ledger.next_sequence(), 2);
    assert_eq!(
        ledger.events().unwrap(),
        DpEvent::Composed(vec![event, DpEvent::DataDependent(curve([0.5; 3]))])
    );
    drop(ledger);
    // A version 2 file refuses event charges, with nothing written.
    let old = dir.file("v2");
    std::fs::write(&old, format::encode_header_v2(&orders())).unwrap();
    let mut ledger = Ledger::open(&old).unwrap();
    assert!(matches!(
        ledger.charge_event(&DpEvent::NoOp, "x"),
        Err(LedgerError::EventsNeedVersion { version: 2, .. })
    ));
    assert_eq!(ledger.next_sequence(), 0);
}

/// The charges of a step: `count` charges of `c` labelled `label`, one event
/// charge, and then `count` more of `c`.
fn step_charges<'a>(c: &'a RdpCurve, event: &'a DpEvent, count: usize) -> Vec<StepCharge<'a>> {
    let mut charges = vec![
        StepCharge {
            cost: StepCost::Curve(c),
            label: "tenant=a;pmixed",
        };
        count
    ];
    charges.push(StepCharge {
        cost: StepCost::Event(event),
        label: "ev",
    });
    charges.extend(vec![
        StepCharge {
            cost: StepCost::Curve(c),
            label: "tenant=b;pmixed",
        };
        count
    ]);
    charges
}

#[test]
fn a_step_is_one_write_and_reads_back_as_its_charges_in_order() {
    let dir = TempDir::new("step");
    let path = dir.file("l");
    let c = curve([0.1, 0.2, 0.7]);
    let event = an_event();
    let mut ledger = Ledger::create(&path, orders(), None).unwrap();
    // The same charges one by one, into a second ledger, for the reference total.
    let reference_path = dir.file("reference");
    let mut reference = Ledger::create(&reference_path, orders(), None).unwrap();
    for _ in 0..3 {
        let charges = step_charges(&c, &event, 5);
        let receipt = ledger.charge_step(&charges).unwrap();
        assert_eq!(receipt.accepted, vec![true; 11]);
        assert_eq!(receipt.records, 1);
        for ch in &charges {
            match ch.cost {
                StepCost::Curve(c) => reference.charge(c, ch.label).map(drop),
                StepCost::Event(e) => reference.charge_event(e, ch.label).map(drop),
            }
            .unwrap();
        }
    }
    assert_eq!(ledger.spent(), reference.spent());
    assert_eq!((ledger.charges(), ledger.next_sequence()), (33, 3));
    // Two definitions (the curve and the event), made by the first step only: the
    // later steps are a few bytes per run.
    let len = std::fs::metadata(&path).unwrap().len();
    let reference_len = std::fs::metadata(&reference_path).unwrap().len();
    assert!(len * 4 < reference_len, "{len} vs {reference_len}");
    drop(ledger);
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.spent(), reference.spent());
    assert_eq!(reopened.charges(), 33);
    assert_eq!(reopened.definitions.len(), 2);
    let summary = verify(&path).unwrap();
    assert_eq!((summary.charges, &summary.spent), (33, reference.spent()));
    // Read back as runs, in order, and as one event.
    let entries: Vec<LedgerEntry> = reopened.entries().unwrap().map(Result::unwrap).collect();
    let EntryKind::Step(runs) = &entries[1].kind else {
        panic!("{:?}", entries[1].kind)
    };
    let shape: Vec<(&str, u32)> = runs.iter().map(|r| (r.label.as_str(), r.count)).collect();
    assert_eq!(
        shape,
        [("tenant=a;pmixed", 5), ("ev", 1), ("tenant=b;pmixed", 5)]
    );
    assert_eq!(runs[1].event.as_ref(), Some(&event));
    let DpEvent::Composed(events) = reopened.events().unwrap() else {
        panic!()
    };
    assert_eq!(events.len(), 9);
    assert_eq!(
        events[0],
        DpEvent::SelfComposed {
            event: Box::new(DpEvent::DataDependent(c.clone())),
            count: 5
        }
    );
}

#[test]
fn a_step_drops_only_the_charges_the_budget_cannot_pay() {
    let dir = TempDir::new("step-refuse");
    let path = dir.file("l");
    let budget = PrivacyBudget::new(3.0, 1e-5).unwrap();
    let mut ledger = Ledger::create(&path, orders(), Some(budget)).unwrap();
    let small = curve([0.01, 0.02, 0.05]);
    let big = curve([10.0, 10.0, 10.0]);
    let step = |c: &[&RdpCurve]| -> Vec<bool> {
        let charges: Vec<StepCharge<'_>> = c
            .iter()
            .map(|c| StepCharge {
                cost: StepCost::Curve(c),
                label: "x",
            })
            .collect();
        ledger_step(&path, &charges)
    };
    // An empty step writes nothing.
    assert_eq!(ledger.charge_step(&[]).unwrap().records, 0);
    drop(ledger);
    // The big charge alone is refused; the small ones around it are recorded.
    assert_eq!(step(&[&small, &big, &small]), [true, false, true]);
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.charges(), 2);
    assert_eq!(reopened.spent(), &small.compose(&small).unwrap());
    drop(reopened);
    // A step of refusals only writes nothing.
    let before = std::fs::metadata(&path).unwrap().len();
    assert_eq!(step(&[&big]), [false]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
    // A bad label fails the whole step before anything is written.
    let long = "x".repeat(MAX_LABEL_BYTES + 1);
    let mut ledger = Ledger::open(&path).unwrap();
    let bad = [
        StepCharge {
            cost: StepCost::Curve(&small),
            label: "ok",
        },
        StepCharge {
            cost: StepCost::Curve(&small),
            label: &long,
        },
    ];
    assert!(matches!(
        ledger.charge_step(&bad),
        Err(LedgerError::LabelTooLong { .. })
    ));
    assert_eq!(ledger.charges(), 2);
}

/// One step on the ledger at `path`, opened for it.
fn ledger_step(path: &Path, charges: &[StepCharge<'_>]) -> Vec<bool> {
    Ledger::open(path)
        .unwrap()
        .charge_step(charges)
        .unwrap()
        .accepted
}

#[test]
fn large_steps_split_into_records_and_old_files_get_charge_records() {
    let dir = TempDir::new("step-large");
    let path = dir.file("l");
    let mut ledger = Ledger::create(&path, orders(), None).unwrap();
    // More distinct labels than a record holds runs, more distinct curves than it
    // makes definitions.
    let curves: Vec<RdpCurve> = (0..10)
        .map(|i| curve([0.1, 0.2, 0.3 + f64::from(i)]))
        .collect();
    let labels: Vec<String> = (0..150).map(|i| format!("tenant=t{i};m")).collect();
    let charges: Vec<StepCharge<'_>> = labels
        .iter()
        .enumerate()
        .map(|(i, label)| StepCharge {
            cost: StepCost::Curve(&curves[i % curves.len()]),
            label,
        })
        .collect();
    let receipt = ledger.charge_step(&charges).unwrap();
    assert!(receipt.records >= 3, "{receipt:?}");
    let mut expected = RdpCurve::zero(orders());
    for ch in &charges {
        let StepCost::Curve(c) = ch.cost else {
            panic!()
        };
        expected = expected.compose(c).unwrap();
    }
    assert_eq!(ledger.spent(), &expected);
    drop(ledger);
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!((reopened.spent(), reopened.charges()), (&expected, 150));
    let labels_read: Vec<String> = reopened
        .entries()
        .unwrap()
        .flat_map(|e| match e.unwrap().kind {
            EntryKind::Step(runs) => runs.into_iter().map(|r| r.label).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(labels_read, labels);
    // A version 2 file is appended to with charge records, in one write.
    let old = dir.file("v2");
    std::fs::write(&old, format::encode_header_v2(&orders())).unwrap();
    let mut ledger = Ledger::open(&old).unwrap();
    let event = an_event();
    let receipt = ledger
        .charge_step(&step_charges(&curves[0], &event, 2))
        .unwrap();
    assert_eq!(receipt.records, 5);
    drop(ledger);
    let reopened = Ledger::open(&old).unwrap();
    assert_eq!((reopened.format_version(), reopened.charges()), (2, 5));
}

#[test]
fn a_file_keeps_at_most_max_definitions_and_charges_on_past_it() {
    let dir = TempDir::new("step-defs");
    let path = dir.file("l");
    let mut ledger = Ledger::create(&path, orders(), None).unwrap();
    let curves: Vec<RdpCurve> = (0..MAX_DEFINITIONS + 3)
        .map(|i| curve([0.0, 0.0, 1e-3 * (i as f64 + 1.0)]))
        .collect();
    let mut expected = RdpCurve::zero(orders());
    for c in &curves {
        ledger
            .charge_step(&[StepCharge {
                cost: StepCost::Curve(c),
                label: "d",
            }])
            .unwrap();
        expected = expected.compose(c).unwrap();
    }
    assert_eq!(ledger.definitions.len(), MAX_DEFINITIONS);
    drop(ledger);
    let reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.spent(), &expected);
    assert_eq!(reopened.definitions.len(), MAX_DEFINITIONS);
}

#[test]
fn step_records_naming_unknown_definitions_are_corruption() {
    let dir = TempDir::new("step-bad");
    let path = dir.file("l");
    let run = format::RunRef {
        definition: 0,
        count: 1,
        label: "x",
    };
    write_ledger(&path, &[format::step_payload(0, 0, &[], &[run])]);
    expect_corrupt(Ledger::open(&path), "not made before it");
    let zero = format::RunRef { count: 0, ..run };
    let def = format::DefinitionBytes::new(&[0.1, 0.2, 0.3], None);
    write_ledger(&path, &[format::step_payload(0, 0, &[&def], &[zero])]);
    expect_corrupt(Ledger::open(&path), "charges nothing");
    write_ledger(&path, &[format::step_payload(0, 0, &[&def], &[])]);
    expect_corrupt(Ledger::open(&path), "no run");
}
