//! SubMix as an [`EnsembleMechanism`] (see [`crate::submix`] for the construction and
//! why it departs from the paper's Alg. 2).

use privmix_accountant::{Orders, RdpCurve};

use crate::pmixed::bounds::{check_enforcement_order, check_radius, pmixed_curve};
use crate::submix::{check_submix_parameters, submix_distribution};
use crate::{
    Account, Diagnostics, Ensemble, EnsembleMechanism, MechanismError, PmixedConfig, PrivacyRng,
    Release, SubmixDistribution,
};

/// SubMix's parameters: k parts, the pair test's order α and bound β (the paper's Eq. 2)
/// and the anchoring constraint's enforcement order α_c and radius b.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubmixConfig {
    parts: usize,
    alpha: f64,
    beta: f64,
    alpha_c: f64,
    radius: f64,
}

impl SubmixConfig {
    /// `parts` ≥ 1, α finite > 1, β finite ≥ 0, α_c finite > 1, b finite ≥ 0.
    pub fn new(
        parts: usize,
        alpha: f64,
        beta: f64,
        alpha_c: f64,
        radius: f64,
    ) -> Result<Self, MechanismError> {
        if parts == 0 {
            return Err(MechanismError::InvalidParameter {
                name: "parts",
                value: 0.0,
                reason: "SubMix needs at least one part",
            });
        }
        check_submix_parameters(alpha, beta)?;
        check_enforcement_order(alpha_c)?;
        check_radius(radius)?;
        Ok(Self {
            parts,
            alpha,
            beta,
            alpha_c,
            radius,
        })
    }

    /// The largest radius b such that `queries` responses compose over `orders` to at
    /// most ε at δ ([`PmixedConfig::calibrate`] for k members without subsampling).
    #[allow(clippy::too_many_arguments)]
    pub fn calibrate(
        epsilon: f64,
        delta: f64,
        queries: u64,
        parts: usize,
        alpha: f64,
        beta: f64,
        alpha_c: f64,
        orders: &Orders,
    ) -> Result<Self, MechanismError> {
        let anchor = PmixedConfig::calibrate(
            epsilon,
            delta,
            queries,
            1.0,
            parts.max(1) as u64,
            alpha_c,
            orders,
        )?;
        Self::new(parts, alpha, beta, alpha_c, anchor.radius())
    }

    /// [`SubmixConfig::calibrate`] for a run after what an account has already spent
    /// (its curve `spent`, whose orders the run is charged at): the radius of
    /// [`PmixedConfig::calibrate_after`] for k members, so that `spent` composed with
    /// `queries` responses converts to at most ε at δ.
    #[allow(clippy::too_many_arguments)]
    pub fn calibrate_after(
        spent: &RdpCurve,
        epsilon: f64,
        delta: f64,
        queries: u64,
        parts: usize,
        alpha: f64,
        beta: f64,
        alpha_c: f64,
    ) -> Result<Self, MechanismError> {
        let anchor = PmixedConfig::calibrate_after(
            spent,
            epsilon,
            delta,
            queries,
            1.0,
            parts.max(1) as u64,
            alpha_c,
        )?;
        Self::new(parts, alpha, beta, alpha_c, anchor.radius())
    }

    /// The number of parts k.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// The pair test's order α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The pair test's bound β.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// The anchoring constraint's enforcement order α_c.
    pub fn alpha_c(&self) -> f64 {
        self.alpha_c
    }

    /// The anchoring radius b.
    pub fn radius(&self) -> f64 {
        self.radius
    }

    /// The per-response charge ([`pmixed_curve`] for k members, q = 1).
    pub fn curve(&self, orders: &Orders) -> Result<RdpCurve, MechanismError> {
        pmixed_curve(orders, self.alpha_c, self.radius, self.parts as u64, 1.0)
    }
}

/// SubMix (see [`crate::submix`]): the ensemble's members `2i` and `2i + 1` are the two
/// halves of part i.
///
/// Guarantee: each response is `(α, ε(α))`-RDP under changed-part adjacency with
/// ε = [`SubmixConfig::curve`], charged to the account before it is released. The
/// charge is data-independent, so the account's budget — not the data — decides when
/// private answers stop; there are no per-part budgets and no STOP.
#[derive(Debug, Clone)]
pub struct SubMix {
    config: SubmixConfig,
    cached: Option<(Orders, RdpCurve)>,
}

impl SubMix {
    /// A mechanism with a validated configuration.
    pub fn new(config: SubmixConfig) -> Self {
        Self {
            config,
            cached: None,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &SubmixConfig {
        &self.config
    }

    /// SubMix's output distribution for this query.
    pub fn distribution(&self, ensemble: &Ensemble) -> Result<SubmixDistribution, MechanismError> {
        if ensemble.len() != 2 * self.config.parts {
            return Err(MechanismError::InvalidParameter {
                name: "members",
                value: ensemble.len() as f64,
                reason: "SubMix needs exactly two members (halves) per part",
            });
        }
        let c = &self.config;
        submix_distribution(ensemble, c.alpha, c.beta, c.alpha_c, c.radius)
    }

    fn charge_curve(&mut self, orders: &Orders) -> Result<RdpCurve, MechanismError> {
        if !matches!(&self.cached, Some((o, _)) if o == orders) {
            self.cached = Some((orders.clone(), self.config.curve(orders)?));
        }
        Ok(self.cached.as_ref().expect("just filled").1.clone())
    }
}

impl EnsembleMechanism for SubMix {
    fn release(
        &mut self,
        ensemble: &Ensemble,
        _rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<Release, MechanismError> {
        let charge = self.charge_curve(account.orders())?;
        let dist = self.distribution(ensemble)?;
        account.charge(&charge, self.name())?;
        Ok(Release {
            distribution: dist.output,
            charge,
            diagnostics: Diagnostics {
                lambdas: dist.lambdas,
                solver_evaluations: dist.solver_evaluations,
                ..Diagnostics::default()
            },
        })
    }

    fn name(&self) -> &'static str {
        "submix"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Unbudgeted;

    #[test]
    fn charges_the_data_independent_curve_and_checks_the_layout() {
        let p0 = [0.5, 0.5];
        let e =
            Ensemble::from_probabilities(&p0, &[0.9, 0.1, 0.8, 0.2, 0.3, 0.7, 0.4, 0.6]).unwrap();
        let orders = Orders::integers(8).unwrap();
        let mut m = SubMix::new(SubmixConfig::new(2, 2.0, 0.5, 8.0, 0.1).unwrap());
        let mut acc = Unbudgeted::new(orders.clone());
        let mut rng = PrivacyRng::from_seed(1);
        let out = m.step(&e, &mut rng, &mut acc).unwrap();
        assert_eq!(out.charge, pmixed_curve(&orders, 8.0, 0.1, 2, 1.0).unwrap());
        let three = Ensemble::from_probabilities(&p0, &[0.9, 0.1, 0.8, 0.2]).unwrap();
        assert!(m.step(&three, &mut rng, &mut acc).is_err());
        assert_eq!(acc.charges(), 1);
        assert!(SubmixConfig::new(0, 2.0, 0.5, 8.0, 0.1).is_err());
    }

    #[test]
    fn calibration_fits_the_budget() {
        let orders = Orders::dp_accounting_default();
        let c = SubmixConfig::calibrate(4.0, 1e-5, 256, 8, 2.0, 0.01, 36.0, &orders).unwrap();
        let spent = c
            .curve(&orders)
            .unwrap()
            .self_compose(256)
            .epsilon(1e-5)
            .unwrap()
            .epsilon;
        assert!(c.radius() > 0.0 && spent <= 4.0, "{spent}");
    }

    #[test]
    fn calibration_after_a_spent_curve_fits_the_composition() {
        let orders = Orders::dp_accounting_default();
        let first = SubmixConfig::calibrate(1.5, 1e-5, 64, 4, 2.0, 0.01, 36.0, &orders).unwrap();
        let spent = first.curve(&orders).unwrap().self_compose(64);
        let c = SubmixConfig::calibrate_after(&spent, 4.0, 1e-5, 64, 4, 2.0, 0.01, 36.0).unwrap();
        let total = |config: &SubmixConfig| {
            spent
                .compose(&config.curve(&orders).unwrap().self_compose(64))
                .unwrap()
                .epsilon(1e-5)
                .unwrap()
                .epsilon
        };
        assert!(c.radius() > 0.0 && total(&c) <= 4.0, "{}", total(&c));
        let larger = SubmixConfig::new(4, 2.0, 0.01, 36.0, c.radius() * (1.0 + 1e-8)).unwrap();
        assert!(total(&larger) > 4.0);
        assert!(SubmixConfig::calibrate_after(&spent, 1.0, 1e-5, 64, 4, 2.0, 0.01, 36.0).is_err());
    }
}
