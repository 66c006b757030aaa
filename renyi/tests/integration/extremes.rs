//! Extreme inputs: probabilities down to the smallest subnormal, one-hot vectors, orders
//! up to 1e6 and beyond. The integer fast path (ratios raised by repeated
//! multiplication) is checked against the log-space kernels (log-probability input)
//! right up to the smallest entries it accepts (1e-150).

use privmix_renyi::{
    Direction, Order, batched_divergence, divergence, divergence_log, kl_divergence,
    kl_divergence_log, symmetric_divergence,
};
use proptest::prelude::*;

fn normalised(mut v: Vec<f64>) -> Vec<f64> {
    let s: f64 = v.iter().sum();
    v.iter_mut().for_each(|x| *x /= s);
    v
}

fn logs(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x.ln()).collect()
}

/// Weights `10^e` with `e` uniform in `[lo, 0]`, normalised; optional exact zeros.
fn wide(len: usize, lo: f64, zeros: bool) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((lo..0.0_f64, 0..8u8), len).prop_map(move |raw| {
        let mut v: Vec<f64> = raw
            .iter()
            .map(|&(e, z)| if zeros && z == 0 { 0.0 } else { 10f64.powf(e) })
            .collect();
        v[0] = 1.0; // keep the sum ≈ 1 before normalising
        normalised(v)
    })
}

fn all_orders() -> Vec<Order> {
    [
        1.0 + 1e-9,
        1.01,
        1.5,
        2.0,
        3.0,
        17.5,
        18.0,
        64.0,
        1000.0,
        1e6,
        1e6 + 0.5,
        1e12,
        1e300,
    ]
    .into_iter()
    .map(|a| Order::new(a).unwrap())
    .chain([Order::Infinite])
    .collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Integer and fractional fast paths against log space, entries down to 1e-149.
    #[test]
    fn ratio_kernels_match_log_space(
        (p, q) in (2..300usize).prop_flat_map(|n| (wide(n, -149.0, true), wide(n, -149.0, false))),
        k in prop_oneof![2..40u32, 40..2000u32, Just(1_000_000u32)],
        frac in 0.0..1.0_f64,
    ) {
        let (lp, lq) = (logs(&p), logs(&q));
        for alpha in [Order::new(f64::from(k)).unwrap(), Order::new(f64::from(k) + frac).unwrap()] {
            for (x, y, lx, ly) in [(&p, &q, &lp, &lq), (&q, &p, &lq, &lp)] {
                let fast = divergence(x, y, alpha).unwrap();
                let slow = divergence_log(lx, ly, alpha).unwrap();
                prop_assert!(!fast.is_nan() && !slow.is_nan());
                prop_assert!(close(fast, slow, 1e-11), "α={:?}: {} vs {}", alpha, fast, slow);
            }
        }
    }

    /// Below 1e-150 probability input switches to log space: results stay finite,
    /// non-negative, ordered in α, and equal to the log-input kernels.
    #[test]
    fn subnormal_and_tiny_entries_never_give_nan(
        (p, q) in (2..50usize).prop_flat_map(|n| (wide(n, -323.0, true), wide(n, -320.0, false))),
    ) {
        let (lp, lq) = (logs(&p), logs(&q));
        let mut previous = kl_divergence(&p, &q).unwrap();
        prop_assert!(close(previous, kl_divergence_log(&lp, &lq).unwrap(), 1e-11));
        for alpha in all_orders() {
            let d = divergence(&p, &q, alpha).unwrap();
            prop_assert!(!d.is_nan() && d >= 0.0, "α={:?}: {}", alpha, d);
            let monotone = d >= previous * (1.0 - 1e-9) - 1e-12;
            prop_assert!(monotone, "α={:?}: {} < {}", alpha, d, previous);
            prop_assert!(close(d, divergence_log(&lp, &lq, alpha).unwrap(), 1e-11));
            let r = divergence(&q, &p, alpha).unwrap();
            prop_assert!(!r.is_nan());
            previous = d;
        }
    }
}

#[test]
fn probabilities_of_1e_300() {
    let p = [1.0 - 2e-300, 1e-300, 1e-300];
    let q = [1.0 - 1e-300, 0.5e-300, 0.5e-300];
    for alpha in all_orders() {
        for (x, y) in [(&p, &q), (&q, &p)] {
            let d = divergence(x, y, alpha).unwrap();
            // True value: both terms at 1e-300 scale are negligible beside the first
            // except through the ratio 2 (or 1/2) raised to α − 1; for every order
            // here the divergence is below 1e-290 unless α − 1 ≳ 1000.
            assert!(!d.is_nan() && d >= 0.0, "{alpha:?}: {d}");
            let l = divergence_log(&logs(x), &logs(y), alpha).unwrap();
            assert!(close(d, l, 1e-12), "{alpha:?}: {d} vs {l}");
        }
    }
    // α = ∞ picks the ratio 2 at the tiny entries: log 2, here computed in log space as
    // log(1e-300) − log(0.5e-300), each ≈ −690 with an ulp of 1.1e-13.
    assert!((divergence(&p, &q, Order::Infinite).unwrap() - 2f64.ln()).abs() < 1e-12);
    // α = 1e6: Σ p^α q^{1−α} = 1 + 2·1e-300·2^(α−1), dominated by the second term, so
    // D = log 2 + log(2e-300)/(α − 1) to far better than 1e-9.
    let d = divergence(&p, &q, Order::new(1e6).unwrap()).unwrap();
    let expected = 2f64.ln() + (2e-300_f64).ln() / (1e6 - 1.0);
    assert!((d - expected).abs() < 1e-9, "{d} vs {expected}");
}

#[test]
fn one_hot_vectors() {
    let mut e0 = vec![0.0; 1000];
    e0[0] = 1.0;
    let mut e1 = vec![0.0; 1000];
    e1[1] = 1.0;
    let uniform = vec![1e-3; 1000];
    for alpha in all_orders() {
        assert_eq!(divergence(&e0, &e0, alpha).unwrap(), 0.0);
        assert_eq!(divergence(&e0, &e1, alpha).unwrap(), f64::INFINITY);
        assert_eq!(divergence(&uniform, &e0, alpha).unwrap(), f64::INFINITY);
        let d = divergence(&e0, &uniform, alpha).unwrap();
        assert!((d - 1000f64.ln()).abs() < 1e-12, "{alpha:?}: {d}");
        assert_eq!(
            symmetric_divergence(&e0, &uniform, alpha).unwrap(),
            f64::INFINITY
        );
    }
    assert!((kl_divergence(&e0, &uniform).unwrap() - 1000f64.ln()).abs() < 1e-12);
}

#[test]
fn subnormal_reference_entries() {
    // q has a subnormal entry where p has ordinary mass: the ratio overflows f64, the
    // divergence is large but finite, computed in log space.
    let p = [0.5, 0.5];
    let q = [1.0 - 5e-324, 5e-324];
    let lr = 0.5_f64.ln() - 5e-324_f64.ln(); // log(p₁/q₁) ≈ 743.7
    assert!((divergence(&p, &q, Order::Infinite).unwrap() - lr).abs() < 1e-12);
    for a in [2.0, 18.0, 1e6] {
        let d = divergence(&p, &q, Order::new(a).unwrap()).unwrap();
        // D_α ≈ log(p₁^α q₁^{1−α})/(α−1) = lr + log(p₁)/(α−1) when that term dominates.
        let approx = lr + 0.5_f64.ln() / (a - 1.0);
        assert!((d - approx).abs() < 1e-9 * approx, "α={a}: {d} vs {approx}");
    }
    assert!(kl_divergence(&p, &q).unwrap().is_finite());
}

#[test]
fn extreme_log_inputs() {
    // Log-probabilities far below f64's range (log q = −1e300) are valid input.
    let lp = [0.5_f64.ln(), 0.5_f64.ln()];
    let lq = [0.0, -1e300];
    let d = divergence_log(&lp, &lq, Order::new(2.0).unwrap()).unwrap();
    assert!(d > 1e299 && d.is_finite(), "{d}");
    let d = divergence_log(&lp, &lq, Order::new(1e300).unwrap()).unwrap();
    assert!(d > 1e299 && d.is_finite(), "{d}");
    assert!(divergence_log(&lp, &lq, Order::new(1.0 + 1e-12).unwrap()).unwrap() > 1e299);
    assert_eq!(
        divergence_log(&lp, &lq, Order::Infinite).unwrap(),
        0.5_f64.ln() + 1e300
    );
    let kl = kl_divergence_log(&lp, &lq).unwrap();
    assert!(kl > 1e299 && kl.is_finite());
    // The other way round the huge log-ratio is weighted by q's tiny mass.
    let d = divergence_log(&lq, &lp, Order::new(2.0).unwrap()).unwrap();
    assert!(d.is_finite() && (d - 2f64.ln()).abs() < 1e-12, "{d}");
}

#[test]
fn orders_close_to_one_and_huge() {
    let p = [0.9, 0.1];
    let q = [0.3, 0.7];
    let kl = kl_divergence(&p, &q).unwrap();
    let d = divergence(&p, &q, Order::new(1.0 + 1e-15).unwrap()).unwrap();
    assert!((d - kl).abs() < 1e-13, "{d} vs {kl}");
    let inf = divergence(&p, &q, Order::Infinite).unwrap();
    for a in [1e12, 1e100, 1e300, f64::MAX] {
        let d = divergence(&p, &q, Order::new(a).unwrap()).unwrap();
        assert!((d - inf).abs() < 1e-10, "α={a}: {d} vs {inf}");
    }
    let batch = batched_divergence(
        &[p, q].concat(),
        &q,
        Order::new(1e6).unwrap(),
        Direction::Symmetric,
    )
    .unwrap();
    assert!(batch.iter().all(|d| !d.is_nan()));
    assert_eq!(batch[1], 0.0);
}
