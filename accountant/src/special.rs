//! Enclosures of the special functions the subsampling bounds need:
//! `ln erfc` and logarithms of (generalised) binomial coefficients.

use crate::interval::Interval;
use privmix_renyi::round::{add_down, add_up, ln_down, ln_up, mul_down, mul_up};

/// Relative error allowed for `libm::erfc` below the asymptotic range: 4 ulps.
///
/// The `libm` crate ports musl/FreeBSD's fdlibm `erfc`, whose rational
/// approximations are accurate to below 2⁻⁵⁷ before the final roundings (about
/// one ulp in all). The enclosure assumes 4 ulps; the test
/// `libm_erfc_is_within_the_assumed_error` checks it against 863 mpmath values
/// on [−6, 26] (tests/golden/erfc_values.py).
const ERFC_REL_ERR: f64 = 4.0 * f64::EPSILON;

/// From this argument on, `erfc` comes from its asymptotic expansion (where
/// `libm::erfc` would approach the subnormal range).
const ASYMPTOTIC_FROM: f64 = 26.0;

/// Terms of the asymptotic series kept (the remainder bound is then below
/// 1e-19 relative at x = 26).
const ASYMPTOTIC_TERMS: u32 = 8;

/// An enclosure of `ln erfc(x)` for every x in `x` (erfc is decreasing).
pub(crate) fn ln_erfc(x: Interval) -> Interval {
    Interval::new(ln_erfc_point(x.hi).lo, ln_erfc_point(x.lo).hi)
}

/// An enclosure of `ln erfc(x)` at one float x.
fn ln_erfc_point(x: f64) -> Interval {
    if x < ASYMPTOTIC_FROM {
        let v = libm::erfc(x);
        let lo = mul_down(v, 1.0 - ERFC_REL_ERR);
        let hi = mul_up(v, 1.0 + ERFC_REL_ERR);
        return Interval::new(ln_down(lo), ln_up(hi));
    }
    // erfc(x) = e^{−x²}/(x√π) · S(x), S(x) = Σ_{n<N} (−1)ⁿ (2n−1)!!/(2x²)ⁿ + R_N,
    // |R_N| ≤ (2N−1)!!/(2x²)^N for real x > 0 (DLMF 7.12.1 with the remainder
    // bound of §7.12(i)).
    let two_x2 = Interval::new(mul_down(2.0, mul_down(x, x)), mul_up(2.0, mul_up(x, x)));
    let mut sum = Interval::exact(1.0);
    let mut term = Interval::exact(1.0); // (2n−1)!!/(2x²)ⁿ, magnitude
    for n in 1..=ASYMPTOTIC_TERMS {
        term = term
            .mul(Interval::exact(f64::from(2 * n - 1)))
            .div_pos(two_x2);
        sum = if n % 2 == 1 {
            sum.sub(term)
        } else {
            sum.add(term)
        };
    }
    let remainder = term
        .mul(Interval::exact(f64::from(2 * ASYMPTOTIC_TERMS + 1)))
        .div_pos(two_x2)
        .hi;
    let series = Interval::new(add_down(sum.lo, -remainder), add_up(sum.hi, remainder));
    // ln erfc(x) = −x² − ln x − ½ ln π + ln S(x).
    let x2 = Interval::new(mul_down(x, x), mul_up(x, x));
    let half_ln_pi = Interval::new(
        mul_down(0.5, ln_down(std::f64::consts::PI)),
        mul_up(0.5, ln_up(std::f64::consts::PI)),
    );
    x2.neg()
        .sub(Interval::exact(x).ln())
        .sub(half_ln_pi)
        .add(series.ln())
}

/// Successive `ln |C(α, k)|` and the sign of `C(α, k)` for k = 0, 1, 2, …, for
/// real α > 0, by the recurrence `C(α, k) = C(α, k−1)·(α − k + 1)/k`.
///
/// Exact zeros (integer α, k > α) are reported with `ln |C| = −∞`.
pub(crate) struct Binomials {
    alpha: f64,
    k: u32,
    ln_abs: Interval,
    negative: bool,
}

impl Binomials {
    /// Starts at k = 0: C(α, 0) = 1.
    pub(crate) fn new(alpha: f64) -> Self {
        Self {
            alpha,
            k: 0,
            ln_abs: Interval::exact(0.0),
            negative: false,
        }
    }

    /// The current k.
    pub(crate) fn k(&self) -> u32 {
        self.k
    }

    /// Enclosure of `ln |C(α, k)|` at the current k.
    pub(crate) fn ln_abs(&self) -> Interval {
        self.ln_abs
    }

    /// Whether `C(α, k) < 0` at the current k.
    pub(crate) fn negative(&self) -> bool {
        self.negative
    }

    /// Moves to k + 1.
    pub(crate) fn advance(&mut self) {
        self.k += 1;
        let k = f64::from(self.k);
        // α − k + 1 = α − (k − 1); k − 1 is an exact integer.
        let factor = Interval::exact(self.alpha).sub(Interval::exact(k - 1.0));
        if factor.lo < 0.0 && factor.hi > 0.0 || factor.lo == 0.0 && factor.hi == 0.0 {
            // Straddling or at 0: only possible when α is (within rounding) an
            // integer; the coefficient from here on is 0 (or bounded by the
            // enclosure's width, which the caller never relies on).
            self.ln_abs = Interval::exact(f64::NEG_INFINITY);
            return;
        }
        if factor.hi < 0.0 {
            self.negative = !self.negative;
        }
        let abs = if factor.hi < 0.0 {
            factor.neg()
        } else {
            factor
        };
        self.ln_abs = self.ln_abs.add(abs.ln()).sub(Interval::exact(k).ln());
    }
}

/// Upper bounds on `ln C(n, k)` for k = 0..=n (integer n), by the same recurrence.
pub(crate) fn ln_binomials_up(n: u32) -> Vec<f64> {
    let mut out = Vec::with_capacity(n as usize + 1);
    let mut acc = 0.0;
    out.push(acc);
    for k in 1..=n {
        acc = add_up(
            add_up(acc, ln_up(f64::from(n - k + 1))),
            -ln_down(f64::from(k)),
        );
        out.push(acc.max(0.0));
    }
    out
}

/// An enclosure of `ln C(n, k)` for k = 0..=n (integer n).
pub(crate) fn ln_binomials(n: u32) -> Vec<Interval> {
    let mut out = Vec::with_capacity(n as usize + 1);
    let mut acc = Interval::exact(0.0);
    out.push(acc);
    for k in 1..=n {
        acc = acc
            .add(Interval::exact(f64::from(n - k + 1)).ln())
            .sub(Interval::exact(f64::from(k)).ln());
        out.push(Interval::new(acc.lo.max(0.0), acc.hi.max(0.0)));
    }
    out
}

#[cfg(test)]
// Reference values are quoted with every digit their source printed.
#[allow(clippy::excessive_precision)]
mod tests {
    use super::*;

    fn contains(i: Interval, x: f64, tol: f64) -> bool {
        i.lo - tol <= x && x <= i.hi + tol
    }

    #[test]
    fn ln_erfc_encloses_reference_values() {
        // mpmath `log(erfc(x))` at 50 digits (tests/golden/special_values.py).
        let cases = [
            (-3.0, 0.693_136_135_250_446_8),
            (0.0, 0.0),
            (1.0, -1.849_605_509_933_248_2),
            (10.0, -102.879_889_024_844_89),
            (25.0, -628.792_039_174_071_7),
            (26.0, -679.831_199_763_194_2),
            (100.0, -10_005.177_585_122_664),
        ];
        for (x, want) in cases {
            let got = ln_erfc(Interval::exact(x));
            assert!(
                contains(got, want, 1e-12 * want.abs().max(1.0)),
                "{x}: {got:?} vs {want}"
            );
            assert!(
                got.hi - got.lo < 1e-12 * want.abs().max(1.0),
                "{x}: {got:?} too wide"
            );
        }
    }

    #[test]
    fn libm_erfc_is_within_the_assumed_error() {
        let table = include_str!("../tests/golden/erfc_values.txt");
        let mut worst = 0.0f64;
        for line in table.lines() {
            let mut it = line.split_whitespace();
            let x: f64 = it.next().unwrap().parse().unwrap();
            let want: f64 = it.next().unwrap().parse().unwrap();
            let rel = (libm::erfc(x) - want).abs() / want;
            worst = worst.max(rel);
        }
        // The reference is rounded to f64 (½ ulp) on parsing.
        assert!(
            worst <= ERFC_REL_ERR - f64::EPSILON,
            "worst relative error {worst:e}"
        );
    }

    #[test]
    fn asymptotic_and_libm_branches_agree_at_the_switch() {
        let below = ln_erfc_point(ASYMPTOTIC_FROM.next_down());
        let at = ln_erfc_point(ASYMPTOTIC_FROM);
        assert!((below.hi - at.hi).abs() < 1e-10);
    }

    #[test]
    fn generalised_binomials_match_direct_products() {
        let alpha = 2.5;
        let mut b = Binomials::new(alpha);
        let mut direct = 1.0f64;
        for k in 1..12u32 {
            direct *= (alpha - f64::from(k) + 1.0) / f64::from(k);
            b.advance();
            assert_eq!(b.k(), k);
            assert_eq!(b.negative(), direct < 0.0, "k = {k}");
            assert!(contains(b.ln_abs(), direct.abs().ln(), 1e-13), "k = {k}");
        }
    }

    #[test]
    fn integer_binomials_bound_the_exact_values() {
        let up = ln_binomials_up(60);
        let enc = ln_binomials(60);
        // C(60, 30) = 118264581564861424.
        let exact = 118_264_581_564_861_424f64.ln();
        assert!(up[30] >= exact && up[30] - exact < 1e-12);
        assert!(contains(enc[30], exact, 0.0));
        assert_eq!(up[0], 0.0);
        assert!(up[60].abs() < 1e-12);
    }
}
