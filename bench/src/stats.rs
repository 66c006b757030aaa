//! Intervals over independent repetitions (seeds) of an experiment.
//!
//! Each seed of a run is one independent deployment: its own resampled queries
//! (held-out blocks or test words), its own mechanism randomness and its own
//! privacy budget. A figure reported with an interval is the mean over seeds
//! with the two-sided 95% Student-t interval `mean ± t₀.₉₇₅,ₙ₋₁ · s/√n`
//! (s the sample standard deviation), which is exact for normal per-seed
//! values and the usual large-sample interval otherwise. A comparison of two
//! methods is made on the per-seed differences (paired: both ran on the same
//! queries), so the variance the seeds share cancels.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::error::BenchError;

/// The confidence level of every interval in the report.
pub const LEVEL: f64 = 0.95;

/// A mean over seeds with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Mean over the seeds.
    pub mean: f64,
    /// Lower end of the 95% interval (the mean itself with one seed).
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Seeds.
    pub n: usize,
}

impl Interval {
    /// The mean and 95% Student-t interval of `values` (one per seed).
    ///
    /// Errors: no value, or a value that is not finite (an infinite
    /// perplexity has no mean; the caller reports it as such).
    pub fn of(values: &[f64]) -> Result<Self, BenchError> {
        if values.is_empty() {
            return Err(BenchError::Config("an interval of no value".into()));
        }
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(BenchError::Config(format!(
                "an interval over a value that is not finite: {v}"
            )));
        }
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Ok(Self {
                mean,
                low: mean,
                high: mean,
                n,
            });
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_quantile(n - 1)? * (var / n as f64).sqrt();
        Ok(Self {
            mean,
            low: mean - half,
            high: mean + half,
            n,
        })
    }

    /// The geometric mean of positive `values` (one per seed) and the 95%
    /// Student-t interval of their logarithms, mapped back by `exp`. For
    /// perplexities (each seed's `exp` of its mean negative log-likelihood) this
    /// is the t-interval of the seeds' mean losses in perplexity units: it stays
    /// positive, and a seed of much harder text widens it multiplicatively.
    ///
    /// Errors: no value, or a value that is not finite and positive.
    pub fn geometric(values: &[f64]) -> Result<Self, BenchError> {
        if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(BenchError::Config(format!(
                "a geometric interval over a value that is not finite and positive: {v}"
            )));
        }
        let logs: Vec<f64> = values.iter().map(|v| v.ln()).collect();
        let log = Self::of(&logs)?;
        Ok(Self {
            mean: log.mean.exp(),
            low: log.low.exp(),
            high: log.high.exp(),
            n: log.n,
        })
    }

    /// The interval of the per-seed differences `a[i] − b[i]` (paired seeds).
    pub fn of_differences(a: &[f64], b: &[f64]) -> Result<Self, BenchError> {
        if a.len() != b.len() {
            return Err(BenchError::Config(format!(
                "paired values of unequal length: {} and {}",
                a.len(),
                b.len()
            )));
        }
        let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        Self::of(&d)
    }

    /// Whether the whole interval lies below `x`.
    pub fn below(&self, x: f64) -> bool {
        self.high < x
    }

    /// Whether the whole interval lies above `x`.
    pub fn above(&self, x: f64) -> bool {
        self.low > x
    }

    /// Whether `x` lies inside the interval.
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }

    /// `mean [low, high]` with `digits` decimals.
    pub fn display(&self, digits: usize) -> String {
        if self.n < 2 {
            return format!("{:.digits$} (1 seed)", self.mean);
        }
        format!(
            "{:.digits$} [{:.digits$}, {:.digits$}]",
            self.mean, self.low, self.high
        )
    }
}

/// `t₀.₉₇₅` of Student's t with `df` degrees of freedom.
pub fn t_quantile(df: usize) -> Result<f64, BenchError> {
    let t = StudentsT::new(0.0, 1.0, df as f64)
        .map_err(|e| BenchError::Config(format!("Student t with {df} degrees of freedom: {e}")))?;
    Ok(t.inverse_cdf(0.5 + LEVEL / 2.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-sided 95% critical values of Student's t, from the standard table
    /// (Fisher & Yates, "Statistical Tables", Table III; also
    /// `scipy.stats.t.ppf(0.975, df)`).
    #[test]
    fn t_quantiles_match_the_table() {
        for (df, t) in [
            (1, 12.706204736),
            (4, 2.776445105),
            (9, 2.262157163),
            (29, 2.045229642),
        ] {
            assert!((t_quantile(df).unwrap() - t).abs() < 1e-6, "df {df}");
        }
    }

    #[test]
    fn interval_of_known_values() {
        // mean 3, s² = 2.5, half-width t₀.₉₇₅,₄ · √(2.5/5).
        let i = Interval::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let half = 2.776445105 * 0.5f64.sqrt();
        assert!((i.mean - 3.0).abs() < 1e-12);
        assert!((i.low - (3.0 - half)).abs() < 1e-6);
        assert!((i.high - (3.0 + half)).abs() < 1e-6);
        assert!(i.contains(3.0) && i.below(6.0) && i.above(0.0));
    }

    #[test]
    fn geometric_interval_is_the_log_interval_mapped_back() {
        // Logs 0, ln 10, ln 100: mean ln 10, s² = (ln 10)², half-width
        // t₀.₉₇₅,₂ · ln 10 / √3 (closed form).
        let i = Interval::geometric(&[1.0, 10.0, 100.0]).unwrap();
        let half = 4.302652730 * 10f64.ln() / 3f64.sqrt();
        assert!((i.mean - 10.0).abs() < 1e-9);
        assert!((i.low - (10f64.ln() - half).exp()).abs() < 1e-6);
        assert!((i.high - (10f64.ln() + half).exp()).abs() < 1e-4);
        // Positive however wide (the arithmetic interval of these goes below 0).
        assert!(i.low > 0.0 && Interval::of(&[1.0, 10.0, 100.0]).unwrap().low < 0.0);
        assert!(Interval::geometric(&[1.0, 0.0]).is_err());
        assert!(Interval::geometric(&[1.0, -2.0]).is_err());
        assert!(Interval::geometric(&[]).is_err());
    }

    #[test]
    fn paired_differences_cancel_shared_variation() {
        let a = [10.0, 20.0, 30.0, 40.0, 50.0];
        let b = [9.0, 19.1, 28.9, 39.0, 49.0];
        let d = Interval::of_differences(&a, &b).unwrap();
        assert!(d.above(0.0));
        assert!(
            !Interval::of(&a)
                .unwrap()
                .above(Interval::of(&b).unwrap().high)
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(Interval::of(&[]).is_err());
        assert!(Interval::of(&[1.0, f64::INFINITY]).is_err());
        assert!(Interval::of(&[1.0, f64::NAN]).is_err());
        assert!(Interval::of_differences(&[1.0], &[1.0, 2.0]).is_err());
        let one = Interval::of(&[4.0]).unwrap();
        assert_eq!((one.low, one.high, one.n), (4.0, 4.0, 1));
    }
}
