//! `Serialize` and `Deserialize` (feature `serde`) for [`Orders`],
//! [`RdpCurve`], [`EpsilonDelta`] and [`DpEvent`].
//!
//! Deserialisation goes through the same checks as construction, so a value
//! read back satisfies every invariant a constructed one does: orders finite,
//! above 1, strictly ascending (a curve's values are matched to its orders by
//! position, so reordering them is refused rather than silently re-paired);
//! RDP values non-negative and never NaN; δ in [0, 1]; every event parameter
//! as [`DpEvent::validate`] requires.
//!
//! An RDP value or ε of +∞ (no guarantee) is written as `null`, since JSON has
//! no infinity, and `null` reads back as +∞: the missing-guarantee value,
//! never a smaller one.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{DpEvent, EpsilonDelta, Orders, RdpCurve};

impl Serialize for Orders {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Orders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let stored = Vec::<f64>::deserialize(d)?;
        let orders = Orders::new(stored.clone()).map_err(D::Error::custom)?;
        if orders.as_slice() != stored.as_slice() {
            return Err(D::Error::custom("Rényi orders must be strictly ascending"));
        }
        Ok(orders)
    }
}

/// +∞ as `None`, so that formats without infinities (JSON) can carry it.
fn finite_or_none(x: f64) -> Option<f64> {
    (x != f64::INFINITY).then_some(x)
}

#[derive(Serialize)]
struct CurveOut<'a> {
    orders: &'a Orders,
    epsilons: Vec<Option<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CurveIn {
    orders: Orders,
    epsilons: Vec<Option<f64>>,
}

impl Serialize for RdpCurve {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CurveOut {
            orders: self.orders(),
            epsilons: self
                .epsilons()
                .iter()
                .copied()
                .map(finite_or_none)
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RdpCurve {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = CurveIn::deserialize(d)?;
        let values = raw
            .epsilons
            .into_iter()
            .map(|v| v.unwrap_or(f64::INFINITY))
            .collect();
        RdpCurve::new(raw.orders, values).map_err(D::Error::custom)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EpsilonDeltaRepr {
    epsilon: Option<f64>,
    delta: f64,
    order: f64,
}

impl Serialize for EpsilonDelta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EpsilonDeltaRepr {
            epsilon: finite_or_none(self.epsilon),
            delta: self.delta,
            order: self.order,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for EpsilonDelta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = EpsilonDeltaRepr::deserialize(d)?;
        let epsilon = raw.epsilon.unwrap_or(f64::INFINITY);
        if epsilon.is_nan() || epsilon < 0.0 {
            return Err(D::Error::custom(format!("ε = {epsilon} must be ≥ 0")));
        }
        if !(0.0..=1.0).contains(&raw.delta) {
            return Err(D::Error::custom(format!(
                "δ = {} must lie in [0, 1]",
                raw.delta
            )));
        }
        if !(raw.order.is_finite() && raw.order > 1.0) {
            return Err(D::Error::custom(format!(
                "Rényi order {} must be finite and greater than 1",
                raw.order
            )));
        }
        Ok(EpsilonDelta {
            epsilon,
            delta: raw.delta,
            order: raw.order,
        })
    }
}

/// Written by the derived (remote) serialiser of `DpEvent`.
impl Serialize for DpEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        DpEvent::serialize(self, s)
    }
}

/// Read in the same shape as it is written, then validated like a constructed event.
impl<'de> Deserialize<'de> for DpEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let event = DpEvent::deserialize(d)?;
        event.validate().map_err(D::Error::custom)?;
        Ok(event)
    }
}
