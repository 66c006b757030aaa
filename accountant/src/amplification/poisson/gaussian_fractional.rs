//! `ln A_α` of the Poisson-subsampled Gaussian at a fractional order α, with a
//! rigorous upper bound (Mironov, Talwar & Zhang (arXiv:1908.10530), §3.3).
//!
//! # The series
//!
//! With μ₀ = N(0, σ²), r(z) = μ₁(z)/μ₀(z) = e^{(2z−1)/(2σ²)} and
//! `A_α = ∫ μ₀(z) (1 − q + q·r(z))^α dz`, split the line at the point z₀ where
//! q·r = 1 − q, i.e. `z₀ = σ² ln(1/q − 1) + ½`. Left of z₀ the binomial series in
//! `q·r/(1−q) ≤ 1` converges, right of it the series in `(1−q)/(q·r) ≤ 1`, and
//! `∫_{−∞}^{z} μ₀ r^k = e^{(k²−k)/(2σ²)} · ½ erfc((k − z)/(√2 σ))`. Hence
//!
//! ```text
//! A_α = Σ_k C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)} ½erfc((k−a)/(√2σ))        (left, z ≤ a)
//!     + Σ_k C(α,k) q^{α−k} (1−q)^k e^{(j²−j)/(2σ²)} ½erfc((b−j)/(√2σ)), j = α−k (right, z ≥ b)
//!     + ∫_a^b μ₀ (1 − q + q r)^α                                               (sliver)
//! ```
//!
//! where `a ≤ z₀ ≤ b` are the two float ends of an enclosure of z₀ (so each
//! series is evaluated exactly where it converges; the sliver between them is
//! at most `(b−a)·(1/(σ√(2π)))·(1 − q + q·r(b))^α`).
//!
//! # The tail: an alternating series with decreasing terms
//!
//! For k > α the coefficients C(α,k) alternate in sign, and the combined term
//! `T_k = left_k + right_k` (both share C(α,k)'s sign) decreases in magnitude
//! for k ≥ α. With `erfc(x + h) ≤ e^{−2xh−h²}·erfc(x)` for h ≥ 0 (substitute
//! t = s + h in the integral and use e^{−2sh} ≤ e^{−2xh} for s ≥ x):
//!
//! * left: `|t_{k+1}/t_k| ≤ (k−α)/(k+1) · (q/(1−q)) · e^{k/σ²} · e^{−(2k−2a+1)/(2σ²)}
//!   = (k−α)/(k+1) · (q/(1−q)) e^{(2a−1)/(2σ²)} ≤ (k−α)/(k+1) < 1`, because
//!   a ≤ z₀ means `(2a−1)/(2σ²) ≤ ln((1−q)/q)`;
//! * right (j = α − k): `|t_{k+1}/t_k| ≤ (k−α)/(k+1) · ((1−q)/q) · e^{(1−j)/σ²} ·
//!   e^{−(2b−2j+1)/(2σ²)} = (k−α)/(k+1) · ((1−q)/q) e^{(1−2b)/(2σ²)} ≤ (k−α)/(k+1)`,
//!   because b ≥ z₀.
//!
//! So by Leibniz's rule the remainder `Σ_{i≥k} T_i` (k > α) has the sign of
//! `T_k` and magnitude at most `|T_k|`: stopping before T_k, the partial sum
//! plus `max(0, T_k)` bounds A_α from above. k grows until `|T_k|` is
//! negligible against `A_α − 1` (or a cap is reached, which only loosens).

use crate::interval::Interval;
use crate::special::{Binomials, ln_erfc};
use privmix_renyi::round::{
    add_up, exp_m1_down, exp_m1_up, exp_up, ln_1p_down, ln_1p_up, ln_down, ln_up, mul_down,
    sqrt_down, sqrt_up, sub_up,
};

/// Stop once the tail bound is below this fraction of `A − 1` …
const TAIL_REL_TOL: f64 = 1e-10;
/// … or below this absolute amount (below f64 resolution of A ≈ 1) …
const TAIL_ABS_TOL: f64 = 1e-18;
/// … or after this many terms per series (the bound stays valid, only looser).
const MAX_TERMS: u32 = 1 << 17;

/// `A − 1` as a sum of signed terms given by enclosures of their logarithms,
/// kept as `e^scale · total` so that neither huge nor tiny terms over- or
/// underflow (the scale follows the largest term seen, as in a streaming
/// log-sum-exp).
///
/// Tracking `A − 1` rather than A keeps `ln A` relatively accurate when A ≈ 1:
/// the dominant left k = 0 term `(1−q)^α·½erfc(−a/(√2σ))` is entered as
/// `((1−q)^α − 1) − (1−q)^α·½erfc(a/(√2σ))` (as ½erfc(−x) = 1 − ½erfc(x)), whose
/// parts are small and cancel only against other small terms.
struct ExcessSum {
    scale: f64,
    total: Interval,
}

impl ExcessSum {
    fn new() -> Self {
        Self {
            scale: f64::NEG_INFINITY,
            total: Interval::exact(0.0),
        }
    }

    /// Adds ±e^{ln_term}.
    fn add(&mut self, ln_term: Interval, negative: bool) {
        if ln_term.hi == f64::NEG_INFINITY {
            return;
        }
        if ln_term.hi > self.scale {
            if self.scale > f64::NEG_INFINITY {
                let shrink = Interval::exact(self.scale)
                    .sub(Interval::exact(ln_term.hi))
                    .exp();
                self.total = self.total.mul(shrink);
            }
            self.scale = ln_term.hi;
        }
        let v = ln_term.sub(Interval::exact(self.scale)).exp();
        self.total = if negative {
            self.total.sub(v)
        } else {
            self.total.add(v)
        };
    }

    /// Upper bound on ln(1 + (A − 1) + e^{ln_extra}) = ln(A + extra).
    fn ln_one_plus_up(&self, ln_extra: f64) -> f64 {
        let s = add_up(self.total.hi, exp_up(sub_up(ln_extra, self.scale)));
        if s <= 0.0 {
            // A − 1 ≤ 0 as bounded, and A ≥ 1 always (a Rényi moment), so ln A = 0.
            return 0.0;
        }
        let l = add_up(self.scale, ln_up(s)); // ≥ ln(A − 1 + extra)
        if l < 0.0 {
            ln_1p_up(exp_up(l))
        } else {
            add_up(l, ln_1p_up(exp_up(-l)))
        }
    }

    /// Rough (float) value of ln(A − 1), for the stopping rule only.
    fn ln_estimate(&self) -> f64 {
        self.scale + self.total.hi.max(f64::MIN_POSITIVE).ln()
    }
}

/// Upper bound on `ln A_α` for fractional α > 1 and 0 < q < 1.
pub(super) fn ln_moment_up(q: f64, sigma: f64, alpha: f64) -> f64 {
    let s = Interval::exact(sigma);
    let two_var = s.mul(s).mul(Interval::exact(2.0));
    let ln_q = Interval::new(ln_down(q), ln_up(q));
    let ln_1mq = Interval::new(ln_1p_down(-q), ln_1p_up(-q));
    let z0 = s.mul(s).mul(ln_1mq.sub(ln_q)).add(Interval::exact(0.5));
    let (a, b) = (z0.lo, z0.hi);
    let sqrt2_sigma = Interval::new(sqrt_down(2.0), sqrt_up(2.0)).mul(s);
    let ln_half = Interval::exact(0.5).ln();
    let alpha_i = Interval::exact(alpha);

    // Terms decrease and alternate from ⌈α⌉ on; stopping is allowed after it.
    let first_alternating = alpha.ceil();
    let ln_rel_tol = TAIL_REL_TOL.ln();
    let ln_abs_tol = TAIL_ABS_TOL.ln();

    let mut excess = ExcessSum::new();
    // ln (1−q)^α
    let ln_keep_all = alpha_i.mul(ln_1mq);
    if a > 0.0 {
        // Left k = 0 term, split: ((1−q)^α − 1) − (1−q)^α·½erfc(a/(√2σ)).
        let drop = Interval::new(exp_m1_down(ln_keep_all.lo), exp_m1_up(ln_keep_all.hi)).neg();
        excess.add(drop.ln(), true);
        let erfc_part = ln_keep_all
            .add(ln_half)
            .add(ln_erfc(Interval::exact(a).div_pos(sqrt2_sigma)));
        excess.add(erfc_part, true);
    } else {
        excess.add(Interval::exact(0.0), true); // the −1
    }

    let mut binom = Binomials::new(alpha);
    let ln_remainder = loop {
        let k = f64::from(binom.k());
        let ln_c = binom.ln_abs();
        let kk = Interval::exact(k);
        let j = alpha_i.sub(kk);
        let left = ln_c
            .add(kk.mul(ln_q))
            .add(j.mul(ln_1mq))
            .add(kk.mul(kk).sub(kk).div_pos(two_var))
            .add(ln_half)
            .add(ln_erfc(kk.sub(Interval::exact(a)).div_pos(sqrt2_sigma)));
        let right = ln_c
            .add(j.mul(ln_q))
            .add(kk.mul(ln_1mq))
            .add(j.mul(j).sub(j).div_pos(two_var))
            .add(ln_half)
            .add(ln_erfc(Interval::exact(b).sub(j).div_pos(sqrt2_sigma)));
        if k >= first_alternating {
            // Remainder from k on: sign of T_k, magnitude ≤ |T_k| (module docs).
            let ln_term = log_add_up(left.hi, right.hi);
            let target = ln_abs_tol.max(ln_rel_tol + excess.ln_estimate());
            if ln_term <= target || binom.k() >= MAX_TERMS {
                break if binom.negative() {
                    f64::NEG_INFINITY
                } else {
                    ln_term
                };
            }
        }
        if binom.k() > 0 || a <= 0.0 {
            excess.add(left, binom.negative());
        }
        excess.add(right, binom.negative());
        binom.advance();
    };
    let ln_sliver = ln_sliver_up(a, b, q, sigma, alpha);
    let ln_extra = log_add_up(ln_remainder, ln_sliver);
    excess.ln_one_plus_up(ln_extra)
}

/// Upper bound on `ln(eˣ + eʸ)`.
fn log_add_up(x: f64, y: f64) -> f64 {
    let (hi, lo) = if x >= y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    add_up(hi, ln_1p_up(exp_up(sub_up(lo, hi))))
}

/// Upper bound on `ln ∫_a^b μ₀ (1 − q + q·r)^α` (−∞ when a = b): width × the
/// largest density on [a, b] × the integrand factor at b (it increases in z).
fn ln_sliver_up(a: f64, b: f64, q: f64, sigma: f64, alpha: f64) -> f64 {
    if a == b {
        return f64::NEG_INFINITY;
    }
    let x = Interval::exact;
    let two_var = x(sigma).mul(x(sigma)).mul(x(2.0));
    // r(b) = e^{(2b − 1)/(2σ²)}
    let r_b = x(2.0).mul(x(b)).sub(x(1.0)).div_pos(two_var).exp();
    let base = x(1.0).sub(x(q)).add(x(q).mul(r_b));
    let ln_power = x(alpha).mul(base.ln());
    // ln μ₀(z) = −z²/(2σ²) − ln(σ√(2π)) at the point of [a, b] nearest 0.
    let nearest = if a > 0.0 {
        a
    } else if b < 0.0 {
        b
    } else {
        0.0
    };
    let ln_density = x(nearest)
        .mul(x(nearest))
        .div_pos(two_var)
        .neg()
        .sub(x(mul_down(sigma, sqrt_down(2.0 * std::f64::consts::PI))).ln());
    let ln_width = x(sub_up(b, a)).ln();
    ln_width.add(ln_density).add(ln_power).hi
}

#[cfg(test)]
// Reference values are quoted with every digit their source printed.
#[allow(clippy::excessive_precision)]
mod tests {
    use super::*;

    /// mpmath quadrature of ln A_α (tests/golden/poisson_gaussian.py, 40 digits).
    #[test]
    fn matches_numerical_integration() {
        let cases: [(f64, f64, f64, f64); 3] = [
            (0.01, 2.5, 1.5, 6.500_708_971_880_397_4e-6),
            (0.01, 2.5, 2.5, 3.256_254_170_754_372_9e-5),
            (0.1, 100.0, 20.5, 1.999_181_845_806_829_6e-4),
        ];
        for (q, sigma, alpha, want) in cases {
            let got = ln_moment_up(q, sigma, alpha);
            assert!(
                got >= want * (1.0 - 1e-9),
                "{q} {sigma} {alpha}: {got} < {want}"
            );
            assert!(
                got <= want * (1.0 + 1e-6),
                "{q} {sigma} {alpha}: {got} ≫ {want}"
            );
        }
    }

    #[test]
    fn sliver_is_negligible() {
        assert_eq!(ln_sliver_up(1.0, 1.0, 0.1, 1.0, 2.5), f64::NEG_INFINITY);
        let s = ln_sliver_up(1.0, 1.0f64.next_up(), 0.1, 1.0, 2.5);
        assert!(s > -1000.0 && s < 1e-14f64.ln());
        // Far from 0 the density, not just the width, makes it vanish.
        assert!(ln_sliver_up(2e4, 2e4 + 1e-11, 0.1, 100.0, 20.5) < -1000.0);
    }
}
