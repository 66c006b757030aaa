use std::cell::RefCell;

use super::*;

/// A sink that logs each commit's charges into `log`, and refuses the charges
/// named in `refuse` (or fails the whole commit when `fail`).
struct LoggingSink<'a> {
    log: &'a RefCell<Vec<String>>,
    refuse: Vec<u32>,
    fail: bool,
    short: bool,
}

impl ChargeSink<u32> for LoggingSink<'_> {
    type Error = String;

    fn commit(&mut self, charges: &[u32]) -> Result<Vec<Verdict>, String> {
        self.log.borrow_mut().push(format!("commit {charges:?}"));
        if self.fail {
            return Err("disk full".into());
        }
        let mut verdicts: Vec<Verdict> = charges
            .iter()
            .map(|c| {
                if self.refuse.contains(c) {
                    Verdict::Refused(format!("budget refuses {c}"))
                } else {
                    Verdict::Accepted
                }
            })
            .collect();
        if self.short {
            verdicts.pop();
        }
        Ok(verdicts)
    }
}

fn sink(log: &RefCell<Vec<String>>) -> LoggingSink<'_> {
    LoggingSink {
        log,
        refuse: Vec::new(),
        fail: false,
        short: false,
    }
}

/// Outputs `'a'`, `'b'`, … owing charges 10, 11, …; the second request idle, the
/// fourth refused by its own account, the fifth failed, the sixth owing nothing.
fn step() -> Vec<Drawn<char, u32>> {
    vec![
        Drawn::output('a', Some(10)),
        Drawn::idle(),
        Drawn::output('c', Some(12)),
        Drawn::from_step(Err(MechanismError::ChargeRefused("spent".into())), None),
        Drawn::from_step(Err(MechanismError::EmptyEnsemble), Some(14)),
        Drawn::from_step(Ok('f'), None),
    ]
}

/// Releases every settled output into `log`, as a caller's release stage would.
fn release(log: &RefCell<Vec<String>>, settled: Vec<Settled<char, u32>>) -> Vec<String> {
    settled
        .into_iter()
        .map(|s| match s {
            Settled::Idle => "idle".to_string(),
            Settled::Released { output, charge } => {
                log.borrow_mut().push(format!("release {output}"));
                format!("{output} {charge:?}")
            }
            Settled::Refused(m) => format!("refused: {m}"),
            Settled::Failed(e) => format!("failed: {e:?}"),
            Settled::Unrecorded => "unrecorded".to_string(),
        })
        .collect()
}

#[test]
fn one_commit_covers_the_step_and_precedes_every_release() {
    let log = RefCell::new(Vec::new());
    let committed = commit(step(), &mut sink(&log));
    assert!(committed.error.is_none());
    let settled = release(&log, committed.settled);
    assert_eq!(
        settled,
        [
            "a Some(10)",
            "idle",
            "c Some(12)",
            "refused: spent",
            "failed: EmptyEnsemble",
            "f None",
        ]
    );
    // One commit of the owed charges, in request order, before any release.
    assert_eq!(
        *log.borrow(),
        ["commit [10, 12]", "release a", "release c", "release f"]
    );
}

#[test]
fn a_refusal_drops_only_that_requests_output() {
    let log = RefCell::new(Vec::new());
    let mut refusing = sink(&log);
    refusing.refuse = vec![10];
    let committed = commit(step(), &mut refusing);
    let settled = release(&log, committed.settled);
    assert_eq!(settled[0], "refused: budget refuses 10");
    assert_eq!(settled[2], "c Some(12)");
    assert_eq!(settled[5], "f None");
    assert_eq!(*log.borrow(), ["commit [10, 12]", "release c", "release f"]);
}

#[test]
fn a_failed_commit_releases_nothing_that_owed_a_charge() {
    let log = RefCell::new(Vec::new());
    let mut failing = sink(&log);
    failing.fail = true;
    let committed = commit(step(), &mut failing);
    assert_eq!(committed.error.as_deref(), Some("disk full"));
    let settled = release(&log, committed.settled);
    assert_eq!(settled[0], "unrecorded");
    assert_eq!(settled[2], "unrecorded");
    // What owed nothing was charged already: it is released.
    assert_eq!(settled[5], "f None");
    assert_eq!(*log.borrow(), ["commit [10, 12]", "release f"]);
}

#[test]
fn a_verdict_list_of_the_wrong_length_releases_nothing_that_owed_a_charge() {
    let log = RefCell::new(Vec::new());
    let mut short = sink(&log);
    short.short = true;
    let committed = commit(step(), &mut short);
    let settled = release(&log, committed.settled);
    assert_eq!(settled[0], "unrecorded");
    assert_eq!(settled[2], "unrecorded");
    assert_eq!(*log.borrow(), ["commit [10, 12]", "release f"]);
}

#[test]
fn a_step_that_owes_nothing_does_not_call_the_sink() {
    let log = RefCell::new(Vec::new());
    let (settled, error) = commit_one(Drawn::<char, u32>::output('z', None), &mut sink(&log));
    assert!(error.is_none());
    assert!(matches!(
        settled,
        Settled::Released {
            output: 'z',
            charge: None
        }
    ));
    assert!(log.borrow().is_empty());
    let (settled, _) = commit_one(Drawn::<char, u32>::output('y', None), &mut AlreadyCharged);
    assert!(matches!(settled, Settled::Released { output: 'y', .. }));
    // A charge left pending where none should be is refused, never released.
    let (settled, _) = commit_one(Drawn::output('x', Some(1u32)), &mut AlreadyCharged);
    assert!(matches!(settled, Settled::Refused(_)));
}

#[test]
fn a_charged_step_settles_to_its_output_a_refusal_or_its_failure() {
    assert_eq!(settle_charged(Ok(3)).unwrap(), Some(3));
    let refused = settle_charged::<u32>(Err(MechanismError::ChargeRefused("spent".into())));
    assert_eq!(refused.unwrap(), None);
    assert!(matches!(
        settle_charged::<u32>(Err(MechanismError::EmptyEnsemble)),
        Err(MechanismError::EmptyEnsemble)
    ));
}

#[test]
fn mapping_a_charge_keeps_the_output_sealed_until_the_commit() {
    let log = RefCell::new(Vec::new());
    let drawn = Drawn::<char, &str>::output('m', Some("7")).map_charge(|c| c.parse::<u32>().ok());
    let (settled, _) = commit_one(drawn, &mut sink(&log));
    assert!(matches!(
        settled,
        Settled::Released {
            output: 'm',
            charge: Some(7)
        }
    ));
    assert_eq!(*log.borrow(), ["commit [7]"]);
    // A failed draw stays failed, whatever its charge maps to.
    let failed =
        Drawn::<char, u32>::from_step(Err(MechanismError::EmptyEnsemble), Some(1)).map_charge(Some);
    assert!(matches!(
        commit_one(failed, &mut sink(&log)).0,
        Settled::Failed(_)
    ));
    assert_eq!(log.borrow().len(), 1);
}
