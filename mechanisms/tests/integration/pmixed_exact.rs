//! PMixED's charge against exact output laws at wider shapes than `verify_pmixed.rs`
//! (V ≤ 16 tokens, N ≤ 8 members, α_c down to 1.5, 14 orders from 1.1 to 64), one
//! query, entirely on the verifier's own code: every Poisson draw is run through
//! PMixED's `release` and checked against the verifier's recomputation
//! (`verifier/pmixed.rs`), the law is built from the released distributions, and the
//! divergence is the verifier's (`verifier::renyi`), never the mechanism's
//! `exact::pmixed_exact_output` or privmix-renyi's kernels.
//!
//! On the dataset and on every changed-member neighbour (member i replaced by the
//! public model or by another member's distribution), `D_α` in both directions must
//! not exceed the charge the account realised, at every order where it is finite.
//! Every subset must be reachable by a seed (`verifier::pmixed::subset_seeds`), so q
//! and N are paired: q ∈ {1, 0.5} with N ≤ 8, q ∈ {0.9, 0.1} with N ≤ 4.

use crate::verifier;

use privmix_accountant::Orders;
use privmix_mechanisms::Pmixed;
use proptest::prelude::*;
use verifier::pmixed::{Mixtures, Spec, branches};
use verifier::{Acct, Table, assert_realised, run_law};

const ORDERS: [f64; 14] = [
    1.1, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 18.0, 24.0, 32.0, 48.0, 64.0,
];

/// A distribution with a chosen shape: flat-ish, peaked, with exact zeros, or
/// with 1e-300 entries.
fn distribution(v: usize) -> impl Strategy<Value = Vec<f64>> {
    (prop::collection::vec(0.0f64..1.0, v), 0u8..4, 1u32..8).prop_map(|(w, shape, power)| {
        let mut w: Vec<f64> = w.into_iter().map(|x| x.powi(power as i32)).collect();
        match shape {
            1 => w.iter_mut().filter(|x| **x < 0.3).for_each(|x| *x = 0.0),
            2 => w.iter_mut().filter(|x| **x < 0.3).for_each(|x| *x = 1e-300),
            _ => {}
        }
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    })
}

/// (q, public, members): N ≤ 8 at q ∈ {1, 0.5}, N ≤ 4 at q ∈ {0.9, 0.1}.
fn ensemble() -> impl Strategy<Value = (f64, Vec<f64>, Vec<Vec<f64>>)> {
    (
        2usize..=16,
        prop::sample::select(vec![1.0, 0.9, 0.5, 0.1]),
        1usize..=8,
    )
        .prop_flat_map(|(v, q, n)| {
            let n = if q == 1.0 || q == 0.5 { n } else { n.min(4) };
            (
                Just(q),
                distribution(v),
                prop::collection::vec(distribution(v), n),
            )
        })
}

fn one_row(public: &[f64], members: Vec<Vec<f64>>) -> Table {
    let mut t = Table {
        vocab: public.len(),
        rows: Default::default(),
    };
    t.rows.insert(vec![], (public.to_vec(), members));
    t
}

fn check(public: &[f64], members: &[Vec<f64>], alpha_c: f64, radius: f64, q: f64) {
    let spec = Spec { alpha_c, radius, q };
    let mech = Pmixed::new(spec.config());
    let account = Acct::free(&Orders::new(ORDERS.to_vec()).unwrap());
    let mut mixtures = Mixtures::default();
    let mut law = |table: &Table| {
        run_law(&mech, &account, table, 1, |m, a, p, ms| {
            branches(&spec, &mut mixtures, m, a, p, ms)
        })
    };
    let base = law(&one_row(public, members.to_vec()));
    let n = members.len();
    for i in 0..n {
        for with in std::iter::once(public).chain(members.iter().map(|m| m.as_slice())) {
            let mut rows = members.to_vec();
            rows[i] = with.to_vec();
            let law_n = law(&one_row(public, rows));
            assert_realised(
                (
                    "PMixED",
                    "changed member (V ≤ 16, N ≤ 8, α to 64)",
                    "unbudgeted",
                    1,
                ),
                &format!("α_c {alpha_c}, b {radius}, q {q}, N {n}, member {i}"),
                &ORDERS,
                &base,
                &law_n,
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn exact_outputs_respect_the_charge(
        (q, public, members) in ensemble(),
        alpha_c in prop::sample::select(vec![1.5, 2.0, 4.0, 8.0, 18.0, 36.0]),
        radius in prop::sample::select(vec![0.001, 0.01, 0.1, 0.5, 2.0, 8.0]),
    ) {
        check(&public, &members, alpha_c, radius, q);
    }
}

#[test]
fn identical_members_cost_nothing_observable_and_one_hot_inputs_stay_finite() {
    // Members equal to p₀: λ = 1, output p₀ on every neighbour, Dsym = 0.
    let p0 = [0.25, 0.25, 0.5];
    check(&p0, &vec![p0.to_vec(); 3], 4.0, 0.1, 0.5);
    // One-hot members and 1e-300 entries never give NaN (the engine checks every
    // released entry is finite and non-negative).
    let public = [1e-300, 1.0 - 2e-300, 1e-300];
    let members = vec![
        vec![1.0, 0.0, 0.0],
        vec![0.0, 0.0, 1.0],
        vec![0.0, 1.0, 0.0],
    ];
    check(&public, &members, 8.0, 0.5, 1.0);
    check(&public, &members, 8.0, 0.5, 0.5);
}
