//! The PostgreSQL ledger's rows (schema version 2): a step is one row per run of equal
//! charges naming a cost stored once, replayed exactly by `verify` and `export`; a
//! database of schema version 1 is upgraded in place and still read; a cost whose
//! curve under-counts its event is caught.

use privmix_accountant::{DpEvent, Orders, PrivacyBudget, ProtectedSet, RdpCurve};

use super::postgres::SCHEMA_VERSION;
use super::step::Cost;
use super::test_cluster::TestSchema;
use super::*;

fn orders() -> Orders {
    Orders::new((2..=64).map(f64::from).collect()).unwrap()
}

fn budget(eps: f64) -> PrivacyBudget {
    PrivacyBudget::new(eps, 1e-6).unwrap()
}

fn set(ids: &[&str]) -> ProtectedSet {
    ProtectedSet::new(ids.iter().map(|s| s.to_string())).unwrap()
}

fn tenant(name: &str) -> Tenant {
    Tenant {
        name: name.into(),
        budget: Some(budget(1.5)),
    }
}

fn event_charge(t: Option<&Tenant>, event: &DpEvent, label: &str) -> PendingCharge {
    PendingCharge {
        tenant: t.cloned(),
        cost: Cost::Event(event.clone()),
        label: label.into(),
    }
}

fn count(client: &mut ::postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap().get(0)
}

fn compose_n(orders: &Orders, curve: &RdpCurve, n: usize) -> RdpCurve {
    let mut total = RdpCurve::zero(orders.clone());
    for _ in 0..n {
        total = total.compose(curve).unwrap();
    }
    total
}

#[test]
fn pg_a_step_is_one_row_per_run_of_equal_charges() {
    let schema = TestSchema::new("rows");
    let o = orders();
    let mut store = PostgresStore::create(
        &schema.url,
        o.clone(),
        Some(budget(50.0)),
        Some(set(&["m"])),
    )
    .unwrap();
    let event = DpEvent::gaussian(40.0).unwrap();
    let curve = event.rdp(&o).unwrap();
    let (a, b) = (tenant("a"), tenant("b"));
    // Eight requests of tenant a, then one of b, then one without a tenant: three runs.
    let mut step: Vec<PendingCharge> = (0..8)
        .map(|_| event_charge(Some(&a), &event, "pmixed"))
        .collect();
    step.push(event_charge(Some(&b), &event, "pmixed"));
    step.push(event_charge(None, &event, "pmixed"));
    let steps = 5;
    for _ in 0..steps {
        assert!(store.commit_step(&step).unwrap().iter().all(Result::is_ok));
    }
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    assert_eq!(
        count(&mut client, "SELECT count(*) FROM privmix_charges"),
        3 * steps
    );
    assert_eq!(count(&mut client, "SELECT count(*) FROM privmix_costs"), 1);
    assert_eq!(
        count(&mut client, "SELECT max(count) FROM privmix_charges"),
        8,
        "a's eight charges of a step are one row"
    );
    // Another handle (another replica) finds the stored cost instead of adding one.
    let mut other = PostgresStore::open(&schema.url).unwrap();
    other.commit_step(&step[..1]).unwrap();
    assert_eq!(count(&mut client, "SELECT count(*) FROM privmix_costs"), 1);
    let n = steps as usize * step.len() + 1;

    // The totals are the charges composed one by one, as a file ledger holds them.
    assert_eq!(store.spent(None).unwrap(), compose_n(&o, &curve, n));
    assert_eq!(
        store.spent(Some("a")).unwrap(),
        compose_n(&o, &curve, 8 * steps as usize + 1)
    );
    let v = store.verify().unwrap();
    assert_eq!(
        (v.records, v.charges, v.tenants),
        (3 * steps as u64 + 1, n as u64, 2)
    );
    let mut replayed = 0;
    store
        .for_each_record(&mut |r| {
            if let Record::Charge {
                count,
                curve: c,
                event: e,
                ..
            } = r
            {
                assert_eq!((&c, e.as_ref()), (&curve, Some(&event)));
                replayed += count;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(replayed, n as u64);

    // A run is charge by charge: a tenant whose budget runs out inside a step keeps the
    // charges it could pay, and the rows still replay to the stored totals.
    let big = DpEvent::gaussian(8.0).unwrap();
    let tight: Vec<PendingCharge> = (0..12)
        .map(|_| event_charge(Some(&b), &big, "big"))
        .collect();
    let outcomes = store.commit_step(&tight).unwrap();
    let paid = outcomes.iter().filter(|o| o.is_ok()).count();
    assert!(paid > 0 && paid < 12, "{outcomes:?}");
    assert!(
        outcomes[paid..]
            .iter()
            .all(|o| o.as_ref().is_err_and(StoreError::is_refusal))
    );
    store.verify().unwrap();

    // A cost whose stored curve is below its event's curve is caught.
    client
        .execute(
            "UPDATE privmix_costs SET curve = array_fill(0::float8, ARRAY[cardinality(curve)])",
            &[],
        )
        .unwrap();
    let e = store.verify().unwrap_err();
    assert!(
        matches!(&e, StoreError::Inconsistent { reason, .. } if reason.contains("below its event")),
        "{e}"
    );
}

/// The tables of schema version 1, as its builds wrote them (`postgres.rs` before
/// commit cc141d0).
const SCHEMA_1: &str = "
CREATE TABLE privmix_ledger (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version integer NOT NULL, orders float8[] NOT NULL,
    initial_epsilon float8, initial_delta float8, budget_epsilon float8, budget_delta float8,
    protected_set text[], created_at timestamptz NOT NULL,
    next_sequence bigint NOT NULL CHECK (next_sequence >= 0),
    charges bigint NOT NULL CHECK (charges >= 0),
    CHECK ((initial_epsilon IS NULL) = (initial_delta IS NULL)),
    CHECK ((budget_epsilon IS NULL) = (budget_delta IS NULL)));
CREATE TABLE privmix_spent (tenant text PRIMARY KEY, curve float8[] NOT NULL,
    charges bigint NOT NULL CHECK (charges >= 0));
CREATE TABLE privmix_charges (sequence bigint PRIMARY KEY, tenant text, label text NOT NULL,
    curve float8[] NOT NULL, at timestamptz NOT NULL);
CREATE TABLE privmix_budgets (sequence bigint PRIMARY KEY, epsilon float8, delta float8,
    at timestamptz NOT NULL, after_charges bigint NOT NULL,
    CHECK ((epsilon IS NULL) = (delta IS NULL)));
";

#[test]
fn pg_a_schema_1_database_is_upgraded_and_still_read() {
    let schema = TestSchema::new("upgrade");
    let o = orders();
    let old = DpEvent::gaussian(20.0).unwrap().rdp(&o).unwrap();
    // A version 1 ledger with two charges of tenant t, one row and one curve each.
    let mut client = ::postgres::Client::connect(&schema.url, ::postgres::NoTls).unwrap();
    client.batch_execute(SCHEMA_1).unwrap();
    let two = old.compose(&old).unwrap();
    client
        .execute(
            "INSERT INTO privmix_ledger VALUES (true, 1, $1, 10, 1e-6, 10, 1e-6, ARRAY['m'],
                 now(), 2, 2)",
            &[&o.as_slice()],
        )
        .unwrap();
    for (key, curve) in [("*", &two), ("t", &two)] {
        client
            .execute(
                "INSERT INTO privmix_spent VALUES ($1, $2, 2)",
                &[&key, &curve.epsilons()],
            )
            .unwrap();
    }
    for seq in 0..2i64 {
        client
            .execute(
                "INSERT INTO privmix_charges VALUES ($1, 't', 'old', $2, now())",
                &[&seq, &old.epsilons()],
            )
            .unwrap();
    }
    // Opening upgrades it; the old rows read as they were.
    let mut store = PostgresStore::open(&schema.url).unwrap();
    assert_eq!(
        count(
            &mut client,
            "SELECT schema_version::int8 FROM privmix_ledger"
        ),
        i64::from(SCHEMA_VERSION)
    );
    assert_eq!(store.spent(Some("t")).unwrap(), two);
    store.verify().unwrap();
    // New steps go in as cost rows beside the old curve rows.
    let event = DpEvent::gaussian(20.0).unwrap();
    let step = vec![event_charge(Some(&tenant("t")), &event, "new"); 2];
    store.commit_step(&step).unwrap();
    assert_eq!(
        store.spent(Some("t")).unwrap(),
        compose_n(&o, &old, 4),
        "old and new rows compose in record order"
    );
    let v = store.verify().unwrap();
    assert_eq!((v.records, v.charges), (3, 4));
    // A second open finds it upgraded already.
    PostgresStore::open(&schema.url).unwrap().verify().unwrap();
    // Its tables are those of a fresh ledger: the same columns, types, nullability,
    // defaults and checks.
    let fresh = TestSchema::new("fresh");
    PostgresStore::create(&fresh.url, o.clone(), Some(budget(10.0)), None).unwrap();
    let mut fresh_client = ::postgres::Client::connect(&fresh.url, ::postgres::NoTls).unwrap();
    let upgraded = table_shapes(&mut client);
    assert!(upgraded.len() > 30, "{upgraded:?}");
    assert_eq!(upgraded, table_shapes(&mut fresh_client));
}

/// Every column (table, name, type, nullability, default) and every constraint
/// (table, definition) of the tables in the connection's schema, sorted.
fn table_shapes(client: &mut ::postgres::Client) -> Vec<String> {
    let mut shapes: Vec<String> = client
        .query(
            "SELECT format('%s.%s %s null=%s default=%s', table_name, column_name, data_type,
                           is_nullable, column_default)
             FROM information_schema.columns WHERE table_schema = current_schema()
             UNION ALL
             SELECT format('%s: %s', conrelid::regclass, pg_get_constraintdef(oid))
             FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
             UNION ALL
             SELECT regexp_replace(indexdef, ' ON \\S+\\.', ' ON ')
             FROM pg_indexes WHERE schemaname = current_schema()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    shapes.sort();
    shapes
}
