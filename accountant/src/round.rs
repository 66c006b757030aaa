//! Outward-rounded f64 arithmetic: every privacy number the crate reports is an
//! upper bound on the exact real-number result of its formula.
//!
//! Like OpenDP's `InfAdd`/`InfMul`/`InfLn` family, each operation here returns
//! a float on the stated side of the exact value:
//!
//! * `+ − × ÷` are exact-directed: the rounding error of the round-to-nearest
//!   result is recovered exactly (TwoSum for sums, a fused multiply-add residual
//!   for products and quotients) and the result is moved one ulp only when the
//!   error points the wrong way. An exactly representable result is returned
//!   unchanged.
//! * `ln`, `ln_1p`, `exp`, `exp_m1` are moved one ulp outward unconditionally.
//!   This is a bound under the assumption, documented as OpenDP documents its own,
//!   that the platform's libm is *faithful* (error below one ulp), which glibc,
//!   musl and Rust's `libm` port all state for these functions.
//!
//! Overflow in an upward operation gives +∞ (a valid, if useless, upper bound);
//! in a downward operation it gives `f64::MAX`, never +∞.

/// `a + b` rounded up (toward +∞).
pub(crate) fn add_up(a: f64, b: f64) -> f64 {
    let s = a + b;
    if !s.is_finite() {
        return s;
    }
    let err = two_sum_err(a, b, s);
    if err > 0.0 { s.next_up() } else { s }
}

/// `a + b` rounded down (toward −∞).
pub(crate) fn add_down(a: f64, b: f64) -> f64 {
    let s = a + b;
    if !s.is_finite() {
        return finite_down(s, a.is_finite() && b.is_finite());
    }
    let err = two_sum_err(a, b, s);
    if err < 0.0 { s.next_down() } else { s }
}

/// `a − b` rounded up.
pub(crate) fn sub_up(a: f64, b: f64) -> f64 {
    add_up(a, -b)
}

/// `a − b` rounded down.
pub(crate) fn sub_down(a: f64, b: f64) -> f64 {
    add_down(a, -b)
}

/// `a · b` rounded up.
pub(crate) fn mul_up(a: f64, b: f64) -> f64 {
    let p = a * b;
    if p.is_nan() || !a.is_finite() || !b.is_finite() || a == 0.0 || b == 0.0 {
        // Products with an infinite or zero factor are exact.
        return p;
    }
    if p.is_infinite() {
        // Overflow: +∞ is an upper bound; −∞ is below the (finite) truth.
        return if p < 0.0 { -f64::MAX } else { p };
    }
    if p.abs() < SAFE_RESIDUAL_MIN {
        // Residuals of (nearly) subnormal products are not exact: step regardless.
        return p.next_up();
    }
    let err = a.mul_add(b, -p);
    if err > 0.0 { p.next_up() } else { p }
}

/// `a · b` rounded down.
pub(crate) fn mul_down(a: f64, b: f64) -> f64 {
    -mul_up(-a, b)
}

/// `a / b` rounded up (`b ≠ 0`).
pub(crate) fn div_up(a: f64, b: f64) -> f64 {
    let q = a / b;
    if q.is_nan() || !a.is_finite() || !b.is_finite() || a == 0.0 {
        // ∞/x, x/∞ and 0/x are exact.
        return q;
    }
    if q.is_infinite() {
        return if q < 0.0 { -f64::MAX } else { q };
    }
    if q.abs() < SAFE_RESIDUAL_MIN || a.abs() < SAFE_RESIDUAL_MIN {
        return q.next_up();
    }
    // a = q·b + r exactly; the true quotient is q + r/b.
    let r = (-q).mul_add(b, a);
    if r != 0.0 && (r > 0.0) == (b > 0.0) {
        q.next_up()
    } else {
        q
    }
}

/// `a / b` rounded down (`b ≠ 0`).
pub(crate) fn div_down(a: f64, b: f64) -> f64 {
    -div_up(-a, b)
}

/// `ln x` rounded up (faithful-libm assumption, see the module docs).
pub(crate) fn ln_up(x: f64) -> f64 {
    if x == 1.0 { 0.0 } else { step_up(x.ln()) }
}

/// `ln x` rounded down.
pub(crate) fn ln_down(x: f64) -> f64 {
    if x == 1.0 { 0.0 } else { step_down(x.ln()) }
}

/// `ln(1 + x)` rounded up.
pub(crate) fn ln_1p_up(x: f64) -> f64 {
    if x == 0.0 { 0.0 } else { step_up(x.ln_1p()) }
}

/// `ln(1 + x)` rounded down.
pub(crate) fn ln_1p_down(x: f64) -> f64 {
    if x == 0.0 { 0.0 } else { step_down(x.ln_1p()) }
}

/// `eˣ` rounded up.
pub(crate) fn exp_up(x: f64) -> f64 {
    match x {
        0.0 => 1.0,
        f64::NEG_INFINITY => 0.0,
        _ => step_up(x.exp()),
    }
}

/// `eˣ` rounded down (never below 0).
pub(crate) fn exp_down(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        step_down(x.exp()).max(0.0)
    }
}

/// `eˣ − 1` rounded up.
pub(crate) fn exp_m1_up(x: f64) -> f64 {
    match x {
        0.0 => 0.0,
        f64::NEG_INFINITY => -1.0,
        _ => step_up(x.exp_m1()),
    }
}

/// `eˣ − 1` rounded down (never below −1).
pub(crate) fn exp_m1_down(x: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        step_down(x.exp_m1()).max(-1.0)
    }
}

/// `√x` rounded up (`x ≥ 0`). IEEE square root is correctly rounded; the FMA
/// residual tells on which side of the truth it landed.
pub(crate) fn sqrt_up(x: f64) -> f64 {
    let s = x.sqrt();
    if !s.is_finite() || x == 0.0 {
        return s;
    }
    if x < SAFE_RESIDUAL_MIN {
        // The residual could underflow: step regardless.
        return s.next_up();
    }
    if s.mul_add(s, -x) < 0.0 {
        s.next_up()
    } else {
        s
    }
}

/// `√x` rounded down (`x ≥ 0`).
pub(crate) fn sqrt_down(x: f64) -> f64 {
    let s = x.sqrt();
    if !s.is_finite() || x == 0.0 {
        return s;
    }
    if x < SAFE_RESIDUAL_MIN {
        return s.next_down();
    }
    if s.mul_add(s, -x) > 0.0 {
        s.next_down()
    } else {
        s
    }
}

/// The largest f64 not above `n` (`n as f64` rounds to nearest above 2^53).
pub(crate) fn u64_down(n: u64) -> f64 {
    let x = n as f64;
    if x as u128 > u128::from(n) {
        x.next_down()
    } else {
        x
    }
}

/// The smallest f64 not below `n`.
pub(crate) fn u64_up(n: u64) -> f64 {
    let x = n as f64;
    if (x as u128) < u128::from(n) {
        x.next_up()
    } else {
        x
    }
}

/// Below this magnitude an FMA residual may itself be rounded (subnormal range).
const SAFE_RESIDUAL_MIN: f64 = f64::MIN_POSITIVE * (1u64 << 53) as f64;

/// The exact rounding error of `s = fl(a + b)` (Knuth's TwoSum), valid without overflow.
fn two_sum_err(a: f64, b: f64, s: f64) -> f64 {
    let b_virtual = s - a;
    let a_virtual = s - b_virtual;
    (a - a_virtual) + (b - b_virtual)
}

/// One ulp up for a transcendental result. Infinite results are exact (they come
/// from infinite arguments or are a valid upward overflow); the callers
/// special-case the exact points (`ln 1 = 0`, `e⁰ = 1`, `e^−∞ = 0`, …).
fn step_up(y: f64) -> f64 {
    if y.is_finite() { y.next_up() } else { y }
}

/// One ulp down for a transcendental result (see [`step_up`]).
fn step_down(y: f64) -> f64 {
    if y.is_finite() { y.next_down() } else { y }
}

/// A downward result that overflowed to ±∞ from finite inputs.
fn finite_down(s: f64, inputs_finite: bool) -> f64 {
    if s == f64::INFINITY && inputs_finite {
        f64::MAX
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sums_are_unchanged_and_inexact_ones_bracket() {
        assert_eq!(add_up(1.0, 2.0), 3.0);
        assert_eq!(add_down(1.0, 2.0), 3.0);
        // 0.1 + 0.2 rounds up to 0.30000000000000004 under round-to-nearest.
        let (lo, hi) = (add_down(0.1, 0.2), add_up(0.1, 0.2));
        assert!(lo < hi);
        assert_eq!(hi.next_down(), lo);
        // 1 + 2^-60 is inexact: the upper result must exceed 1.
        let tiny = 2f64.powi(-60);
        assert_eq!(add_up(1.0, tiny), 1.0f64.next_up());
        assert_eq!(add_down(1.0, tiny), 1.0);
        assert_eq!(sub_down(1.0, tiny), 1.0f64.next_down());
    }

    #[test]
    fn products_and_quotients_bracket_the_truth() {
        assert_eq!(mul_up(3.0, 0.5), 1.5);
        let (lo, hi) = (mul_down(0.1, 3.0), mul_up(0.1, 3.0));
        assert_eq!(lo.next_up(), hi);
        assert_eq!(div_up(1.0, 4.0), 0.25);
        let (lo, hi) = (div_down(1.0, 3.0), div_up(1.0, 3.0));
        assert_eq!(lo.next_up(), hi);
        assert!(lo < 1.0 / 3.0 || hi > 1.0 / 3.0);
        // Signs: dividing by a negative number flips the side of the residual.
        let (lo, hi) = (div_down(1.0, -3.0), div_up(1.0, -3.0));
        assert_eq!(lo.next_up(), hi);
        assert!(hi < 0.0);
    }

    #[test]
    fn overflow_and_underflow_stay_on_the_safe_side() {
        assert_eq!(add_up(f64::MAX, f64::MAX), f64::INFINITY);
        assert_eq!(add_down(f64::MAX, f64::MAX), f64::MAX);
        assert_eq!(mul_up(1e-200, 1e-200), f64::from_bits(1));
        let lo = mul_down(1e-200, 1e-200);
        assert!(lo <= 0.0 && lo > -1e-300);
        assert_eq!(mul_up(f64::MAX, 2.0), f64::INFINITY);
    }

    #[test]
    fn transcendentals_step_outward() {
        assert!(ln_up(2.0) > std::f64::consts::LN_2);
        assert!(ln_down(2.0) < std::f64::consts::LN_2);
        assert_eq!(ln_up(1.0), 0.0);
        assert_eq!(exp_up(0.0), 1.0);
        assert_eq!(exp_up(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_down(-1000.0), 0.0);
        assert_eq!(exp_m1_down(-1000.0), -1.0);
        assert!(ln_1p_up(1e-20) > 1e-20 && ln_1p_down(1e-20) < 1e-20);
        assert!(exp_m1_up(1e-20) > 1e-20);
        assert_eq!(sqrt_up(4.0), 2.0);
        assert_eq!(sqrt_down(4.0), 2.0);
        let (lo, hi) = (sqrt_down(2.0), sqrt_up(2.0));
        assert_eq!(lo.next_up(), hi);
        assert!(lo * lo < 2.0 || hi * hi > 2.0);
    }
}
