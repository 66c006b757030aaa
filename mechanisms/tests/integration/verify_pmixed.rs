//! PMixED under the exact transcript verifier (`verifier/`): T ≤ 3 adaptively chosen
//! queries, Poisson subsampling integrated out by the verifier, on the dataset and on
//! every changed-member neighbour (member i's distributions replaced by another
//! table's, by a near-deterministic one, or by the public model: an emptied shard).

use crate::verifier;

use privmix_accountant::Orders;
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, Unbudgeted,
};
use proptest::prelude::*;
use verifier::{Law, ORDERS, SLACK, Table, assert_covered, bits, dsym_vec, mix, stateless_run_law};

/// The orders of the account in these runs.
fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// Member i's λ at one query, read from the mechanism's public output for a draw of
/// {i} alone, after checking with the verifier's own divergence that it satisfies the
/// constraint the proof assumes: `Dsym_{α_c}(λpᵢ + (1−λ)p₀, p₀) ≤ b`.
fn checked_lambda(mech: &Pmixed, public: &[f64], member: &[f64]) -> f64 {
    let e = Ensemble::from_probabilities(public, member).unwrap();
    let lambda = mech.output_distribution(&e, &[0]).unwrap().solutions[0].lambda;
    assert!((0.0..=1.0).contains(&lambda), "λ {lambda}");
    let c = mech.config();
    let d = dsym_vec(&mix(lambda, member, public), public, c.alpha_c());
    assert!(
        d <= c.radius() * (1.0 + SLACK) + 1e-15,
        "λ {lambda} breaks its constraint: Dsym {d} > b {}",
        c.radius()
    );
    lambda
}

/// The exact token law of one PMixED query, computed by the verifier: the Poisson
/// average over every subset S of the members of the mean of their mixtures.
fn query_law(mech: &Pmixed, public: &[f64], members: &[Vec<f64>]) -> Vec<f64> {
    let n = members.len();
    let q = mech.config().q();
    let lambdas: Vec<f64> = members
        .iter()
        .map(|m| checked_lambda(mech, public, m))
        .collect();
    let mut law = vec![0.0; public.len()];
    for mask in 0u32..1 << n {
        let k = mask.count_ones() as i32;
        let p = q.powi(k) * (1.0 - q).powi(n as i32 - k);
        if p == 0.0 {
            continue;
        }
        if k == 0 {
            law.iter_mut().zip(public).for_each(|(l, &x)| *l += p * x);
            continue;
        }
        for (i, m) in members.iter().enumerate() {
            if mask >> i & 1 == 1 {
                let mixed = mix(lambdas[i], m, public);
                law.iter_mut()
                    .zip(&mixed)
                    .for_each(|(l, &x)| *l += p * x / f64::from(k as u32));
            }
        }
    }
    law
}

/// The per-step charge the mechanism makes on this table (read from a real step
/// through an account), as bits for the transcript.
fn step_charge(mech: &mut Pmixed, table: &Table) -> Vec<f64> {
    let (public, members) = table.at(&[]);
    let e = Ensemble::from_probabilities(public, &members.concat()).unwrap();
    let mut account = Unbudgeted::new(orders());
    let mut rng = PrivacyRng::from_seed(1);
    let outcome = mech.step(&e, &mut rng, &mut account).unwrap();
    outcome.charge.epsilons().to_vec()
}

/// The law of a T-token run on `table`, with the charge per step.
fn run_law(mech: &mut Pmixed, table: &Table, steps: usize) -> (Law, Vec<f64>) {
    let charge = step_charge(mech, table);
    let m = mech.clone();
    let law = stateless_run_law(steps, &bits(&charge), |context| {
        let (public, members) = table.at(context);
        query_law(&m, public, members)
    });
    (law, charge)
}

/// Checks every changed-member neighbour of `table` (replaced by `other`'s member j,
/// for every j, and emptied) over T = `steps` tokens.
fn check(table: &Table, other: &Table, alpha_c: f64, radius: f64, q: f64, steps: usize) {
    let mut mech = Pmixed::new(PmixedConfig::new(alpha_c, radius, q).unwrap());
    let (law, charge) = run_law(&mut mech, table, steps);
    let charged = |alpha: f64| {
        let i = ORDERS.iter().position(|&a| a == alpha).unwrap();
        charge[i] * steps as f64
    };
    let case = format!("α_c {alpha_c}, b {radius}, q {q}, N {}", table.members());
    for i in 0..table.members() {
        let emptied = table.emptied(i);
        let (law_e, _) = run_law(&mut mech, &emptied, steps);
        assert_covered(
            ("PMixED", "changed member (emptied → p₀)", steps),
            &format!("{case}, member {i} emptied"),
            &law,
            &law_e,
            charged,
        );
        for j in 0..other.members() {
            let changed = table.with_member(i, other, j);
            let (law_c, _) = run_law(&mut mech, &changed, steps);
            assert_covered(
                ("PMixED", "changed member (arbitrary)", steps),
                &format!("{case}, member {i} → other {j}"),
                &law,
                &law_c,
                charged,
            );
        }
    }
}

/// Finding: replace-one at N = 1 was charged ε(α; 2) = 0.0703 at α_c = 36, b = 0.05,
/// α = 18, against a true 0.0982 (and 0.0295 against 0.0337 at q = 0.5). The two
/// opposite one-hot members are the worst case.
#[test]
fn one_member_changed_to_its_opposite_is_covered() {
    let p0 = vec![0.5, 0.5];
    let mut a = Table {
        vocab: 2,
        rows: Default::default(),
    };
    a.rows.insert(vec![], (p0.clone(), vec![vec![1.0, 0.0]]));
    let mut b = a.clone();
    b.rows.insert(vec![], (p0.clone(), vec![vec![0.0, 1.0]]));
    for (q, old_charge) in [(1.0, 0.0703), (0.5, 0.0295)] {
        let mut mech = Pmixed::new(PmixedConfig::new(36.0, 0.05, q).unwrap());
        let (la, charge) = run_law(&mut mech, &a, 1);
        let (lb, _) = run_law(&mut mech, &b, 1);
        let d18 = verifier::renyi(&la, &lb, 18.0);
        assert!(d18 > old_charge, "q {q}: the old charge covered it ({d18})");
        let at18 = charge[ORDERS.iter().position(|&x| x == 18.0).unwrap()];
        assert!(d18 <= at18, "q {q}: exact {d18} > charged {at18}");
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
    // Poisson subsampling at 8 members (every draw enumerated by the verifier).
    let mut members = vec![up.clone(); 8];
    members[0] = down.clone();
    check(&one_row(&[0.5, 0.5], members), &flip, 36.0, 0.1336, 0.5, 1);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
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
    ) {
        let table = Table::random(seed, v, n, steps);
        let other = Table::random(seed ^ 0xABCD, v, 2, steps);
        check(&table, &other, alpha_c, radius, q, steps);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
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
        check(&table, &other, alpha_c, radius, 1.0, 1);
    }
}

/// Prints this file's coverage rows (run with `--nocapture`); runs last by name.
#[test]
fn zz_coverage() {
    hand_built_extremes_are_covered();
    three_token_runs_are_covered();
    one_member_changed_to_its_opposite_is_covered();
    println!("{}", verifier::coverage_table());
}
