//! The budget a ledger enforces, and the receipt a charge returns.

use crate::conversion::check_delta;
use crate::{AccountantError, EpsilonDelta};

/// An (ε, δ) privacy budget: charges may spend up to ε at this δ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrivacyBudget {
    epsilon: f64,
    delta: f64,
}

impl PrivacyBudget {
    /// A budget of ε (finite, ≥ 0) at δ ∈ (0, 1).
    pub fn new(epsilon: f64, delta: f64) -> Result<Self, AccountantError> {
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(AccountantError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                reason: "a budget's ε must be finite and ≥ 0",
            });
        }
        check_delta(delta)?;
        Ok(Self { epsilon, delta })
    }

    /// The most ε that may be spent.
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// The δ at which spending is measured.
    pub fn delta(&self) -> f64 {
        self.delta
    }
}

/// Proof that a charge is durably recorded.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Receipt {
    /// The charge's sequence number in the ledger.
    pub sequence: u64,
    /// The total spent including this charge, at the budget's δ (rounded up);
    /// `None` when the ledger has no budget.
    pub spent: Option<EpsilonDelta>,
}
