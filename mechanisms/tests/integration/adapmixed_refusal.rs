//! AdaPMixED's published outcomes (charges, ε, refusals) are the same on neighbouring
//! datasets whose screening goes different ways (issue 39, §2).
//!
//! Finding: the screening cost was charged after the decision, inside a charge whose
//! size depended on it, and a refused charge recorded nothing. With what was left of
//! the budget between the screened charge and the private one, a query was refused
//! exactly when the screening said "private", and the printed ε told the member sets
//! apart (`privmix generate --json`: 1.044 … 4.000 against 1.044 … 3.424). Now each
//! query charges a fixed step of a data-independent schedule before anything is
//! computed from the members, and a refused charge changes nothing.
//!
//! The corpora: p₀ = [.5, .5], two members. `near` = {p₀, p₀} screens "private"
//! (the noisy screening vector stays near p₀); `far` = {p₀, [1, 0]} (member 1
//! changed) screens "public" (the screening vector [.75, .25] is `D₂ ≈ 0.22` from p₀,
//! 11σ above the threshold 0.05 in the vector's scale).

use privmix_accountant::{Budget, Orders};
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng,
    PublicReason, Unbudgeted,
};

const DELTA: f64 = 1e-5;

fn orders() -> Orders {
    Orders::new(vec![1.5, 2.0, 3.0, 4.0]).unwrap()
}

fn config() -> AdapmixedConfig {
    AdapmixedConfig {
        alpha_c: 8.0,
        radius: 1.0,
        screen_order: 2.0,
        screen_lambda: 1.0,
        sigma: 0.02,
        threshold: 0.05,
        top_k: 2,
        ..AdapmixedConfig::default()
    }
}

fn near() -> Ensemble {
    Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5, 0.5, 0.5]).unwrap()
}

fn far() -> Ensemble {
    Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5, 1.0, 0.0]).unwrap()
}

/// What a user sees of one step: the charge (bits), whether it was refused, and the
/// ε the account publishes after it.
#[derive(Debug, PartialEq)]
struct Seen {
    charge: Option<Vec<u64>>,
    epsilon: u64,
}

/// Runs `steps` queries on `e` against `account`, recording what is published, and
/// the screening decisions (private state, to check that they did differ).
fn run(
    config: &AdapmixedConfig,
    e: &Ensemble,
    account: &mut Budget,
    steps: usize,
) -> (Vec<Seen>, Vec<bool>) {
    let mut mech = Adapmixed::new(config.clone()).unwrap();
    let mut rng = PrivacyRng::from_seed(17);
    let mut seen = Vec::new();
    let mut private = Vec::new();
    for _ in 0..steps {
        let charge = match mech.step(e, &mut rng, account) {
            Ok(out) => {
                private.push(out.diagnostics.public_reason.is_none());
                if !private.last().unwrap() {
                    assert_eq!(out.diagnostics.public_reason, Some(PublicReason::Screened));
                }
                Some(out.charge.epsilons().iter().map(|x| x.to_bits()).collect())
            }
            Err(MechanismError::ChargeRefused(_)) => None,
            Err(other) => panic!("{other}"),
        };
        let epsilon = account.spent_epsilon(DELTA).unwrap().epsilon.to_bits();
        seen.push(Seen { charge, epsilon });
    }
    (seen, private)
}

/// The ε after each of `steps` unbudgeted queries on `e`.
fn spent_after(config: &AdapmixedConfig, e: &Ensemble, steps: usize) -> Vec<f64> {
    let mut mech = Adapmixed::new(config.clone()).unwrap();
    let mut rng = PrivacyRng::from_seed(17);
    let mut account = Unbudgeted::new(orders());
    (0..steps)
        .map(|_| {
            mech.step(e, &mut rng, &mut account).unwrap();
            account.spent().epsilon(DELTA).unwrap().epsilon
        })
        .collect()
}

/// A budget ε between what the two corpora would have spent after `steps` queries
/// when those differ (so that a charge whose size followed the screening would be
/// refused on one corpus only), and just above their common value when they agree.
fn between(config: &AdapmixedConfig, steps: usize) -> f64 {
    let a = spent_after(config, &near(), steps)[steps - 1];
    let b = spent_after(config, &far(), steps)[steps - 1];
    if a == b {
        a * (1.0 + 1e-9)
    } else {
        0.5 * (a + b)
    }
}

fn check_same(config: &AdapmixedConfig, epsilon: f64, steps: usize) {
    let mut budget_near = Budget::new(orders(), epsilon, DELTA).unwrap();
    let mut budget_far = Budget::new(orders(), epsilon, DELTA).unwrap();
    let (seen_near, private_near) = run(config, &near(), &mut budget_near, steps);
    let (seen_far, private_far) = run(config, &far(), &mut budget_far, steps);
    // The corpora do screen differently.
    assert!(private_near.iter().all(|&p| p), "{private_near:?}");
    assert!(private_far.iter().all(|&p| !p), "{private_far:?}");
    // The budget runs out mid-run.
    assert!(seen_near.first().unwrap().charge.is_some(), "{seen_near:?}");
    assert!(seen_near.last().unwrap().charge.is_none(), "{seen_near:?}");
    assert_eq!(
        seen_near, seen_far,
        "what is published told the corpora apart"
    );
    assert_eq!(budget_near, budget_far);
}

/// (a) The published charges and ε sequence are the same for the two member sets,
/// with a budget that runs out after the third query.
#[test]
fn the_published_epsilon_sequence_is_the_same_for_both_member_sets() {
    let c = config();
    check_same(&c, between(&c, 3), 6);
}

/// (b) Refusal on neighbouring datasets: with what is left after one query between
/// a screened charge and a private one, the second query is refused on both or on
/// neither, and the same holds under a filter budget.
#[test]
fn refusal_and_stopping_are_the_same_on_neighbouring_datasets() {
    let c = config();
    check_same(&c, between(&c, 2), 5);
    // With a filter budget of 2.5 worst-case queries, and the account's budget
    // running out first.
    let worst = c.worst_query_loss(2).unwrap();
    let filtered = AdapmixedConfig {
        filter_budget: Some(worst.iter().map(|w| 2.5 * w).collect()),
        ..c.clone()
    };
    check_same(&filtered, between(&filtered, 2), 5);
}

/// (c) A refused charge leaves the mechanism (its filter and what it has charged)
/// as it was: the next accepted query charges what a fresh run's first query does.
#[test]
fn a_refused_charge_leaves_the_filter_unchanged() {
    let c = AdapmixedConfig {
        filter_budget: Some(
            config()
                .worst_query_loss(2)
                .unwrap()
                .iter()
                .map(|w| 1.5 * w)
                .collect(),
        ),
        ..config()
    };
    for e in [near(), far()] {
        let mut fresh = Adapmixed::new(c.clone()).unwrap();
        let mut rng = PrivacyRng::from_seed(3);
        let mut account = Unbudgeted::new(orders());
        let first = fresh.step(&e, &mut rng, &mut account).unwrap().charge;

        let mut mech = Adapmixed::new(c.clone()).unwrap();
        let mut tiny = Budget::new(orders(), 1e-9, DELTA).unwrap();
        for _ in 0..3 {
            assert!(matches!(
                mech.step(&e, &mut rng, &mut tiny),
                Err(MechanismError::ChargeRefused(_))
            ));
        }
        if let Some(active) = mech.active_members() {
            assert!(active.iter().all(|&a| a), "{active:?}");
        }
        let mut account = Unbudgeted::new(orders());
        let after = mech.step(&e, &mut rng, &mut account).unwrap().charge;
        assert_eq!(after, first, "the refused queries advanced the account");
    }
}
