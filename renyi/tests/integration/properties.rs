//! Property tests of the divergences (proptest): the theorems every Rényi divergence
//! satisfies (van Erven & Harremoës 2014), checked on random distributions, plus
//! agreement between the kernels (ratio vs log space, batched vs scalar).

use privmix_renyi::{
    Direction, Order, batched_divergence, divergence, divergence_log, kl_divergence,
    symmetric_divergence,
};
use proptest::prelude::*;

/// A random distribution on `len` points: positive weights spanning many orders of
/// magnitude, some exact zeros when `zeros`.
fn distribution(len: std::ops::Range<usize>, zeros: bool) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((0.0..1.0_f64, -12.0..0.0_f64, 0..10u8), len).prop_map(move |raw| {
        let mut v: Vec<f64> = raw
            .iter()
            .map(|&(u, e, z)| {
                if zeros && z == 0 {
                    0.0
                } else {
                    (0.1 + u) * 10f64.powf(e)
                }
            })
            .collect();
        if v.iter().all(|&x| x == 0.0) {
            v[0] = 1.0;
        }
        let s: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= s);
        v
    })
}

/// Two distributions of the same length, the second with full support.
fn pair() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
    (2..40usize).prop_flat_map(|n| (distribution(n..n + 1, true), distribution(n..n + 1, false)))
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![
        (1.0001..3.0_f64).prop_map(|a| Order::new(a).unwrap()),
        (3.0..100.0_f64).prop_map(|a| Order::new(a).unwrap()),
        (2..64u32).prop_map(|k| Order::new(f64::from(k)).unwrap()),
        Just(Order::Infinite),
    ]
}

/// A scalar divergence function, for comparing with the batched kernel.
type Scalar = fn(&[f64], &[f64], Order) -> privmix_renyi::Result<f64>;

fn close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #[test]
    fn non_negative_and_zero_on_equal_inputs((p, q) in pair(), alpha in order()) {
        let d = divergence(&p, &q, alpha).unwrap();
        prop_assert!(d >= 0.0);
        prop_assert_eq!(divergence(&p, &p, alpha).unwrap(), 0.0);
        prop_assert_eq!(divergence(&q, &q, alpha).unwrap(), 0.0);
        prop_assert_eq!(kl_divergence(&p, &p).unwrap(), 0.0);
        let lp: Vec<f64> = p.iter().map(|x| x.ln()).collect();
        prop_assert_eq!(divergence_log(&lp, &lp, alpha).unwrap(), 0.0);
    }

    /// D = 0 only for equal distributions: moving mass δ from the largest entry to
    /// another gives D ≥ KL ≥ 2δ² (Pinsker, TV = δ). δ ≥ 1e-4/(2·30) keeps the bound
    /// (≥ 5e-12) far above f64 rounding of the result (~1e-16); differences below that
    /// noise floor are not resolvable in f64 and may come out as 0.
    #[test]
    fn positive_on_different_inputs(
        q in distribution(2..30, false),
        eps in 1e-4..0.5_f64,
        to in 0usize..30,
        alpha in order(),
    ) {
        let from = (0..q.len()).max_by(|&i, &j| q[i].total_cmp(&q[j])).unwrap();
        let to = if to % q.len() == from { (from + 1) % q.len() } else { to % q.len() };
        let mut p = q.clone();
        let moved = eps * 0.5 * p[from];
        p[from] -= moved;
        p[to] += moved;
        let pinsker = 2.0 * moved * moved;
        prop_assert!(divergence(&p, &q, alpha).unwrap() >= pinsker * (1.0 - 1e-3));
        prop_assert!(divergence(&q, &p, alpha).unwrap() >= pinsker * (1.0 - 1e-3));
        prop_assert!(kl_divergence(&p, &q).unwrap() >= pinsker * (1.0 - 1e-3));
    }

    #[test]
    fn non_decreasing_in_order((p, q) in pair(), a in 1.0001..50.0_f64, step in 0.0..50.0_f64) {
        let lo = divergence(&p, &q, Order::new(a).unwrap()).unwrap();
        let hi = divergence(&p, &q, Order::new(a + step).unwrap()).unwrap();
        let inf = divergence(&p, &q, Order::Infinite).unwrap();
        let kl = kl_divergence(&p, &q).unwrap();
        prop_assert!(kl <= lo * (1.0 + 1e-12) + 1e-14, "KL {} > D_{} {}", kl, a, lo);
        prop_assert!(lo <= hi * (1.0 + 1e-12) + 1e-14, "D_{} {} > D_{} {}", a, lo, a + step, hi);
        prop_assert!(hi <= inf * (1.0 + 1e-12) + 1e-14);
    }

    /// Data processing: merging two outcomes (a deterministic channel) never increases D.
    #[test]
    fn merging_outcomes_never_increases(
        (p, q) in pair(),
        alpha in order(),
        i in 0usize..40,
        j in 0usize..40,
    ) {
        let n = p.len();
        let (i, j) = (i % n, j % n);
        prop_assume!(i != j);
        let merge = |v: &[f64]| {
            let mut w: Vec<f64> = v.to_vec();
            w[i] += w[j];
            w.remove(j);
            w
        };
        let before = divergence(&p, &q, alpha).unwrap();
        let after = divergence(&merge(&p), &merge(&q), alpha).unwrap();
        prop_assert!(after <= before * (1.0 + 1e-12) + 1e-14, "{} > {}", after, before);
        let kl_after = kl_divergence(&merge(&p), &merge(&q)).unwrap();
        prop_assert!(kl_after <= kl_divergence(&p, &q).unwrap() * (1.0 + 1e-12) + 1e-14);
    }

    /// Continuity at α → 1: with X = log(p/q) under p, D_{1+t} − KL = t·K''(ξ)/2 for some
    /// ξ ∈ (0, t) (K the cumulant generating function of X), and K''(ξ) ≤ E_ξ[X²] ≤
    /// e^{2t·max|X|}·E_p[X²]; so |D_{1+t} − KL| ≤ (t/2)·e^{2t·max|X|}·E_p[X²].
    #[test]
    fn continuous_to_kl((p, q) in pair(), t in 1e-9..1e-3_f64) {
        let kl = kl_divergence(&p, &q).unwrap();
        let d = divergence(&p, &q, Order::new(1.0 + t).unwrap()).unwrap();
        let (mut second, mut max_abs) = (0.0_f64, 0.0_f64);
        for (&a, &b) in p.iter().zip(&q) {
            if a > 0.0 {
                let x = (a / b).ln();
                second += a * x * x;
                max_abs = max_abs.max(x.abs());
            }
        }
        let bound = 0.5 * t * (2.0 * t * max_abs).exp() * second;
        let within = (d - kl).abs() <= bound * (1.0 + 1e-9) + 1e-13;
        prop_assert!(within, "D {} KL {} bound {}", d, kl, bound);
    }

    #[test]
    fn symmetric_is_the_larger_direction((p, q) in pair(), alpha in order()) {
        let s = symmetric_divergence(&p, &q, alpha).unwrap();
        let f = divergence(&p, &q, alpha).unwrap();
        let r = divergence(&q, &p, alpha).unwrap();
        prop_assert!(s >= f && s >= r);
        prop_assert_eq!(s, f.max(r));
        prop_assert_eq!(s, symmetric_divergence(&q, &p, alpha).unwrap());
    }

    /// Ratio kernels (probability input) against log-space kernels (log input).
    #[test]
    fn probability_and_log_inputs_agree((p, q) in pair(), alpha in order()) {
        let lp: Vec<f64> = p.iter().map(|x| x.ln()).collect();
        let lq: Vec<f64> = q.iter().map(|x| x.ln()).collect();
        let a = divergence(&p, &q, alpha).unwrap();
        let b = divergence_log(&lp, &lq, alpha).unwrap();
        prop_assert!(close(a, b, 1e-12), "{} vs {}", a, b);
        let a = divergence(&q, &p, alpha).unwrap();
        let b = divergence_log(&lq, &lp, alpha).unwrap();
        prop_assert!(close(a, b, 1e-12), "reverse {} vs {}", a, b);
    }

    #[test]
    fn batched_equals_scalar(
        rows in (1..6usize, 2..600usize).prop_flat_map(|(n, len)| {
            let rows = prop::collection::vec(distribution(len..len + 1, true), n);
            (rows, distribution(len..len + 1, false))
        }),
        alpha in order(),
    ) {
        let (rows, reference) = rows;
        let flat: Vec<f64> = rows.concat();
        for (dir, f) in [
            (Direction::Forward, (|r, q, a| divergence(r, q, a)) as Scalar),
            (Direction::Reverse, |r, q, a| divergence(q, r, a)),
            (Direction::Symmetric, |r, q, a| symmetric_divergence(r, q, a)),
        ] {
            let batch = batched_divergence(&flat, &reference, alpha, dir).unwrap();
            prop_assert_eq!(batch.len(), rows.len());
            for (got, row) in batch.iter().zip(&rows) {
                prop_assert_eq!(*got, f(row, &reference, alpha).unwrap());
            }
        }
        // f32 buffers too.
        let flat32: Vec<f32> = flat.iter().map(|&x| x as f32).collect();
        let ref32: Vec<f32> = reference.iter().map(|&x| x as f32).collect();
        let batch = batched_divergence(&flat32, &ref32, alpha, Direction::Forward).unwrap();
        for (k, got) in batch.iter().enumerate() {
            let row = &flat32[k * ref32.len()..(k + 1) * ref32.len()];
            prop_assert_eq!(*got, divergence(row, &ref32, alpha).unwrap());
        }
    }
}
