use super::*;
use dashu_int::ops::BitTest;
use dashu_int::{IBig, UBig};

/// `x ≥ 0` as an integer multiple of 2⁻¹⁰⁷⁴.
fn units(x: f64) -> UBig {
    let (m, e) = crate::noise::dyadic(x);
    UBig::from(m) << (e + 1074) as usize
}

/// The realised token law of `log_probs`: the sampler's weights and their exact sum.
fn sampler_law(log_probs: &[f64]) -> (Vec<f64>, UBig) {
    let max = log_probs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w = crate::sample::log_weights(log_probs, max);
    let total = w.iter().fold(UBig::ZERO, |acc, &x| acc + units(x));
    (w, total)
}

/// `ln(a/b)` for positive big integers less than 2⁹⁰⁰ apart in ratio: within a
/// relative 2⁻⁵⁰ plus 2⁻¹¹⁵ (120 leading bits kept, the difference taken exactly).
fn ln_ratio(a: &UBig, b: &UBig) -> f64 {
    let shift = a.bit_len().min(b.bit_len()).saturating_sub(120);
    let (a, b) = (a.clone() >> shift, b.clone() >> shift);
    let f = |x: &UBig| -> f64 { x.to_f64().value() };
    // ln(1 + (a − b)/b) from the exact difference.
    if a >= b {
        (f(&(a.clone() - &b)) / f(&b)).ln_1p()
    } else {
        -(f(&(b.clone() - &a)) / f(&a)).ln_1p()
    }
}

/// `max_x |ln P(x) − ln P'(x)|` of the realised laws (both supports equal).
fn realised_max_divergence(lp: &[f64], lq: &[f64]) -> f64 {
    let ((w, sw), (v, sv)) = (sampler_law(lp), sampler_law(lq));
    let mut worst = 0.0f64;
    for (&a, &b) in w.iter().zip(&v) {
        assert_eq!(a == 0.0, b == 0.0, "the supports differ");
        if a == 0.0 {
            continue;
        }
        // ln(a/b) + ln(Σv/Σw) in one exact ratio.
        let d = ln_ratio(&(units(a) * &sv), &(units(b) * &sw));
        worst = worst.max(d.abs());
    }
    worst
}

#[test]
fn realised_epsilon_is_4b_plus_the_proven_slack() {
    let u = f64::EPSILON / 2.0;
    assert_eq!(realised_epsilon(0.0, 3).unwrap(), 0.0);
    let e = realised_epsilon(0.5, 1).unwrap();
    let slack = 4.0 * u * (9.0 * 903.0 + 4.0);
    assert!(
        e >= 2.0 + slack && e <= (2.0 + slack) * (1.0 + 1e-15),
        "{e}"
    );
    // n = 4, b ≤ 1: about 1.45e-11 above 4b.
    let e = realised_epsilon(1.0, 4).unwrap() - 4.0;
    assert!((1.4e-11..1.5e-11).contains(&e), "{e}");
    // Monotone in b and n; +∞ once ē > 1/4.
    let mut last = 0.0;
    for b in [1e-300, 1e-12, 1e-3, 0.1, 1.0, 10.0, 1e6, 1e12] {
        let e = realised_epsilon(b, 2).unwrap();
        assert!(e > last && e > 4.0 * b);
        last = e;
    }
    assert!(realised_epsilon(0.1, 3).unwrap() < realised_epsilon(0.1, 4).unwrap());
    assert_eq!(realised_epsilon(1e15, 1).unwrap(), f64::INFINITY);
    assert_eq!(realised_epsilon(0.1, usize::MAX).unwrap(), f64::INFINITY);
    assert!(realised_epsilon(-1.0, 1).is_err());
    assert!(realised_epsilon(f64::NAN, 1).is_err());
    // The charge is the token curve at the realised ε (q = 1: no amplification).
    let orders = Orders::new(vec![1.5, 2.0, 100.0]).unwrap();
    assert_eq!(
        dps_mozo_charge(&orders, 0.05, 5, 5).unwrap(),
        token_curve(&orders, realised_epsilon(0.05, 5).unwrap()).unwrap()
    );
    let ideal = dps_mozo_token_curve(&orders, 0.05).unwrap();
    for (c, i) in dps_mozo_charge(&orders, 0.05, 5, 5)
        .unwrap()
        .epsilons()
        .iter()
        .zip(ideal.epsilons())
    {
        assert!(c > i && *c <= i * (1.0 + 1e-9));
    }
    // b = 0 charges nothing (both sides compute the same bits).
    assert!(
        dps_mozo_charge(&orders, 0.0, 2, 7)
            .unwrap()
            .epsilons()
            .iter()
            .all(|&x| x == 0.0)
    );
}

/// `x` (finite) as an exact signed multiple of 2⁻¹⁰⁷⁴.
fn exact(x: f64) -> IBig {
    let m = IBig::from(units(x.abs()));
    if x < 0.0 { -m } else { m }
}

/// A signed multiple of 2⁻¹⁰⁷⁴ as an f64 (to a relative 2⁻⁵²).
fn to_f64(x: &IBig) -> f64 {
    let shift = x.bit_len().saturating_sub(64);
    let top: IBig = x.clone() >> shift;
    top.to_f64().value() * 2f64.powi(shift as i32 - 1074)
}

/// A deterministic stream of uniforms in [0, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() * v.len() as f64) as usize]
    }
}

/// A random DPS-MOZO input: zero-shot logits (flat, spread to 700/n, a few far
/// below), and n + 1 one-shot rows around them (the last one replaces the first).
fn random_input(g: &mut Lcg) -> (DpsMozoConfig, Vec<f64>, Vec<Vec<f64>>) {
    let k = g.pick(&[2usize, 3, 5, 16, 64]);
    let n = g.pick(&[1usize, 2, 3, 5, 8]);
    let b = g.pick(&[1e-6, 1e-3, 0.1, 2.0, 50.0]);
    let spread = g.pick(&[0.0, 5.0, 300.0, 700.0, 720.0]) / n as f64;
    let zero: Vec<f64> = (0..k)
        .map(|i| match i {
            0 => 3.0,
            _ if g.next() < 0.1 => -1e5 * g.next(),
            _ => 3.0 - spread * g.next(),
        })
        .collect();
    let c = g.pick(&[0.01, 1.0, 30.0]);
    let rows = (0..=n)
        .map(|_| {
            zero.iter()
                .map(|&z| z + c * (2.0 * g.next() - 1.0))
                .collect()
        })
        .collect();
    (DpsMozoConfig::new(n, k, b).unwrap(), zero, rows)
}

/// Step 1 of [`dps_mozo_charge`]'s proof, exactly: with `v = n·log z + Σᵢ rᵢ` (the
/// f64 vectors the step sums, recomputed by the same `mix_one`, as exact reals) and
/// `δ = l − max l` of the step's log-probabilities, `δ(x) − (v(x) − W) = e(x)` with
/// `|e| ≤ ē` on every index with `δ ≥ −709 − 4b`; checked as
/// `|(δ(x) − v(x)) − (δ(y) − v(y))| ≤ 2ē` against the index y with δ = 0. Over
/// 3000 random inputs (flat and 700/n-wide zero-shot rows, n ≤ 8, K ≤ 64).
#[test]
fn upstream_rounding_is_within_the_bound() {
    let u = f64::EPSILON / 2.0;
    assert_eq!(to_f64(&exact(-3.5)), -3.5);
    assert_eq!(to_f64(&(exact(-700.25) - exact(1e-300))), -700.25);
    let mut g = Lcg(0xD95);
    let mut worst = 0.0f64;
    let mut moved = 0;
    for _ in 0..3000 {
        let (config, zero, rows) = random_input(&mut g);
        let n = config.n_shots();
        let refs: Vec<&[f64]> = rows[..n].iter().map(Vec::as_slice).collect();
        let out = dps_mozo_output(&config, &zero, &refs).unwrap();
        let k = support(&zero, config.top_k()).unwrap();
        assert_eq!(k, out.support);
        let l0 = gather(&zero, &k).unwrap();
        let log_z = log_softmax(&l0).unwrap();
        let mut v: Vec<Option<IBig>> = log_z
            .iter()
            .map(|&z| z.is_finite().then(|| exact(z) * IBig::from(n)))
            .collect();
        for row in &refs {
            let l1 = gather(row, &k).unwrap();
            let (lambda, r, _) = mix_one(&l1, &l0, &log_z, &config).unwrap();
            moved += usize::from(lambda > 0.0);
            for (vx, &rx) in v.iter_mut().zip(&r) {
                assert!(rx.abs() <= config.radius());
                if let Some(vx) = vx {
                    *vx += exact(rx);
                }
            }
        }
        let b = config.radius();
        let ebar = u * ((n + 2) * (n + 2)) as f64 * (900.0 + 6.0 * b);
        let top = out
            .log_probs
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let y = out.log_probs.iter().position(|&l| l == top).unwrap();
        let base = exact(0.0) - v[y].clone().unwrap();
        for (x, &l) in out.log_probs.iter().enumerate() {
            if l == f64::NEG_INFINITY {
                // Only where n·log z overflows to −∞ (public).
                assert!(!(n as f64 * log_z[x]).is_finite());
                continue;
            }
            let delta = exact(l) - exact(top);
            if to_f64(&delta) < -709.0 - 4.0 * b {
                continue;
            }
            let diff = to_f64(&(delta - v[x].clone().unwrap() - &base)).abs();
            assert!(
                diff <= 2.0 * ebar,
                "|e(x) − e(y)| = {diff:e} > 2ē = {:e}",
                2.0 * ebar
            );
            worst = worst.max(diff / (2.0 * ebar));
        }
    }
    assert!(moved > 1000, "only {moved} demonstrations moved the output");
    assert!(
        worst > 0.0 && worst < 0.1,
        "largest |e(x) − e(y)|/2ē = {worst}"
    );
}

/// Step 3's conclusion on the realised laws themselves: for every input above and its
/// replace-one neighbour (the first drawn row replaced), the token laws the sampler
/// realises (its weights, exact sums) have the same support and
/// `max_x |ln P(x) − ln P'(x)| ≤` the realised ε (and stay close to 4b's bound).
#[test]
fn realised_laws_are_within_the_realised_epsilon() {
    let mut g = Lcg(0x5A1);
    let mut worst = 0.0f64;
    for _ in 0..3000 {
        let (config, zero, rows) = random_input(&mut g);
        let n = config.n_shots();
        let a: Vec<&[f64]> = rows[..n].iter().map(Vec::as_slice).collect();
        let mut b = a.clone();
        b[0] = &rows[n];
        let p = dps_mozo_output(&config, &zero, &a).unwrap();
        let q = dps_mozo_output(&config, &zero, &b).unwrap();
        let d = realised_max_divergence(&p.log_probs, &q.log_probs);
        let e = realised_epsilon(config.radius(), n).unwrap();
        assert!(d <= e, "D∞ = {d} > ε = {e} (b = {})", config.radius());
        worst = worst.max(d / e);
    }
    assert!(
        worst > 0.3,
        "largest D∞/ε {worst}: the cases never approach the bound"
    );
}
