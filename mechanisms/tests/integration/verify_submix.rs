//! SubMix under the exact transcript verifier (`verifier/`): T ≤ 3 adaptively chosen
//! queries on a corpus of k parts (two halves each) and on every changed-part
//! neighbour — one half's model replaced (a user of that half added, removed or
//! replaced), both halves replaced, or a half emptied (its model is the public one).

use crate::verifier;

use privmix_accountant::Orders;
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, PrivacyRng, SubMix, SubmixConfig, Unbudgeted,
};
use proptest::prelude::*;
use verifier::{Law, ORDERS, SLACK, Table, assert_covered, bits, dsym_vec, mix, stateless_run_law};

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

fn ensemble(public: &[f64], members: &[Vec<f64>]) -> Ensemble {
    Ensemble::from_probabilities(public, &members.concat()).unwrap()
}

/// The exact token law of one query, computed by the verifier from the λ the mechanism
/// chose (its solvers are what is under test), after checking each λ with the
/// verifier's own divergence against the anchoring constraint the proof assumes.
fn query_law(mech: &SubMix, public: &[f64], members: &[Vec<f64>]) -> Vec<f64> {
    let c = *mech.config();
    let lambdas = mech
        .distribution(&ensemble(public, members))
        .unwrap()
        .lambdas;
    let k = members.len() / 2;
    let mut law = vec![0.0; public.len()];
    for (part, &lambda) in lambdas.iter().enumerate() {
        let hbar: Vec<f64> = members[2 * part]
            .iter()
            .zip(&members[2 * part + 1])
            .map(|(a, b)| 0.5 * (a + b))
            .collect();
        let mixed = mix(lambda, &hbar, public);
        let d = dsym_vec(&mixed, public, c.alpha_c());
        assert!(
            d <= c.radius() * (1.0 + SLACK) + 1e-15,
            "part {part}: λ {lambda} breaks the anchor: Dsym {d} > b {}",
            c.radius()
        );
        law.iter_mut()
            .zip(&mixed)
            .for_each(|(l, &x)| *l += x / k as f64);
    }
    law
}

fn run_law(mech: &mut SubMix, table: &Table, steps: usize) -> (Law, Vec<f64>) {
    let (public, members) = table.at(&[]);
    let mut account = Unbudgeted::new(orders());
    let charge = mech
        .step(
            &ensemble(public, members),
            &mut PrivacyRng::from_seed(1),
            &mut account,
        )
        .unwrap()
        .charge
        .epsilons()
        .to_vec();
    let m = mech.clone();
    let law = stateless_run_law(steps, &bits(&charge), |context| {
        let (public, members) = table.at(context);
        query_law(&m, public, members)
    });
    (law, charge)
}

fn check(table: &Table, other: &Table, config: SubmixConfig, steps: usize) {
    let mut mech = SubMix::new(config);
    let (law, charge) = run_law(&mut mech, table, steps);
    let charged = |alpha: f64| {
        let i = ORDERS.iter().position(|&a| a == alpha).unwrap();
        charge[i] * steps as f64
    };
    let case = format!("{config:?}");
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
    for (adjacency, what, neighbour) in neighbours {
        let (law_n, _) = run_law(&mut mech, &neighbour, steps);
        assert_covered(
            ("SubMix", adjacency, steps),
            &format!("{case}, {what}"),
            &law,
            &law_n,
            charged,
        );
    }
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
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
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
    ) {
        let table = Table::random(seed, v, 2 * parts, steps);
        let other = Table::random(seed ^ 0x5eed, v, 2, steps);
        check(&table, &other, SubmixConfig::new(parts, 2.0, beta, alpha_c, radius).unwrap(), steps);
    }
}

#[test]
fn zz_coverage() {
    the_stop_counterexample_is_covered();
    hand_built_extremes_are_covered();
    println!("{}", verifier::coverage_table());
}
