//! Sampling a token from a distribution, in f64.

use rand::Rng;

use crate::MechanismError;

/// Draws an index with probability `p[i] / Σp` by inversion of the f64 CDF with
/// a 53-bit uniform. Indices with zero mass are never returned. `p` must be
/// finite and non-negative with a positive sum.
pub fn sample_index(p: &[f64], rng: &mut impl Rng) -> Result<usize, MechanismError> {
    if p.is_empty() {
        return Err(MechanismError::EmptyVocabulary);
    }
    let mut total = 0.0;
    for (index, &x) in p.iter().enumerate() {
        if !x.is_finite() {
            return Err(MechanismError::NonFinite {
                row: 0,
                index,
                value: x,
            });
        }
        if x < 0.0 {
            return Err(MechanismError::Negative {
                row: 0,
                index,
                value: x,
            });
        }
        total += x;
    }
    if total.is_nan() || total <= 0.0 {
        return Err(MechanismError::NotNormalised {
            row: 0,
            sum: total,
            tolerance: 0.0,
        });
    }
    let target = rng.random::<f64>() * total;
    let mut cumulative = 0.0;
    let mut last_positive = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > 0.0 {
            cumulative += x;
            last_positive = i;
            if target < cumulative {
                return Ok(i);
            }
        }
    }
    // Rounding can leave `cumulative` a hair below `target`: the draw belongs to
    // the last index with mass.
    Ok(last_positive)
}

/// Draws an index from unnormalised log-weights (−∞ allowed), normalising by
/// the maximum first so that nothing overflows.
pub fn sample_log_index(log_p: &[f64], rng: &mut impl Rng) -> Result<usize, MechanismError> {
    let max = log_p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if let Some((index, &value)) = log_p
        .iter()
        .enumerate()
        .find(|(_, x)| x.is_nan() || **x == f64::INFINITY)
    {
        return Err(MechanismError::NonFinite {
            row: 0,
            index,
            value,
        });
    }
    if max == f64::NEG_INFINITY {
        return Err(MechanismError::NotNormalised {
            row: 0,
            sum: 0.0,
            tolerance: 0.0,
        });
    }
    let weights: Vec<f64> = log_p.iter().map(|&l| (l - max).exp()).collect();
    sample_index(&weights, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PrivacyRng;

    #[test]
    fn never_samples_zero_mass_and_matches_frequencies() {
        let p = [0.0, 0.25, 0.0, 0.75, 0.0];
        let mut rng = PrivacyRng::from_seed(1);
        let mut counts = [0usize; 5];
        for _ in 0..40_000 {
            counts[sample_index(&p, &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[0] + counts[2] + counts[4], 0);
        let share = counts[1] as f64 / 40_000.0;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
    }

    #[test]
    fn log_sampling_survives_extreme_logits() {
        let mut rng = PrivacyRng::from_seed(2);
        let l = [-1e300, f64::NEG_INFINITY, -1e300 + 1.0];
        let i = sample_log_index(&l, &mut rng).unwrap();
        assert!(i == 0 || i == 2);
        assert!(sample_log_index(&[f64::NAN], &mut rng).is_err());
        assert!(sample_log_index(&[f64::NEG_INFINITY], &mut rng).is_err());
        assert!(sample_index(&[0.0, 0.0], &mut rng).is_err());
    }
}
