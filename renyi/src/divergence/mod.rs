//! Divergences between two distributions given as probability or log-probability vectors.
//!
//! The guarantees (what is computed on inputs normalised within tolerance, exact `+∞`
//! and 0, accuracy, batched = scalar bitwise) and the identities each kernel evaluates
//! are written out in `proof.md` beside this file.
//!
//! Every function validates its input once, then runs one kernel:
//! * probability vectors whose non-zero entries are all ≥ 1e-150 go through the ratio
//!   kernels (module `ratio`): ratios `p·fl(1/q)` scaled by their running maximum, raised
//!   to `α − 1` by repeated multiplication for integer α (no `exp`/`log` per element),
//!   by `powf` otherwise, and by an `expm1` form for `α − 1 < 0.125`;
//! * other probability vectors (entries down to the smallest subnormal) and all
//!   log-probability vectors go through the log-space kernels (module `logspace`);
//! * [`batched_divergence`] (module `batched`) runs the same kernels over many rows
//!   against one reference.

mod batched;
mod logspace;
mod ratio;

use crate::kernel::{RATIO_PATH_MIN, SMALL_EXPONENT, non_negative};
use crate::validate::{self, ProbSummary, Probability};
use crate::{Order, Result};
use logspace::{LnOf, LogSource, Logs};
use ratio::{Denominator, Power, SCREEN_NONE, SCREEN_P};

pub use batched::{Direction, batched_divergence};

/// `D_α(p/P ‖ q/Q)` for validated probability vectors: picks the kernel. `inv_q`, when
/// given, holds `fl(1/q_x)` (see [`ratio::reciprocals`]); the result is bitwise the same
/// with or without it.
pub(crate) fn forward_prob<T: Probability>(
    p: &[T],
    q: &[T],
    inv_q: Option<&[f64]>,
    sp: ProbSummary,
    sq: ProbSummary,
    alpha: Order,
) -> f64 {
    let den = Denominator { q, inv: inv_q };
    let ratio_ok = ratio::applicable(sp.min_positive, sq.min_positive);
    let done = |outcome: ratio::Outcome| outcome.map_or(f64::INFINITY, |(d, _)| d);
    let d = match alpha {
        Order::Infinite if ratio_ok => done(ratio::infinite::<T, SCREEN_NONE>(p, den)),
        Order::Infinite => logspace::infinite(&LnOf(p), &LnOf(q)),
        Order::Finite(a) if !ratio_ok => logspace::finite(&LnOf(p), &LnOf(q), a - 1.0),
        Order::Finite(_) => done(ratio_finite::<T, SCREEN_NONE>(p, den, alpha)),
    };
    non_negative(d)
}

/// The ratio kernel for a finite order (`alpha` is finite).
fn ratio_finite<T: Probability, const S: u8>(
    p: &[T],
    den: Denominator<'_, T>,
    alpha: Order,
) -> ratio::Outcome {
    let n = alpha.value() - 1.0;
    if n < SMALL_EXPONENT {
        ratio::finite_small::<T, S>(p, den, n)
    } else if let Some(k) = alpha.integer() {
        ratio::finite::<T, S>(p, den, Power::Int(k - 1))
    } else {
        ratio::finite::<T, S>(p, den, Power::Real(n))
    }
}

/// [`forward_prob`] where one side (`S`: [`SCREEN_P`] or [`SCREEN_Q`]) has NOT been
/// validated: the ratio kernel's own pass screens it (same sum, sign and support checks
/// as validation, at no extra memory traffic). Returns the divergence and that side's
/// summary when the side is valid and the ratio kernels apply; `None` otherwise (the
/// caller then validates, which names any problem, and calls [`forward_prob`]). When it
/// returns a value, that value is bitwise what [`forward_prob`] would return.
pub(crate) fn forward_prob_screened<T: Probability, const S: u8>(
    p: &[T],
    q: &[T],
    inv_q: Option<&[f64]>,
    validated: ProbSummary,
    alpha: Order,
) -> Option<(f64, ProbSummary)> {
    if !ratio::applicable(validated.min_positive, RATIO_PATH_MIN) {
        return None;
    }
    let den = Denominator { q, inv: inv_q };
    let (d, pass) = match alpha {
        Order::Infinite => ratio::infinite::<T, S>(p, den),
        Order::Finite(_) => ratio_finite::<T, S>(p, den, alpha),
    }?;
    let sum = if S == SCREEN_P {
        pass.p_sum
    } else {
        pass.q_sum
    };
    let screen = pass.screen;
    let valid = validate::check_sum(sum).is_ok() && screen.min >= 0.0;
    let summary = ProbSummary {
        min_positive: screen.min_positive,
        sum,
    };
    (valid && ratio::applicable(summary.min_positive, RATIO_PATH_MIN))
        .then(|| (non_negative(d), summary))
}

fn forward_log<S: LogSource>(lp: &S, lq: &S, alpha: Order) -> f64 {
    non_negative(match alpha {
        Order::Infinite => logspace::infinite(lp, lq),
        Order::Finite(a) => logspace::finite(lp, lq, a - 1.0),
    })
}

fn check_pair<T: Probability>(p: &[T], q: &[T]) -> Result<(ProbSummary, ProbSummary)> {
    let sp = validate::probabilities(p)?;
    let sq = validate::probabilities(q)?;
    validate::same_length(p.len(), q.len())?;
    Ok((sp, sq))
}

fn check_log_pair(log_p: &[f64], log_q: &[f64]) -> Result<()> {
    validate::log_probabilities(log_p)?;
    validate::log_probabilities(log_q)?;
    validate::same_length(log_p.len(), log_q.len())
}

/// The Rényi divergence of order α,
/// `D_α(p‖q) = 1/(α−1) · log Σ_x p_x^α q_x^{1−α}` (and `log max_x p_x/q_x` for α = ∞),
/// of two probability vectors (van Erven & Harremoës, "Rényi Divergence and
/// Kullback-Leibler Divergence", arXiv:1206.2459). It is the privacy loss of Rényi
/// differential privacy (Mironov, "Rényi Differential Privacy", arXiv:1702.07476). See
/// the crate documentation for what is computed on inputs normalised only within
/// tolerance, and the accuracy; `proof.md` beside this file for why.
pub fn divergence<T: Probability>(p: &[T], q: &[T], alpha: Order) -> Result<f64> {
    let alpha = alpha.checked()?;
    let (sp, sq) = check_pair(p, q)?;
    Ok(forward_prob(p, q, None, sp, sq, alpha))
}

/// `max(D_α(p‖q), D_α(q‖p))`: the symmetric divergence that PMixED (arXiv:2403.15638),
/// AdaPMixED (arXiv:2410.02016, §3.2) and DPS-MOZO (arXiv:2501.19287, §4.1) bound. Never
/// below either direction.
pub fn symmetric_divergence<T: Probability>(p: &[T], q: &[T], alpha: Order) -> Result<f64> {
    let alpha = alpha.checked()?;
    let (sp, sq) = check_pair(p, q)?;
    Ok(forward_prob(p, q, None, sp, sq, alpha).max(forward_prob(q, p, None, sq, sp, alpha)))
}

/// The Kullback-Leibler divergence `KL(p‖q) = Σ_x p_x log(p_x/q_x)`, the limit of `D_α` as
/// α → 1 (van Erven & Harremoës, arXiv:1206.2459, Thm. 5).
pub fn kl_divergence<T: Probability>(p: &[T], q: &[T]) -> Result<f64> {
    let (sp, sq) = check_pair(p, q)?;
    Ok(non_negative(
        if ratio::applicable(sp.min_positive, sq.min_positive) {
            ratio::kl(p, Denominator { q, inv: None })
        } else {
            logspace::kl(&LnOf(p), &LnOf(q))
        },
    ))
}

/// [`divergence`] for log-probability vectors (natural logs; `−∞` is probability 0).
/// Accepted when `|exp(logsumexp) − 1| ≤ NORMALISATION_TOLERANCE`; computed entirely in
/// log space, so probabilities far below the f64 range are handled.
pub fn divergence_log(log_p: &[f64], log_q: &[f64], alpha: Order) -> Result<f64> {
    let alpha = alpha.checked()?;
    check_log_pair(log_p, log_q)?;
    Ok(forward_log(&Logs(log_p), &Logs(log_q), alpha))
}

/// [`symmetric_divergence`] for log-probability vectors.
pub fn symmetric_divergence_log(log_p: &[f64], log_q: &[f64], alpha: Order) -> Result<f64> {
    let alpha = alpha.checked()?;
    check_log_pair(log_p, log_q)?;
    let (lp, lq) = (Logs(log_p), Logs(log_q));
    Ok(forward_log(&lp, &lq, alpha).max(forward_log(&lq, &lp, alpha)))
}

/// [`kl_divergence`] for log-probability vectors.
pub fn kl_divergence_log(log_p: &[f64], log_q: &[f64]) -> Result<f64> {
    check_log_pair(log_p, log_q)?;
    Ok(non_negative(logspace::kl(&Logs(log_p), &Logs(log_q))))
}
