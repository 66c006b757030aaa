//! RDP curves over a fixed set of orders.

use std::sync::Arc;

use crate::AccountantError;
use privmix_renyi::round::{add_up, mul_up, u64_up};

/// A sorted, duplicate-free set of Rényi orders α > 1 (finite).
///
/// Cloning is cheap (the list is shared), so every curve can carry its orders
/// and composition can check that two curves were measured at the same ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Orders(Arc<[f64]>);

impl Orders {
    /// An order set from any list: sorted and deduplicated. Every order must be
    /// finite and greater than 1.
    pub fn new(mut orders: Vec<f64>) -> Result<Self, AccountantError> {
        if orders.is_empty() {
            return Err(AccountantError::EmptyOrders);
        }
        if let Some(&bad) = orders.iter().find(|a| !(a.is_finite() && **a > 1.0)) {
            return Err(AccountantError::InvalidOrder(bad));
        }
        orders.sort_by(f64::total_cmp);
        orders.dedup();
        Ok(Self(orders.into()))
    }

    /// dp_accounting's default orders: `1 + x/10` for x in 1..=99, the integers
    /// 11..=63, and 128, 256, 512, 1024 (`rdp_privacy_accountant.py`).
    pub fn dp_accounting_default() -> Self {
        let mut v: Vec<f64> = (1..100).map(|x| 1.0 + f64::from(x) / 10.0).collect();
        v.extend((11..64).map(f64::from));
        v.extend([128.0, 256.0, 512.0, 1024.0]);
        Self::new(v).expect("the default orders are valid")
    }

    /// The integer orders 2..=max, the set on which subsampling bounds are tight.
    pub fn integers(max: u32) -> Result<Self, AccountantError> {
        if max < 2 {
            return Err(AccountantError::EmptyOrders);
        }
        Self::new((2..=max).map(f64::from).collect())
    }

    /// The orders, ascending.
    pub fn as_slice(&self) -> &[f64] {
        &self.0
    }

    /// How many orders there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: an order set is never empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Default for Orders {
    fn default() -> Self {
        Self::dp_accounting_default()
    }
}

/// An RDP guarantee: at each order α of `orders`, the mechanism is (α, ε(α))-RDP.
///
/// Values are non-negative and may be +∞ (no guarantee at that order); NaN is
/// rejected at construction so it can never reach a reported ε.
#[derive(Debug, Clone, PartialEq)]
pub struct RdpCurve {
    orders: Orders,
    epsilons: Vec<f64>,
}

impl RdpCurve {
    /// A curve from one value per order.
    pub fn new(orders: Orders, epsilons: Vec<f64>) -> Result<Self, AccountantError> {
        if epsilons.len() != orders.len() {
            return Err(AccountantError::LengthMismatch {
                orders: orders.len(),
                values: epsilons.len(),
            });
        }
        for (&order, &value) in orders.as_slice().iter().zip(&epsilons) {
            if value.is_nan() || value < 0.0 {
                return Err(AccountantError::InvalidEpsilon { order, value });
            }
        }
        Ok(Self { orders, epsilons })
    }

    /// The curve of a mechanism that reveals nothing: ε(α) = 0 everywhere.
    pub fn zero(orders: Orders) -> Self {
        let epsilons = vec![0.0; orders.len()];
        Self { orders, epsilons }
    }

    /// A curve from a function of the order (an analytic bound).
    pub fn from_fn(orders: Orders, f: impl FnMut(f64) -> f64) -> Result<Self, AccountantError> {
        let epsilons = orders.as_slice().iter().copied().map(f).collect();
        Self::new(orders, epsilons)
    }

    /// A curve at a single order: a measured (data-dependent) charge such as
    /// AdaPMixED's `max_i Dsym_α(p ‖ p₋ᵢ)` or SubMix's per-query divergence.
    pub fn single(order: f64, epsilon: f64) -> Result<Self, AccountantError> {
        Self::new(Orders::new(vec![order])?, vec![epsilon])
    }

    /// ε at one of the curve's orders.
    pub fn at(&self, order: f64) -> Result<f64, AccountantError> {
        self.orders
            .as_slice()
            .iter()
            .position(|&a| a == order)
            .map(|i| self.epsilons[i])
            .ok_or(AccountantError::MissingOrder(order))
    }

    /// The orders this curve is measured at.
    pub fn orders(&self) -> &Orders {
        &self.orders
    }

    /// ε(α) at each order, in the order of [`Self::orders`].
    pub fn epsilons(&self) -> &[f64] {
        &self.epsilons
    }

    /// Sequential composition (Mironov, arXiv:1702.07476, Prop. 1): RDP values add order by
    /// order. Each sum is rounded up, so the result never under-states the
    /// exact sum of the two curves.
    pub fn compose(&self, other: &RdpCurve) -> Result<RdpCurve, AccountantError> {
        if self.orders != other.orders {
            return Err(AccountantError::OrdersDiffer);
        }
        let epsilons = self
            .epsilons
            .iter()
            .zip(&other.epsilons)
            .map(|(&a, &b)| add_up(a, b))
            .collect();
        Ok(Self {
            orders: self.orders.clone(),
            epsilons,
        })
    }

    /// `count`-fold self-composition (Mironov, arXiv:1702.07476, Prop. 1 applied `count`
    /// times): every value times `count`, rounded up.
    pub fn self_compose(&self, count: u64) -> RdpCurve {
        // `count as f64` rounds to nearest above 2^53: take the float at or above it.
        let k = u64_up(count);
        // 0 · ∞ must stay 0: zero runs of a mechanism cost nothing.
        let epsilons = self
            .epsilons
            .iter()
            .map(|&e| if count == 0 { 0.0 } else { mul_up(e, k) })
            .collect();
        Self {
            orders: self.orders.clone(),
            epsilons,
        }
    }

    /// The curve read at other orders: at each α of `orders`, the smallest
    /// value the curve holds at any order ≥ α (+∞ where it holds none).
    ///
    /// Valid because the Rényi divergence is non-decreasing in its order (van
    /// Erven and Harremoës, "Rényi Divergence and Kullback-Leibler
    /// Divergence", arXiv:1206.2459, Thm 3): a bound at α' ≥ α bounds it at α.
    /// Over the curve's own orders it returns the curve itself, unless a value
    /// at a higher order is smaller, which it then takes.
    pub fn bound_at(&self, orders: &Orders) -> RdpCurve {
        let own = self.orders.as_slice();
        let mut suffix_min = self.epsilons.clone();
        for i in (0..suffix_min.len().saturating_sub(1)).rev() {
            suffix_min[i] = suffix_min[i].min(suffix_min[i + 1]);
        }
        let epsilons = orders
            .as_slice()
            .iter()
            .map(|&a| {
                let i = own.partition_point(|&b| b < a);
                suffix_min.get(i).copied().unwrap_or(f64::INFINITY)
            })
            .collect();
        Self {
            orders: orders.clone(),
            epsilons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_sorted_deduplicated_and_default_to_dp_accounting() {
        let o = Orders::new(vec![3.0, 2.0, 3.0, 1.5]).unwrap();
        assert_eq!(o.as_slice(), &[1.5, 2.0, 3.0]);
        let d = Orders::default();
        assert_eq!(d.len(), 99 + 53 + 4);
        assert_eq!((d.as_slice()[0], d.as_slice()[d.len() - 1]), (1.1, 1024.0));
        assert_eq!(Orders::integers(4).unwrap().as_slice(), &[2.0, 3.0, 4.0]);
    }

    #[test]
    fn single_and_at_look_up_values() {
        let c = RdpCurve::single(18.0, 0.25).unwrap();
        assert_eq!(c.at(18.0), Ok(0.25));
        assert_eq!(c.at(2.0), Err(AccountantError::MissingOrder(2.0)));
        assert!(RdpCurve::single(1.0, 0.1).is_err());
        assert!(RdpCurve::single(2.0, -0.1).is_err());
    }

    #[test]
    fn self_composition_rounds_up_and_zero_runs_cost_nothing() {
        let c = RdpCurve::new(
            Orders::new(vec![2.0, 3.0]).unwrap(),
            vec![0.1, f64::INFINITY],
        )
        .unwrap();
        let k = c.self_compose(3);
        assert!(k.epsilons()[0] >= 0.30000000000000004 && k.epsilons()[0] <= 0.3 + 1e-15);
        assert_eq!(k.epsilons()[1], f64::INFINITY);
        assert_eq!(c.self_compose(0), RdpCurve::zero(c.orders().clone()));
        // 0.1 + 0.2 is inexact; the composed value is the float above it.
        let a = RdpCurve::single(2.0, 0.1).unwrap();
        let b = RdpCurve::single(2.0, 0.2).unwrap();
        assert!(a.compose(&b).unwrap().epsilons()[0] >= 0.1 + 0.2);
    }
}
