//! The baselines the papers compare against (SubMix, arXiv:2201.00971, App. A.1 and
//! B.3–B.4; AdaPMixED, arXiv:2410.02016, §5): public model only, non-private ensemble,
//! subsample-and-aggregate with Laplace noise, and GNMax. The sensitivity and rounding
//! arguments behind their charges are collected in `proof.md` beside this file
//! (`src/baselines/proof.md`).

use privmix_accountant::{DpEvent, Orders, RdpCurve, gaussian};

use crate::error::positive;
use crate::noise::{
    check_granularity, gaussian_on_grid, laplace_on_grid, pure_dp_rdp_at, rounded_l1_sensitivity,
};
use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release,
};

fn members_average(ensemble: &Ensemble) -> Result<Vec<f64>, MechanismError> {
    if ensemble.is_empty() {
        return Err(MechanismError::EmptyEnsemble);
    }
    let n = ensemble.len() as f64;
    let mut avg = vec![0.0; ensemble.vocab()];
    for i in 0..ensemble.len() {
        for (a, &p) in avg.iter_mut().zip(ensemble.member(i)) {
            *a += p;
        }
    }
    avg.iter_mut().for_each(|a| *a /= n);
    Ok(avg)
}

/// The public model alone: samples from p₀ and charges 0 at every order (it
/// reads no private data). Also the fallback once a budget is exhausted.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicOnly;

impl EnsembleMechanism for PublicOnly {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        _rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let charge = RdpCurve::zero(account.orders().clone());
        account.charge_event(&DpEvent::NoOp, self.name())?;
        Ok(Release {
            distribution: ensemble.public().to_vec(),
            charge,
            diagnostics: Diagnostics {
                public_reason: Some(PublicReason::PublicOnly),
                ..Diagnostics::default()
            },
        })
    }

    fn name(&self) -> &'static str {
        "public-only"
    }
}

/// The non-private ensemble: samples from the plain average of the members.
/// It has no privacy guarantee, so it honestly charges +∞ at every order: only
/// an account without a budget ([`crate::Unbudgeted`]) accepts it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NonPrivateEnsemble;

impl EnsembleMechanism for NonPrivateEnsemble {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        _rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let avg = members_average(ensemble)?;
        let charge = RdpCurve::from_fn(account.orders().clone(), |_| f64::INFINITY)?;
        account.charge(&charge, self.name())?;
        Ok(Release {
            distribution: avg,
            charge,
            diagnostics: Diagnostics::default(),
        })
    }

    fn name(&self) -> &'static str {
        "non-private-ensemble"
    }
}

/// RDP of the Laplace mechanism at order α for sensitivity/scale ratio t
/// (Mironov 2017, Table II / Prop. 6):
/// `1/(α−1)·log(α/(2α−1)·e^{(α−1)t} + (α−1)/(2α−1)·e^{−αt})`, evaluated as
/// `[ln(α/(2α−1)) + (α−1)t + ln1p((α−1)/α·e^{−(2α−1)t})]/(α−1)` (no overflow)
/// and rounded up (one ulp per arithmetic step, two per `exp`/`ln`).
pub fn laplace_rdp_at(alpha: f64, ratio: f64) -> f64 {
    if ratio == 0.0 {
        return 0.0;
    }
    let am1_lo = (alpha - 1.0).next_down();
    let am1_hi = (alpha - 1.0).next_up();
    let two_am1_lo = (2.0 * alpha - 1.0).next_down();
    let ln_ratio = (alpha / two_am1_lo).next_up().ln().next_up().next_up();
    let linear = (am1_hi * ratio).next_up();
    let decay = (-(two_am1_lo * ratio).next_down())
        .exp()
        .next_up()
        .next_up();
    let tail = ((am1_hi / alpha).next_up() * decay)
        .next_up()
        .ln_1p()
        .next_up()
        .next_up();
    let total = ((ln_ratio + linear).next_up() + tail).next_up();
    (total / am1_lo).next_up().max(0.0)
}

/// Subsample-and-aggregate with Laplace noise (Dwork et al. 2014; the SubMix
/// paper's baseline, arXiv:2201.00971 App. B.3): release the average of the members'
/// distributions, rounded to a grid of granularity g, plus i.i.d. DISCRETE
/// Laplace noise of scale b on every entry (`g·Z`, `P(Z = z) ∝ exp(−|z|·g/b)`,
/// sampled exactly from random bits: [`crate::noise::laplace_on_grid`]), and
/// sample the token from the noisy vector clipped at 0 and renormalised (p₀ if
/// nothing positive is left) — both post-processing of the released vector.
/// (Continuous Laplace noise made of `ln(u)` has float artefacts that leak the
/// noised value: Mironov, "On Significance of the Least Significant Bits for
/// Differential Privacy", CCS 2012.)
///
/// Privacy unit: one member (its data changes that member's distribution
/// arbitrarily). Adjacency: replacing a member, or adding/removing one when
/// both ensembles keep ≥ 1 member (an empty ensemble is refused).
///
/// Sensitivity (L1, value units), all rounded up, for N members and V tokens:
/// * the exact average moves by `(1/N)(pᵢ − p̄₋ᵢ)` (removal) or `(pᵢ − pᵢ')/N`
///   (replacement), at most **2B/N** in L1, B the largest mass of a member row
///   ([`row_mass_bound`]: 1 up to the rounding of its normalisation). App. B.3
///   states 1/K, half the true worst case;
/// * the f64 average (members summed in order, then divided by N) is within
///   `γ_{N+1}·B + V·2⁻¹⁰⁷⁴` of the exact one in L1 (`γ_n = nu/(1−nu)`,
///   u = 2⁻⁵³: nonnegative terms, n − 1 additions and one division, each
///   entry's quotient possibly subnormal), on each side of the pair;
/// * rounding to the grid moves each entry by at most g/2 on each side: `+V·g`
///   ([`crate::noise::rounded_l1_sensitivity`]).
///
/// Guarantee: with Δ₁ that total, the released integer vector is ε-DP with
/// `ε = Δ₁/b` (the discrete Laplace density ratio at integer shift d is at
/// most `exp(|d|·g/b)`, multiplied over entries), hence
/// `(α, `[`pure_dp_rdp_at`]`(α, ε))`-RDP at every order.
#[derive(Debug, Clone, Copy)]
pub struct SubsampleAggregateLaplace {
    scale: f64,
    granularity: f64,
}

/// The default grid for a noise scale b: the largest power of two ≤ b·2⁻³⁰
/// (at least 2⁻¹⁰²², the smallest normal), so that the grid adds at most
/// `V·2⁻³⁰` to ε = Δ₁/b.
pub fn default_granularity(scale: f64) -> f64 {
    let (_, e) = crate::noise::dyadic(scale);
    // scale = m·2^e with 2⁵² ≤ m < 2⁵³ for normal scales: 2^{e+52} ≤ scale.
    2f64.powi((e + 52 - 30).clamp(-1022, 1023) as i32)
}

/// The largest L1 mass of an [`Ensemble`] row: each entry is `fl(w_j/s)` with
/// `s` the f64 sum of the nonnegative `w_j` (any order), so the row's exact
/// sum is at most `(1+u)/(1 − γ_{V−1}) + V·2⁻¹⁰⁷⁴` (u = 2⁻⁵³), rounded up.
pub fn row_mass_bound(vocab: usize) -> f64 {
    let u = 2f64.powi(-53);
    let v = vocab as f64;
    let gamma = gamma_up((v - 1.0).max(0.0));
    let quotient = ((1.0 + u).next_up() / (1.0 - gamma).next_down()).next_up();
    (quotient + (v * 2f64.powi(-1074)).next_up()).next_up()
}

/// `γ_n = n·u/(1 − n·u)`, u = 2⁻⁵³, rounded up (+∞ when n·u ≥ 1).
fn gamma_up(n: f64) -> f64 {
    let nu = (n * 2f64.powi(-53)).next_up();
    if nu >= 1.0 {
        return f64::INFINITY;
    }
    (nu / (1.0 - nu).next_down()).next_up()
}

impl SubsampleAggregateLaplace {
    /// Laplace scale b > 0 (finite), on the grid [`default_granularity`]`(b)`.
    pub fn new(scale: f64) -> Result<Self, MechanismError> {
        positive("scale", scale)?;
        Self::with_granularity(scale, default_granularity(scale))
    }

    /// Laplace scale b > 0 on a grid of granularity g (a positive normal power
    /// of two; the noise is `g·Z` with Z of scale b/g grid units). A coarse
    /// grid costs `V·g/b` more ε; a fine one costs only big-integer time.
    pub fn with_granularity(scale: f64, granularity: f64) -> Result<Self, MechanismError> {
        positive("scale", scale)?;
        check_granularity(granularity)?;
        Ok(Self { scale, granularity })
    }

    /// b.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// g.
    pub fn granularity(&self) -> f64 {
        self.granularity
    }

    /// The L1 sensitivity of the rounded average for `members` (≥ 1) and
    /// `vocab` (≥ 1) tokens, value units, rounded up (see the type's doc).
    pub fn sensitivity(&self, members: usize, vocab: usize) -> Result<f64, MechanismError> {
        if members == 0 {
            return Err(MechanismError::EmptyEnsemble);
        }
        if vocab == 0 {
            return Err(MechanismError::EmptyVocabulary);
        }
        let b = row_mass_bound(vocab);
        let exact = ((2.0 * b).next_up() / members as f64).next_up();
        let float = ((gamma_up(members as f64 + 1.0) * b).next_up()
            + (vocab as f64 * 2f64.powi(-1074)).next_up())
        .next_up();
        let total = (exact + (2.0 * float).next_up()).next_up();
        Ok(rounded_l1_sensitivity(total, vocab, self.granularity))
    }

    /// The per-step curve for an ensemble of `members` (≥ 1) over `vocab`
    /// tokens: `pure_dp_rdp_at(α, Δ₁/b)`.
    pub fn curve(
        &self,
        orders: &Orders,
        members: usize,
        vocab: usize,
    ) -> Result<RdpCurve, MechanismError> {
        let epsilon = (self.sensitivity(members, vocab)? / self.scale).next_up();
        Ok(RdpCurve::from_fn(orders.clone(), |a| {
            pure_dp_rdp_at(a, epsilon)
        })?)
    }

    /// The f64 average of the members (the query before rounding).
    pub fn average(ensemble: &Ensemble) -> Result<Vec<f64>, MechanismError> {
        members_average(ensemble)
    }

    /// The released noisy average for a given noise vector (one entry per token).
    pub fn noisy_average(
        &self,
        ensemble: &Ensemble,
        noise: &[f64],
    ) -> Result<Vec<f64>, MechanismError> {
        if noise.len() != ensemble.vocab() {
            return Err(MechanismError::LengthMismatch {
                what: "laplace noise",
                len: noise.len(),
                vocab: ensemble.vocab(),
            });
        }
        let avg = members_average(ensemble)?;
        Ok(avg.iter().zip(noise).map(|(a, z)| a + z).collect())
    }
}

impl EnsembleMechanism for SubsampleAggregateLaplace {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let charge = self.curve(account.orders(), ensemble.len(), ensemble.vocab())?;
        let average = members_average(ensemble)?;
        let released = laplace_on_grid(&average, self.scale, self.granularity, rng)?;
        account.charge(&charge, self.name())?;
        // Post-processing: clip at 0 and renormalise (the public distribution
        // when nothing stays positive).
        let mut clipped: Vec<f64> = released.iter().map(|&x| x.max(0.0)).collect();
        let total: f64 = clipped.iter().sum();
        if total > 0.0 && total.is_finite() {
            clipped.iter_mut().for_each(|x| *x /= total);
        } else {
            clipped = ensemble.public().to_vec();
        }
        Ok(Release {
            distribution: clipped,
            charge,
            diagnostics: Diagnostics::default(),
        })
    }

    fn name(&self) -> &'static str {
        "subsample-aggregate-laplace"
    }
}

/// GNMax (Papernot et al. 2018, "Scalable private learning with PATE", §4.1):
/// each member votes for its most likely token (ties: the lowest index), the
/// vote histogram gets i.i.d. DISCRETE Gaussian noise with parameter σ
/// (`P(Z = z) ∝ exp(−z²/(2σ²))` on the integers, sampled exactly from random
/// bits: [`crate::noise::gaussian_on_grid`] on the grid of one vote, which
/// leaves the integer histogram unrounded), and the noisy argmax is released
/// (ties: the lowest index).
///
/// Privacy unit: one member. Adjacency and guarantee: replacing one member's
/// data moves at most one vote, changing two histogram entries by 1 each — L2
/// sensitivity √2 on the integers — so each step is `(α, α/σ²)`-RDP: for
/// integer shifts the discrete Gaussian's Rényi divergence is at most the
/// continuous one's `α·Δ²/(2σ²)` (Canonne, Kamath & Steinke, "The Discrete
/// Gaussian for Differential Privacy", arXiv 2004.00010), it adds over the
/// independent entries, and the argmax is post-processing. Adding or removing a member changes one entry by 1
/// (sensitivity 1 ≤ √2), so the same charge covers add/remove adjacency too.
/// The paper's data-dependent refinement (its Thm 6) is not used.
#[derive(Debug, Clone, Copy)]
pub struct Gnmax {
    sigma: f64,
}

impl Gnmax {
    /// Noise standard deviation σ > 0 (finite).
    pub fn new(sigma: f64) -> Result<Self, MechanismError> {
        positive("sigma", sigma)?;
        Ok(Self { sigma })
    }

    /// σ.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The per-step curve `α·(√2)²/(2σ²) = α/σ²`, rounded up.
    pub fn curve(&self, orders: &Orders) -> Result<RdpCurve, MechanismError> {
        Ok(gaussian(
            orders,
            self.sigma,
            std::f64::consts::SQRT_2.next_up(),
        )?)
    }

    /// The vote histogram: entry x counts the members whose argmax is x.
    pub fn votes(ensemble: &Ensemble) -> Result<Vec<f64>, MechanismError> {
        if ensemble.is_empty() {
            return Err(MechanismError::EmptyEnsemble);
        }
        let mut hist = vec![0.0; ensemble.vocab()];
        for i in 0..ensemble.len() {
            hist[argmax(ensemble.member(i))] += 1.0;
        }
        Ok(hist)
    }
}

/// Index of the largest entry; ties go to the lowest index.
fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

impl EnsembleMechanism for Gnmax {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let charge = self.curve(account.orders())?;
        let votes = Self::votes(ensemble)?;
        let noisy = gaussian_on_grid(&votes, self.sigma, 1.0, rng)?;
        account.charge(&charge, self.name())?;
        // The noisy argmax, released with certainty.
        let mut distribution = vec![0.0; ensemble.vocab()];
        distribution[argmax(&noisy)] = 1.0;
        Ok(Release {
            distribution,
            charge,
            diagnostics: Diagnostics::default(),
        })
    }

    fn name(&self) -> &'static str {
        "gnmax"
    }
}

#[cfg(test)]
mod tests;
