//! Privacy budgets that refuse a charge before it would overspend.
//!
//! A refused charge is an error and leaves the budget untouched, so the
//! mechanism can stop (answer from the public model) *before* releasing the
//! output that would have overspent — unlike SubMix's reference code, which
//! checks the budget before charging and lets the last query overshoot.

use crate::{AccountantError, EpsilonDelta, Orders, RdpCurve};
use privmix_renyi::round::{add_up, ln_up, mul_up, sub_down, u64_up};

/// Checks a budget value: finite and ≥ 0.
fn check_limit(name: &'static str, value: f64) -> Result<(), AccountantError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name,
            value,
            reason: "a budget must be finite and ≥ 0",
        })
    }
}

/// An (ε, δ)-DP budget tracked as an RDP curve of everything spent so far.
///
/// Guarantee: after any sequence of accepted charges, the composition of the
/// charged curves (Mironov, arXiv:1702.07476, Prop. 1; sums rounded up) converts at δ to an
/// ε (rounded up, see [`RdpCurve::epsilon`]) no larger than the budget's ε.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    epsilon: f64,
    delta: f64,
    spent: RdpCurve,
}

impl Budget {
    /// A fresh budget of (ε, δ) over `orders`. ε finite ≥ 0, δ ∈ (0, 1).
    pub fn new(orders: Orders, epsilon: f64, delta: f64) -> Result<Self, AccountantError> {
        Self::with_spent(RdpCurve::zero(orders), epsilon, delta)
    }

    /// A budget resumed with `spent` already consumed (e.g. replayed from a
    /// ledger). Errors with [`AccountantError::BudgetBelowSpent`] if the spent
    /// curve already exceeds (ε, δ).
    pub fn with_spent(spent: RdpCurve, epsilon: f64, delta: f64) -> Result<Self, AccountantError> {
        check_limit("epsilon", epsilon)?;
        let used = spent.epsilon(delta)?; // also validates δ
        if used.epsilon > epsilon {
            return Err(AccountantError::BudgetBelowSpent {
                limit: epsilon,
                spent: used.epsilon,
            });
        }
        Ok(Self {
            epsilon,
            delta,
            spent,
        })
    }

    /// The ε limit.
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// The δ at which the limit applies.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// Everything charged so far, composed.
    pub fn spent(&self) -> &RdpCurve {
        &self.spent
    }

    /// The ε spent so far at any δ ∈ (0, 1) (not only the budget's own).
    pub fn spent_epsilon(&self, delta: f64) -> Result<EpsilonDelta, AccountantError> {
        self.spent.epsilon(delta)
    }

    /// ε still available at the budget's δ, rounded down (never negative).
    pub fn remaining_epsilon(&self) -> Result<f64, AccountantError> {
        Ok(sub_down(self.epsilon, self.spent.epsilon(self.delta)?.epsilon).max(0.0))
    }

    /// What the spent curve would be after `cost`, and its ε at the budget's δ,
    /// without charging anything.
    pub fn preview(&self, cost: &RdpCurve) -> Result<(RdpCurve, EpsilonDelta), AccountantError> {
        let after = self.spent.compose(cost)?;
        let eps = after.epsilon(self.delta)?;
        Ok((after, eps))
    }

    /// Charges `cost` if the result stays within the budget; otherwise returns
    /// [`AccountantError::BudgetExceeded`] and changes nothing. On success
    /// returns the new spent (ε, δ).
    pub fn try_charge(&mut self, cost: &RdpCurve) -> Result<EpsilonDelta, AccountantError> {
        let (after, eps) = self.preview(cost)?;
        if eps.epsilon > self.epsilon {
            return Err(AccountantError::BudgetExceeded {
                would_spend: eps.epsilon,
                limit: self.epsilon,
                delta: self.delta,
            });
        }
        self.spent = after;
        Ok(eps)
    }
}

/// Per-part budgets for data-dependent accounting at one Rényi order (SubMix:
/// Ginart et al., "SubMix: Practical Private Prediction for Large-Scale
/// Language Models", arXiv:2201.00971, §3, Alg. 2 and Prop. 3.1; also
/// AdaPMixED's data-dependent loss).
///
/// Each of the k parts Πᵢ has its own budget ε at order α; every query charges
/// part i the divergence `Dsym_α(h ‖ h₋ᵢ)` between the output distribution with
/// and without that part. Guarantee (Prop. 3.1, by adaptive composition,
/// Mironov, arXiv:1702.07476, Prop. 1): as long as every accepted charge keeps each part's
/// running sum (rounded up) ≤ ε, the protocol is (α, ε)-ROP. A charge that
/// would push any part over is refused as a whole and changes nothing; the
/// mechanism must then issue STOP and answer from the public model.
#[derive(Debug, Clone, PartialEq)]
pub struct PartBudgets {
    order: f64,
    limit: f64,
    spent: Vec<f64>,
}

impl PartBudgets {
    /// `parts` fresh budgets of `limit` each at `order`.
    pub fn new(order: f64, parts: usize, limit: f64) -> Result<Self, AccountantError> {
        Self::with_spent(order, limit, vec![0.0; parts])
    }

    /// Budgets resumed with per-part `spent` amounts; errors with
    /// [`AccountantError::BudgetBelowSpent`] if any part already exceeds `limit`.
    pub fn with_spent(order: f64, limit: f64, spent: Vec<f64>) -> Result<Self, AccountantError> {
        if !(order.is_finite() && order > 1.0) {
            return Err(AccountantError::InvalidOrder(order));
        }
        check_limit("limit", limit)?;
        if spent.is_empty() {
            return Err(AccountantError::InvalidParameter {
                name: "parts",
                value: 0.0,
                reason: "at least one part is needed",
            });
        }
        for &s in &spent {
            if !(s.is_finite() && s >= 0.0) {
                return Err(AccountantError::InvalidEpsilon { order, value: s });
            }
            if s > limit {
                return Err(AccountantError::BudgetBelowSpent { limit, spent: s });
            }
        }
        Ok(Self {
            order,
            limit,
            spent,
        })
    }

    /// The Rényi order all charges are measured at.
    pub fn order(&self) -> f64 {
        self.order
    }

    /// Each part's budget.
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// What each part has spent.
    pub fn spent(&self) -> &[f64] {
        &self.spent
    }

    /// The largest amount any part has spent: the protocol's RDP at the order.
    pub fn max_spent(&self) -> f64 {
        self.spent.iter().copied().fold(0.0, f64::max)
    }

    /// The (ε, δ) implied by the worst part's spending, at any δ ∈ (0, 1).
    pub fn spent_epsilon(&self, delta: f64) -> Result<EpsilonDelta, AccountantError> {
        RdpCurve::new(Orders::new(vec![self.order])?, vec![self.max_spent()])?.epsilon(delta)
    }

    /// Charges every part its divergence, or refuses the whole charge (no part
    /// changes) with [`AccountantError::PartBudgetExceeded`] naming the first
    /// part that would go over.
    pub fn try_charge(&mut self, charges: &[f64]) -> Result<(), AccountantError> {
        if charges.len() != self.spent.len() {
            return Err(AccountantError::PartCountMismatch {
                parts: self.spent.len(),
                given: charges.len(),
            });
        }
        let mut after = Vec::with_capacity(charges.len());
        for (part, (&s, &c)) in self.spent.iter().zip(charges).enumerate() {
            if c.is_nan() || c < 0.0 {
                return Err(AccountantError::InvalidEpsilon {
                    order: self.order,
                    value: c,
                });
            }
            let would = add_up(s, c);
            if would > self.limit {
                return Err(AccountantError::PartBudgetExceeded {
                    part,
                    would_spend: would,
                    limit: self.limit,
                });
            }
            after.push(would);
        }
        self.spent = after;
        Ok(())
    }
}

/// SubMix's random-stopping conversion (arXiv:2201.00971, App. C, Prop. C.3(1)): a
/// (B, C)-random-stopping wrapper turns an (α, ε)-ROP protocol into an
/// (α, ε + ln(C·B), B)-RDP one. Returns `ε + ln(C·B)` rounded up; C > ½, B ≥ 1.
pub fn random_stopping_epsilon(
    rop_epsilon: f64,
    responses: u64,
    expansion: f64,
) -> Result<f64, AccountantError> {
    check_limit("rop_epsilon", rop_epsilon)?;
    if !(expansion.is_finite() && expansion > 0.5) {
        return Err(AccountantError::InvalidParameter {
            name: "expansion",
            value: expansion,
            reason: "the expansion factor C must be finite and > 1/2",
        });
    }
    if responses == 0 {
        return Err(AccountantError::InvalidParameter {
            name: "responses",
            value: 0.0,
            reason: "the response budget B must be at least 1",
        });
    }
    Ok(add_up(
        rop_epsilon,
        ln_up(mul_up(expansion, u64_up(responses))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussian_step() -> RdpCurve {
        RdpCurve::from_fn(Orders::default(), |a| a / 200.0).unwrap()
    }

    #[test]
    fn a_refused_charge_changes_nothing() {
        let mut b = Budget::new(Orders::default(), 1.0, 1e-5).unwrap();
        let mut accepted = 0;
        loop {
            let before = b.clone();
            match b.try_charge(&gaussian_step()) {
                Ok(e) => {
                    accepted += 1;
                    assert!(e.epsilon <= 1.0);
                }
                Err(AccountantError::BudgetExceeded {
                    would_spend, limit, ..
                }) => {
                    assert!(would_spend > limit);
                    assert_eq!(b, before);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(accepted > 0);
        assert!(b.spent_epsilon(1e-5).unwrap().epsilon <= 1.0);
        assert!(b.remaining_epsilon().unwrap() >= 0.0);
        // Spent ε at other δ is available at any time.
        assert!(b.spent_epsilon(1e-3).unwrap().epsilon < b.spent_epsilon(1e-9).unwrap().epsilon);
    }

    #[test]
    fn bad_budgets_are_typed_errors() {
        let o = Orders::default();
        assert!(Budget::new(o.clone(), f64::NAN, 1e-5).is_err());
        assert!(Budget::new(o.clone(), -1.0, 1e-5).is_err());
        assert!(Budget::new(o.clone(), f64::INFINITY, 1e-5).is_err());
        assert!(Budget::new(o.clone(), 1.0, 0.0).is_err());
        assert!(Budget::new(o.clone(), 1.0, 1.0).is_err());
        let spent = gaussian_step().self_compose(1000);
        assert!(matches!(
            Budget::with_spent(spent, 1.0, 1e-5),
            Err(AccountantError::BudgetBelowSpent { .. })
        ));
        assert!(PartBudgets::new(1.0, 4, 1.0).is_err());
        assert!(PartBudgets::new(2.0, 0, 1.0).is_err());
        assert!(PartBudgets::new(2.0, 4, -1.0).is_err());
        assert!(matches!(
            PartBudgets::with_spent(2.0, 1.0, vec![0.5, 1.5]),
            Err(AccountantError::BudgetBelowSpent { .. })
        ));
    }

    #[test]
    fn part_budgets_refuse_the_charge_that_would_overspend() {
        let mut p = PartBudgets::new(2.0, 3, 1.0).unwrap();
        p.try_charge(&[0.4, 0.1, 0.0]).unwrap();
        p.try_charge(&[0.4, 0.1, 0.0]).unwrap();
        let before = p.clone();
        let err = p.try_charge(&[0.1, 0.9, 0.0]).unwrap_err();
        assert!(matches!(
            err,
            AccountantError::PartBudgetExceeded { part: 1, .. }
        ));
        assert_eq!(p, before);
        assert!(p.try_charge(&[0.1, 0.1]).is_err());
        assert!(p.try_charge(&[f64::NAN, 0.0, 0.0]).is_err());
        assert!((p.max_spent() - 0.8).abs() < 1e-15);
        let e = p.spent_epsilon(1e-5).unwrap();
        assert_eq!(e.order, 2.0);
    }

    #[test]
    fn random_stopping_adds_log_cb() {
        // The paper's example: ε = 2, B = 1000, C = 10 gives 2 + ln(10⁴) ≈ 11.21.
        let e = random_stopping_epsilon(2.0, 1000, 10.0).unwrap();
        assert!(e >= 2.0 + 1e4f64.ln() && e < 11.22);
        assert!(random_stopping_epsilon(2.0, 1000, 0.5).is_err());
        assert!(random_stopping_epsilon(2.0, 0, 1.0).is_err());
    }
}
