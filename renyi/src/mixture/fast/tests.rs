//! The λ = 1 answer of the ratio pass against the table's own scaled pass and the
//! general kernels, on rows whose ratios leave `e^{±600/α}` (where the unscaled sums
//! would overflow or lose their terms), with zeros on either side.

use super::*;
use crate::{MixturePath, validate};

/// A distribution of `len` entries `10^{−spread·u}` (xorshift on `seed`), normalised,
/// with every `zero_every`-th entry (from `first_zero`) set to 0.
fn row(len: usize, seed: u64, spread: f64, zeros: Option<(usize, usize)>) -> Vec<f64> {
    crate::test_rows::wide_row(len, seed, spread, |w| {
        if let Some((first, every)) = zeros {
            w.iter_mut()
                .skip(first)
                .step_by(every)
                .for_each(|x| *x = 0.0);
        }
    })
}

fn table(p: &[f64], q: &[f64], k: u32) -> RatioTable {
    let order = Order::new(f64::from(k)).unwrap();
    let summaries = [
        validate::probabilities(p).unwrap(),
        validate::probabilities(q).unwrap(),
    ];
    RatioTable::new(p, q, order, summaries).expect("the closed-form path applies")
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    got == want || (got - want).abs() <= tol * (1.0 + got.abs().max(want.abs()))
}

/// Values to `1e-13` relative, slopes to `1e-9` (the slope sums hold `d = r − 1`,
/// which cancels near r = 1), never NaN.
fn assert_agree(got: Pair, want: Pair, what: &str) {
    for (g, w) in [(got.0, want.0), (got.1, want.1)] {
        assert!(!g.value.is_nan() && !g.slope.is_nan(), "{what}: {g:?}");
        assert!(close(g.value, w.value, 1e-13), "{what}: {g:?} vs {w:?}");
        assert!(close(g.slope, w.slope, 1e-9), "{what}: {g:?} vs {w:?}");
    }
}

#[test]
fn lambda_one_from_the_ratio_pass_agrees_with_the_slow_paths_at_extreme_ratios() {
    let mut answered = 0;
    // Lengths with and without a scalar tail; ratios beyond e^{±320} at planted
    // positions, a spread of 40 decades elsewhere.
    for (len, seed) in [(1000, 1), (5003, 2), (37, 3)] {
        let plant = |mut v: Vec<f64>, small: usize, large: usize| {
            (v[small], v[large]) = (0.3e-140, 0.3);
            let s: f64 = v.iter().sum();
            v.into_iter().map(|x| x / s).collect::<Vec<f64>>()
        };
        let p = plant(row(len, 2 * seed, 40.0, None), 2, 1);
        let q = plant(row(len, 2 * seed + 1, 40.0, None), 1, 2);
        for k in [2, 3, 18, 36, 64, 256, 257, 1024] {
            let t = table(&p, &q, k);
            let alpha = f64::from(k);
            assert!(
                alpha * t.r_max.ln() > 600.0 && -alpha * t.r_min.ln() > 600.0,
                "{len} {k}: the old unscaled sums would not serve"
            );
            let what = format!("V {len}, α {k}");
            // The general kernels on the explicit rows.
            let order = Order::new(alpha).unwrap();
            let general = (
                MixturePath::forward(&p, &q, order)
                    .unwrap()
                    .evaluate(1.0)
                    .unwrap(),
                MixturePath::reverse(&p, &q, order)
                    .unwrap()
                    .evaluate(1.0)
                    .unwrap(),
            );
            // The table's own pass scaled by the extremes of t (its answer before).
            let mut slow = t.clone();
            slow.at_one = None;
            let scaled = slow.evaluate(&q, 1.0);
            match t.at_one {
                Some(pair) => {
                    assert!(k <= SCALED_MAX_ORDER, "{what}");
                    assert_agree(pair, general, &what);
                    assert_agree(pair, scaled.expect("the scaled pass serves"), &what);
                    assert_eq!(t.evaluate(&q, 1.0), Some(pair));
                    answered += 1;
                }
                // Above the scaled orders only in-range ratios are answered.
                None => assert!(k > SCALED_MAX_ORDER, "{what}"),
            }
        }
    }
    assert_eq!(answered, 3 * 6);
}

/// Zeros in p (the reverse divergence at λ = 1 is `+∞`), in q (the forward one is), and
/// in both at the same positions (masked, weight 0).
#[test]
fn lambda_one_with_zeros_on_either_side() {
    for (len, k) in [(1000, 36), (203, 2), (203, 18)] {
        let order = Order::new(f64::from(k)).unwrap();
        let q_full = row(len, 7, 30.0, None);
        let p_zeros = row(len, 8, 30.0, Some((3, 17)));
        let q_zeros = row(len, 9, 30.0, Some((5, 11)));
        let mut both_p = row(len, 10, 30.0, Some((5, 11)));
        both_p[5 + 11] = 0.0; // normalisation moves little: renormalise
        let s: f64 = both_p.iter().sum();
        both_p.iter_mut().for_each(|x| *x /= s);
        for (p, q, fwd_inf, rev_inf) in [
            (&p_zeros, &q_full, false, true),
            (&q_full, &q_zeros, true, false),
            (&both_p, &q_zeros, false, false),
        ] {
            let t = table(p, q, k);
            let what = format!("V {len}, α {k}, {fwd_inf} {rev_inf}");
            let pair = t.at_one.expect("answered from the ratio pass");
            let general = (
                MixturePath::forward(p, q, order)
                    .unwrap()
                    .evaluate(1.0)
                    .unwrap(),
                MixturePath::reverse(p, q, order)
                    .unwrap()
                    .evaluate(1.0)
                    .unwrap(),
            );
            assert_eq!(pair.0.value == f64::INFINITY, fwd_inf, "{what}: {pair:?}");
            assert_eq!(pair.1.value == f64::INFINITY, rev_inf, "{what}: {pair:?}");
            assert_agree(pair, general, &what);
        }
    }
}

/// Where the ratios stay within `2^{±⌊400/k⌋}` the scales never move and the sums are
/// the unscaled ones; where they stay within `e^{±600/α}` the values are formed from the
/// unscaled sums (multiplied back), as before the sums were scaled.
#[test]
fn mild_ratios_keep_the_unscaled_sums() {
    for (k, spread) in [(2, 1.0), (36, 1.0), (300, 0.2)] {
        let p = row(3001, 11, spread, None);
        let q = row(3001, 12, spread, None);
        let t = table(&p, &q, k);
        let at = pulp::Arch::new().dispatch(Ratios {
            p: &p,
            q: &q,
            r: &mut vec![0.0; p.len()],
            k,
            careful: false,
        });
        assert_eq!((at.at_one.e_hi, at.at_one.e_lo), (0, 0), "{k}");
        assert_eq!(at.at_one.unscaled(k), at.at_one.sums);
        let [a, b, c, d] = at.at_one.sums;
        assert_eq!(t.at_one, Some(t.pair(1.0, a.ln(), b / a, c.ln(), d / c)));
    }
}
