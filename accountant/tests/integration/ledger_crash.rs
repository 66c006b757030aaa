//! Real crashes: a child process charges in a loop and is killed (SIGKILL on
//! Unix) at arbitrary points; the reopened ledger must hold every charge the
//! child had acknowledged. Also the lock across processes.
//!
//! The child is this test binary itself, re-run with `--exact --ignored` on
//! one of the `child_*` helper tests and an environment variable naming the
//! ledger; the helpers do nothing when run without it.

use crate::ledger_support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use ledger_support::{TempDir, bits, charge_for, compose_all, label_for, small_orders};
use privmix_accountant::{EntryKind, Ledger, LedgerError, RdpCurve, verify};

const LEDGER_ENV: &str = "PRIVMIX_LEDGER_TEST_CHILD_PATH";
/// Held by each test here for its whole run. A `flock` belongs to the open
/// file, which a child forked by a *concurrent* test shares until its `exec`
/// closes it; running these tests one at a time keeps such a momentary copy
/// from making a released ledger look locked.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The child stops by itself after this many charges, should nobody kill it.
const CHILD_MAX_CHARGES: u64 = 20_000;

#[test]
#[ignore = "helper: the crash test runs it as a child process"]
fn child_writer() {
    let Ok(path) = std::env::var(LEDGER_ENV) else {
        return;
    };
    let orders = small_orders();
    let mut ledger = Ledger::open_or_create(&path, orders.clone(), None).unwrap();
    let mut out = std::io::stdout().lock();
    for _ in 0..CHILD_MAX_CHARGES {
        let seq = ledger.next_sequence();
        let receipt = ledger
            .charge(&charge_for(&orders, seq), &label_for(seq))
            .unwrap();
        // Acknowledge only after Ok: this line stands for a released token.
        writeln!(out, "ACK {}", receipt.sequence).unwrap();
        out.flush().unwrap();
    }
}

#[test]
#[ignore = "helper: the lock test runs it as a child process"]
fn child_lock_probe() {
    let Ok(path) = std::env::var(LEDGER_ENV) else {
        return;
    };
    match Ledger::open(&path) {
        Err(LedgerError::Locked(_)) => println!("PROBE locked"),
        Ok(_) => println!("PROBE opened"),
        Err(e) => println!("PROBE error {e}"),
    }
}

fn spawn_child(test: &str, ledger: &Path) -> (Child, BufReader<ChildStdout>) {
    // libtest names a test by its path below the crate root: `ledger_crash::<test>`.
    let name = format!("ledger_crash::{test}");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            name.as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LEDGER_ENV, ledger)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// The sequence number of an `ACK` line (libtest may print the test's name
/// before the first one, on the same line).
fn ack(line: &str) -> Option<u64> {
    let (_, seq) = line.split_once("ACK ")?;
    Some(seq.trim().parse().unwrap())
}

#[test]
fn killing_a_writer_mid_stream_never_loses_an_acknowledged_charge() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("crash");
    let path = dir.file("ledger");
    let orders = small_orders();
    let mut acknowledged = BTreeSet::new();
    // Kill after a varying number of acknowledgements, so the kill lands at
    // different points of the write/sync/print cycle; later rounds reopen a
    // ledger that earlier crashes left behind.
    for (round, kill_after) in [1usize, 7, 30, 3, 60, 12, 45, 2].into_iter().enumerate() {
        let (mut child, mut stdout) = spawn_child("child_writer", &path);
        let mut seen = 0;
        let mut line = String::new();
        while seen < kill_after {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "child ended early"
            );
            if let Some(seq) = ack(&line) {
                acknowledged.insert(seq);
                seen += 1;
                if round == 0 && seen == 1 {
                    // The running writer holds the lock; readers still read.
                    assert!(matches!(Ledger::open(&path), Err(LedgerError::Locked(_))));
                    assert!(
                        verify(&path).is_ok(),
                        "reading a live ledger must not see corruption"
                    );
                }
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // Lines already in the pipe were acknowledged before the kill too.
        for line in stdout.lines() {
            acknowledged.extend(ack(&line.unwrap()));
        }

        let ledger = Ledger::open(&path).unwrap();
        let mut present = BTreeSet::new();
        let mut curves: Vec<RdpCurve> = Vec::new();
        for entry in ledger.entries().unwrap() {
            let entry = entry.unwrap();
            let EntryKind::Charge { curve, label } = entry.kind else {
                panic!("only charges were written");
            };
            assert_eq!(label, label_for(entry.sequence));
            assert_eq!(bits(&curve), bits(&charge_for(&orders, entry.sequence)));
            present.insert(entry.sequence);
            curves.push(curve);
        }
        let missing: Vec<_> = acknowledged.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged charges lost: {missing:?}"
        );
        // At most the one charge synced but not yet printed is extra.
        let unacknowledged = present.len() - acknowledged.len();
        assert!(
            unacknowledged <= 1,
            "round {round}: {unacknowledged} extra charges"
        );
        // Never under-counts: the total covers every acknowledged charge.
        let acked_total = compose_all(
            &orders,
            &acknowledged
                .iter()
                .map(|&s| charge_for(&orders, s))
                .collect::<Vec<_>>(),
        );
        for (have, need) in ledger.spent().epsilons().iter().zip(acked_total.epsilons()) {
            assert!(
                have >= need,
                "round {round}: spent {have} < acknowledged {need}"
            );
        }
        assert_eq!(bits(ledger.spent()), bits(&compose_all(&orders, &curves)));
        drop(ledger);
        // Make the acknowledged set match the file for the next round.
        acknowledged = present;
    }
    assert!(acknowledged.len() > 100);
}

#[test]
fn another_process_cannot_open_a_held_ledger() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("xlock");
    let path = dir.file("ledger");
    let probe = |path: &Path| {
        let (mut child, stdout) = spawn_child("child_lock_probe", path);
        // Read to the end, so the child never writes into a closed pipe.
        let lines: Vec<String> = stdout.lines().map(Result::unwrap).collect();
        let verdict = lines
            .iter()
            .find_map(|l| l.find("PROBE ").map(|at| l[at..].trim().to_owned()));
        assert!(child.wait().unwrap().success());
        verdict.expect("the probe printed its verdict")
    };
    let ledger = Ledger::create(&path, small_orders(), None).unwrap();
    assert_eq!(probe(&path), "PROBE locked");
    drop(ledger);
    assert_eq!(probe(&path), "PROBE opened");
}
