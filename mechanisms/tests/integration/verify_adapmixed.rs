//! AdaPMixED under the exact transcript verifier (`verifier/`), with its screening, its
//! member filter and its data-independent charges all running: T ≤ 2 adaptively chosen
//! queries over V = 3 tokens, on the corpus and on every changed-member neighbour
//! (member i's distributions replaced by another table's, or by the public model).
//!
//! The verifier enumerates the screening noise itself: on a coarse grid (σ = 4 grid
//! units) it sums the discrete Gaussian law over every noise vector within ±60 units
//! (the mass beyond is below e⁻¹¹⁰), decides each vector with its own divergence, and
//! so gets the exact probability of each screening decision. For each decision it then
//! drives a clone of the mechanism with one noise vector of that decision (the audit
//! entry point `release_with_screening_noise`), checks that the mechanism decides the
//! same, reads which members it used and their λ (checking each λ against the
//! constraint with the verifier's own divergence), checks that the RELEASED distribution
//! is the verifier's recomputation (p₀ when screened; the average of the members'
//! checked mixtures, p₀ in the slots of members that left, when private), and builds
//! the law from the released distribution. Runs go against an unbudgeted account and
//! against a budget that runs out after the first query; a transcript is what a user
//! sees of each step (token or refusal, its charge, the account's spent curve after it),
//! and the divergence is checked against the total the account realised on each
//! transcript (`assert_realised`: the same on every transcript, since the schedule is
//! data-independent), not against a worst case over transcripts.

use crate::verifier;

use privmix_accountant::Orders;
use privmix_mechanisms::{Adapmixed, AdapmixedConfig, Ensemble, PublicReason};
use verifier::pmixed::assert_proportional;
use verifier::{
    AccountKind, Acct, Branch, Law, ORDERS, SLACK, Table, assert_realised, dsym_vec, mix,
    renyi_vec, run_law,
};

const DELTA: f64 = 1e-5;

const GRID: f64 = 0.0625;
const SIGMA: f64 = 0.25;
const REACH: i64 = 60;

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// The discrete Gaussian law on −REACH..=REACH grid units (the verifier's own).
fn gaussian_units() -> Vec<(i64, f64)> {
    let s = SIGMA / GRID;
    let w: Vec<(i64, f64)> = (-REACH..=REACH)
        .map(|z| (z, (-(z as f64).powi(2) / (2.0 * s * s)).exp()))
        .collect();
    let total: f64 = w.iter().map(|x| x.1).sum();
    w.into_iter().map(|(z, p)| (z, p / total)).collect()
}

/// Indices of the k largest entries of p₀, ties to the lower index (the mechanism's
/// documented rule).
fn top_k(p0: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..p0.len()).collect();
    idx.sort_by(|&a, &b| p0[b].total_cmp(&p0[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The screening decision of one noise vector, computed by the verifier.
fn decide(c: &AdapmixedConfig, p0: &[f64], idx: &[usize], rounded: &[i64], z: &[i64]) -> bool {
    let noisy: Vec<f64> = rounded
        .iter()
        .zip(z)
        .map(|(&r, &z)| ((r + z) as f64 * GRID).max(0.0))
        .collect();
    let sum: f64 = noisy.iter().sum();
    if sum <= 0.0 {
        return false;
    }
    let noisy: Vec<f64> = noisy.iter().map(|x| x / sum).collect();
    let s0: f64 = idx.iter().map(|&i| p0[i]).sum();
    let base: Vec<f64> = idx.iter().map(|&i| p0[i] / s0).collect();
    renyi_vec(&noisy, &base, c.screen_order) <= c.threshold
}

/// Every noise vector of `k` coordinates with its probability.
fn noise_vectors(k: usize) -> Vec<(Vec<i64>, f64)> {
    let one = gaussian_units();
    let mut all = vec![(Vec::new(), 1.0)];
    for _ in 0..k {
        let mut next = Vec::with_capacity(all.len() * one.len());
        for (v, p) in &all {
            for &(z, q) in &one {
                let mut w = v.clone();
                w.push(z);
                next.push((w, p * q));
            }
        }
        all = next;
    }
    all
}

fn ensemble(public: &[f64], members: &[Vec<f64>]) -> Ensemble {
    Ensemble::from_probabilities(public, &members.concat()).unwrap()
}

/// The branches of one AdaPMixED query at a node: each screening decision with its
/// exact probability, the mechanism driven with one noise vector of that decision.
fn branches(
    c: &AdapmixedConfig,
    noise: &[(Vec<i64>, f64)],
    m: &Adapmixed,
    account: &Acct,
    public: &[f64],
    members: &[Vec<f64>],
) -> Vec<Branch<Adapmixed>> {
    let n = members.len();
    let e = ensemble(public, members);
    // The screening vector the verifier computes from the members the mechanism will
    // read (a member that left holds p₀).
    let reading = m.next_screening_members(n).unwrap();
    let idx = top_k(public, c.top_k.min(public.len()));
    let rounded: Vec<i64> = idx
        .iter()
        .map(|&x| {
            let s: f64 = (0..n)
                .map(|i| {
                    let px = if reading[i] { members[i][x] } else { public[x] };
                    c.screen_lambda * px + (1.0 - c.screen_lambda) * public[x]
                })
                .sum::<f64>()
                / n as f64;
            (s / GRID).round() as i64
        })
        .collect();
    let mut by_decision: [(f64, Option<Vec<i64>>); 2] = [(0.0, None), (0.0, None)];
    for (z, q) in noise {
        let private = decide(c, public, &idx, &rounded, z);
        let slot = &mut by_decision[private as usize];
        slot.0 += q;
        if slot.1.is_none() {
            slot.1 = Some(z.clone());
        }
    }
    let total = by_decision[0].0 + by_decision[1].0;
    let mut out = Vec::new();
    for (private, (pd, z)) in by_decision.into_iter().enumerate() {
        let Some(z) = z else { continue };
        let mut m2 = m.clone();
        let mut a2 = account.clone();
        let result = m2.release_with_screening_noise(&e, &z, &mut a2);
        if let Ok(release) = &result {
            let private = private == 1;
            assert_eq!(
                release.diagnostics.public_reason.is_none(),
                private,
                "the mechanism decided otherwise than the verifier"
            );
            let want: Vec<f64> = if private {
                let used = &release.diagnostics.drawn;
                let mut rows = Vec::with_capacity(n);
                for (i, member) in members.iter().enumerate() {
                    rows.push(if used.contains(&i) {
                        let lambda = release.diagnostics.lambdas[i];
                        let mixed = mix(lambda, member, public);
                        let d = dsym_vec(&mixed, public, c.alpha_c);
                        assert!(d <= c.radius * (1.0 + SLACK) + 1e-15, "λ {lambda}: {d}");
                        mixed
                    } else {
                        public.to_vec()
                    });
                }
                verifier::pmixed::average(&rows, public.len())
            } else {
                assert_eq!(
                    release.diagnostics.public_reason,
                    Some(PublicReason::Screened)
                );
                public.to_vec()
            };
            assert_proportional(&release.distribution, &want, "AdaPMixED's release");
        }
        out.push(Branch {
            weight: pd / total,
            mech: m2,
            account: a2,
            result,
        });
    }
    out
}

/// The transcript law of a `steps`-query run on `table` against `account`.
fn run_law_of(
    mech: &Adapmixed,
    account: &Acct,
    table: &Table,
    steps: usize,
    noise: &[(Vec<i64>, f64)],
) -> Law {
    let c = mech.config().clone();
    run_law(mech, account, table, steps, |m, a, p, ms| {
        branches(&c, noise, m, a, p, ms)
    })
}

/// The account of a run: unbudgeted, or a budget that accepts `k` queries (the
/// schedule's spend read from a run of the mechanism itself, any data).
fn account(mech: &Adapmixed, table: &Table, kind: AccountKind) -> Acct {
    let o = orders();
    match kind {
        AccountKind::Unbudgeted => Acct::free(&o),
        AccountKind::RunsOutAfter(k) => {
            let (public, members) = table.at(&[]);
            let e = ensemble(public, members);
            let mut m = mech.clone();
            let mut acct = privmix_mechanisms::Unbudgeted::new(o.clone());
            let mut spent = vec![acct.spent().clone()];
            for _ in 0..=k {
                let z = vec![0; mech.config().top_k.min(public.len())];
                m.release_with_screening_noise(&e, &z, &mut acct).unwrap();
                spent.push(acct.spent().clone());
            }
            Acct::budget_between(&spent[k], &spent[k + 1], DELTA)
        }
    }
}

fn config(alpha_c: f64, radius: f64, lambda: f64, threshold: f64) -> AdapmixedConfig {
    AdapmixedConfig {
        alpha_c,
        radius,
        screen_order: 2.0,
        screen_lambda: lambda,
        sigma: SIGMA,
        screen_granularity: GRID,
        threshold,
        top_k: 2,
        ..AdapmixedConfig::default()
    }
}

fn check(
    table: &Table,
    other: &Table,
    c: AdapmixedConfig,
    steps: usize,
    noise: &[(Vec<i64>, f64)],
) {
    let mech = Adapmixed::new(c.clone()).unwrap();
    let filtered = if c.filter_budget.is_some() {
        "filter"
    } else {
        "no filter"
    };
    for kind in [
        AccountKind::Unbudgeted,
        AccountKind::RunsOutAfter(steps - 1),
    ] {
        let acct = account(&mech, table, kind);
        let law = run_law_of(&mech, &acct, table, steps, noise);
        let case = format!(
            "α_c {}, b {}, λ_s {}, T {}, budget {:?}, N {}, {kind:?}",
            c.alpha_c,
            c.radius,
            c.screen_lambda,
            c.threshold,
            c.filter_budget,
            table.members()
        );
        for i in 0..table.members() {
            let mut neighbours = vec![("emptied → p₀", table.emptied(i))];
            for j in 0..other.members() {
                neighbours.push(("arbitrary", table.with_member(i, other, j)));
            }
            for (what, neighbour) in neighbours {
                let law_n = run_law_of(&mech, &acct, &neighbour, steps, noise);
                let adjacency = format!("changed member ({what}), {filtered}");
                assert_realised(
                    ("AdaPMixED", &adjacency, acct.kind(), steps),
                    &format!("{case}, member {i} {what}"),
                    &ORDERS,
                    &law,
                    &law_n,
                );
            }
        }
    }
}

fn configs(members: usize) -> Vec<AdapmixedConfig> {
    let mut out = Vec::new();
    for (alpha_c, radius) in [(8.0, 0.3), (8.0, 2.0), (18.0, 1.0)] {
        for (lambda, threshold) in [(0.5, 0.05), (1.0, 0.5), (0.01, 10.0)] {
            let c = config(alpha_c, radius, lambda, threshold);
            out.push(c.clone());
            // A budget of about 1.5 worst-case queries: members leave mid-run.
            let worst = c.worst_query_loss(members).unwrap();
            out.push(AdapmixedConfig {
                filter_budget: Some(worst.iter().map(|w| 1.5 * w).collect()),
                ..c
            });
        }
    }
    out
}

#[test]
fn hand_built_and_random_corpora_are_covered() {
    let noise = noise_vectors(2);
    for (seed, n) in [(1u64, 1usize), (2, 2), (3, 3)] {
        let table = Table::random(seed, 3, n, 2);
        let other = Table::random(seed + 77, 3, 2, 2);
        for c in configs(n) {
            check(&table, &other, c, 2, &noise);
        }
    }
}

#[test]
fn near_deterministic_members_and_tiny_public_mass_are_covered() {
    let noise = noise_vectors(2);
    let p0 = vec![0.6, 0.4 - 1e-12, 1e-12];
    let mut table = Table {
        vocab: 3,
        rows: Default::default(),
    };
    table.rows.insert(
        vec![],
        (
            p0.clone(),
            vec![vec![1e-12, 1e-12, 1.0 - 2e-12], vec![0.0, 1.0, 0.0]],
        ),
    );
    let mut other = table.clone();
    other
        .rows
        .insert(vec![], (p0.clone(), vec![vec![1.0, 0.0, 0.0], p0.clone()]));
    for c in configs(2) {
        check(&table, &other, c, 1, &noise);
    }
}

#[test]
fn zz_coverage() {
    hand_built_and_random_corpora_are_covered();
    near_deterministic_members_and_tiny_public_mass_are_covered();
    println!("{}", verifier::coverage_table());
}
