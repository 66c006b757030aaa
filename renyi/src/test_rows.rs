//! Deterministic probability rows for tests (feature `test-rows`, and this crate's own
//! tests): wide dynamic range, reproducible from a seed, no random-number crate.
//!
//! The tests of this crate and of `privmix-mixing` exercise the divergence kernels on
//! rows whose entries span many orders of magnitude, where the scaled ratio pass and the
//! error model matter. Both draw them here, so one generator decides what "a wide row" is.

/// Uniform draws on `[0, 1)` with 53 random bits each, from a xorshift64 stream seeded by
/// `seed` (any seed: it is mixed and made odd, so the stream never sticks at zero).
///
/// Exact integer arithmetic and one exact conversion: the same seed gives the same
/// draws on every machine.
pub fn uniforms(seed: u64) -> impl Iterator<Item = f64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::iter::repeat_with(move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// A distribution over `len` outcomes whose unnormalised weights are `10^(−spread·u)`,
/// `u` the first `len` of [`uniforms`]`(seed)`; `shape` may then
/// change the weights (plant a small entry, zero some) before they are normalised to sum
/// to 1.
///
/// The same `(len, seed, spread, shape)` gives the same bits on every machine: `powf`,
/// the sum and the division are the only roundings.
///
/// # Panics
/// If `len` is 0 or `shape` leaves every weight zero (the row cannot be normalised): a
/// test's own mistake, not an input to report.
pub fn wide_row(len: usize, seed: u64, spread: f64, shape: impl FnOnce(&mut [f64])) -> Vec<f64> {
    assert!(len > 0, "a row needs at least one outcome");
    let mut weights: Vec<f64> = uniforms(seed)
        .take(len)
        .map(|u| 10f64.powf(-spread * u))
        .collect();
    shape(&mut weights);
    let total: f64 = weights.iter().sum();
    assert!(total > 0.0, "the shaped weights must not all be zero");
    weights.iter_mut().for_each(|w| *w /= total);
    weights
}

#[cfg(test)]
mod tests {
    use super::wide_row;

    #[test]
    fn a_row_is_a_distribution_over_the_spread_and_reproducible() {
        let row = wide_row(4096, 3, 30.0, |_| {});
        let total: f64 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-12);
        let (min, max) = row
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        // Weights lie in (10^−30, 1]; over 4096 draws both ends are approached.
        assert!(max / min > 1e25 && max / min <= 1e30, "range {}", max / min);
        assert_eq!(row, wide_row(4096, 3, 30.0, |_| {}));
        assert_ne!(row, wide_row(4096, 4, 30.0, |_| {}));
    }

    #[test]
    fn the_shape_is_applied_before_normalising() {
        let row = wide_row(8, 1, 5.0, |w| w[2] = 0.0);
        assert_eq!(row[2], 0.0);
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-15);
    }
}
