//! SubMix, checked exactly: the leave-one-part-out distributions are the outputs on the
//! neighbouring corpora, and the charge bounds the divergence to every neighbour at every
//! order; budgets never overshoot; STOP answers from the public model forever.

use privmix_accountant::{Budget, Orders};
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason, RandomStopping, SubMix,
    submix_distribution,
};
use privmix_mixing::submix_lambda;
use privmix_renyi::Order;
use proptest::prelude::*;

/// Orders the charges are checked at.
const ORDERS: [f64; 6] = [1.25, 1.5, 2.0, 3.0, 8.0, 32.0];

fn normalise(w: &[f64]) -> Vec<f64> {
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}

/// An independent Rényi divergence (direct formula, log-space), both directions.
fn naive_dsym(p: &[f64], q: &[f64], alpha: f64) -> f64 {
    let one = |p: &[f64], q: &[f64]| {
        let mut terms = Vec::new();
        for (&a, &b) in p.iter().zip(q) {
            if a > 0.0 {
                if b == 0.0 {
                    return f64::INFINITY;
                }
                terms.push(alpha * a.ln() + (1.0 - alpha) * b.ln());
            }
        }
        let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()) / (alpha - 1.0)
    };
    one(p, q).max(one(q, p))
}

/// The neighbour's output computed from the paper's formulas (Alg. 2 lines 14–17), with
/// the means over the remaining parts — independently of the crate's code path.
fn neighbour_by_formula(e: &Ensemble, alpha: f64, beta: f64, removed: usize) -> Vec<f64> {
    let k = e.len() / 2;
    let rest: Vec<usize> = (0..k).filter(|&j| j != removed).collect();
    if rest.is_empty() {
        return e.public().to_vec();
    }
    let order = Order::new(alpha).unwrap();
    let mut lam = 0.0;
    let mut mean = vec![0.0; e.vocab()];
    for &j in &rest {
        let (a, b) = (e.member(2 * j), e.member(2 * j + 1));
        lam += submix_lambda(a, b, e.public(), order, beta).unwrap().lambda;
        for x in 0..e.vocab() {
            mean[x] += (a[x] + b[x]) / 2.0;
        }
    }
    let n = rest.len() as f64;
    let lam = lam / n;
    (0..e.vocab())
        .map(|x| lam * mean[x] / n + (1.0 - lam) * e.public()[x])
        .collect()
}

fn without_part(e: &Ensemble, part: usize) -> Ensemble {
    e.without_member(2 * part + 1).without_member(2 * part)
}

/// A random distribution over `v` tokens, with some exact zeros when `zeros` is set.
fn dist(v: usize, zeros: bool) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((0.0f64..1.0, 0u8..8), v).prop_map(move |w| {
        let mut w: Vec<f64> = w
            .into_iter()
            .map(|(x, z)| if zeros && z == 0 { 0.0 } else { x + 1e-3 })
            .collect();
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        normalise(&w)
    })
}

fn ensemble_strategy() -> impl Strategy<Value = Ensemble> {
    (2usize..=16, 1usize..=6).prop_flat_map(|(v, k)| {
        (dist(v, false), prop::collection::vec(dist(v, true), 2 * k))
            .prop_map(|(p0, halves)| Ensemble::from_probabilities(&p0, &halves.concat()).unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn charge_bounds_every_leave_one_part_out_neighbour(
        e in ensemble_strategy(),
        alpha in prop::sample::select(vec![1.5, 2.0, 4.0]),
        beta in 0.0f64..2.0,
    ) {
        let d = submix_distribution(&e, alpha, beta).unwrap();
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let curves = d.part_curves(&orders).unwrap();
        let total = d.charge_curve(&orders).unwrap();
        for part in 0..d.parts() {
            // The neighbour's output, from the mechanism run on the smaller corpus, is
            // bitwise the leave-one-part-out row the charge was computed from …
            let neighbour = submix_distribution(&without_part(&e, part), alpha, beta).unwrap();
            prop_assert_eq!(neighbour.output.as_slice(), d.without_part(part));
            // … and agrees with the paper's formula computed independently.
            let formula = neighbour_by_formula(&e, alpha, beta, part);
            for (x, y) in formula.iter().zip(d.without_part(part)) {
                prop_assert!((x - y).abs() <= 1e-14, "{x} vs {y}");
            }
            for (i, &a) in ORDERS.iter().enumerate() {
                let exact = naive_dsym(&d.output, &neighbour.output, a);
                let charged = curves[part].epsilons()[i];
                prop_assert!(
                    exact <= charged * (1.0 + 1e-9) + 1e-13,
                    "part {part} order {a}: Dsym {exact} > charge {charged}"
                );
                prop_assert!(total.epsilons()[i] >= charged);
            }
        }
    }

    #[test]
    fn identical_halves_get_lambda_one(
        p0 in dist(6, false),
        h in prop::collection::vec(dist(6, true), 1..=4),
        beta in 0.0f64..1.0,
    ) {
        let members: Vec<f64> = h.iter().flat_map(|r| r.iter().chain(r.iter()).copied()).collect();
        let e = Ensemble::from_probabilities(&p0, &members).unwrap();
        let d = submix_distribution(&e, 2.0, beta).unwrap();
        prop_assert!(d.lambdas.iter().all(|&l| l == 1.0));
        prop_assert_eq!(d.lambda_star, 1.0);
    }

    #[test]
    fn budgets_never_overshoot_and_stop_is_forever(
        queries in prop::collection::vec(ensemble_with_parts(3), 1..25),
        budget in 0.0f64..0.5,
        seed in any::<u64>(),
    ) {
        let alpha = 2.0;
        let mut m = SubMix::new(3, alpha, 0.05, budget).unwrap();
        let orders = Orders::new(vec![alpha]).unwrap();
        let mut account = Budget::new(orders.clone(), 1e6, 1e-5).unwrap();
        let mut rng = PrivacyRng::from_seed(seed);
        let mut stopped_at = None;
        for (t, e) in queries.iter().enumerate() {
            let before = m.budgets().spent().to_vec();
            let losses = submix_distribution(e, alpha, 0.05).unwrap()
                .part_losses(Order::new(alpha).unwrap()).unwrap();
            let out = m.step(e, &mut rng, &mut account).unwrap();
            prop_assert!(m.budgets().spent().iter().all(|&s| s <= budget));
            if m.is_stopped() {
                if stopped_at.is_none() {
                    stopped_at = Some(t);
                    // STOP was issued because this query's charge would overshoot.
                    prop_assert!(before.iter().zip(&losses).any(|(&s, &l)| (s + l).next_up() > budget));
                }
                prop_assert_eq!(out.diagnostics.public_reason, Some(PublicReason::Stopped));
                prop_assert!(out.charge.epsilons().iter().all(|&x| x == 0.0));
                prop_assert_eq!(m.budgets().spent(), before.as_slice());
                // p₀ is one-hot on token 0 in these queries: the answer is public.
                prop_assert_eq!(out.token, 0);
            } else {
                prop_assert!(stopped_at.is_none());
                for ((&s, &l), &a) in before.iter().zip(&losses).zip(m.budgets().spent()) {
                    prop_assert!(a >= s + l);
                }
                prop_assert_eq!(out.charge.epsilons()[0], losses.iter().copied().fold(0.0, f64::max));
            }
        }
    }
}

/// Queries whose public model is one-hot on token 0 (so a public answer is recognisable)
/// and whose halves put most mass elsewhere.
fn ensemble_with_parts(k: usize) -> impl Strategy<Value = Ensemble> {
    prop::collection::vec(dist(4, false), 2 * k).prop_map(move |halves| {
        let p0 = [1.0, 0.0, 0.0, 0.0];
        Ensemble::from_probabilities(&p0, &halves.concat()).unwrap()
    })
}

fn spiky(k: usize) -> Ensemble {
    // Halves that disagree strongly: every response is expensive.
    let p0 = [0.25; 4];
    let mut m = Vec::new();
    for part in 0..k {
        // Each part favours its own tokens, so removing a part moves the output.
        let (x, y) = ((2 * part) % 4, (2 * part + 1) % 4);
        for favourite in [x, y] {
            let mut h = [0.01; 4];
            h[favourite] = 0.97;
            m.extend(h);
        }
    }
    Ensemble::from_probabilities(&p0, &m).unwrap()
}

#[test]
fn stop_is_issued_before_the_overshooting_response_and_then_p0_forever() {
    let mut m = SubMix::new(2, 2.0, 0.5, 0.3).unwrap();
    let mut account = Budget::new(Orders::new(vec![2.0]).unwrap(), 100.0, 1e-5).unwrap();
    let mut rng = PrivacyRng::from_seed(11);
    let e = spiky(2);
    let mut private = 0;
    for _ in 0..50 {
        let out = m.step(&e, &mut rng, &mut account).unwrap();
        if out.diagnostics.public_reason.is_none() {
            private += 1;
        }
    }
    assert!(m.is_stopped());
    assert!((1..50).contains(&private), "{private}");
    assert!(m.budgets().max_spent() <= 0.3);
    // Even a free query (identical halves) is answered publicly after STOP.
    let same = Ensemble::from_probabilities(&[0.25; 4], &[0.25; 16]).unwrap();
    let out = m.step(&same, &mut rng, &mut account).unwrap();
    assert_eq!(out.diagnostics.public_reason, Some(PublicReason::Stopped));
    assert_eq!(m.responses(), 51);
}

#[test]
fn same_seed_same_tokens() {
    let run = |seed| {
        let mut m = SubMix::paper_heuristic(2, 2.0, 64).unwrap();
        let mut account = Budget::new(Orders::default(), 1e6, 1e-5).unwrap();
        let mut rng = PrivacyRng::from_seed(seed);
        let e = spiky(2);
        (0..40)
            .map(|_| m.step(&e, &mut rng, &mut account).unwrap().token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn a_refused_account_charge_releases_nothing_and_spends_nothing() {
    let mut m = SubMix::new(2, 2.0, 0.5, 10.0).unwrap();
    let mut account = Budget::new(Orders::new(vec![2.0]).unwrap(), 1e-6, 1e-5).unwrap();
    let mut rng = PrivacyRng::from_seed(1);
    let err = m.step(&spiky(2), &mut rng, &mut account).unwrap_err();
    assert!(matches!(err, MechanismError::ChargeRefused(_)), "{err}");
    assert_eq!(m.budgets().max_spent(), 0.0);
    assert_eq!(m.responses(), 0);
    assert!(!m.is_stopped());
}

#[test]
fn random_stopping_stops_at_tau_or_after_b_responses() {
    let mut rng = PrivacyRng::from_seed(3);
    let rs = RandomStopping::new(10, 2.0, &mut rng).unwrap();
    let tau = rs.stop_before();
    assert!((1..=20).contains(&tau));
    let mut m = SubMix::new(1, 2.0, 1e-3, 1e3)
        .unwrap()
        .with_random_stopping(rs);
    let eps = m.fixed_length_epsilon().unwrap().unwrap();
    assert!(eps >= 1e3 + 20f64.ln() && eps <= (1e3 + 20f64.ln()) * (1.0 + 1e-12));
    let mut account = Budget::new(Orders::new(vec![2.0]).unwrap(), 1e6, 1e-5).unwrap();
    let e = Ensemble::from_probabilities(&[0.5, 0.5], &[0.6, 0.4, 0.4, 0.6]).unwrap();
    for t in 1..=25u64 {
        let out = m.step(&e, &mut rng, &mut account).unwrap();
        let public = out.diagnostics.public_reason.is_some();
        assert_eq!(public, t >= tau || t > 10, "t = {t}, tau = {tau}");
    }
    // Prop. C.3's parameters are validated.
    assert!(RandomStopping::new(0, 2.0, &mut rng).is_err());
    assert!(RandomStopping::new(10, 0.5, &mut rng).is_err());
    assert!(RandomStopping::new(10, 0.55, &mut rng).is_err()); // C·B = 5.5
    assert!(RandomStopping::new(10, f64::NAN, &mut rng).is_err());
}

#[test]
fn bad_inputs_are_typed_errors() {
    assert!(SubMix::new(0, 2.0, 0.1, 1.0).is_err());
    assert!(SubMix::new(2, 1.0, 0.1, 1.0).is_err());
    assert!(SubMix::new(2, 2.0, -0.1, 1.0).is_err());
    assert!(SubMix::new(2, 2.0, 0.1, -1.0).is_err());
    assert!(SubMix::new(2, 2.0, 0.1, f64::INFINITY).is_err());
    assert!(SubMix::paper_heuristic(2, 1.0, 0).is_err());
    let mut m = SubMix::new(3, 2.0, 0.1, 1.0).unwrap();
    let mut account = Budget::new(Orders::new(vec![2.0]).unwrap(), 1.0, 1e-5).unwrap();
    let mut rng = PrivacyRng::from_seed(1);
    assert!(matches!(
        m.step(&spiky(2), &mut rng, &mut account),
        Err(MechanismError::InvalidParameter {
            name: "members",
            ..
        })
    ));
}
