//! # privmix-accountant
//!
//! Rényi-DP accounting: RDP curves over a set of orders, privacy events,
//! composition, privacy amplification by subsampling, conversion to (ε, δ),
//! calibration, budgets and a durable ledger.
//!
//! A mechanism M is (α, ε)-RDP when D_α(M(D) ‖ M(D')) ≤ ε for all neighbouring
//! datasets D, D' (Mironov, "Rényi Differential Privacy", arXiv:1702.07476,
//! Def. 4). An [`RdpCurve`] records such a bound at every order of an
//! [`Orders`] set; curves over the same orders compose by addition (ibid.,
//! Prop. 1). A [`DpEvent`] describes what was run (a Gaussian, a subsampled
//! event, a composition, …) and maps to its curve with [`DpEvent::rdp`].
//!
//! ## What is provided, and on what it rests
//!
//! Each construction lives in its own folder with its guarantee, its tests,
//! and a `proof.md` where privmix relies on an argument of its own.
//!
//! * Events (`event/`): [`gaussian`] (arXiv:1702.07476, Prop. 7), [`laplace`]
//!   (ibid., Prop. 6), [`randomized_response`] (ibid., Prop. 5 for k = 2; the
//!   k-ary case in `event/randomized_response/proof.md`), [`pmixed_query`] and
//!   [`pmixed_subsampled`] (Flemings, Razaviyayn & Annavaram, "Adaptively
//!   Private Next-Token Prediction of Large Language Models",
//!   arXiv:2410.02016, Thm 3.1; small ensembles in
//!   `event/pmixed/proof.md`), [`dps_mozo_token`] (Flemings et al.,
//!   "Differentially Private In-context Learning via Sampling Few-shot Mixed
//!   with Zero-shot Outputs", arXiv:2501.19287, Thm B.3), [`adapmixed_screening`]
//!   (arXiv:2410.02016, Thm 4.1), and measured curves ([`RdpCurve::new`],
//!   [`DpEvent::Measured`], [`DpEvent::DataDependent`]).
//! * Amplification (`amplification/`): [`RdpCurve::poisson_subsampled`] (Zhu &
//!   Wang, "Poisson Subsampled Rényi Differential Privacy", ICML 2019, Thm 6,
//!   tight at integer orders), [`poisson_subsampled_gaussian`] (Mironov,
//!   Talwar & Zhang, arXiv:1908.10530, integer and fractional orders),
//!   [`RdpCurve::sampled_without_replacement`] (Wang, Balle &
//!   Kasiviswanathan, arXiv:1808.00087, Thm 9) and
//!   [`without_replacement_gaussian`] (their Thm 27).
//! * Conversion (`conversion/`): [`RdpCurve::epsilon`] / [`RdpCurve::delta`]
//!   (Balle et al., arXiv:1905.09982, Thm 21, and Bretagnolle–Huber),
//!   reporting the order used.
//! * Privacy-loss distributions ([`pld`]): [`PrivacyLossDistribution`] of the
//!   (Poisson-subsampled) Gaussian, pessimistically discretised (Doroshenko et
//!   al., "Connect the Dots", arXiv:2207.04380), composed by FFT with its
//!   floating-point error bounded, converted to (ε, δ) for both neighbouring
//!   directions; [`dp_sgd_epsilon`] for DP-SGD. The proofs are in
//!   [`proofs::pld`].
//! * Calibration: [`pmixed_beta`], [`dps_mozo_beta`], [`poisson_gaussian_sigma`],
//!   [`screening_sigma`]
//!   — each returns a value checked feasible, maximal (minimal) to [`REL_TOL`].
//! * Budgets: [`Budget`] and [`PartBudgets`] refuse a charge that would
//!   overspend, without recording it.
//! * Ledger (`ledger/`): [`Ledger`] durably records charges, curves or events,
//!   and never under-counts across crashes.
//!
//! ## Rounding
//!
//! Every reported RDP value, ε and δ is an upper bound on the exact value of its
//! formula: like OpenDP, arithmetic is rounded outward with `privmix_renyi::round`
//! (exact-directed `+ − × ÷ √` via error-free transformations; `ln`, `exp` and
//! friends moved one ulp, under the assumption of a faithful libm), and series with
//! cancellation are summed in interval arithmetic with proven remainder bounds.
//!
//! ## Features
//!
//! * `serde`: `Serialize`/`Deserialize` for [`Orders`], [`RdpCurve`],
//!   [`EpsilonDelta`] and [`DpEvent`]; deserialisation validates like
//!   construction.

mod amplification;
mod budget;
mod calibrate;
mod conversion;
mod curve;
mod error;
pub mod event;
mod interval;
mod ledger;
pub mod pld;
pub mod proofs;
#[cfg(feature = "serde")]
mod serde_impls;
mod special;

pub use amplification::poisson::{poisson_subsampled_gaussian, poisson_subsampled_gaussian_at};
pub use amplification::without_replacement::without_replacement_gaussian;
pub use budget::{Budget, PartBudgets, random_stopping_epsilon};
pub use calibrate::{
    REL_TOL, dps_mozo_beta, dps_mozo_total, gaussian_sigma, largest_feasible, pmixed_beta,
    poisson_gaussian_sigma, screening_sigma, smallest_feasible,
};
pub use conversion::EpsilonDelta;
pub use curve::{Orders, RdpCurve};
pub use error::AccountantError;
pub use event::adapmixed_screening::adapmixed_screening;
pub use event::dps_mozo::dps_mozo_token;
pub use event::gaussian::gaussian;
pub use event::laplace::laplace;
pub use event::pmixed::{pmixed_query, pmixed_subsampled};
pub use event::randomized_response::randomized_response;
pub use event::{DpEvent, MAX_EVENT_DEPTH};
pub use ledger::{
    EntryKind, EventDecodeError, FORMAT_VERSION, Ledger, LedgerEntry, LedgerError, LedgerHeader,
    LedgerReader, LedgerSummary, MAX_DEFINITIONS, MAX_EVENT_BYTES, MAX_LABEL_BYTES,
    MAX_MEMBER_ID_BYTES, MAX_PROTECTED_MEMBERS, MAX_STEP_DEFINITIONS, MAX_STEP_RUNS,
    OLDEST_READABLE_VERSION, PrivacyBudget, ProtectedSet, Receipt, StepCharge, StepCost,
    StepReceipt, StepRun, decode_event, encode_event, verify,
};
pub use pld::{PldError, PrivacyLossDistribution, dp_sgd_epsilon};

// The README's quick start runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
