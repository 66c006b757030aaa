//! The SubMix prediction protocol (submix.txt Alg. 2, Prop. 3.1): per-part budgets,
//! STOP, and optional random stopping (App. C.4, Prop. C.3).

use privmix_accountant::{AccountantError, PartBudgets, RdpCurve, random_stopping_epsilon};
use privmix_renyi::Order;
use rand::Rng;

use crate::submix::{check_submix_parameters, submix_distribution};
use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, PublicReason,
    Release, SubmixDistribution,
};

/// The (B, C)-random-stopping wrapper of submix.txt App. C.4: τ is drawn uniformly from
/// {1, …, C·B} once, and STOP is issued before the τ-th response if it has not been
/// issued already.
///
/// Guarantee (Prop. C.3(1)): wrapping an (α, ε)-ROP protocol gives an
/// (α, ε + log(C·B), B)-RDP protocol — a guarantee for a *fixed* number B of responses
/// rather than the variable length of ROP; the extra log(C·B) pays for what the
/// stopping time reveals (`Pr[RS = t] ≥ 1/(C·B)` for every t ≤ B). privmix also answers
/// every response after the B-th from the public model, so the whole interaction is
/// covered by the B-response guarantee.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomStopping {
    responses: u64,
    expansion: f64,
    stop_before: u64,
}

impl RandomStopping {
    /// Draws τ for a response budget B = `responses` ≥ 1 and expansion factor C =
    /// `expansion` > ½ (Prop. C.3's parameters); C·B must be an integer (the range of τ).
    pub fn new(
        responses: u64,
        expansion: f64,
        rng: &mut PrivacyRng,
    ) -> Result<Self, MechanismError> {
        if responses == 0 {
            return Err(MechanismError::InvalidParameter {
                name: "responses",
                value: 0.0,
                reason: "the response budget B must be at least 1",
            });
        }
        if !(expansion.is_finite() && expansion > 0.5) {
            return Err(MechanismError::InvalidParameter {
                name: "expansion",
                value: expansion,
                reason: "the expansion factor C must be finite and > 1/2",
            });
        }
        let horizon = expansion * responses as f64;
        if !(horizon.fract() == 0.0 && horizon >= 1.0 && horizon <= 2f64.powi(53)) {
            return Err(MechanismError::InvalidParameter {
                name: "expansion",
                value: expansion,
                reason: "C·B must be an integer (τ is uniform on {1, …, C·B})",
            });
        }
        let stop_before = rng.random_range(1..=horizon as u64);
        Ok(Self {
            responses,
            expansion,
            stop_before,
        })
    }

    /// The response budget B.
    pub fn responses(&self) -> u64 {
        self.responses
    }

    /// The expansion factor C.
    pub fn expansion(&self) -> f64 {
        self.expansion
    }

    /// τ: STOP is issued before the τ-th response (1-based).
    pub fn stop_before(&self) -> u64 {
        self.stop_before
    }

    /// `ε + log(C·B)` rounded up: the fixed-length RDP of an (α, ε)-ROP protocol under
    /// this wrapper (Prop. C.3(1), [`privmix_accountant::random_stopping_epsilon`]).
    pub fn epsilon(&self, rop_epsilon: f64) -> Result<f64, MechanismError> {
        Ok(random_stopping_epsilon(
            rop_epsilon,
            self.responses,
            self.expansion,
        )?)
    }
}

/// SubMix (submix.txt Alg. 2) as an [`EnsembleMechanism`]: the ensemble's members `2i`
/// and `2i + 1` are the two halves of part i.
///
/// Guarantee: (α, ε)-ROP for the partition (Def. 2.4, Prop. 3.1), ε = `part_budget`, at
/// the order α of the constructor: every part has a budget ε at α; a response sampled
/// from `h` charges each part i `Dsym_α(h, h₋ᵢ)` (rounded up, see
/// [`SubmixDistribution::part_losses`]), and by adaptive composition (Mironov 2017,
/// Prop. 1) the whole interaction costs each part at most ε. The budgets are checked
/// *before* charging: a response whose charge would take any part over its budget is not
/// sampled from `h`; STOP is issued instead and that response and every later one come
/// from the public model (free: `p₀` is not a function of the corpus). (The reference
/// code checks after charging, so its last query overshoots.) With [`RandomStopping`]
/// the guarantee becomes the fixed-length one of Prop. C.3.
///
/// The [`Account`] is charged, per response, [`SubmixDistribution::charge_curve`] at the
/// account's orders: the maximum over parts of the same divergence at every order — a
/// data-dependent charge, valid for a user in any one part (zero after STOP).
#[derive(Debug, Clone)]
pub struct SubMix {
    order: Order,
    beta: f64,
    budgets: PartBudgets,
    stopped: bool,
    responses: u64,
    stopping: Option<RandomStopping>,
}

impl SubMix {
    /// `parts` ≥ 1 parts, Rényi order `alpha` (finite, > 1) of Eq. 2 and of the budgets,
    /// target leakage `beta` ≥ 0 (finite) and per-part budget `part_budget` ≥ 0 (finite).
    pub fn new(
        parts: usize,
        alpha: f64,
        beta: f64,
        part_budget: f64,
    ) -> Result<Self, MechanismError> {
        let order = check_submix_parameters(alpha, beta)?;
        let budgets = PartBudgets::new(alpha, parts, part_budget)?;
        Ok(Self {
            order,
            beta,
            budgets,
            stopped: false,
            responses: 0,
            stopping: None,
        })
    }

    /// The paper's heuristic (§4): α = 2 and β = ε/B for a per-part budget ε over an
    /// expected B responses (k = 8–16 parts in the paper).
    pub fn paper_heuristic(
        parts: usize,
        part_budget: f64,
        responses: u64,
    ) -> Result<Self, MechanismError> {
        if responses == 0 {
            return Err(MechanismError::InvalidParameter {
                name: "responses",
                value: 0.0,
                reason: "the expected number of responses B must be at least 1",
            });
        }
        Self::new(parts, 2.0, part_budget / responses as f64, part_budget)
    }

    /// Wraps the protocol with (B, C)-random stopping.
    pub fn with_random_stopping(mut self, stopping: RandomStopping) -> Self {
        self.stopping = Some(stopping);
        self
    }

    /// The order α of the constraint and the budgets.
    pub fn order(&self) -> f64 {
        self.order.value()
    }

    /// The target leakage β of Eq. 2.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// The per-part budgets and what each part has spent.
    pub fn budgets(&self) -> &PartBudgets {
        &self.budgets
    }

    /// Whether STOP has been issued (every later response comes from `p₀`).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Responses made so far (private and public).
    pub fn responses(&self) -> u64 {
        self.responses
    }

    /// The random-stopping wrapper, if any.
    pub fn random_stopping(&self) -> Option<&RandomStopping> {
        self.stopping.as_ref()
    }

    /// The ROP guarantee ε at [`SubMix::order`]: the per-part budget. (The amount actually
    /// spent, [`PartBudgets::max_spent`], is data-dependent and itself sensitive.)
    pub fn rop_epsilon(&self) -> f64 {
        self.budgets.limit()
    }

    /// With random stopping, the fixed-length RDP ε + log(C·B) at [`SubMix::order`] for
    /// B responses (Prop. C.3(1)); `None` without it.
    pub fn fixed_length_epsilon(&self) -> Option<Result<f64, MechanismError>> {
        self.stopping
            .as_ref()
            .map(|s| s.epsilon(self.rop_epsilon()))
    }

    /// SubMix's output distribution for this query (before any budget decision), with its
    /// leave-one-part-out neighbours (see [`submix_distribution`]).
    pub fn distribution(&self, ensemble: &Ensemble) -> Result<SubmixDistribution, MechanismError> {
        let parts = self.budgets.spent().len();
        if ensemble.len() != 2 * parts {
            return Err(MechanismError::InvalidParameter {
                name: "members",
                value: ensemble.len() as f64,
                reason: "SubMix needs exactly two members (halves) per part",
            });
        }
        submix_distribution(ensemble, self.order.value(), self.beta)
    }

    /// Answers from the public model: charges nothing (a zero curve) and releases `p₀`.
    fn public_answer(
        &mut self,
        ensemble: &Ensemble,
        account: &mut dyn Account,
        diagnostics: Diagnostics,
    ) -> Result<Release, MechanismError> {
        let charge = RdpCurve::zero(account.orders().clone());
        account.charge(&charge, "submix-public")?;
        self.responses += 1;
        Ok(Release {
            distribution: ensemble.public().to_vec(),
            charge,
            diagnostics: Diagnostics {
                public_reason: Some(PublicReason::Stopped),
                ..diagnostics
            },
        })
    }
}

impl EnsembleMechanism for SubMix {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        _rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let next = self.responses + 1;
        if let Some(s) = &self.stopping
            && (next == s.stop_before || next > s.responses)
        {
            self.stopped = true;
        }
        if self.stopped {
            return self.public_answer(ensemble, account, Diagnostics::default());
        }
        let dist = self.distribution(ensemble)?;
        let losses = dist.part_losses(self.order)?;
        let loss = losses.iter().copied().fold(0.0, f64::max);
        let diagnostics = Diagnostics {
            lambdas: dist.lambdas.clone(),
            drawn: Vec::new(),
            public_reason: None,
            data_dependent_loss: Some(loss),
            solver_evaluations: dist.solver_evaluations,
        };
        // Check before charging: a charge that would overshoot any part issues STOP.
        let mut after = self.budgets.clone();
        match after.try_charge(&losses) {
            Ok(()) => {}
            Err(AccountantError::PartBudgetExceeded { .. }) => {
                self.stopped = true;
                return self.public_answer(ensemble, account, diagnostics);
            }
            Err(e) => return Err(e.into()),
        }
        let charge = dist.charge_curve(account.orders())?;
        account.charge(&charge, "submix")?;
        self.budgets = after;
        self.responses += 1;
        Ok(Release {
            distribution: dist.output,
            charge,
            diagnostics,
        })
    }

    fn name(&self) -> &'static str {
        "submix"
    }
}
