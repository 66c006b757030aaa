//! One row of any [`Rows`] kind converted to f64 probabilities, checked and summed.

use privmix_renyi::NORMALISATION_TOLERANCE;

use super::exp;
use super::rows::Rows;
use crate::MechanismError;

/// One row converted to f64 probabilities in `out` (of the row's length): checked
/// (finite and non-negative, or for log rows not NaN and not positive, or for
/// logits not NaN, not +∞ and not all −∞) and summed; its sum, which must lie
/// within [`NORMALISATION_TOLERANCE`] of 1 (a softmax sums to 1 within a few ulps
/// per entry), is returned, for the caller to divide the row by
/// (`ValidatedRows::new_divided`).
pub(super) fn convert_row(
    row: Rows<'_>,
    index: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let sum = match row {
        Rows::ProbF32(r) => probabilities(r, index, out)?,
        Rows::ProbF64(r) => probabilities(r, index, out)?,
        Rows::LogProbF32(r) => log_probabilities(r, index, out)?,
        Rows::LogProbF64(r) => log_probabilities(r, index, out)?,
        Rows::LogitsF32(r) => softmax(r.iter().map(|&x| f64::from(x)), index, out)?,
        Rows::LogitsF64(r) => softmax(r.iter().copied(), index, out)?,
    };
    // Entries are finite, so the sum is finite (or +∞ on overflow, which fails too).
    if sum.is_nan() || (sum - 1.0).abs() > NORMALISATION_TOLERANCE {
        return Err(MechanismError::NotNormalised {
            row: index,
            sum,
            tolerance: NORMALISATION_TOLERANCE,
        });
    }
    Ok(sum)
}

/// Lanes of the conversion's sums: a fixed summation order whatever the vector width.
const LANES: usize = 8;

/// Probability entries widened into `out`, in one pass that also forms their sum
/// (in [`LANES`] interleaved partial sums) and their minimum; the first bad entry is
/// looked for only when that screen (a non-finite sum or a negative minimum) says
/// there is one. Returns the sum.
fn probabilities<T: Copy + Into<f64> + Send + Sync>(
    row: &[T],
    index: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let (sum, min) = pulp::Arch::new().dispatch(Widen(row, out));
    if !sum.is_finite() || min < 0.0 {
        for (i, &value) in out.iter().enumerate() {
            if !value.is_finite() {
                return Err(MechanismError::NonFinite {
                    row: index,
                    index: i,
                    value,
                });
            }
            if value < 0.0 {
                return Err(MechanismError::Negative {
                    row: index,
                    index: i,
                    value,
                });
            }
        }
    }
    Ok(sum)
}

/// The pass of [`probabilities`], compiled for the CPU's widest vectors.
struct Widen<'a, T>(&'a [T], &'a mut [f64]);

impl<T: Copy + Into<f64>> pulp::WithSimd for Widen<'_, T> {
    type Output = (f64, f64);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> (f64, f64) {
        let Widen(row, out) = self;
        let (mut sum, mut min) = ([0.0_f64; LANES], [0.0_f64; LANES]);
        let mut blocks = out.chunks_exact_mut(LANES);
        let mut entries = row.chunks_exact(LANES);
        for (o, r) in (&mut blocks).zip(&mut entries) {
            for j in 0..LANES {
                let v: f64 = r[j].into();
                o[j] = v;
                sum[j] += v;
                min[j] = if v < min[j] { v } else { min[j] };
            }
        }
        for (j, (o, &r)) in blocks
            .into_remainder()
            .iter_mut()
            .zip(entries.remainder())
            .enumerate()
        {
            let v: f64 = r.into();
            *o = v;
            sum[j] += v;
            min[j] = if v < min[j] { v } else { min[j] };
        }
        (combine(sum), min.into_iter().fold(0.0, f64::min))
    }
}

/// Log-probability entries exponentiated into `out`: −∞ is a valid log-probability
/// (zero); NaN and +∞ are not, and a positive one is a probability above 1. Returns
/// the sum of the probabilities.
///
/// One vectorised pass ([`LogExp`]) exponentiates every entry with
/// [`exp::exp_lanes`] and screens the row: the sum of the entries (non-finite when
/// one is NaN, ±∞), their largest (> 0 for an invalid one) and their smallest (below
/// [`exp::MIN_ARG`] for −∞ and for a probability below about `3·10⁻³⁰⁸`). Only a row the
/// screen flags is walked again, entry by entry in order: the first bad entry is
/// reported, and the entries below `MIN_ARG` are computed by libm (0 for −∞, else a
/// subnormal or 0).
fn log_probabilities<T: Copy + Into<f64>>(
    values: &[T],
    row: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let screen = pulp::Arch::new().dispatch(LogExp(values, out));
    if screen.entries.is_finite() && screen.max <= 0.0 && screen.min >= exp::MIN_ARG {
        return Ok(screen.sum);
    }
    let mut sum = [0.0; LANES];
    for (index, (&x, o)) in values.iter().zip(out.iter_mut()).enumerate() {
        let x: f64 = x.into();
        if x.is_nan() || x == f64::INFINITY {
            return Err(MechanismError::NonFinite {
                row,
                index,
                value: x,
            });
        }
        if x > 0.0 {
            return Err(MechanismError::Negative {
                row,
                index,
                value: -x,
            });
        }
        if x < exp::MIN_ARG {
            *o = x.exp();
        }
        sum[index % LANES] += *o;
    }
    Ok(combine(sum))
}

/// The lanes of a sum added in a fixed order.
fn combine(s: [f64; LANES]) -> f64 {
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// What [`LogExp`] learnt about a row of log-probabilities.
struct LogScreen {
    /// `Σ e^x` over the entries (each clamped into the served range first).
    sum: f64,
    /// `Σ x`: non-finite when an entry is NaN or infinite.
    entries: f64,
    /// The smallest and largest entries (NaN entries ignored).
    min: f64,
    max: f64,
}

/// `x` clamped into `[`[`exp::MIN_ARG`]`, 0]` (NaN stays NaN), as selects.
#[inline(always)]
fn clamp(x: f64) -> f64 {
    let x = if x < exp::MIN_ARG { exp::MIN_ARG } else { x };
    if x > 0.0 { 0.0 } else { x }
}

/// The pass of [`log_probabilities`]: `out[i] = e^{x_i}` for every `x_i` clamped into
/// `[`[`exp::MIN_ARG`]`, 0]`, with the sums and extremes of [`LogScreen`] in
/// [`LANES`] interleaved lanes, compiled for the CPU's widest vectors.
struct LogExp<'a, T>(&'a [T], &'a mut [f64]);

impl<T: Copy + Into<f64>> pulp::WithSimd for LogExp<'_, T> {
    type Output = LogScreen;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> LogScreen {
        let LogExp(row, out) = self;
        let mut sum = [0.0_f64; LANES];
        let mut entries = [0.0_f64; LANES];
        let mut min = [f64::INFINITY; LANES];
        let mut max = [f64::NEG_INFINITY; LANES];
        let mut blocks = out.chunks_exact_mut(LANES);
        let mut values = row.chunks_exact(LANES);
        // Simple lane-wise loops, each of which the compiler vectorises (one loop
        // with every update it does not).
        for (o, r) in (&mut blocks).zip(&mut values) {
            let mut x = [0.0_f64; LANES];
            for j in 0..LANES {
                x[j] = r[j].into();
            }
            for j in 0..LANES {
                entries[j] += x[j];
            }
            for j in 0..LANES {
                min[j] = if x[j] < min[j] { x[j] } else { min[j] };
                max[j] = if x[j] > max[j] { x[j] } else { max[j] };
            }
            for j in 0..LANES {
                x[j] = clamp(x[j]);
            }
            let e = exp::exp_lanes(x);
            o.copy_from_slice(&e);
            for j in 0..LANES {
                sum[j] += e[j];
            }
        }
        for (j, (o, &r)) in blocks
            .into_remainder()
            .iter_mut()
            .zip(values.remainder())
            .enumerate()
        {
            let x: f64 = r.into();
            entries[j] += x;
            min[j] = if x < min[j] { x } else { min[j] };
            max[j] = if x > max[j] { x } else { max[j] };
            *o = exp::exp_lanes([clamp(x)])[0];
            sum[j] += *o;
        }
        LogScreen {
            sum: combine(sum),
            entries: combine(entries),
            min: min.into_iter().fold(f64::INFINITY, f64::min),
            max: max.into_iter().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// Logits turned into probabilities in `out` by a log-softmax in f64:
/// `p(x) = exp(x − m − ln Σ_y exp(y − m))` with `m` the largest logit. Every
/// shifted logit is ≤ 0 and the largest is exactly 0, so the sum lies in [1, V]
/// and nothing overflows or underflows to a zero sum. −∞ gives probability 0;
/// NaN and +∞ are errors, and so is a row with no finite logit (no token would
/// have positive probability). Returns the sum of the probabilities.
fn softmax(
    values: impl Iterator<Item = f64>,
    row: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let mut max = f64::NEG_INFINITY;
    for (index, (x, o)) in values.zip(out.iter_mut()).enumerate() {
        if x.is_nan() || x == f64::INFINITY {
            return Err(MechanismError::NonFinite {
                row,
                index,
                value: x,
            });
        }
        *o = x;
        max = max.max(x);
    }
    if max == f64::NEG_INFINITY {
        return Err(MechanismError::NoFiniteLogit { row });
    }
    let mut shifted_sum = 0.0;
    for o in out.iter_mut() {
        *o -= max;
        shifted_sum += o.exp();
    }
    let ln_sum = shifted_sum.ln();
    let mut sum = 0.0;
    for o in out.iter_mut() {
        *o = (*o - ln_sum).exp();
        sum += *o;
    }
    Ok(sum)
}
