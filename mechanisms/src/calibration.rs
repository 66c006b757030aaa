//! One calibration for every data-independent mixing mechanism: a run's budget
//! (ε, δ, the queries it must cover, and what the account has already spent)
//! and the rules that turn it into PMixED's, AdaPMixED's and SubMix's
//! parameters. The CLI's `generate`/`serve` and the benchmark's contenders
//! both calibrate through [`RunBudget`], so a rule changed here changes both.
//!
//! Guarantee: each method returns parameters whose run, composed after the
//! spent curve (RDP adds order by order: Mironov, "Rényi Differential
//! Privacy", arXiv:1702.07476, Prop. 1), converts to at most ε at δ with the
//! accountant's rounded-up arithmetic, as the calibration it calls states
//! ([`PmixedConfig::calibrate`], [`AdapmixedConfig::with_calibrated_filter`],
//! [`SubmixConfig::calibrate`] and their `_after` forms).

use privmix_accountant::{Orders, RdpCurve};

use crate::{AdapmixedConfig, MechanismError, PmixedConfig, SubmixConfig};

/// The budget a run is calibrated to.
#[derive(Debug, Clone, Copy)]
pub struct RunBudget<'a> {
    /// Budget ε (finite, > 0).
    pub epsilon: f64,
    /// Budget δ, in (0, 1).
    pub delta: f64,
    /// Queries (tokens) the run must cover (≥ 1).
    pub queries: u64,
    /// What the account has already spent; the run is charged at its orders.
    /// `None`: nothing spent, and the run is charged at `orders`.
    pub spent: Option<&'a RdpCurve>,
    /// The orders the run is charged at when nothing is spent.
    pub orders: &'a Orders,
}

impl RunBudget<'_> {
    /// PMixED with `members` models sampled at rate `q` and enforcement order
    /// `alpha_c`: the largest radius whose `queries` queries fit the budget.
    pub fn pmixed(
        &self,
        members: usize,
        q: f64,
        alpha_c: f64,
    ) -> Result<PmixedConfig, MechanismError> {
        let n = members as u64;
        match self.spent {
            Some(spent) => PmixedConfig::calibrate_after(
                spent,
                self.epsilon,
                self.delta,
                self.queries,
                q,
                n,
                alpha_c,
            ),
            None => PmixedConfig::calibrate(
                self.epsilon,
                self.delta,
                self.queries,
                q,
                n,
                alpha_c,
                self.orders,
            ),
        }
    }

    /// AdaPMixED from `config` (its screening settings and α_c): the radius is
    /// `radius`, else PMixED's for the same budget and queries without
    /// subsampling (so that `queries` worst-case queries fit; members nearer
    /// p₀ spend less and answer longer; the paper's 3.6 spends a member's whole
    /// filter in one query), and the member filter is calibrated so that the
    /// whole run, however many queries it answers, fits the budget.
    pub fn adapmixed(
        &self,
        members: usize,
        config: AdapmixedConfig,
        radius: Option<f64>,
    ) -> Result<AdapmixedConfig, MechanismError> {
        let radius = match radius {
            Some(r) => r,
            None => self.pmixed(members, 1.0, config.alpha_c)?.radius(),
        };
        let config = AdapmixedConfig { radius, ..config };
        match self.spent {
            Some(spent) => {
                config.with_calibrated_filter_after(spent, self.epsilon, self.delta, members)
            }
            None => config.with_calibrated_filter(self.epsilon, self.delta, members, self.orders),
        }
    }

    /// SubMix's pair-test β: `beta`, else ε spread evenly over the queries.
    pub fn submix_beta(&self, beta: Option<f64>) -> f64 {
        beta.unwrap_or(self.epsilon / self.queries.max(1) as f64)
    }

    /// SubMix over `members / 2` parts (members 2k and 2k + 1 are part k's
    /// halves), pair test at order `alpha` with β [`Self::submix_beta`], its
    /// radius PMixED's for k members at enforcement order `alpha_c`.
    pub fn submix(
        &self,
        members: usize,
        alpha: f64,
        beta: Option<f64>,
        alpha_c: f64,
    ) -> Result<SubmixConfig, MechanismError> {
        let parts = members / 2;
        // SubmixConfig::calibrate{,_after}'s anchor: PMixED's radius for the parts.
        let anchor = self.pmixed(parts.max(1), 1.0, alpha_c)?;
        SubmixConfig::new(
            parts,
            alpha,
            self.submix_beta(beta),
            alpha_c,
            anchor.radius(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget with nothing spent gives the plain calibrations; with a
    /// spent curve, the `_after` ones, and a smaller radius (less is left).
    #[test]
    fn the_spent_curve_selects_the_after_calibration() {
        let orders = Orders::dp_accounting_default();
        let fresh = RunBudget {
            epsilon: 4.0,
            delta: 1e-5,
            queries: 64,
            spent: None,
            orders: &orders,
        };
        let p = fresh.pmixed(8, 1.0, 18.0).unwrap();
        let direct = PmixedConfig::calibrate(4.0, 1e-5, 64, 1.0, 8, 18.0, &orders).unwrap();
        assert_eq!(p.radius(), direct.radius());
        let spent = p.curve(&orders, 8).unwrap().self_compose(16);
        let after = RunBudget {
            spent: Some(&spent),
            ..fresh
        };
        let q = after.pmixed(8, 1.0, 18.0).unwrap();
        let direct_after =
            PmixedConfig::calibrate_after(&spent, 4.0, 1e-5, 64, 1.0, 8, 18.0).unwrap();
        assert_eq!(q.radius(), direct_after.radius());
        assert!(q.radius() < p.radius());
        // SubMix: 8 members are 4 parts, β = ε / queries unless given.
        let s = fresh.submix(8, 2.0, None, 18.0).unwrap();
        assert_eq!(s.parts(), 4);
        assert_eq!(fresh.submix_beta(None), 4.0 / 64.0);
        assert_eq!(fresh.submix_beta(Some(0.5)), 0.5);
        let direct =
            SubmixConfig::calibrate(4.0, 1e-5, 64, 4, 2.0, 4.0 / 64.0, 18.0, &orders).unwrap();
        assert_eq!(s.radius(), direct.radius());
        let s_after = after.submix(8, 2.0, None, 18.0).unwrap();
        let direct_after =
            SubmixConfig::calibrate_after(&spent, 4.0, 1e-5, 64, 4, 2.0, 4.0 / 64.0, 18.0).unwrap();
        assert_eq!(s_after.radius(), direct_after.radius());
        assert!(s_after.radius() < s.radius());
        // AdaPMixED: PMixED's radius without subsampling, then its filter.
        let a = fresh
            .adapmixed(8, AdapmixedConfig::default(), None)
            .unwrap();
        let unsampled = fresh
            .pmixed(8, 1.0, AdapmixedConfig::default().alpha_c)
            .unwrap();
        assert_eq!(a.radius, unsampled.radius());
        assert!(a.filter_budget.is_some());
        let given = fresh
            .adapmixed(8, AdapmixedConfig::default(), Some(0.01))
            .unwrap();
        assert_eq!(given.radius, 0.01);
        // Bad budgets are the calibrations' errors.
        assert!(
            RunBudget {
                epsilon: -1.0,
                ..fresh
            }
            .pmixed(8, 1.0, 18.0)
            .is_err()
        );
    }
}
