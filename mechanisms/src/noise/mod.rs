//! Floating-point-safe randomness: exact Bernoulli, discrete Laplace and
//! discrete Gaussian samplers built from uniform random bits only.
//!
//! Why: noise drawn by transforming a uniform f64 (`ln(u)` for Laplace, a
//! Ziggurat for the Gaussian) has gaps and a lattice of its own, and those
//! artefacts depend on the noised value — Mironov, "On Significance of the
//! Least Significant Bits for Differential Privacy" (CCS 2012) recovers the
//! secret from them. Likewise `u < p` with a 53-bit `u` realises
//! Bernoulli(⌈p·2⁵³⌉/2⁵³), not Bernoulli(p).
//!
//! Everything here follows Canonne, Kamath & Steinke, "The Discrete Gaussian
//! for Differential Privacy" (NeurIPS 2020, arXiv 2004.00010), as OpenDP's
//! samplers do: each sampler's output law is EXACTLY the stated one, given
//! that the [`RngCore`] produces independent uniform bits; no floating-point
//! transcendental function is evaluated on the sampling path (all arithmetic
//! is on integers, big where needed).
//!
//! Randomness is read through a bit stream (`Bits`), one bit at a time in the order the
//! algorithms consume them (most significant bit of each `next_u64` word
//! first); the unused rest of the last word of a call is discarded.

use dashu_int::ops::{BitTest, UnsignedAbs};
use dashu_int::{IBig, UBig};
use rand::RngCore;

use crate::MechanismError;
use crate::error::positive;

/// A stream of independent uniform bits.
pub(crate) trait Bits {
    /// The next bit.
    fn bit(&mut self) -> bool;

    /// The next `k ≤ 64` bits as an integer, the first one most significant.
    fn bits(&mut self, k: u32) -> u64 {
        let mut x = 0u64;
        for _ in 0..k {
            x = (x << 1) | u64::from(self.bit());
        }
        x
    }

    /// The number of 0 bits read before the first 1 bit, reading no further than
    /// that 1 bit, or `None` once more than `limit` zeros have been read (the
    /// stream is then positioned anywhere past them).
    fn leading_zeros(&mut self, limit: u32) -> Option<u32> {
        let mut zeros = 0;
        while !self.bit() {
            zeros += 1;
            if zeros > limit {
                return None;
            }
        }
        Some(zeros)
    }
}

/// The bits of an [`RngCore`], 64 at a time (most significant first).
pub(crate) struct RngBits<'a, R: RngCore + ?Sized> {
    rng: &'a mut R,
    word: u64,
    left: u32,
}

impl<'a, R: RngCore + ?Sized> RngBits<'a, R> {
    pub(crate) fn new(rng: &'a mut R) -> Self {
        Self {
            rng,
            word: 0,
            left: 0,
        }
    }
}

impl<R: RngCore + ?Sized> Bits for RngBits<'_, R> {
    fn bit(&mut self) -> bool {
        if self.left == 0 {
            self.word = self.rng.next_u64();
            self.left = 64;
        }
        self.left -= 1;
        (self.word >> self.left) & 1 == 1
    }

    fn bits(&mut self, k: u32) -> u64 {
        debug_assert!(k <= 64);
        if k == 0 {
            return 0;
        }
        if k <= self.left {
            self.left -= k;
            let shifted = self.word >> self.left;
            return if k == 64 {
                shifted
            } else {
                shifted & ((1u64 << k) - 1)
            };
        }
        // The rest of this word, then the first bits of the next.
        let have = self.left;
        let high = if have == 0 {
            0
        } else {
            self.word & ((1u64 << have) - 1)
        };
        let need = k - have;
        self.word = self.rng.next_u64();
        self.left = 64 - need;
        let low = self.word >> self.left;
        if have == 0 { low } else { (high << need) | low }
    }

    fn leading_zeros(&mut self, limit: u32) -> Option<u32> {
        let mut zeros = 0u32;
        loop {
            if self.left == 0 {
                self.word = self.rng.next_u64();
                self.left = 64;
            }
            // The unread bits, moved to the top of the word.
            let unread = self.word << (64 - self.left);
            let lz = unread.leading_zeros();
            if lz < self.left {
                self.left -= lz + 1;
                return Some(zeros + lz);
            }
            zeros += self.left;
            self.left = 0;
            if zeros > limit {
                return None;
            }
        }
    }
}

/// Bernoulli(p) for an f64 `p ∈ [0, 1]`, exactly: `P(true) = p` as a real
/// number (every f64 is a dyadic rational).
///
/// Algorithm: with `I` the position of the first 1 in a stream of uniform bits
/// (`P(I = i) = 2⁻ⁱ`), return the `I`-th bit after the binary point of `p`;
/// then `P(true) = Σᵢ 2⁻ⁱ·bitᵢ(p) = p`. This is the lazy comparison of a
/// uniform real `U = 0.U₁U₂…` with `p`: `U < p` is decided at the first
/// position where they differ. The expansion of an f64 below 1 ends by
/// position 1074, so at most ⌈1075/64⌉ words are read (one, except with
/// probability 2⁻⁶⁴).
///
/// Callers must pass `p ∈ [0, 1]` (not NaN); [`sample_bernoulli`] checks.
pub(crate) fn bernoulli_unit(p: f64, bits: &mut impl Bits) -> bool {
    if p.is_nan() || p <= 0.0 {
        return false;
    }
    if p >= 1.0 {
        return true;
    }
    let (mantissa, exponent) = dyadic(p);
    // The first 1 at position i = zeros + 1; all bits past 2⁻¹⁰⁷⁴ are 0.
    match bits.leading_zeros(1074) {
        Some(zeros) => {
            let i = i64::from(zeros) + 1;
            // p = mantissa·2^exponent: bit i after the point is bit k = −i − exponent.
            let k = -i - exponent;
            (0..64).contains(&k) && (mantissa >> k) & 1 == 1
        }
        None => false,
    }
}

/// `x = mantissa · 2^exponent` exactly, for finite `x ≥ 0`.
pub(crate) fn dyadic(x: f64) -> (u64, i64) {
    let raw = x.to_bits();
    let field = ((raw >> 52) & 0x7ff) as i64;
    let fraction = raw & ((1u64 << 52) - 1);
    if field == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), field - 1075)
    }
}

/// Bernoulli(p), exactly (see the crate-private `bernoulli_unit` for the
/// algorithm): `P(true) = p` as a real number, from uniform bits of `rng`.
///
/// Errors: `p` NaN or outside [0, 1].
pub fn sample_bernoulli(p: f64, rng: &mut (impl RngCore + ?Sized)) -> Result<bool, MechanismError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(MechanismError::InvalidParameter {
            name: "p",
            value: p,
            reason: "a probability must lie in [0, 1]",
        });
    }
    Ok(bernoulli_unit(p, &mut RngBits::new(rng)))
}

/// A uniform integer in `[0, m)`, `m ≥ 1`, exactly: the `k` bits of
/// `m − 1`'s length read as an integer, rejected and redrawn while ≥ m
/// (each try accepts with probability > 1/2).
pub(crate) fn uniform_below_u64(m: u64, bits: &mut impl Bits) -> u64 {
    debug_assert!(m >= 1);
    let k = 64 - (m - 1).leading_zeros();
    loop {
        let x = bits.bits(k);
        if x < m {
            return x;
        }
    }
}

/// [`uniform_below_u64`] for a big `m ≥ 1`.
pub(crate) fn uniform_below(m: &UBig, bits: &mut impl Bits) -> UBig {
    if let Ok(small) = u64::try_from(m) {
        return UBig::from(uniform_below_u64(small, bits));
    }
    let k = (m - UBig::ONE).bit_len();
    let words = k.div_ceil(64);
    let top = (k - 64 * (words - 1)) as u32;
    let mut buffer = vec![0u64; words];
    loop {
        // Most significant word first, so that the bits are read in order.
        buffer[words - 1] = bits.bits(top);
        for w in (0..words - 1).rev() {
            buffer[w] = bits.bits(64);
        }
        let x = UBig::from_words(&buffer);
        if &x < m {
            return x;
        }
    }
}

/// A uniform integer in `[0, n)`, exactly (rejection sampling on uniform bits;
/// `rand`'s `random_range` keeps a bias of up to n/2⁶⁴).
///
/// Errors: `n = 0`.
pub fn sample_uniform_below(
    n: u64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<u64, MechanismError> {
    if n == 0 {
        return Err(MechanismError::InvalidParameter {
            name: "n",
            value: 0.0,
            reason: "the range [0, n) is empty",
        });
    }
    Ok(uniform_below_u64(n, &mut RngBits::new(rng)))
}

/// Bernoulli(n/d) for integers `0 ≤ n ≤ d`, `d ≥ 1`: a uniform integer below
/// d compared with n.
fn bernoulli_ratio(n: &UBig, d: &UBig, bits: &mut impl Bits) -> bool {
    if n >= d {
        return true;
    }
    if *n == UBig::ZERO {
        return false;
    }
    uniform_below(d, bits) < *n
}

/// Bernoulli(exp(−n/d)) for `n/d ∈ [0, 1]` (CKS20, Algorithm 1): draw
/// A_k ~ Bernoulli(γ/k) for k = 1, 2, … until the first A_k = 0, and return
/// whether that k is odd; `P(k odd) = Σ_k odd (γ^{k−1}/(k−1)! − γ^k/k!) = e^{−γ}`.
fn bernoulli_exp_neg_unit(n: &UBig, d: &UBig, bits: &mut impl Bits) -> bool {
    let mut k = 1u64;
    let mut dk = d.clone();
    while bernoulli_ratio(n, &dk, bits) {
        k += 1;
        dk += d;
    }
    k % 2 == 1
}

/// Bernoulli(exp(−n/d)) for any rational `n/d ≥ 0`, `d ≥ 1` (CKS20, Algorithm
/// 1): `exp(−γ) = exp(−1)^⌊γ⌋·exp(−(γ − ⌊γ⌋))`, each factor an independent
/// coin of [`bernoulli_exp_neg_unit`]; stops at the first failure.
pub(crate) fn bernoulli_exp_neg(n: &UBig, d: &UBig, bits: &mut impl Bits) -> bool {
    let whole = n / d;
    let rest = n - &whole * d;
    let mut i = UBig::ZERO;
    while i < whole {
        if !bernoulli_exp_neg_unit(&UBig::ONE, &UBig::ONE, bits) {
            return false;
        }
        i += UBig::ONE;
    }
    bernoulli_exp_neg_unit(&rest, d, bits)
}

/// Bernoulli(exp(−num/den)), exactly, for integers `num ≥ 0`, `den ≥ 1`
/// (CKS20, Algorithm 1, from uniform bits only).
///
/// Errors: `den = 0`.
pub fn sample_bernoulli_exp(
    num: u64,
    den: u64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<bool, MechanismError> {
    if den == 0 {
        return Err(MechanismError::InvalidParameter {
            name: "den",
            value: 0.0,
            reason: "the denominator of γ must be ≥ 1",
        });
    }
    Ok(bernoulli_exp_neg(
        &UBig::from(num),
        &UBig::from(den),
        &mut RngBits::new(rng),
    ))
}

/// A positive rational `num/den` (both ≥ 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ratio {
    pub(crate) num: UBig,
    pub(crate) den: UBig,
}

impl Ratio {
    /// `m·2^e` exactly.
    fn dyadic(m: u64, e: i64) -> Self {
        let m = UBig::from(m);
        if e >= 0 {
            Self {
                num: m << e as usize,
                den: UBig::ONE,
            }
        } else {
            Self {
                num: m,
                den: UBig::ONE << (-e) as usize,
            }
        }
    }

    /// `(x / granularity)^power` exactly, for finite `x > 0` and a power-of-two
    /// granularity (no floating-point division: x = m·2^e and g = 2^k give
    /// m^power·2^{power·(e−k)}).
    fn in_grid_units(x: f64, granularity: f64, power: u32) -> Self {
        let (mut m, mut e) = dyadic(x);
        let tz = m.trailing_zeros();
        m >>= tz;
        e += i64::from(tz);
        let (_, k) = dyadic(granularity);
        // granularity = 2^52·2^k', its mantissa being exactly 2^52 (a power of two, normal).
        let k = k + 52;
        let mut r = Self::dyadic(1, i64::from(power) * (e - k));
        let mb = UBig::from(m);
        for _ in 0..power {
            r.num *= &mb;
        }
        r
    }
}

/// Discrete Laplace with scale `t/s` (CKS20, Algorithm 2): `P(Z = z) ∝
/// exp(−|z|·s/t)` on the integers, exactly.
fn discrete_laplace(scale: &Ratio, bits: &mut impl Bits) -> IBig {
    let (t, s) = (&scale.num, &scale.den);
    loop {
        let u = uniform_below(t, bits);
        if !bernoulli_exp_neg(&u, t, bits) {
            continue;
        }
        let mut v = UBig::ZERO;
        while bernoulli_exp_neg_unit(&UBig::ONE, &UBig::ONE, bits) {
            v += UBig::ONE;
        }
        let y = (u + t * v) / s;
        let negative = bits.bit();
        if negative && y == UBig::ZERO {
            continue;
        }
        return if negative {
            -IBig::from(y)
        } else {
            IBig::from(y)
        };
    }
}

/// Discrete Gaussian with `σ² = num/den` (CKS20, Algorithm 3): `P(Z = z) ∝
/// exp(−z²/(2σ²))` on the integers, exactly. Rejection from a discrete
/// Laplace of integer scale `τ = ⌊σ⌋ + 1`: Y is accepted with probability
/// `exp(−(|Y| − σ²/τ)²/(2σ²))`, whose exponent is the rational
/// `(|Y|·den·τ − num)² / (2·num·den·τ²)`. (Any τ > 0 gives the same law;
/// this one makes the expected number of tries O(1).)
struct DiscreteGaussian {
    num: UBig,
    laplace: Ratio,
    den_tau: UBig,
    exponent_den: UBig,
}

impl DiscreteGaussian {
    fn new(sigma2: Ratio) -> Self {
        let (a, b) = (&sigma2.num, &sigma2.den);
        // ⌊σ⌋ = ⌊√⌊σ²⌋⌋ (√ is increasing and maps squares of integers to integers).
        let tau = (a / b).nth_root(2) + UBig::ONE;
        let den_tau = b * &tau;
        let exponent_den = UBig::from(2u8) * a * &den_tau * &tau;
        Self {
            laplace: Ratio {
                num: tau,
                den: UBig::ONE,
            },
            num: sigma2.num,
            den_tau,
            exponent_den,
        }
    }

    fn sample(&self, bits: &mut impl Bits) -> IBig {
        loop {
            let y = discrete_laplace(&self.laplace, bits);
            let magnitude = (&y).unsigned_abs() * &self.den_tau;
            let diff = if magnitude >= self.num {
                magnitude - &self.num
            } else {
                &self.num - magnitude
            };
            if bernoulli_exp_neg(&(&diff * &diff), &self.exponent_den, bits) {
                return y;
            }
        }
    }
}

/// Checks a grid granularity: a positive normal power of two (so that
/// dividing by it, and multiplying by it, is exact in f64).
pub fn check_granularity(granularity: f64) -> Result<(), MechanismError> {
    let raw = granularity.to_bits();
    let normal = granularity.is_normal() && granularity > 0.0;
    if normal && raw & ((1u64 << 52) - 1) == 0 {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name: "granularity",
            value: granularity,
            reason: "must be a positive normal power of two (2^k)",
        })
    }
}

fn to_i64(z: IBig) -> Result<i64, MechanismError> {
    i64::try_from(&z).map_err(|_| MechanismError::InvalidParameter {
        name: "noise",
        value: z.to_f64().value(),
        reason: "a noise draw exceeded the 64-bit range (probability below 2^-60 for any scale ≤ 2^56)",
    })
}

/// An integer drawn from the discrete Laplace law `P(Z = z) ∝ exp(−|z|/scale)`,
/// exactly (CKS20, Algorithm 2, with the f64 scale taken as the exact rational
/// it is).
///
/// Errors: `scale` not finite and > 0; a draw outside the i64 range (possible
/// only for astronomically large scales).
pub fn sample_discrete_laplace(
    scale: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<i64, MechanismError> {
    positive("scale", scale)?;
    let ratio = Ratio::in_grid_units(scale, 1.0, 1);
    to_i64(discrete_laplace(&ratio, &mut RngBits::new(rng)))
}

/// An integer drawn from the discrete Gaussian law `P(Z = z) ∝ exp(−z²/(2σ²))`,
/// exactly (CKS20, Algorithm 3, with σ² the exact square of the f64 σ).
///
/// Errors: `sigma` not finite and > 0; a draw outside the i64 range.
pub fn sample_discrete_gaussian(
    sigma: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<i64, MechanismError> {
    positive("sigma", sigma)?;
    let sampler = DiscreteGaussian::new(Ratio::in_grid_units(sigma, 1.0, 2));
    to_i64(sampler.sample(&mut RngBits::new(rng)))
}

/// `round(x / granularity)` (halves away from zero), exactly: the division by
/// a power of two is exact unless the quotient is below 2⁻¹⁰²² in magnitude,
/// where both it and the exact quotient round to 0.
///
/// Errors: `x` not finite; a quotient of magnitude ≥ 2⁶² (the grid is too fine
/// for the value).
pub fn round_to_grid(x: f64, granularity: f64) -> Result<i64, MechanismError> {
    check_granularity(granularity)?;
    if !x.is_finite() {
        return Err(MechanismError::NonFinite {
            row: 0,
            index: 0,
            value: x,
        });
    }
    let q = (x / granularity).round();
    if q.abs() >= 4_611_686_018_427_387_904.0 {
        return Err(MechanismError::InvalidParameter {
            name: "granularity",
            value: granularity,
            reason: "the value divided by the granularity reaches 2^62: choose a coarser grid",
        });
    }
    Ok(q as i64)
}

/// The query rounded to the grid, coordinate by coordinate (errors name the
/// coordinate).
fn grid_query(query: &[f64], granularity: f64) -> Result<Vec<i64>, MechanismError> {
    check_granularity(granularity)?;
    query
        .iter()
        .enumerate()
        .map(|(index, &x)| {
            round_to_grid(x, granularity).map_err(|e| match e {
                MechanismError::NonFinite { value, .. } => MechanismError::NonFinite {
                    row: 0,
                    index,
                    value,
                },
                other => other,
            })
        })
        .collect()
}

/// `granularity · (r + z)` as an f64: a function of the exact integer `r + z`
/// only (post-processing of it).
fn on_grid(r: i64, z: IBig, granularity: f64) -> f64 {
    (IBig::from(r) + z).to_f64().value() * granularity
}

/// The discrete Laplace mechanism on a grid: with `R_j = round(q_j/g)`
/// ([`round_to_grid`]) and `Z_j` i.i.d. discrete Laplace of scale `scale/g`
/// grid units (`P(Z_j = z) ∝ exp(−|z|·g/scale)`), returns `g·(R_j + Z_j)`
/// (an f64 function of the integer `R_j + Z_j` alone).
///
/// Guarantee: if the caller's query has L1 sensitivity Δ₁ (in value units),
/// the integer vector `R` has L1 sensitivity at most
/// [`rounded_l1_sensitivity`]`(Δ₁, len, g)/g` grid units, so the release is
/// ε-DP with `ε = rounded_l1_sensitivity(Δ₁, len, g)/scale` (the discrete
/// Laplace density ratio at integer shift d is at most `exp(|d|·g/scale)`,
/// multiplied over coordinates) — see [`pure_dp_rdp_at`] for its RDP curve.
///
/// Errors: bad `scale` or `granularity`, a non-finite query entry, a value too
/// large for the grid.
pub fn laplace_on_grid(
    query: &[f64],
    scale: f64,
    granularity: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<Vec<f64>, MechanismError> {
    positive("scale", scale)?;
    let r = grid_query(query, granularity)?;
    let ratio = Ratio::in_grid_units(scale, granularity, 1);
    let mut bits = RngBits::new(rng);
    Ok(r.into_iter()
        .map(|r| on_grid(r, discrete_laplace(&ratio, &mut bits), granularity))
        .collect())
}

/// The discrete Gaussian mechanism on a grid: with `R_j = round(q_j/g)`
/// ([`round_to_grid`]) and `Z_j` i.i.d. discrete Gaussian with parameter
/// `σ/g` grid units (`P(Z_j = z) ∝ exp(−z²g²/(2σ²))`), returns `g·(R_j + Z_j)`
/// (an f64 function of the integer `R_j + Z_j` alone).
///
/// Guarantee: if the caller's query has L2 sensitivity Δ₂ (value units), `R`
/// has L2 sensitivity at most `Δ' = `[`rounded_l2_sensitivity`]`(Δ₂, len, g)`
/// (value units), and the release is `(α, α·Δ'²/(2σ²))`-RDP at every α > 1:
/// for integer shifts the discrete Gaussian's Rényi divergence is at most that
/// of the continuous one (CKS20, the concentrated-DP theorem for the discrete
/// Gaussian), and Rényi divergence adds over independent coordinates. Charge
/// it with `privmix_accountant::gaussian(orders, σ, Δ')`.
///
/// Errors: bad `sigma` or `granularity`, a non-finite query entry, a value
/// too large for the grid.
pub fn gaussian_on_grid(
    query: &[f64],
    sigma: f64,
    granularity: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<Vec<f64>, MechanismError> {
    positive("sigma", sigma)?;
    let r = grid_query(query, granularity)?;
    let sampler = DiscreteGaussian::new(Ratio::in_grid_units(sigma, granularity, 2));
    let mut bits = RngBits::new(rng);
    Ok(r.into_iter()
        .map(|r| on_grid(r, sampler.sample(&mut bits), granularity))
        .collect())
}

/// `len` i.i.d. draws `g·Z_j`, `Z_j` discrete Gaussian with parameter `σ/g`
/// grid units (`P(g·Z_j = g·z) ∝ exp(−(g·z)²/(2σ²))`), each converted to f64
/// (exact while `|Z_j| < 2⁵³`).
///
/// For a caller that adds the noise itself: round the query to the same grid
/// first (`g·`[`round_to_grid`]`(q_j, g)`), so that the sum of two multiples
/// of g is one correctly rounded f64 of the exact integer sum, and charge
/// `privmix_accountant::gaussian(orders, σ, `[`rounded_l2_sensitivity`]`(Δ₂,
/// len, g))` — the guarantee of [`gaussian_on_grid`], which does both steps.
///
/// Errors: bad `sigma` or `granularity`.
pub fn gaussian_noise_vector(
    len: usize,
    sigma: f64,
    granularity: f64,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<Vec<f64>, MechanismError> {
    gaussian_on_grid(&vec![0.0; len], sigma, granularity, rng)
}

/// The L1 sensitivity of a query after rounding each of its `len` coordinates
/// to the grid `g`, rounded up: each rounded coordinate moves by at most g/2
/// from the value, so two rounded neighbours differ by at most `|Δ_j| + g` in
/// each coordinate, `Δ₁ + len·g` in total.
pub fn rounded_l1_sensitivity(l1: f64, len: usize, granularity: f64) -> f64 {
    (l1 + (len as f64 * granularity).next_up()).next_up()
}

/// The L2 sensitivity after rounding `len` coordinates to the grid `g`, rounded
/// up: the rounded difference is the exact one plus a vector with entries in
/// [−g, g], so by the triangle inequality it is at most `Δ₂ + √len·g`.
pub fn rounded_l2_sensitivity(l2: f64, len: usize, granularity: f64) -> f64 {
    let root = (len as f64).sqrt().next_up();
    (l2 + (root * granularity).next_up()).next_up()
}

/// RDP at order α > 1 of any ε-DP mechanism, rounded up:
/// `min(ε, α·ε²/2, ε + [ln(1 + e^{−(2α−1)ε}) − ln(1 + e^{−ε})]/(α−1))`.
///
/// The last form is `ln((e^{αε} + e^{−(α−1)ε})/(1 + e^ε))/(α−1)`, the RDP of
/// randomised response, and it is the largest for ε-DP: with `Z` the privacy
/// loss, `W = e^{−Z} ∈ [e^{−ε}, e^ε]` has mean 1 under the first law and the
/// moment `E[W^{−(α−1)}]` is convex in W, so the two-point law on the ends
/// maximises it (Steinke, "Tight RDP & zCDP Bounds from Pure DP", 2024; the
/// `α·ε²/2` form is Bun & Steinke, "Concentrated Differential Privacy:
/// Simplifications, Extensions, and Lower Bounds", arXiv 1605.02065, Prop. 3.3).
pub fn pure_dp_rdp_at(alpha: f64, epsilon: f64) -> f64 {
    if epsilon <= 0.0 {
        return 0.0;
    }
    let am1_lo = (alpha - 1.0).next_down();
    let quadratic = ((alpha * epsilon).next_up() * epsilon).next_up() / 2.0;
    // ln1p(e^{−(2α−1)ε}) rounded up, ln1p(e^{−ε}) rounded down (two ulps per
    // exp/ln1p step; the arguments are in (0, 1]).
    let up = (-((2.0 * alpha - 1.0).next_down() * epsilon).next_down())
        .exp()
        .next_up()
        .next_up()
        .ln_1p()
        .next_up()
        .next_up();
    let down = (-epsilon.next_up())
        .exp()
        .next_down()
        .next_down()
        .ln_1p()
        .next_down()
        .next_down();
    let gap = (up - down).next_up();
    // Dividing a negative gap by a larger denominator rounds its quotient up.
    let rr = if gap <= 0.0 {
        (epsilon + (gap / (alpha - 1.0).next_up()).next_up()).next_up()
    } else {
        (epsilon + (gap / am1_lo).next_up()).next_up()
    };
    epsilon.min(quadratic).min(rr).max(0.0)
}

#[cfg(test)]
mod tests;
