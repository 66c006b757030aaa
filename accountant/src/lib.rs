//! # privmix-accountant
//!
//! Rényi-DP accounting: RDP curves over a set of orders, composition, privacy
//! amplification by subsampling, conversion to (ε, δ), calibration, budgets and
//! a durable ledger.
//!
//! A mechanism M is (α, ε)-RDP when D_α(M(D) ‖ M(D')) ≤ ε for all neighbouring
//! datasets D, D' (Mironov 2017). An [`RdpCurve`] records such a bound at every
//! order of an [`Orders`] set; curves over the same orders compose by addition.

mod amplify;
mod budget;
mod calibrate;
mod conversion;
mod curve;
mod error;
mod events;
mod interval;
mod ledger;
mod poisson;
mod round;
mod special;
mod without_replacement;

pub use budget::{Budget, PartBudgets, random_stopping_epsilon};
pub use calibrate::{
    REL_TOL, dps_mozo_beta, dps_mozo_total, largest_feasible, pmixed_beta, poisson_gaussian_sigma,
    smallest_feasible,
};
pub use conversion::EpsilonDelta;
pub use curve::{Orders, RdpCurve};
pub use error::AccountantError;
pub use events::{adapmixed_screening, dps_mozo_token, gaussian, pmixed_query, pmixed_subsampled};
pub use ledger::{
    EntryKind, Ledger, LedgerEntry, LedgerError, LedgerReader, LedgerSummary, MAX_LABEL_BYTES,
    PrivacyBudget, Receipt, verify,
};
pub use poisson::{poisson_subsampled_gaussian, poisson_subsampled_gaussian_at};
pub use without_replacement::without_replacement_gaussian;
