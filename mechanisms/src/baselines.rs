//! The baselines the papers compare against (submix.txt §5 and App. B,
//! adapmixed.txt §5): public model only, non-private ensemble,
//! subsample-and-aggregate with Laplace noise, and GNMax.

use privmix_accountant::{Orders, RdpCurve, gaussian};
use rand::Rng;
use rand_distr::{Distribution, Normal};

use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release,
};

pub(crate) fn positive(name: &'static str, value: f64) -> Result<(), MechanismError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(MechanismError::InvalidParameter {
            name,
            value,
            reason: "must be finite and > 0",
        })
    }
}

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
        account.charge(&charge, self.name())?;
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
/// paper's baseline, submix.txt App. B.3): release the average of the members'
/// distributions plus i.i.d. Laplace(scale) noise on every entry, and sample
/// the token from the noisy vector clipped at 0 and renormalised (p₀ if
/// nothing positive is left) — both post-processing of the released vector.
///
/// Sensitivity: removing member i changes the average by
/// `(1/N)(pᵢ − p̄₋ᵢ)`, whose L1 norm is at most **2/N** (two distributions are
/// at most 2 apart in L1; the same holds for replacing a member). App. B.3
/// states 1/K, which is half the true worst case; privmix uses 2/N.
/// Guarantee: the product of per-entry Laplace divergences is maximised by
/// putting the whole shift on one entry (the log-moment
/// `(α−1)ε(α; t)` is a log-sum-exp of affine functions of t, hence convex with
/// value 0 at t = 0, hence superadditive), so each step is
/// `(α, laplace_rdp_at(α, (2/N)/scale))`-RDP.
#[derive(Debug, Clone, Copy)]
pub struct SubsampleAggregateLaplace {
    scale: f64,
}

impl SubsampleAggregateLaplace {
    /// Laplace scale b > 0 (finite).
    pub fn new(scale: f64) -> Result<Self, MechanismError> {
        positive("scale", scale)?;
        Ok(Self { scale })
    }

    /// The per-step curve for an ensemble of `members` (≥ 1).
    pub fn curve(&self, orders: &Orders, members: usize) -> Result<RdpCurve, MechanismError> {
        if members == 0 {
            return Err(MechanismError::EmptyEnsemble);
        }
        let ratio = (2.0 / members as f64).next_up() / self.scale;
        let ratio = ratio.next_up();
        Ok(RdpCurve::from_fn(orders.clone(), |a| {
            laplace_rdp_at(a, ratio)
        })?)
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
        let charge = self.curve(account.orders(), ensemble.len())?;
        // Laplace(b) as the difference of two Exp(1/b) draws (inversion, f64).
        let noise: Vec<f64> = (0..ensemble.vocab())
            .map(|_| {
                let u: f64 = rng.random();
                let w: f64 = rng.random();
                self.scale * ((1.0 - w).ln() - (1.0 - u).ln())
            })
            .collect();
        let released = self.noisy_average(ensemble, &noise)?;
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
/// vote histogram gets i.i.d. N(0, σ²) noise, and the noisy argmax is released.
///
/// Adjacency and guarantee: replacing one member's data moves at most one vote,
/// changing two histogram entries by 1 each — L2 sensitivity √2 — so each step
/// is `(α, α/σ²)`-RDP (Gaussian mechanism, Mironov 2017 Prop. 7; the argmax
/// is post-processing). Adding or removing a member changes one entry by 1
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
        let normal =
            Normal::new(0.0, self.sigma).map_err(|_| MechanismError::InvalidParameter {
                name: "sigma",
                value: self.sigma,
                reason: "must be finite and > 0",
            })?;
        let noisy: Vec<f64> = Self::votes(ensemble)?
            .into_iter()
            .map(|h| h + normal.sample(rng))
            .collect();
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
mod tests {
    use super::*;

    #[test]
    fn laplace_rdp_matches_mpmath_and_rounds_up() {
        // mpmath (dps 40) of Mironov's Table II formula, as the nearest f64:
        // log(a/(2a-1)*exp((a-1)*t) + (a-1)/(2a-1)*exp(-a*t))/(a-1).
        let golden = [
            (2.0, 1.0, 0.619_123_629_998_592_8),
            (1.5, 0.1, 0.007_247_485_389_328_535),
            (18.0, 0.02, 0.003_506_100_522_649_583_6),
            (64.0, 3.0, 2.989_122_158_680_969_8),
            (2.0, 50.0, 49.594_534_891_891_83),
        ];
        for (a, t, want) in golden {
            let got = laplace_rdp_at(a, t);
            assert!(
                got >= want && got <= want * (1.0 + 1e-12),
                "α {a}, t {t}: {got} vs {want}"
            );
        }
        assert_eq!(laplace_rdp_at(2.0, 0.0), 0.0);
        assert!(laplace_rdp_at(2.0, 1e6).is_finite());
    }

    #[test]
    fn bad_parameters_and_empty_ensembles_are_errors() {
        assert!(SubsampleAggregateLaplace::new(0.0).is_err());
        assert!(SubsampleAggregateLaplace::new(f64::NAN).is_err());
        assert!(Gnmax::new(-1.0).is_err());
        let e = Ensemble::from_probabilities(&[0.5, 0.5], &[]).unwrap();
        assert!(matches!(
            Gnmax::votes(&e),
            Err(MechanismError::EmptyEnsemble)
        ));
        let s = SubsampleAggregateLaplace::new(1.0).unwrap();
        assert!(s.curve(&Orders::default(), 0).is_err());
        assert!(s.noisy_average(&e, &[0.0, 0.0]).is_err());
        let e = Ensemble::from_probabilities(&[0.5, 0.5], &[0.5, 0.5]).unwrap();
        assert!(s.noisy_average(&e, &[0.0]).is_err());
    }

    #[test]
    fn votes_break_ties_low_and_count_each_member_once() {
        let e = Ensemble::from_probabilities(
            &[0.25; 4],
            &[0.4, 0.4, 0.1, 0.1, 0.0, 0.0, 0.0, 1.0, 0.1, 0.2, 0.3, 0.4],
        )
        .unwrap();
        assert_eq!(Gnmax::votes(&e).unwrap(), vec![1.0, 0.0, 0.0, 2.0]);
    }
}
