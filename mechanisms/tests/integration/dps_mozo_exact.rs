//! DPS-MOZO, checked exactly: the output distribution of a token is averaged over ALL
//! n_shots-subsets of a small demonstration set, for the set and for every replace-one
//! neighbour, and the charged (amplified) RDP bounds the divergence at every order; for
//! fixed subsets the pure-DP bound 4b holds pointwise.

use privmix_accountant::{Budget, Orders};
use privmix_mechanisms::{
    DpsMozo, DpsMozoConfig, IclMechanism, IclSource, MechanismError, PrivacyRng, calibrate_radius,
    dps_mozo_charge, dps_mozo_output, dps_mozo_token_curve, draw_demonstrations, generate_icl,
};
use proptest::prelude::*;

/// Orders the charges are checked at (fractional ones use WBK's interpolation).
const ORDERS: [f64; 7] = [1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0];

/// All `k`-subsets of `0..n`, increasing.
fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    rec(0, n, k, &mut Vec::new(), &mut out);
    out
}

/// The exact output distribution of one token: the mean over all subsets.
fn exact_output(config: &DpsMozoConfig, zero: &[f64], demos: &[Vec<f64>]) -> Vec<f64> {
    let all = subsets(demos.len(), config.n_shots());
    let mut p = vec![0.0; zero.len()];
    for s in &all {
        let rows: Vec<&[f64]> = s.iter().map(|&i| demos[i].as_slice()).collect();
        let out = dps_mozo_output(config, zero, &rows).unwrap();
        for (px, ox) in p.iter_mut().zip(out.distribution(zero.len())) {
            *px += ox / all.len() as f64;
        }
    }
    p
}

/// An independent Rényi divergence (direct formula), both directions.
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

fn logits(v: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(-8.0f64..8.0, v)
}

/// (vocab, zero-shot, demos, replacement row, n_shots, top_k, radius)
type Case = (usize, Vec<f64>, Vec<Vec<f64>>, Vec<f64>, usize, usize, f64);

fn case() -> impl Strategy<Value = Case> {
    (2usize..=6, 1usize..=8).prop_flat_map(|(v, n)| {
        (
            Just(v),
            logits(v),
            prop::collection::vec(logits(v), n),
            logits(v),
            1usize..=n.min(3),
            1usize..=v,
            prop_oneof![0.001f64..0.05, 0.05f64..2.0],
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn charged_rdp_bounds_every_replace_one_neighbour((v, zero, demos, new, n_shots, top_k, b) in case()) {
        let config = DpsMozoConfig::new(n_shots, top_k, b).unwrap();
        let orders = Orders::new(ORDERS.to_vec()).unwrap();
        let charge = dps_mozo_charge(&orders, b, n_shots, demos.len()).unwrap();
        let out = exact_output(&config, &zero, &demos);
        prop_assert!((out.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        prop_assert_eq!(out.len(), v);
        for j in 0..demos.len() {
            let mut neighbour = demos.clone();
            neighbour[j] = new.clone();
            let out2 = exact_output(&config, &zero, &neighbour);
            for (i, &a) in ORDERS.iter().enumerate() {
                let d = naive_dsym(&out, &out2, a);
                let c = charge.epsilons()[i];
                prop_assert!(d <= c * (1.0 + 1e-9) + 1e-12, "order {a}: Dsym {d} > charge {c}");
            }
        }
    }

    #[test]
    fn fixed_subsets_differing_in_one_demo_are_4b_pure_dp(
        (v, zero, demos, new, n_shots, top_k, b) in case(),
    ) {
        let config = DpsMozoConfig::new(n_shots, top_k, b).unwrap();
        let rows: Vec<&[f64]> = demos.iter().take(n_shots).map(Vec::as_slice).collect();
        let out = dps_mozo_output(&config, &zero, &rows).unwrap();
        prop_assert!(out.lambdas.iter().all(|&l| (0.0..=1.5).contains(&l)));
        for j in 0..rows.len() {
            let mut other = rows.clone();
            other[j] = new.as_slice();
            let out2 = dps_mozo_output(&config, &zero, &other).unwrap();
            prop_assert_eq!(&out.support, &out2.support);
            for (x, y) in out.log_probs.iter().zip(&out2.log_probs) {
                prop_assert!((x - y).abs() <= 4.0 * b + 1e-12, "{x} vs {y}, 4b = {}", 4.0 * b);
            }
        }
        // Nothing outside the support, and the support is the zero-shot top-k.
        let full = out.distribution(v);
        prop_assert_eq!(full.iter().filter(|&&p| p > 0.0).count() <= top_k, true);
    }

    #[test]
    fn drawn_subsets_are_uniform_sets(n in 1usize..8, k in 1usize..4, seed in any::<u64>()) {
        let k = k.min(n);
        let mut rng = PrivacyRng::from_seed(seed);
        let s = draw_demonstrations(n, k, &mut rng).unwrap();
        prop_assert_eq!(s.len(), k);
        prop_assert!(s.windows(2).all(|w| w[0] < w[1]) && s.iter().all(|&i| i < n));
    }
}

#[test]
fn subset_draws_are_uniform() {
    // 4-of-... 2-subsets of 4: six subsets, each with probability 1/6.
    let mut rng = PrivacyRng::from_seed(9);
    let all = subsets(4, 2);
    let mut counts = vec![0usize; all.len()];
    let trials = 60_000;
    for _ in 0..trials {
        let s = draw_demonstrations(4, 2, &mut rng).unwrap();
        counts[all.iter().position(|a| *a == s).unwrap()] += 1;
    }
    for c in counts {
        let share = c as f64 / trials as f64;
        assert!((share - 1.0 / 6.0).abs() < 0.01, "{share}");
    }
}

#[test]
fn token_curve_is_min_of_pure_and_zcdp_and_amplification_helps() {
    let orders = Orders::new(vec![1.5, 2.0, 100.0]).unwrap();
    let b = 0.05;
    let c = dps_mozo_token_curve(&orders, b).unwrap();
    // 4b = 0.2: α·0.04/2 = 0.03, 0.04, then capped at 0.2.
    let want = [0.03, 0.04, 0.2];
    for (x, w) in c.epsilons().iter().zip(want) {
        assert!(*x >= w && *x <= w * (1.0 + 1e-15), "{x} vs {w}");
    }
    let amp = dps_mozo_charge(&orders, b, 2, 20).unwrap();
    for (a, x) in amp.epsilons().iter().zip(c.epsilons()) {
        assert!(a < x);
    }
    // n_shots = |D| is no amplification: the token curve at the realised ε (4b plus the
    // proven f64 slack of `dps_mozo_charge`), within 1e-9 of the ideal curve.
    let at_q1 = dps_mozo_charge(&orders, b, 5, 5).unwrap();
    for (x, y) in at_q1.epsilons().iter().zip(c.epsilons()) {
        assert!(x > y && *x <= y * (1.0 + 1e-9), "{x} vs {y}");
    }
}

#[test]
fn calibration_returns_the_feasible_lower_bracket() {
    let orders = Orders::integers(64).unwrap();
    let (eps, delta, tokens, n_shots, n) = (2.0, 1e-5, 1000u64, 4usize, 100usize);
    let b = calibrate_radius(&orders, eps, delta, tokens, n_shots, n).unwrap();
    let spend = |b: f64| {
        dps_mozo_charge(&orders, b, n_shots, n)
            .unwrap()
            .self_compose(tokens)
            .epsilon(delta)
            .unwrap()
            .epsilon
    };
    assert!(b > 0.0 && spend(b) <= eps);
    assert!(spend(b * (1.0 + 1e-8)) > eps);
    assert!(calibrate_radius(&orders, eps, delta, tokens, 5, 4).is_err());
    assert!(calibrate_radius(&orders, eps, delta, tokens, 1, 0).is_err());
    assert!(calibrate_radius(&orders, -1.0, delta, tokens, 1, 4).is_err());
    assert!(calibrate_radius(&orders, eps, 1.5, tokens, 1, 4).is_err());
}

/// A fixed table of logits: the zero-shot row depends on the context length.
struct Table {
    zero: Vec<f64>,
    demos: Vec<Vec<f64>>,
}

impl IclSource for Table {
    fn demonstrations(&self) -> usize {
        self.demos.len()
    }
    fn zero_shot_logits(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        let mut z = self.zero.clone();
        let i = context.len() % z.len();
        z[i] += 0.5;
        Ok(z)
    }
    fn one_shot_logits(
        &mut self,
        demo: usize,
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        let mut l = self.demos[demo].clone();
        let i = context.len() % l.len();
        l[i] += 0.5;
        Ok(l)
    }
}

fn table() -> Table {
    Table {
        zero: vec![1.0, 0.5, 0.0, -1.0, -2.0],
        demos: vec![
            vec![0.0, 3.0, 0.0, -1.0, -2.0],
            vec![2.0, 0.5, 1.0, -1.0, -2.0],
            vec![1.0, 0.5, 0.0, 2.0, -2.0],
            vec![-1.0, 0.5, 3.0, -1.0, -2.0],
        ],
    }
}

#[test]
fn same_seed_same_tokens_and_each_token_is_charged() {
    let config = DpsMozoConfig::new(2, 4, 0.3).unwrap();
    let orders = Orders::integers(32).unwrap();
    let run = |seed| {
        let mut m = DpsMozo::new(config);
        let mut account = Budget::new(orders.clone(), 100.0, 1e-5).unwrap();
        let mut rng = PrivacyRng::from_seed(seed);
        let g = generate_icl(
            &mut m,
            &mut table(),
            &[7, 7],
            30,
            None,
            &mut rng,
            &mut account,
        )
        .unwrap();
        (g, account)
    };
    let (g1, a1) = run(4);
    let (g2, _) = run(4);
    let (g3, _) = run(5);
    assert_eq!(g1.tokens, g2.tokens);
    assert_ne!(g1.tokens, g3.tokens);
    // Only top-4 tokens of the zero-shot row are ever produced; index 4 never is.
    assert!(g1.tokens.iter().all(|&t| t < 5));
    let per_token = config.token_charge(&orders, 4).unwrap();
    assert!(
        g1.steps
            .iter()
            .all(|s| s.charge == per_token && s.diagnostics.drawn.len() == 2)
    );
    for (spent, one) in a1.spent().epsilons().iter().zip(per_token.epsilons()) {
        assert!(
            (spent - 30.0 * one).abs() <= 1e-12 * spent,
            "{spent} vs 30 × {one}"
        );
    }
}

#[test]
fn exhausted_budget_refuses_and_releases_nothing() {
    let config = DpsMozoConfig::new(2, 4, 5.0).unwrap();
    let orders = Orders::integers(32).unwrap();
    let mut account = Budget::new(orders, 0.5, 1e-5).unwrap();
    let mut m = DpsMozo::new(config);
    let mut rng = PrivacyRng::from_seed(1);
    let err = m
        .step(&mut table(), &[1], &mut rng, &mut account)
        .unwrap_err();
    assert!(matches!(err, MechanismError::ChargeRefused(_)), "{err}");
    assert!(account.spent().epsilons().iter().all(|&e| e == 0.0));
    let err = generate_icl(&mut m, &mut table(), &[1], 5, None, &mut rng, &mut account);
    assert!(matches!(err, Err(MechanismError::ChargeRefused(_))));
}

#[test]
fn extreme_logits_never_give_nan() {
    let config = DpsMozoConfig::new(2, 3, 0.5).unwrap();
    let zero = [0.0, f64::NEG_INFINITY, -1e300, 1e300, 3.0];
    let one_hot = [
        0.0,
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
    ];
    let huge = [-1e308, -1e308, 1e308, -1e308, -1e308];
    let out = dps_mozo_output(&config, &zero, &[&one_hot, &huge]).unwrap();
    assert!(out.log_probs.iter().all(|x| !x.is_nan()));
    // The one-hot demo has −∞ on the support: no λ > 0 is feasible. The huge one only
    // admits a vanishing λ.
    assert_eq!(out.lambdas[0], 0.0);
    assert!(
        out.lambdas[1] >= 0.0 && out.lambdas[1] < 1e-90,
        "{:?}",
        out.lambdas
    );
    assert!((out.log_probs.iter().map(|x| x.exp()).sum::<f64>() - 1.0).abs() < 1e-15);
    // A one-hot zero-shot row: the support is the single finite token.
    let out = dps_mozo_output(&config, &one_hot, &[&one_hot, &huge]).unwrap();
    assert_eq!(
        (out.support.as_slice(), out.log_probs.as_slice()),
        (&[0][..], &[0.0][..])
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let c = DpsMozoConfig::new(1, 2, 0.1).unwrap();
    let z = [0.0, 1.0, 2.0];
    assert!(matches!(
        dps_mozo_output(&c, &z, &[&[0.0, 1.0]]),
        Err(MechanismError::LengthMismatch { .. })
    ));
    assert!(matches!(
        dps_mozo_output(&c, &z, &[&[0.0, f64::NAN, 1.0]]),
        Err(MechanismError::NonFinite {
            row: 1,
            index: 1,
            ..
        })
    ));
    assert!(matches!(
        dps_mozo_output(&c, &[0.0, f64::INFINITY, 1.0], &[&z]),
        Err(MechanismError::NonFinite { row: 0, .. })
    ));
    assert!(matches!(
        dps_mozo_output(&c, &z, &[]),
        Err(MechanismError::EmptyEnsemble)
    ));
    assert!(matches!(
        dps_mozo_output(&c, &[], &[&z]),
        Err(MechanismError::EmptyVocabulary)
    ));
    let wide = DpsMozoConfig::new(1, 4, 0.1).unwrap();
    assert!(dps_mozo_output(&wide, &z, &[&z]).is_err());
    assert!(DpsMozoConfig::new(0, 2, 0.1).is_err());
    assert!(DpsMozoConfig::new(1, 0, 0.1).is_err());
    assert!(DpsMozoConfig::new(1, 2, -0.1).is_err());
    assert!(DpsMozoConfig::new(1, 2, f64::NAN).is_err());
    assert!(c.with_lambda_max(0.0).is_err());
    let mut rng = PrivacyRng::from_seed(0);
    assert!(draw_demonstrations(0, 1, &mut rng).is_err());
    assert!(draw_demonstrations(3, 4, &mut rng).is_err());
    let orders = Orders::integers(8).unwrap();
    assert!(dps_mozo_charge(&orders, 0.1, 4, 3).is_err());
    assert!(dps_mozo_charge(&orders, 0.1, 1, 0).is_err());
    // n_shots larger than the source's demonstration set.
    let mut m = DpsMozo::new(DpsMozoConfig::new(5, 2, 0.1).unwrap());
    let mut account = Budget::new(orders, 10.0, 1e-5).unwrap();
    assert!(matches!(
        m.step(&mut table(), &[], &mut rng, &mut account),
        Err(MechanismError::InvalidParameter {
            name: "n_shots",
            ..
        })
    ));
}
