//! SubMix under the exact transcript verifier (`verifier/`): T ≤ 3 adaptively chosen
//! queries on a corpus of k parts (two halves each) and on every changed-part
//! neighbour — one half's model replaced (a user of that half added, removed or
//! replaced), both halves replaced, or a half emptied (its model is the public one).
//! Each step's RELEASED distribution is checked against the verifier's recomputation
//! (`verifier/submix.rs`) and the law is built from it; runs go against an unbudgeted
//! account and against budgets that run out mid-run, each transcript recording every
//! step's token or refusal, its charge and the account's spent curve after it.

use crate::verifier;

use privmix_accountant::{Orders, RdpCurve};
use privmix_mechanisms::{
    Account, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, Release, SubMix, SubmixConfig,
};
use proptest::prelude::*;
use verifier::submix::{Parts, branches};
use verifier::{AccountKind, Acct, Law, ORDERS, Table, assert_realised, run_law};

const DELTA: f64 = 1e-5;

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

fn account(config: &SubmixConfig, kind: AccountKind) -> Acct {
    match kind {
        AccountKind::Unbudgeted => Acct::free(&orders()),
        AccountKind::RunsOutAfter(k) => {
            let step = config.curve(&orders()).unwrap();
            let before = if k == 0 {
                RdpCurve::zero(orders())
            } else {
                step.self_compose(k as u64)
            };
            Acct::budget_between(&before, &step.self_compose(k as u64 + 1), DELTA)
        }
    }
}

fn law<M: EnsembleMechanism + Clone>(
    config: &SubmixConfig,
    mech: &M,
    account: &Acct,
    table: &Table,
    steps: usize,
) -> Law {
    let mut parts = Parts::default();
    run_law(mech, account, table, steps, |m, a, p, ms| {
        branches(config, &mut parts, m, a, p, ms)
    })
}

fn check_mech<M: EnsembleMechanism + Clone>(
    mech: &M,
    table: &Table,
    other: &Table,
    config: SubmixConfig,
    steps: usize,
    kinds: &[AccountKind],
) {
    let mut neighbours: Vec<(&str, String, Table)> = Vec::new();
    for half in 0..table.members() {
        neighbours.push((
            "changed part (one half emptied)",
            format!("half {half} emptied"),
            table.emptied(half),
        ));
        neighbours.push((
            "changed part (one half arbitrary)",
            format!("half {half} → other 0"),
            table.with_member(half, other, 0),
        ));
    }
    for part in 0..table.members() / 2 {
        neighbours.push((
            "changed part (both halves arbitrary)",
            format!("part {part} → other"),
            table
                .with_member(2 * part, other, 0)
                .with_member(2 * part + 1, other, 1),
        ));
    }
    for &kind in kinds {
        let acct = account(&config, kind);
        let base = law(&config, mech, &acct, table, steps);
        let case = format!("{config:?}, {kind:?}");
        for (adjacency, what, neighbour) in &neighbours {
            let law_n = law(&config, mech, &acct, neighbour, steps);
            assert_realised(
                ("SubMix", adjacency, acct.kind(), steps),
                &format!("{case}, {what}"),
                &ORDERS,
                &base,
                &law_n,
            );
        }
    }
}

fn check(table: &Table, other: &Table, config: SubmixConfig, steps: usize) {
    check_mech(
        &SubMix::new(config),
        table,
        other,
        config,
        steps,
        &[
            AccountKind::Unbudgeted,
            AccountKind::RunsOutAfter(steps - 1),
        ],
    );
}

/// The finding's corpus: p₀ = [.5, .5], two parts whose four halves are [.999, .001].
/// The paper's protocol charges 0 here and STOPs on the neighbour
/// (`submix_paper_protocol.rs`); privmix's SubMix charges what it releases.
#[test]
fn the_stop_counterexample_is_covered() {
    let p0 = vec![0.5, 0.5];
    let peaked = vec![0.999, 0.001];
    let mut table = Table {
        vocab: 2,
        rows: Default::default(),
    };
    table
        .rows
        .insert(vec![], (p0.clone(), vec![peaked.clone(); 4]));
    let other = table.emptied(0).emptied(1);
    for radius in [0.05, 0.5, 5.0] {
        check(
            &table,
            &other,
            SubmixConfig::new(2, 2.0, 0.2, 8.0, radius).unwrap(),
            1,
        );
    }
}

#[test]
fn hand_built_extremes_are_covered() {
    for (seed, v, parts) in [(1u64, 2usize, 1usize), (2, 3, 2), (3, 4, 1), (4, 2, 2)] {
        let table = Table::random(seed, v, 2 * parts, 2);
        let other = Table::random(seed + 50, v, 2, 2);
        for (alpha, beta) in [(2.0, 0.01), (2.0, 10.0), (8.0, 0.5)] {
            for (alpha_c, radius) in [(36.0, 0.05), (8.0, 1.0), (4.0, 20.0)] {
                let c = SubmixConfig::new(parts, alpha, beta, alpha_c, radius).unwrap();
                check(&table, &other, c, 2);
            }
        }
    }
    let table = Table::random(9, 3, 4, 3);
    let other = Table::random(10, 3, 2, 3);
    check(
        &table,
        &other,
        SubmixConfig::new(2, 2.0, 1.0, 8.0, 0.5).unwrap(),
        3,
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_corpora_are_covered(
        seed in any::<u64>(),
        v in 2usize..=4,
        parts in 1usize..=2,
        steps in 1usize..=2,
        beta in prop::sample::select(vec![0.001, 0.1, 10.0]),
        alpha_c in prop::sample::select(vec![4.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.01, 0.3, 3.0]),
        runs_out in 0usize..=2,
    ) {
        let table = Table::random(seed, v, 2 * parts, steps);
        let other = Table::random(seed ^ 0x5eed, v, 2, steps);
        let c = SubmixConfig::new(parts, 2.0, beta, alpha_c, radius).unwrap();
        let kind = if runs_out >= steps {
            AccountKind::Unbudgeted
        } else {
            AccountKind::RunsOutAfter(runs_out)
        };
        check_mech(&SubMix::new(c), &table, &other, c, steps, &[kind]);
    }
}

/// A SubMix that skips the anchoring (releases `mean(h̄ᵢ)` unprojected) while charging
/// the anchored charge, and one whose charge follows the data: both caught.
#[derive(Debug, Clone)]
struct Wrong {
    inner: SubMix,
    unanchored: bool,
}

impl EnsembleMechanism for Wrong {
    fn release(
        &mut self,
        e: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        if self.unanchored {
            let mut r = self.inner.release(e, rng, account)?;
            let k = e.len() / 2;
            r.distribution = (0..e.vocab())
                .map(|x| (0..e.len()).map(|i| e.member(i)[x]).sum::<f64>() / (2 * k) as f64)
                .collect();
            return Ok(r);
        }
        // The charge is waived when part 0's first half is near-deterministic.
        let peaked = e.member(0).iter().any(|&x| x > 0.99);
        let mut free = privmix_mechanisms::Unbudgeted::new(account.orders().clone());
        let mut r = self.inner.release(e, rng, &mut free)?;
        if peaked {
            r.charge = RdpCurve::zero(account.orders().clone());
        }
        account.charge(&r.charge, "wrong")?;
        Ok(r)
    }

    fn name(&self) -> &'static str {
        "wrong-submix"
    }
}

#[test]
fn wrong_submix_is_caught() {
    let p0 = vec![0.5, 0.5];
    let peaked = vec![0.999, 0.001];
    let mut table = Table {
        vocab: 2,
        rows: Default::default(),
    };
    for c in verifier::contexts(2, 2) {
        table.rows.insert(c, (p0.clone(), vec![peaked.clone(); 4]));
    }
    let other = table.emptied(0).emptied(1);
    let c = SubmixConfig::new(2, 2.0, 0.2, 8.0, 0.05).unwrap();
    for (unanchored, kind, want) in [
        (true, AccountKind::Unbudgeted, "the verifier computes"),
        (
            false,
            AccountKind::RunsOutAfter(1),
            "differs between transcripts",
        ),
    ] {
        let mech = Wrong {
            inner: SubMix::new(c),
            unanchored,
        };
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_mech(&mech, &table, &other, c, 2, &[kind])
        }));
        let payload = caught.expect_err("the verifier did not catch a wrong SubMix");
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn zz_coverage() {
    the_stop_counterexample_is_covered();
    hand_built_extremes_are_covered();
    println!("{}", verifier::coverage_table());
}
