//! The max divergence along a mixing path: `D_∞ = max_x log(m_x/n_x) + log(N/M)`, and its
//! one-sided slope: that of the active (maximal) term, `m'/m − n'/n`, plus the slope of
//! the normalisation. When several terms tie for the maximum the right derivative is the
//! largest of their slopes (λ < 1) and the left derivative at λ = 1 the smallest.
//! Elements with `m = n = 0` at an endpoint take their limiting ratio (`m'/n'` at λ = 0,
//! 1 at λ = 1) with slope 0; if that limit exceeds the maximum the value jumps there and
//! the slope is `+∞` (λ = 0) or `−∞` (λ = 1).

use super::kernel::{Endpoint, PathAccumulator, PathChunk, Sums, ValueAndSlope, signed_exp_sum};
use crate::kernel::{CHUNK, non_negative};

/// Accumulator for order ∞.
pub(crate) struct MaxAcc {
    endpoint: Endpoint,
    key: f64,
    slope: f64,
    limit_key: f64,
    sums: Sums,
    infinite: bool,
}

/// `log(m/n)`, exact (0) for `m = n`, accurate when `m/n` is a normal number.
fn log_ratio(m: f64, n: f64) -> f64 {
    let r = m / n;
    if r.is_normal() {
        r.ln()
    } else {
        m.ln() - n.ln()
    }
}

/// `m'/m − n'/n` without overflow-induced NaN (subnormal `m` or `n`).
fn term_slope(m: f64, dm: f64, n: f64, dn: f64) -> f64 {
    let (a, b) = (dm / m, dn / n);
    if a.is_finite() && b.is_finite() {
        return a - b;
    }
    let log_abs = |d: f64, v: f64| {
        if d == 0.0 {
            f64::NEG_INFINITY
        } else {
            d.abs().ln() - v.ln()
        }
    };
    signed_exp_sum(dm.signum(), log_abs(dm, m), -dn.signum(), log_abs(dn, n))
}

impl MaxAcc {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        let slope = if endpoint == Endpoint::One {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        };
        MaxAcc {
            endpoint,
            key: f64::NEG_INFINITY,
            slope,
            limit_key: f64::NEG_INFINITY,
            sums: Sums::default(),
            infinite: false,
        }
    }

    /// Records a candidate with its slope, applying the tie rule.
    fn offer(&mut self, key: f64, slope: f64) {
        if key > self.key {
            self.key = key;
            self.slope = slope;
        } else if key == self.key {
            self.slope = if self.endpoint == Endpoint::One {
                self.slope.min(slope)
            } else {
                self.slope.max(slope)
            };
        }
    }
}

impl PathAccumulator for MaxAcc {
    fn add(&mut self, c: &PathChunk) {
        if self.infinite {
            return;
        }
        self.sums.add(c);
        for i in 0..CHUNK {
            let (m, n, dm, dn) = (c.m[i], c.n[i], c.dm[i], c.dn[i]);
            if m > 0.0 {
                if n == 0.0 {
                    self.infinite = true;
                    return;
                }
                self.offer(log_ratio(m, n), term_slope(m, dm, n, dn));
            } else if n == 0.0 && dm != 0.0 {
                let limit = match self.endpoint {
                    Endpoint::Interior => continue,
                    Endpoint::Zero if dn == 0.0 => f64::INFINITY,
                    Endpoint::Zero => dm.ln() - dn.ln(),
                    Endpoint::One => 0.0,
                };
                self.limit_key = self.limit_key.max(limit);
            }
        }
    }

    fn infinite(&self) -> bool {
        self.infinite
    }

    fn finish(&self) -> ValueAndSlope {
        let value = self.key + (self.sums.n / self.sums.m).ln();
        let mut rate = self.slope;
        if self.limit_key > self.key {
            rate = if self.endpoint == Endpoint::One {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
        } else if self.limit_key == self.key {
            rate = if self.endpoint == Endpoint::One {
                rate.min(0.0)
            } else {
                rate.max(0.0)
            };
        }
        let slope = rate - self.sums.dm / self.sums.m + self.sums.dn / self.sums.n;
        ValueAndSlope {
            value: non_negative(value),
            slope,
        }
    }
}
