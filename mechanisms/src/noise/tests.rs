use std::collections::BTreeMap;

use super::*;
use crate::PrivacyRng;

/// A bit stream that serves a fixed prefix, then pseudo-random bits, and
/// records whether anything past the prefix was read.
struct Script<'a> {
    prefix: &'a [bool],
    pos: usize,
    past: bool,
    state: u64,
}

impl Bits for Script<'_> {
    fn bit(&mut self) -> bool {
        let b = match self.prefix.get(self.pos) {
            Some(&b) => b,
            None => {
                self.past = true;
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.state & 1 == 1
            }
        };
        self.pos += 1;
        b
    }
}

/// The exact law of `f`'s output over uniform bits, by walking the tree of
/// bit prefixes: a prefix that `f` reads past is split in two, one it does
/// not is a leaf of probability 2^−length. Masses are numerators over
/// 2^depth; the second value is the mass of the prefixes still undecided at
/// `depth` bits.
fn law<T: Ord>(depth: usize, f: impl Fn(&mut Script) -> T) -> (BTreeMap<T, UBig>, UBig) {
    let mut masses = BTreeMap::new();
    let mut undecided = UBig::ZERO;
    let mut stack = vec![Vec::new()];
    while let Some(prefix) = stack.pop() {
        let mut s = Script {
            prefix: &prefix,
            pos: 0,
            past: false,
            state: 0x9e37_79b9_7f4a_7c15,
        };
        let out = f(&mut s);
        let weight = UBig::ONE << (depth - prefix.len());
        if !s.past {
            *masses.entry(out).or_insert(UBig::ZERO) += weight;
        } else if prefix.len() == depth {
            undecided += weight;
        } else {
            for b in [true, false] {
                let mut next = prefix.clone();
                next.push(b);
                stack.push(next);
            }
        }
    }
    (masses, undecided)
}

fn ratio(x: &UBig, depth: usize) -> f64 {
    x.to_f64().value() / 2f64.powi(depth as i32)
}

/// `u64` words served in order (a fake [`RngCore`]).
struct Words(Vec<u64>, usize);

impl RngCore for Words {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        let w = self.0[self.1];
        self.1 += 1;
        w
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut PrivacyRng::from_seed(0), dst)
    }
}

/// Exactness of Bernoulli(p) for f64 p: the outcome on the streams whose
/// first 1 is at position i (probability 2⁻ⁱ, the rest of the stream
/// arbitrary) is computed for every i up to past 2⁻¹⁰⁷⁴; the positions
/// answering `true` must sum, as exact binary fractions, to p.
#[test]
fn bernoulli_of_an_f64_is_exact() {
    let ps = [
        0.0,
        1.0,
        0.5,
        0.1,
        1.0 / 3.0,
        2f64.powi(-60),
        2f64.powi(-60) * 3.0,
        f64::MIN_POSITIVE,
        5e-324,
        3.0 * 5e-324,
        1.0 - f64::EPSILON / 2.0,
        0.999_999_9,
    ];
    const DEPTH: usize = 64 * 18;
    for &p in &ps {
        let mut total = UBig::ZERO;
        for i in 1..=DEPTH {
            // Zeros, then a 1 at position i followed by ones (which must not matter).
            let mut words = vec![0u64; (i - 1) / 64];
            let at = (i - 1) % 64;
            words.push(u64::MAX >> at);
            words.extend([u64::MAX; 20]);
            let mut rng = Words(words, 0);
            if sample_bernoulli(p, &mut rng).unwrap() {
                total += UBig::ONE << (DEPTH - i);
            }
        }
        // p = m·2^e exactly, as a numerator over 2^DEPTH.
        let (m, e) = dyadic(p);
        let want = if p == 1.0 {
            (UBig::ONE << DEPTH) - UBig::ONE // Σ 2⁻ⁱ over i ≤ DEPTH
        } else {
            UBig::from(m) << (DEPTH as i64 + e) as usize
        };
        assert_eq!(total, want, "p = {p:e}");
    }
    let mut rng = PrivacyRng::from_seed(0);
    assert!(sample_bernoulli(-0.1, &mut rng).is_err());
    assert!(sample_bernoulli(1.5, &mut rng).is_err());
    assert!(sample_bernoulli(f64::NAN, &mut rng).is_err());
}

/// The word reader gives the bits in the order `bit` does, however reads
/// of different widths straddle words.
#[test]
fn word_reads_are_bit_reads() {
    let mut seed = PrivacyRng::from_seed(5);
    let words: Vec<u64> = (0..64).map(|_| seed.next_u64()).collect();
    let widths = [1u32, 7, 64, 3, 63, 64, 0, 5, 33, 31, 64, 2];
    let mut a = Words(words.clone(), 0);
    let mut b = Words(words, 0);
    let (mut wide, mut single) = (RngBits::new(&mut a), RngBits::new(&mut b));
    for round in 0..10 {
        for &k in &widths {
            let mut x = 0u64;
            for _ in 0..k {
                x = (x << 1) | u64::from(single.bit());
            }
            assert_eq!(wide.bits(k), x, "round {round}, width {k}");
        }
        let lz = wide.leading_zeros(10_000);
        let mut zeros = 0;
        while !single.bit() {
            zeros += 1;
        }
        assert_eq!(lz, Some(zeros));
    }
}

/// Uniform below m: every value has exactly the same mass at every depth
/// of the bit tree (the rest is the undecided mass, which vanishes).
#[test]
fn uniform_below_is_exactly_uniform() {
    for m in [1u64, 2, 3, 5, 6, 7, 12] {
        let (masses, undecided) = law(24, |s| uniform_below_u64(m, s));
        assert_eq!(masses.len() as u64, m);
        let first = masses.values().next().unwrap().clone();
        assert!(masses.values().all(|x| *x == first), "m = {m}");
        assert!(ratio(&undecided, 24) < 1e-3);
    }
    let big = (UBig::ONE << 70) + UBig::from(3u8);
    let mut rng = PrivacyRng::from_seed(9);
    let mut bits = RngBits::new(&mut rng);
    assert!((0..200).all(|_| uniform_below(&big, &mut bits) < big));
    assert!(sample_uniform_below(0, &mut rng).is_err());
}

/// Bernoulli(exp(−γ)): the decided mass of `true` never exceeds e^{−γ} and
/// misses it by at most the undecided mass.
#[test]
fn bernoulli_exp_matches_its_law() {
    for (n, d) in [(0u64, 1u64), (1, 2), (1, 1), (3, 2), (5, 3), (3, 1), (2, 7)] {
        let depth = 26;
        let (masses, undecided) = law(depth, |s| {
            bernoulli_exp_neg(&UBig::from(n), &UBig::from(d), s)
        });
        let yes = masses.get(&true).map_or(0.0, |x| ratio(x, depth));
        let rest = ratio(&undecided, depth);
        let want = (-(n as f64) / d as f64).exp();
        assert!(
            yes <= want + 1e-15 && want <= yes + rest + 1e-15,
            "{n}/{d}: {yes} {rest} {want}"
        );
        assert!(rest < 0.02, "{n}/{d}: undecided {rest}");
    }
}

/// Each integer's decided mass is at most its probability and misses it by
/// at most the undecided mass (which must be below `most`).
fn check_law(
    masses: &BTreeMap<IBig, UBig>,
    undecided: &UBig,
    depth: usize,
    most: f64,
    want: impl Fn(i64) -> f64,
) {
    let rest = ratio(undecided, depth);
    assert!(rest < most, "undecided {rest}");
    for z in -8i64..=8 {
        let got = masses.get(&IBig::from(z)).map_or(0.0, |x| ratio(x, depth));
        let w = want(z);
        assert!(
            got <= w + 1e-12 && w <= got + rest + 1e-12,
            "z {z}: {got} vs {w} (+{rest})"
        );
    }
}

#[test]
fn discrete_laplace_matches_its_law() {
    for (t, s) in [(1u64, 1u64), (1, 3), (2, 1), (1, 2)] {
        let scale = Ratio {
            num: UBig::from(t),
            den: UBig::from(s),
        };
        let depth = 22;
        let (masses, undecided) = law(depth, |b| discrete_laplace(&scale, b));
        let r = (-(s as f64) / t as f64).exp();
        check_law(&masses, &undecided, depth, 0.12, |z| {
            (1.0 - r) / (1.0 + r) * r.powi(z.abs() as i32)
        });
    }
}

#[test]
fn discrete_gaussian_matches_its_law() {
    // The rejection loop spends many bits: at this depth about half the mass
    // is decided, so this bounds each probability from one side (and
    // `discrete_gaussian_frequencies` checks the other statistically).
    for (a, b) in [(1u64, 1u64), (1, 2), (1, 4)] {
        let sampler = DiscreteGaussian::new(Ratio {
            num: UBig::from(a),
            den: UBig::from(b),
        });
        let depth = 22;
        let (masses, undecided) = law(depth, |bits| sampler.sample(bits));
        let s2 = a as f64 / b as f64;
        let norm: f64 = (-60i64..=60)
            .map(|z| (-(z * z) as f64 / (2.0 * s2)).exp())
            .sum();
        check_law(&masses, &undecided, depth, 0.45, |z| {
            (-(z * z) as f64 / (2.0 * s2)).exp() / norm
        });
    }
}

/// Where the bit tree is too deep to walk: frequencies of 400 000 draws
/// (fixed seed) against the exact law, within 5 binomial standard errors,
/// for a σ whose rational σ² has a 106-bit numerator.
#[test]
fn discrete_gaussian_frequencies() {
    let sigma = 1.7f64 + f64::EPSILON;
    let mut rng = PrivacyRng::from_seed(17);
    let draws = 400_000;
    let mut counts = BTreeMap::new();
    for _ in 0..draws {
        *counts
            .entry(sample_discrete_gaussian(sigma, &mut rng).unwrap())
            .or_insert(0u64) += 1;
    }
    let weight = |z: i64| (-((z * z) as f64) / (2.0 * sigma * sigma)).exp();
    let norm: f64 = (-60..=60).map(weight).sum();
    for z in -6i64..=6 {
        let p = weight(z) / norm;
        let got = counts.get(&z).copied().unwrap_or(0) as f64 / draws as f64;
        let se = (p * (1.0 - p) / draws as f64).sqrt();
        assert!((got - p).abs() < 5.0 * se, "z {z}: {got} vs {p}");
    }
    let mut rng = PrivacyRng::from_seed(18);
    let scale = 2.5;
    let mut counts = BTreeMap::new();
    for _ in 0..draws {
        *counts
            .entry(sample_discrete_laplace(scale, &mut rng).unwrap())
            .or_insert(0u64) += 1;
    }
    let r = (-1.0f64 / scale).exp();
    for z in -6i64..=6 {
        let p = (1.0 - r) / (1.0 + r) * r.powi(z.abs() as i32);
        let got = counts.get(&z).copied().unwrap_or(0) as f64 / draws as f64;
        let se = (p * (1.0 - p) / draws as f64).sqrt();
        assert!((got - p).abs() < 5.0 * se, "laplace z {z}: {got} vs {p}");
    }
}

#[test]
fn grids_and_parameters_are_checked() {
    let mut rng = PrivacyRng::from_seed(1);
    for g in [0.0, -1.0, 0.3, f64::NAN, f64::INFINITY, 5e-324] {
        assert!(check_granularity(g).is_err(), "{g}");
    }
    for g in [1.0, 0.5, 2f64.powi(-30), 1024.0] {
        assert!(check_granularity(g).is_ok(), "{g}");
    }
    assert_eq!(round_to_grid(0.3, 0.25).unwrap(), 1);
    assert_eq!(round_to_grid(0.375, 0.25).unwrap(), 2); // halves away from zero
    assert_eq!(round_to_grid(-0.375, 0.25).unwrap(), -2);
    assert_eq!(round_to_grid(1e-320, 1.0).unwrap(), 0);
    assert!(round_to_grid(1.0, 2f64.powi(-70)).is_err());
    assert!(round_to_grid(f64::NAN, 1.0).is_err());
    assert!(matches!(
        laplace_on_grid(&[0.0, f64::INFINITY], 1.0, 1.0, &mut rng),
        Err(MechanismError::NonFinite { index: 1, .. })
    ));
    assert!(gaussian_on_grid(&[0.0], 0.0, 1.0, &mut rng).is_err());
    assert!(gaussian_noise_vector(3, 1.0, 0.3, &mut rng).is_err());
    assert!(sample_discrete_laplace(f64::NAN, &mut rng).is_err());
    assert!(sample_bernoulli_exp(1, 0, &mut rng).is_err());
    // Releases lie on the grid.
    let g = 0.125;
    let out = gaussian_on_grid(&[0.3, -7.0], 0.5, g, &mut rng).unwrap();
    assert!(out.iter().all(|x| (x / g).fract() == 0.0));
    let out = laplace_on_grid(&[0.3, -7.0], 0.5, g, &mut rng).unwrap();
    assert!(out.iter().all(|x| (x / g).fract() == 0.0));
    // Tiny and huge parameters work (big rationals).
    assert!(sample_discrete_gaussian(1e-300, &mut rng).unwrap() == 0);
    assert!(sample_discrete_gaussian(1e15, &mut rng).is_ok());
    assert!(sample_discrete_laplace(1e-300, &mut rng).unwrap() == 0);
}

#[test]
fn rounded_sensitivities_and_the_pure_dp_curve() {
    assert!(rounded_l1_sensitivity(0.5, 4, 0.125) >= 1.0);
    assert!(rounded_l2_sensitivity(0.5, 4, 0.125) >= 0.75);
    for (a, e) in [
        (1.5, 0.1),
        (2.0, 1.0),
        (4.0, 3.0),
        (64.0, 0.01),
        (2.0, 40.0),
        (1.1, 1e-6),
    ] {
        let got = pure_dp_rdp_at(a, e);
        let direct = ((a * e).exp() + ((1.0 - a) * e).exp()).ln() / (a - 1.0)
            - (1.0 + e.exp()).ln() / (a - 1.0);
        let direct = if direct.is_finite() { direct } else { e };
        assert!(
            got <= e && got <= a * e * e / 2.0 * (1.0 + 1e-12),
            "{a} {e}"
        );
        assert!(got >= direct.min(e) - 1e-12, "{a} {e}: {got} < {direct}");
        assert!(
            got <= direct + 1e-9 * (1.0 + direct),
            "{a} {e}: {got} vs {direct}"
        );
    }
    assert_eq!(pure_dp_rdp_at(2.0, 0.0), 0.0);
}
