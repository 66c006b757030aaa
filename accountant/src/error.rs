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
}
