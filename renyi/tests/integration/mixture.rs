//! Mixture paths: the value equals the divergence of the explicit mixture, the slope
//! equals a finite difference of the value, endpoints and support changes behave as
//! documented, and the one-pass symmetric evaluator equals the two separate paths
//! (bitwise, or to 1e-13 where it uses its closed-form integer-order path).

use privmix_renyi::{
    MixturePath, Order, SymmetricMixture, ValidatedRow, divergence, symmetric_divergence,
};
use proptest::prelude::*;

fn distribution(n: usize, lo: f64, zeros: bool) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((lo..0.0_f64, 0..6u8), n).prop_map(move |raw| {
        let mut v: Vec<f64> = raw
            .iter()
            .map(|&(e, z)| if zeros && z == 0 { 0.0 } else { 10f64.powf(e) })
            .collect();
        v[0] = 1.0;
        let s: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= s);
        v
    })
}

/// (a, b, c): `a` and `b` may have zeros, `c` has full support (a finite path).
fn triple(lo: f64) -> impl Strategy<Value = (Vec<f64>, Vec<f64>, Vec<f64>)> {
    (2..60usize).prop_flat_map(move |n| {
        (
            distribution(n, lo, true),
            distribution(n, lo, true),
            distribution(n, lo, false),
        )
    })
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![
        (1.05..4.0_f64).prop_map(|a| Order::new(a).unwrap()),
        (4.0..30.0_f64).prop_map(|a| Order::new(a).unwrap()),
        (2..33u32).prop_map(|k| Order::new(f64::from(k)).unwrap()),
        Just(Order::Infinite),
    ]
}

fn mix(lambda: f64, x: &[f64], c: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(c)
        .map(|(&x, &c)| lambda * x + (1.0 - lambda) * c)
        .collect()
}

/// Whether `SymmetricMixture` may answer from its closed-form integer-order path, which
/// agrees with the general kernels to rounding rather than bitwise.
fn closed_form(alpha: Order, lambda: f64) -> bool {
    alpha.integer().is_some_and(|k| k >= 2) && lambda > 0.0
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// Central difference of the value, and whether the left and right differences agree
/// (they do not at a kink of the max divergence).
fn central_difference(path: &MixturePath, lambda: f64, h: f64) -> (f64, bool) {
    let v = |l: f64| path.evaluate(l).unwrap().value;
    let (lo, mid, hi) = (v(lambda - h), v(lambda), v(lambda + h));
    let (left, right) = ((mid - lo) / h, (hi - mid) / h);
    ((hi - lo) / (2.0 * h), close(left, right, 1e-3))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn value_is_the_divergence_of_the_mixture(
        (a, b, c) in triple(-6.0),
        alpha in order(),
        lambda in 0.0..=1.0_f64,
    ) {
        let (m, n) = (mix(lambda, &a, &c), mix(lambda, &b, &c));
        let got = MixturePath::new(&a, &b, &c, alpha).unwrap().evaluate(lambda).unwrap();
        let want = divergence(&m, &n, alpha).unwrap();
        prop_assert!(close(got.value, want, 1e-12), "{} vs {}", got.value, want);
        prop_assert!(!got.slope.is_nan());
        // forward / reverse against the explicit mixture with q itself.
        let fwd = MixturePath::forward(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        prop_assert!(close(fwd.value, divergence(&mix(lambda, &a, &c), &c, alpha).unwrap(), 1e-12));
        let rev = MixturePath::reverse(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        prop_assert!(close(rev.value, divergence(&c, &mix(lambda, &a, &c), alpha).unwrap(), 1e-12));
    }

    #[test]
    fn slope_matches_finite_differences(
        (a, b, c) in triple(-6.0),
        alpha in order(),
        lambda in 0.01..0.99_f64,
    ) {
        let path = MixturePath::new(&a, &b, &c, alpha).unwrap();
        let got = path.evaluate(lambda).unwrap();
        prop_assume!(got.value.is_finite());
        let (fd, smooth) = central_difference(&path, lambda, 1e-6);
        prop_assume!(smooth || alpha != Order::Infinite);
        prop_assert!(close(got.slope, fd, 1e-5), "slope {} vs finite difference {}", got.slope, fd);
    }

    /// On the ratio kernels (α ≥ 1.125, entries ≥ 1e-150) the path's value is bitwise the
    /// scalar divergence of the explicit mixture, in every direction.
    #[test]
    fn value_is_bitwise_the_scalar_divergence(
        (a, b, c) in triple(-6.0),
        alpha in prop_oneof![
            (1.125..30.0_f64).prop_map(|a| Order::new(a).unwrap()),
            (2..33u32).prop_map(|k| Order::new(f64::from(k)).unwrap()),
        ],
        lambda in prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0_f64],
    ) {
        let (m, n) = (mix(lambda, &a, &c), mix(lambda, &b, &c));
        let path = MixturePath::new(&a, &b, &c, alpha).unwrap().evaluate(lambda).unwrap();
        prop_assert_eq!(path.value, divergence(&m, &n, alpha).unwrap());
        // `SymmetricMixture`'s closed-form integer-order path (λ > 0) agrees to rounding
        // (it rounds its value up one ulp); every other case is bitwise.
        let sym = SymmetricMixture::new(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        let want = [
            (sym.forward.value, divergence(&m, &c, alpha).unwrap()),
            (sym.reverse.value, divergence(&c, &m, alpha).unwrap()),
            (sym.max(), symmetric_divergence(&m, &c, alpha).unwrap()),
        ];
        for (got, want) in want {
            if closed_form(alpha, lambda) {
                prop_assert!(close(got, want, 1e-13), "{} vs {}", got, want);
            } else {
                prop_assert_eq!(got, want);
            }
        }
    }

    /// `SymmetricMixture` is the two `MixturePath`s in one pass, bitwise (to 1e-13 on
    /// its closed-form path, whose λ = 1 comes from the sums of its construction pass).
    #[test]
    fn symmetric_equals_both_paths(
        (a, _b, c) in triple(-6.0),
        alpha in order(),
        lambda in prop_oneof![Just(1.0), 0.0..=1.0_f64],
    ) {
        let both = SymmetricMixture::new(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        let fwd = MixturePath::forward(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        let rev = MixturePath::reverse(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        if closed_form(alpha, lambda) {
            for (got, want) in [(both.forward, fwd), (both.reverse, rev)] {
                prop_assert!(close(got.value, want.value, 1e-13), "{:?} vs {:?}", got, want);
                prop_assert!(close(got.slope, want.slope, 1e-13), "{:?} vs {:?}", got, want);
            }
        } else {
            prop_assert_eq!(both.forward, fwd);
            prop_assert_eq!(both.reverse, rev);
            prop_assert_eq!(both.max(), fwd.value.max(rev.value));
        }
    }

    /// Along λp + (1−λ)q against q (either direction) the divergence starts at 0 and does
    /// not decrease (quasi-convexity), so its slope is ≥ 0.
    #[test]
    fn forward_and_reverse_paths_are_monotone(
        (a, _b, c) in triple(-6.0),
        alpha in order(),
        l1 in 0.0..=1.0_f64,
        l2 in 0.0..=1.0_f64,
    ) {
        let (lo, hi) = if l1 <= l2 { (l1, l2) } else { (l2, l1) };
        let paths = [
            MixturePath::forward(&a, &c, alpha).unwrap(),
            MixturePath::reverse(&a, &c, alpha).unwrap(),
        ];
        for path in paths {
            prop_assert_eq!(path.evaluate(0.0).unwrap().value, 0.0);
            let (x, y) = (path.evaluate(lo).unwrap(), path.evaluate(hi).unwrap());
            prop_assert!(x.value <= y.value * (1.0 + 1e-12) + 1e-15, "{} > {}", x.value, y.value);
            prop_assert!(x.slope >= -1e-9 * (1.0 + x.value), "negative slope {}", x.slope);
        }
    }

    /// Entries down to 1e-250 (log-space accumulator) and orders above 1e12 (exponents
    /// scaled by 1/(α−1)): values still match the explicit mixture, slopes the finite
    /// differences, and nothing is NaN.
    #[test]
    fn log_space_accumulator(
        (a, b, c) in triple(-250.0),
        big in prop::bool::ANY,
        lambda in 0.01..0.99_f64,
    ) {
        let alpha = if big { Order::new(3e13).unwrap() } else { Order::new(7.5).unwrap() };
        let path = MixturePath::new(&a, &b, &c, alpha).unwrap();
        let got = path.evaluate(lambda).unwrap();
        let want = divergence(&mix(lambda, &a, &c), &mix(lambda, &b, &c), alpha).unwrap();
        prop_assert!(close(got.value, want, 1e-10), "{} vs {}", got.value, want);
        let (fd, smooth) = central_difference(&path, lambda, 1e-7);
        prop_assume!(smooth);
        prop_assert!(close(got.slope, fd, 1e-4), "slope {} vs {}", got.slope, fd);
    }

    #[test]
    fn never_nan_at_extremes(
        (a, b, c) in (2..20usize).prop_flat_map(|n| {
            let d = || distribution(n, -323.0, true);
            (d(), d(), d())
        }),
        alpha in prop_oneof![
            Just(1.0 + 1e-12), Just(2.0), Just(18.0), Just(1e6), Just(1e300), Just(f64::INFINITY)
        ],
        lambda in prop_oneof![Just(0.0), Just(1e-300), Just(0.5), Just(1.0 - 1e-16), Just(1.0)],
    ) {
        let alpha = Order::new(alpha).unwrap();
        for path in [
            MixturePath::new(&a, &b, &c, alpha).unwrap(),
            MixturePath::forward(&a, &c, alpha).unwrap(),
            MixturePath::reverse(&a, &c, alpha).unwrap(),
        ] {
            let v = path.evaluate(lambda).unwrap();
            prop_assert!(!v.value.is_nan() && !v.slope.is_nan() && v.value >= 0.0, "{:?}", v);
        }
        let s = SymmetricMixture::new(&a, &b, alpha).unwrap().evaluate(lambda).unwrap();
        prop_assert!(!s.max().is_nan() && !s.forward.slope.is_nan() && !s.reverse.slope.is_nan());
    }
}

fn order_of(a: f64) -> Order {
    Order::new(a).unwrap()
}

#[test]
fn slope_at_zero_is_zero_for_full_support() {
    let p = [0.7, 0.2, 0.1];
    let q = [0.2, 0.3, 0.5];
    for alpha in [1.5, 2.0, 18.0, 18.5] {
        let path = MixturePath::forward(&p, &q, order_of(alpha)).unwrap();
        let at0 = path.evaluate(0.0).unwrap();
        assert_eq!(at0.value, 0.0);
        assert!(at0.slope.abs() < 1e-12, "{alpha}: {}", at0.slope);
        // D(λ) ≈ (α/2)·χ²(p‖q)·λ² near 0.
        let chi2: f64 = p.iter().zip(&q).map(|(a, b)| (a - b) * (a - b) / b).sum();
        let small = path.evaluate(1e-4).unwrap();
        assert!(
            close(small.value, 0.5 * alpha * chi2 * 1e-8, 1e-3),
            "{alpha}: {}",
            small.value
        );
        assert!(close(small.slope, alpha * chi2 * 1e-4, 1e-3));
    }
}

#[test]
fn support_mismatch_is_infinite_and_slope_at_zero_too() {
    let p = [0.5, 0.5];
    let q = [1.0, 0.0];
    for alpha in [order_of(2.0), order_of(2.5), Order::Infinite] {
        let fwd = MixturePath::forward(&p, &q, alpha).unwrap();
        let at0 = fwd.evaluate(0.0).unwrap();
        assert_eq!((at0.value, at0.slope), (0.0, f64::INFINITY));
        let later = fwd.evaluate(0.25).unwrap();
        assert_eq!((later.value, later.slope), (f64::INFINITY, f64::INFINITY));
        // The reverse direction stays finite below λ = 1 ...
        let rev = MixturePath::reverse(&p, &q, alpha).unwrap();
        assert!(rev.evaluate(0.5).unwrap().value.is_finite());
        // ... and at λ = 1 it is D(q‖p), finite here (q ≪ p).
        let at1 = rev.evaluate(1.0).unwrap();
        assert!((at1.value - 2f64.ln()).abs() < 1e-15, "{:?}", at1);
    }
    // Reverse path whose end point lacks support: value → ∞ as λ → 1.
    let rev = MixturePath::reverse(&q, &p, order_of(2.0)).unwrap();
    assert_eq!(rev.evaluate(1.0).unwrap().value, f64::INFINITY);
    let near = rev.evaluate(1.0 - 1e-9).unwrap();
    assert!(near.value.is_finite() && near.slope > 1e8, "{near:?}");
}

/// At λ = 0 an element with c = 0 < a, b contributes λ·a^α b^{1−α} to Σ m^α n^{1−α}:
/// the slope there is its full rate. At λ = 1 an element with a = b = 0 < c contributes
/// (1−λ)·c. Both checked against one-sided finite differences.
#[test]
fn one_sided_slopes_where_both_arguments_vanish() {
    let a = [0.5, 0.3, 0.2, 0.0];
    let b = [0.2, 0.2, 0.6, 0.0];
    let c = [0.6, 0.4, 0.0, 0.0];
    let c1 = [0.4, 0.3, 0.0, 0.3]; // a = b = 0 < c at the last element
    for alpha in [
        order_of(2.0),
        order_of(3.5),
        order_of(18.0),
        Order::Infinite,
    ] {
        let h = 1e-7;
        let path = MixturePath::new(&a, &b, &c, alpha).unwrap();
        let (v0, vh) = (path.evaluate(0.0).unwrap(), path.evaluate(h).unwrap());
        assert_eq!(v0.value, 0.0);
        let fd = (vh.value - v0.value) / h;
        if alpha == Order::Infinite {
            // Limit ratio a/b = 1/3 at the c = 0 element is below 1: no jump.
            assert!(close(v0.slope, fd, 1e-4), "{alpha:?}: {} vs {fd}", v0.slope);
        } else {
            assert!(close(v0.slope, fd, 1e-4), "{alpha:?}: {} vs {fd}", v0.slope);
            assert!(v0.slope > 0.0);
        }
        let path = MixturePath::new(&a, &b, &c1, alpha).unwrap();
        let (v1, v1h) = (path.evaluate(1.0).unwrap(), path.evaluate(1.0 - h).unwrap());
        let fd = (v1.value - v1h.value) / h;
        assert!(
            close(v1.slope, fd, 1e-4),
            "{alpha:?} at 1: {} vs {fd}",
            v1.slope
        );
    }
    // c = 0 < a with b = 0: infinite for every λ > 0, so +∞ slope at 0.
    let b0 = [0.2, 0.2, 0.0, 0.6];
    let path = MixturePath::new(&a, &b0, &c, order_of(2.0)).unwrap();
    assert_eq!(path.evaluate(0.0).unwrap().slope, f64::INFINITY);
    assert_eq!(path.evaluate(0.5).unwrap().value, f64::INFINITY);
}

#[test]
fn max_divergence_path_takes_the_active_term() {
    let p = [0.6, 0.3, 0.1];
    let q = [0.2, 0.3, 0.5];
    let path = MixturePath::forward(&p, &q, Order::Infinite).unwrap();
    // D_∞(λ) = log(1 + λ(p₀/q₀ − 1)) = log(1 + 2λ); slope 2/(1 + 2λ).
    for lambda in [0.0, 0.1, 0.5, 1.0] {
        let v = path.evaluate(lambda).unwrap();
        assert!((v.value - (1.0 + 2.0 * lambda).ln()).abs() < 1e-15);
        assert!(
            (v.slope - 2.0 / (1.0 + 2.0 * lambda)).abs() < 1e-14,
            "{lambda}: {v:?}"
        );
    }
}

/// The closed-form integer-order path of `SymmetricMixture` at the edges of its domain:
/// ratios p/q from 0 to about 1e149 (entries down to 1e-150), λ from 1e-300 to 1, orders
/// up to 4096. Values agree with the general kernels (`MixturePath`) to 1e-13, slopes
/// to 1e-9, nothing is NaN, and a value is never below the general kernel's by more
/// than rounding.
#[test]
fn symmetric_closed_form_at_extremes() {
    let mut p = vec![1e-150, 0.0, 0.3, 0.2, 1e-3, 0.0];
    let mut q = vec![0.25, 1e-150, 0.1, 0.35, 0.2, 1e-9];
    for v in [&mut p, &mut q] {
        let s: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= s);
    }
    for alpha in [2.0, 18.0, 36.0, 4096.0] {
        let alpha = order_of(alpha);
        let sym = SymmetricMixture::new(&p, &q, alpha).unwrap();
        let (fwd, rev) = (
            MixturePath::forward(&p, &q, alpha).unwrap(),
            MixturePath::reverse(&p, &q, alpha).unwrap(),
        );
        for lambda in [1e-300, 1e-12, 1e-6, 0.01, 0.5, 0.999, 1.0 - 1e-16, 1.0] {
            let got = sym.evaluate(lambda).unwrap();
            let want = [fwd.evaluate(lambda).unwrap(), rev.evaluate(lambda).unwrap()];
            for (g, w) in [(got.forward, want[0]), (got.reverse, want[1])] {
                assert!(
                    !g.value.is_nan() && !g.slope.is_nan(),
                    "{alpha:?} {lambda}: {g:?}"
                );
                assert!(
                    close(g.value, w.value, 1e-13),
                    "{alpha:?} {lambda}: {g:?} vs {w:?}"
                );
                assert!(
                    close(g.slope, w.slope, 1e-9),
                    "{alpha:?} {lambda}: {g:?} vs {w:?}"
                );
                let floor = w.value - 1e-13 * (1.0 + w.value);
                assert!(g.value == w.value || g.value >= floor, "{g:?} vs {w:?}");
            }
        }
    }
    // p has mass where q has none: forward +∞ for every λ > 0, reverse finite below 1.
    let (p, q) = ([0.5, 0.25, 0.25], [0.5, 0.5, 0.0]);
    let sym = SymmetricMixture::new(&p, &q, order_of(18.0)).unwrap();
    let rev = MixturePath::reverse(&p, &q, order_of(18.0)).unwrap();
    for lambda in [1e-9, 0.5, 1.0] {
        let got = sym.evaluate(lambda).unwrap();
        assert_eq!(
            (got.forward.value, got.forward.slope),
            (f64::INFINITY, f64::INFINITY)
        );
        let want = rev.evaluate(lambda).unwrap();
        assert!(
            close(got.reverse.value, want.value, 1e-13),
            "{got:?} vs {want:?}"
        );
        assert!(
            close(got.reverse.slope, want.slope, 1e-9),
            "{got:?} vs {want:?}"
        );
    }
}

proptest! {
    /// A public row validated once gives bitwise the same evaluations as validating it
    /// per construction (entries down to 1e-300 exercise the general kernels, larger
    /// ones the closed-form integer path).
    #[test]
    fn validated_public_row_is_bitwise_the_same(
        (a, _, c) in triple(-300.0),
        alpha in order(),
        lambda in prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0_f64],
    ) {
        let public = ValidatedRow::new(&c).unwrap();
        let old = SymmetricMixture::new(&a, &c, alpha).unwrap().evaluate(lambda).unwrap();
        let new = SymmetricMixture::with_public(&a, &public, alpha)
            .unwrap()
            .evaluate(lambda)
            .unwrap();
        prop_assert_eq!(old, new);
    }
}

#[test]
fn validated_row_rejects_what_validation_rejects() {
    assert!(ValidatedRow::new(&[]).is_err());
    assert!(ValidatedRow::new(&[0.5, 0.6]).is_err());
    assert!(ValidatedRow::new(&[1.5, -0.5]).is_err());
    assert!(ValidatedRow::new(&[f64::NAN, 1.0]).is_err());
    let q = [0.25, 0.75];
    let public = ValidatedRow::new(&q).unwrap();
    assert_eq!(public.row(), &q);
    // The private row is validated, and the lengths must match.
    let alpha = Order::new(2.0).unwrap();
    assert!(SymmetricMixture::with_public(&[0.5, 0.6], &public, alpha).is_err());
    assert!(SymmetricMixture::with_public(&[1.0], &public, alpha).is_err());
}

/// Found by CI (proptest case `cc 6a293dfe…`): at `p/q ≈ 2.3e-5` the closed form used to
/// compute `t = 1 + λ·(p/q − 1)`, which cancels and kept only ~37 bits of `p/q`; raised to
/// α = 32 the reverse divergence was off by 1.4e-13 relative. `t = (1−λ) + λ·p/q` is exact
/// here (λ = 1), so the value now agrees with the scalar divergence to rounding.
#[test]
fn closed_form_keeps_precision_where_the_ratio_is_tiny() {
    let a = [0.9999985914929886, 1.408507011277005e-6];
    let c = [0.9393543401651709, 0.06064565983482909];
    for alpha in [2.0, 8.0, 32.0, 1024.0] {
        let order = order_of(alpha);
        for lambda in [1.0, 0.999_999, 0.5] {
            let m = mix(lambda, &a, &c);
            let sym = SymmetricMixture::new(&a, &c, order)
                .unwrap()
                .evaluate(lambda)
                .unwrap();
            let want = [
                (sym.forward.value, divergence(&m, &c, order).unwrap()),
                (sym.reverse.value, divergence(&c, &m, order).unwrap()),
            ];
            for (got, want) in want {
                assert!(
                    close(got, want, 1e-14),
                    "α {alpha} λ {lambda}: {got} vs {want}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The closed-form path reuses the ratio buffer of a dropped evaluator on the same
    /// thread; whatever that buffer held (here: another pair's ratios, of another length,
    /// with zeros of q in the tail), the values are bitwise those of an evaluator built on
    /// a thread that never built one.
    #[test]
    fn a_reused_ratio_buffer_changes_nothing(
        (p, q, _) in triple(-12.0),
        (p2, q2, _) in triple(-12.0),
        lambda in 0.01..=1.0f64,
    ) {
        let alpha = Order::new(7.0).unwrap();
        let fresh = {
            let (p, q) = (p.clone(), q.clone());
            std::thread::spawn(move || {
                SymmetricMixture::new(&p, &q, alpha).unwrap().evaluate(lambda).unwrap()
            })
            .join()
            .unwrap()
        };
        drop(SymmetricMixture::new(&p2, &q2, alpha).unwrap());
        let reused = SymmetricMixture::new(&p, &q, alpha).unwrap().evaluate(lambda).unwrap();
        let bits = |v: privmix_renyi::SymmetricValue| {
            [v.forward.value, v.forward.slope, v.reverse.value, v.reverse.slope].map(f64::to_bits)
        };
        prop_assert_eq!(bits(fresh), bits(reused));
    }
}

/// The reused buffer's old entries are overwritten even where q = 0 in the scalar tail:
/// an earlier pair leaves ratios of ~1e139 there, which would overflow the powers of a
/// term whose weight is 0 (0·∞ = NaN) if they survived.
#[test]
fn a_reused_ratio_buffer_with_huge_stale_ratios_changes_nothing() {
    let alpha = Order::new(7.0).unwrap();
    // 11 entries: one or two whole vectors and a tail of three on any SIMD width.
    let normalise = |v: Vec<f64>| {
        let s: f64 = v.iter().sum();
        v.into_iter().map(|x| x / s).collect::<Vec<f64>>()
    };
    let mut q2 = vec![0.1; 11];
    let mut p2 = vec![0.01; 11];
    for x in 8..11 {
        q2[x] = 1e-140;
        p2[x] = 0.3;
    }
    let (p2, q2) = (normalise(p2), normalise(q2));
    let mut q = vec![0.125; 11];
    for x in q.iter_mut().skip(8) {
        *x = 0.0;
    }
    let p = normalise((1..=11).map(|x| x as f64).collect());
    let q = normalise(q);
    for lambda in [0.3, 1.0] {
        let fresh = {
            let (p, q) = (p.clone(), q.clone());
            std::thread::spawn(move || {
                SymmetricMixture::new(&p, &q, alpha)
                    .unwrap()
                    .evaluate(lambda)
                    .unwrap()
            })
            .join()
            .unwrap()
        };
        drop(SymmetricMixture::new(&p2, &q2, alpha).unwrap());
        let reused = SymmetricMixture::new(&p, &q, alpha)
            .unwrap()
            .evaluate(lambda)
            .unwrap();
        assert!(!reused.reverse.value.is_nan(), "{reused:?}");
        assert_eq!(format!("{fresh:?}"), format!("{reused:?}"));
    }
}

proptest! {
    /// Against a q with zeros (the closed-form path's masked ratio pass): the same
    /// values and slopes as the two separate paths, to rounding, at λ = 1 and inside.
    #[test]
    fn symmetric_equals_both_paths_against_a_q_with_zeros(
        (a, _b, c) in triple(-6.0),
        k in 2..20u32,
        lambda in prop_oneof![Just(1.0), 0.01..=1.0_f64],
    ) {
        prop_assume!(a.contains(&0.0));
        let alpha = Order::new(f64::from(k)).unwrap();
        // q = a (zeros), p = c (full support): p has mass where q has none.
        let both = SymmetricMixture::new(&c, &a, alpha).unwrap().evaluate(lambda).unwrap();
        let fwd = MixturePath::forward(&c, &a, alpha).unwrap().evaluate(lambda).unwrap();
        let rev = MixturePath::reverse(&c, &a, alpha).unwrap().evaluate(lambda).unwrap();
        prop_assert_eq!(both.forward.value, f64::INFINITY);
        prop_assert_eq!(fwd.value, f64::INFINITY);
        prop_assert!(close(both.reverse.value, rev.value, 1e-13), "{:?} vs {:?}", both, rev);
        prop_assert!(close(both.reverse.slope, rev.slope, 1e-12), "{:?} vs {:?}", both, rev);
    }
}

proptest! {
    /// At λ = 1 the closed-form path answers from its ratio pass, scaled by powers of
    /// two that follow the ratios' range: on rows whose ratios reach `10^{±140}` (far
    /// beyond `e^{±600/α}`), with zeros on either side, it agrees with the two separate
    /// paths to rounding, and is `+∞` exactly where they are.
    #[test]
    fn lambda_one_agrees_with_both_paths_at_extreme_ratios(
        (p, q) in (2..80usize).prop_flat_map(|n| (distribution(n, -140.0, true), distribution(n, -140.0, true))),
        k in prop_oneof![2..20u32, Just(36), Just(64), Just(256)],
    ) {
        let alpha = Order::new(f64::from(k)).unwrap();
        let both = SymmetricMixture::new(&p, &q, alpha).unwrap().evaluate(1.0).unwrap();
        let fwd = MixturePath::forward(&p, &q, alpha).unwrap().evaluate(1.0).unwrap();
        let rev = MixturePath::reverse(&p, &q, alpha).unwrap().evaluate(1.0).unwrap();
        for (got, want) in [(both.forward, fwd), (both.reverse, rev)] {
            prop_assert!(!got.value.is_nan() && !got.slope.is_nan(), "{:?}", got);
            prop_assert_eq!(got.value == f64::INFINITY, want.value == f64::INFINITY);
            prop_assert!(close(got.value, want.value, 1e-13), "{:?} vs {:?}", got, want);
            prop_assert!(close(got.slope, want.slope, 1e-9), "{:?} vs {:?}", got, want);
        }
    }
}
