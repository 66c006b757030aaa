//! Embedding Space Aggregation (Wu et al. 2023, "Privacy-Preserving
//! In-Context Learning for Large Language Models"), the ICL baseline of
//! dps-mozo.txt App. D, Algorithm 4.
//!
//! Per query: the private demonstrations are split into N disjoint subsets;
//! subset i's few-shot prompt gives one output sentence, embedded as `E_i`.
//! The mechanism releases `Ê = (1/N)·Σ E_i + N(0, σ²·I)` and answers with the
//! public candidate sentence (zero-shot samples, which cost nothing) of
//! largest cosine similarity to `Ê` — post-processing of `Ê`.
//!
//! Guarantee: each `E_i` is clipped to L2 norm ≤ 1 (sentence encoders that
//! normalise, as all-MiniLM-L6-v2 does, are untouched up to rounding).
//! Replacing one demonstration changes one subset, hence one `E_i`, so the
//! mean moves by at most `‖E_i − E_i'‖/N ≤ 2/N`: the release is the Gaussian
//! mechanism with L2 sensitivity `Δ = 2/N`, `(α, α·Δ²/(2σ²))`-RDP at every
//! order (Mironov 2017, Prop. 7), composed over queries. Adding or removing a
//! demonstration also changes one subset (the partition assigns the others as
//! before), so the same charge covers it. No amplification by subsampling is
//! claimed. Wu et al. account with the PRV accountant; RDP here is at least
//! as conservative.

use privmix_accountant::{Orders, RdpCurve, gaussian};
use rand_distr::{Distribution, Normal};

use crate::account::Account;
use crate::baselines::positive;
use crate::error::MechanismError;
use crate::rng::PrivacyRng;

/// The Gaussian mechanism on the mean of N clipped sentence embeddings.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingSpaceAggregation {
    sigma: f64,
}

/// One answered query.
#[derive(Debug, Clone)]
pub struct EmbeddingRelease {
    /// Index of the chosen candidate (ties go to the lowest index).
    pub index: usize,
    /// Cosine similarity of each candidate to the noisy mean.
    pub similarities: Vec<f64>,
    /// The charge recorded for this query.
    pub charge: RdpCurve,
}

impl EmbeddingSpaceAggregation {
    /// Noise standard deviation σ > 0 (finite), per coordinate.
    pub fn new(sigma: f64) -> Result<Self, MechanismError> {
        positive("sigma", sigma)?;
        Ok(Self { sigma })
    }

    /// The smallest σ (to relative 1e-9) for which `queries` releases over
    /// `subsets` subsets stay within (ε, δ) at `orders`, with ε(δ) evaluated
    /// by the accountant's rounded-up conversion.
    pub fn calibrated(
        orders: &Orders,
        subsets: usize,
        queries: u64,
        epsilon: f64,
        delta: f64,
    ) -> Result<Self, MechanismError> {
        let sensitivity = sensitivity(subsets)?;
        let sigma =
            privmix_accountant::gaussian_sigma(orders, sensitivity, queries, epsilon, delta)?;
        Self::new(sigma)
    }

    /// σ.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The per-query curve `α·(2/N)²/(2σ²)`, rounded up.
    pub fn curve(&self, orders: &Orders, subsets: usize) -> Result<RdpCurve, MechanismError> {
        Ok(gaussian(orders, self.sigma, sensitivity(subsets)?)?)
    }

    /// Charges `account`, then releases the candidate closest (cosine) to the
    /// noisy mean of `outputs` (one embedding per subset). Nothing is charged
    /// when the input is bad.
    ///
    /// Errors: no outputs or candidates, differing or zero dimensions,
    /// non-finite values, a candidate of norm 0 (its cosine is undefined).
    pub fn release(
        &self,
        outputs: &[Vec<f32>],
        candidates: &[Vec<f32>],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<EmbeddingRelease, MechanismError> {
        let mean = clipped_mean(outputs)?;
        let norms = check_candidates(candidates, mean.len())?;
        // Everything that can fail comes before the charge.
        let normal =
            Normal::new(0.0, self.sigma).map_err(|_| MechanismError::InvalidParameter {
                name: "sigma",
                value: self.sigma,
                reason: "must be finite and > 0",
            })?;
        let charge = self.curve(account.orders(), outputs.len())?;
        account.charge(&charge, "embedding-space-aggregation")?;
        let noisy: Vec<f64> = mean.iter().map(|m| m + normal.sample(rng)).collect();
        let noisy_norm = noisy.iter().map(|v| v * v).sum::<f64>().sqrt();
        let similarities: Vec<f64> = candidates
            .iter()
            .zip(&norms)
            .map(|(c, n)| {
                let dot: f64 = c.iter().zip(&noisy).map(|(&a, b)| a as f64 * b).sum();
                // The noise is continuous: Ê = 0 has probability zero.
                dot / (n * noisy_norm.max(f64::MIN_POSITIVE))
            })
            .collect();
        let mut index = 0;
        for (i, &s) in similarities.iter().enumerate() {
            if s > similarities[index] {
                index = i;
            }
        }
        Ok(EmbeddingRelease {
            index,
            similarities,
            charge,
        })
    }
}

/// `2/N`, rounded up.
fn sensitivity(subsets: usize) -> Result<f64, MechanismError> {
    if subsets == 0 {
        return Err(MechanismError::EmptyEnsemble);
    }
    // Division is correctly rounded; the next float up bounds 2/N.
    Ok((2.0 / subsets as f64).next_up())
}

/// The mean of the outputs after clipping each to L2 norm ≤ 1, in f64.
pub fn clipped_mean(outputs: &[Vec<f32>]) -> Result<Vec<f64>, MechanismError> {
    let first = outputs.first().ok_or(MechanismError::EmptyEnsemble)?;
    let dim = first.len();
    if dim == 0 {
        return Err(MechanismError::EmptyVocabulary);
    }
    let mut sum = vec![0.0f64; dim];
    for (row, e) in outputs.iter().enumerate() {
        check_row(row, e, dim, "subset outputs")?;
        let norm = e.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        // Dividing by a norm > 1 leaves a norm of 1 up to rounding; the
        // sensitivity 2/N is rounded up by more than that slack.
        let scale = if norm > 1.0 { 1.0 / norm } else { 1.0 };
        for (s, &v) in sum.iter_mut().zip(e) {
            *s += v as f64 * scale;
        }
    }
    let n = outputs.len() as f64;
    Ok(sum.into_iter().map(|s| s / n).collect())
}

/// The candidates' norms, after checking them.
fn check_candidates(candidates: &[Vec<f32>], dim: usize) -> Result<Vec<f64>, MechanismError> {
    if candidates.is_empty() {
        return Err(MechanismError::InvalidParameter {
            name: "candidates",
            value: 0.0,
            reason: "at least one public candidate is needed",
        });
    }
    candidates
        .iter()
        .enumerate()
        .map(|(row, c)| {
            check_row(row, c, dim, "candidates")?;
            let norm = c.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
            if norm > 0.0 {
                Ok(norm)
            } else {
                Err(MechanismError::InvalidParameter {
                    name: "candidate norm",
                    value: norm,
                    reason: "a candidate embedding of norm 0 has no cosine similarity",
                })
            }
        })
        .collect()
}

fn check_row(row: usize, e: &[f32], dim: usize, what: &'static str) -> Result<(), MechanismError> {
    if e.len() != dim {
        return Err(MechanismError::LengthMismatch {
            what,
            len: e.len(),
            vocab: dim,
        });
    }
    if let Some((index, &v)) = e.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(MechanismError::NonFinite {
            row,
            index,
            value: v as f64,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_accountant::Budget;

    fn orders() -> Orders {
        Orders::dp_accounting_default()
    }

    #[test]
    fn sensitivity_is_two_over_n_and_the_curve_is_gaussian() {
        let esa = EmbeddingSpaceAggregation::new(0.5).unwrap();
        let curve = esa.curve(&orders(), 4).unwrap();
        for (&a, &e) in orders().as_slice().iter().zip(curve.epsilons()) {
            let exact = a * 0.25 / (2.0 * 0.25);
            assert!(
                e >= exact && e <= exact * (1.0 + 1e-12),
                "{a}: {e} vs {exact}"
            );
        }
    }

    #[test]
    fn clipping_bounds_every_output_by_one() {
        let mean = clipped_mean(&[vec![3.0, 4.0], vec![0.0, 0.5]]).unwrap();
        assert!((mean[0] - 0.3).abs() < 1e-12 && (mean[1] - 0.65).abs() < 1e-12);
    }

    #[test]
    fn with_little_noise_the_closest_candidate_wins() {
        let esa = EmbeddingSpaceAggregation::new(1e-6).unwrap();
        let outputs = vec![vec![1.0, 0.0, 0.0], vec![0.8, 0.6, 0.0]];
        let candidates = vec![
            vec![0.0, 0.0, 1.0],
            vec![0.9, 0.3, 0.0],
            vec![-1.0, 0.0, 0.0],
        ];
        let mut rng = PrivacyRng::from_seed(1);
        let mut account = crate::Unbudgeted::new(orders());
        let r = esa
            .release(&outputs, &candidates, &mut rng, &mut account)
            .unwrap();
        assert_eq!(r.index, 1);
        assert!(r.similarities[1] > 0.99);
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_charged() {
        let esa = EmbeddingSpaceAggregation::new(1.0).unwrap();
        let mut rng = PrivacyRng::from_seed(0);
        let mut budget = Budget::new(orders(), 1.0, 1e-5).unwrap();
        let good = vec![vec![1.0f32, 0.0]];
        type Rows = Vec<Vec<f32>>;
        let cases: [(Rows, Rows); 5] = [
            (vec![], good.clone()),
            (good.clone(), vec![]),
            (vec![vec![1.0, 0.0], vec![1.0]], good.clone()),
            (vec![vec![f32::NAN, 0.0]], good.clone()),
            (good.clone(), vec![vec![0.0, 0.0]]),
        ];
        for (outputs, candidates) in cases {
            assert!(
                esa.release(&outputs, &candidates, &mut rng, &mut budget)
                    .is_err()
            );
        }
        assert!(budget.spent().epsilons().iter().all(|&e| e == 0.0));
        assert!(EmbeddingSpaceAggregation::new(0.0).is_err());
        assert!(EmbeddingSpaceAggregation::new(f64::NAN).is_err());
    }

    #[test]
    fn calibration_fits_the_budget_and_is_minimal() {
        let o = orders();
        let esa = EmbeddingSpaceAggregation::calibrated(&o, 32, 16, 4.0, 1e-5).unwrap();
        let spent = |sigma: f64| {
            gaussian(&o, sigma, 2.0 / 32.0)
                .unwrap()
                .self_compose(16)
                .epsilon(1e-5)
                .unwrap()
                .epsilon
        };
        assert!(spent(esa.sigma()) <= 4.0);
        assert!(spent(esa.sigma() * (1.0 - 1e-6)) > 4.0);
    }
}
