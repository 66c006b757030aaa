//! What one mechanism step returns, and the trait ensemble mechanisms implement.

use privmix_accountant::RdpCurve;

use crate::{Account, Ensemble, MechanismError, PrivacyRng, sample_index};

/// Why a step answered from the public distribution alone, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublicReason {
    /// Poisson subsampling drew no member (PMixED).
    NoMemberDrawn,
    /// Noisy screening judged the query answerable from the public model (AdaPMixED).
    Screened,
    /// The mechanism is the public-only baseline.
    PublicOnly,
}

/// Diagnostics of one step: what the mechanism decided, for tests, audits and plots.
///
/// **Private.** Every field is computed from the private data (which members were
/// drawn, their λ, the solvers' work) and is not covered by any charge: never publish
/// it (the CLI prints none of it; reports show it only under a heading saying so).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diagnostics {
    /// The λ of each member, part or demonstration mixed in this step, in order.
    pub lambdas: Vec<f64>,
    /// Members (or parts, or demonstrations) drawn by subsampling, if any.
    pub drawn: Vec<usize>,
    /// Set when the step answered from the public distribution alone.
    pub public_reason: Option<PublicReason>,
    /// Divergence evaluations the λ solvers spent (cost diagnostics).
    pub solver_evaluations: usize,
}

/// One released token and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// The released token index.
    pub token: usize,
    /// The RDP curve charged to the account for this token.
    pub charge: RdpCurve,
    /// What the mechanism decided.
    pub diagnostics: Diagnostics,
}

/// The distribution one step draws its token from, already charged.
///
/// The guarantee a mechanism proves is for one token *sampled* from this
/// distribution: the vector itself is not private and must not be published.
/// Teacher-forced evaluation (perplexity at the true next token, as in the
/// PMixED and SubMix papers) reads it and counts every position as one query
/// charged as if its token had been released.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    /// The output distribution, as a law up to a positive factor: non-negative, with a
    /// positive sum, and the token is drawn with probability `d_t / Σd`. It sums to 1 up
    /// to rounding, except where PMixED, SubMix or AdaPMixED's private answer average m
    /// mixture rows and some positive entry of their f64 sum is below `m·2⁻¹⁰²²`
    /// (dividing would make it subnormal, with an error that is not relative): the sum
    /// is then released undivided and sums to about m (a release summing to 2.0 has been
    /// seen). Divide by the sum before reading entries as probabilities.
    pub distribution: Vec<f64>,
    /// The RDP curve charged to the account.
    pub charge: RdpCurve,
    /// What the mechanism decided.
    pub diagnostics: Diagnostics,
}

/// A mechanism over an ensemble of next-token distributions (PMixED, AdaPMixED,
/// SubMix and the ensemble baselines).
///
/// Contract: [`EnsembleMechanism::release`] has `account` accept the charge
/// (for a ledger: synced to disk) *before* it returns the distribution; if the
/// account refuses, it returns [`MechanismError::ChargeRefused`] and nothing is
/// released. [`EnsembleMechanism::step`] then samples from that distribution.
pub trait EnsembleMechanism {
    /// Computes the output distribution and its charge, and charges the account.
    fn release(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError>;

    /// One step: [`EnsembleMechanism::release`], then one token drawn from the
    /// released distribution.
    fn step(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        let release = self.release(ensemble, rng, account)?;
        let token = sample_index(&release.distribution, rng)?;
        self.recycle(release.distribution);
        Ok(StepOutcome {
            token,
            charge: release.charge,
            diagnostics: release.diagnostics,
        })
    }

    /// Takes back a released distribution that is no longer needed, so that a
    /// mechanism may reuse its buffer for the next one (a fresh vocabulary-sized
    /// buffer per step costs page faults); [`EnsembleMechanism::step`] hands back the
    /// one it sampled from. The default drops it.
    fn recycle(&mut self, distribution: Vec<f64>) {
        drop(distribution);
    }

    /// A short name for ledgers and reports (e.g. `"pmixed"`).
    fn name(&self) -> &'static str;
}
