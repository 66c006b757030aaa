//! PMixED under the exact transcript verifier (`verifier/`): T ≤ 3 adaptively chosen
//! queries, every Poisson draw enumerated and each draw's RELEASED distribution checked
//! against the verifier's own recomputation (`verifier/pmixed.rs`), run against an
//! unbudgeted account and against budgets that run out mid-run, on the dataset and on
//! every changed-member neighbour (member i's distributions replaced by another
//! table's, by a near-deterministic one, or by the public model: an emptied shard).
//! Each transcript records every step's token, refusal or error, the charge the step
//! reports and the account's spent curve after it; the divergence of the two laws must
//! stay within the total the account realised.
//!
//! The `wrong_*` tests run deliberately wrong mechanisms (wrappers around PMixED) and
//! show that the verifier catches each.

use crate::verifier;

use privmix_accountant::{Orders, RdpCurve};
use privmix_mechanisms::{
    Account, Ensemble, EnsembleMechanism, MechanismError, Pmixed, PrivacyRng, Release,
};
use proptest::prelude::*;
use verifier::pmixed::{Mixtures, Spec, branches, poisson, subset_seeds};
use verifier::{AccountKind, Acct, Branch, Law, ORDERS, Table, assert_realised, mix, run_law};

const DELTA: f64 = 1e-5;

/// The orders of the account in these runs.
fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// The account of a run on ensembles of `n` members.
fn account(spec: &Spec, n: usize, kind: AccountKind) -> Acct {
    match kind {
        AccountKind::Unbudgeted => Acct::free(&orders()),
        AccountKind::RunsOutAfter(k) => {
            let step = spec.config().curve(&orders(), n as u64).unwrap();
            let before = if k == 0 {
                RdpCurve::zero(orders())
            } else {
                step.self_compose(k as u64)
            };
            Acct::budget_between(&before, &step.self_compose(k as u64 + 1), DELTA)
        }
    }
}

/// The law of a T-step run of `mech` (claiming to be PMixED with `spec`) on `table`.
fn law<M: EnsembleMechanism + Clone>(
    spec: &Spec,
    mech: &M,
    account: &Acct,
    table: &Table,
    steps: usize,
) -> Law {
    let mut mixtures = Mixtures::default();
    run_law(mech, account, table, steps, |m, a, p, ms| {
        branches(spec, &mut mixtures, m, a, p, ms)
    })
}

/// The neighbours of `table`: each member emptied, and replaced by each of `other`'s.
fn neighbours(table: &Table, other: &Table) -> Vec<(&'static str, String, Table)> {
    let mut out = Vec::new();
    for i in 0..table.members() {
        out.push((
            "changed member (emptied → p₀)",
            format!("member {i} emptied"),
            table.emptied(i),
        ));
        for j in 0..other.members() {
            out.push((
                "changed member (arbitrary)",
                format!("member {i} → other {j}"),
                table.with_member(i, other, j),
            ));
        }
    }
    out
}

/// Checks `mech` on `table` and every neighbour against each account of `kinds`.
fn check_mech<M: EnsembleMechanism + Clone>(
    mech: &M,
    table: &Table,
    other: &Table,
    spec: Spec,
    steps: usize,
    kinds: &[AccountKind],
) {
    for &kind in kinds {
        let acct = account(&spec, table.members(), kind);
        let base = law(&spec, mech, &acct, table, steps);
        let case = format!("{spec:?}, N {}, {kind:?}", table.members());
        for (adjacency, what, neighbour) in neighbours(table, other) {
            let law_n = law(&spec, mech, &acct, &neighbour, steps);
            assert_realised(
                ("PMixED", adjacency, acct.kind(), steps),
                &format!("{case}, {what}"),
                &ORDERS,
                &base,
                &law_n,
            );
        }
    }
}

/// The unbudgeted account and a budget that runs out at the last step.
fn kinds(steps: usize) -> [AccountKind; 2] {
    [
        AccountKind::Unbudgeted,
        AccountKind::RunsOutAfter(steps - 1),
    ]
}

fn check(table: &Table, other: &Table, alpha_c: f64, radius: f64, q: f64, steps: usize) {
    let spec = Spec { alpha_c, radius, q };
    check_mech(
        &Pmixed::new(spec.config()),
        table,
        other,
        spec,
        steps,
        &kinds(steps),
    );
}

/// A one-context table (T = 1) from explicit rows.
fn one_row(public: &[f64], members: Vec<Vec<f64>>) -> Table {
    let mut t = Table {
        vocab: public.len(),
        rows: Default::default(),
    };
    t.rows.insert(vec![], (public.to_vec(), members));
    t
}

/// Finding: replace-one at N = 1 was charged ε(α; 2) = 0.0703 at α_c = 36, b = 0.05,
/// α = 18, against a true 0.0982 (and 0.0295 against 0.0337 at q = 0.5). The two
/// opposite one-hot members are the worst case.
#[test]
fn one_member_changed_to_its_opposite_is_covered() {
    let p0 = vec![0.5, 0.5];
    let a = one_row(&p0, vec![vec![1.0, 0.0]]);
    let b = one_row(&p0, vec![vec![0.0, 1.0]]);
    for (q, old_charge) in [(1.0, 0.0703), (0.5, 0.0295)] {
        let spec = Spec {
            alpha_c: 36.0,
            radius: 0.05,
            q,
        };
        let mech = Pmixed::new(spec.config());
        let acct = Acct::free(&orders());
        let la = law(&spec, &mech, &acct, &a, 1);
        let lb = law(&spec, &mech, &acct, &b, 1);
        let d18 = verifier::renyi(&la, &lb, 18.0);
        assert!(d18 > old_charge, "q {q}: the old charge covered it ({d18})");
        check(&a, &b, 36.0, 0.05, q, 1);
    }
}

#[test]
fn hand_built_extremes_are_covered() {
    // N = 1 and 2, near-deterministic members, public mass near 0, λ on its boundary
    // (members equal to p₀ get λ = 1; a huge radius lets every λ be 1).
    for (seed, v, n) in [(1u64, 2usize, 1usize), (2, 3, 2), (3, 4, 2), (4, 2, 3)] {
        let table = Table::random(seed, v, n, 2);
        let other = Table::random(seed + 100, v, n.max(2), 2);
        for (alpha_c, radius) in [(36.0, 0.05), (8.0, 0.5), (4.0, 3.0), (36.0, 50.0)] {
            for q in [1.0, 0.5, 0.1] {
                check(&table, &other, alpha_c, radius, q, 2);
            }
        }
    }
}

#[test]
fn three_token_runs_are_covered() {
    let table = Table::random(11, 3, 2, 3);
    let other = Table::random(12, 3, 2, 3);
    check(&table, &other, 36.0, 0.2, 0.5, 3);
    check(&table, &other, 8.0, 1.0, 1.0, 3);
    // A budget that runs out after the first token of three: two refusals follow.
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.2,
        q: 0.5,
    };
    check_mech(
        &Pmixed::new(spec.config()),
        &table,
        &other,
        spec,
        3,
        &[AccountKind::RunsOutAfter(1)],
    );
}

/// The second-order bound's extremes (`src/pmixed/proof.md`, "The second-order bound")
/// at up to 16 members: antiparallel members at the ball's edge (the raw rows lie far
/// outside it, so λ puts their mixtures on the boundary), the others' average on
/// either side, and rare public tokens with large member ratios.
#[test]
fn second_order_extremes_up_to_sixteen_members_are_covered() {
    let up = vec![0.9, 0.1];
    let down = vec![0.1, 0.9];
    let flip = one_row(&[0.5, 0.5], vec![up.clone(), down.clone()]);
    let rare_public = [1e-6, 0.5, 0.5 - 1e-6];
    let rare = one_row(
        &rare_public,
        vec![vec![0.5, 0.25, 0.25], vec![1e-9, 0.2, 0.8 - 1e-9]],
    );
    let four_public = [0.4, 0.3, 0.2, 0.1];
    let four = one_row(
        &four_public,
        vec![vec![0.1, 0.2, 0.3, 0.4], vec![0.7, 0.3, 0.0, 0.0]],
    );
    for n in [2usize, 4, 16] {
        for (alpha_c, radius) in [(36.0, 0.0408), (36.0, 0.1336), (18.0, 0.5)] {
            // Every other member on the changed member's side, or on the opposite one.
            for others in [&up, &down] {
                let mut members = vec![others.clone(); n];
                members[0] = down.clone();
                check(
                    &one_row(&[0.5, 0.5], members),
                    &flip,
                    alpha_c,
                    radius,
                    1.0,
                    1,
                );
            }
            let mut members = vec![rare_public.to_vec(); n];
            members[0] = vec![0.5, 0.25, 0.25];
            check(
                &one_row(&rare_public, members),
                &rare,
                alpha_c,
                radius,
                1.0,
                1,
            );
            let mut members = vec![vec![0.7, 0.3, 0.0, 0.0]; n];
            members[0] = vec![0.1, 0.2, 0.3, 0.4];
            check(
                &one_row(&four_public, members),
                &four,
                alpha_c,
                radius,
                1.0,
                1,
            );
        }
    }
    // Poisson subsampling at 8 members (every draw's release checked).
    let mut members = vec![up.clone(); 8];
    members[0] = down.clone();
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.1336,
        q: 0.5,
    };
    check_mech(
        &Pmixed::new(spec.config()),
        &one_row(&[0.5, 0.5], members),
        &flip,
        spec,
        1,
        &[AccountKind::Unbudgeted],
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_tables_are_covered(
        seed in any::<u64>(),
        v in 2usize..=4,
        n in 1usize..=3,
        steps in 1usize..=2,
        alpha_c in prop::sample::select(vec![4.0, 8.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.01, 0.1, 0.5, 2.0]),
        q in prop::sample::select(vec![1.0, 0.7, 0.3]),
        runs_out in 0usize..=2,
    ) {
        let table = Table::random(seed, v, n, steps);
        let other = Table::random(seed ^ 0xABCD, v, 2, steps);
        let spec = Spec { alpha_c, radius, q };
        let kind = if runs_out >= steps {
            AccountKind::Unbudgeted
        } else {
            AccountKind::RunsOutAfter(runs_out)
        };
        check_mech(&Pmixed::new(spec.config()), &table, &other, spec, steps, &[kind]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    /// Up to 16 members at q = 1, where the second-order bound is far below the
    /// first-order one: one query's exact law is cheap because only one member changes.
    #[test]
    fn random_tables_with_many_members_are_covered(
        seed in any::<u64>(),
        v in 2usize..=4,
        n in 4usize..=16,
        alpha_c in prop::sample::select(vec![18.0, 36.0]),
        radius in prop::sample::select(vec![0.04, 0.13, 0.5]),
    ) {
        let table = Table::random(seed, v, n, 1);
        let other = Table::random(seed ^ 0xABCD, v, 2, 1);
        let spec = Spec { alpha_c, radius, q: 1.0 };
        check_mech(&Pmixed::new(spec.config()), &table, &other, spec, 1, &[AccountKind::Unbudgeted]);
    }
}

// ---------------------------------------------------------------------------------
// Deliberately wrong mechanisms: each must make the verifier fail.

/// What a wrong PMixED does differently.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    /// Releases honestly but reports the draw shifted by one member.
    MisreportsDrawn,
    /// Releases the average of EVERY member's mixture (no subsampling) while reporting
    /// the Poisson draw and its λs, and charging the subsampled charge.
    IgnoresTheDraw,
    /// Reports half the charge it takes from the account.
    ReportsLessThanItCharges,
    /// Takes and reports half the charge.
    ChargesHalf,
    /// Charges nothing when member 0 puts most mass on token 0 (a data-dependent
    /// charge: with a budget, a refusal on one side only).
    ChargeDependsOnData,
    /// Fails with an error when member 0 puts most mass on token 0 (after charging).
    ErrsOnData,
}

#[derive(Debug, Clone)]
struct Wrong {
    inner: Pmixed,
    bug: Bug,
}

impl Wrong {
    fn member0_likes_token0(e: &Ensemble) -> bool {
        let m = e.member(0);
        m[0] >= m.iter().copied().fold(0.0, f64::max)
    }
}

impl EnsembleMechanism for Wrong {
    fn release(
        &mut self,
        e: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let curve = self
            .inner
            .config()
            .curve(account.orders(), e.len() as u64)?;
        let half = RdpCurve::from_fn(account.orders().clone(), |a| curve.at(a).unwrap() / 2.0)?;
        match self.bug {
            Bug::MisreportsDrawn => {
                let mut r = self.inner.release(e, rng, account)?;
                r.diagnostics.drawn = r
                    .diagnostics
                    .drawn
                    .iter()
                    .map(|i| (i + 1) % e.len())
                    .collect();
                Ok(r)
            }
            Bug::IgnoresTheDraw => {
                let mut r = self.inner.release(e, rng, account)?;
                let all: Vec<usize> = (0..e.len()).collect();
                r.distribution = self.inner.output_distribution(e, &all)?.distribution;
                Ok(r)
            }
            Bug::ReportsLessThanItCharges => {
                let mut r = self.inner.release(e, rng, account)?;
                r.charge = half;
                Ok(r)
            }
            Bug::ChargesHalf | Bug::ChargeDependsOnData | Bug::ErrsOnData => {
                let charge = match self.bug {
                    Bug::ChargesHalf => half,
                    Bug::ChargeDependsOnData if Self::member0_likes_token0(e) => {
                        RdpCurve::zero(account.orders().clone())
                    }
                    _ => curve,
                };
                let mut free = privmix_mechanisms::Unbudgeted::new(account.orders().clone());
                let mut r = self.inner.release(e, rng, &mut free)?;
                account.charge(&charge, "wrong")?;
                if self.bug == Bug::ErrsOnData && Self::member0_likes_token0(e) {
                    return Err(MechanismError::EmptyVocabulary);
                }
                r.charge = charge;
                Ok(r)
            }
        }
    }

    fn name(&self) -> &'static str {
        "wrong-pmixed"
    }
}

/// Runs `f` and returns its panic message (panics itself if `f` passed).
fn fails(what: &str, f: impl FnOnce()) -> String {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let Err(payload) = caught else {
        panic!("the verifier did not catch {what}");
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// The same rows at every context of fewer than `depth` tokens.
fn constant(public: &[f64], members: Vec<Vec<f64>>, depth: usize) -> Table {
    let mut t = Table {
        vocab: public.len(),
        rows: Default::default(),
    };
    for c in verifier::contexts(public.len(), depth) {
        t.rows.insert(c, (public.to_vec(), members.clone()));
    }
    t
}

/// The opposite one-hot members (the worst case of one query), beside a member at p₀.
fn opposites() -> (Table, Table) {
    (
        constant(&[0.5, 0.5], vec![vec![1.0, 0.0], vec![0.5, 0.5]], 3),
        constant(&[0.5, 0.5], vec![vec![0.0, 1.0], vec![0.5, 0.5]], 3),
    )
}

fn check_wrong(bug: Bug, spec: Spec, kind: AccountKind, steps: usize) -> String {
    let (table, other) = opposites();
    let mech = Wrong {
        inner: Pmixed::new(spec.config()),
        bug,
    };
    fails(&format!("{bug:?}"), || {
        check_mech(&mech, &table, &other, spec, steps, &[kind])
    })
}

/// A mechanism that misreports which members it drew: its reports are checked against
/// its released outputs.
#[test]
fn wrong_reports_of_the_draw_are_caught() {
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.5,
        q: 0.5,
    };
    let msg = check_wrong(Bug::MisreportsDrawn, spec, AccountKind::Unbudgeted, 1);
    assert!(msg.contains("reports other members"), "{msg}");
}

/// A mechanism that uses members it did not draw (no subsampling) while reporting the
/// draw: the law built from its reports (the old verifier's) is the honest one and
/// passes; the released distributions differ from the recomputation, and the law built
/// from them alone (no recomputation check) breaks the subsampled charge.
#[test]
fn wrong_use_of_undrawn_members_is_caught() {
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.05,
        q: 0.1,
    };
    let msg = check_wrong(Bug::IgnoresTheDraw, spec, AccountKind::Unbudgeted, 1);
    assert!(msg.contains("the verifier computes"), "{msg}");

    let (table, other) = opposites();
    let mech = Wrong {
        inner: Pmixed::new(spec.config()),
        bug: Bug::IgnoresTheDraw,
    };
    let acct = Acct::free(&orders());
    // Every draw's release, with no check: the law of what it releases, or of what it
    // reports.
    let expand = |from_reports: bool| {
        move |m: &Wrong, a: &Acct, p: &[f64], ms: &[Vec<f64>]| -> Vec<Branch<Wrong>> {
            let n = ms.len();
            let seeds = subset_seeds(n, spec.q);
            let e = Ensemble::from_probabilities(p, &ms.concat()).unwrap();
            (0u32..1 << n)
                .map(|mask| {
                    let (mut m2, mut a2) = (m.clone(), a.clone());
                    let seed = seeds[mask as usize].unwrap();
                    let mut r = m2.release(&e, &mut PrivacyRng::from_seed(seed), &mut a2);
                    if let (true, Ok(r)) = (from_reports, &mut r) {
                        let d = &r.diagnostics;
                        r.distribution = if d.drawn.is_empty() {
                            p.to_vec()
                        } else {
                            let rows: Vec<Vec<f64>> = d
                                .drawn
                                .iter()
                                .zip(&d.lambdas)
                                .map(|(&i, &l)| mix(l, &ms[i], p))
                                .collect();
                            verifier::pmixed::average(&rows, p.len())
                        };
                    }
                    Branch {
                        weight: poisson(mask, n, spec.q),
                        mech: m2,
                        account: a2,
                        result: r,
                    }
                })
                .collect()
        }
    };
    let key = ("PMixED (wrong)", "demonstration", "unbudgeted", 1);
    let reported = run_law(&mech, &acct, &table, 1, expand(true));
    let reported_n = run_law(&mech, &acct, &other, 1, expand(true));
    assert_realised(key, "from reports", &ORDERS, &reported, &reported_n);
    let released = run_law(&mech, &acct, &table, 1, expand(false));
    let released_n = run_law(&mech, &acct, &other, 1, expand(false));
    let msg = fails("IgnoresTheDraw by divergence", || {
        assert_realised(key, "from releases", &ORDERS, &released, &released_n)
    });
    assert!(msg.contains("> realised charge"), "{msg}");
}

/// A step that reports less than the account took, and one that takes less than the
/// divergence needs.
#[test]
fn wrong_charges_are_caught() {
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.05,
        q: 1.0,
    };
    let msg = check_wrong(
        Bug::ReportsLessThanItCharges,
        spec,
        AccountKind::Unbudgeted,
        1,
    );
    assert!(msg.contains("reported a charge"), "{msg}");
    let msg = check_wrong(Bug::ChargesHalf, spec, AccountKind::Unbudgeted, 2);
    assert!(msg.contains("> realised charge"), "{msg}");
}

/// A charge that depends on the data (with a budget: a refusal on one side only), and
/// an error that does: both are in the transcript a user sees.
#[test]
fn wrong_refusals_and_errors_are_caught() {
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.05,
        q: 1.0,
    };
    let msg = check_wrong(
        Bug::ChargeDependsOnData,
        spec,
        AccountKind::RunsOutAfter(1),
        2,
    );
    assert!(
        msg.contains("differs between transcripts") || msg.contains("> realised charge"),
        "{msg}"
    );
    let msg = check_wrong(Bug::ErrsOnData, spec, AccountKind::Unbudgeted, 1);
    assert!(
        msg.contains("> realised charge") || msg.contains("differs"),
        "{msg}"
    );
}

/// Prints this file's coverage rows (run with `--nocapture`); runs last by name.
#[test]
fn zz_coverage() {
    hand_built_extremes_are_covered();
    three_token_runs_are_covered();
    one_member_changed_to_its_opposite_is_covered();
    println!("{}", verifier::coverage_table());
}

/// The durable ledger is the other budgeted account: along sampled runs (the same
/// seeds), a `Ledger` with the budget of the verifier's `Budget` accepts and refuses
/// the same steps and records the same spent curve after each, so the transcript laws
/// computed against `Budget` are those of a ledger-backed run.
#[test]
fn a_ledger_sees_the_same_transcript_as_the_budget() {
    use privmix_accountant::{Ledger, PrivacyBudget};
    let spec = Spec {
        alpha_c: 36.0,
        radius: 0.2,
        q: 0.5,
    };
    let table = Table::random(11, 3, 2, 3);
    let step = spec.config().curve(&orders(), 2).unwrap();
    let Acct::Budgeted(budget) = Acct::budget_between(&step, &step.self_compose(2), DELTA) else {
        unreachable!()
    };
    let dir = std::env::temp_dir().join(format!("privmix-verifier-ledger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for seed in 0..8u64 {
        let path = dir.join(format!("ledger-{seed}"));
        let _ = std::fs::remove_file(&path);
        let mut ledger = Ledger::create(
            &path,
            orders(),
            Some(PrivacyBudget::new(budget.epsilon(), DELTA).unwrap()),
        )
        .unwrap();
        let mut budget = budget.clone();
        let (mut a, mut b) = (Pmixed::new(spec.config()), Pmixed::new(spec.config()));
        let (mut ra, mut rb) = (PrivacyRng::from_seed(seed), PrivacyRng::from_seed(seed));
        let mut context = Vec::new();
        let mut refused = 0;
        for _ in 0..3 {
            let (public, members) = table.at(&context);
            let e = Ensemble::from_probabilities(public, &members.concat()).unwrap();
            let x = a.step(&e, &mut ra, &mut ledger);
            let y = b.step(&e, &mut rb, &mut budget);
            match (x, y) {
                (Ok(x), Ok(y)) => {
                    assert_eq!(x.token, y.token);
                    assert_eq!(x.charge, y.charge);
                    context.push(x.token as u32);
                }
                (Err(MechanismError::ChargeRefused(_)), Err(MechanismError::ChargeRefused(_))) => {
                    refused += 1
                }
                (x, y) => panic!("the ledger and the budget differ: {x:?} / {y:?}"),
            }
            assert_eq!(ledger.spent(), budget.spent());
        }
        assert_eq!(
            refused, 2,
            "the budget runs out after the first step of three"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
