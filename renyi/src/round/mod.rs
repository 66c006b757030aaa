//! Outward-rounded f64 arithmetic: the one place where privmix rounds a privacy
//! number toward the safe side.
//!
//! Every function here returns a float on the side of the exact real result that its
//! name states: `*_up` a value `≥` the exact result, `*_down` a value `≤` it. Privacy
//! quantities (ε, δ, RDP values, radii a solver must enforce) are computed with them so
//! that a reported bound is never below the bound its formula defines, as OpenDP does
//! with its `InfAdd`/`InfMul`/`InfLn` family.
//!
//! # How each operation is bounded
//!
//! * `+ − × ÷ √` and the conversions from integers ([`u64_up`], [`usize_down`], …) are
//!   *exact-directed*: the result is the closest float on the requested side, so an
//!   exactly representable result is returned unchanged (one ulp looser at most near
//!   the subnormal range). The rounding error is recovered exactly (TwoSum for sums, a
//!   fused multiply-add residual for products, quotients and square roots) and the
//!   result moves one ulp only when that error points the wrong way.
//! * `ln`, `ln(1+x)`, `eˣ`, `eˣ − 1` move the platform's result one ulp outward, except
//!   at the points where the exact value is a float (`ln 1 = 0`, `e⁰ = 1`, `e^{−∞} = 0`,
//!   …), which are returned exactly. This is a bound under the one assumption of this
//!   module, documented as OpenDP documents its own: the platform's libm is *faithful*
//!   for these functions (error below one ulp), as glibc, musl and Rust's `libm` port
//!   state; the tests check it against 60-digit mpmath values. [`step_up`] and
//!   [`step_down`] apply the same one-ulp rule to any other faithful result.
//!
//! The argument for each operation (exactness of the residuals, the subnormal
//! threshold, overflow, compositions) is written out in `proof.md` beside this file.
//!
//! # One rule for 0, ±∞ and NaN
//!
//! * **NaN** in any argument gives NaN; so does an operation undefined on the extended
//!   reals (`∞ − ∞`, `0·∞`, `0/0`, `∞/∞`, the logarithm or square root of a negative
//!   number). A NaN is never turned into a number: callers validate their inputs.
//! * **Exact results are returned as IEEE 754 computes them**, so `0` stays `0` (its
//!   sign is unspecified: `−0` and `+0` compare equal), and operations with an infinite operand whose IEEE result is `±∞` or
//!   `0` (`∞ + 1`, `2·∞`, `1/∞`, `ln 0 = −∞`, `e^∞ = ∞`) are exact. Division by zero
//!   returns IEEE's `±∞` (or NaN for `0/0`).
//! * **Overflow** from finite operands stays on the named side: an upward result is
//!   `+∞` when the exact value exceeds `f64::MAX` and `−f64::MAX` when it is below
//!   `−f64::MAX`; a downward result is `f64::MAX` and `−∞` respectively. An upward
//!   result is never `−∞` and a downward one never `+∞` unless an operand was.
//! * **Underflow** needs no rule: results in the subnormal range are bounds like any
//!   other (a product or a quotient that rounds to 0 but is not exactly 0 becomes the
//!   smallest subnormal of the right sign on the requested side).
//!
//! # Choosing an operation
//!
//! Compose them so that every intermediate is on the side that keeps the final
//! result a bound: an upper bound on `a − b` is `sub_up(a_hi, b_lo)`, on `x/y` for
//! positive `x, y` is `div_up(x_hi, y_lo)`, on `ln x` is `ln_up(x_hi)` (ln is
//! increasing), on `e^{−x}` is `exp_up(−x_lo)`. A value computed with plain f64
//! arithmetic and then moved one ulp is *not* a bound in general (several roundings
//! can each lose up to half an ulp); use these operations instead.
//!
//! ```
//! use privmix_renyi::round::{add_down, add_up, div_up, ln_up, mul_up};
//!
//! // 0.1 + 0.2 is not a float: the two directions bracket it, one ulp apart.
//! let (lo, hi) = (add_down(0.1, 0.2), add_up(0.1, 0.2));
//! assert_eq!(lo.next_up(), hi);
//! // Exact results are returned unchanged.
//! assert_eq!(mul_up(3.0, 0.5), 1.5);
//! assert_eq!(ln_up(1.0), 0.0);
//! // ε = ln(1 + 1/3) rounded up: every step on the upper side.
//! let eps = ln_up(add_up(1.0, div_up(1.0, 3.0)));
//! assert!(eps >= (4.0_f64 / 3.0).ln());
//! ```

/// `a + b` rounded up (toward +∞).
pub fn add_up(a: f64, b: f64) -> f64 {
    let s = a + b;
    if !s.is_finite() {
        return overflow_up(s, a.is_finite() && b.is_finite());
    }
    // The error is exact unless an intermediate of TwoSum overflowed (NaN or ±∞ then):
    // step regardless in that case.
    let err = two_sum_err(a, b, s);
    if err > 0.0 || !err.is_finite() {
        s.next_up()
    } else {
        s
    }
}

/// `a + b` rounded down (toward −∞).
pub fn add_down(a: f64, b: f64) -> f64 {
    -add_up(-a, -b)
}

/// `a − b` rounded up.
pub fn sub_up(a: f64, b: f64) -> f64 {
    add_up(a, -b)
}

/// `a − b` rounded down.
pub fn sub_down(a: f64, b: f64) -> f64 {
    add_down(a, -b)
}

/// `Σ xs` rounded up: each partial sum rounded up, in the order given.
pub fn sum_up(xs: impl IntoIterator<Item = f64>) -> f64 {
    xs.into_iter().fold(0.0, add_up)
}

/// `Σ xs` rounded down: each partial sum rounded down, in the order given.
pub fn sum_down(xs: impl IntoIterator<Item = f64>) -> f64 {
    xs.into_iter().fold(0.0, add_down)
}

/// `a · b` rounded up.
pub fn mul_up(a: f64, b: f64) -> f64 {
    let p = a * b;
    if p.is_nan() || !a.is_finite() || !b.is_finite() || a == 0.0 || b == 0.0 {
        // Products with an infinite or a zero factor are exact (or NaN).
        return p;
    }
    if p.is_infinite() {
        return overflow_up(p, true);
    }
    if p.abs() < SAFE_RESIDUAL_MIN {
        // The residual of a (nearly) subnormal product may be rounded: step regardless.
        return p.next_up();
    }
    // a·b = p + err exactly.
    let err = a.mul_add(b, -p);
    if err > 0.0 { p.next_up() } else { p }
}

/// `a · b` rounded down.
pub fn mul_down(a: f64, b: f64) -> f64 {
    -mul_up(-a, b)
}

/// `a / b` rounded up. Division by zero gives IEEE's `±∞` (NaN for `0/0`).
pub fn div_up(a: f64, b: f64) -> f64 {
    let q = a / b;
    if q.is_nan() || !a.is_finite() || !b.is_finite() || a == 0.0 || b == 0.0 {
        // ∞/x, x/∞, 0/x and x/0 are IEEE's exact (extended-real) answers.
        return q;
    }
    if q.is_infinite() {
        return overflow_up(q, true);
    }
    if q.abs() < SAFE_RESIDUAL_MIN || a.abs() < SAFE_RESIDUAL_MIN {
        return q.next_up();
    }
    // a = q·b + r exactly; the exact quotient is q + r/b.
    let r = (-q).mul_add(b, a);
    if r != 0.0 && (r > 0.0) == (b > 0.0) {
        q.next_up()
    } else {
        q
    }
}

/// `a / b` rounded down. Division by zero gives IEEE's `±∞` (NaN for `0/0`).
pub fn div_down(a: f64, b: f64) -> f64 {
    -div_up(-a, b)
}

/// `√x` rounded up (NaN for `x < 0`). IEEE square root is correctly rounded; the FMA
/// residual tells on which side of the exact root it landed.
pub fn sqrt_up(x: f64) -> f64 {
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

/// `√x` rounded down (NaN for `x < 0`).
pub fn sqrt_down(x: f64) -> f64 {
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

/// `ln x` rounded up (faithful-libm assumption, see the module docs): `ln 1 = 0`,
/// `ln 0 = −∞` and `ln ∞ = ∞` exactly, NaN for `x < 0`.
pub fn ln_up(x: f64) -> f64 {
    if x == 1.0 { 0.0 } else { step_up(x.ln()) }
}

/// `ln x` rounded down (see [`ln_up`]).
pub fn ln_down(x: f64) -> f64 {
    if x == 1.0 { 0.0 } else { step_down(x.ln()) }
}

/// `ln(1 + x)` rounded up: `0` at `x = 0`, `−∞` at `x = −1` exactly, NaN below `−1`.
pub fn ln_1p_up(x: f64) -> f64 {
    if x == 0.0 { x } else { step_up(x.ln_1p()) }
}

/// `ln(1 + x)` rounded down (see [`ln_1p_up`]).
pub fn ln_1p_down(x: f64) -> f64 {
    if x == 0.0 { x } else { step_down(x.ln_1p()) }
}

/// `eˣ` rounded up: `e⁰ = 1`, `e^{−∞} = 0`, `e^∞ = ∞` exactly; `+∞` on overflow; the
/// smallest subnormal where `eˣ` underflows.
pub fn exp_up(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else if x == f64::NEG_INFINITY {
        0.0
    } else {
        step_up(x.exp())
    }
}

/// `eˣ` rounded down: never below 0, `f64::MAX` where `eˣ` overflows for finite x.
pub fn exp_down(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x == 0.0 {
        return 1.0;
    }
    let y = x.exp();
    if y == f64::INFINITY && x.is_finite() {
        return f64::MAX;
    }
    step_down(y).max(0.0)
}

/// `eˣ − 1` rounded up: `0` at `x = 0`, `−1` at `x = −∞` exactly.
pub fn exp_m1_up(x: f64) -> f64 {
    if x == 0.0 {
        x
    } else if x == f64::NEG_INFINITY {
        -1.0
    } else {
        step_up(x.exp_m1())
    }
}

/// `eˣ − 1` rounded down: never below −1, `f64::MAX` where it overflows for finite x.
pub fn exp_m1_down(x: f64) -> f64 {
    if x.is_nan() || x == 0.0 {
        return x;
    }
    let y = x.exp_m1();
    if y == f64::INFINITY && x.is_finite() {
        return f64::MAX;
    }
    step_down(y).max(-1.0)
}

/// The smallest f64 not below `n` (`n as f64` rounds to nearest above 2⁵³).
pub fn u64_up(n: u64) -> f64 {
    let x = n as f64;
    if (x as u128) < u128::from(n) {
        x.next_up()
    } else {
        x
    }
}

/// The largest f64 not above `n`.
pub fn u64_down(n: u64) -> f64 {
    let x = n as f64;
    if x as u128 > u128::from(n) {
        x.next_down()
    } else {
        x
    }
}

/// The smallest f64 not below `n`.
pub fn usize_up(n: usize) -> f64 {
    u64_up(n as u64)
}

/// The largest f64 not above `n`.
pub fn usize_down(n: usize) -> f64 {
    u64_down(n as u64)
}

/// One ulp toward +∞ from a finite `y`; `±∞` and NaN unchanged.
///
/// An upper bound on a real `v` when `y` is a *faithful* rounding of `v` (one of the
/// two floats around it, as a libm function not covered above returns) or `y ≥ v`
/// already. Not a bound for a value carrying several roundings: use the operations
/// above for those. Note that `step_up(0.0)` is the smallest subnormal, not 0.
pub fn step_up(y: f64) -> f64 {
    if y.is_finite() { y.next_up() } else { y }
}

/// One ulp toward −∞ from a finite `y`; `±∞` and NaN unchanged (see [`step_up`]).
pub fn step_down(y: f64) -> f64 {
    if y.is_finite() { y.next_down() } else { y }
}

/// Below this magnitude an FMA residual may itself be rounded (subnormal range):
/// `2⁵³` times the smallest normal number.
const SAFE_RESIDUAL_MIN: f64 = f64::MIN_POSITIVE * (1u64 << 53) as f64;

/// The exact rounding error of `s = fl(a + b)` (Knuth's TwoSum), valid when no
/// intermediate overflows (else non-finite).
fn two_sum_err(a: f64, b: f64, s: f64) -> f64 {
    let b_virtual = s - a;
    let a_virtual = s - b_virtual;
    (a - a_virtual) + (b - b_virtual)
}

/// An upward result that is not finite: NaN and the IEEE answer for infinite operands
/// unchanged; an overflow of finite operands is `+∞` above and `−f64::MAX` below.
fn overflow_up(y: f64, operands_finite: bool) -> f64 {
    if operands_finite && y == f64::NEG_INFINITY {
        -f64::MAX
    } else {
        y
    }
}

#[cfg(test)]
mod tests;
