use super::*;

#[test]
fn exact_sums_are_unchanged_and_inexact_ones_bracket() {
    assert_eq!(add_up(1.0, 2.0), 3.0);
    assert_eq!(add_down(1.0, 2.0), 3.0);
    let (lo, hi) = (add_down(0.1, 0.2), add_up(0.1, 0.2));
    assert_eq!(hi.next_down(), lo);
    let tiny = 2f64.powi(-60);
    assert_eq!(add_up(1.0, tiny), 1.0f64.next_up());
    assert_eq!(add_down(1.0, tiny), 1.0);
    assert_eq!(sub_down(1.0, tiny), 1.0f64.next_down());
    assert_eq!(sum_up([1.0, tiny, tiny]), 1.0f64.next_up().next_up());
    assert_eq!(sum_down([1.0, tiny, tiny]), 1.0);
}

#[test]
fn products_and_quotients_bracket_the_truth() {
    assert_eq!(mul_up(3.0, 0.5), 1.5);
    let (lo, hi) = (mul_down(0.1, 3.0), mul_up(0.1, 3.0));
    assert_eq!(lo.next_up(), hi);
    assert_eq!(div_up(1.0, 4.0), 0.25);
    let (lo, hi) = (div_down(1.0, 3.0), div_up(1.0, 3.0));
    assert_eq!(lo.next_up(), hi);
    // Dividing by a negative number flips the side of the residual.
    let (lo, hi) = (div_down(1.0, -3.0), div_up(1.0, -3.0));
    assert_eq!(lo.next_up(), hi);
    assert!(hi < 0.0);
}

#[test]
fn zero_infinity_and_nan_follow_the_module_rule() {
    // NaN in, NaN out, including where `f64::max` would hide it.
    for f in [exp_down, exp_m1_down, exp_up, ln_up, ln_down, sqrt_up] {
        assert!(f(f64::NAN).is_nan());
    }
    assert!(add_up(f64::INFINITY, f64::NEG_INFINITY).is_nan());
    assert!(mul_down(0.0, f64::INFINITY).is_nan());
    // Exact results unchanged, zero included.
    assert_eq!(mul_up(0.0, 5.0), 0.0);
    assert_eq!(add_up(f64::INFINITY, 1.0), f64::INFINITY);
    assert_eq!(add_down(f64::NEG_INFINITY, 1.0), f64::NEG_INFINITY);
    assert_eq!(div_up(1.0, f64::INFINITY), 0.0);
    assert_eq!(div_up(1.0, 0.0), f64::INFINITY);
    assert_eq!(div_down(-1.0, 0.0), f64::NEG_INFINITY);
    assert_eq!(ln_down(0.0), f64::NEG_INFINITY);
    assert_eq!(exp_down(f64::INFINITY), f64::INFINITY);
    // Overflow of finite operands: upward never −∞, downward never +∞.
    assert_eq!(add_up(f64::MAX, f64::MAX), f64::INFINITY);
    assert_eq!(add_down(f64::MAX, f64::MAX), f64::MAX);
    assert_eq!(add_up(-f64::MAX, -f64::MAX), -f64::MAX);
    assert_eq!(add_down(-f64::MAX, -f64::MAX), f64::NEG_INFINITY);
    assert_eq!(mul_up(f64::MAX, -2.0), -f64::MAX);
    assert_eq!(mul_down(f64::MAX, 2.0), f64::MAX);
    assert_eq!(div_up(-f64::MAX, 0.5), -f64::MAX);
    assert_eq!(exp_down(1000.0), f64::MAX);
    assert_eq!(exp_m1_down(1000.0), f64::MAX);
    assert_eq!(exp_up(1000.0), f64::INFINITY);
    // Underflow: a non-zero product that rounds to 0 becomes a subnormal bound.
    assert_eq!(mul_up(1e-200, 1e-200), f64::from_bits(1));
    let lo = mul_down(1e-200, 1e-200);
    assert!(lo <= 0.0 && lo > -1e-300);
    assert_eq!(exp_up(-1000.0), f64::from_bits(1));
    assert_eq!(exp_down(-1000.0), 0.0);
}

#[test]
fn transcendentals_step_outward() {
    assert!(ln_up(2.0) > std::f64::consts::LN_2);
    assert!(ln_down(2.0) < std::f64::consts::LN_2);
    assert_eq!(ln_up(1.0), 0.0);
    assert_eq!(exp_up(0.0), 1.0);
    assert_eq!(exp_up(f64::NEG_INFINITY), 0.0);
    assert_eq!(exp_m1_down(-1000.0), -1.0);
    assert_eq!(exp_m1_up(f64::NEG_INFINITY), -1.0);
    assert!(ln_1p_up(1e-20) > 1e-20 && ln_1p_down(1e-20) < 1e-20);
    assert!(exp_m1_up(1e-20) > 1e-20);
    assert_eq!(ln_1p_up(-1.0), f64::NEG_INFINITY);
    assert_eq!(sqrt_up(4.0), 2.0);
    assert_eq!(sqrt_down(4.0), 2.0);
    let (lo, hi) = (sqrt_down(2.0), sqrt_up(2.0));
    assert_eq!(lo.next_up(), hi);
    assert!(sqrt_up(-1.0).is_nan());
    assert_eq!(step_up(f64::INFINITY), f64::INFINITY);
    assert_eq!(step_down(1.0), 1.0f64.next_down());
}

#[test]
fn integer_conversions_bracket() {
    let n = (1u64 << 53) + 1;
    assert_eq!(u64_down(n), (1u64 << 53) as f64);
    assert_eq!(u64_up(n), ((1u64 << 53) + 2) as f64);
    assert_eq!(u64_up(u64::MAX), 2f64.powi(64));
    assert_eq!(u64_down(u64::MAX), 2f64.powi(64).next_down());
    assert_eq!(usize_up(7), 7.0);
    assert_eq!(usize_down(7), 7.0);
}
