//! Sampling a token from a distribution.

use dashu_int::UBig;
use rand::Rng;

use crate::MechanismError;
use crate::noise::{Bits, RngBits, dyadic};

/// Draws an index with probability EXACTLY `p[i] / Σp`, the `p[i]` being the
/// f64 entries as real numbers and `Σp` their exact sum. Indices with zero mass
/// are never returned; an index of any positive mass (2⁻⁶⁰ of the total, a
/// subnormal) can be. `p` must be finite and non-negative with a positive sum.
///
/// Why exact: inverting an f64 CDF with one 53-bit uniform cannot reach a token
/// whose mass is below 2⁻⁵³ of the total, while a neighbouring dataset may give
/// it mass — an infinite Rényi divergence.
///
/// Algorithm: the output is the index i with `C_{i−1} ≤ U·Σp < C_i`, `C` the
/// exact cumulative sums and `U = 0.U₁U₂…` a uniform real whose bits are read
/// lazily, 64 at a time; then `P(i) = (C_i − C_{i−1})/Σp` exactly. The common
/// case decides from the first 64 bits in f64: the CDF is formed block by block
/// (`Σp` the sum of 1024-entry block sums, each in 8 lanes, which vectorises; only
/// the block holding the target is scanned entry by entry), and the index is
/// accepted only when the whole interval `[k, k+1)·2⁻⁶⁴·Σp` lies inside its cell
/// with a margin of `8·(2V+64)·2⁻⁵³·Σp` — more than the error of any f64 sum of
/// V + V/1024 + 8 nonnegative terms (`γ_n ≤ 1.01·n·2⁻⁵³`). Otherwise (an
/// ambiguous draw: probability about `32·V²·2⁻⁵³`, below 10⁻⁵ for V = 50 000, or
/// a cell thinner than the margin — a tiny mass), the cumulative sums are formed exactly as big integers (in
/// units of the smallest exponent present) and the cell of U is located by exact
/// comparisons, reading more bits of U until it is one cell.
///
/// Why blocks: one sequential pass to validate and sum and another to invert
/// read the whole vocabulary twice on one core.
pub fn sample_index(p: &[f64], rng: &mut impl Rng) -> Result<usize, MechanismError> {
    let (blocks, total) = checked_blocks(p)?;
    let mut bits = RngBits::new(rng);
    let k = bits.bits(64);
    if let Some(i) = certified(p, &blocks, total, k) {
        return Ok(i);
    }
    Ok(exact_index(p, k, &mut bits))
}

/// Validates `p` and returns its block sums and their f64 total (> 0).
fn checked_blocks(p: &[f64]) -> Result<(Vec<f64>, f64), MechanismError> {
    if p.is_empty() {
        return Err(MechanismError::EmptyVocabulary);
    }
    let mut blocks = Vec::with_capacity(p.len().div_ceil(BLOCK));
    let mut lowest = f64::INFINITY;
    for block in p.chunks(BLOCK) {
        let (mut lanes, mut min) = ([0.0; LANES], [f64::INFINITY; LANES]);
        let whole = block.chunks_exact(LANES);
        let rest = whole.remainder();
        for c in whole {
            for j in 0..LANES {
                lanes[j] += c[j];
                min[j] = if c[j] < min[j] { c[j] } else { min[j] };
            }
        }
        for (j, &x) in rest.iter().enumerate() {
            lanes[j] += x;
            min[j] = if x < min[j] { x } else { min[j] };
        }
        lowest = min.iter().fold(lowest, |m, &x| m.min(x));
        blocks.push(lanes.iter().sum::<f64>());
    }
    let total: f64 = blocks.iter().sum();
    // A NaN or infinite entry makes the sum non-finite; a negative one the minimum
    // negative (a NaN may hide from `min`, never from the sum).
    if !total.is_finite() || lowest < 0.0 {
        for (index, &x) in p.iter().enumerate() {
            if !x.is_finite() {
                return Err(MechanismError::NonFinite {
                    row: 0,
                    index,
                    value: x,
                });
            }
            if x < 0.0 {
                return Err(MechanismError::Negative {
                    row: 0,
                    index,
                    value: x,
                });
            }
        }
    }
    if total.is_nan() || total <= 0.0 {
        return Err(MechanismError::NotNormalised {
            row: 0,
            sum: total,
            tolerance: 0.0,
        });
    }
    Ok((blocks, total))
}

/// The index of the cell holding `[k, k+1)·2⁻⁶⁴·Σp` when f64 arithmetic with a
/// margin certifies it (see [`sample_index`]), else `None`.
fn certified(p: &[f64], blocks: &[f64], total: f64, k: u64) -> Option<usize> {
    let n = p.len() as f64;
    let relative = (2.0 * n + 64.0) * 2f64.powi(-53) * 8.0;
    // Below 2⁻⁹⁰⁰ products could underflow and lose the relative error bounds.
    if relative > 1.0 / 64.0 || total < 2f64.powi(-900) {
        return None;
    }
    let margin = relative * total;
    let scale = total * 2f64.powi(-64);
    let lo = k as f64 * scale - margin;
    let hi = (k as f64 + 1.0) * scale + margin;
    // The first block whose cumulative sum passes `lo`, then its entries.
    let mut before = 0.0;
    let mut first = blocks.len();
    for (b, &s) in blocks.iter().enumerate() {
        if lo < before + s {
            first = b;
            break;
        }
        before += s;
    }
    let start = (first * BLOCK).min(p.len());
    let mut cumulative = before;
    for (i, &x) in p.iter().enumerate().skip(start) {
        if x > 0.0 {
            let next = cumulative + x;
            if lo < next {
                // Certified only if the whole widened interval is in [cumulative, next);
                // a cumulative sum of 0 is exact (no mass before), and U·Σp < Σp
                // needs no margin above the last index with mass.
                let above = cumulative == 0.0 || lo >= cumulative;
                let below = hi <= next || p[i + 1..].iter().all(|&x| x == 0.0);
                return (above && below).then_some(i);
            }
            cumulative = next;
        }
    }
    None
}

/// The exact cell of U given its first 64 bits `k`, reading more bits as needed.
fn exact_index(p: &[f64], k: u64, bits: &mut impl Bits) -> usize {
    // Every positive entry is m·2^e; in units of the smallest such 2^e they are
    // integers, and so are their cumulative sums.
    let lowest = p
        .iter()
        .filter(|&&x| x > 0.0)
        .map(|&x| dyadic(x).1)
        .min()
        .unwrap_or(0);
    let mut cumulative = Vec::with_capacity(p.len());
    let mut sum = UBig::ZERO;
    for &x in p {
        if x > 0.0 {
            let (m, e) = dyadic(x);
            sum += UBig::from(m) << (e - lowest) as usize;
        }
        cumulative.push(sum.clone());
    }
    // U ∈ [l, l+1)·2^{−b}: the first i with C_i·2^b > l·Σp holds U's lower end;
    // it holds all of U once C_i·2^b ≥ (l+1)·Σp.
    let mut l = UBig::from(k);
    let mut b = 64usize;
    loop {
        let low = &l * &sum;
        let i = cumulative.partition_point(|c| (c.clone() << b) <= low);
        let high = (&l + UBig::ONE) * &sum;
        if (cumulative[i].clone() << b) >= high {
            return i;
        }
        l = (l << 64) + UBig::from(bits.bits(64));
        b += 64;
    }
}

/// Entries per block of [`sample_index`]'s CDF.
const BLOCK: usize = 1024;

/// Independent partial sums per block (one AVX-512 vector of f64).
const LANES: usize = 8;

/// How far below the largest log-weight [`sample_log_index`] keeps an index's own
/// weight: an index whose log-weight is further below gets the weight `exp(−708)`
/// (a normal f64, ≈ 3.3e-308) instead of one that would underflow.
const LOG_WEIGHT_FLOOR: f64 = -708.0;

/// Draws an index from unnormalised log-weights `l` (−∞ allowed: no mass), with
/// probability EXACTLY `ŵ_i/Σⱼŵⱼ` for the f64 weights `ŵ` defined here.
///
/// # The law
///
/// Let `L = maxⱼ lⱼ` and, for a finite `lᵢ`, `δᵢ = lᵢ − L` as a real number: the f64
/// difference `h = lᵢ − L` plus its rounding error `t` (recovered exactly by TwoSum;
/// `h ≥ −708` cannot overflow), so `δᵢ = h + t`. Then
///
/// - `ŵᵢ = 0` if `lᵢ = −∞`;
/// - `ŵᵢ = c₀`, the f64 `exp(−708)` (≈ 3.3e-308, a normal float), if `δᵢ < −708`,
///   decided exactly: `h < −708`, or `h = −708` and `t < 0`;
/// - otherwise `ŵᵢ = e + e·t` in f64 (two roundings, no fused multiply-add), `e = exp(h)`;
///
/// and the index is drawn by [`sample_index`]'s exact machinery, so `P(i) = ŵᵢ/Σŵ` with
/// the `ŵ` as real numbers and their exact sum. Every finite log-weight has positive mass
/// however far it lies below the maximum; only −∞ has none. (The maximum has `ŵ = 1`.)
///
/// Why the floor: left to `exp`, a weight below `e^{−745}` of the largest rounds to 0,
/// while a neighbouring dataset's slightly larger one becomes a positive subnormal — a
/// token drawable on one side only, an infinite Rényi divergence; and subnormal results
/// carry no relative accuracy. With the floor the log-weight is `max(δ, −708)` up to
/// rounding, a 1-Lipschitz function of δ that privacy proofs can carry through.
///
/// # Distance to the intended law
///
/// Assume, as the accountant's rounding does (`privmix_renyi::round`), that the
/// platform's `exp` is faithful (error below one ulp). Then for every finite `lᵢ`
///
/// `|ln ŵᵢ − max(δᵢ, −708)| ≤ η_s := 3.01·2⁻⁵³`.
///
/// Proof. If `δ ≥ −708`, then `h ≥ −708` (rounding is monotone and −708 is a float), so
/// `e^h ≥ e^{−708} > 2⁻¹⁰²²` and `e`, `e + e·t` are normal: `e = e^h(1 + θ₁)` with
/// `|θ₁| < 2⁻⁵²`. `|h| < 1024` gives `|t| ≤ ½ulp(h) ≤ 2⁻⁴⁴`, and `e^t = (1 + t)(1 + θ₂)`
/// with `|θ₂| ≤ t² ≤ 2⁻⁸⁸`. `e·t` is rounded by a relative `2⁻⁵³` on a value below
/// `2⁻⁴⁴e`, and the sum by a relative `2⁻⁵³`: `ŵ = e^δ(1 + θ₁)(1 + θ₃)/(1 + θ₂)` with
/// `|θ₃| ≤ 2⁻⁵³(1 + 2⁻⁴³)`, so `|ln ŵ − δ| ≤ 2⁻⁵² + 2⁻⁵³ + 2⁻⁹⁰ + O(2⁻¹⁰⁴) ≤ η_s`. If
/// `δ < −708`, `ŵ = c₀ = e^{−708}(1 + θ)` with `|θ| < 2⁻⁵²` (normal), so
/// `|ln ŵ + 708| ≤ 2.01·2⁻⁵³`. ∎
///
/// So the realised law is, within a factor `e^{±2η_s}` (≈ 1 ± 7e-16) on every index, the
/// law of the floored log-weights `max(lᵢ − L, −708)`: on an index within 708 of the
/// maximum it is the intended `e^{lᵢ}/Σe^{lⱼ}` to that factor (the normaliser moves by
/// at most `V·c₀`, V the vector's length, from the floored indices), and an index further
/// below is drawn with probability `c₀/Σŵ` instead of its smaller intended one. DPS-MOZO's
/// charge covers this law ([`crate::dps_mozo_charge`]).
///
/// Cost: one pass for the weights (an `exp` each, a TwoSum), then [`sample_index`]'s draw
/// (64 random bits, more only when the f64 fast path is ambiguous).
///
/// Errors: NaN or +∞ entries ([`MechanismError::NonFinite`]); an empty vector or every
/// entry −∞ ([`MechanismError::NotNormalised`], sum 0).
pub fn sample_log_index(log_p: &[f64], rng: &mut impl Rng) -> Result<usize, MechanismError> {
    let max = log_p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if let Some((index, &value)) = log_p
        .iter()
        .enumerate()
        .find(|(_, x)| x.is_nan() || **x == f64::INFINITY)
    {
        return Err(MechanismError::NonFinite {
            row: 0,
            index,
            value,
        });
    }
    if max == f64::NEG_INFINITY {
        return Err(MechanismError::NotNormalised {
            row: 0,
            sum: 0.0,
            tolerance: 0.0,
        });
    }
    let weights = log_weights(log_p, max);
    let (blocks, total) = checked_blocks(&weights)?;
    let mut bits = RngBits::new(rng);
    let k = bits.bits(64);
    if let Some(i) = certified(&weights, &blocks, total, k) {
        return Ok(i);
    }
    Ok(exact_index(&weights, k, &mut bits))
}

/// [`sample_log_index`]'s weights `ŵ` of validated log-weights with (finite) maximum
/// `max`.
pub(crate) fn log_weights(log_p: &[f64], max: f64) -> Vec<f64> {
    let floor = LOG_WEIGHT_FLOOR.exp();
    log_p.iter().map(|&l| log_weight(l, max, floor)).collect()
}

/// [`sample_log_index`]'s weight `ŵ` of a log-weight `l` below the (finite) maximum
/// `max`, `floor` being the f64 `exp(LOG_WEIGHT_FLOOR)`.
fn log_weight(l: f64, max: f64, floor: f64) -> f64 {
    if l == f64::NEG_INFINITY {
        return 0.0;
    }
    let h = l - max;
    // h < −708 implies δ < −708 (and covers an overflow of l − max to −∞).
    if h < LOG_WEIGHT_FLOOR {
        return floor;
    }
    // TwoSum (Knuth): δ = h + t exactly; nothing overflows for h ≥ −708.
    let t = {
        let b_virtual = h - l;
        let a_virtual = h - b_virtual;
        (l - a_virtual) + (-max - b_virtual)
    };
    if h == LOG_WEIGHT_FLOOR && t < 0.0 {
        return floor;
    }
    let e = h.exp();
    e + e * t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PrivacyRng;

    #[test]
    fn never_samples_zero_mass_and_matches_frequencies() {
        // Binomial standard error 0.0022: the bound is 4.5 of them (fixed seed).
        let p = [0.0, 0.25, 0.0, 0.75, 0.0];
        let mut rng = PrivacyRng::from_seed(1);
        let mut counts = [0usize; 5];
        for _ in 0..40_000 {
            counts[sample_index(&p, &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[0] + counts[2] + counts[4], 0);
        let share = counts[1] as f64 / 40_000.0;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
    }

    /// `u64` words served in order, then zeros (a fake [`rand::RngCore`]).
    struct Words(Vec<u64>, usize);

    impl rand::RngCore for Words {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.1 += 1;
            self.0.get(self.1 - 1).copied().unwrap_or(0)
        }
        fn fill_bytes(&mut self, _: &mut [u8]) {
            unreachable!("the samplers read words")
        }
    }

    /// `x = m·2^e` as a big numerator over `2^1074`.
    fn units(x: f64) -> UBig {
        let (m, e) = dyadic(x);
        UBig::from(m) << (e + 1074) as usize
    }

    /// The base-2⁶⁴ digits (most significant first) of an integer below 2^{64·words}.
    fn digits(x: &UBig, words: usize) -> Vec<u64> {
        (0..words)
            .rev()
            .map(|w| {
                let shifted: UBig = x.clone() >> (64 * w);
                let low: UBig = shifted & UBig::from(u64::MAX);
                u64::try_from(&low).unwrap()
            })
            .collect()
    }

    /// The law is exact: `sample_index` is the step function U ↦ the cell of
    /// U·Σp among the exact cumulative sums. For each cell of positive mass
    /// (masses of 2⁻⁶⁰, subnormals, zeros around them), the streams whose first
    /// 64·w bits place U in the first, the middle and the last 2^{−64w}-interval
    /// that lies wholly inside the cell (w the first depth with three such) must
    /// all draw that cell, whatever bits follow. With the cells' edges exact to
    /// 2^{−64w}, P(i) = (C_i − C_{i−1})/Σp.
    #[test]
    fn the_law_is_exact_to_the_cell_edges() {
        let tiny = 5e-324;
        let vectors: Vec<Vec<f64>> = vec![
            vec![1.0, 2f64.powi(-60)],
            vec![2f64.powi(-60), 1.0, 0.0, 2f64.powi(-60) * 3.0],
            vec![0.5, tiny, 0.0, 0.25, tiny * 7.0, 0.25],
            vec![tiny, tiny * 2.0],
            vec![0.0, 1e-300, 0.0],
            vec![0.1, 0.2, 0.3, 0.4],
            vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
            vec![f64::MIN_POSITIVE, 1.0, f64::MIN_POSITIVE / 2.0],
        ];
        for p in &vectors {
            let c: Vec<UBig> = p
                .iter()
                .scan(UBig::ZERO, |acc, &x| {
                    *acc += units(x);
                    Some(acc.clone())
                })
                .collect();
            let total = c.last().unwrap().clone();
            for (i, &x) in p.iter().enumerate() {
                let lower = if i == 0 { UBig::ZERO } else { c[i - 1].clone() };
                if x == 0.0 {
                    continue;
                }
                for words in 1..=20usize {
                    let bits = 64 * words;
                    // First and last integers D with [D, D+1)·2^{-bits}·Σp inside the cell.
                    let first = ((lower.clone() << bits) + &total - UBig::ONE) / &total;
                    let top = (c[i].clone() << bits) / &total; // ⌊C_i·2^bits/Σp⌋
                    if top < first.clone() + UBig::from(3u8) {
                        continue;
                    }
                    let last = top - UBig::ONE;
                    let middle = (first.clone() + &last) >> 1;
                    for d in [first, middle, last] {
                        for tail in [0u64, u64::MAX, 0x5555_5555_5555_5555] {
                            let mut stream = digits(&d, words);
                            stream.extend([tail; 40]);
                            let got = sample_index(p, &mut Words(stream, 0)).unwrap();
                            assert_eq!(got, i, "{p:?}: cell {i}, {words} words");
                        }
                    }
                    break;
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 64,
            rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// The f64 fast path never disagrees with the exact cell: whenever it
        /// certifies an index for the first 64 bits, the exact search (which
        /// then needs no further bits) finds the same one — across block
        /// boundaries, long runs of zeros and tiny masses.
        #[test]
        fn the_fast_path_is_the_exact_cell(
            weights in proptest::collection::vec(
                proptest::prop_oneof![3 => proptest::strategy::Just(0.0), 2 => 0.0f64..1.0, 1 => 0.0f64..1e-17],
                1..3000,
            ),
            draws in proptest::collection::vec(proptest::prelude::any::<u64>(), 16),
        ) {
            proptest::prop_assume!(weights.iter().any(|&w| w > 0.0));
            let (blocks, total) = checked_blocks(&weights).unwrap();
            let mut fast = 0;
            for &k in &draws {
                if let Some(i) = certified(&weights, &blocks, total, k) {
                    fast += 1;
                    let mut none = Words(Vec::new(), 0);
                    let exact = exact_index(&weights, k, &mut RngBits::new(&mut none));
                    proptest::prop_assert_eq!(i, exact);
                    proptest::prop_assert_eq!(none.1, 0);
                }
            }
            proptest::prop_assert!(fast >= 8, "the fast path decided only {} of 16", fast);
        }
    }

    #[test]
    fn the_first_bad_entry_is_named_in_any_block() {
        let mut rng = PrivacyRng::from_seed(3);
        let mut p = vec![1e-4; 3000];
        p[2500] = -1e-9;
        p[2700] = f64::NAN;
        assert!(matches!(
            sample_index(&p, &mut rng),
            Err(MechanismError::Negative { index: 2500, .. })
        ));
        p[2500] = 1e-4;
        assert!(matches!(
            sample_index(&p, &mut rng),
            Err(MechanismError::NonFinite { index: 2700, .. })
        ));
        p[2700] = f64::INFINITY;
        assert!(matches!(
            sample_index(&p, &mut rng),
            Err(MechanismError::NonFinite { index: 2700, .. })
        ));
    }

    #[test]
    fn log_sampling_survives_extreme_logits() {
        let mut rng = PrivacyRng::from_seed(2);
        let l = [-1e300, f64::NEG_INFINITY, -1e300 + 1.0];
        let i = sample_log_index(&l, &mut rng).unwrap();
        assert!(i == 0 || i == 2);
        // `l − max` overflows to −∞: a finite log-weight still gets the floor, not 0.
        let l = [-1.7e308, 1.7e308];
        assert_eq!(
            log_weight(l[0], l[1], LOG_WEIGHT_FLOOR.exp()),
            (-708f64).exp()
        );
        assert!(sample_log_index(&l, &mut rng).is_ok());
        assert!(sample_index(&[0.0, 0.0], &mut rng).is_err());
    }

    #[test]
    fn log_sampling_keeps_its_typed_errors() {
        let mut rng = PrivacyRng::from_seed(5);
        assert!(matches!(
            sample_log_index(&[0.0, f64::NAN, f64::INFINITY], &mut rng),
            Err(MechanismError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            sample_log_index(&[0.0, -1.0, f64::INFINITY], &mut rng),
            Err(MechanismError::NonFinite { index: 2, .. })
        ));
        for bad in [&[][..], &[f64::NEG_INFINITY, f64::NEG_INFINITY][..]] {
            assert!(matches!(
                sample_log_index(bad, &mut rng),
                Err(MechanismError::NotNormalised { .. })
            ));
        }
    }

    /// The documented weights, written out again: 0 for −∞, `exp(−708)` when
    /// `l − max < −708` as a real number, else `e + e·t` with `e = exp(h)`, `h + t = l − max`.
    fn documented_weight(l: f64, max: f64) -> f64 {
        if l == f64::NEG_INFINITY {
            return 0.0;
        }
        let h = l - max;
        // The exact remainder of the subtraction (when it did not overflow).
        let t = if h.is_finite() {
            let z = h - l;
            (l - (h - z)) + (-max - z)
        } else {
            -1.0
        };
        if h < -708.0 || (h == -708.0 && t < 0.0) {
            return (-708f64).exp();
        }
        let e = h.exp();
        e + e * t
    }

    #[test]
    fn log_weights_are_the_documented_ones() {
        let floor = (-708f64).exp();
        assert!(floor >= f64::MIN_POSITIVE, "the floor is a normal float");
        let max = 0.25;
        // e^{-700} and e^{-708} keep their own weight; e^{-760} (which `exp` would
        // round to 0) and anything further down get the floor; −∞ gets 0.
        let cases = [
            (max, 1.0),
            (max - 700.0, (-700f64).exp()),
            (max - 708.0, floor),
            (max - 760.0, floor),
            (-1e300, floor),
            (f64::NEG_INFINITY, 0.0),
        ];
        for (l, want) in cases {
            assert_eq!(log_weight(l, max, floor), want, "l = {l}");
        }
        // l − max = −708 ∓ 2⁻⁴⁵ rounds to −708 (half an ulp is 2⁻⁴⁴); the real difference
        // decides: below −708 the floor, above it the index's own e^{−708}(1 + 2⁻⁴⁵),
        // about 256 ulps above the floor.
        let tiny = 2f64.powi(-45);
        assert_eq!(-708.0 - tiny, -708.0);
        assert_eq!(log_weight(-708.0, tiny, floor), floor);
        let own = log_weight(-708.0, -tiny, floor);
        assert!(own > floor && own <= floor * (1.0 + 2.0 * tiny), "{own:e}");
        assert_eq!(own, floor + floor * tiny);
        // Inexact differences: the weight follows the real difference (δ = h + t), and
        // the test's own transcription of the law agrees bit for bit.
        let mut s = 7u64;
        for _ in 0..2000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let l = -((s >> 11) as f64 / (1u64 << 53) as f64) * 720.0 + 0.3;
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = 0.3 + (s >> 40) as f64 * 1e-7;
            let w = log_weight(l, m, floor);
            assert_eq!(w.to_bits(), documented_weight(l, m).to_bits());
            assert!(w > 0.0 && w <= 1.0 && w.is_normal());
        }
    }

    /// Streams (most significant word first) placing U at the first, the middle and the
    /// last `2^{−64w}`-interval inside each positive-mass cell of the exact CDF of `p`,
    /// for the first depth w with three such intervals, each followed by three tails.
    fn cell_streams(p: &[f64]) -> Vec<(usize, Vec<u64>)> {
        let c: Vec<UBig> = p
            .iter()
            .scan(UBig::ZERO, |acc, &x| {
                *acc += units(x);
                Some(acc.clone())
            })
            .collect();
        let total = c.last().unwrap().clone();
        let mut out = Vec::new();
        for (i, &x) in p.iter().enumerate() {
            if x == 0.0 {
                continue;
            }
            let lower = if i == 0 { UBig::ZERO } else { c[i - 1].clone() };
            let mut found = false;
            for words in 1..=20usize {
                let bits = 64 * words;
                let first = ((lower.clone() << bits) + &total - UBig::ONE) / &total;
                let top = (c[i].clone() << bits) / &total;
                if top < first.clone() + UBig::from(3u8) {
                    continue;
                }
                let last = top - UBig::ONE;
                let middle = (first.clone() + &last) >> 1;
                for d in [first, middle, last] {
                    for tail in [0u64, u64::MAX, 0x5555_5555_5555_5555] {
                        let mut stream = digits(&d, words);
                        stream.extend([tail; 40]);
                        out.push((i, stream));
                    }
                }
                found = true;
                break;
            }
            assert!(found, "cell {i} of {p:?} thinner than 2^-1280");
        }
        out
    }

    /// The law of `sample_log_index` is exactly ŵ/Σŵ for the documented weights, down
    /// to masses of e^{-700} (its own weight), e^{-760} and e^{-1e300} (the floor, where
    /// `exp` alone underflows to 0): every stream placing U inside a cell draws it.
    #[test]
    fn log_sampling_is_exact_down_to_underflow() {
        let vectors: Vec<Vec<f64>> = vec![
            vec![0.0, -700.0, -760.0, f64::NEG_INFINITY],
            vec![-760.0, 0.0, f64::NEG_INFINITY, -700.0, -1e300, 3.0f64.ln()],
            vec![12.5, 12.5 - 708.0, 12.5 - 708.000_000_000_1, -36.5, 11.0],
            vec![-0.1, -2.0, -3.5],
            vec![(0.25f64).ln(), (0.75f64).ln()],
        ];
        for l in &vectors {
            let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = l.iter().map(|&x| documented_weight(x, max)).collect();
            let streams = cell_streams(&w);
            let positive = w.iter().filter(|&&x| x > 0.0).count();
            assert_eq!(streams.len(), positive * 9);
            for (i, stream) in streams {
                let got = sample_log_index(l, &mut Words(stream, 0)).unwrap();
                assert_eq!(got, i, "{l:?}: cell {i}");
            }
        }
    }

    #[test]
    fn log_sampling_matches_frequencies() {
        // Binomial standard error 0.0022: the bound is 4.5 of them (fixed seed).
        let l = [
            (0.25f64).ln() + 3.0,
            f64::NEG_INFINITY,
            (0.75f64).ln() + 3.0,
            -800.0,
        ];
        let mut rng = PrivacyRng::from_seed(4);
        let mut counts = [0usize; 4];
        for _ in 0..40_000 {
            counts[sample_log_index(&l, &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        let share = counts[0] as f64 / 40_000.0;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
    }
}
