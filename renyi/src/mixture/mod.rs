//! Divergences along mixing paths, with their derivative in λ from the same pass: the
//! quantity the λ solvers of PMixED, AdaPMixED and SubMix search over.
//!
//! What the evaluators guarantee (value, one-sided slope, endpoint terms, agreement with
//! [`crate::divergence`], the closed forms of the integer-order path) and why is written
//! out in `proof.md` beside this file.
//!
//! The modules below this one form a tree with no cycle: [`kernel`] holds the shared
//! types (chunks, endpoints, sums, [`ValueAndSlope`]) and the ratio accumulator;
//! `log` and `max` hold the log-space and order-∞ accumulators, built on the kernel's
//! types; `fast` holds the integer-order fast path, and `ratio_pass` the pass that
//! builds its table (the ratios and the λ = 1 sums). This module picks the accumulator
//! for each evaluation ([`PathAcc`]); `rows` holds validated rows ([`ValidatedRow`],
//! [`ValidatedRows`]), which the constructors take.

mod fast;
mod kernel;
mod log;
mod max;
mod ratio_pass;
mod rows;

use crate::kernel::{CHUNK, RATIO_PATH_MIN};
use crate::validate::{self, ProbSummary};
use crate::{Order, Result};
use fast::RatioTable;
use kernel::{Endpoint, PathAccumulator, PathChunk, RATIO_PATH_MAX_ORDER, RatioAcc};
use log::LogAcc;
use max::MaxAcc;

pub use kernel::ValueAndSlope;
pub use rows::{ValidatedRow, ValidatedRows};

/// A value-and-slope accumulator; `add` is called once per chunk.
pub(crate) enum PathAcc {
    Ratio(RatioAcc),
    Log(LogAcc),
    Max(MaxAcc),
}

impl PathAcc {
    /// `ratio_ok`: every non-zero `m`, `n` is at least `RATIO_PATH_MIN`.
    pub(crate) fn new(alpha: Order, ratio_ok: bool, endpoint: Endpoint) -> Self {
        match alpha {
            Order::Infinite => PathAcc::Max(MaxAcc::new(endpoint)),
            Order::Finite(a) if ratio_ok && a <= RATIO_PATH_MAX_ORDER => {
                PathAcc::Ratio(RatioAcc::new(alpha, a, endpoint))
            }
            Order::Finite(a) => PathAcc::Log(LogAcc::new(a, endpoint)),
        }
    }

    pub(crate) fn add(&mut self, c: &PathChunk) {
        match self {
            PathAcc::Ratio(acc) => acc.add(c),
            PathAcc::Log(acc) => acc.add(c),
            PathAcc::Max(acc) => acc.add(c),
        }
    }

    pub(crate) fn finish(&self) -> ValueAndSlope {
        match self {
            PathAcc::Ratio(acc) => acc.result(),
            PathAcc::Log(acc) => acc.result(),
            PathAcc::Max(acc) => acc.result(),
        }
    }
}

/// The path `λ ↦ D_α(λa + (1−λ)c ‖ λb + (1−λ)c)`, λ ∈ [0, 1].
///
/// Both arguments are probability vectors for every λ (convex combinations), and the
/// divergence is that of their normalised versions, as for [`crate::divergence`]. The
/// vectors are validated once, in the constructor; [`MixturePath::evaluate`] is then a
/// single pass over them with no heap allocation, returning the value and its slope
///
/// `dD/dλ = (1/(α−1))·Σ_x w_x·[α(a_x−c_x)/m_x + (1−α)(b_x−c_x)/n_x]`,
/// `w_x = m_x^α n_x^{1−α} / Σ_y m_y^α n_y^{1−α}`,
///
/// (plus the derivative of the normalisation, zero for exactly normalised inputs), or
/// for α = ∞ the slope of the maximal term `log(m_x/n_x)`. Rényi divergence is
/// jointly quasi-convex and `D(λ) = 0` at λ = 0 (van Erven & Harremoës, "Rényi Divergence
/// and Kullback-Leibler Divergence", arXiv:1206.2459, Thm. 13), so along every path, and
/// in particular [`MixturePath::forward`] and [`MixturePath::reverse`], the exact value
/// is non-decreasing in λ (see `proof.md` beside this file, P6).
///
/// For finite α ≥ 1.125 and vectors whose non-zero entries are ≥ 1e-150 (so that both use
/// the ratio kernels) the value is bitwise equal to [`crate::divergence`] applied to the
/// explicit vectors `λa + (1−λ)c` and `λb + (1−λ)c` (each computed as
/// `lambda * x + (1.0 - lambda) * c`); elsewhere the two agree to rounding (~1e-13).
#[derive(Debug, Clone)]
pub struct MixturePath<'a> {
    a: &'a [f64],
    b: &'a [f64],
    c: &'a [f64],
    alpha: Order,
    min_positive: [f64; 3],
    /// `a` (resp. `b`) is the very slice `c`: that argument is then exactly `c` for every
    /// λ (not `λc + (1−λ)c`, which can differ in the last bit).
    a_is_c: bool,
    b_is_c: bool,
}

impl<'a> MixturePath<'a> {
    /// Validates `a`, `b`, `c` (probability vectors of one length) and `alpha`.
    pub fn new(a: &'a [f64], b: &'a [f64], c: &'a [f64], alpha: Order) -> Result<Self> {
        let alpha = alpha.checked()?;
        let sa = validate::probabilities(a)?;
        let sb = validate::probabilities(b)?;
        let sc = validate::probabilities(c)?;
        validate::same_length(a.len(), b.len())?;
        validate::same_length(a.len(), c.len())?;
        let min_positive = [sa.min_positive, sb.min_positive, sc.min_positive];
        let (a_is_c, b_is_c) = (std::ptr::eq(a, c), std::ptr::eq(b, c));
        Ok(MixturePath {
            a,
            b,
            c,
            alpha,
            min_positive,
            a_is_c,
            b_is_c,
        })
    }

    /// `λ ↦ D_α(λp + (1−λ)q ‖ q)` (`a = p`, `b = c = q`).
    pub fn forward(p: &'a [f64], q: &'a [f64], alpha: Order) -> Result<Self> {
        Self::new(p, q, q, alpha)
    }

    /// `λ ↦ D_α(q ‖ λp + (1−λ)q)` (`a = c = q`, `b = p`).
    pub fn reverse(p: &'a [f64], q: &'a [f64], alpha: Order) -> Result<Self> {
        Self::new(q, p, q, alpha)
    }

    /// The divergence and its slope at `lambda`; [`crate::RenyiError::InvalidLambda`] for
    /// λ outside [0, 1] or NaN. The value may be `+∞` (support mismatch), never NaN.
    pub fn evaluate(&self, lambda: f64) -> Result<ValueAndSlope> {
        validate::lambda(lambda)?;
        let [ma, mb, mc] = self.min_positive;
        let ratio_ok = mixture_floor(lambda, ma, mc) >= RATIO_PATH_MIN
            && mixture_floor(lambda, mb, mc) >= RATIO_PATH_MIN;
        let mut acc = PathAcc::new(self.alpha, ratio_ok, Endpoint::of(lambda));
        let mut chunk = PathChunk::new();
        let mu = 1.0 - lambda;
        for ((ac, bc), cc) in self
            .a
            .chunks(CHUNK)
            .zip(self.b.chunks(CHUNK))
            .zip(self.c.chunks(CHUNK))
        {
            if ac.len() < CHUNK {
                chunk = PathChunk::new();
            }
            for i in 0..ac.len() {
                let (a, b, c) = (ac[i], bc[i], cc[i]);
                chunk.m[i] = if self.a_is_c { c } else { lambda * a + mu * c };
                chunk.n[i] = if self.b_is_c { c } else { lambda * b + mu * c };
                chunk.dm[i] = a - c;
                chunk.dn[i] = b - c;
            }
            acc.add(&chunk);
        }
        Ok(acc.finish())
    }
}

/// A lower bound on the non-zero entries of `λx + (1−λ)c` from those of `x` and `c`.
fn mixture_floor(lambda: f64, min_x: f64, min_c: f64) -> f64 {
    let from_x = if lambda > 0.0 {
        lambda * min_x
    } else {
        f64::INFINITY
    };
    let from_c = if lambda < 1.0 {
        (1.0 - lambda) * min_c
    } else {
        f64::INFINITY
    };
    from_x.min(from_c)
}

/// Both directions of the PMixED constraint at one λ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SymmetricValue {
    /// `D_α(λp + (1−λ)q ‖ q)` and its slope.
    pub forward: ValueAndSlope,
    /// `D_α(q ‖ λp + (1−λ)q)` and its slope.
    pub reverse: ValueAndSlope,
}

impl SymmetricValue {
    /// The symmetric divergence `max(forward, reverse)`.
    pub fn max(&self) -> f64 {
        self.forward.value.max(self.reverse.value)
    }
}

/// `λ ↦ (D_α(λp + (1−λ)q ‖ q), D_α(q ‖ λp + (1−λ)q))`, both from ONE pass over memory:
/// the constraint `max(forward, reverse) ≤ βα` of PMixED (Flemings, Razaviyayn,
/// Annavaram, "Differentially Private Next-Token Prediction of Large Language Models",
/// arXiv:2403.15638; restated in arXiv:2410.02016, §3.2, Thm. 3.1).
///
/// For integer α ∈ [2, 4096] and entries ≥ 1e-150, the constructor precomputes
/// the ratios `p/q` once, and each λ ∈ (0, 1] is then evaluated in closed form from
/// that vector and q (see `fast.rs` and `proof.md` beside this file, P5): equal to [`MixturePath::forward`] and
/// [`MixturePath::reverse`] to rounding (relative ~1e-14), with each positive value
/// rounded up one ulp. The pass that forms the ratios also forms the sums at λ = 1
/// (where the mixture is p), scaled by powers of two that follow the ratios' range, so
/// `evaluate(1.0)`, the first point every λ search probes, costs no further pass (for
/// orders up to 256; above, where every ratio stays within `e^{±600/α}`). Elsewhere (other orders, tiny entries, λ = 0, or a
/// scale that cannot keep every term representable) it is exactly those two paths
/// evaluated together (same formulas, same summation order), at half the memory traffic.
#[derive(Debug, Clone)]
pub struct SymmetricMixture<'a> {
    p: &'a [f64],
    q: &'a [f64],
    alpha: Order,
    summaries: [ProbSummary; 2],
    table: Option<RatioTable>,
}

impl<'a> SymmetricMixture<'a> {
    /// Validates `p`, `q` (probability vectors of one length) and `alpha`.
    pub fn new(p: &'a [f64], q: &'a [f64], alpha: Order) -> Result<Self> {
        let alpha = alpha.checked()?;
        let sp = validate::probabilities(p)?;
        let sq = validate::probabilities(q)?;
        Self::build(p, q, alpha, sp, sq)
    }

    /// As [`SymmetricMixture::new`] with `q` already validated once (a
    /// [`ValidatedRow`]): many private rows against one public row then pay for the
    /// public row's validation pass once, not once per row. Validates `p`, the length
    /// and `alpha`; the result is bitwise that of [`SymmetricMixture::new`].
    pub fn with_public(p: &'a [f64], q: &ValidatedRow<'a>, alpha: Order) -> Result<Self> {
        let alpha = alpha.checked()?;
        let sp = validate::probabilities(p)?;
        Self::build(p, q.row, alpha, sp, q.summary)
    }

    /// From two rows validated beforehand (many solves against the same rows pay for
    /// their validation once); validates the length and `alpha`. Bitwise the same as
    /// [`SymmetricMixture::new`] on the rows' slices.
    pub fn from_rows(p: &ValidatedRow<'a>, q: &ValidatedRow<'a>, alpha: Order) -> Result<Self> {
        let alpha = alpha.checked()?;
        Self::build(p.row, q.row, alpha, p.summary, q.summary)
    }

    fn build(
        p: &'a [f64],
        q: &'a [f64],
        alpha: Order,
        sp: ProbSummary,
        sq: ProbSummary,
    ) -> Result<Self> {
        validate::same_length(p.len(), q.len())?;
        let table = RatioTable::new(p, q, alpha, [sp, sq]);
        Ok(SymmetricMixture {
            p,
            q,
            alpha,
            summaries: [sp, sq],
            table,
        })
    }

    /// Both divergences and their slopes at `lambda` (λ ∈ [0, 1], else
    /// [`crate::RenyiError::InvalidLambda`]).
    pub fn evaluate(&self, lambda: f64) -> Result<SymmetricValue> {
        validate::lambda(lambda)?;
        if let Some((forward, reverse)) =
            self.table.as_ref().and_then(|t| t.evaluate(self.q, lambda))
        {
            return Ok(SymmetricValue { forward, reverse });
        }
        let [sp, sq] = self.summaries;
        let floor = mixture_floor(lambda, sp.min_positive, sq.min_positive);
        let ratio_ok = floor >= RATIO_PATH_MIN && sq.min_positive >= RATIO_PATH_MIN;
        let endpoint = Endpoint::of(lambda);
        let mut fwd = PathAcc::new(self.alpha, ratio_ok, endpoint);
        let mut rev = PathAcc::new(self.alpha, ratio_ok, endpoint);
        // Forward reads (m, n, m', n') = (mix, q, p − q, 0); reverse (q, mix, 0, p − q).
        let mut f = PathChunk::new();
        let mut r = PathChunk::new();
        let mu = 1.0 - lambda;
        for (pc, qc) in self.p.chunks(CHUNK).zip(self.q.chunks(CHUNK)) {
            if pc.len() < CHUNK {
                f = PathChunk::new();
                r = PathChunk::new();
            }
            for i in 0..pc.len() {
                let (p, q) = (pc[i], qc[i]);
                let mix = lambda * p + mu * q;
                f.m[i] = mix;
                f.n[i] = q;
                f.dm[i] = p - q;
                r.m[i] = q;
                r.n[i] = mix;
                r.dn[i] = p - q;
            }
            fwd.add(&f);
            rev.add(&r);
        }
        Ok(SymmetricValue {
            forward: fwd.finish(),
            reverse: rev.finish(),
        })
    }
}
