//! Kernels in log space: they take log-probabilities (given, or `ln` of probabilities
//! whose tiny entries rule out the ratio kernels) and never form a ratio or a power.
//!
//! For a finite order, with `n = α − 1`, `t_x = α·lp_x − n·lq_x = lp_x + n·(lp_x − lq_x)`
//! over the support of `p`, and `L(v) = log Σ exp(v)`:
//!
//! `D_α(p/P ‖ q/Q) = (L(t) − L(lp))/n + (L(lq) − L(lp))`.
//!
//! All three log-sum-exps stream over the same chunks, so for `lp = lq` bitwise the
//! result is exactly 0. If some `t_x` overflows (finite but astronomically negative
//! `lq`, or an astronomically large α) the sum is redone on `t/n`, which cannot overflow.
//! The identity and the stability argument are in `proof.md` beside this file.

use crate::kernel::{Buf, CHUNK, SMALL_EXPONENT, ScaledLse, lane_max, lane_sum};
use crate::validate::Probability;

/// A vector of log-probabilities read chunk by chunk.
pub(crate) trait LogSource {
    /// Number of entries.
    fn len(&self) -> usize;
    /// Writes the log-values of entries `start..start + CHUNK` (fewer at the end) into
    /// `out`, padding the rest with `−∞`.
    fn fill(&self, start: usize, out: &mut Buf);
}

/// Log-probabilities given as such.
pub(crate) struct Logs<'a>(pub &'a [f64]);

/// Probabilities, logged on the fly.
pub(crate) struct LnOf<'a, T>(pub &'a [T]);

impl LogSource for Logs<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn fill(&self, start: usize, out: &mut Buf) {
        let src = &self.0[start..self.0.len().min(start + CHUNK)];
        out[..src.len()].copy_from_slice(src);
        out[src.len()..].fill(f64::NEG_INFINITY);
    }
}

impl<T: Probability> LogSource for LnOf<'_, T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn fill(&self, start: usize, out: &mut Buf) {
        let src = &self.0[start..self.0.len().min(start + CHUNK)];
        for (dst, &x) in out.iter_mut().zip(src) {
            *dst = x.to_f64().ln();
        }
        out[src.len()..].fill(f64::NEG_INFINITY);
    }
}

/// Walks both sources chunk by chunk.
fn for_chunks<S: LogSource>(lp: &S, lq: &S, mut f: impl FnMut(&Buf, &Buf) -> bool) {
    let (mut bp, mut bq) = ([0.0; CHUNK], [0.0; CHUNK]);
    let mut start = 0;
    while start < lp.len() {
        lp.fill(start, &mut bp);
        lq.fill(start, &mut bq);
        if !f(&bp, &bq) {
            return;
        }
        start += CHUNK;
    }
}

/// True when some entry has `p > 0 = q` in this chunk.
fn support_violated(bp: &Buf, bq: &Buf) -> bool {
    bp.iter()
        .zip(bq)
        .any(|(&a, &b)| a > f64::NEG_INFINITY && b == f64::NEG_INFINITY)
}

/// `D_α(p/P ‖ q/Q)` for a finite `α = n + 1`.
pub(crate) fn finite<S: LogSource>(lp: &S, lq: &S, n: f64) -> f64 {
    if n < SMALL_EXPONENT
        && let Some(d) = finite_small(lp, lq, n)
    {
        return d;
    }
    finite_direct(lp, lq, n).unwrap_or_else(|| finite_rescaled(lp, lq, n))
}

/// The log-sum-exp of `t`; `None` if some `t_x` overflowed.
fn finite_direct<S: LogSource>(lp: &S, lq: &S, n: f64) -> Option<f64> {
    let (mut lt, mut lsp, mut lsq) = (
        ScaledLse::new(1.0),
        ScaledLse::new(1.0),
        ScaledLse::new(1.0),
    );
    let mut t = [0.0; CHUNK];
    let mut outcome = None;
    for_chunks(lp, lq, |bp, bq| {
        for ((dst, &a), &b) in t.iter_mut().zip(bp).zip(bq) {
            *dst = if a > f64::NEG_INFINITY {
                a + n * (a - b)
            } else {
                f64::NEG_INFINITY
            };
        }
        if lane_max(&t, f64::NEG_INFINITY) == f64::INFINITY {
            outcome = Some(if support_violated(bp, bq) {
                Some(f64::INFINITY)
            } else {
                None
            });
            return false;
        }
        lt.add_chunk(&t);
        lsp.add_chunk(bp);
        lsq.add_chunk(bq);
        true
    });
    match outcome {
        Some(early) => early,
        None => {
            let (lp_sum, lq_sum) = (lsp.value(), lsq.value());
            Some((lt.value() - lp_sum) / n + (lq_sum - lp_sum))
        }
    }
}

/// The same divergence from `u = t/n`, summed as `Σ exp(n·u)`: slower to converge in
/// precision for small `n`, but free of overflow for any finite input and order.
fn finite_rescaled<S: LogSource>(lp: &S, lq: &S, n: f64) -> f64 {
    let (mut lu, mut lsp, mut lsq) = (ScaledLse::new(n), ScaledLse::new(1.0), ScaledLse::new(1.0));
    let mut u = [0.0; CHUNK];
    let mut violated = false;
    for_chunks(lp, lq, |bp, bq| {
        if support_violated(bp, bq) {
            violated = true;
            return false;
        }
        for ((dst, &a), &b) in u.iter_mut().zip(bp).zip(bq) {
            *dst = if a > f64::NEG_INFINITY {
                a / n + (a - b)
            } else {
                f64::NEG_INFINITY
            };
        }
        lu.add_chunk(&u);
        lsp.add_chunk(bp);
        lsq.add_chunk(bq);
        true
    });
    if violated {
        return f64::INFINITY;
    }
    let (lp_sum, lq_sum) = (lsp.value(), lsq.value());
    (lu.value_over_kappa() - lp_sum / n) + (lq_sum - lp_sum)
}

/// `D = log1p(T/P)/n + log(Q/P)`, `T = Σ p·expm1(n·(lp − lq))`, for small `n`; `None`
/// when some `n·(lp − lq) > 40`, where `T` could lose small terms to overflow scaling.
fn finite_small<S: LogSource>(lp: &S, lq: &S, n: f64) -> Option<f64> {
    let (mut t_sum, mut p_sum, mut q_sum) = (0.0, 0.0, 0.0);
    let (mut ep, mut eq, mut term) = ([0.0; CHUNK], [0.0; CHUNK], [0.0; CHUNK]);
    let mut outcome = None;
    for_chunks(lp, lq, |bp, bq| {
        if support_violated(bp, bq) {
            outcome = Some(Some(f64::INFINITY));
            return false;
        }
        for i in 0..CHUNK {
            let (a, b) = (bp[i], bq[i]);
            ep[i] = a.exp();
            eq[i] = b.exp();
            term[i] = if a > f64::NEG_INFINITY {
                n * (a - b)
            } else {
                0.0
            };
        }
        if lane_max(&term, 0.0) > 40.0 {
            outcome = Some(None);
            return false;
        }
        for (v, &e) in term.iter_mut().zip(&ep) {
            *v = e * v.exp_m1();
        }
        t_sum += lane_sum(&term);
        p_sum += lane_sum(&ep);
        q_sum += lane_sum(&eq);
        true
    });
    match outcome {
        Some(early) => early,
        None => Some((t_sum / p_sum).ln_1p() / n + (q_sum / p_sum).ln()),
    }
}

/// `D_∞(p/P ‖ q/Q) = max_{p_x>0} (lp_x − lq_x) + L(lq) − L(lp)`.
pub(crate) fn infinite<S: LogSource>(lp: &S, lq: &S) -> f64 {
    let (mut lsp, mut lsq) = (ScaledLse::new(1.0), ScaledLse::new(1.0));
    let mut d_max = f64::NEG_INFINITY;
    let mut d = [0.0; CHUNK];
    for_chunks(lp, lq, |bp, bq| {
        for ((dst, &a), &b) in d.iter_mut().zip(bp).zip(bq) {
            *dst = if a > f64::NEG_INFINITY {
                a - b
            } else {
                f64::NEG_INFINITY
            };
        }
        d_max = d_max.max(lane_max(&d, f64::NEG_INFINITY));
        lsp.add_chunk(bp);
        lsq.add_chunk(bq);
        d_max < f64::INFINITY
    });
    if d_max == f64::INFINITY {
        return f64::INFINITY;
    }
    d_max + (lsq.value() - lsp.value())
}

/// `KL(p/P ‖ q/Q) = Σ exp(lp − L(lp))·(lp − lq) + L(lq) − L(lp)`, in two passes (the
/// first finds the normalisers). A term whose weight underflows but whose log-ratio is
/// huge is formed as `exp(w + log|d|)` so that it is not lost.
pub(crate) fn kl<S: LogSource>(lp: &S, lq: &S) -> f64 {
    let (mut lsp, mut lsq) = (ScaledLse::new(1.0), ScaledLse::new(1.0));
    let mut violated = false;
    for_chunks(lp, lq, |bp, bq| {
        violated = support_violated(bp, bq);
        lsp.add_chunk(bp);
        lsq.add_chunk(bq);
        !violated
    });
    if violated {
        return f64::INFINITY;
    }
    let (lp_sum, lq_sum) = (lsp.value(), lsq.value());
    let mut total = 0.0;
    let mut term = [0.0; CHUNK];
    for_chunks(lp, lq, |bp, bq| {
        for ((dst, &a), &b) in term.iter_mut().zip(bp).zip(bq) {
            *dst = if a > f64::NEG_INFINITY {
                let (w, d) = (a - lp_sum, a - b);
                if w < -700.0 && d.abs() > 1.0 {
                    d.signum() * (w + d.abs().ln()).exp()
                } else {
                    w.exp() * d
                }
            } else {
                0.0
            };
        }
        total += lane_sum(&term);
        true
    });
    total + (lq_sum - lp_sum)
}
