//! Closed intervals of reals with outward-rounded endpoints.
//!
//! Series with terms of both signs (the fractional-order subsampled Gaussian,
//! forward differences) are summed as intervals: every term is enclosed, the
//! enclosure of the sum is exact up to outward rounding, and the upper endpoint
//! is a valid upper bound however much the terms cancel. This is what keeps
//! a signed series from ever reporting a value below the true one (or below 0).

use privmix_renyi::round::{
    add_down, add_up, div_down, div_up, exp_down, exp_up, ln_down, ln_up, mul_down, mul_up,
};

/// The set `[lo, hi]`, `lo ≤ hi`; an enclosure of one unknown real.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Interval {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
}

impl Interval {
    /// The degenerate interval holding an exactly representable value.
    pub(crate) fn exact(x: f64) -> Self {
        Self { lo: x, hi: x }
    }

    /// The interval `[lo, hi]`.
    pub(crate) fn new(lo: f64, hi: f64) -> Self {
        debug_assert!(lo <= hi, "interval [{lo}, {hi}] is empty");
        Self { lo, hi }
    }

    /// The enclosure of a sum.
    pub(crate) fn add(self, o: Self) -> Self {
        Self::new(add_down(self.lo, o.lo), add_up(self.hi, o.hi))
    }

    /// The enclosure of a difference.
    pub(crate) fn sub(self, o: Self) -> Self {
        self.add(o.neg())
    }

    /// Negation (exact).
    pub(crate) fn neg(self) -> Self {
        Self::new(-self.hi, -self.lo)
    }

    /// The enclosure of a product of finite intervals.
    pub(crate) fn mul(self, o: Self) -> Self {
        let (a, b, c, d) = (self.lo, self.hi, o.lo, o.hi);
        let lo = mul_down(a, c)
            .min(mul_down(a, d))
            .min(mul_down(b, c))
            .min(mul_down(b, d));
        let hi = mul_up(a, c)
            .max(mul_up(a, d))
            .max(mul_up(b, c))
            .max(mul_up(b, d));
        Self::new(lo, hi)
    }

    /// The enclosure of a quotient by a strictly positive interval.
    pub(crate) fn div_pos(self, o: Self) -> Self {
        debug_assert!(o.lo > 0.0);
        let lo = if self.lo >= 0.0 {
            div_down(self.lo, o.hi)
        } else {
            div_down(self.lo, o.lo)
        };
        let hi = if self.hi >= 0.0 {
            div_up(self.hi, o.lo)
        } else {
            div_up(self.hi, o.hi)
        };
        Self::new(lo, hi)
    }

    /// `ln` of a positive interval (monotone). A lower end at 0 gives −∞.
    pub(crate) fn ln(self) -> Self {
        Self::new(ln_down(self.lo.max(0.0)), ln_up(self.hi))
    }

    /// `exp` (monotone).
    pub(crate) fn exp(self) -> Self {
        Self::new(exp_down(self.lo), exp_up(self.hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enclosures_contain_the_float_results() {
        let third = Interval::exact(1.0).div_pos(Interval::exact(3.0));
        assert!(third.lo <= 1.0 / 3.0 && 1.0 / 3.0 <= third.hi && third.lo < third.hi);
        let p = Interval::new(-2.0, 3.0).mul(Interval::new(-5.0, 1.0));
        assert_eq!((p.lo, p.hi), (-15.0, 10.0));
        let e = Interval::exact(1.0).exp().ln();
        assert!(e.lo <= 1.0 && 1.0 <= e.hi);
        let d = Interval::exact(1.0).sub(Interval::exact(1e-30));
        assert!(d.lo < 1.0 && d.hi == 1.0);
        let q = Interval::new(-1.0, 2.0).div_pos(Interval::new(2.0, 4.0));
        assert_eq!((q.lo, q.hi), (-0.5, 1.0));
    }
}
