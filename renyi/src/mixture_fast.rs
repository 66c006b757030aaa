//! The fast path of [`crate::SymmetricMixture`] for integer orders: both directions of
//! `D_α(λp + (1−λ)q ‖ q)` and `D_α(q ‖ λp + (1−λ)q)`, with their λ-slopes, from one
//! pass over two precomputed vectors, with no `powf`, `exp` or `ln` per element.
//!
//! With `r_x = p_x/q_x` and `d_x = r_x − 1` on the support of q and
//! `t_x = (1−λ) + λ·r_x = 1 + λ·d_x` (so that the mixture is `q_x·t_x`), the unnormalised sums of [`crate::mixture_kernel`] become
//!
//! * forward: `S = Σ q·t^α`, `S' = α·Σ q·t^{α−1}·d`;
//! * reverse: `S = Σ q·t^{1−α}`, `S' = (1−α)·Σ q·t^{−α}·d`.
//!
//! `t` is computed as `(1−λ) + λ·r`, a sum of two non-negative terms, so its relative error
//! is a few ulps even where `r` is tiny; `1 + λ·d` would cancel there (at `r = 2e-5`,
//! `1 + d` keeps only the top 37 bits of `r`, and `t^α` amplifies the loss α-fold).
//!
//! Every term is scaled by the extreme `t` (computed in O(1) from the extreme `r`, and
//! bounding every element's `t` because rounding is monotone): the forward powers
//! `(t/t_max)^k` and reverse powers `(t_min/t)^α` lie in [0, 1], so nothing overflows,
//! and an element that underflows is below `2^-1022` of the largest term. Powers are
//! repeated squaring on blocks of [`PW`] elements in independent lanes.
//!
//! Only used where every non-zero entry of p and q is at least `RATIO_PATH_MIN` (so
//! `r ∈ [0, 1e150]`) and `2 ≤ α ≤ MAX_ORDER`; otherwise, and at λ = 0, the general
//! chunked kernels answer. The values agree with [`crate::divergence`] on the explicit
//! mixture to rounding (a few ulps of the terms, amplified by at most α), and each
//! positive value is rounded up by one ulp so that rounding errs on the safe side.

use crate::kernel::{LANES, PW, RATIO_PATH_MIN, combine, non_negative, pow8};
use crate::validate::ProbSummary;
use crate::{Order, ValueAndSlope};

/// Largest integer order served here: powers cost `2·log₂ α` multiplications.
const MAX_ORDER: u32 = 1 << 12;

/// `r = p/q` and the sums the closed forms need, computed once per pair.
#[derive(Debug, Clone)]
pub(crate) struct RatioTable {
    k: u32,
    /// `p_x/q_x` where `q_x > 0`, 1 where `q_x = 0` (whose weight q is 0, and where
    /// `t = 1` stays finite).
    r: Vec<f64>,
    r_min: f64,
    r_max: f64,
    /// `Σp` and `Σq`, for the normalisations `M = λΣp + (1−λ)Σq`.
    p_total: f64,
    q_total: f64,
    /// Some `q_x = 0 < p_x`: the forward divergence is `+∞` for every λ > 0.
    off_support: bool,
}

/// Both directions at one λ, or `None` where the general kernels must answer.
pub(crate) type Pair = (ValueAndSlope, ValueAndSlope);

impl RatioTable {
    /// The table, or `None` where the fast path does not apply.
    pub(crate) fn new(
        p: &[f64],
        q: &[f64],
        alpha: Order,
        summaries: [ProbSummary; 2],
    ) -> Option<Self> {
        let k = alpha.integer().filter(|&k| (2..=MAX_ORDER).contains(&k))?;
        let [sp, sq] = summaries;
        if sp.min_positive < RATIO_PATH_MIN || sq.min_positive < RATIO_PATH_MIN {
            return None;
        }
        let mut r = vec![1.0; p.len()];
        let (mut lo, mut hi) = ([f64::INFINITY; LANES], [f64::NEG_INFINITY; LANES]);
        let (mut ps, mut qs, mut off) = ([0.0; LANES], [0.0; LANES], [0.0; LANES]);
        // Branch-free (selects, not `f64::min`) so that it vectorises; `p/0` is
        // computed and discarded where q = 0.
        let mut blocks = r.chunks_exact_mut(LANES);
        let (mut pb, mut qb) = (p.chunks_exact(LANES), q.chunks_exact(LANES));
        for ((db, pv), qv) in (&mut blocks).zip(&mut pb).zip(&mut qb) {
            for j in 0..LANES {
                let (pv, qv) = (pv[j], qv[j]);
                ps[j] += pv;
                qs[j] += qv;
                let on = qv > 0.0;
                let raw = pv / qv;
                let dv = if on { raw } else { 1.0 };
                db[j] = dv;
                let (l, h) = (if on { dv } else { lo[j] }, if on { dv } else { hi[j] });
                lo[j] = if l < lo[j] { l } else { lo[j] };
                hi[j] = if h > hi[j] { h } else { hi[j] };
                off[j] += if on { 0.0 } else { pv };
            }
        }
        let (db, pv, qv) = (blocks.into_remainder(), pb.remainder(), qb.remainder());
        for j in 0..db.len() {
            ps[j] += pv[j];
            qs[j] += qv[j];
            if qv[j] > 0.0 {
                let dv = pv[j] / qv[j];
                db[j] = dv;
                lo[j] = lo[j].min(dv);
                hi[j] = hi[j].max(dv);
            } else {
                off[j] += pv[j];
            }
        }
        let r_min = lo.into_iter().fold(f64::INFINITY, f64::min);
        let r_max = hi.into_iter().fold(f64::NEG_INFINITY, f64::max);
        if !(r_min.is_finite() && r_max.is_finite()) {
            return None;
        }
        Some(RatioTable {
            k,
            r,
            r_min,
            r_max,
            p_total: combine(ps),
            q_total: combine(qs),
            off_support: combine(off) > 0.0,
        })
    }

    /// Both directions at `lambda ∈ (0, 1]` (the caller checks the range), or `None`
    /// where the scaling cannot keep every term representable.
    pub(crate) fn evaluate(&self, q: &[f64], lambda: f64) -> Option<Pair> {
        if !(lambda > 0.0 && lambda <= 1.0) {
            return None;
        }
        let keep = 1.0 - lambda;
        let t_max = keep + lambda * self.r_max;
        let t_min = keep + lambda * self.r_min;
        if !(t_min > 0.0 && t_max.is_finite()) {
            return None;
        }
        let (sf, gf, sr, gr) = self.sums(q, lambda, t_min, t_max);
        if !(sf > 0.0 && sr > 0.0 && sf.is_finite() && sr.is_finite()) {
            return None;
        }
        let alpha = f64::from(self.k);
        let e = alpha - 1.0;
        let (pt, qt) = (self.p_total, self.q_total);
        let mix_total = if pt == qt {
            qt
        } else {
            lambda * pt + (1.0 - lambda) * qt
        };
        let norm_slope = pt - qt;
        let infinite = ValueAndSlope {
            value: f64::INFINITY,
            slope: f64::INFINITY,
        };
        let forward = if self.off_support {
            infinite
        } else {
            // D = (log S − α log M)/e + log N with M = mix_total, N = Σq.
            let log_s = alpha * t_max.ln() + sf.ln();
            let value = (log_s - alpha * mix_total.ln()) / e + qt.ln();
            let rate = alpha * gf / (t_max * sf);
            ValueAndSlope {
                value: round_up(value),
                slope: rate / e - (alpha / e) * (norm_slope / mix_total),
            }
        };
        let log_s = -alpha * t_min.ln() + sr.ln();
        let value = (log_s - alpha * qt.ln()) / e + mix_total.ln();
        let reverse = ValueAndSlope {
            value: round_up(value),
            slope: -gr / sr + norm_slope / mix_total,
        };
        Some((forward, reverse))
    }

    /// `(Σ q·v^α, Σ q·v^{α−1}·d, Σ q·t·u^α, Σ q·u^α·d)` with `d = r − 1`, `v = t/t_max`,
    /// `u = t_min/t`, in `LANES` interleaved accumulators per sum.
    fn sums(&self, q: &[f64], lambda: f64, t_min: f64, t_max: f64) -> (f64, f64, f64, f64) {
        let inv_max = 1.0 / t_max;
        let k = self.k;
        let mut acc = [[0.0_f64; LANES]; 4];
        let (qb, db) = (q.chunks_exact(PW), self.r.chunks_exact(PW));
        let (q_tail, d_tail) = (qb.remainder(), db.remainder());
        for (qb, db) in qb.zip(db) {
            block(&mut acc, qb, db, lambda, t_min, inv_max, k);
        }
        if !q_tail.is_empty() {
            // Padding: q = 0 contributes nothing; r = 1 keeps t = 1 finite.
            let (mut qp, mut dp) = ([0.0; PW], [1.0; PW]);
            qp[..q_tail.len()].copy_from_slice(q_tail);
            dp[..d_tail.len()].copy_from_slice(d_tail);
            block(&mut acc, &qp, &dp, lambda, t_min, inv_max, k);
        }
        (
            combine(acc[0]),
            combine(acc[1]),
            combine(acc[2]),
            combine(acc[3]),
        )
    }
}

/// One block of [`RatioTable::sums`], inlined so that its arrays stay in registers.
#[inline(always)]
fn block(
    acc: &mut [[f64; LANES]; 4],
    qb: &[f64],
    db: &[f64],
    lambda: f64,
    t_min: f64,
    inv_max: f64,
    k: u32,
) {
    let (qb, db): (&[f64; PW], &[f64; PW]) = match (qb.try_into(), db.try_into()) {
        (Ok(q), Ok(d)) => (q, d),
        _ => return,
    };
    let keep = 1.0 - lambda;
    let t: [f64; PW] = std::array::from_fn(|j| keep + lambda * db[j]);
    // `r − 1` is exact for r ∈ [1/2, 2] (Sterbenz) and within an ulp of 1 elsewhere.
    let d: [f64; PW] = std::array::from_fn(|j| db[j] - 1.0);
    let v: [f64; PW] = std::array::from_fn(|j| at_most_one(t[j] * inv_max));
    let u: [f64; PW] = std::array::from_fn(|j| at_most_one(t_min / t[j]));
    let vk1 = pow8(v, k - 1);
    let uk = pow8(u, k);
    for j in 0..PW {
        let l = j % LANES;
        let qv = qb[j] * vk1[j];
        let qu = qb[j] * uk[j];
        acc[0][l] += qv * v[j];
        acc[1][l] += qv * d[j];
        acc[2][l] += qu * t[j];
        acc[3][l] += qu * d[j];
    }
}

/// `min(x, 1)` as a select (no NaN here), which compiles to one vector instruction.
#[inline(always)]
fn at_most_one(x: f64) -> f64 {
    if x > 1.0 { 1.0 } else { x }
}

/// A computed divergence, clamped at 0 (rounding can only make it negative) and, when
/// positive, moved up one ulp so that the rounding of the closed forms never lowers it.
fn round_up(value: f64) -> f64 {
    let v = non_negative(value);
    if v > 0.0 && v.is_finite() {
        v.next_up()
    } else {
        v
    }
}
