//! `privmix ledger …` on the command line: `show --json` of a ledger whose charges name
//! tenants, and PostgreSQL specs whose password never reaches the output. (The stores
//! themselves, PostgreSQL included, are tested beside their code in
//! `src/ledger_store/tests.rs`.)

use std::path::Path;

use privmix_accountant::{Ledger, Orders, PrivacyBudget, ProtectedSet, RdpCurve};
use serde_json::Value;

use crate::support::{TempDir, privmix};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A ledger with two charges of tenant `alice`, one of `bob` and one of no tenant, in
/// the label format the file store writes (`tenant=<name>;<label>`).
fn ledger_with_tenants(path: &Path) -> RdpCurve {
    let orders = Orders::integers(16).unwrap();
    let budget = PrivacyBudget::new(5.0, 1e-5).unwrap();
    let set = ProtectedSet::new(["sha256:00"]).unwrap();
    let mut ledger = Ledger::create_protecting(path, orders.clone(), Some(budget), set).unwrap();
    let step = RdpCurve::from_fn(orders, |a| a / 200.0).unwrap();
    for label in [
        "tenant=alice;step 0",
        "tenant=bob;step 0",
        "tenant=alice;step 1",
        "cli run",
    ] {
        ledger.charge(&step, label).unwrap();
    }
    step
}

#[test]
fn show_json_reports_tenants_and_export_splits_labels() {
    let dir = TempDir::new("json");
    let path = dir.join("ledger");
    let step = ledger_with_tenants(&path);
    let p = path.to_str().unwrap();

    let out = privmix(&["ledger", "show", "--json", p]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object: {lines:?}");
    let v: Value = serde_json::from_str(lines[0]).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "budget",
            "charges",
            "created",
            "created_ms",
            "format",
            "history",
            "initial_budget",
            "leases",
            "ledger",
            "left",
            "orders",
            "protected_set",
            "spent",
            "tenants"
        ]
    );
    assert_eq!(v["charges"], 4);
    assert_eq!(v["format"]["kind"], "file");
    assert_eq!(v["format"]["version"], 4);
    assert_eq!(v["protected_set"][0], "sha256:00");
    assert_eq!(v["budget"]["epsilon"], 5.0);
    assert_eq!(v["tenants"]["alice"]["charges"], 2);
    assert_eq!(v["tenants"]["bob"]["charges"], 1);
    let alice = step.compose(&step).unwrap().epsilon(1e-5).unwrap().epsilon;
    assert_eq!(
        v["tenants"]["alice"]["spent"]["epsilon"].as_f64(),
        Some(alice)
    );
    assert_eq!(v["spent"]["delta"].as_f64(), Some(1e-5));

    // --delta moves every reported ε, the tenants' too.
    let out = privmix(&["ledger", "show", "--json", "--delta", "1e-3", p]);
    let w: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["tenants"]["bob"]["spent"]["delta"].as_f64(), Some(1e-3));
    assert!(w["spent"]["epsilon"].as_f64() < v["spent"]["epsilon"].as_f64());

    let out = privmix(&["ledger", "show", p]);
    let shown = text(&out.stdout);
    assert!(shown.contains("tenants  2"), "{shown}");
    assert!(shown.contains("alice: 2 charges"), "{shown}");

    let out = privmix(&["ledger", "export", p]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let records: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records[1]["tenant"], "alice");
    assert_eq!(records[1]["label"], "step 0");
    assert_eq!(records[4]["tenant"], Value::Null);
    assert_eq!(records[4]["label"], "cli run");
}

#[test]
fn postgres_specs_never_print_the_password() {
    // Nothing listens on port 1: each command fails on the connection, naming the
    // store without its password.
    let url = "postgres://alice:hunter2@127.0.0.1:1/ledgers?connect_timeout=5";
    for args in [
        vec!["ledger", "show", url],
        vec!["ledger", "show", "--json", url],
        vec!["ledger", "verify", url],
        vec!["ledger", "export", url],
        vec!["ledger", "raise", url, "--epsilon", "2"],
    ] {
        let out = privmix(&args);
        assert!(!out.status.success(), "{args:?}");
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!all.contains("hunter2"), "{args:?}: {all}");
        assert!(
            all.contains("postgresql://alice@127.0.0.1:1/ledgers"),
            "{args:?}: {all}"
        );
    }
    // A URL that does not parse is not repeated.
    let out = privmix(&["ledger", "show", "postgresql://alice:hunter2@host:port/db"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("bad ledger spec") && !err.contains("hunter2"),
        "{err}"
    );
}
