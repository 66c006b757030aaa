//! `privmix_renyi::round` against exact arithmetic: every `*_up` result is `≥` the exact
//! real result and every `*_down` result `≤` it, and each is at most one ulp (two in the
//! subnormal range, where the module steps regardless) beyond the nearest float.
//!
//! * `+ − × ÷ √`, sums and integer conversions: exact rationals (`num-rational`) on
//!   random operands over the whole f64 range, subnormals and overflow included.
//! * `ln`, `ln(1+x)`, `eˣ`, `eˣ − 1`: 50-digit mpmath values of the exact doubles
//!   (`golden/round_values.py`, output `golden/round_values.txt`).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};
use privmix_renyi::round::*;
use proptest::prelude::*;

/// The exact value of a finite double.
fn rat(x: f64) -> BigRational {
    BigRational::from_float(x).expect("finite")
}

/// `f64::MAX` as a rational: beyond it a result overflows.
fn max() -> BigRational {
    rat(f64::MAX)
}

/// Checks that `got` is an upper bound on `exact` (`up`) or a lower bound (`!up`), and
/// that it is within `slack` ulps of it; overflow must give the module's values.
fn check(op: &str, up: bool, got: f64, exact: &BigRational, slack: u32) -> Result<(), String> {
    let fail = |why: &str| Err(format!("{op} ({}): got {got:e}, {why}", dir(up)));
    if got.is_nan() {
        return fail("NaN from finite operands");
    }
    let limit = max();
    // Work on the upward side: a downward check is the upward one of the negation.
    let (got, exact) = if up {
        (got, exact.clone())
    } else {
        (-got, -exact.clone())
    };
    if exact > limit {
        return if got == f64::INFINITY {
            Ok(())
        } else {
            fail("the exact value overflows: want the infinity on the bound's side")
        };
    }
    if got == f64::INFINITY {
        return fail("overflow reported for a representable value");
    }
    if got == f64::NEG_INFINITY {
        return fail("an infinity on the wrong side");
    }
    if rat(got) < exact {
        return fail(&format!(
            "the exact value {} lies beyond it",
            to_f64(&exact)
        ));
    }
    // Tightness: `slack` steps back toward the exact value cross it.
    let mut back = got;
    for _ in 0..slack {
        back = back.next_down();
    }
    if back.is_finite() && rat(back) >= exact {
        return fail(&format!("more than {slack} ulp beyond the exact value"));
    }
    Ok(())
}

fn dir(up: bool) -> &'static str {
    if up { "up" } else { "down" }
}

/// A double near a rational (for messages only).
fn to_f64(r: &BigRational) -> f64 {
    r.to_f64().unwrap_or(f64::NAN)
}

/// One ulp of slack where exact-directed results are the nearest float on their side;
/// two near the subnormal range (the module steps regardless there) or where an operand
/// is tiny.
fn slack(exact: &BigRational, operands: &[f64]) -> u32 {
    let tiny = rat(2f64.powi(-900));
    let near_subnormal = exact.abs() < tiny || operands.iter().any(|x| x.abs() < 2f64.powi(-900));
    if near_subnormal { 2 } else { 1 }
}

/// One ulp of slack for a sum, two within a factor 16 of overflow.
fn sum_slack(exact: &BigRational) -> u32 {
    if exact.abs() > rat(2f64.powi(1020)) {
        2
    } else {
        1
    }
}

/// Finite doubles of every kind: arbitrary bit patterns (uniform over exponents),
/// ordinary magnitudes, subnormals and near-subnormals, values near `f64::MAX`, and a
/// few exact points.
fn finite() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |x| x.is_finite()),
        4 => -4.0..4.0_f64,
        2 => (any::<bool>(), 0u64..(1 << 58))
            .prop_map(|(neg, bits)| if neg { -f64::from_bits(bits) } else { f64::from_bits(bits) }),
        2 => (any::<bool>(), 0u64..(1 << 52)).prop_map(|(neg, m)| {
            let x = f64::from_bits(0x7FE0_0000_0000_0000 | m);
            if neg { -x } else { x }
        }),
        1 => prop::sample::select(vec![0.0, -0.0, 1.0, -1.0, 0.5, 3.0, f64::MAX, f64::MIN_POSITIVE]),
    ]
}

/// Pairs of operands, half of them close in magnitude (so that sums cancel and
/// products and quotients land near 1 or at the range's edges).
fn pair() -> impl Strategy<Value = (f64, f64)> {
    prop_oneof![
        (finite(), finite()),
        (finite(), -1.0..1.0_f64, -4i32..4, any::<bool>())
            .prop_map(|(x, d, k, neg)| {
                let y = x * 2f64.powi(k) * (1.0 + d * 1e-3);
                (x, if neg { -y } else { y })
            })
            .prop_filter("finite", |(_, y)| y.is_finite()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn sums_differences_products_and_quotients_bracket_the_exact_result((a, b) in pair()) {
        let (ra, rb) = (rat(a), rat(b));
        // Sums are exact-directed everywhere (subnormal sums are exact), except where
        // an intermediate of TwoSum overflows next to `f64::MAX`.
        let sum = &ra + &rb;
        let s = sum_slack(&sum);
        check("a + b", true, add_up(a, b), &sum, s).map_err(TestCaseError::fail)?;
        check("a + b", false, add_down(a, b), &sum, s).map_err(TestCaseError::fail)?;
        let diff = &ra - &rb;
        let s = sum_slack(&diff);
        check("a − b", true, sub_up(a, b), &diff, s).map_err(TestCaseError::fail)?;
        check("a − b", false, sub_down(a, b), &diff, s).map_err(TestCaseError::fail)?;
        let prod = &ra * &rb;
        let s = slack(&prod, &[a, b]);
        check("a · b", true, mul_up(a, b), &prod, s).map_err(TestCaseError::fail)?;
        check("a · b", false, mul_down(a, b), &prod, s).map_err(TestCaseError::fail)?;
        if b != 0.0 {
            let quot = &ra / &rb;
            let s = slack(&quot, &[a, b]);
            check("a / b", true, div_up(a, b), &quot, s).map_err(TestCaseError::fail)?;
            check("a / b", false, div_down(a, b), &quot, s).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn square_roots_bracket_the_exact_root(x in finite()) {
        let x = x.abs();
        let rx = rat(x);
        let (lo, hi) = (sqrt_down(x), sqrt_up(x));
        prop_assert!(lo >= 0.0 && hi.is_finite());
        prop_assert!(rat(lo) * rat(lo) <= rx, "sqrt_down({x:e}) = {lo:e}");
        prop_assert!(rat(hi) * rat(hi) >= rx, "sqrt_up({x:e}) = {hi:e}");
        // Within one ulp (two near the subnormal range) of the root.
        let steps = if x < 2f64.powi(-900) { 2 } else { 1 };
        let (mut below, mut above) = (hi, lo);
        for _ in 0..steps {
            below = below.next_down();
            above = above.next_up();
        }
        prop_assert!(below < 0.0 || rat(below) * rat(below) < rx, "sqrt_up({x:e}) = {hi:e}");
        prop_assert!(rat(above) * rat(above) > rx, "sqrt_down({x:e}) = {lo:e}");
    }

    #[test]
    fn running_sums_bracket_the_exact_sum(xs in prop::collection::vec(-1e6..1e6_f64, 0..40)) {
        let exact = xs.iter().fold(BigRational::zero(), |acc, &x| acc + rat(x));
        prop_assert!(rat(sum_up(xs.iter().copied())) >= exact);
        prop_assert!(rat(sum_down(xs.iter().copied())) <= exact);
    }

    #[test]
    fn integer_conversions_bracket_the_integer(n in any::<u64>()) {
        let exact = BigRational::from_integer(BigInt::from(n));
        check("u64", true, u64_up(n), &exact, 1).map_err(TestCaseError::fail)?;
        check("u64", false, u64_down(n), &exact, 1).map_err(TestCaseError::fail)?;
        let m = n as usize;
        check("usize", true, usize_up(m), &exact, 1).map_err(TestCaseError::fail)?;
        check("usize", false, usize_down(m), &exact, 1).map_err(TestCaseError::fail)?;
    }
}

/// A decimal `[-]d.ddd[e±N]` as an exact rational.
fn decimal(s: &str) -> BigRational {
    let (mantissa, exponent) = match s.split_once('e') {
        Some((m, e)) => (m, e.parse::<i64>().expect("exponent")),
        None => (s, 0),
    };
    let negative = mantissa.starts_with('-');
    let mantissa = mantissa.trim_start_matches('-');
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: BigInt = format!("{int}{frac}").parse().expect("digits");
    let scale = exponent - frac.len() as i64;
    let power = BigRational::from_integer(BigInt::from(10).pow(scale.unsigned_abs() as u32));
    let r = BigRational::from_integer(digits);
    let r = if scale >= 0 { r * power } else { r / power };
    if negative { -r } else { r }
}

#[test]
fn transcendentals_bracket_fifty_digit_values() {
    let text = include_str!("../golden/round_values.txt");
    let mut counts = [0usize; 4];
    // The fixture's values carry 50 significant digits: the exact value lies within
    // 1e-49 of them, relatively. A bound that misses by less than that is not caught
    // here, and cannot be wrong by more.
    let fixture_error = decimal("1e-48");
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (name, x, value) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let x: f64 = x.parse().unwrap();
        let v = decimal(value);
        let room = v.abs() * &fixture_error;
        let (lo, hi, slot) = match name {
            "ln" => (ln_down(x), ln_up(x), 0),
            "ln_1p" => (ln_1p_down(x), ln_1p_up(x), 1),
            "exp" => (exp_down(x), exp_up(x), 2),
            "exp_m1" => (exp_m1_down(x), exp_m1_up(x), 3),
            other => panic!("unknown function {other}"),
        };
        counts[slot] += 1;
        let what = format!("{name}({x:e}) = {value}: [{lo:e}, {hi:e}]");
        assert!(!lo.is_nan() && !hi.is_nan(), "{what}");
        // Downward: finite (`f64::MAX` at most) and not above the value.
        assert!(lo.is_finite(), "{what}");
        assert!(rat(lo) <= &v + &room, "{what}: the lower bound is above");
        if hi.is_finite() {
            assert!(rat(hi) >= &v - &room, "{what}: the upper bound is below");
        } else {
            assert!(v > max(), "{what}: +∞ for a representable value");
        }
        // One ulp each side of a faithful result: the two bounds are at most two ulps
        // apart (at the saturations, `f64::MAX` below and `+∞` above).
        if hi.is_finite() {
            assert!(hi <= lo.next_up().next_up(), "{what}: wider than two ulps");
        }
    }
    assert!(counts.iter().all(|&c| c >= 100), "{counts:?}");
}
