//! Helpers shared by the ledger integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

use privmix_accountant::{Orders, RdpCurve};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// A new empty directory whose name contains `tag`.
    pub fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("privmix-ledger-{tag}-"))
            .tempdir()
            .unwrap();
        Self(dir)
    }

    /// A path inside the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A small order set, so files stay small and byte-level loops stay fast.
pub fn small_orders() -> Orders {
    Orders::new(vec![1.5, 2.0, 4.0, 16.0, 64.0]).unwrap()
}

/// The Gaussian mechanism's RDP curve, α / (2σ²) (Mironov, arXiv:1702.07476, Prop. 7).
pub fn gaussian(orders: &Orders, sigma: f64) -> RdpCurve {
    RdpCurve::from_fn(orders.clone(), |a| a / (2.0 * sigma * sigma)).unwrap()
}

/// A charge that depends on its sequence number, so a test can tell from a
/// record's position what it must contain.
pub fn charge_for(orders: &Orders, sequence: u64) -> RdpCurve {
    gaussian(orders, 20.0 + (sequence % 7) as f64)
}

/// The label written with [`charge_for`].
pub fn label_for(sequence: u64) -> String {
    format!("gaussian-{sequence}")
}

/// Byte-exact values of a curve.
pub fn bits(curve: &RdpCurve) -> Vec<u64> {
    curve.epsilons().iter().map(|v| v.to_bits()).collect()
}

/// Composes curves in order, starting from zero: what a ledger's total must be.
pub fn compose_all<'a>(
    orders: &Orders,
    curves: impl IntoIterator<Item = &'a RdpCurve>,
) -> RdpCurve {
    curves
        .into_iter()
        .fold(RdpCurve::zero(orders.clone()), |acc, c| {
            acc.compose(c).unwrap()
        })
}
