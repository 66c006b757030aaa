//! Streaming value-and-slope accumulators for divergences along a mixing path.
//!
//! Along a path the two arguments are `m(λ) = λa + (1−λ)c` and `n(λ) = λb + (1−λ)c`, with
//! derivatives `m' = a − c`, `n' = b − c`. With `e = α − 1` and `S = Σ m^α n^{1−α}`,
//!
//! `dS/dλ = Σ m^α n^{1−α} (α·m'/m − e·n'/n) = Σ (m/n)^e (α·m' − e·n'·m/n)`,
//!
//! which needs one division per element (`m/n`). The value and slope of the normalised
//! divergence `D = (log S − α log M)/e + log N` (`M = Σm`, `N = Σn`) follow as
//! `D' = S'/(e·S) − (α/e)·M'/M + N'/N`.
//!
//! Elements where both `m` and `n` vanish at an endpoint (`c_x = 0` at λ = 0, or
//! `a_x = b_x = 0` at λ = 1) have a term linear in the distance to the endpoint,
//! `|λ − λ₀|·|m'|^α |n'|^{1−α}`: it adds nothing to the value there but its full
//! one-sided rate to `S'`. The slope reported is the right derivative for λ < 1 and the
//! left derivative at λ = 1; it is `+∞` when the value is `+∞`, or when the value is
//! finite at λ = 0 but infinite for every λ > 0. The derivation of both, endpoint
//! terms included, is in `proof.md` beside this file (P3).

use crate::Order;
use crate::kernel::{
    Buf, CHUNK, LANES, PW, ScaledLse, combine, lane_sum, non_negative, pow8, powi_u32,
};

/// A divergence and its derivative in λ at one point of a path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueAndSlope {
    /// `D(λ)`, in nats; `+∞` when the first argument has mass where the second has none.
    pub value: f64,
    /// `dD/dλ`: the right derivative for λ < 1, the left derivative at λ = 1 (so that a
    /// solver can step inwards from either end). `+∞` when `value` is `+∞`, or when the
    /// divergence is finite at λ = 0 but infinite for every λ > 0. Never NaN.
    pub slope: f64,
}

/// Orders up to this use ratio arithmetic (with terms bounded by about `α·1e150`);
/// above it the log-space accumulator is used, whose exponents are scaled by `1/(α − 1)`.
pub(crate) const RATIO_PATH_MAX_ORDER: f64 = 1e12;

/// One chunk of a path: `m`, `n` at the current λ and their derivatives, zero-padded.
pub(crate) struct PathChunk {
    pub m: Buf,
    pub n: Buf,
    pub dm: Buf,
    pub dn: Buf,
}

impl PathChunk {
    pub(crate) fn new() -> Self {
        PathChunk {
            m: [0.0; CHUNK],
            n: [0.0; CHUNK],
            dm: [0.0; CHUNK],
            dn: [0.0; CHUNK],
        }
    }
}

/// Where λ lies: endpoints need the one-sided terms described in the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Endpoint {
    Interior,
    Zero,
    One,
}

impl Endpoint {
    pub(crate) fn of(lambda: f64) -> Self {
        if lambda == 0.0 {
            Endpoint::Zero
        } else if lambda == 1.0 {
            Endpoint::One
        } else {
            Endpoint::Interior
        }
    }
}

/// `M, N, M', N'`, accumulated per chunk.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sums {
    pub(crate) m: f64,
    pub(crate) n: f64,
    pub(crate) dm: f64,
    pub(crate) dn: f64,
}

impl Sums {
    pub(crate) fn add(&mut self, c: &PathChunk) {
        self.m += lane_sum(&c.m);
        self.n += lane_sum(&c.n);
        self.dm += lane_sum(&c.dm);
        self.dn += lane_sum(&c.dn);
    }

    /// `−(α/e)·M'/M + N'/N`, the slope of the normalisation terms.
    pub(crate) fn slope(&self, alpha: f64, e: f64) -> f64 {
        -(alpha / e) * (self.dm / self.m) + self.dn / self.n
    }
}

/// `s₁·exp(x) + s₂·exp(y)` for signs `s ∈ {−1, 1}`: finite or ±∞, never NaN.
pub(crate) fn signed_exp_sum(s1: f64, x: f64, s2: f64, y: f64) -> f64 {
    let (hi_s, hi, lo_s, lo) = if x >= y {
        (s1, x, s2, y)
    } else {
        (s2, y, s1, x)
    };
    if hi == f64::NEG_INFINITY {
        return 0.0;
    }
    if hi_s == lo_s {
        hi_s * hi.exp() * (1.0 + (lo - hi).exp())
    } else if hi == lo {
        0.0
    } else {
        hi_s * hi.exp() * -(lo - hi).exp_m1()
    }
}

/// A value-and-slope accumulator: the ratio one below, and those of the `log` and `max`
/// modules. `add` is called once per chunk, then `result` once.
pub(crate) trait PathAccumulator {
    /// Adds one chunk of the path.
    fn add(&mut self, c: &PathChunk);

    /// Whether some `m > 0` met `n = 0`: the value (and slope) is `+∞`.
    fn infinite(&self) -> bool;

    /// The value and slope of a path that is not `infinite`.
    fn finish(&self) -> ValueAndSlope;

    /// The value and slope: `+∞` for both when `infinite`, else `finish`.
    fn result(&self) -> ValueAndSlope {
        if self.infinite() {
            ValueAndSlope {
                value: f64::INFINITY,
                slope: f64::INFINITY,
            }
        } else {
            self.finish()
        }
    }
}

/// The one-sided endpoint terms of a finite order: `log Σ |m'|^α |n'|^{1−α}`, all of one
/// sign (+ at λ = 0, − at λ = 1), with `+∞` slope when `n' = 0 < m'` at λ = 0.
pub(crate) struct EndpointTerms {
    endpoint: Endpoint,
    pub(crate) log_sum: ScaledLse,
    pub(crate) jumps_to_infinity: bool,
}

impl EndpointTerms {
    pub(crate) fn new(endpoint: Endpoint, kappa: f64) -> Self {
        EndpointTerms {
            endpoint,
            log_sum: ScaledLse::new(kappa),
            jumps_to_infinity: false,
        }
    }

    /// Scans a chunk for elements with `m = n = 0` (only at endpoints).
    pub(crate) fn scan(&mut self, c: &PathChunk, e: f64) {
        if self.endpoint == Endpoint::Interior {
            return;
        }
        let kappa = self.log_sum_kappa();
        for i in 0..CHUNK {
            let (dm, dn) = (c.dm[i].abs(), c.dn[i].abs());
            if c.m[i] != 0.0 || c.n[i] != 0.0 || dm == 0.0 {
                continue;
            }
            if dn == 0.0 {
                // Only possible at λ = 0 (at λ = 1 both derivatives are −c_x).
                self.jumps_to_infinity = true;
                continue;
            }
            let (ldm, ldn) = (dm.ln(), dn.ln());
            self.log_sum.add(ldm / kappa + (e / kappa) * (ldm - ldn));
        }
    }

    fn log_sum_kappa(&self) -> f64 {
        self.log_sum.kappa()
    }

    pub(crate) fn sign(&self) -> f64 {
        if self.endpoint == Endpoint::One {
            -1.0
        } else {
            1.0
        }
    }
}

/// Ratio arithmetic (see `divergence/ratio.rs`): `S` and `S'` scaled by `r*^e`.
pub(crate) struct RatioAcc {
    alpha: f64,
    e: f64,
    int_e: Option<u32>,
    r_star: f64,
    s: f64,
    g: f64,
    sums: Sums,
    ends: EndpointTerms,
    infinite: bool,
}

impl RatioAcc {
    pub(crate) fn new(order: Order, alpha: f64, endpoint: Endpoint) -> Self {
        RatioAcc {
            alpha,
            e: alpha - 1.0,
            int_e: order.integer().map(|k| k - 1).filter(|&k| k >= 1),
            r_star: 0.0,
            s: 0.0,
            g: 0.0,
            sums: Sums::default(),
            ends: EndpointTerms::new(endpoint, 1.0),
            infinite: false,
        }
    }

    fn power(&self, x: f64) -> f64 {
        match self.int_e {
            Some(k) => powi_u32(x, k),
            None => x.powf(self.e),
        }
    }

    /// `Σ m·x^e` and `Σ x^e·(α·m' − e·n'·r)` with `x = r/c_max` (exactly 1 at the
    /// maximum when `exact_top`, else within an ulp of it), lane `j` taking elements
    /// `j, j + LANES, …` as the sum `M` did, so that `m = n` gives `S = M` bitwise.
    #[inline]
    fn scaled_sums(
        &self,
        c: &PathChunk,
        r: &Buf,
        c_max: f64,
        exact_top: bool,
        f: impl Fn([f64; PW]) -> [f64; PW],
    ) -> (f64, f64) {
        let inv = 1.0 / c_max;
        let (alpha, e) = (self.alpha, self.e);
        let (mut s, mut g) = ([0.0; LANES], [0.0; LANES]);
        let blocks = c.m.chunks_exact(PW).zip(r.chunks_exact(PW));
        let derivs = c.dm.chunks_exact(PW).zip(c.dn.chunks_exact(PW));
        for ((bm, br), (bdm, bdn)) in blocks.zip(derivs) {
            let mut x = [0.0; PW];
            for j in 0..PW {
                let y = br[j] * inv;
                x[j] = if (exact_top && br[j] >= c_max) || y > 1.0 {
                    1.0
                } else {
                    y
                };
            }
            let xe = f(x);
            for j in 0..PW {
                s[j % LANES] += bm[j] * xe[j];
                g[j % LANES] += xe[j] * (alpha * bdm[j]) - (xe[j] * br[j]) * (e * bdn[j]);
            }
        }
        (combine(s), combine(g))
    }
}

impl PathAccumulator for RatioAcc {
    fn add(&mut self, c: &PathChunk) {
        if self.infinite {
            return;
        }
        self.ends.scan(c, self.e);
        // Pass 1 (lane-wise): the ratios m/n (0 where m = 0, +∞ where m > 0 = n), their
        // maximum, and the sums M, N, M', N'.
        let mut r = [0.0; CHUNK];
        let mut lanes = [[0.0_f64; LANES]; 5];
        let input = c.m.chunks_exact(LANES).zip(c.n.chunks_exact(LANES));
        let derivs = c.dm.chunks_exact(LANES).zip(c.dn.chunks_exact(LANES));
        for ((dst, (bm, bn)), (bdm, bdn)) in r.chunks_exact_mut(LANES).zip(input).zip(derivs) {
            for j in 0..LANES {
                // Formed exactly as the scalar kernels form p/q, so that on this path the
                // value is bitwise that of `divergence` on the explicit mixture.
                let r = if bm[j] == bn[j] {
                    1.0
                } else {
                    bm[j] * (1.0 / bn[j])
                };
                let v = if bm[j] > 0.0 { r } else { 0.0 };
                dst[j] = v;
                lanes[0][j] = if v > lanes[0][j] { v } else { lanes[0][j] };
                lanes[1][j] += bm[j];
                lanes[2][j] += bn[j];
                lanes[3][j] += bdm[j];
                lanes[4][j] += bdn[j];
            }
        }
        let c_max = lanes[0]
            .into_iter()
            .fold(0.0, |a, b| if b > a { b } else { a });
        self.sums.m += combine(lanes[1]);
        self.sums.n += combine(lanes[2]);
        self.sums.dm += combine(lanes[3]);
        self.sums.dn += combine(lanes[4]);
        if c_max == f64::INFINITY {
            self.infinite = true;
            return;
        }
        if c_max == 0.0 {
            return;
        }
        // Pass 2 (blocks of PW in registers): S and S' of the chunk, scaled by c_max^e.
        let (s_chunk, g_chunk) = match self.int_e {
            Some(k) => self.scaled_sums(c, &r, c_max, false, |x| pow8(x, k)),
            None => {
                let e = self.e;
                self.scaled_sums(c, &r, c_max, true, |x| x.map(|v| v.powf(e)))
            }
        };
        if c_max > self.r_star {
            let f = self.power(self.r_star / c_max);
            self.s = self.s * f + s_chunk;
            self.g = self.g * f + g_chunk;
            self.r_star = c_max;
        } else {
            let f = self.power(c_max / self.r_star);
            self.s += s_chunk * f;
            self.g += g_chunk * f;
        }
    }

    fn infinite(&self) -> bool {
        self.infinite
    }

    fn finish(&self) -> ValueAndSlope {
        let (e, m) = (self.e, self.sums.m);
        let ln_r = self.r_star.ln();
        let value = ln_r + (self.sums.n / m).ln() + (self.s / m).ln() / e;
        let mut rate = self.g / self.s;
        if self.ends.jumps_to_infinity {
            rate = f64::INFINITY;
        } else {
            // Endpoint terms are unscaled: divide by S_raw = r*^e·s in log space.
            let log_ratio = self.ends.log_sum.value() - (e * ln_r + self.s.ln());
            rate += self.ends.sign() * log_ratio.exp();
        }
        let slope = rate / e + self.sums.slope(self.alpha, e);
        ValueAndSlope {
            value: non_negative(value),
            slope,
        }
    }
}
