//! DPS-MOZO's per-token cost as the paper states it.
//!
//! Flemings, Gan, Li, Razaviyayn, Annavaram, "Differentially Private
//! In-context Learning via Sampling Few-shot Mixed with Zero-shot Outputs",
//! arXiv:2501.19287, App. B, Thm B.3.

use crate::event::check::check_non_negative;
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::mul_up;

/// DPS-MOZO's per-token cost (arXiv:2501.19287, App. B, Thm B.3): with every one-shot
/// mixture kept within `Dsym_α ≤ β·α` of the zero-shot distribution, each
/// generated token is `(α, 4βα)`-RDP.
///
/// Guarantee: `ε(α) = 4βα`, rounded up, at every order — which presumes the
/// mechanism enforces the β·α constraint at every order it is accounted at
/// (a constraint enforced at one α does not bound the divergence at the
/// others). β ≥ 0.
///
/// **Caution — the paper's bound, not a proven one.** Thm B.3's proof applies the
/// additivity of Rényi divergence for *product measures* (van Erven & Harremoës,
/// Thm 28) to the *normalised pointwise product* of next-token distributions over
/// one vocabulary, which is not a product measure; renormalisation acts like
/// conditioning and can exceed 4βα (privmix-mechanisms keeps counterexamples in
/// `tests/integration/dps_mozo_paper_bound.rs`, 42× over at α = 2). privmix's DPS-MOZO
/// mechanism therefore enforces a max-divergence constraint and charges its own
/// proven per-token bound (`privmix_mechanisms::dps_mozo`); this function stays
/// for comparison with the paper's reported figures.
pub fn dps_mozo_token(orders: &Orders, beta: f64) -> Result<RdpCurve, AccountantError> {
    check_non_negative("beta", beta)?;
    let four_beta = mul_up(4.0, beta);
    RdpCurve::from_fn(orders.clone(), |a| mul_up(four_beta, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orders() -> Orders {
        Orders::new(vec![1.5, 2.0, 18.0, 64.0]).unwrap()
    }

    #[test]
    fn dps_mozo_token_is_four_beta_alpha() {
        let c = dps_mozo_token(&orders(), 0.25).unwrap();
        assert_eq!(c.epsilons(), &[1.5, 2.0, 18.0, 64.0]);
        assert!(dps_mozo_token(&orders(), -0.1).is_err());
    }
}
