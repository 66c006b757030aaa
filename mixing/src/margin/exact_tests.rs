//! The certified solves against an independent exact evaluator: the Rényi divergence of
//! the f64 vectors a solve returns, normalised, computed in rational arithmetic (integer
//! orders and ∞, where it is a rational function of the entries) and compared with the
//! radius through a rigorous enclosure of `e^y` (Taylor series with a bounded tail).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};
use proptest::prelude::*;

use super::*;
use crate::{LogitMixing, PmixedProjection, SubmixPairProjection};
use privmix_renyi::round::{
    add_down, add_up, div_up, exp_down, exp_up, ln_down, ln_up, mul_down, mul_up, sum_down, sum_up,
};

fn rat(x: f64) -> BigRational {
    BigRational::from_float(x).expect("finite")
}

fn int(n: u64) -> BigRational {
    BigRational::from_integer(BigInt::from(n))
}

/// Lower and upper rational bounds on `e^y`, `y ≥ 0`, within `2⁻²⁰⁰` relative.
fn exp_bounds(y: &BigRational) -> (BigRational, BigRational) {
    let tiny = BigRational::new(BigInt::one(), BigInt::one() << 200);
    let (mut sum, mut term) = (BigRational::one(), BigRational::one());
    let mut j = 1u64;
    loop {
        term = term * y / int(j);
        sum += &term;
        j += 1;
        if int(j) > y * int(2) && term < &sum * &tiny {
            break;
        }
    }
    // Tail Σ_{i≥j} y^i/i! ≤ (y^j/j!)·1/(1 − y/(j+1)) ≤ 2·y^j/j! since j > 2y.
    let next = &term * y / int(j);
    (sum.clone(), sum + next * int(2))
}

/// Where the exact divergence lies relative to a radius.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Within,
    Beyond,
    /// Within `2⁻²⁰⁰` relative of the radius: not decided.
    Undecided,
}

/// `D_α(p/Σp ‖ q/Σq)` against `b`, exactly, for an integer order `Some(k)` (k ≥ 2) or
/// `None` (α = ∞).
fn exact_verdict(p: &[f64], q: &[f64], order: Option<u32>, b: f64) -> Verdict {
    let (sp, sq) = (
        p.iter().fold(BigRational::zero(), |s, &x| s + rat(x)),
        q.iter().fold(BigRational::zero(), |s, &x| s + rat(x)),
    );
    if p.iter().zip(q).any(|(&x, &y)| x > 0.0 && y == 0.0) {
        return Verdict::Beyond;
    }
    // D ≤ b ⇔ value ≤ e^y.
    let (value, y) = match order {
        Some(k) => {
            let mut s = BigRational::zero();
            for (&x, &z) in p.iter().zip(q) {
                if x > 0.0 {
                    s += num_traits::pow(rat(x), k as usize)
                        / num_traits::pow(rat(z), k as usize - 1);
                }
            }
            let norm = num_traits::pow(sq.clone(), k as usize - 1)
                / num_traits::pow(sp.clone(), k as usize);
            (s * norm, int(u64::from(k - 1)) * rat(b))
        }
        None => {
            let mut best = BigRational::zero();
            for (&x, &z) in p.iter().zip(q) {
                if x > 0.0 {
                    let r = rat(x) / rat(z);
                    if r > best {
                        best = r;
                    }
                }
            }
            (best * &sq / &sp, rat(b))
        }
    };
    let (lo, hi) = exp_bounds(&y);
    if value <= lo {
        Verdict::Within
    } else if value > hi {
        Verdict::Beyond
    } else {
        Verdict::Undecided
    }
}

fn order_of(k: Option<u32>) -> Order {
    match k {
        Some(k) => Order::new(f64::from(k)).unwrap(),
        None => Order::Infinite,
    }
}

/// A pseudo-random distribution of `len` entries (xorshift on `seed`): a Zipf-like
/// profile, with `tiny` entries scaled down to 1e-200 and below (the log-space kernels)
/// and `zeros` entries set to 0.
fn distribution(len: usize, seed: u64, tiny: usize, zeros: usize) -> Vec<f64> {
    let mut v: Vec<f64> = privmix_renyi::test_rows::uniforms(seed)
        .take(len)
        .enumerate()
        .map(|(i, u)| (0.2 + u) / (i as f64 + 1.0))
        .collect();
    for (j, x) in v.iter_mut().rev().take(tiny).enumerate() {
        *x *= [1e-200, 1e-300, 1e-310][j % 3];
    }
    for x in v.iter_mut().skip(1).step_by(3).take(zeros) {
        *x = 0.0;
    }
    let s: f64 = v.iter().sum();
    v.iter_mut().for_each(|x| *x /= s);
    v
}

/// The pairs the grid tests run on: (private, public).
fn pairs() -> Vec<(Vec<f64>, Vec<f64>)> {
    let close = |seed| {
        let q = distribution(17, seed, 0, 0);
        let p: Vec<f64> = q
            .iter()
            .enumerate()
            .map(|(i, &x)| x * (1.0 + if i % 2 == 0 { 1e-7 } else { -1e-7 }))
            .collect();
        (p, q)
    };
    vec![
        (distribution(3, 1, 0, 0), distribution(3, 2, 0, 0)),
        (distribution(17, 3, 0, 0), distribution(17, 4, 0, 0)),
        (distribution(40, 5, 0, 4), distribution(40, 6, 0, 0)),
        (distribution(24, 7, 3, 0), distribution(24, 8, 3, 0)),
        (distribution(24, 9, 0, 0), distribution(24, 10, 4, 0)),
        close(11),
    ]
}

const ORDERS: [Option<u32>; 4] = [Some(2), Some(3), Some(18), None];

/// Radii from subnormal to large, and some just above each margin.
fn radii(margin: f64) -> Vec<f64> {
    let mut r = vec![
        f64::from_bits(1),
        1e-300,
        1e-17,
        1e-16,
        1e-15,
        1e-12,
        1e-9,
        1e-6,
        1e-3,
        0.1,
        3.6,
    ];
    r.extend([1.5 * margin, 4.0 * margin, 100.0 * margin]);
    r
}

#[test]
fn certified_pmixed_mixtures_are_within_the_radius_exactly() {
    let mut positive = 0;
    for (p, q) in pairs() {
        for k in ORDERS {
            let order = order_of(k);
            let margin = evaluator_error(order, q.len()).unwrap().absolute;
            for b in radii(margin) {
                let proj = PmixedProjection::new(&p, &q, order, b).unwrap();
                let sol = proj.solve_certified().unwrap();
                let m = proj.mixture(sol.lambda).unwrap();
                let what = format!("α {k:?}, b {b:e}, V {}: {sol:?}", q.len());
                assert_eq!(
                    exact_verdict(&m, &q, k, b),
                    Verdict::Within,
                    "forward {what}"
                );
                assert_eq!(
                    exact_verdict(&q, &m, k, b),
                    Verdict::Within,
                    "reverse {what}"
                );
                if b <= margin {
                    assert_eq!(sol.lambda, 0.0, "{what}");
                }
                if b >= 4.0 * margin && sol.lambda > 0.0 {
                    positive += 1;
                }
            }
        }
    }
    // Radii just above the margin are not all answered with λ = 0.
    assert!(positive >= 60, "{positive}");
}

#[test]
fn certified_submix_mixtures_are_within_the_radius_exactly() {
    for (seed, (h, p0)) in pairs().into_iter().enumerate() {
        let h_prime = distribution(p0.len(), 100 + seed as u64, seed % 2, 0);
        for k in ORDERS {
            let order = order_of(k);
            let margin = evaluator_error(order, p0.len()).unwrap().absolute;
            for b in radii(margin) {
                let proj = SubmixPairProjection::new(&h, &h_prime, &p0, order, b).unwrap();
                let sol = proj.solve_certified().unwrap();
                let (l, mu) = (sol.lambda, 1.0 - sol.lambda);
                let mix = |x: &[f64]| -> Vec<f64> {
                    x.iter().zip(&p0).map(|(&a, &c)| l * a + mu * c).collect()
                };
                let what = format!("α {k:?}, b {b:e}: {sol:?}");
                assert_eq!(
                    exact_verdict(&mix(&h), &mix(&h_prime), k, b),
                    Verdict::Within,
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn identical_rows_keep_lambda_one_when_the_margin_swallows_the_radius() {
    let q = distribution(5, 1, 0, 0);
    let order = Order::new(2.0).unwrap();
    let sol = PmixedProjection::new(&q, &q, order, 1e-300)
        .unwrap()
        .solve_certified()
        .unwrap();
    assert_eq!(sol.lambda, 1.0);
    // A different row: λ = 0, the public row bit for bit.
    let p = distribution(5, 2, 0, 0);
    let proj = PmixedProjection::new(&p, &q, order, 1e-300).unwrap();
    let sol = proj.solve_certified().unwrap();
    assert_eq!((sol.lambda, sol.violated_at), (0.0, Some(1.0)));
    assert_eq!(proj.mixture(0.0).unwrap(), q);
}

/// Why the relative margin `b·(1 − 1e-9)` alone is not enough: for a tiny radius the
/// evaluator's absolute error exceeds it (it even evaluates some λ > 0 to exactly 0), and
/// the mixture of the λ the plain solve finds has an exact divergence above `b`. Cases
/// found by a search over the generator's seeds; which of them cross depends on the
/// evaluator's last bits (the summation order follows the SIMD width), so the test asks
/// for one.
#[test]
fn a_relative_margin_alone_can_exceed_a_tiny_radius() {
    // (seed, length, tiny entries, order, radius): p from seed 2s+1, q from 2s+2.
    let cases = [
        (1, 8, 1, Some(2), 1e-15),
        (15, 3, 0, Some(2), 1e-15),
        (15, 3, 0, Some(3), 1e-15),
        (3, 64, 0, Some(2), 1e-17),
        (3, 64, 0, Some(3), 1e-16),
        (8, 64, 2, Some(2), 1e-16),
    ];
    let mut beyond = 0;
    for (seed, len, tiny, k, b) in cases {
        let p = distribution(len, 2 * seed + 1, tiny, 0);
        let q = distribution(len, 2 * seed + 2, 0, 0);
        let proj = PmixedProjection::new(&p, &q, order_of(k), b * (1.0 - 1e-9)).unwrap();
        let sol = proj.solve().unwrap();
        let m = proj.mixture(sol.lambda).unwrap();
        if exact_verdict(&m, &q, k, b) == Verdict::Beyond
            || exact_verdict(&q, &m, k, b) == Verdict::Beyond
        {
            beyond += 1;
        }
        // The certified solve of the same projection stays within b.
        let certified = PmixedProjection::new(&p, &q, order_of(k), b)
            .unwrap()
            .solve_certified()
            .unwrap();
        assert_eq!(certified.lambda, 0.0, "{certified:?}");
    }
    assert!(beyond > 0, "no case crossed the radius");
}

/// `ln Σ exp(v)` rounded up (`up`) or down, with `privmix_renyi::round` (faithful-libm
/// assumption): an enclosure independent of privmix-renyi's divergence kernels.
fn log_sum_exp(v: &[f64], up: bool) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if up {
        add_up(
            max,
            ln_up(sum_up(v.iter().map(|&x| exp_up(add_up(x, -max))))),
        )
    } else {
        add_down(
            max,
            ln_down(sum_down(v.iter().map(|&x| exp_down(add_down(x, -max))))),
        )
    }
}

/// An upper bound on `D_α(softmax(a) ‖ softmax(b))` for logits `a`, `b`, integer order
/// `Some(k)` or ∞: `[lse(k·a − (k−1)·b) − k·lse(a) + (k−1)·lse(b)]/(k−1)`, or
/// `max(a − b) − lse(a) + lse(b)`, each operation rounded toward the upper side.
fn logit_divergence_up(a: &[f64], b: &[f64], order: Option<u32>) -> f64 {
    match order {
        Some(k) => {
            let (k, e) = (f64::from(k), f64::from(k - 1));
            let t_up: Vec<f64> = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| add_up(mul_up(k, x), -mul_down(e, y)))
                .collect();
            let head = add_up(
                log_sum_exp(&t_up, true),
                -mul_down(k, log_sum_exp(a, false)),
            );
            div_up(add_up(head, mul_up(e, log_sum_exp(b, true))), e)
        }
        None => {
            let top = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| add_up(x, -y))
                .fold(f64::NEG_INFINITY, f64::max);
            add_up(add_up(top, -log_sum_exp(a, false)), log_sum_exp(b, true))
        }
    }
}

/// Logits in [−5, 5) from xorshift on `seed`.
fn logits(len: usize, seed: u64) -> Vec<f64> {
    distribution(len, seed, 0, 0)
        .iter()
        .enumerate()
        .map(|(i, &x)| (x * 1e4 + i as f64).sin() * 5.0)
        .collect()
}

#[test]
fn certified_logit_mixtures_are_within_the_radius() {
    let mut positive = 0;
    for (seed, len) in [(1u64, 4usize), (2, 16), (3, 60)] {
        let zero_shot = logits(len, seed);
        let one_shot: Vec<f64> = logits(len, seed + 10)
            .iter()
            .zip(&zero_shot)
            .map(|(&d, &z)| z + 0.5 * d)
            .collect();
        for k in [Some(2), Some(3), None] {
            let order = order_of(k);
            let probe = LogitMixing::new(&one_shot, &zero_shot, order, 1.0).unwrap();
            let margin = probe.evaluator_error().unwrap().absolute;
            for b in radii(margin) {
                let mixing = LogitMixing::new(&one_shot, &zero_shot, order, b).unwrap();
                let sol = mixing.solve_certified().unwrap();
                let mixed = mixing.mixed_logits(sol.lambda).unwrap();
                let what = format!("α {k:?}, b {b:e}, V {len}: {sol:?}");
                if mixed == zero_shot {
                    // λ = 0: the same distribution, divergence exactly 0.
                    assert!(sol.lambda == 0.0 || b >= margin, "{what}");
                    continue;
                }
                positive += usize::from(b <= 100.0 * margin);
                let forward = logit_divergence_up(&mixed, &zero_shot, k);
                let reverse = logit_divergence_up(&zero_shot, &mixed, k);
                assert!(
                    forward <= b && reverse <= b,
                    "{what}: {forward:e}, {reverse:e}"
                );
            }
        }
    }
    assert!(positive >= 9, "{positive}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random rows, orders and radii (log-uniform from 1e-320 to 10): the certified
    /// mixture is within the radius in exact arithmetic, both directions.
    #[test]
    fn certified_pmixed_is_exact_for_random_rows(
        len in 2..24usize,
        seeds in (any::<u64>(), any::<u64>()),
        tiny in 0..3usize,
        k in prop::sample::select(ORDERS.to_vec()),
        log_b in -320.0..1.0_f64,
    ) {
        let p = distribution(len, seeds.0, tiny, len / 5);
        let q = distribution(len, seeds.1, tiny, 0);
        let b = 10f64.powf(log_b);
        let proj = PmixedProjection::new(&p, &q, order_of(k), b).unwrap();
        let sol = proj.solve_certified().unwrap();
        let m = proj.mixture(sol.lambda).unwrap();
        prop_assert_eq!(exact_verdict(&m, &q, k, b), Verdict::Within, "{:?}", sol);
        prop_assert_eq!(exact_verdict(&q, &m, k, b), Verdict::Within, "{:?}", sol);
    }
}

/// Entries `10^{−spread·u}` for uniform u (xorshift on `seed`), with the entry at `zero`
/// set to 0, then one entry `10^{−spread}` times smaller than the rest at `planted`:
/// ratios between two such rows reach `10^{±2·spread}`.
fn wide_distribution(
    len: usize,
    seed: u64,
    spread: f64,
    planted: usize,
    zero: Option<usize>,
) -> Vec<f64> {
    privmix_renyi::test_rows::wide_row(len, seed, spread, |w| {
        w[planted % len] *= 10f64.powf(-spread);
        if let Some(z) = zero {
            w[z % len] = 0.0;
        }
    })
}

/// `ln n` for a positive integer, enclosed: `n ∈ [m·2^s, (m+1)·2^s)` for its top 53 bits
/// `m`, each end's logarithm rounded outward with `privmix_renyi::round`.
fn ln_enclosure(n: &BigInt) -> (f64, f64) {
    let shift = n.bits().saturating_sub(53);
    let m: BigInt = n >> shift;
    let m = m.to_string().parse::<f64>().expect("53 bits");
    let s = shift as f64;
    (
        add_down(ln_down(m), mul_down(s, ln_down(2.0))),
        add_up(ln_up(m + 1.0), mul_up(s, ln_up(2.0))),
    )
}

/// `D_k(p/Σp ‖ q/Σq)`, enclosed from its exact rational `e^{(k−1)D}`; `None` where it
/// is `+∞`.
fn exact_enclosure(p: &[f64], q: &[f64], k: u32) -> Option<(f64, f64)> {
    if p.iter().zip(q).any(|(&x, &y)| x > 0.0 && y == 0.0) {
        return None;
    }
    let (sp, sq) = (
        p.iter().fold(BigRational::zero(), |s, &x| s + rat(x)),
        q.iter().fold(BigRational::zero(), |s, &x| s + rat(x)),
    );
    let mut s = BigRational::zero();
    for (&x, &z) in p.iter().zip(q) {
        if x > 0.0 {
            s += num_traits::pow(rat(x), k as usize) / num_traits::pow(rat(z), k as usize - 1);
        }
    }
    let value = s * num_traits::pow(sq, k as usize - 1) / num_traits::pow(sp, k as usize);
    let (num, den) = (ln_enclosure(value.numer()), ln_enclosure(value.denom()));
    let e = f64::from(k - 1);
    Some((
        privmix_renyi::round::div_down(add_down(num.0, -den.1), e),
        div_up(add_up(num.1, -den.0), e),
    ))
}

/// Whether `|D̂ − D| ≤ ρ·D + A` for the exact `D` (enclosed to about `2⁻⁵²` absolute):
/// `D ≤ (D̂ + A)/(1 − ρ)` and `D ≥ (D̂ − A)/(1 + ρ)`.
fn within_the_model(p: &[f64], q: &[f64], k: u32, value: f64, error: EvaluatorError) -> bool {
    let (rho, a) = (error.relative, error.absolute);
    let Some((lo, hi)) = exact_enclosure(p, q, k) else {
        return value == f64::INFINITY;
    };
    let upper = div_up(add_up(value, a), sub_down(1.0, rho));
    let lower = privmix_renyi::round::div_down(add_down(value, -a), add_up(1.0, rho));
    hi <= upper && lo >= lower
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// At λ = 1 the closed-form path answers from its ratio pass's sums, scaled by
    /// powers of two that follow the ratios' extremes: on rows whose ratios reach far
    /// beyond `e^{±600/α}` (up to `10^{±100}`), with a zero in p (the reverse divergence
    /// is `+∞`) or in q (the forward one is), both directions are within the error
    /// model of `evaluator_error` of the exact divergence.
    #[test]
    fn lambda_one_values_are_within_the_error_model_at_extreme_ratios(
        len in 2..24usize,
        seeds in (any::<u64>(), any::<u64>()),
        spread in 1.0..50.0_f64,
        planted in (0..24usize, 0..24usize),
        zero in prop_oneof![Just(None), Just(Some(0)), Just(Some(1))],
        zero_at in 0..24usize,
        k in prop::sample::select(vec![2u32, 3, 7, 18, 36, 64]),
    ) {
        let p = wide_distribution(len, seeds.0, spread, planted.0, (zero == Some(0)).then_some(zero_at));
        let q = wide_distribution(len, seeds.1, spread, planted.1, (zero == Some(1)).then_some(zero_at));
        let order = order_of(Some(k));
        let value = privmix_renyi::SymmetricMixture::new(&p, &q, order)
            .unwrap()
            .evaluate(1.0)
            .unwrap();
        let error = evaluator_error(order, len).unwrap();
        prop_assert!(within_the_model(&p, &q, k, value.forward.value, error), "forward {:?}", value);
        prop_assert!(within_the_model(&q, &p, k, value.reverse.value, error), "reverse {:?}", value);
        // The check has teeth: a value off by 4A is outside the model.
        for (a, b, v) in [(&p, &q, value.forward.value), (&q, &p, value.reverse.value)] {
            if v.is_finite() {
                prop_assert!(!within_the_model(a, b, k, v + 4.0 * error.absolute, error));
                if v > 8.0 * error.absolute {
                    prop_assert!(!within_the_model(a, b, k, v - 4.0 * error.absolute, error));
                }
            }
        }
    }
}
