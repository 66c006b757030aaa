//! Rényi orders.

use crate::{RenyiError, Result};

/// A Rényi order: a finite `α > 1`, or `+∞` (the max divergence).
///
/// Orders `α ≤ 1` are rejected: order 1 (KL) has its own entry points
/// ([`crate::kl_divergence`], [`crate::kl_divergence_log`]), and orders below 1 are not
/// used by Rényi differential privacy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Order {
    /// A finite order `α > 1`.
    Finite(f64),
    /// The order `α = +∞`: `D_∞(p‖q) = log max_x p_x / q_x` over the support of `p`.
    Infinite,
}

impl Order {
    /// Validates an order: `α > 1` finite gives [`Order::Finite`], `+∞` gives
    /// [`Order::Infinite`]; anything else (≤ 1, NaN, −∞) is [`RenyiError::InvalidOrder`].
    pub fn new(alpha: f64) -> Result<Order> {
        if alpha == f64::INFINITY {
            Ok(Order::Infinite)
        } else if alpha.is_finite() && alpha > 1.0 {
            Ok(Order::Finite(alpha))
        } else {
            Err(RenyiError::InvalidOrder(alpha))
        }
    }

    /// The order α (`f64::INFINITY` for [`Order::Infinite`]).
    pub fn value(self) -> f64 {
        match self {
            Order::Finite(alpha) => alpha,
            Order::Infinite => f64::INFINITY,
        }
    }

    /// `Some(k)` when α is an integer that fits in a `u32`: such orders take the kernels'
    /// fast path, which raises ratios to the power `k − 1` by repeated multiplication
    /// instead of calling `exp`/`log` for every element.
    pub fn integer(self) -> Option<u32> {
        match self {
            Order::Finite(alpha) if alpha.fract() == 0.0 && alpha <= u32::MAX as f64 => {
                Some(alpha as u32)
            }
            _ => None,
        }
    }

    /// Checks a value that was built directly as `Order::Finite(α)` (bypassing
    /// [`Order::new`]): every entry point calls this once.
    pub(crate) fn checked(self) -> Result<Order> {
        match self {
            Order::Finite(alpha) => Order::new(alpha),
            Order::Infinite => Ok(Order::Infinite),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_orders_above_one_and_infinity() {
        assert_eq!(Order::new(1.5), Ok(Order::Finite(1.5)));
        assert_eq!(Order::new(f64::INFINITY), Ok(Order::Infinite));
        assert_eq!(Order::new(1e6).map(Order::value), Ok(1e6));
        assert_eq!(Order::Infinite.value(), f64::INFINITY);
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [1.0, 0.5, 0.0, -3.0, f64::NEG_INFINITY] {
            assert_eq!(Order::new(bad), Err(RenyiError::InvalidOrder(bad)));
        }
        assert!(matches!(Order::new(f64::NAN), Err(RenyiError::InvalidOrder(v)) if v.is_nan()));
        assert!(Order::Finite(0.9).checked().is_err());
    }

    #[test]
    fn integer_detection() {
        assert_eq!(Order::new(18.0).unwrap().integer(), Some(18));
        assert_eq!(Order::new(2.0).unwrap().integer(), Some(2));
        assert_eq!(Order::new(18.5).unwrap().integer(), None);
        assert_eq!(Order::new(1e10).unwrap().integer(), None);
        assert_eq!(Order::Infinite.integer(), None);
    }
}
