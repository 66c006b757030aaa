//! # privmix-accountant
//!
//! Rényi-DP accounting: RDP curves over a set of orders, composition, privacy
//! amplification by subsampling, conversion to (ε, δ), calibration, budgets and
//! a durable ledger.
//!
//! A mechanism M is (α, ε)-RDP when D_α(M(D) ‖ M(D')) ≤ ε for all neighbouring
//! datasets D, D' (Mironov 2017). An [`RdpCurve`] records such a bound at every
//! order of an [`Orders`] set; curves over the same orders compose by addition.
//!
//! ## What is provided, and on what it rests
//!
//! * Events: [`gaussian`] (Mironov 2017 Prop. 7), [`pmixed_query`] (adapmixed.txt
//!   Thm 3.1, with the one-member case derived in its docs), [`dps_mozo_token`]
//!   (dps-mozo.txt Thm B.3), [`adapmixed_screening`] (adapmixed.txt Thm 4.1),
//!   and any measured curve ([`RdpCurve::new`], [`RdpCurve::single`]).
//! * Amplification: [`RdpCurve::poisson_subsampled`] (Zhu & Wang 2019, tight, at
//!   integer orders), [`poisson_subsampled_gaussian`] (Mironov, Talwar & Zhang
//!   2019, integer and fractional orders), [`RdpCurve::sampled_without_replacement`]
//!   (Wang, Balle & Kasiviswanathan 2019 Thm 9) and [`without_replacement_gaussian`]
//!   (their Thm 27), [`pmixed_subsampled`].
//! * Conversion: [`RdpCurve::epsilon`] / [`RdpCurve::delta`] (Balle et al. 2020
//!   Thm 21 and Bretagnolle–Huber), reporting the order used.
//! * Calibration: [`pmixed_beta`], [`dps_mozo_beta`], [`poisson_gaussian_sigma`],
//!   [`screening_sigma`]
//!   — each returns a value checked feasible, maximal (minimal) to [`REL_TOL`].
//! * Budgets: [`Budget`] and [`PartBudgets`] refuse a charge that would
//!   overspend, without recording it.
//!
//! ## Rounding
//!
//! Every reported RDP value, ε and δ is an upper bound on the exact value of its
//! formula: like OpenDP, arithmetic is rounded outward with `privmix_renyi::round`
//! (exact-directed `+ − × ÷ √` via error-free transformations; `ln`, `exp` and
//! friends moved one ulp, under the assumption of a faithful libm), and series with
//! cancellation are summed in interval arithmetic with proven remainder bounds.

mod amplify;
mod budget;
mod calibrate;
mod conversion;
mod curve;
mod error;
mod events;
mod interval;
mod ledger;
pub mod pld;
mod poisson;
mod special;
mod without_replacement;

pub use budget::{Budget, PartBudgets, random_stopping_epsilon};
pub use calibrate::{
    REL_TOL, dps_mozo_beta, dps_mozo_total, gaussian_sigma, largest_feasible, pmixed_beta,
    poisson_gaussian_sigma, screening_sigma, smallest_feasible,
};
pub use conversion::EpsilonDelta;
pub use curve::{Orders, RdpCurve};
pub use error::AccountantError;
pub use events::{adapmixed_screening, dps_mozo_token, gaussian, pmixed_query, pmixed_subsampled};
pub use ledger::{
    EntryKind, FORMAT_VERSION, Ledger, LedgerEntry, LedgerError, LedgerHeader, LedgerReader,
    LedgerSummary, MAX_LABEL_BYTES, MAX_MEMBER_ID_BYTES, MAX_PROTECTED_MEMBERS,
    OLDEST_READABLE_VERSION, PrivacyBudget, ProtectedSet, Receipt, verify,
};
pub use pld::{PldError, PrivacyLossDistribution, dp_sgd_epsilon};
pub use poisson::{poisson_subsampled_gaussian, poisson_subsampled_gaussian_at};
pub use without_replacement::without_replacement_gaussian;
