//! # privmix-renyi
//!
//! Rényi divergences of discrete distributions, computed in f64 and log space: the
//! privacy loss that every privmix mechanism bounds.
//!
//! For probability vectors `p`, `q` and an order `α ∈ (1, ∞)`,
//!
//! `D_α(p‖q) = 1/(α−1) · log Σ_x p_x^α q_x^{1−α}`,   `D_∞(p‖q) = log max_{p_x>0} p_x/q_x`,
//!
//! and `KL(p‖q) = Σ_x p_x log(p_x/q_x)` is the limit α → 1 (van Erven & Harremoës,
//! "Rényi Divergence and Kullback-Leibler Divergence", arXiv:1206.2459, IEEE Trans. Inf.
//! Theory 60(7), 2014). A mechanism is `(α, ε)`-RDP when this divergence between its
//! output distributions on neighbouring inputs is at most ε (Mironov, "Rényi
//! Differential Privacy", arXiv:1702.07476, CSF 2017).
//!
//! What this crate guarantees:
//! * Every sum is a scaled f64 sum (log-sum-exp, or ratios scaled by their maximum), so
//!   no intermediate overflows or underflows to a wrong result: probabilities down to the
//!   smallest subnormal and orders up to `f64::MAX` give a number, never NaN.
//! * A zero of the second argument where the first has mass gives `+∞`, explicitly;
//!   positions where both vanish contribute nothing; bitwise-equal inputs give exactly 0.
//! * Inputs are validated once per call ([`RenyiError`] names any problem); vectors that
//!   sum to 1 within [`NORMALISATION_TOLERANCE`] are accepted and the divergence returned
//!   is that of the normalised distributions (below).
//!
//! Entry points: [`divergence`], [`symmetric_divergence`], [`kl_divergence`] (f32 or f64
//! probabilities) and their `_log` variants (log-probabilities); [`batched_divergence`]
//! (N rows against one reference, parallel, exp/log-free for integer α); and
//! [`MixturePath`] / [`SymmetricMixture`], the value and λ-derivative of the divergence
//! along `λp + (1−λ)q`, for λ solvers. [`ValidatedRows`] keeps rows validated once with
//! what validation learnt, so that solves repeated against them (every member of an
//! ensemble, every token) skip their validation pass.
//!
//! ## What is computed
//!
//! Inputs are accepted when they sum to 1 within [`NORMALISATION_TOLERANCE`]; the
//! divergence returned is that of the normalised distributions `p/Σp` and `q/Σq` (sums
//! in f64), which is ≥ 0 by Hölder's (Rényi) or Gibbs' (KL) inequality and 0 exactly
//! when they are equal. A negative result can
//! therefore only be rounding error and is returned as 0, the nearer value to the true
//! one; bitwise-equal inputs give exactly 0. A zero of `q` where `p` has mass gives
//! `+∞`; positions where both are zero contribute nothing. No valid input gives NaN.
//!
//! ## Accuracy
//!
//! Every term is scaled by the running maximum and summed in f64 in 4 interleaved
//! lanes, so the relative error of `S = Σ p^α q^{1−α}` is at worst about
//! `(len/4 + 2(α−1))·ε` (`ε = 2^-53`; far less in practice), and the absolute error of
//! `D_α = log(S)/(α−1)` about that divided by `α − 1`, plus a few `ε·|log max p/q|`. For
//! `α − 1 < 0.125` the `expm1` form keeps the error near `ε·E_p|log p/q|` instead of
//! `ε/(α−1)`. The log-space kernels lose a further `ε·|log p|` per term (ulps of the
//! logarithms). The tests check agreement with 60-digit mpmath values to 1e-13 relative.
//! Callers that report a privacy bound should round it up, with [`round`]: the
//! outward-rounded arithmetic every privmix crate uses for its privacy numbers.
//!
//! ## Layout
//!
//! One folder per construction, each with a `proof.md` (shipped in the crate) that
//! states its guarantee and the argument for it: `divergence/` (two distributions, and
//! many rows against one reference), `mixture/` (divergences along mixing paths, with
//! their λ-derivative), `round/` (outward-rounded arithmetic). Shared pieces: `kernel`
//! (chunked lane-wise loops, streaming log-sum-exp), `validate`, `order`, `error`, and
//! the public [`simd`] building blocks.
//!
//! ## Example
//!
//! ```
//! use privmix_renyi::{divergence, kl_divergence, symmetric_divergence, MixturePath, Order};
//!
//! // Randomised response on two outcomes with flip probability 1/4.
//! let p = [0.75, 0.25];
//! let q = [0.25, 0.75];
//! let alpha = Order::new(2.0)?;
//! // D_2 = log(0.75²/0.25 + 0.25²/0.75) = log(7/3).
//! let d = divergence(&p, &q, alpha)?;
//! assert!((d - (7.0_f64 / 3.0).ln()).abs() < 1e-15);
//! assert_eq!(symmetric_divergence(&p, &q, alpha)?, d); // symmetric pair
//! assert!(kl_divergence(&p, &q)? < d); // D_α is non-decreasing in α
//! assert_eq!(divergence(&p, &[0.0, 1.0], alpha)?, f64::INFINITY);
//!
//! // Along the mixture λp + (1−λ)q against q, with its slope for a Newton step.
//! let path = MixturePath::forward(&p, &q, alpha)?;
//! let at_half = path.evaluate(0.5)?;
//! assert!(at_half.value > 0.0 && at_half.value < d && at_half.slope > 0.0);
//! assert_eq!(path.evaluate(0.0)?.value, 0.0);
//! # Ok::<(), privmix_renyi::RenyiError>(())
//! ```

mod divergence;
mod error;
mod kernel;
mod mixture;
mod order;
pub mod proofs;
pub mod round;
pub mod simd;
#[cfg(any(test, feature = "test-rows"))]
pub mod test_rows;
mod validate;

pub use divergence::{
    Direction, batched_divergence, divergence, divergence_log, kl_divergence, kl_divergence_log,
    symmetric_divergence, symmetric_divergence_log,
};
pub use error::{RenyiError, Result};
pub use mixture::{
    MixturePath, SymmetricMixture, SymmetricValue, ValidatedRow, ValidatedRows, ValueAndSlope,
};
pub use order::Order;
pub use validate::Probability;

/// How far from 1 the sum of a probability vector (or the exponential of the
/// log-sum-exp of a log-probability vector) may be: `|Σp − 1| ≤ 1e-4`. That admits f32
/// softmax outputs over vocabularies of 10⁵ tokens (accumulated rounding ≈ 1e-5) while
/// rejecting vectors that are not distributions at all.
pub const NORMALISATION_TOLERANCE: f64 = 1e-4;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
