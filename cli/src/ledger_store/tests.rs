//! Tests of both stores: tenant accounting, refusals that write nothing, the
//! PostgreSQL ledger's creation, checks and raise, replicas charging concurrently, and
//! replicas dying inside a charge. The PostgreSQL tests run against
//! `PRIVMIX_TEST_POSTGRES` or a private cluster (see `test_cluster.rs`), each in a
//! schema of its own.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::{Arc, Barrier};

use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet, RdpCurve};
use privmix_mechanisms::{Account, MechanismError};

use super::file::FileStore;
use super::postgres::{describe_config, parse_url, test_hooks};
use super::step::Cost;
use super::test_cluster::{TestSchema, server_url};
use super::*;

/// A fresh folder under the system temp dir, removed at drop.
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("privmix-store-{tag}-"))
            .tempdir()
            .unwrap();
        Self(dir)
    }

    fn join(&self, p: &str) -> PathBuf {
        self.0.path().join(p)
    }
}

/// Runs `f` again while it fails because the ledger file is locked, for up to 10 s.
///
/// A ledger's lock belongs to its open file, which a child process forked by another
/// test (the PostgreSQL tests start servers and processes) shares until its `exec`: a
/// reopen right after a drop can find the lock still held for that moment.
fn unlocked<T, E: std::fmt::Display>(mut f: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match f() {
            Err(e)
                if e.to_string().contains("is locked") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn orders() -> Orders {
    Orders::integers(32).unwrap()
}

/// The Gaussian mechanism's curve, ε(α) = α / (2σ²) (Mironov, Rényi Differential Privacy,
/// arXiv:1702.07476, Prop. 7).
fn gaussian(orders: &Orders, sigma: f64) -> RdpCurve {
    RdpCurve::from_fn(orders.clone(), |a| a / (2.0 * sigma * sigma)).unwrap()
}

fn set(ids: &[&str]) -> ProtectedSet {
    ProtectedSet::new(ids.iter().copied()).unwrap()
}

fn budget(eps: f64) -> PrivacyBudget {
    PrivacyBudget::new(eps, 1e-5).unwrap()
}

fn tenant(name: &str, eps: Option<f64>) -> Tenant {
    Tenant {
        name: name.into(),
        budget: eps.map(budget),
    }
}

fn eps(curve: &RdpCurve) -> f64 {
    curve.epsilon(1e-5).unwrap().epsilon
}

/// Composes `curves` in order from zero (what a store's spending must equal).
fn compose_all<'a>(orders: &Orders, curves: impl IntoIterator<Item = &'a RdpCurve>) -> RdpCurve {
    curves
        .into_iter()
        .fold(RdpCurve::zero(orders.clone()), |acc, c| {
            acc.compose(c).unwrap()
        })
}

/// Charges `store` for `t` until a refusal, checking nothing is recorded by it;
/// returns the accepted curves.
fn charge_until_refused(
    store: &mut dyn LedgerStore,
    t: Option<&Tenant>,
    curve: &RdpCurve,
) -> (Vec<RdpCurve>, StoreError) {
    let mut accepted = Vec::new();
    loop {
        match store.charge_receipt(t, curve, "step") {
            Ok(_) => accepted.push(curve.clone()),
            Err(e) => return (accepted, e),
        }
        assert!(accepted.len() < 10_000, "no refusal");
    }
}

#[test]
fn file_store_tenant_spending_survives_reopen() {
    let dir = TempDir::new("tenants");
    let path = dir.join("ledger");
    let o = orders();
    let alice = tenant("alice", Some(1.0));
    let bob = tenant("bob@example.org", None);
    let (a, b) = (gaussian(&o, 8.0), gaussian(&o, 5.0));
    let mut alice_curves = Vec::new();
    let mut all = Vec::new();
    {
        let mut store =
            FileStore::create(&path, o.clone(), Some(budget(6.0)), set(&["m"])).unwrap();
        // Interleaved: the tenants' curves are composed in record order.
        for _ in 0..3 {
            store.charge_receipt(Some(&bob), &b, "bob's").unwrap();
            all.push(b.clone());
            store.charge_receipt(None, &a, "nobody's").unwrap();
            all.push(a.clone());
        }
        let (accepted, refused) = charge_until_refused(&mut store, Some(&alice), &a);
        assert!(!accepted.is_empty());
        match refused {
            StoreError::Refused {
                budget,
                epsilon,
                spent,
                would_spend,
                ..
            } => {
                assert_eq!(budget, "tenant alice");
                assert_eq!(epsilon, 1.0);
                assert!(spent <= 1.0 && would_spend > 1.0, "{spent} {would_spend}");
            }
            other => panic!("{other}"),
        }
        alice_curves.extend(accepted.iter().cloned());
        all.extend(accepted);
        assert_eq!(
            store.spent(Some("alice")).unwrap(),
            compose_all(&o, &alice_curves)
        );
    }
    let mut store = unlocked(|| FileStore::open(&path)).unwrap();
    assert_eq!(
        store.spent(Some("alice")).unwrap(),
        compose_all(&o, &alice_curves)
    );
    assert_eq!(
        store.spent(Some("bob@example.org")).unwrap(),
        compose_all(&o, [&b, &b, &b])
    );
    assert_eq!(
        store.spent(Some("carol")).unwrap(),
        RdpCurve::zero(o.clone())
    );
    assert_eq!(store.spent(None).unwrap(), compose_all(&o, &all));
    // Alice stays refused after the reopen, with nothing written.
    let before = std::fs::read(&path).unwrap();
    assert!(
        store
            .charge_receipt(Some(&alice), &a, "x")
            .unwrap_err()
            .is_refusal()
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.tenants["alice"].charges, alice_curves.len() as u64);
    assert_eq!(snap.tenants["bob@example.org"].charges, 3);
    assert_eq!(snap.charges, all.len() as u64);
    // The label records the tenant in the file ledger's own format.
    let labels: Vec<String> = store
        .ledger()
        .entries()
        .unwrap()
        .filter_map(|e| match e.unwrap().kind {
            privmix_accountant::EntryKind::Charge { label, .. } => Some(label),
            _ => None,
        })
        .collect();
    assert_eq!(labels[0], "tenant=bob@example.org;bob's");
    assert_eq!(labels[1], "nobody's");
}

#[test]
fn file_store_refusals_and_bad_input_write_nothing() {
    let dir = TempDir::new("refusals");
    let path = dir.join("ledger");
    let o = orders();
    let mut store = FileStore::create(&path, o.clone(), Some(budget(1.0)), set(&["m"])).unwrap();
    let big = gaussian(&o, 8.0);
    let (accepted, refused) = charge_until_refused(&mut store, None, &big);
    assert!(!accepted.is_empty());
    assert!(matches!(&refused, StoreError::Refused { budget, .. } if budget == "total"));
    let before = std::fs::read(&path).unwrap();
    // A tenant with room left is still refused by the total budget.
    let roomy = tenant("roomy", Some(100.0));
    let e = store.charge_receipt(Some(&roomy), &big, "x").unwrap_err();
    assert!(
        matches!(&e, StoreError::Refused { budget, .. } if budget == "total"),
        "{e}"
    );
    assert!(store.spent(Some("roomy")).unwrap() == RdpCurve::zero(o.clone()));
    // Bad tenants and labels are typed errors, not refusals.
    let zero = RdpCurve::zero(o.clone());
    for bad in [
        "",
        "has space",
        "semi;colon",
        "eq=ual",
        "*",
        &"x".repeat(129),
    ] {
        let e = store
            .charge_receipt(Some(&tenant(bad, None)), &zero, "x")
            .unwrap_err();
        assert!(matches!(e, StoreError::BadTenant { .. }), "{bad:?}: {e}");
    }
    let e = store
        .charge_receipt(None, &zero, "tenant=mallory;x")
        .unwrap_err();
    assert!(matches!(e, StoreError::BadLabel { .. }), "{e}");
    let other = RdpCurve::zero(Orders::integers(4).unwrap());
    assert!(matches!(
        store.charge_receipt(None, &other, "x").unwrap_err(),
        StoreError::Accountant(_)
    ));
    let e = store.raise(budget(0.01)).unwrap_err();
    assert!(matches!(e, StoreError::BudgetBelowSpent { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // A raise is recorded; then the refused charge fits.
    let seq = store.raise(budget(2.0)).unwrap();
    assert_eq!(seq, accepted.len() as u64);
    store.charge_receipt(None, &big, "after the raise").unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.history.len(), 1);
    assert_eq!(snap.history[0].after_charges, accepted.len() as u64);
    assert_eq!(snap.initial_budget, Some(budget(1.0)));
    assert_eq!(snap.budget, Some(budget(2.0)));
}

/// A step of `tenants` (`None`: no tenant) each charging `curve`, labelled "step".
fn step_of(curve: &RdpCurve, tenants: &[Option<&Tenant>]) -> Vec<PendingCharge> {
    tenants
        .iter()
        .map(|t| PendingCharge {
            tenant: t.cloned(),
            cost: Cost::Curve(curve.clone()),
            label: "step".into(),
        })
        .collect()
}

/// Step commits on `store`: budgets checked in request order, a refusal dropping only
/// its own charge, the tenants' and the total's spend read back as the composition of
/// the accepted charges.
fn step_commits_check_budgets_in_order(store: &mut dyn LedgerStore) {
    let o = store.orders().clone();
    let a = tenant("a", Some(0.5));
    let b = tenant("b", None);
    let step = gaussian(&o, 12.0);
    let (mut total, mut of_a) = (Vec::new(), Vec::new());
    // Until tenant a's budget refuses it: b and the tenant-less charge still go on.
    loop {
        let outcomes = store
            .commit_step(&step_of(&step, &[Some(&a), Some(&b), None]))
            .unwrap();
        assert_eq!(outcomes.len(), 3);
        assert!(outcomes[1].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
        // Every charge is the same curve, so the order within a step does not matter.
        total.extend([step.clone(), step.clone()]);
        match &outcomes[0] {
            Ok(()) => {
                of_a.push(step.clone());
                total.push(step.clone());
            }
            Err(e) => {
                assert!(e.is_refusal() && e.to_string().contains("tenant a"), "{e}");
                break;
            }
        }
    }
    assert!(of_a.len() > 1);
    assert_eq!(store.spent(Some("a")).unwrap(), compose_all(&o, &of_a));
    assert_eq!(store.spent(None).unwrap(), compose_all(&o, &total));
    // An event is charged as its curve at the store's orders.
    let event = privmix_accountant::DpEvent::gaussian(12.0).unwrap();
    let charge = PendingCharge {
        tenant: Some(b.clone()),
        cost: Cost::Event(event.clone()),
        label: "gaussian".into(),
    };
    assert!(store.commit_step(&[charge]).unwrap()[0].is_ok());
    total.push(event.rdp(&o).unwrap());
    assert_eq!(store.spent(None).unwrap(), compose_all(&o, &total));
    // A label too long fails the whole step, recording nothing.
    let long = PendingCharge {
        tenant: None,
        cost: Cost::Curve(step.clone()),
        label: "x".repeat(privmix_accountant::MAX_LABEL_BYTES + 1),
    };
    let mut charges = step_of(&step, &[Some(&b)]);
    charges.push(long);
    assert!(store.commit_step(&charges).is_err());
    assert_eq!(store.spent(None).unwrap(), compose_all(&o, &total));
}

#[test]
fn file_step_commits_check_budgets_in_order_and_read_back() {
    let dir = TempDir::new("step");
    let path = dir.join("ledger");
    let o = orders();
    let mut store = FileStore::create(&path, o.clone(), Some(budget(8.0)), set(&["m"])).unwrap();
    step_commits_check_budgets_in_order(&mut store);
    let (total, of_a) = (store.spent(None).unwrap(), store.spent(Some("a")).unwrap());
    let records = store.ledger().next_sequence();
    drop(store);
    // Reopened (and snapshotted), the file holds the same totals, one record a step.
    let mut reopened = FileStore::open(&path).unwrap();
    assert_eq!(reopened.spent(None).unwrap(), total);
    assert_eq!(reopened.spent(Some("a")).unwrap(), of_a);
    assert_eq!(reopened.ledger().next_sequence(), records);
    let snap = snapshot_of_file(&path).unwrap();
    assert_eq!((snap.spent, &snap.tenants["a"].spent), (total, &of_a));
}

#[test]
fn a_step_account_collects_one_charge_for_the_commit() {
    let o = orders();
    let t = tenant("t", None);
    let mut account = StepAccount::new(o.clone());
    assert!(StepAccount::new(o.clone()).into_charge(Some(&t)).is_none());
    let step = gaussian(&o, 12.0);
    account.charge(&step, "pmixed").unwrap();
    let charge = account.into_charge(Some(&t)).unwrap();
    assert_eq!(
        (charge.cost, charge.label, charge.tenant),
        (Cost::Curve(step.clone()), "pmixed".to_string(), Some(t))
    );
    // Two charges in one step are one, composed.
    let mut account = StepAccount::new(o.clone());
    account.charge(&step, "a").unwrap();
    let event = privmix_accountant::DpEvent::gaussian(3.0).unwrap();
    account.charge_event(&event, "b").unwrap();
    let charge = account.into_charge(None).unwrap();
    let both = charge.cost.curve(&o).unwrap();
    assert!(both.epsilons()[0] >= step.compose(&event.rdp(&o).unwrap()).unwrap().epsilons()[0]);
    // Curves over other orders are refused as the mechanism charges them.
    let other = RdpCurve::zero(Orders::integers(4).unwrap());
    let mut account = StepAccount::new(o);
    assert!(matches!(
        account.charge(&other, "x"),
        Err(MechanismError::Accountant(_))
    ));
    // A PostgreSQL failure is a ledger failure, carrying the store's message.
    let e = account::mechanism_error(
        StoreError::Contention {
            store: "postgresql://u@h/db".into(),
            attempts: 3,
        },
        "postgresql://u@h/db",
    );
    assert!(
        matches!(e, MechanismError::Ledger(_)) && e.to_string().contains("3 attempts"),
        "{e}"
    );
}

#[test]
fn descriptions_never_hold_the_password() {
    let c = parse_url("postgres://alice:hunter2@db.example:6543/ledgers?password=hunter3").unwrap();
    assert_eq!(
        describe_config(&c),
        "postgresql://alice@db.example:6543/ledgers"
    );
    let c = parse_url("postgresql://bob:s3cret@/ledgers?host=/run/postgresql&port=5433").unwrap();
    let d = describe_config(&c);
    assert!(
        !d.contains("s3cret") && d.contains("/run/postgresql"),
        "{d}"
    );
    // A server that is not there: the error names the store without the password.
    let e = PostgresStore::open("postgres://alice:hunter2@127.0.0.1:1/db?connect_timeout=5")
        .unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(text.contains("postgresql://alice@127.0.0.1:1/db"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    // A URL that does not parse is not repeated either.
    let e = StoreSpec::parse("postgres://alice:hunter2@host:notaport/db").unwrap_err();
    assert!(
        matches!(e, StoreError::BadSpec { .. }) && !e.to_string().contains("hunter2"),
        "{e}"
    );
    assert!(matches!(
        StoreSpec::parse("some/file").unwrap(),
        StoreSpec::File(_)
    ));
}

#[test]
fn pg_create_open_charge_refuse_and_raise() {
    let schema = TestSchema::new("basic");
    let o = orders();
    assert!(matches!(
        PostgresStore::open(&schema.url),
        Err(StoreError::NotFound { .. })
    ));
    let mut a = PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(2.0)),
        Some(set(&["m1", "m2"])),
    )
    .unwrap();
    assert!(matches!(
        PostgresStore::create(&schema.url, o.clone(), Some(budget(2.0)), None),
        Err(StoreError::AlreadyExists { .. })
    ));
    let mut b = PostgresStore::open(&schema.url).unwrap();
    assert_eq!(b.orders(), &o);
    assert_eq!(b.budget(), Some(budget(2.0)));
    assert_eq!(b.protected_set(), Some(&set(&["m2", "m1"])));

    // Charges from either handle add up in one ledger.
    let step = gaussian(&o, 6.0);
    let t = tenant("t1", Some(1.2));
    let r0 = a.charge_receipt(Some(&t), &step, "a's").unwrap();
    b.charge(None, &step, "b's").unwrap();
    assert_eq!(r0.sequence, 0);
    assert!(r0.tenant_spent.is_some());
    assert_eq!(a.spent(None).unwrap(), compose_all(&o, [&step, &step]));
    assert_eq!(b.spent(Some("t1")).unwrap(), step);

    // The tenant runs out first, then the total; refusals record nothing.
    let (more, refused) = charge_until_refused(&mut a, Some(&t), &step);
    assert!(matches!(&refused, StoreError::Refused { budget, .. } if budget == "tenant t1"));
    let (rest, refused) = charge_until_refused(&mut b, None, &step);
    assert!(matches!(&refused, StoreError::Refused { budget, .. } if budget == "total"));
    let n = 2 + more.len() + rest.len();
    let v = a.verify().unwrap();
    assert_eq!((v.records, v.charges, v.tenants), (n as u64, n as u64, 1));
    let spent = a.spent(None).unwrap();
    assert!(eps(&spent) <= 2.0);
    assert_eq!(spent, compose_all(&o, std::iter::repeat_n(&step, n)));

    // Bad input is a typed error and records nothing.
    assert!(matches!(
        a.charge_receipt(Some(&tenant("*", None)), &step, "x"),
        Err(StoreError::BadTenant { .. })
    ));
    assert!(matches!(
        a.charge_receipt(None, &step, "nul\0"),
        Err(StoreError::BadLabel { .. })
    ));
    let other = RdpCurve::zero(Orders::integers(4).unwrap());
    assert!(matches!(
        a.charge_receipt(None, &other, "x"),
        Err(StoreError::Accountant(_))
    ));

    // A budget below the spending is refused; a raise is recorded and used by the
    // other handle's next charge at once.
    assert!(matches!(
        a.raise(budget(0.1)),
        Err(StoreError::BudgetBelowSpent { .. })
    ));
    assert_eq!(a.raise(budget(3.0)).unwrap(), n as u64);
    let r = b.charge_receipt(None, &step, "after the raise").unwrap();
    assert_eq!(r.sequence, n as u64 + 1);
    assert_eq!(b.budget(), Some(budget(3.0)));
    let snap = b.snapshot().unwrap();
    assert_eq!(snap.initial_budget, Some(budget(2.0)));
    assert_eq!(snap.budget, Some(budget(3.0)));
    assert_eq!(snap.history.len(), 1);
    assert_eq!(snap.history[0].after_charges, n as u64);
    assert_eq!(snap.charges, n as u64 + 1);
    assert_eq!(snap.tenants["t1"].charges, 1 + more.len() as u64);
    assert!(snap.created_ms.is_some_and(|ms| ms > 1_600_000_000_000));
    b.verify().unwrap();
}

#[test]
fn pg_step_commits_check_budgets_in_order_in_one_transaction() {
    let schema = TestSchema::new("step");
    let mut store =
        PostgresStore::create(&schema.url, orders(), Some(budget(8.0)), Some(set(&["m"]))).unwrap();
    step_commits_check_budgets_in_order(&mut store);
    // verify recomputes the totals from the charge rows the steps appended.
    store.verify().unwrap();
}

#[test]
fn pg_and_file_stores_record_the_same_bits() {
    let schema = TestSchema::new("same_bits");
    let dir = TempDir::new("same-bits");
    let o = Orders::dp_accounting_default();
    let protected = set(&["m"]);
    let mut pg = PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(50.0)),
        Some(protected.clone()),
    )
    .unwrap();
    let mut file =
        FileStore::create(dir.join("ledger"), o.clone(), Some(budget(50.0)), protected).unwrap();
    let t = tenant("t", None);
    // Curves whose sums round: the compositions must round the same way.
    for (i, sigma) in [3.0, 7.0 / 3.0, 1.1, 9.7, 0.3e1].iter().enumerate() {
        let c = RdpCurve::from_fn(o.clone(), |a| a / (2.0 * sigma * sigma) + 1e-17 * a).unwrap();
        let who = (i % 2 == 0).then_some(&t);
        let rp = pg.charge_receipt(who, &c, "c").unwrap();
        let rf = file.charge_receipt(who, &c, "c").unwrap();
        assert_eq!(rp, rf);
    }
    assert_eq!(pg.spent(None).unwrap(), file.spent(None).unwrap());
    assert_eq!(pg.spent(Some("t")).unwrap(), file.spent(Some("t")).unwrap());
}

#[test]
fn pg_open_store_checks_the_protected_set_and_budget_flags() {
    let schema = TestSchema::new("open_rules");
    let mine = set(&["sha256:aa", "sha256:bb"]);
    let e = open_store(&schema.url, &mine, None, None).unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    let store = open_store(&schema.url, &mine, Some(2.0), None).unwrap();
    assert_eq!(store.budget(), Some(PrivacyBudget::new(2.0, 1e-5).unwrap()));
    assert_eq!(store.orders(), &Orders::dp_accounting_default());
    drop(store);
    // The same set, in any order, with the flags repeating the budget or absent.
    open_store(&schema.url, &set(&["sha256:bb", "sha256:aa"]), None, None).unwrap();
    open_store(&schema.url, &mine, Some(2.0), Some(1e-5)).unwrap();
    let e = open_store(&schema.url, &set(&["sha256:aa", "sha256:cc"]), None, None).unwrap_err();
    match &e {
        StoreError::ProtectedSetDiffers { .. } => {
            let m = e.to_string();
            assert!(m.contains("only in the ledger: [sha256:bb]"), "{m}");
            assert!(m.contains("only in this run: [sha256:cc]"), "{m}");
        }
        other => panic!("{other}"),
    }
    let e = open_store(&schema.url, &mine, Some(3.0), None).unwrap_err();
    assert!(matches!(e, StoreError::BudgetRaiseNeeded { .. }), "{e}");
    assert!(e.to_string().contains("privmix ledger raise"), "{e}");
    let e = open_store(&schema.url, &mine, Some(1.0), None).unwrap_err();
    assert!(matches!(e, StoreError::BudgetNotRepeated { .. }), "{e}");
    // A ledger created without a set cannot be charged for any.
    let bare = TestSchema::new("open_rules_bare");
    PostgresStore::create(&bare.url, orders(), Some(budget(1.0)), None).unwrap();
    let e = open_store(&bare.url, &mine, None, None).unwrap_err();
    assert!(matches!(e, StoreError::NoProtectedSet { .. }), "{e}");
}

#[test]
fn pg_refuses_a_server_that_may_lose_commits() {
    let base = server_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20synchronous_commit%3Doff");
    let e = PostgresStore::open(&url).unwrap_err();
    match &e {
        StoreError::UnsafeServer { setting, value, .. } => {
            assert_eq!((*setting, value.as_str()), ("synchronous_commit", "off"));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("set synchronous_commit = on"), "{e}");
}

/// One acknowledged charge, as the charging thread saw it.
struct Acked {
    sequence: u64,
    tenant: Option<String>,
    label: String,
    curve: RdpCurve,
}

#[test]
fn pg_replicas_charging_concurrently_never_overspend() {
    let schema = TestSchema::new("concurrent");
    let o = orders();
    let total = budget(4.0);
    PostgresStore::create(&schema.url, o.clone(), Some(total), Some(set(&["m"]))).unwrap();
    // Two replicas, each with three threads, each thread its own connection (a
    // replica's pool); tenants t0 and t1 with their own budgets, and untenanted charges.
    let threads = 6;
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let url = schema.url.clone();
            let start = Arc::clone(&start);
            let o = o.clone();
            std::thread::spawn(move || {
                let mut store = PostgresStore::open(&url).unwrap();
                let t = match i % 3 {
                    0 => Some(tenant("t0", Some(2.5))),
                    1 => Some(tenant("t1", Some(2.5))),
                    _ => None,
                };
                let curve = gaussian(&o, 18.0 + i as f64);
                let mut acked = Vec::new();
                start.wait();
                for k in 0.. {
                    let label = format!("replica{} thread{i} charge{k}", i % 2);
                    match store.charge_receipt(t.as_ref(), &curve, &label) {
                        Ok(r) => acked.push(Acked {
                            sequence: r.sequence,
                            tenant: t.as_ref().map(|t| t.name.clone()),
                            label,
                            curve: curve.clone(),
                        }),
                        Err(StoreError::Refused { .. }) => break,
                        Err(e) => panic!("thread {i}: {e}"),
                    }
                }
                acked
            })
        })
        .collect();
    let mut acked: Vec<Acked> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("a charging thread failed"))
        .collect();
    acked.sort_by_key(|a| a.sequence);
    assert!(acked.len() > 20, "only {} charges", acked.len());
    // Records 0, 1, … in acknowledgement: each number given once, none skipped.
    for (i, a) in acked.iter().enumerate() {
        assert_eq!(a.sequence, i as u64);
    }
    let mut store = PostgresStore::open(&schema.url).unwrap();
    // The ledger's spending is the composition of exactly the acknowledged charges.
    let spent = store.spent(None).unwrap();
    assert_eq!(spent, compose_all(&o, acked.iter().map(|a| &a.curve)));
    assert!(eps(&spent) <= total.epsilon(), "{}", eps(&spent));
    for name in ["t0", "t1"] {
        let mine = compose_all(
            &o,
            acked
                .iter()
                .filter(|a| a.tenant.as_deref() == Some(name))
                .map(|a| &a.curve),
        );
        assert_eq!(store.spent(Some(name)).unwrap(), mine);
        assert!(eps(&mine) <= 2.5, "{name}: {}", eps(&mine));
    }
    let mut recorded = Vec::new();
    store
        .for_each_record(&mut |r| {
            if let Record::Charge {
                sequence, label, ..
            } = r
            {
                recorded.push((sequence, label));
            }
            Ok(())
        })
        .unwrap();
    let expected: Vec<(u64, String)> = acked
        .iter()
        .map(|a| (a.sequence, a.label.clone()))
        .collect();
    assert_eq!(recorded, expected);
    store.verify().unwrap();
    // The budget really ran out: the smallest charge any thread made no longer fits.
    let smallest = gaussian(&o, 18.0 + (threads - 1) as f64);
    assert!(
        store
            .charge_receipt(None, &smallest, "one more")
            .unwrap_err()
            .is_refusal()
    );
}

#[test]
fn pg_a_replica_dying_inside_a_charge_leaves_the_ledger_consistent() {
    let schema = TestSchema::new("dies");
    let o = orders();
    let mut store = PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(10.0)),
        Some(set(&["m"])),
    )
    .unwrap();
    let step = gaussian(&o, 10.0);
    store.charge_receipt(None, &step, "before").unwrap();
    let t = tenant("t", Some(5.0));
    // The dying replica runs every step of a charge, and while it holds the lock the
    // other replica starts a charge of its own, which must wait, then proceed.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let url = schema.url.clone();
    let (step2, t2) = (step.clone(), t.clone());
    let dying = std::thread::spawn(move || {
        test_hooks::charge_then_die(&url, Some(&t2), &step2, "never committed", || {
            tx.send(()).unwrap();
            // Long enough for the other charge to be queued behind the lock.
            std::thread::sleep(std::time::Duration::from_millis(300));
        })
    });
    rx.recv().unwrap();
    let waited = std::time::Instant::now();
    let r = store.charge_receipt(Some(&t), &step, "after").unwrap();
    assert!(
        waited.elapsed() >= std::time::Duration::from_millis(200),
        "did not wait for the lock"
    );
    let died = dying.join().unwrap().unwrap();
    // The dead charge had been given record 1; it was never committed, so the live one
    // got record 1 too, and the spending counts only what was acknowledged.
    assert_eq!((died.sequence, r.sequence), (1, 1));
    assert_eq!(store.spent(None).unwrap(), compose_all(&o, [&step, &step]));
    assert_eq!(store.spent(Some("t")).unwrap(), step);
    let v = store.verify().unwrap();
    assert_eq!((v.records, v.charges), (2, 2));
}

#[test]
fn pg_a_serialization_failure_is_retried() {
    let schema = TestSchema::new("retry");
    let o = orders();
    let mut store = PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(10.0)),
        Some(set(&["m"])),
    )
    .unwrap();
    let step = gaussian(&o, 10.0);
    // Another session writes the total's row without the ledger's table lock (a no-op
    // update) and holds it: the charge takes its snapshot, then waits for that row; when
    // the other session commits, SERIALIZABLE must fail the charge's transaction with
    // SQLSTATE 40001 ("could not serialize access due to concurrent update"). The
    // charge succeeds only if that failure is retried.
    let mut other = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut t = other.transaction().unwrap();
        t.execute(
            "UPDATE privmix_spent SET charges = charges WHERE tenant = '*'",
            &[],
        )
        .unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        t.commit().unwrap();
    });
    rx.recv().unwrap();
    let r = store.charge_receipt(None, &step, "retried").unwrap();
    holder.join().unwrap();
    assert_eq!(r.sequence, 0);
    assert_eq!(store.spent(None).unwrap(), step);
    store.verify().unwrap();
}

/// Run only by `pg_a_killed_process_leaves_the_ledger_consistent`, in a child process
/// it kills: charges the ledger at `PRIVMIX_CRASH_CHILD_URL` forever, printing
/// `ack <label>` after each acknowledged charge.
#[test]
#[ignore = "the child process of pg_a_killed_process_leaves_the_ledger_consistent"]
fn crash_child_charges_until_killed() {
    use std::io::Write;
    let url = std::env::var("PRIVMIX_CRASH_CHILD_URL")
        .expect("run by pg_a_killed_process_leaves_the_ledger_consistent, which sets PRIVMIX_CRASH_CHILD_URL");
    let mut store = PostgresStore::open(&url).unwrap();
    let step = gaussian(&orders(), 1000.0);
    let t = tenant("child", None);
    let mut out = std::io::stdout();
    for k in 0u64.. {
        let label = format!("child{k}");
        store.charge_receipt(Some(&t), &step, &label).unwrap();
        writeln!(out, "ack {label}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn pg_a_killed_process_leaves_the_ledger_consistent() {
    let schema = TestSchema::new("killed");
    let o = orders();
    PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(100.0)),
        Some(set(&["m"])),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "ledger_store::tests::crash_child_charges_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PRIVMIX_CRASH_CHILD_URL", &schema.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acked = Vec::new();
    while acked.len() < 40 {
        match lines.next() {
            Some(line) => {
                if let Some((_, label)) = line.unwrap().rsplit_once("ack ") {
                    acked.push(label.to_owned());
                }
            }
            None => panic!("the child stopped after {} charges", acked.len()),
        }
    }
    // SIGKILL, at whatever point of a charge the child is in.
    child.kill().unwrap();
    for line in lines {
        if let Some((_, label)) = line.unwrap().rsplit_once("ack ") {
            acked.push(label.to_owned());
        }
    }
    child.wait().unwrap();
    let mut store = PostgresStore::open(&schema.url).unwrap();
    let mut recorded = Vec::new();
    store
        .for_each_record(&mut |r| {
            if let Record::Charge { label, .. } = r {
                recorded.push(label);
            }
            Ok(())
        })
        .unwrap();
    // Every acknowledged charge is there, in order; at most one more (committed, killed
    // before it could say so).
    assert!(
        recorded.len() == acked.len() || recorded.len() == acked.len() + 1,
        "{} {}",
        recorded.len(),
        acked.len()
    );
    assert_eq!(recorded[..acked.len()], acked[..]);
    store.verify().unwrap();
    let step = gaussian(&o, 1000.0);
    assert_eq!(
        store.spent(Some("child")).unwrap(),
        compose_all(&o, std::iter::repeat_n(&step, recorded.len()))
    );
    // The dead connection's lock is gone: a charge goes through.
    store.charge_receipt(None, &step, "after the kill").unwrap();
    store.verify().unwrap();
}

#[test]
fn ledger_commands_read_both_stores() {
    let schema = TestSchema::new("commands");
    let dir = TempDir::new("commands");
    let file = dir.join("ledger");
    let o = orders();
    let t = tenant("alice", Some(1.0));
    let step = gaussian(&o, 9.0);
    let mut stores: Vec<Box<dyn LedgerStore>> = vec![
        Box::new(FileStore::create(&file, o.clone(), Some(budget(3.0)), set(&["m"])).unwrap()),
        Box::new(
            PostgresStore::create(&schema.url, o.clone(), Some(budget(3.0)), Some(set(&["m"])))
                .unwrap(),
        ),
    ];
    for store in &mut stores {
        store.charge_receipt(Some(&t), &step, "one").unwrap();
        store.charge_receipt(None, &step, "two").unwrap();
        store.raise(budget(4.0)).unwrap();
        store.charge_receipt(Some(&t), &step, "three").unwrap();
    }
    drop(stores);
    let specs = [file.display().to_string(), schema.url.clone()];
    let mut shown = Vec::new();
    for spec in &specs {
        let mut out = Vec::new();
        crate::ledger_cmd::show(&mut out, spec, None, true).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["charges"], 3);
        assert_eq!(v["budget"]["epsilon"], 4.0);
        assert_eq!(v["initial_budget"]["epsilon"], 3.0);
        assert_eq!(v["history"][0]["after_charges"], 2);
        assert_eq!(v["tenants"]["alice"]["charges"], 2);
        assert_eq!(v["protected_set"][0], "m");
        let alice = eps(&compose_all(&o, [&step, &step]));
        assert_eq!(
            v["tenants"]["alice"]["spent"]["epsilon"].as_f64(),
            Some(alice)
        );
        let all = eps(&compose_all(&o, [&step, &step, &step]));
        assert_eq!(v["spent"]["epsilon"].as_f64(), Some(all));
        shown.push(v);

        let mut out = Vec::new();
        crate::ledger_cmd::show(&mut out, spec, None, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("history  ε = 3, δ = 0.00001 (at creation"),
            "{text}"
        );
        assert!(text.contains("ε = 4, δ = 0.00001 (record 2,"), "{text}");
        assert!(text.contains("alice: 2 charges"), "{text}");

        let mut out = Vec::new();
        crate::ledger_cmd::export(&mut out, spec).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["header", "charge", "charge", "budget", "charge"]);
        assert_eq!(lines[1]["tenant"], "alice");
        assert_eq!(lines[1]["label"], "one");
        assert_eq!(lines[2]["tenant"], serde_json::Value::Null);
        assert_eq!(lines[3]["epsilon"], 4.0);

        let mut out = Vec::new();
        crate::ledger_cmd::verify_cmd(&mut out, spec).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("3 charges"));

        let mut out = Vec::new();
        unlocked(|| crate::ledger_cmd::raise(&mut out, spec, 5.0, None)).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("-> ε = 5, δ = 0.00001 (record 4)")
        );
        let e =
            unlocked(|| crate::ledger_cmd::raise(&mut Vec::new(), spec, 0.001, None)).unwrap_err();
        assert!(e.to_string().contains("below"), "{e}");
    }
    // Same keys whatever the store, and the same numbers but for the format.
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&shown[0]), keys(&shown[1]));
    for key in ["spent", "tenants", "left", "budget", "charges", "orders"] {
        assert_eq!(shown[0][key], shown[1][key], "{key}");
    }
    assert_eq!(shown[1]["format"]["kind"], "postgres");
    assert_eq!(shown[0]["format"]["kind"], "file");
    // An absent PostgreSQL ledger is an error naming it.
    let empty = TestSchema::new("commands_empty");
    let e = crate::ledger_cmd::show(&mut Vec::new(), &empty.url, None, true).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}
