//! A vectorised `exp` for f32 and the host-memory activations built on it
//! (SiLU, log-softmax over rows), for the decode path of plain burn-flex.
//!
//! Why: burn-flex evaluates `exp` one element at a time through libm. The
//! ensemble's decode step takes the exponential of every logit of N + 1
//! rows (log-softmax over 49 152 entries each) and of every MLP gate (SiLU),
//! a noticeable part of the step when taken one element at a time.
//!
//! The exponential is Cephes' `expf` (S. Moshier, Cephes Math Library
//! 2.2): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (ln 2 split in two parts so
//! `r` is exact to f32), `e^r` by its degree-7 minimax polynomial, `2^n`
//! written into the exponent bits. Its relative error is a few units in the
//! last place (the test bounds it by 4 ulp against f64). Arguments below
//! `MIN_ARG` give exactly 0 (where libm's `expf` gives a subnormal or 0);
//! above `MAX_ARG` (`e^x > 2.4·10³⁸`, within 1.5× of `f32::MAX`) they give
//! +∞; NaN gives NaN. The callers here take `e^x` of `x ≤ 0` (log-softmax, attention) or
//! use it in `1/(1 + e^{−x})` (SiLU), where neither end matters beyond
//! `1e-36`.

use pulp::{Simd, WithSimd};

/// Smallest argument with a normal result; below it the result is 0.
const MIN_ARG: f32 = -87.336_55;
/// Largest argument handled (`2^127.5`); larger ones give +∞.
const MAX_ARG: f32 = 88.376_26;

/// `e^x` lane by lane (see the module documentation).
#[inline(always)]
pub(crate) fn exp_f32s<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2²³: adding it rounds to an integer, held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let arg = x;
    let tiny = simd.less_than_f32s(x, simd.splat_f32s(MIN_ARG));
    let huge = simd.less_than_f32s(simd.splat_f32s(MAX_ARG), x);
    let x = simd.min_f32s(
        simd.max_f32s(x, simd.splat_f32s(MIN_ARG)),
        simd.splat_f32s(MAX_ARG),
    );
    let shifted = simd.mul_add_e_f32s(x, simd.splat_f32s(LOG2E), simd.splat_f32s(ROUND));
    let n = simd.sub_f32s(shifted, simd.splat_f32s(ROUND));
    let r = simd.mul_add_e_f32s(n, simd.splat_f32s(-LN2_HI), x);
    let r = simd.mul_add_e_f32s(n, simd.splat_f32s(-LN2_LO), r);
    let mut p = simd.splat_f32s(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes: 5.0000001201e-1, which is 0.5 in f32
    ] {
        p = simd.mul_add_e_f32s(p, r, simd.splat_f32s(c));
    }
    let r2 = simd.mul_f32s(r, r);
    let p = simd.add_f32s(simd.mul_add_e_f32s(p, r2, r), simd.splat_f32s(1.0));
    // 2^n: (n + 127) << 23, with n read from the rounded sum's low bits.
    let bits = simd.sub_u32s(
        simd.transmute_u32s_f32s(shifted),
        simd.splat_u32s(ROUND.to_bits() - 127),
    );
    let scale = simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(bits, simd.splat_u32s(23)));
    let e = simd.select_f32s(tiny, simd.splat_f32s(0.0), simd.mul_f32s(p, scale));
    let e = simd.select_f32s(huge, simd.splat_f32s(f32::INFINITY), e);
    // NaN stays NaN (the clamps above would have made it finite).
    simd.select_f32s(simd.equal_f32s(arg, arg), e, arg)
}

/// `x ← e^{x − shift}` in place; returns `Σ e^{x − shift}` (summed in f32 lanes,
/// then in f64). With `shift` the maximum of `x` every result lies in (0, 1]:
/// the numerators and the denominator of a softmax.
pub fn exp_shifted_in_place(x: &mut [f32], shift: f32) -> f64 {
    struct Exp<'a>(&'a mut [f32], f32);
    impl WithSimd for Exp<'_> {
        type Output = f64;
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) -> f64 {
            let m = simd.splat_f32s(self.1);
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            let mut sum = 0.0f64;
            // Lanes summed in f32 over chunks of 64 vectors, then in f64.
            for chunk in head.chunks_mut(64) {
                let mut acc = simd.splat_f32s(0.0);
                for v in chunk {
                    *v = exp_f32s(simd, simd.sub_f32s(*v, m));
                    acc = simd.add_f32s(acc, *v);
                }
                sum += f64::from(simd.reduce_sum_f32s(acc));
            }
            let last = exp_f32s(simd, simd.sub_f32s(simd.partial_load_f32s(tail), m));
            simd.partial_store_f32s(tail, last);
            sum + tail.iter().map(|&e| f64::from(e)).sum::<f64>()
        }
    }
    crate::cpu::dispatch::vectorize(Exp(x, shift))
}

/// `x ← x · σ(x) = x / (1 + e^{−x})` in place (HF's `silu`).
pub fn silu_in_place(x: &mut [f32]) {
    struct Silu<'a>(&'a mut [f32]);
    impl WithSimd for Silu<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            let one = simd.splat_f32s(1.0);
            for v in head {
                let e = exp_f32s(simd, simd.neg_f32s(*v));
                *v = simd.mul_f32s(*v, simd.div_f32s(one, simd.add_f32s(one, e)));
            }
            let mut last = simd.partial_load_f32s(tail);
            let e = exp_f32s(simd, simd.neg_f32s(last));
            last = simd.mul_f32s(last, simd.div_f32s(one, simd.add_f32s(one, e)));
            simd.partial_store_f32s(tail, last);
        }
    }
    crate::cpu::dispatch::vectorize(Silu(x));
}

/// Each `width`-long row of `x` replaced by its log-softmax, as burn's
/// `log_softmax`: `(x − max) − ln Σ e^{x − max}`.
pub fn log_softmax_rows_in_place(x: &mut [f32], width: usize) {
    struct Row<'a>(&'a mut [f32]);
    impl WithSimd for Row<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let row = self.0;
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (head, tail) = S::as_simd_f32s(row);
            let m = simd.splat_f32s(max);
            let mut acc = simd.splat_f32s(0.0);
            for v in head {
                acc = simd.add_f32s(acc, exp_f32s(simd, simd.sub_f32s(*v, m)));
            }
            let tail_e = exp_f32s(simd, simd.sub_f32s(simd.partial_load_f32s(tail), m));
            let mut sum = simd.reduce_sum_f32s(acc);
            let mut rest = [0.0f32; 64];
            let rest = &mut rest[..tail.len()];
            simd.partial_store_f32s(rest, tail_e);
            sum += rest.iter().sum::<f32>();
            let log_sum = sum.ln();
            for v in row.iter_mut() {
                *v = (*v - max) - log_sum;
            }
        }
    }
    use rayon::prelude::*;
    let one = |row: &mut [f32]| crate::cpu::dispatch::vectorize(Row(row));
    if x.len() >= 2 * width && x.len() >= 1 << 16 {
        x.par_chunks_mut(width).for_each(one);
    } else {
        x.chunks_mut(width).for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Exp<'a>(&'a mut [f32]);
    impl WithSimd for Exp<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            for v in head {
                *v = exp_f32s(simd, *v);
            }
            let v = exp_f32s(simd, simd.partial_load_f32s(tail));
            simd.partial_store_f32s(tail, v);
        }
    }

    /// Distance in units in the last place between f32 values of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    /// `exp_f32s` within 4 ulp of `e^x` rounded from f64 over the normal
    /// range, exactly 0 below it, finite at the top.
    #[test]
    fn exp_is_within_four_ulp() {
        let mut xs: Vec<f32> = (0..200_001)
            .map(|i| MIN_ARG + (MAX_ARG - MIN_ARG) * i as f32 / 200_000.0)
            .collect();
        xs.extend([0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30]);
        let mut ys = xs.clone();
        crate::cpu::dispatch::vectorize(Exp(&mut ys));
        for (x, y) in xs.iter().zip(&ys) {
            let want = (f64::from(*x)).exp() as f32;
            assert!(ulps(*y, want) <= 4, "exp({x}) = {y}, want {want}");
        }
        let mut low = vec![MIN_ARG - 0.01, -100.0, f32::MIN, f32::NEG_INFINITY];
        crate::cpu::dispatch::vectorize(Exp(&mut low));
        assert!(low.iter().all(|&v| v == 0.0));
        let mut high = vec![MAX_ARG + 0.01, 100.0, f32::MAX, f32::INFINITY];
        crate::cpu::dispatch::vectorize(Exp(&mut high));
        assert!(high.iter().all(|&v| v == f32::INFINITY));
        let mut nan = vec![f32::NAN; 3];
        crate::cpu::dispatch::vectorize(Exp(&mut nan));
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    proptest! {
        /// Row-wise log-softmax agrees with the f64 formula to 2e-6 (relative
        /// to the largest |log-prob| + 1) and each row's probabilities sum to 1.
        #[test]
        fn log_softmax_rows_match_f64(
            width in 1usize..300,
            rows in 1usize..4,
            seed in any::<u32>(),
            spread in 0.1f32..60.0,
        ) {
            let x: Vec<f32> = (0..rows * width)
                .map(|i| (((i as u64 * 2654435761 + u64::from(seed)) % 10_007) as f32 / 10_007.0 - 0.5) * spread)
                .collect();
            let mut y = x.clone();
            log_softmax_rows_in_place(&mut y, width);
            for (xr, yr) in x.chunks(width).zip(y.chunks(width)) {
                let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = max + xr.iter().map(|&v| (f64::from(v) - max).exp()).sum::<f64>().ln();
                let scale = 1.0 + yr.iter().map(|v| v.abs()).fold(0.0f32, f32::max) as f64;
                for (a, b) in xr.iter().zip(yr) {
                    let want = f64::from(*a) - lse;
                    prop_assert!((f64::from(*b) - want).abs() <= 2e-6 * scale, "{} vs {}", b, want);
                }
                let mass: f64 = yr.iter().map(|&v| f64::from(v).exp()).sum();
                prop_assert!((mass - 1.0).abs() < 1e-5);
            }
        }

        /// The shifted exponentials agree with f64's `exp` of the same (f32)
        /// difference to 4 ulp (relative 5e-7), and their sum with the f64 sum of
        /// the results to 1e-6 relative.
        #[test]
        fn shifted_exp_and_its_sum_match_f64(
            xs in prop::collection::vec(-100.0f32..30.0, 1..5000),
        ) {
            let shift = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut y = xs.clone();
            let sum = exp_shifted_in_place(&mut y, shift);
            for (x, e) in xs.iter().zip(&y) {
                let want = f64::from(*x - shift).exp();
                prop_assert!(*e <= 1.0);
                prop_assert!((f64::from(*e) - want).abs() <= 5e-7 * want + 1e-37, "{} vs {}", e, want);
            }
            let exact: f64 = y.iter().map(|&e| f64::from(e)).sum();
            prop_assert!(sum >= 1.0 - 1e-6 && (sum - exact).abs() <= 1e-6 * exact, "{} vs {}", sum, exact);
        }

        /// SiLU agrees with `x / (1 + e^{−x})` in f64 to a few ulp.
        #[test]
        fn silu_matches_f64(xs in prop::collection::vec(-120.0f32..120.0, 1..200)) {
            let mut y = xs.clone();
            silu_in_place(&mut y);
            for (x, v) in xs.iter().zip(&y) {
                let x = f64::from(*x);
                let want = x / (1.0 + (-x).exp());
                prop_assert!((f64::from(*v) - want).abs() <= 4e-7 * want.abs() + 1e-36, "{} vs {}", v, want);
            }
        }
    }
}
