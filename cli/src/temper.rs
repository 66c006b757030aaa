//! `--temperature`: each model's next-token distribution tempered before the mechanism.
//!
//! Every row of a step (the public model's and each member's) has its
//! log-probabilities divided by T and is renormalised on its own:
//! `p_T(x) = p(x)^{1/T} / Σ_y p(y)^{1/T}`. A member's tempered row is a function
//! of that member's row alone, and every mechanism's charge holds for whatever
//! member distributions it is given, so tempering the inputs keeps every
//! guarantee unchanged. The mechanism's output is never tempered: its guarantee is
//! for the distribution it outputs, and sharpening that after the mixing would
//! sample from another one (see `privmix_mechanisms::temper`, the same operation
//! on an `Ensemble`).

use privmix_ensemble::rows::LogProbRows;

use crate::error::CliError;

/// Checks `--temperature`: finite and > 0.
pub fn check_temperature(temperature: f64) -> Result<(), CliError> {
    if temperature.is_finite() && temperature > 0.0 {
        Ok(())
    } else {
        Err(CliError::arg(
            "--temperature",
            format!("{temperature} is not a finite number > 0"),
        ))
    }
}

/// Every row of `rows` (row-major, `vocab` natural-log probabilities each)
/// divided by `temperature` and renormalised, written to `out`: `l/T − log Σ
/// exp(l/T)`, the sum taken in f64 from the row's maximum. −∞ (a zero
/// probability) stays −∞.
pub fn temper_log_probs(rows: &[f32], vocab: usize, temperature: f64, out: &mut Vec<f32>) {
    out.clear();
    out.reserve(rows.len());
    if vocab == 0 {
        return;
    }
    for row in rows.chunks(vocab) {
        let max = row
            .iter()
            .map(|&l| f64::from(l) / temperature)
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row
            .iter()
            .map(|&l| (f64::from(l) / temperature - max).exp())
            .sum();
        let log_norm = max + sum.ln();
        out.extend(
            row.iter()
                .map(|&l| (f64::from(l) / temperature - log_norm) as f32),
        );
    }
}

/// The public row and the member rows of one step at `temperature`: the rows
/// themselves at T = 1, else their tempered copies in `buffer`.
pub fn tempered_rows<'a>(
    rows: &'a LogProbRows,
    temperature: f64,
    buffer: &'a mut Vec<f32>,
) -> (&'a [f32], &'a [f32]) {
    if temperature == 1.0 {
        return (rows.row(0), rows.member_rows());
    }
    let vocab = rows.vocab();
    temper_log_probs(rows.as_flat(), vocab, temperature, buffer);
    buffer.split_at(vocab.min(buffer.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_mechanisms::{Ensemble, Rows, temper};

    /// Public row and two members over a vocabulary of 4, as log-probabilities.
    fn rows() -> (Vec<f64>, Vec<f32>) {
        let probs = [
            0.5, 0.25, 0.125, 0.125, // public
            0.7, 0.1, 0.2, 0.0, // member 0 (a zero)
            0.05, 0.05, 0.3, 0.6, // member 1
        ];
        let logs = probs.iter().map(|&p: &f64| p.ln() as f32).collect();
        (probs.to_vec(), logs)
    }

    /// Each row raised to 1/T and renormalised on its own, every row (public and
    /// members), as `privmix_mechanisms::temper` computes it in probability space.
    #[test]
    fn every_row_is_tempered_on_its_own() {
        let (probs, logs) = rows();
        for t in [0.5, 0.8, 1.0, 1.7, 3.0] {
            let mut out = Vec::new();
            temper_log_probs(&logs, 4, t, &mut out);
            let reference = temper(
                &Ensemble::from_probabilities(&probs[..4], &probs[4..]).unwrap(),
                t,
            )
            .unwrap();
            let mut expected = reference.public().to_vec();
            expected.extend_from_slice(reference.members());
            for (i, (&l, &e)) in out.iter().zip(&expected).enumerate() {
                let p = f64::from(l).exp();
                assert!((p - e).abs() < 1e-6, "T = {t}, entry {i}: {p} vs {e}");
            }
            // The closed form for one entry: member 1's last, 0.6^(1/T) / Σ p^(1/T).
            let z: f64 = probs[8..].iter().map(|p| p.powf(1.0 / t)).sum();
            let closed = 0.6f64.powf(1.0 / t) / z;
            assert!((f64::from(out[11]).exp() - closed).abs() < 1e-6, "T = {t}");
            // A zero stays a zero.
            assert_eq!(out[7], f32::NEG_INFINITY);
            // The mechanism accepts the tempered rows as distributions.
            Ensemble::new(Rows::LogProbF32(&out[..4]), Rows::LogProbF32(&out[4..])).unwrap();
        }
    }

    /// Below 1 the most likely token gains, above 1 it loses; at 1 nothing changes.
    #[test]
    fn temperature_sharpens_below_one_and_flattens_above() {
        let (_, logs) = rows();
        let top = |t: f64| {
            let mut out = Vec::new();
            temper_log_probs(&logs, 4, t, &mut out);
            f64::from(out[0]).exp()
        };
        assert!(top(0.5) > top(1.0) && top(1.0) > top(2.0));
        assert!((top(1.0) - 0.5).abs() < 1e-7);
    }

    #[test]
    fn temperature_must_be_positive_and_finite() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(check_temperature(bad).is_err(), "{bad}");
        }
        assert!(check_temperature(0.7).is_ok());
    }
}
