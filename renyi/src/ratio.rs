//! Kernels on probability vectors whose non-zero entries are all ≥ [`RATIO_PATH_MIN`]:
//! they work on the ratios `r_x = p_x / q_x`, which then lie in `[1e-150, 1e150]`.
//!
//! For a finite order, with `n = α − 1`, `P = Σp`, `Q = Σq` (both ≈ 1) and
//! `r* = max_{p_x>0} r_x`, the divergence of the normalised vectors `p/P`, `q/Q` is
//!
//! `D = log r* + log(Q/P) + log(S/P)/n`,   `S = Σ_{p_x>0} p_x · (r_x / r*)^n`,
//!
//! since `Σ p^α q^{1−α} = Σ p·r^n = r*^n·S`. Every `(r_x/r*)^n ≤ 1`, so nothing overflows;
//! the maximal term is exactly `p·1`, so `S > 0`. For integer α the power is taken by
//! repeated multiplication ([`pow_int_in_place`]): one division and a handful of
//! multiplications per element, no `exp` or `log`. Each chunk is scaled by its own
//! maximum and merged into the running sum by rescaling with `(r*_old / r*_new)^n`.

use crate::kernel::{
    Buf, CHUNK, SMALL_EXPONENT, lane_dot, lane_max, lane_sum, pow_int_in_place, powi_u32,
};
use crate::validate::Probability;

/// How `(r/r*)^n` is computed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Power {
    /// Integer exponent `n = α − 1 ≥ 1`: binary powering.
    Int(u32),
    /// Real exponent `n ≥` [`SMALL_EXPONENT`]: `powf`.
    Real(f64),
}

impl Power {
    fn exponent(self) -> f64 {
        match self {
            Power::Int(n) => f64::from(n),
            Power::Real(n) => n,
        }
    }

    fn apply(self, x: f64) -> f64 {
        match self {
            Power::Int(n) => powi_u32(x, n),
            Power::Real(n) => x.powf(n),
        }
    }
}

/// One chunk widened to f64, padded with zeros: `p`, `q` and `r = p/q` (0 where `p = 0`,
/// `+∞` where `p > 0 = q`).
struct Chunk {
    p: Buf,
    q: Buf,
    r: Buf,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            p: [0.0; CHUNK],
            q: [0.0; CHUNK],
            r: [0.0; CHUNK],
        }
    }

    #[inline]
    fn fill<T: Probability>(&mut self, pc: &[T], qc: &[T]) {
        let len = pc.len();
        if len < CHUNK {
            self.p = [0.0; CHUNK];
            self.q = [0.0; CHUNK];
        }
        for (((dp, dq), dr), (&a, &b)) in self
            .p
            .iter_mut()
            .zip(self.q.iter_mut())
            .zip(self.r.iter_mut())
            .zip(pc.iter().zip(qc))
        {
            let (a, b) = (a.to_f64(), b.to_f64());
            *dp = a;
            *dq = b;
            *dr = if a > 0.0 { a / b } else { 0.0 };
        }
        if len < CHUNK {
            self.r[len..].fill(0.0);
        }
    }
}

/// `D_α(p/P ‖ q/Q)` for finite α with `α − 1 = power.exponent()`; `+∞` when some
/// `p_x > 0 = q_x`. The inputs must satisfy the ratio-path precondition.
pub(crate) fn finite<T: Probability>(p: &[T], q: &[T], power: Power) -> f64 {
    let n = power.exponent();
    let mut chunk = Chunk::new();
    let mut scratch = [0.0; CHUNK];
    let (mut r_star, mut s, mut p_sum, mut q_sum) = (0.0_f64, 0.0_f64, 0.0_f64, 0.0_f64);
    for (pc, qc) in p.chunks(CHUNK).zip(q.chunks(CHUNK)) {
        chunk.fill(pc, qc);
        let c_max = lane_max(&chunk.r, 0.0);
        if c_max == f64::INFINITY {
            return f64::INFINITY;
        }
        p_sum += lane_sum(&chunk.p);
        q_sum += lane_sum(&chunk.q);
        if c_max == 0.0 {
            continue; // no mass of p in this chunk
        }
        // x = r / c_max, exactly 1 at the chunk maximum and never above 1.
        let inv = 1.0 / c_max;
        for v in chunk.r.iter_mut() {
            let y = *v * inv;
            *v = if *v >= c_max || y > 1.0 { 1.0 } else { y };
        }
        match power {
            Power::Int(k) => pow_int_in_place(&mut chunk.r, &mut scratch, k),
            Power::Real(e) => {
                for v in chunk.r.iter_mut() {
                    *v = v.powf(e);
                }
            }
        }
        let s_chunk = lane_dot(&chunk.p, &chunk.r);
        if c_max > r_star {
            s = s * power.apply(r_star / c_max) + s_chunk;
            r_star = c_max;
        } else {
            s += s_chunk * power.apply(c_max / r_star);
        }
    }
    r_star.ln() + (q_sum / p_sum).ln() + (s / p_sum).ln() / n
}

/// `D_α` for a finite order with `n = α − 1 <` [`SMALL_EXPONENT`]:
/// `D = log1p(T/P)/n + log(Q/P)` with `T = Σ p·expm1(n·log r)`, which keeps full relative
/// precision as α → 1 (the direct formula loses `ε/n`).
pub(crate) fn finite_small<T: Probability>(p: &[T], q: &[T], n: f64) -> f64 {
    debug_assert!(n < SMALL_EXPONENT);
    let mut chunk = Chunk::new();
    let (mut t, mut p_sum, mut q_sum) = (0.0_f64, 0.0_f64, 0.0_f64);
    for (pc, qc) in p.chunks(CHUNK).zip(q.chunks(CHUNK)) {
        chunk.fill(pc, qc);
        if lane_max(&chunk.r, 0.0) == f64::INFINITY {
            return f64::INFINITY;
        }
        p_sum += lane_sum(&chunk.p);
        q_sum += lane_sum(&chunk.q);
        for v in chunk.r.iter_mut() {
            *v = if *v > 0.0 { (n * v.ln()).exp_m1() } else { 0.0 };
        }
        t += lane_dot(&chunk.p, &chunk.r);
    }
    (t / p_sum).ln_1p() / n + (q_sum / p_sum).ln()
}

/// `D_∞(p/P ‖ q/Q) = log max_{p_x>0} r_x + log(Q/P)`.
pub(crate) fn infinite<T: Probability>(p: &[T], q: &[T]) -> f64 {
    let mut chunk = Chunk::new();
    let (mut r_star, mut p_sum, mut q_sum) = (0.0_f64, 0.0_f64, 0.0_f64);
    for (pc, qc) in p.chunks(CHUNK).zip(q.chunks(CHUNK)) {
        chunk.fill(pc, qc);
        r_star = r_star.max(lane_max(&chunk.r, 0.0));
        if r_star == f64::INFINITY {
            return f64::INFINITY;
        }
        p_sum += lane_sum(&chunk.p);
        q_sum += lane_sum(&chunk.q);
    }
    r_star.ln() + (q_sum / p_sum).ln()
}

/// `KL(p/P ‖ q/Q) = (1/P)·Σ p·log r + log(Q/P)`.
pub(crate) fn kl<T: Probability>(p: &[T], q: &[T]) -> f64 {
    let mut chunk = Chunk::new();
    let (mut k, mut p_sum, mut q_sum) = (0.0_f64, 0.0_f64, 0.0_f64);
    for (pc, qc) in p.chunks(CHUNK).zip(q.chunks(CHUNK)) {
        chunk.fill(pc, qc);
        if lane_max(&chunk.r, 0.0) == f64::INFINITY {
            return f64::INFINITY;
        }
        p_sum += lane_sum(&chunk.p);
        q_sum += lane_sum(&chunk.q);
        for v in chunk.r.iter_mut() {
            *v = if *v > 0.0 { v.ln() } else { 0.0 };
        }
        k += lane_dot(&chunk.p, &chunk.r);
    }
    k / p_sum + (q_sum / p_sum).ln()
}
