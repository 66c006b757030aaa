//! Regression test: the PAPER's PMixED bound (Flemings, Razaviyayn, Annavaram,
//! "Adaptively Private Next-Token Prediction of Large Language Models",
//! arXiv:2410.02016, Thm 3.1, restating PMixED of arXiv:2403.15638; the
//! accountant's `pmixed_query`) is violated when λ is enforced at the single
//! order α it is charged at — which is why privmix's mechanisms never charge it.
//!
//! The ensemble below was found by the random search in
//! `fixtures/pmixed_paper_bound_search.py` (numpy, λ by 60-step bisection, seed
//! 1; hit after 121 trials). Two members, V = 2, α = 4, b = βα = 0.01: each
//! member's mixture is within Dsym_4 ≤ 0.01 of p₀, yet the exact PMixED outputs
//! on D and on D minus member 0 are Dsym_4 ≈ 0.80 apart, ~39× the paper's
//! `ln((m − 1 + e^{4βα(α−1)})/m)/(α − 1)` ≈ 0.0206. The cause: the triangle-like
//! inequality (Steinke 2022, Lemma 33.7) needs the constraint at all orders;
//! here `p̄₀` sits above p₀ and `p̄₁` below it on the rare token, and at α = 4
//! the two small divergences do not add up to bound the divergence between them.

use privmix_accountant::{Orders, pmixed_query};
use privmix_mechanisms::bounds::max_accounted_order;
use privmix_mechanisms::exact::pmixed_exact_output;
use privmix_mechanisms::{Ensemble, Pmixed, PmixedConfig};
use privmix_renyi::{Order, symmetric_divergence};

const PUBLIC: [f64; 2] = [0.9999940058940805, 5.9941059195295895e-06];
const MEMBERS: [f64; 4] = [
    0.43570731252340666,
    0.5642926874765933,
    0.9999996908510449,
    3.091489551457168e-07,
];

#[test]
fn the_papers_bound_fails_with_lambda_enforced_at_one_order() {
    let (alpha, radius) = (4.0, 0.01);
    let e = Ensemble::from_probabilities(&PUBLIC, &MEMBERS).unwrap();
    let mech = Pmixed::new(PmixedConfig::new(alpha, radius, 1.0).unwrap());
    // The constraint holds for both members at α = 4.
    let drawn = mech.output_distribution(&e, &[0, 1]).unwrap();
    assert!(drawn.solutions.iter().all(|s| s.value <= radius));
    let out = pmixed_exact_output(&mech, &e).unwrap();
    let out_without_0 = pmixed_exact_output(&mech, &e.without_member(0)).unwrap();
    let d = symmetric_divergence(&out, &out_without_0, Order::new(alpha).unwrap()).unwrap();
    let orders = Orders::new(vec![alpha]).unwrap();
    let paper = pmixed_query(&orders, radius / alpha, 2)
        .unwrap()
        .at(alpha)
        .unwrap();
    assert!(paper < 0.021, "paper bound {paper}");
    assert!(d > 0.79, "Dsym {d}");
    assert!(
        d > 30.0 * paper,
        "the paper's bound {paper} is exceeded: Dsym {d}"
    );

    // privmix charges +∞ at α = 4 for α_c = 4 (α_max = 16/7) ...
    assert!(max_accounted_order(alpha) < alpha);
    let charged = mech.config().curve(&orders, 2).unwrap();
    assert_eq!(charged.at(alpha).unwrap(), f64::INFINITY);
    // ... and its finite charges at orders ≤ α_max hold for this ensemble.
    let low = Orders::new(vec![1.1, 1.5, 2.0, 16.0 / 7.0 - 1e-9]).unwrap();
    let curve = mech.config().curve(&low, 2).unwrap();
    for (&a, &eps) in low.as_slice().iter().zip(curve.epsilons()) {
        assert!(eps.is_finite());
        let d = symmetric_divergence(&out, &out_without_0, Order::new(a).unwrap()).unwrap();
        assert!(d * (1.0 - 1e-12) <= eps, "order {a}: {d} > {eps}");
    }
}
