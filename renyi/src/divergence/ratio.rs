//! Kernels on probability vectors whose non-zero entries are all ≥ [`RATIO_PATH_MIN`]:
//! they work on the ratios `r_x = p_x / q_x`, which then lie within about `[1e-150, 1e150]`.
//!
//! For a finite order, with `n = α − 1`, `P = Σp`, `Q = Σq` (both ≈ 1) and
//! `r* = max_{p_x>0} r_x`, the divergence of the normalised vectors `p/P`, `q/Q` is
//!
//! `D = log r* + log(Q/P) + log(S/P)/n`,   `S = Σ_{p_x>0} p_x · (r_x / r*)^n`,
//!
//! since `Σ p^α q^{1−α} = Σ p·r^n = r*^n·S`. Every `(r_x/r*)^n ≤ 1`, so nothing overflows,
//! and the maximal term is exactly `p·1`, so `S > 0`. For integer α the power is taken by
//! repeated multiplication in registers ([`pow8`]): a multiplication by `1/q` and a
//! handful of multiplications per element, no `exp`, `log` or division. Each chunk is
//! scaled by its own maximum and merged into the running sum by rescaling with
//! `(r*_old / r*_new)^n`.
//!
//! The ratio is formed as `p·fl(1/q)` (1 exactly when `p = q`), so that a caller holding
//! many rows against one reference computes the reciprocals once ([`Denominator::inv`]);
//! a relative error of 2 ulp in `r` costs `2nε` relative in `S`, `2ε` in `D`.
//! Why nothing overflows and why equal inputs give exactly 0: `proof.md` beside this file.

use crate::kernel::{Buf, CHUNK, PW, RATIO_PATH_MIN, SMALL_EXPONENT, combine, pow8, powi_u32};
use crate::validate::Probability;

/// Block width of the register-resident inner loops.
const W: usize = crate::kernel::LANES;

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

/// The second argument of a ratio kernel, with its reciprocals `fl(1/q_x)` when the
/// caller has them (`None`: computed on the fly, with the same rounding).
#[derive(Clone, Copy)]
pub(crate) struct Denominator<'a, T> {
    pub q: &'a [T],
    pub inv: Option<&'a [f64]>,
}

/// The reciprocals of a reference row, for [`Denominator::inv`].
pub(crate) fn reciprocals<T: Probability>(q: &[T]) -> Vec<f64> {
    q.iter().map(|&b| 1.0 / b.to_f64()).collect()
}

#[inline(always)]
fn ratio(a: f64, b: f64, inv_b: f64) -> f64 {
    // Written as two selects (no branches) so that it vectorises.
    let r = if a == b { 1.0 } else { a * inv_b };
    if a > 0.0 { r } else { 0.0 }
}

/// Which side's entries a kernel pass screens (see [`Screen`]).
pub(crate) const SCREEN_NONE: u8 = 0;
/// Screen the first argument (`p`).
pub(crate) const SCREEN_P: u8 = 1;
/// Screen the second argument (`q`).
pub(crate) const SCREEN_Q: u8 = 2;

/// What a kernel pass learnt about the entries of one side, at no extra memory traffic:
/// enough to tell whether that side would have passed validation (its sum, computed
/// exactly as [`crate::validate`] computes it, is returned beside).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Screen {
    /// Smallest entry (negative entries show here; NaN and ±∞ make the sum non-finite).
    pub min: f64,
    /// Smallest strictly positive entry.
    pub min_positive: f64,
}

/// One chunk widened to f64 and zero-padded: `p`, and `r = p/q` (0 where `p = 0`, `+∞`
/// where `p > 0 = q`), with the chunk's `Σp`, `Σq`, `max r` and screen.
struct Chunk {
    p: Buf,
    r: Buf,
    p_sum: f64,
    q_sum: f64,
    r_max: f64,
    screen: Screen,
}

impl Chunk {
    fn new() -> Chunk {
        let screen = Screen {
            min: 0.0,
            min_positive: f64::INFINITY,
        };
        Chunk {
            p: [0.0; CHUNK],
            r: [0.0; CHUNK],
            p_sum: 0.0,
            q_sum: 0.0,
            r_max: 0.0,
            screen,
        }
    }

    /// Loads one chunk in two simple loops that the compiler vectorises: an element-wise
    /// one (widen, form the ratio) and a lane-wise reduction over the L1 buffers (sums,
    /// maximum, and the screen of side `S`). A short last chunk is zero-padded; zeros
    /// change no sum, maximum or screen.
    #[inline]
    fn fill<T: Probability, const S: u8>(&mut self, pc: &[T], qc: &[T], inv: Option<&[f64]>) {
        let mut q = [0.0; CHUNK];
        if pc.len() < CHUNK {
            self.p = [0.0; CHUNK];
            self.r = [0.0; CHUNK];
        }
        let out = self.p.iter_mut().zip(self.r.iter_mut()).zip(q.iter_mut());
        match inv {
            Some(ic) => {
                for (((dp, dr), dq), ((&a, &b), &ib)) in out.zip(pc.iter().zip(qc).zip(ic)) {
                    let (a, b) = (a.to_f64(), b.to_f64());
                    (*dp, *dq, *dr) = (a, b, ratio(a, b, ib));
                }
            }
            None => {
                for (((dp, dr), dq), (&a, &b)) in out.zip(pc.iter().zip(qc)) {
                    let (a, b) = (a.to_f64(), b.to_f64());
                    (*dp, *dq, *dr) = (a, b, ratio(a, b, 1.0 / b));
                }
            }
        }
        let (mut ps, mut qs, mut rm) = ([0.0; W], [0.0; W], [0.0; W]);
        let (mut mn, mut mp) = ([0.0; W], [f64::INFINITY; W]);
        let blocks = self
            .p
            .chunks_exact(W)
            .zip(q.chunks_exact(W))
            .zip(self.r.chunks_exact(W));
        for ((bp, bq), br) in blocks {
            for j in 0..W {
                ps[j] += bp[j];
                qs[j] += bq[j];
                rm[j] = if br[j] > rm[j] { br[j] } else { rm[j] };
                if S != SCREEN_NONE {
                    let v = if S == SCREEN_P { bp[j] } else { bq[j] };
                    mn[j] = if v < mn[j] { v } else { mn[j] };
                    mp[j] = if (v > 0.0) & (v < mp[j]) { v } else { mp[j] };
                }
            }
        }
        self.p_sum = combine(ps);
        self.q_sum = combine(qs);
        self.r_max = rm.into_iter().fold(0.0, |m, x| if x > m { x } else { m });
        if S != SCREEN_NONE {
            self.screen = Screen {
                min: mn.into_iter().fold(0.0, |m, x| if x < m { x } else { m }),
                min_positive: mp.into_iter().fold(f64::INFINITY, f64::min),
            };
        }
    }

    /// `Σ p·f(x)` over the chunk, `x = r / r_max`, summed in the same lanes and order as
    /// `p_sum`. `exact_top`: `x` is exactly 1 at the maximum (needed for huge real
    /// exponents); otherwise `min(r·fl(1/r_max), 1)`, which may be 1 − ulp there.
    #[inline]
    fn scaled_dot(&self, exact_top: bool, f: impl Fn([f64; PW]) -> [f64; PW]) -> f64 {
        let (c_max, inv) = (self.r_max, 1.0 / self.r_max);
        let mut acc = [0.0; W];
        for (bp, br) in self.p.chunks_exact(PW).zip(self.r.chunks_exact(PW)) {
            let mut x = [0.0; PW];
            for j in 0..PW {
                let y = br[j] * inv;
                x[j] = if (exact_top && br[j] >= c_max) || y > 1.0 {
                    1.0
                } else {
                    y
                };
            }
            let fx = f(x);
            // Lane j takes elements j, j + W, …: the order in which `p_sum` took them.
            for j in 0..PW {
                acc[j % W] += bp[j] * fx[j];
            }
        }
        combine(acc)
    }

    /// `Σ p·g(r)` over entries with `p > 0`.
    #[inline]
    fn dot_on_support(&self, g: impl Fn(f64) -> f64) -> f64 {
        let mut acc = [0.0; W];
        for (bp, br) in self.p.chunks_exact(W).zip(self.r.chunks_exact(W)) {
            for j in 0..W {
                acc[j] += bp[j] * if br[j] > 0.0 { g(br[j]) } else { 0.0 };
            }
        }
        combine(acc)
    }
}

/// The sums of a completed pass, and the screen of the side asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    pub p_sum: f64,
    pub q_sum: f64,
    pub screen: Screen,
}

/// Walks `p` and `q` chunk by chunk; stops early (`None`) on a ratio `+∞` (`p_x > 0 = q_x`
/// for valid input).
fn for_chunks<T: Probability, const S: u8>(
    p: &[T],
    q: Denominator<'_, T>,
    mut f: impl FnMut(&Chunk),
) -> Option<Pass> {
    let mut chunk = Chunk::new();
    let mut pass = Pass {
        p_sum: 0.0,
        q_sum: 0.0,
        screen: chunk.screen,
    };
    for (k, (pc, qc)) in p.chunks(CHUNK).zip(q.q.chunks(CHUNK)).enumerate() {
        let inv = q.inv.map(|inv| &inv[k * CHUNK..k * CHUNK + pc.len()]);
        chunk.fill::<T, S>(pc, qc, inv);
        if chunk.r_max == f64::INFINITY {
            return None;
        }
        pass.p_sum += chunk.p_sum;
        pass.q_sum += chunk.q_sum;
        if S != SCREEN_NONE {
            pass.screen.min = pass.screen.min.min(chunk.screen.min);
            pass.screen.min_positive = pass.screen.min_positive.min(chunk.screen.min_positive);
        }
        f(&chunk);
    }
    Some(pass)
}

/// A kernel's result: the (unclamped) divergence and the pass's sums and screen, or
/// `None` when it stopped early on a ratio `+∞` (the divergence of valid input is `+∞`).
pub(crate) type Outcome = Option<(f64, Pass)>;

/// `D_α(p/P ‖ q/Q)` for finite α with `α − 1 = power.exponent()`. The inputs must
/// satisfy the ratio-path precondition (or be screened, see [`SCREEN_P`]).
pub(crate) fn finite<T: Probability, const S: u8>(
    p: &[T],
    q: Denominator<'_, T>,
    power: Power,
) -> Outcome {
    let (mut r_star, mut s) = (0.0_f64, 0.0_f64);
    let pass = for_chunks::<T, S>(p, q, |c| {
        if c.r_max == 0.0 {
            return; // no mass of p in this chunk
        }
        let s_chunk = match power {
            Power::Int(k) => c.scaled_dot(false, |x| pow8(x, k)),
            Power::Real(e) => c.scaled_dot(true, |x| x.map(|v| v.powf(e))),
        };
        if c.r_max > r_star {
            s = s * power.apply(r_star / c.r_max) + s_chunk;
            r_star = c.r_max;
        } else {
            s += s_chunk * power.apply(c.r_max / r_star);
        }
    })?;
    let d = r_star.ln() + (pass.q_sum / pass.p_sum).ln() + (s / pass.p_sum).ln() / power.exponent();
    Some((d, pass))
}

/// `D_α` for a finite order with `n = α − 1 <` [`SMALL_EXPONENT`]:
/// `D = log1p(T/P)/n + log(Q/P)` with `T = Σ p·expm1(n·log r)`, which keeps full relative
/// precision as α → 1 (the direct formula loses `ε/n`).
pub(crate) fn finite_small<T: Probability, const S: u8>(
    p: &[T],
    q: Denominator<'_, T>,
    n: f64,
) -> Outcome {
    debug_assert!(n < SMALL_EXPONENT);
    let mut t = 0.0;
    let pass = for_chunks::<T, S>(p, q, |c| t += c.dot_on_support(|r| (n * r.ln()).exp_m1()))?;
    Some((
        (t / pass.p_sum).ln_1p() / n + (pass.q_sum / pass.p_sum).ln(),
        pass,
    ))
}

/// `D_∞(p/P ‖ q/Q) = log max_{p_x>0} r_x + log(Q/P)`.
pub(crate) fn infinite<T: Probability, const S: u8>(p: &[T], q: Denominator<'_, T>) -> Outcome {
    let mut r_star = 0.0_f64;
    let pass = for_chunks::<T, S>(p, q, |c| r_star = r_star.max(c.r_max))?;
    Some((r_star.ln() + (pass.q_sum / pass.p_sum).ln(), pass))
}

/// `KL(p/P ‖ q/Q) = (1/P)·Σ p·log r + log(Q/P)`.
pub(crate) fn kl<T: Probability>(p: &[T], q: Denominator<'_, T>) -> f64 {
    let mut k = 0.0;
    match for_chunks::<T, SCREEN_NONE>(p, q, |c| k += c.dot_on_support(f64::ln)) {
        Some(pass) => k / pass.p_sum + (pass.q_sum / pass.p_sum).ln(),
        None => f64::INFINITY,
    }
}

/// True when both vectors' non-zero entries allow the ratio kernels.
pub(crate) fn applicable(min_p: f64, min_q: f64) -> bool {
    min_p >= RATIO_PATH_MIN && min_q >= RATIO_PATH_MIN
}
