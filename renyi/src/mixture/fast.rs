//! The fast path of [`crate::SymmetricMixture`] for integer orders: both directions of
//! `D_α(λp + (1−λ)q ‖ q)` and `D_α(q ‖ λp + (1−λ)q)`, with their λ-slopes, from one
//! pass over two precomputed vectors, with no `powf`, `exp` or `ln` per element.
//!
//! With `r_x = p_x/q_x` and `d_x = r_x − 1` on the support of q and
//! `t_x = (1−λ) + λ·r_x = 1 + λ·d_x` (so that the mixture is `q_x·t_x`), the unnormalised sums of [`super::kernel`] become
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
//! The pass that forms `r` (`ratio_pass.rs`) also forms the four sums at λ = 1 (`t = r`),
//! scaled by powers of two that follow the running extremes of r, so a solve's first
//! probe rides on the table's construction whatever the ratios' range (for orders up to
//! 256; above, only where `α·|ln r|` stays below 600 for the extreme ratios).
//!
//! Only used where every non-zero entry of p and q is at least `RATIO_PATH_MIN` (so
//! `r ∈ [0, 1e150]`) and `2 ≤ α ≤ MAX_ORDER`; otherwise, and at λ = 0, the general
//! chunked kernels answer. The values agree with [`crate::divergence`] on the explicit
//! mixture to rounding (a few ulps of the terms, amplified by at most α), and each
//! positive value is rounded up by one ulp so that rounding errs on the safe side.
//! The derivation and the scaling argument are in `proof.md` beside this file (P5).

use super::ratio_pass::{AtOneSums, MIN_SCALED_SUM, Ratios, SCALED_MAX_ORDER, pow2};
use crate::kernel::{LANES, PW, RATIO_PATH_MIN, combine, non_negative, pow8, powi_u32};
use crate::round::step_up;
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
    /// `Σp` and `Σq` as validation summed them, for the normalisations
    /// `M = λΣp + (1−λ)Σq`.
    p_total: f64,
    q_total: f64,
    /// Some `q_x = 0 < p_x`: the forward divergence is `+∞` for every λ > 0.
    off_support: bool,
    /// Both directions at λ = 1, from the sums the ratio pass formed on the way
    /// (see [`RatioTable::new`]); `None` where they could not be trusted.
    at_one: Option<Pair>,
}

impl Drop for RatioTable {
    fn drop(&mut self) {
        spare::give(std::mem::take(&mut self.r));
    }
}

/// Ratio buffers of dropped tables, kept per thread for the next table built there.
///
/// Why: a table is built per member per token (hundreds per step, each a
/// vocabulary-sized buffer). A fresh buffer is memory the cache has never seen: filling
/// it reads every line first (and page faults when the allocator maps new pages); a
/// reused one is more likely still in cache. The buffer's old contents are never read: the ratio pass writes every entry.
mod spare {
    use std::cell::RefCell;

    /// Buffers kept per thread (two per thread cover a table being built while another
    /// is alive).
    const KEPT: usize = 2;

    thread_local! {
        static SPARE: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
    }

    /// A buffer of `len` entries, reused where this thread has one (contents arbitrary).
    pub(super) fn take(len: usize) -> Vec<f64> {
        let reused = SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten();
        match reused {
            Some(mut r) => {
                // Same vocabulary as last time: no write at all.
                r.resize(len, 1.0);
                r
            }
            None => vec![1.0; len],
        }
    }

    /// Keeps `r` for the next [`take`] on this thread (dropped if enough are kept, or
    /// while the thread is exiting).
    pub(super) fn give(r: Vec<f64>) {
        if r.capacity() == 0 {
            return;
        }
        let _ = SPARE.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut()
                && s.len() < KEPT
            {
                s.push(r);
            }
        });
    }
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
        let mut r = spare::take(p.len());
        let pass = |careful, r: &mut Vec<f64>| {
            pulp::Arch::new().dispatch(Ratios {
                p,
                q,
                r,
                k,
                careful,
            })
        };
        let mut out = pass(false, &mut r);
        if !out.check.is_finite() {
            // Some q_x = 0.
            out = pass(true, &mut r);
        }
        let (r_min, r_max) = (out.r_min, out.r_max);
        if !(r_min.is_finite() && r_max.is_finite()) {
            return None;
        }
        let mut table = RatioTable {
            k,
            r,
            r_min,
            r_max,
            p_total: sp.sum,
            q_total: sq.sum,
            off_support: out.off > 0.0,
            at_one: None,
        };
        table.at_one = table.at_one(&out.at_one);
        Some(table)
    }

    /// Both directions at λ = 1 from the pass's sums (see `ratio_pass.rs`), or `None`
    /// where they cannot be trusted.
    fn at_one(&self, at: &AtOneSums) -> Option<Pair> {
        if at.failed {
            return None;
        }
        let (k, alpha) = (self.k, f64::from(self.k));
        let scaled = k <= SCALED_MAX_ORDER;
        let [a_s, b_s, c_s, d_s] = at.sums;
        // Scaled sums this small could carry the roundings of subnormal results (an
        // infinite direction's sums are not used).
        let forward_ok = self.off_support || a_s >= MIN_SCALED_SUM;
        let reverse_ok = self.r_min == 0.0 || c_s >= MIN_SCALED_SUM;
        if scaled && !(forward_ok && reverse_ok) {
            return None;
        }
        // Where every power of every ratio stays within e^{±600}, the unscaled sums
        // are representable (and the largest terms, ≥ 1 since min r ≤ 1 ≤ max r, keep
        // full precision): formed from them, the values are those of the unscaled
        // pass the scaled one multiplies by powers of two.
        let in_range = self.r_min > 0.0
            && alpha * self.r_max.ln() < MIN_SCALED_LOG_RANGE
            && -alpha * self.r_min.ln() < MIN_SCALED_LOG_RANGE;
        if in_range {
            let [a, b, c, d] = at.unscaled(k);
            if a > 0.0
                && c > 0.0
                && a.is_finite()
                && c.is_finite()
                && b.is_finite()
                && d.is_finite()
            {
                return Some(self.pair(1.0, a.ln(), b / a, c.ln(), d / c));
            }
        }
        if !(scaled && a_s.is_finite() && b_s.is_finite()) {
            return None;
        }
        // Scaled by 2^E (forward) and 2^F (reverse), as `evaluate` scales by the
        // extremes of t: Σ q·r^k = 2^{Ek}·a_s, Σ q·r^{1−k} = 2^{−Fk}·c_s.
        let (hi, lo) = (pow2(at.e_hi.into()), pow2(at.e_lo.into()));
        let log_sf = alpha * hi.ln() + a_s.ln();
        let forward_rate = b_s / (hi * a_s);
        if self.r_min == 0.0 {
            // p = 0 < q somewhere: the reverse divergence at λ = 1 is +∞ (what the
            // general kernels return there), whatever the reverse sums hold.
            let (forward, _) = self.pair(1.0, log_sf, forward_rate, 0.0, 0.0);
            let infinite = ValueAndSlope {
                value: f64::INFINITY,
                slope: f64::INFINITY,
            };
            return Some((forward, infinite));
        }
        if !(c_s.is_finite() && d_s.is_finite()) {
            return None;
        }
        Some(self.pair(
            1.0,
            log_sf,
            forward_rate,
            -alpha * lo.ln() + c_s.ln(),
            d_s / c_s,
        ))
    }

    /// Both directions at `lambda ∈ (0, 1]` (the caller checks the range), or `None`
    /// where the scaling cannot keep every term representable.
    pub(crate) fn evaluate(&self, q: &[f64], lambda: f64) -> Option<Pair> {
        if !(lambda > 0.0 && lambda <= 1.0) {
            return None;
        }
        if lambda == 1.0
            && let Some(pair) = self.at_one
        {
            return Some(pair);
        }
        let keep = 1.0 - lambda;
        let t_max = keep + lambda * self.r_max;
        let t_min = keep + lambda * self.r_min;
        if !(t_min > 0.0 && t_max.is_finite()) {
            return None;
        }
        let alpha = f64::from(self.k);
        // Scaled by t_min (one power chain and one division per element) where
        // `(t_max/t_min)^α` stays far from overflow, else by both extremes.
        let (log_sf, forward_rate, log_sr, reverse_rate) =
            if alpha * (t_max / t_min).ln() < MIN_SCALED_LOG_RANGE {
                let [a, b, c, d] = min_scaled_sums(q, &self.r, lambda, t_min, self.k);
                if !(a > 0.0 && c > 0.0 && a.is_finite() && c.is_finite()) {
                    return None;
                }
                (
                    alpha * t_min.ln() + a.ln(),
                    b / (t_min * a),
                    -alpha * t_min.ln() + c.ln(),
                    d / c,
                )
            } else {
                let (sf, gf, sr, gr) = self.sums(q, lambda, t_min, t_max);
                if !(sf > 0.0 && sr > 0.0 && sf.is_finite() && sr.is_finite()) {
                    return None;
                }
                (
                    alpha * t_max.ln() + sf.ln(),
                    gf / (t_max * sf),
                    -alpha * t_min.ln() + sr.ln(),
                    gr / sr,
                )
            };
        Some(self.pair(lambda, log_sf, forward_rate, log_sr, reverse_rate))
    }

    /// Both directions from the logs of the forward and reverse sums `Σ q·t^α` and
    /// `Σ q·t^{1−α}` and their relative rates (`S'/(αS)`-style factors as
    /// [`RatioTable::evaluate`] forms them).
    fn pair(
        &self,
        lambda: f64,
        log_sf: f64,
        forward_rate: f64,
        log_sr: f64,
        reverse_rate: f64,
    ) -> Pair {
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
            let value = (log_sf - alpha * mix_total.ln()) / e + qt.ln();
            let rate = alpha * forward_rate;
            ValueAndSlope {
                value: round_up(value),
                slope: rate / e - (alpha / e) * (norm_slope / mix_total),
            }
        };
        let value = (log_sr - alpha * qt.ln()) / e + mix_total.ln();
        let reverse = ValueAndSlope {
            value: round_up(value),
            slope: -reverse_rate + norm_slope / mix_total,
        };
        (forward, reverse)
    }

    /// `(Σ q·v^α, Σ q·v^{α−1}·d, Σ q·t·u^α, Σ q·u^α·d)` with `d = r − 1`, `v = t/t_max`,
    /// `u = t_min/t`, in `LANES` interleaved accumulators per sum.
    fn sums(&self, q: &[f64], lambda: f64, t_min: f64, t_max: f64) -> (f64, f64, f64, f64) {
        let inv_max = 1.0 / t_max;
        let k = self.k;
        let mut acc = [[0.0_f64; LANES]; 4];
        // Compiled for the best vector width this CPU has (AVX-512, AVX2+FMA or
        // baseline): `block` is inlined into pulp's `#[target_feature]` frame.
        let body = q.len() - q.len() % PW;
        acc = pulp::Arch::new().dispatch(Sums {
            acc,
            q: &q[..body],
            r: &self.r[..body],
            lambda,
            t_min,
            inv_max,
            k,
        });
        let (q_tail, d_tail) = (&q[body..], &self.r[body..]);
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

/// `α·ln(t_max/t_min)` below which [`min_scaled_sums`] serves: every `y^α` then
/// stays below `e^600 ≈ 1e260` and every `y^{−α}` above `1e-260`.
const MIN_SCALED_LOG_RANGE: f64 = 600.0;

/// `[Σ q·y^k, Σ q·y^{k−1}·d, Σ q·t·y^{−k}, Σ q·y^{−k}·d]` with `t = (1−λ) + λr`,
/// `y = t/t_min ≥ 1` and `d = r − 1`: the sums of [`RatioTable::sums`] scaled by
/// `t_min` alone (`u = 1/y`), for a ratio range where no term can overflow.
fn min_scaled_sums(q: &[f64], r: &[f64], lambda: f64, t_min: f64, k: u32) -> [f64; 4] {
    let inv_min = 1.0 / t_min;
    let keep = 1.0 - lambda;
    pulp::Arch::new().dispatch(MinScaled {
        q,
        r,
        keep,
        lambda,
        inv_min,
        k,
    })
}

/// Vectors per block of [`MinScaled`]: independent chains that hide the
/// multiplications' latency and the exponent loop's tests.
const U: usize = 4;

struct MinScaled<'a> {
    q: &'a [f64],
    r: &'a [f64],
    keep: f64,
    lambda: f64,
    inv_min: f64,
    k: u32,
}

impl pulp::WithSimd for MinScaled<'_> {
    type Output = [f64; 4];

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> [f64; 4] {
        let MinScaled {
            q,
            r,
            keep,
            lambda,
            inv_min,
            k,
        } = self;
        let qv = S::as_simd_f64s(q).0;
        let rv = S::as_simd_f64s(r).0;
        let zero = simd.splat_f64s(0.0);
        let (one, keep_v, lambda_v, inv_v) = (
            simd.splat_f64s(1.0),
            simd.splat_f64s(keep),
            simd.splat_f64s(lambda),
            simd.splat_f64s(inv_min),
        );
        let mut acc = [[zero; U]; 4];
        let (qb, rb) = (qv.chunks_exact(U), rv.chunks_exact(U));
        let q_rest = qb.remainder();
        for (qb, rb) in qb.zip(rb) {
            let mut t = [zero; U];
            let mut d = [zero; U];
            let mut y = [zero; U];
            for j in 0..U {
                t[j] = simd.mul_add_f64s(lambda_v, rb[j], keep_v);
                d[j] = simd.sub_f64s(rb[j], one);
                y[j] = simd.mul_f64s(t[j], inv_v);
            }
            let yk1 = crate::simd::pow_vectors(simd, y, k - 1);
            for j in 0..U {
                let qk1 = simd.mul_f64s(qb[j], yk1[j]);
                let yk = simd.mul_f64s(yk1[j], y[j]);
                let qz = simd.div_f64s(qb[j], yk);
                acc[0][j] = simd.mul_add_f64s(qk1, y[j], acc[0][j]);
                acc[1][j] = simd.mul_add_f64s(qk1, d[j], acc[1][j]);
                acc[2][j] = simd.mul_add_f64s(qz, t[j], acc[2][j]);
                acc[3][j] = simd.mul_add_f64s(qz, d[j], acc[3][j]);
            }
        }
        let mut out = [0.0; 4];
        for (o, a) in out.iter_mut().zip(acc) {
            let mut v = a[0];
            for x in &a[1..] {
                v = simd.add_f64s(v, *x);
            }
            *o = simd.reduce_sum_f64s(v);
        }
        // The last vectors and elements, one at a time in scalar arithmetic.
        let lanes = size_of::<S::f64s>() / size_of::<f64>();
        let start = (qv.len() - q_rest.len()) * lanes;
        for x in start..q.len() {
            let (qx, rx) = (q[x], r[x]);
            let t = keep + lambda * rx;
            let d = rx - 1.0;
            let y = t * inv_min;
            let yk1 = powi_u32(y, k - 1);
            let yk = yk1 * y;
            let qz = qx / yk;
            out[0] += qx * yk1 * y;
            out[1] += qx * yk1 * d;
            out[2] += qz * t;
            out[3] += qz * d;
        }
        out
    }
}

/// The whole blocks of [`RatioTable::sums`], as a `pulp` operation.
struct Sums<'a> {
    acc: [[f64; LANES]; 4],
    q: &'a [f64],
    r: &'a [f64],
    lambda: f64,
    t_min: f64,
    inv_max: f64,
    k: u32,
}

impl pulp::WithSimd for Sums<'_> {
    type Output = [[f64; LANES]; 4];

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> Self::Output {
        let mut acc = self.acc;
        for (qb, db) in self.q.chunks_exact(PW).zip(self.r.chunks_exact(PW)) {
            block(
                &mut acc,
                qb,
                db,
                self.lambda,
                self.t_min,
                self.inv_max,
                self.k,
            );
        }
        acc
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
    // Plain loops, not `array::from_fn` closures, so that everything is inlined into
    // the caller's `#[target_feature]` frame.
    let (mut t, mut d, mut v, mut u) = ([0.0; PW], [0.0; PW], [0.0; PW], [0.0; PW]);
    for j in 0..PW {
        t[j] = keep + lambda * db[j];
        // `r − 1` is exact for r ∈ [1/2, 2] (Sterbenz) and within an ulp of 1 elsewhere.
        d[j] = db[j] - 1.0;
        v[j] = at_most_one(t[j] * inv_max);
        u[j] = at_most_one(t_min / t[j]);
    }
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
/// positive, moved up one ulp ([`crate::round::step_up`]) so that the last rounding of
/// the closed forms never lowers it. This is not an enclosure of the exact divergence
/// (the sums carry many roundings): callers that must bound the exact value enlarge
/// their margin by the error model of `privmix-mixing`'s `enforced_radius`.
fn round_up(value: f64) -> f64 {
    let v = non_negative(value);
    if v > 0.0 { step_up(v) } else { v }
}

#[cfg(test)]
mod tests;
