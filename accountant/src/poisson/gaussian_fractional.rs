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
    add_up, exp_up, ln_1p_down, ln_1p_up, ln_down, ln_up, mul_down, mul_up, sqrt_down, sqrt_up,
    sub_up,
};
use crate::special::{Binomials, ln_erfc};

/// Stop once the tail bound is below this fraction of `A − 1` …
const TAIL_REL_TOL: f64 = 1e-10;
/// … or below this absolute amount (below f64 resolution of A ≈ 1) …
const TAIL_ABS_TOL: f64 = 1e-18;
/// … or after this many terms per series (the bound stays valid, only looser).
const MAX_TERMS: u32 = 1 << 17;

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

    let mut binom = Binomials::new(alpha);
    let mut sum = Interval::exact(0.0);
    let tail = loop {
        let k = f64::from(binom.k());
        let ln_c = binom.ln_abs();
        if ln_c.hi > f64::NEG_INFINITY {
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
            let term = left.exp().add(right.exp());
            sum = if binom.negative() {
                sum.sub(term)
            } else {
                sum.add(term)
            };
        }
        if k >= k_min {
            let tail = tail_bound_up(ln_c.hi, k, alpha, a, b, sigma, ln_1mq.hi);
            let excess = sub_up(sum.hi, 1.0).max(0.0);
            if tail <= TAIL_ABS_TOL.max(TAIL_REL_TOL * excess) || binom.k() >= MAX_TERMS {
                break tail;
            }
        }
        binom.advance();
    };
    let total = add_up(add_up(sum.hi, tail), sliver_up(a, b, q, sigma, alpha));
    ln_up(total)
}

/// Upper bound on the sum of |left| + |right| terms over k > K, for K ≥ α
/// (module docs, "Tails").
fn tail_bound_up(
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
        exp_up(add_up(common.hi, top))
    } else {
        0.0
    };
    let far_left = common
        .sub(x(a).mul(x(a)).div_pos(two_var))
        .add(ln_gauss)
        .sub(x(k_far + 1.0).sub(x(a)).ln())
        .exp()
        .hi;
    // Right series, in j = α − k ≤ 0: middle terms bounded by e^{j(j−2b)/(2σ²)},
    // far terms (b − j ≥ 1) by the erfc tail.
    let k_far_r = k.max((alpha - b).ceil());
    let mid_right = if k_far_r > k {
        let j_first = x(alpha).sub(x(k + 1.0));
        let j_last = x(alpha).sub(x(k_far_r));
        let at = |j: Interval| j.mul(j.sub(x(2.0).mul(x(b)))).div_pos(two_var).hi;
        exp_up(add_up(common.hi, at(j_first).max(at(j_last))))
    } else {
        0.0
    };
    let far_right = common
        .sub(x(b).mul(x(b)).div_pos(two_var))
        .add(ln_gauss)
        .sub(x(b).add(x(k_far_r + 1.0)).sub(x(alpha)).ln())
        .exp()
        .hi;
    add_up(add_up(mid_left, far_left), add_up(mid_right, far_right))
}

/// Upper bound on `∫_a^b μ₀ (1 − q + q·r)^α` (zero when a = b): width × the
/// largest density on [a, b] × the integrand factor at b (it increases in z).
fn sliver_up(a: f64, b: f64, q: f64, sigma: f64, alpha: f64) -> f64 {
    if a == b {
        return 0.0;
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
    exp_up(ln_width.add(ln_density).add(ln_power).hi)
}

#[cfg(test)]
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
        assert_eq!(sliver_up(1.0, 1.0, 0.1, 1.0, 2.5), 0.0);
        let s = sliver_up(1.0, 1.0f64.next_up(), 0.1, 1.0, 2.5);
        assert!(s > 0.0 && s < 1e-14);
        // Far from 0 the density, not just the width, makes it vanish.
        assert!(sliver_up(2e4, 2e4 + 1e-11, 0.1, 100.0, 20.5) < 1e-300);
    }
}
