//! The one error type of the accountant: every fallible step names its problem.

use thiserror::Error;

/// What went wrong in an accounting step.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum AccountantError {
    /// An RDP order must be a finite number greater than 1 (or +∞ where allowed).
    #[error("Rényi order {0} is invalid: orders must be greater than 1")]
    InvalidOrder(f64),
    /// An order set must hold at least one order.
    #[error("the set of Rényi orders is empty")]
    EmptyOrders,
    /// Curve values must be non-negative numbers (+∞ allowed), never NaN.
    #[error("RDP value {value} at order {order} is invalid: must be ≥ 0 and not NaN")]
    InvalidEpsilon {
        /// The order at which the bad value sits.
        order: f64,
        /// The bad value.
        value: f64,
    },
    /// A curve's value count must equal its order count.
    #[error("{values} RDP values given for {orders} orders")]
    LengthMismatch {
        /// Number of orders.
        orders: usize,
        /// Number of values.
        values: usize,
    },
    /// Two curves over different order sets cannot be composed.
    #[error("cannot combine RDP curves over different sets of orders")]
    OrdersDiffer,
    /// A parameter is outside its domain; the message names it.
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name, e.g. `delta`, `sigma`, `q`.
        name: &'static str,
        /// The offending value.
        value: f64,
        /// What the domain is.
        reason: &'static str,
    },
    /// A charge was refused because it would take the spent privacy past the budget.
    /// Nothing was recorded.
    #[error(
        "charge refused: spending would reach ε = {would_spend} at δ = {delta}, over the budget ε = {limit}"
    )]
    BudgetExceeded {
        /// ε (at `delta`) that the budget would have spent with the charge, rounded up.
        would_spend: f64,
        /// The budget's ε limit.
        limit: f64,
        /// The δ at which ε is measured (0 for a pure RDP budget at one order).
        delta: f64,
    },
    /// A per-part (SubMix) charge was refused: that part's budget would be exceeded.
    #[error("charge refused: part {part} would spend {would_spend}, over its budget {limit}")]
    PartBudgetExceeded {
        /// Index of the first part whose budget would be exceeded.
        part: usize,
        /// What that part would have spent with the charge (RDP at the budget's order).
        would_spend: f64,
        /// That part's budget.
        limit: f64,
    },
    /// A budget was created below what has already been spent.
    #[error("budget ε = {limit} is below the ε = {spent} already spent")]
    BudgetBelowSpent {
        /// The requested budget.
        limit: f64,
        /// What is already spent, rounded up.
        spent: f64,
    },
    /// A curve was asked for an order it does not hold.
    #[error("the curve holds no value at order {0}")]
    MissingOrder(f64),
    /// A per-part charge listed the wrong number of parts.
    #[error("{given} per-part values given for {parts} parts")]
    PartCountMismatch {
        /// Number of parts in the budget.
        parts: usize,
        /// Number of values given.
        given: usize,
    },
    /// A calibration found no feasible value in its search range.
    #[error("no feasible {name} in [{lo}, {hi}]: {reason}")]
    Infeasible {
        /// The parameter calibrated (`beta`, `sigma`).
        name: &'static str,
        /// Lower end of the range searched.
        lo: f64,
        /// Upper end of the range searched.
        hi: f64,
        /// Why.
        reason: &'static str,
    },
    /// An event combination with no bound this crate can prove (e.g. a
    /// sampling theorem applied to a bound under another adjacency).
    #[error("cannot account event {event}: {reason}")]
    UnsupportedEvent {
        /// The event's name (see `DpEvent::name`).
        event: &'static str,
        /// Why.
        reason: &'static str,
    },
}
