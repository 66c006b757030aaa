//! The log-space value-and-slope accumulator of a mixing path, for entries below
//! `RATIO_PATH_MIN` or orders above `RATIO_PATH_MAX_ORDER`.
//!
//! Each element's term `m^α n^{1−α}` is kept as the exponent `v = (log m + e·log(m/n))/κ`
//! (κ = 1, or κ = e = α − 1 for huge orders, so that `v` cannot overflow), summed as a
//! streaming log-sum-exp. The slope needs the weighted mean of
//! `g = α·m'/m − e·n'/n` under the weights `m^α n^{1−α}/S`: it is accumulated linearly,
//! in the same running scale as `S`, as `Σ w·ĝ` with `ĝ = g/α` (so that it stays finite).
//! The weighted mean is then as precise as the weights themselves, which is the
//! conditioning of the problem. Elements where `ĝ` overflows (subnormal `m` or `n`) and
//! the one-sided endpoint terms go to signed log-sums instead; every combination is
//! written so that the result is finite or ±∞ and never NaN.

use super::kernel::{
    Endpoint, EndpointTerms, PathAccumulator, PathChunk, RATIO_PATH_MAX_ORDER, Sums, ValueAndSlope,
};
use crate::kernel::{CHUNK, ScaledLse, non_negative};

/// `Σ exp(κ(v − max))` and `Σ exp(κ(v − max))·ĝ` in one running scale.
struct WeightedSum {
    kappa: f64,
    max: f64,
    s: f64,
    g: f64,
}

impl WeightedSum {
    fn add(&mut self, v: f64, g_hat: f64) {
        if v > self.max {
            let f = (self.kappa * (self.max - v)).exp();
            self.s = self.s * f + 1.0;
            self.g = self.g * f + g_hat;
            self.max = v;
        } else {
            let w = (self.kappa * (v - self.max)).exp();
            self.s += w;
            self.g += w * g_hat;
        }
    }

    /// `log Σ exp(κ·v) / κ`.
    fn log_over_kappa(&self) -> f64 {
        self.max + self.s.ln() / self.kappa
    }
}

/// Log-space accumulator (see the module docs).
pub(crate) struct LogAcc {
    alpha: f64,
    e: f64,
    kappa: f64,
    terms: WeightedSum,
    log_m: ScaledLse,
    log_n: ScaledLse,
    odd_pos: ScaledLse,
    odd_neg: ScaledLse,
    sums: Sums,
    ends: EndpointTerms,
    infinite: bool,
}

impl LogAcc {
    pub(crate) fn new(alpha: f64, endpoint: Endpoint) -> Self {
        let e = alpha - 1.0;
        let kappa = if alpha <= RATIO_PATH_MAX_ORDER {
            1.0
        } else {
            e
        };
        LogAcc {
            alpha,
            e,
            kappa,
            terms: WeightedSum {
                kappa,
                max: f64::NEG_INFINITY,
                s: 0.0,
                g: 0.0,
            },
            log_m: ScaledLse::new(1.0),
            log_n: ScaledLse::new(1.0),
            odd_pos: ScaledLse::new(kappa),
            odd_neg: ScaledLse::new(kappa),
            sums: Sums::default(),
            ends: EndpointTerms::new(endpoint, kappa),
            infinite: false,
        }
    }

    /// `α·m'·w/m` and `−e·n'·w/n` in log form, for a term whose `ĝ` overflowed.
    fn add_odd(&mut self, v: f64, lm: f64, ln: f64, dm: f64, dn: f64) {
        let k = self.kappa;
        if dm != 0.0 {
            let u = v + (self.alpha.ln() + dm.abs().ln() - lm) / k;
            if dm > 0.0 {
                self.odd_pos.add(u)
            } else {
                self.odd_neg.add(u)
            }
        }
        if dn != 0.0 {
            let u = v + (self.e.ln() + dn.abs().ln() - ln) / k;
            if dn < 0.0 {
                self.odd_pos.add(u)
            } else {
                self.odd_neg.add(u)
            }
        }
    }
}

impl PathAccumulator for LogAcc {
    fn add(&mut self, c: &PathChunk) {
        if self.infinite {
            return;
        }
        self.sums.add(c);
        self.ends.scan(c, self.e);
        let (k, e, alpha) = (self.kappa, self.e, self.alpha);
        for i in 0..CHUNK {
            let (m, n) = (c.m[i], c.n[i]);
            if m > 0.0 {
                if n == 0.0 {
                    self.infinite = true;
                    return;
                }
                let (lm, ln) = (m.ln(), n.ln());
                let d = lm - ln;
                self.log_m.add(lm);
                self.log_n.add(ln);
                // log(m^α n^{1−α}) = lm + e·d, divided by κ.
                let v = lm / k + (e / k) * d;
                let (dm, dn) = (c.dm[i], c.dn[i]);
                let g_hat = dm / m - (e / alpha) * (dn / n);
                if g_hat.is_finite() {
                    self.terms.add(v, g_hat);
                } else {
                    self.terms.add(v, 0.0);
                    self.add_odd(v, lm, ln, dm, dn);
                }
            } else if n > 0.0 {
                self.log_n.add(n.ln());
            }
        }
    }

    fn infinite(&self) -> bool {
        self.infinite
    }

    fn finish(&self) -> ValueAndSlope {
        let (e, k) = (self.e, self.kappa);
        let (lm, ln) = (self.log_m.value(), self.log_n.value());
        let ls = self.terms.log_over_kappa();
        let head = if k == 1.0 { (ls - lm) / e } else { ls - lm / e };
        let value = head + (ln - lm);
        // S'/(e·S) = (α/e)·(Σwĝ/Σw) + (odd and endpoint parts)/(e·S).
        let linear = (self.alpha / e) * (self.terms.g / self.terms.s);
        let odd = if self.ends.jumps_to_infinity {
            f64::INFINITY
        } else {
            let rel = |acc: &ScaledLse| acc.value_over_kappa() - ls;
            let (ends, pos, neg) = (
                rel(&self.ends.log_sum),
                rel(&self.odd_pos),
                rel(&self.odd_neg),
            );
            let (pos, neg) = if self.ends.sign() > 0.0 {
                (log_add(pos, ends, k), neg)
            } else {
                (pos, log_add(neg, ends, k))
            };
            exp_diff(pos, neg, k) / e
        };
        let rate = if odd.is_infinite() { odd } else { linear + odd };
        let slope = rate + self.sums.slope(self.alpha, e);
        ValueAndSlope {
            value: non_negative(value),
            slope,
        }
    }
}

/// `log(exp(κx) + exp(κy))/κ` for `x, y ∈ [−∞, ∞)`, never NaN.
fn log_add(x: f64, y: f64, kappa: f64) -> f64 {
    let (hi, lo) = if x >= y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (kappa * (lo - hi)).exp().ln_1p() / kappa
    }
}

/// `exp(κx) − exp(κy)` for `x, y ∈ [−∞, ∞)`: finite or ±∞ with the right sign, never NaN.
fn exp_diff(x: f64, y: f64, kappa: f64) -> f64 {
    if x == y {
        return 0.0;
    }
    let (sign, hi, lo) = if x > y { (1.0, x, y) } else { (-1.0, y, x) };
    sign * (kappa * hi).exp() * -(kappa * (lo - hi)).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::super::kernel::RatioAcc;
    use super::*;
    use crate::Order;
    use proptest::prelude::*;

    /// Runs one accumulator over the path `(a, b, c)` at λ.
    fn run(
        acc: &mut impl PathAccumulator,
        a: &[f64],
        b: &[f64],
        c: &[f64],
        lambda: f64,
    ) -> ValueAndSlope {
        for start in (0..a.len()).step_by(CHUNK) {
            let mut chunk = PathChunk::new();
            for i in start..a.len().min(start + CHUNK) {
                let j = i - start;
                chunk.m[j] = lambda * a[i] + (1.0 - lambda) * c[i];
                chunk.n[j] = lambda * b[i] + (1.0 - lambda) * c[i];
                chunk.dm[j] = a[i] - c[i];
                chunk.dn[j] = b[i] - c[i];
            }
            acc.add(&chunk);
        }
        acc.result()
    }

    fn dist(n: usize) -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec((-8.0..0.0_f64, 0..5u8), n).prop_map(|raw| {
            let mut v: Vec<f64> = raw
                .iter()
                .map(|&(e, z)| if z == 0 { 0.0 } else { 10f64.powf(e) })
                .collect();
            v[0] = 1.0;
            let s: f64 = v.iter().sum();
            v.iter_mut().for_each(|x| *x /= s);
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// The log-space accumulator agrees with the ratio accumulator wherever both apply,
        /// endpoints included.
        #[test]
        fn log_and_ratio_accumulators_agree(
            (a, b, c) in (1..700usize).prop_flat_map(|n| (dist(n), dist(n), dist(n))),
            alpha in prop_oneof![1.01..3.0_f64, 3.0..40.0, (2..40u32).prop_map(f64::from)],
            lambda in prop_oneof![Just(0.0), Just(1.0), 0.0..1.0_f64],
        ) {
            let order = Order::new(alpha).unwrap();
            let endpoint = Endpoint::of(lambda);
            // What `PathAcc::new` picks for these orders with and without `ratio_ok`.
            let ratio = run(&mut RatioAcc::new(order, alpha, endpoint), &a, &b, &c, lambda);
            let log = run(&mut LogAcc::new(alpha, endpoint), &a, &b, &c, lambda);
            let close =
                |x: f64, y: f64| x == y || (x - y).abs() <= 1e-10 * (1.0 + x.abs().max(y.abs()));
            prop_assert!(close(ratio.value, log.value), "{:?} vs {:?}", ratio, log);
            prop_assert!(close(ratio.slope, log.slope), "{:?} vs {:?}", ratio, log);
        }
    }
}
