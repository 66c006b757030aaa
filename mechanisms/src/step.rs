//! What one mechanism step returns, and the trait ensemble mechanisms implement.

use privmix_accountant::RdpCurve;

use crate::{Account, Ensemble, MechanismError, PrivacyRng};

/// Why a step answered from the public distribution alone, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublicReason {
    /// Poisson subsampling drew no member (PMixED).
    NoMemberDrawn,
    /// Noisy screening judged the query answerable from the public model (AdaPMixED).
    Screened,
    /// A per-part budget ran out and the protocol issued STOP (SubMix).
    Stopped,
    /// The mechanism is the public-only baseline.
    PublicOnly,
}

/// Diagnostics of one step: what the mechanism decided, for reports and plots.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diagnostics {
    /// The λ of each member, part or demonstration mixed in this step, in order.
    pub lambdas: Vec<f64>,
    /// Members (or parts, or demonstrations) drawn by subsampling, if any.
    pub drawn: Vec<usize>,
    /// Set when the step answered from the public distribution alone.
    pub public_reason: Option<PublicReason>,
    /// The data-dependent loss at the mechanism's main order, where computed.
    pub data_dependent_loss: Option<f64>,
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

/// A mechanism over an ensemble of next-token distributions (PMixED, AdaPMixED,
/// SubMix and the ensemble baselines).
///
/// Contract of [`EnsembleMechanism::step`]: the charge is accepted by `account`
/// (for a ledger: synced to disk) *before* the token is drawn; if the account
/// refuses, the step returns [`MechanismError::ChargeRefused`] and nothing is
/// released.
pub trait EnsembleMechanism {
    /// One step: compute the output distribution and its charge, charge the
    /// account, then sample.
    fn step(
        &mut self,
        ensemble: &Ensemble,
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError>;

    /// A short name for ledgers and reports (e.g. `"pmixed"`).
    fn name(&self) -> &'static str;
}
