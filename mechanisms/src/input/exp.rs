//! `e^x` in f64 for log-probability rows, written lane by lane so that the
//! compiler vectorises it inside a `pulp` operation (libm's `exp` is one call per
//! entry: the conversion of a step's rows, nine vocabulary-sized rows per request,
//! spent most of its time there).
//!
//! The method is the classic one (Tang, "Table-driven implementation of the
//! exponential function in IEEE floating-point arithmetic", ACM TOMS 15(2), 1989,
//! without the table): `x = n·ln 2 + r` with `n = round(x/ln 2)` and
//! `|r| ≤ ln 2/2`, where `n·ln 2` uses fdlibm's split of ln 2 (its high part has 32
//! trailing zero bits, so `n·LN2_HI` and `x − n·LN2_HI` are exact for the `n` here);
//! `e^r` by its Taylor polynomial of degree 13 (truncation below `4·10⁻¹⁸`
//! relative); `2ⁿ` written into the exponent bits. The result is within 2 ulp of
//! the exact value (the tests measure libm's results against it).
//!
//! Served: `x ∈ [`[`MIN_ARG`]`, 0]`, where `2ⁿ` is normal (`n ≥ −1021`). The
//! callers clamp into that range and send every entry outside it (−∞, tiny
//! probabilities whose result would be subnormal, and the invalid ones) to libm.

/// The smallest argument served: `e^{−708}` is about `3·10⁻³⁰⁸`, still normal.
pub(super) const MIN_ARG: f64 = -708.0;

/// `1/ln 2`.
const LOG2E: f64 = std::f64::consts::LOG2_E;
/// fdlibm's `ln2HI` (`0x3fe62e42fee00000`): ln 2 with its low 32 bits cleared.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// fdlibm's `ln2LO` (`0x3dea39ef35793c76`): `ln 2 − LN2_HI` to f64 precision.
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// `1.5·2⁵²`: added to `x/ln 2`, it rounds it to an integer held in the low
/// mantissa bits (as a two's complement offset from its own bit pattern).
const SHIFTER: f64 = 6_755_399_441_055_744.0;

/// `1/k!` for `k = 13, 12, …, 2`, the order Horner's scheme takes them in.
const INVERSE_FACTORIALS: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];

/// `e^x` for each `x ∈ [`[`MIN_ARG`]`, 0]` of a block of `L` lanes (see the module
/// documentation); other arguments give unspecified finite values or NaN, never a
/// panic. Each step is a plain loop over the lanes, which the compiler turns into
/// vector instructions.
#[inline(always)]
pub(super) fn exp_lanes<const L: usize>(x: [f64; L]) -> [f64; L] {
    let mut shifted = [0.0; L];
    let mut r = [0.0; L];
    for j in 0..L {
        shifted[j] = x[j].mul_add(LOG2E, SHIFTER);
        let n = shifted[j] - SHIFTER;
        r[j] = (-n).mul_add(LN2_HI, x[j]);
        r[j] = (-n).mul_add(LN2_LO, r[j]);
    }
    let mut poly = [INVERSE_FACTORIALS[0]; L];
    for c in INVERSE_FACTORIALS.into_iter().skip(1) {
        for j in 0..L {
            poly[j] = poly[j].mul_add(r[j], c);
        }
    }
    let mut out = [0.0; L];
    for j in 0..L {
        // e^r = 1 + r + r²·(1/2 + r/6 + …): the small part first, then the 1.
        let e_r = 1.0 + r[j].mul_add(r[j] * poly[j], r[j]);
        // n as the difference of the bit patterns, then 2ⁿ = (n + 1023)·2⁵² as bits.
        let n_bits = shifted[j].to_bits().wrapping_sub(SHIFTER.to_bits());
        let scale = f64::from_bits(n_bits.wrapping_add(1023) << 52);
        out[j] = e_r * scale;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two positive normal f64.
    fn exp_in_range(x: f64) -> f64 {
        exp_lanes([x])[0]
    }

    fn ulps(a: f64, b: f64) -> u64 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn agrees_with_libm_to_two_ulp_over_the_range() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut worst = 0;
        for i in 0..1_000_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            // Half the samples where log-probabilities live (−40 … 0), half over
            // the whole range.
            let x = if i % 2 == 0 { -40.0 * u } else { MIN_ARG * u };
            worst = worst.max(ulps(exp_in_range(x), x.exp()));
        }
        assert!(worst <= 2, "{worst} ulp");
    }

    #[test]
    fn ends_and_special_points_are_exact() {
        assert_eq!(exp_in_range(0.0), 1.0);
        assert_eq!(exp_in_range(-0.0), 1.0);
        for x in [
            MIN_ARG,
            -1.0,
            -0.5,
            f64::from(f32::MIN_POSITIVE).ln(),
            -1e-300,
        ] {
            assert!(ulps(exp_in_range(x), x.exp()) <= 2, "{x}");
        }
        // The results at the low end are normal.
        assert!(exp_in_range(MIN_ARG) >= f64::MIN_POSITIVE);
    }
}
