//! Budget leases on the PostgreSQL ledger: a replica spends from reservations recorded
//! as spent, never past them; replicas with and without leases share one budget; a
//! replica that dies holding a lease leaves only an over-count; `verify` checks each
//! lease against its reservations. Tenants' budgets kept in the ledger bind every
//! replica and are checked by `verify`.

use privmix_accountant::{DpEvent, Orders, PrivacyBudget, ProtectedSet, RdpCurve};

use super::file::FileStore;
use super::step::Cost;
use super::test_cluster::TestSchema;
use super::*;

fn orders() -> Orders {
    Orders::new((2..=64).map(f64::from).collect()).unwrap()
}

fn budget(eps: f64) -> PrivacyBudget {
    PrivacyBudget::new(eps, 1e-6).unwrap()
}

fn charge(tenant: Option<&Tenant>, event: &DpEvent) -> PendingCharge {
    PendingCharge {
        tenant: tenant.cloned(),
        cost: Cost::Event(event.clone()),
        label: "pmixed".into(),
    }
}

fn eps(curve: &RdpCurve) -> f64 {
    curve.epsilon(1e-6).unwrap().epsilon
}

#[test]
fn pg_leases_spend_reservations_and_never_past_the_budget() {
    let schema = TestSchema::new("leases");
    let o = orders();
    let set = ProtectedSet::new(["m".to_string()]).unwrap();
    PostgresStore::create(&schema.url, o.clone(), Some(budget(2.0)), Some(set)).unwrap();
    let mut leased = PostgresStore::open(&schema.url).unwrap();
    leased.use_leases(8).unwrap();
    let mut direct = PostgresStore::open(&schema.url).unwrap();
    let t = Tenant {
        name: "t".into(),
        budget: Some(budget(1.0)),
    };
    let event = DpEvent::gaussian(30.0).unwrap();
    let curve = event.rdp(&o).unwrap();
    // Both replicas until both are refused: the leased one a step of tenant t and one
    // without a tenant, the direct one a charge without a tenant.
    let mut acked = RdpCurve::zero(o.clone());
    let mut acked_t = RdpCurve::zero(o.clone());
    let (mut n_leased, mut n_direct) = (0u64, 0u64);
    loop {
        let out = leased
            .commit_step(&[charge(Some(&t), &event), charge(None, &event)])
            .unwrap();
        for (i, r) in out.iter().enumerate() {
            if r.is_ok() {
                acked = acked.compose(&curve).unwrap();
                n_leased += 1;
                if i == 0 {
                    acked_t = acked_t.compose(&curve).unwrap();
                }
            } else {
                assert!(r.as_ref().unwrap_err().is_refusal(), "{r:?}");
            }
        }
        let d = direct.commit_step(&[charge(None, &event)]).unwrap();
        if d[0].is_ok() {
            acked = acked.compose(&curve).unwrap();
            n_direct += 1;
        }
        if out.iter().all(Result::is_err) && d[0].is_err() {
            break;
        }
    }
    assert!(n_leased > 16 && n_direct > 0, "{n_leased} {n_direct}");
    // What the clients were given is within the budgets, and what the ledger counts
    // (reservations included) is at least that, order by order.
    assert!(eps(&acked) <= 2.0 && eps(&acked_t) <= 1.0);
    let spent = direct.spent(None).unwrap();
    assert!(eps(&spent) <= 2.0);
    assert!(
        acked
            .epsilons()
            .iter()
            .zip(spent.epsilons())
            .all(|(a, s)| a <= s)
    );
    let spent_t = direct.spent(Some("t")).unwrap();
    assert!(
        acked_t
            .epsilons()
            .iter()
            .zip(spent_t.epsilons())
            .all(|(a, s)| a <= s)
    );
    // The leased replica took the ledger's lock only to reserve: a few rows for many
    // charges.
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    let reservations: i64 = client
        .query_one(
            "SELECT count(*) FROM privmix_charges WHERE lease IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        reservations > 0 && (reservations as u64) < n_leased / 2,
        "{reservations}"
    );
    let v = direct.verify().unwrap();
    assert_eq!((v.leases, v.lease_charges), (2, n_leased));
    let snap = direct.snapshot().unwrap();
    assert_eq!(snap.leases.len(), 2);
    assert_eq!(snap.leases.iter().map(|l| l.charges).sum::<u64>(), n_leased);

    // A replica that dies holding a lease (its handle gone, no goodbye) leaves its
    // unspent part counted: the ledger verifies and nothing more can be spent.
    drop(leased);
    direct.verify().unwrap();
    assert!(direct.commit_step(&[charge(None, &event)]).unwrap()[0].is_err());

    // A lease said to have spent more than it reserved is caught.
    client
        .execute(
            "UPDATE privmix_leases SET used = array(SELECT x * 2 + 1 FROM unnest(reserved) x) WHERE tenant = 't'",
            &[],
        )
        .unwrap();
    let e = direct.verify().unwrap_err();
    assert!(e.to_string().contains("spent more than it reserved"), "{e}");
}

/// `a` at or below `b` at every order.
fn below(a: &RdpCurve, b: &RdpCurve) -> bool {
    a.epsilons().iter().zip(b.epsilons()).all(|(x, y)| x <= y)
}

/// A lease is renewed ahead of need: once fewer than half a reservation is left, the
/// next is reserved in the background and taken in before the steps run out, so that
/// no step after the first waits on a reservation; the ledger counts every
/// reservation, at least what was spent at every order, and a clean stop waits for a
/// renewal under way and gives its part back too.
#[test]
fn pg_leases_are_renewed_ahead_of_need() {
    let schema = TestSchema::new("lease_ahead");
    let o = orders();
    PostgresStore::create(&schema.url, o.clone(), Some(budget(100.0)), None).unwrap();
    let mut leased = PostgresStore::open(&schema.url).unwrap();
    leased.use_leases(8).unwrap();
    let event = DpEvent::gaussian(30.0).unwrap();
    let curve = event.rdp(&o).unwrap();
    let mut acked = RdpCurve::zero(o.clone());
    for step in 0..60 {
        let out = leased.commit_step(&[charge(None, &event)]).unwrap();
        assert!(out[0].is_ok(), "step {step}: {out:?}");
        acked = acked.compose(&curve).unwrap();
        // Only the first step (which opens the lease) waited on a reservation.
        assert_eq!(
            leased.lease_waits_settled().unwrap(),
            Some(1),
            "step {step}"
        );
        assert!(below(&acked, &leased.spent(None).unwrap()), "step {step}");
    }
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    let reservations = |client: &mut ::postgres::Client| -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM privmix_charges WHERE lease IS NOT NULL",
                &[],
            )
            .unwrap()
            .get(0)
    };
    // 60 charges at 8 a reservation, each asked for with at most half left: 8 or 9.
    let made = reservations(&mut client);
    assert!((8..=9).contains(&made), "{made}");
    // A clean stop right after a step (a renewal may be under way) waits for the
    // renewal and gives back its part with the rest.
    let spent_before = leased.spent(None).unwrap();
    leased.commit_step(&[charge(None, &event)]).unwrap();
    acked = acked.compose(&curve).unwrap();
    leased.close_leases().unwrap();
    let v = leased.verify().unwrap();
    assert_eq!((v.leases, v.lease_charges), (1, 61));
    let after = leased.spent(None).unwrap();
    assert!(below(&acked, &after));
    assert!(below(&after, &spent_before.compose(&curve).unwrap()));
}

#[test]
fn pg_a_clean_stop_gives_back_the_unspent_part() {
    let schema = TestSchema::new("release");
    let o = orders();
    let set = ProtectedSet::new(["m".to_string()]).unwrap();
    PostgresStore::create(&schema.url, o.clone(), Some(budget(2.0)), Some(set)).unwrap();
    let mut leased = PostgresStore::open(&schema.url).unwrap();
    leased.use_leases(16).unwrap();
    let t = Tenant {
        name: "t".into(),
        budget: Some(budget(1.0)),
    };
    let event = DpEvent::gaussian(30.0).unwrap();
    let curve = event.rdp(&o).unwrap();
    // Three steps, each a charge of tenant t and one without a tenant: far less than
    // a reservation of 16.
    let mut acked_t = RdpCurve::zero(o.clone());
    let mut acked_none = RdpCurve::zero(o.clone());
    for _ in 0..3 {
        let out = leased
            .commit_step(&[charge(Some(&t), &event), charge(None, &event)])
            .unwrap();
        assert!(out.iter().all(Result::is_ok));
        acked_t = acked_t.compose(&curve).unwrap();
        acked_none = acked_none.compose(&curve).unwrap();
    }
    let acked = acked_t.compose(&acked_none).unwrap();
    let total_before = leased.spent(None).unwrap();
    let t_before = leased.spent(Some("t")).unwrap();
    leased.close_leases().unwrap();
    let total_after = leased.spent(None).unwrap();
    let t_after = leased.spent(Some("t")).unwrap();
    // The spending dropped (13 of 16 charges given back per lease), and still covers
    // every charge released.
    assert!(below(&total_after, &total_before) && total_after != total_before);
    assert!(below(&t_after, &t_before) && t_after != t_before);
    // (`acked` composes the two uses rounded up; the released spending is their exact
    // sum, which the give-back keeps below the total up to that rounding.)
    let exact_sum = RdpCurve::from_fn(o.clone(), |a| {
        (acked_t.at(a).unwrap() + acked_none.at(a).unwrap()) * (1.0 - 1e-12)
    })
    .unwrap();
    assert!(
        below(&exact_sum, &total_after),
        "{total_after:?} < {acked:?}"
    );
    assert!(below(&acked_none, &total_after) && below(&acked_t, &total_after));
    assert!(below(&acked_t, &t_after), "{t_after:?} < {acked_t:?}");
    assert!(eps(&total_after) < 0.5 * eps(&total_before));
    // Each lease is recorded closed, its reservation reduced to its use.
    let snap = leased.snapshot().unwrap();
    assert_eq!(snap.leases.len(), 2);
    for l in &snap.leases {
        assert!(l.closed);
        assert_eq!(l.reserved, l.used);
        assert_eq!(l.charges, 3);
    }
    let v = leased.verify().unwrap();
    assert_eq!((v.leases, v.lease_charges, v.charges), (2, 6, 2));
    // Closing again has nothing to give back; the handle opens new leases after.
    leased.close_leases().unwrap();
    let out = leased.commit_step(&[charge(Some(&t), &event)]).unwrap();
    assert!(out[0].is_ok());
    let v = leased.verify().unwrap();
    assert_eq!(v.leases, 3);

    // A release that gives back more than the reservation less the use is caught.
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    client
        .execute(
            "UPDATE privmix_charges SET curve = array(SELECT x * 2 FROM unnest(curve) x)
             WHERE label = 'lease release' AND tenant = 't'",
            &[],
        )
        .unwrap();
    let e = leased.verify().unwrap_err();
    assert!(e.to_string().contains("not the composition"), "{e}");
}

#[test]
fn pg_give_back_rounds_toward_the_safe_side() {
    let o = Orders::new(vec![2.0, 4.0]).unwrap();
    let reserved = RdpCurve::new(o.clone(), vec![0.3, 1.0]).unwrap();
    let used = RdpCurve::new(o.clone(), vec![0.1, 1.0]).unwrap();
    let gave = super::postgres::unspent_of(&reserved, &used).unwrap();
    // At most the true difference, 0 where nothing is unspent.
    assert!(gave.epsilons()[0] < 0.3 - 0.1 && gave.epsilons()[0] > 0.19);
    assert_eq!(gave.epsilons()[1], 0.0);
    let spent = RdpCurve::new(o.clone(), vec![0.3, 1.0]).unwrap();
    let after = super::postgres::give_back_of(&spent, &gave).unwrap();
    // Never below what stays spent (the use): here 0.1 at order 2, all at order 4.
    assert!(after.epsilons()[0] >= 0.1 && after.epsilons()[0] < 0.11);
    assert_eq!(after.epsilons()[1], 1.0);
}

#[test]
fn leases_need_a_postgresql_ledger() {
    let dir = std::env::temp_dir().join(format!("privmix-lease-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger");
    let set = ProtectedSet::new(["m".to_string()]).unwrap();
    let mut file = FileStore::create(&path, orders(), Some(budget(1.0)), set).unwrap();
    assert!(matches!(
        file.use_leases(8),
        Err(StoreError::BadLease { .. })
    ));
    drop(file);
    std::fs::remove_dir_all(&dir).unwrap();
    let schema = TestSchema::new("lease_zero");
    let mut pg = PostgresStore::create(&schema.url, orders(), Some(budget(1.0)), None).unwrap();
    assert!(matches!(pg.use_leases(0), Err(StoreError::BadLease { .. })));
}

#[test]
fn pg_tenant_budgets_live_in_the_ledger() {
    let schema = TestSchema::new("tenant_budgets");
    let o = orders();
    let mut a = PostgresStore::create(&schema.url, o.clone(), Some(budget(10.0)), None).unwrap();
    let mut b = PostgresStore::open(&schema.url).unwrap();
    b.use_leases(4).unwrap();
    // The tenant's keys give it no budget: the ledger's binds every replica.
    let t = Tenant {
        name: "t".into(),
        budget: None,
    };
    a.set_tenant_budget("t", budget(0.5)).unwrap();
    let event = DpEvent::gaussian(20.0).unwrap();
    let mut acked = RdpCurve::zero(o.clone());
    let refused = loop {
        match b
            .commit_step(&[charge(Some(&t), &event)])
            .unwrap()
            .remove(0)
        {
            Ok(()) => acked = acked.compose(&event.rdp(&o).unwrap()).unwrap(),
            Err(e) => break e,
        }
    };
    assert!(refused.to_string().contains("tenant t"), "{refused}");
    assert!(eps(&acked) > 0.0 && eps(&acked) <= 0.5);
    assert!(eps(&a.spent(Some("t")).unwrap()) <= 0.5);
    // Below what it spent is refused; a raise lets it charge again, at once.
    assert!(matches!(
        a.set_tenant_budget("t", budget(0.01)),
        Err(StoreError::BudgetBelowSpent { .. })
    ));
    a.set_tenant_budget("t", budget(1.0)).unwrap();
    assert!(a.commit_step(&[charge(Some(&t), &event)]).unwrap()[0].is_ok());
    let snap = a.snapshot().unwrap();
    assert_eq!(snap.tenant_budgets["t"], budget(1.0));
    a.verify().unwrap();
    assert!(matches!(
        a.set_tenant_budget("no;pe", budget(1.0)),
        Err(StoreError::BadTenant { .. })
    ));
    // A budget recorded below what the tenant had spent (written around the store) is
    // caught by verify.
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    client
        .execute(
            "INSERT INTO privmix_tenant_budgets (tenant, epsilon, delta, at, after_records)
             SELECT 't', 0.001, 1e-6, now(), next_sequence FROM privmix_ledger",
            &[],
        )
        .unwrap();
    let e = a.verify().unwrap_err();
    assert!(e.to_string().contains("below what it had spent"), "{e}");
}

#[test]
fn tenant_budgets_need_a_postgresql_ledger() {
    let dir = std::env::temp_dir().join(format!("privmix-tenant-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger");
    let set = ProtectedSet::new(["m".to_string()]).unwrap();
    let mut file = FileStore::create(&path, orders(), Some(budget(1.0)), set).unwrap();
    assert!(matches!(
        file.set_tenant_budget("t", budget(0.5)),
        Err(StoreError::TenantBudgetsUnsupported { .. })
    ));
    drop(file);
    std::fs::remove_dir_all(&dir).unwrap();
}
