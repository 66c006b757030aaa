//! `ln A_α` of the Poisson-subsampled Gaussian at a fractional order α, with a
//! rigorous upper bound (Mironov, Talwar & Zhang 2019, §3.3).
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
//! # Tails
//!
//! For k > α the coefficients alternate in sign. Using `erfc(x) ≤ e^{−x²}/(x√π)`
//! (x > 0) and `(2a−1)/(2σ²) ≤ ln((1−q)/q)` (as a ≤ z₀), every left term with
//! k > a satisfies `|t_k| ≤ |C(α,k)| (1−q)^α e^{−a²/(2σ²)} σ/((k−a)√(2π))`, and
//! likewise every right term with b + k − α > 0 satisfies
//! `|t_k| ≤ |C(α,k)| (1−q)^α e^{−b²/(2σ²)} σ/((b+k−α)√(2π))`. For K ≥ α,
//! `|C(α,k)| ≤ |C(α,K)| ((K+1)/(k+1))^{α+1}` for k > K (from
//! `1 − (1+α)/i ≤ e^{−(1+α)/i}`), so `Σ_{k>K} |C(α,k)| ≤ |C(α,K)|(K+1)/α`.
//! Summing terms k ≤ K in interval arithmetic and adding these two tail bounds
//! gives an upper bound on A_α whatever K is; K grows until the tail is
//! negligible against `A_α − 1` (or a cap is reached, which only loosens).

use crate::interval::Interval;
use crate::round::{
    add_up, exp_m1_down, exp_m1_up, exp_up, ln_1p_down, ln_1p_up, ln_down, ln_up, mul_down, mul_up,
    sqrt_down, sqrt_up, sub_up,
};
use crate::special::{Binomials, ln_erfc};

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

    // The tail bounds hold from K ≥ α on.
    let k_min = alpha.ceil();
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
    let ln_tail = loop {
        let k = f64::from(binom.k());
        let ln_c = binom.ln_abs();
        if ln_c.hi > f64::NEG_INFINITY {
            let kk = Interval::exact(k);
            let j = alpha_i.sub(kk);
            if binom.k() > 0 || a <= 0.0 {
                let left = ln_c
                    .add(kk.mul(ln_q))
                    .add(j.mul(ln_1mq))
                    .add(kk.mul(kk).sub(kk).div_pos(two_var))
                    .add(ln_half)
                    .add(ln_erfc(kk.sub(Interval::exact(a)).div_pos(sqrt2_sigma)));
                excess.add(left, binom.negative());
            }
            let right = ln_c
                .add(j.mul(ln_q))
                .add(kk.mul(ln_1mq))
                .add(j.mul(j).sub(j).div_pos(two_var))
                .add(ln_half)
                .add(ln_erfc(Interval::exact(b).sub(j).div_pos(sqrt2_sigma)));
            excess.add(right, binom.negative());
        }
        if k >= k_min {
            let ln_tail = ln_tail_bound_up(ln_c.hi, k, alpha, a, b, sigma, ln_1mq.hi);
            let target = ln_abs_tol.max(ln_rel_tol + excess.ln_estimate());
            if ln_tail <= target || binom.k() >= MAX_TERMS {
                break ln_tail;
            }
        }
        binom.advance();
    };
    let ln_sliver = ln_sliver_up(a, b, q, sigma, alpha);
    // e^{ln_tail} + e^{ln_sliver} ≤ 2·e^{max}.
    let ln_extra = add_up(ln_tail.max(ln_sliver), std::f64::consts::LN_2.next_up());
    excess.ln_one_plus_up(ln_extra)
}

/// Upper bound on the ln of the sum of |left| + |right| terms over k > K, for
/// K ≥ α (module docs, "Tails").
fn ln_tail_bound_up(
    ln_c_k: f64,
    k: f64,
    alpha: f64,
    a: f64,
    b: f64,
    sigma: f64,
    ln_1mq_up: f64,
) -> f64 {
    let x = Interval::exact;
    let two_var = x(sigma).mul(x(sigma)).mul(x(2.0));
    // ln[|C(α,K)|·(K+1)/α·(1−q)^α] bounds ln of Σ_{k>K} |C(α,k)|·(1−q)^α.
    let common = x(ln_c_k)
        .add(x(k + 1.0).ln())
        .sub(x(alpha).ln())
        .add(x(mul_up(alpha, ln_1mq_up)));
    // ln(σ/√(2π)); the f64 PI is below π.
    let ln_gauss = x(sigma).ln().sub(
        x(2.0)
            .mul(Interval::new(
                std::f64::consts::PI,
                std::f64::consts::PI.next_up(),
            ))
            .ln()
            .mul(x(0.5)),
    );
    let parabola = |t: f64, c: f64| x(t).mul(x(t).sub(x(2.0).mul(x(c)))).div_pos(two_var).hi;

    // Left series: middle terms K < k ≤ k_far bounded by e^{k(k−2a)/(2σ²)}
    // (convex in k: largest at an end), far terms by the erfc tail.
    let k_far = k.max(a.ceil());
    let mid_left = if k_far > k {
        let top = parabola(k + 1.0, a).max(parabola(k_far, a));
        add_up(common.hi, top)
    } else {
        f64::NEG_INFINITY
    };
    let far_left = common
        .sub(x(a).mul(x(a)).div_pos(two_var))
        .add(ln_gauss)
        .sub(x(k_far + 1.0).sub(x(a)).ln())
        .hi;
    // Right series, in j = α − k ≤ 0: middle terms bounded by e^{j(j−2b)/(2σ²)},
    // far terms (b − j ≥ 1) by the erfc tail.
    let k_far_r = k.max((alpha - b).ceil());
    let mid_right = if k_far_r > k {
        let j_first = x(alpha).sub(x(k + 1.0));
        let j_last = x(alpha).sub(x(k_far_r));
        let at = |j: Interval| j.mul(j.sub(x(2.0).mul(x(b)))).div_pos(two_var).hi;
        add_up(common.hi, at(j_first).max(at(j_last)))
    } else {
        f64::NEG_INFINITY
    };
    let far_right = common
        .sub(x(b).mul(x(b)).div_pos(two_var))
        .add(ln_gauss)
        .sub(x(b).add(x(k_far_r + 1.0)).sub(x(alpha)).ln())
        .hi;
    // ln of a sum of four terms ≤ ln 4 + the largest.
    let largest = mid_left.max(far_left).max(mid_right).max(far_right);
    add_up(largest, ln_up(4.0))
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
