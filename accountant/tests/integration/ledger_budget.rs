//! Budgets: refusal before writing, persistence across restarts, and budgets
//! below what was already spent.

use crate::ledger_support;

use ledger_support::{TempDir, bits, charge_for, compose_all, small_orders};
use privmix_accountant::{EntryKind, Ledger, LedgerError, PrivacyBudget, RdpCurve};

const DELTA: f64 = 1e-5;

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Charges `charge_for(seq)` until the budget refuses; returns the accepted curves.
fn fill(ledger: &mut Ledger) -> Vec<RdpCurve> {
    let orders = ledger.orders().clone();
    let budget = ledger.budget().expect("budgeted ledger");
    let mut accepted = Vec::new();
    loop {
        let seq = ledger.next_sequence();
        let curve = charge_for(&orders, seq);
        let before = file_len(ledger.path());
        match ledger.charge(&curve, "gaussian") {
            Ok(receipt) => {
                accepted.push(curve);
                let spent = receipt.spent.expect("a budget gives a conversion");
                assert_eq!(spent, ledger.spent_epsilon(budget.delta()).unwrap());
                assert!(spent.epsilon <= budget.epsilon());
            }
            Err(LedgerError::BudgetExceeded {
                budget: b,
                would_spend,
            }) => {
                assert_eq!(b, budget);
                assert!(would_spend.epsilon > budget.epsilon());
                let total = ledger.spent().compose(&curve).unwrap();
                assert_eq!(would_spend, total.epsilon(budget.delta()).unwrap());
                assert_eq!(
                    file_len(ledger.path()),
                    before,
                    "a refused charge wrote bytes"
                );
                assert_eq!(ledger.next_sequence(), seq);
                return accepted;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(accepted.len() < 10_000, "budget never ran out");
    }
}

#[test]
fn a_budget_refuses_the_charge_that_would_exceed_it_even_after_restart() {
    let dir = TempDir::new("budget");
    let path = dir.file("ledger");
    let orders = small_orders();
    let budget = PrivacyBudget::new(1.0, DELTA).unwrap();
    let mut ledger = Ledger::create(&path, orders.clone(), Some(budget)).unwrap();
    let accepted = fill(&mut ledger);
    assert!(
        accepted.len() >= 2,
        "test budget should allow a few charges"
    );
    let spent = bits(ledger.spent());
    assert_eq!(spent, bits(&compose_all(&orders, &accepted)));
    drop(ledger);

    // The budget lives in the file: a restarted process still refuses.
    let mut reopened = Ledger::open(&path).unwrap();
    assert_eq!(reopened.budget(), Some(budget));
    assert_eq!(bits(reopened.spent()), spent);
    assert!(fill(&mut reopened).is_empty());
    // A smaller charge that still fits is accepted.
    assert!(reopened.charge(&RdpCurve::zero(orders), "free").is_ok());
}

#[test]
fn budgets_below_what_was_spent_are_refused() {
    let dir = TempDir::new("below");
    let path = dir.file("ledger");
    let orders = small_orders();
    let mut ledger = Ledger::create(&path, orders.clone(), None).unwrap();
    for s in 0..5 {
        ledger.charge(&charge_for(&orders, s), "gaussian").unwrap();
    }
    let spent = ledger.spent_epsilon(DELTA).unwrap();
    let len = file_len(&path);

    let too_small = PrivacyBudget::new(spent.epsilon.next_down(), DELTA).unwrap();
    match ledger.set_budget(Some(too_small)) {
        Err(LedgerError::BudgetBelowSpent { budget, spent: s }) => {
            assert_eq!(budget, too_small);
            assert_eq!(s, spent);
        }
        other => panic!("expected BudgetBelowSpent, got {other:?}"),
    }
    assert_eq!(file_len(&path), len);
    assert_eq!(ledger.budget(), None);

    // Exactly what was spent is allowed, and recorded durably.
    let exact = PrivacyBudget::new(spent.epsilon, DELTA).unwrap();
    ledger.set_budget(Some(exact)).unwrap();
    assert!(matches!(
        ledger.charge(&charge_for(&orders, 9), "over"),
        Err(LedgerError::BudgetExceeded { .. })
    ));
    drop(ledger);

    // On restart, open_or_create never changes the budget: one below what was
    // spent, or above the recorded one, is a typed error and writes nothing...
    let len = file_len(&path);
    let larger = PrivacyBudget::new(spent.epsilon * 2.0, DELTA).unwrap();
    for asked in [Some(too_small), Some(larger), None] {
        match Ledger::open_or_create(&path, orders.clone(), asked) {
            Err(LedgerError::BudgetDiffers {
                recorded,
                requested,
                ..
            }) => assert_eq!((recorded, requested), (Some(exact), asked)),
            other => panic!("expected BudgetDiffers for {asked:?}, got {other:?}"),
        }
        assert_eq!(file_len(&path), len);
    }
    // ... the recorded one is accepted without writing anything...
    let ledger = Ledger::open_or_create(&path, orders.clone(), Some(exact)).unwrap();
    assert_eq!(ledger.budget(), Some(exact));
    assert_eq!(file_len(&path), len);
    drop(ledger);
    // ... and raising it is an explicit set_budget, kept as a record (the history).
    let mut ledger = Ledger::open(&path).unwrap();
    ledger.set_budget(Some(larger)).unwrap();
    ledger.charge(&charge_for(&orders, 5), "fits now").unwrap();
    let history: Vec<_> = ledger
        .entries()
        .unwrap()
        .filter_map(|e| match e.unwrap().kind {
            EntryKind::Budget(b) => Some(b),
            _ => None,
        })
        .collect();
    assert_eq!(history, [Some(exact), Some(larger)]);
    drop(ledger);
    assert_eq!(Ledger::open(&path).unwrap().budget(), Some(larger));
}

#[test]
fn spent_epsilon_is_available_at_any_delta() {
    let dir = TempDir::new("anydelta");
    let path = dir.file("ledger");
    let orders = small_orders();
    let mut ledger = Ledger::create(
        &path,
        orders.clone(),
        Some(PrivacyBudget::new(5.0, DELTA).unwrap()),
    )
    .unwrap();
    ledger.charge(&charge_for(&orders, 0), "g").unwrap();
    let mut last = f64::INFINITY;
    for delta in [1e-12, 1e-9, 1e-6, 1e-3, 0.1] {
        let e = ledger.spent_epsilon(delta).unwrap();
        assert_eq!(e, ledger.spent().epsilon(delta).unwrap());
        assert!(e.epsilon <= last, "ε must not grow as δ grows");
        last = e.epsilon;
    }
    assert!(matches!(
        ledger.spent_epsilon(0.0),
        Err(LedgerError::Accountant(_))
    ));
}
