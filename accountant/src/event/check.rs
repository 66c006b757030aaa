//! Parameter checks shared by the events (a leaf: it imports no event).

use crate::AccountantError;

/// Checks a finite, non-negative parameter.
pub(crate) fn check_non_negative(name: &'static str, value: f64) -> Result<(), AccountantError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            name,
            value,
            reason: "must be finite and ≥ 0",
        })
    }
}
