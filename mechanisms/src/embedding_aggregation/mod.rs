//! Embedding Space Aggregation (Wu et al., "Privacy-Preserving In-Context
//! Learning for Large Language Models", arXiv:2305.01639), the ICL baseline of
//! DPS-MOZO (arXiv:2501.19287, App. D, Algorithm 4). The guarantee below is
//! argued step by step in `proof.md` beside this file
//! (`src/embedding_aggregation/proof.md`).
//!
//! Per query: the private demonstrations are split into N disjoint subsets;
//! subset i's few-shot prompt gives one output sentence, embedded as `E_i`.
//! The mechanism releases `Ê = (1/N)·Σ E_i + N(0, σ²·I)` and answers with the
//! public candidate sentence (zero-shot samples, which cost nothing) of
//! largest cosine similarity to `Ê` — post-processing of `Ê`.
//!
//! Privacy unit: one private demonstration. Adjacency: REPLACE-ONE — the
//! neighbour has the same number of demonstrations with one of them changed
//! arbitrarily. The caller splits the demonstrations into the N subsets by
//! position (independently of their content), so a replaced demonstration
//! changes exactly one subset, hence one output `E_i`, arbitrarily. (Adding or
//! removing a demonstration would shift every later positional chunk, so no
//! add/remove claim is made.)
//!
//! Guarantee: each `E_i` is clipped to L2 norm ≤ 1 (sentence encoders that
//! normalise, as all-MiniLM-L6-v2 does, are untouched up to rounding), their
//! mean is rounded to a grid of granularity g (a power of two, default
//! [`EmbeddingSpaceAggregation::DEFAULT_GRANULARITY`]) and released with i.i.d. DISCRETE Gaussian noise
//! `g·Z_j`, `P(Z_j = z) ∝ exp(−(g·z)²/(2σ²))`, sampled exactly from random bits
//! ([`crate::noise::gaussian_on_grid`]). The L2 sensitivity
//! [`EmbeddingSpaceAggregation::sensitivity`]
//! bounds, in f64 rounded up:
//! * the exact mean of exactly clipped outputs: `2C/N`, with C ≥ 1 the norm
//!   bound of an output clipped in f64 (below);
//! * the f64 error of clipping and of the mean: an output v (f32, widened
//!   exactly) has its norm computed as `n = fl(√fl(Σv²))` ≥ `‖v‖·√(1−γ_d)·(1−u)`
//!   (squares of f32 values neither overflow nor underflow in f64; d − 1
//!   additions; one square root; u = 2⁻⁵³, `γ_k = ku/(1−ku)`), and is scaled by
//!   `fl(1/n)` entry by entry when n > 1, so its norm is at most
//!   `C = (1+u)²/((1−u)·√(1−γ_d))`; the mean (outputs summed in order, then
//!   divided by N) is off the exact mean of those by at most `γ_N·C + √d·2⁻¹⁰⁷⁴`
//!   in L2 (`|Σ error| ≤ γ_N·Σ|terms|` per coordinate, Minkowski over
//!   coordinates, one possibly subnormal quotient per coordinate), on each side
//!   of the pair;
//! * the grid: `+√d·g` ([`crate::noise::rounded_l2_sensitivity`]).
//!
//! With Δ that total, the release is `(α, α·Δ²/(2σ²))`-RDP at every order: for
//! integer shifts the discrete Gaussian's Rényi divergence is at most the
//! continuous one's (Canonne, Kamath & Steinke, "The Discrete Gaussian for
//! Differential Privacy", arXiv 2004.00010), and it adds over independent
//! coordinates; queries compose. No amplification by subsampling is claimed.
//! Wu et al. account with the PRV accountant; RDP here is at least as
//! conservative.

use privmix_accountant::{Orders, RdpCurve, gaussian};

use crate::account::Account;
use crate::error::MechanismError;
use crate::error::positive;
use crate::rng::PrivacyRng;

/// The discrete Gaussian mechanism on the mean of N clipped sentence embeddings.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingSpaceAggregation {
    sigma: f64,
    granularity: f64,
}

/// The default grid, 2⁻³⁰: far below any useful σ for clipped (norm ≤ 1)
/// embeddings, and adding only `√d·2⁻³⁰` to the sensitivity.
const DEFAULT_GRANULARITY: f64 = 1.0 / 1_073_741_824.0;

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
    /// The default grid granularity, 2⁻³⁰ (see the module doc).
    pub const DEFAULT_GRANULARITY: f64 = DEFAULT_GRANULARITY;

    /// The L2 sensitivity charged for `subsets` outputs of dimension `dim` on
    /// the grid `granularity` (`2C/N + 2(γ_N·C + √d·2⁻¹⁰⁷⁴) + √d·g`, rounded up;
    /// derivation in the module doc).
    pub fn sensitivity(
        subsets: usize,
        dim: usize,
        granularity: f64,
    ) -> Result<f64, MechanismError> {
        sensitivity(subsets, dim, granularity)
    }

    /// Noise parameter σ > 0 (finite), per coordinate, on the grid
    /// [`Self::DEFAULT_GRANULARITY`].
    pub fn new(sigma: f64) -> Result<Self, MechanismError> {
        Self::with_granularity(sigma, DEFAULT_GRANULARITY)
    }

    /// σ > 0 on a grid of granularity g (a positive normal power of two).
    pub fn with_granularity(sigma: f64, granularity: f64) -> Result<Self, MechanismError> {
        positive("sigma", sigma)?;
        crate::noise::check_granularity(granularity)?;
        Ok(Self { sigma, granularity })
    }

    /// g.
    pub fn granularity(&self) -> f64 {
        self.granularity
    }

    /// The smallest σ (to relative 1e-9) for which `queries` releases over
    /// `subsets` subsets of `dim`-dimensional embeddings stay within (ε, δ) at
    /// `orders` on the default grid, with ε(δ) evaluated by the accountant's
    /// rounded-up conversion.
    pub fn calibrated(
        orders: &Orders,
        subsets: usize,
        dim: usize,
        queries: u64,
        epsilon: f64,
        delta: f64,
    ) -> Result<Self, MechanismError> {
        let sensitivity = sensitivity(subsets, dim, DEFAULT_GRANULARITY)?;
        let sigma =
            privmix_accountant::gaussian_sigma(orders, sensitivity, queries, epsilon, delta)?;
        Self::new(sigma)
    }

    /// σ.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The per-query curve `α·Δ²/(2σ²)` for `subsets` outputs of dimension
    /// `dim` ([`Self::sensitivity`]), rounded up.
    pub fn curve(
        &self,
        orders: &Orders,
        subsets: usize,
        dim: usize,
    ) -> Result<RdpCurve, MechanismError> {
        Ok(gaussian(
            orders,
            self.sigma,
            sensitivity(subsets, dim, self.granularity)?,
        )?)
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
        // Everything that can fail comes before the charge (the grid rounding
        // of the mean included: the noise is drawn after it).
        let charge = self.curve(account.orders(), outputs.len(), mean.len())?;
        crate::noise::check_granularity(self.granularity)?;
        for &m in &mean {
            crate::noise::round_to_grid(m, self.granularity)?;
        }
        account.charge(&charge, "embedding-space-aggregation")?;
        let noisy = crate::noise::gaussian_on_grid(&mean, self.sigma, self.granularity, rng)?;
        let noisy_norm = noisy.iter().map(|v| v * v).sum::<f64>().sqrt();
        let similarities: Vec<f64> = candidates
            .iter()
            .zip(&norms)
            .map(|(c, n)| {
                let dot: f64 = c.iter().zip(&noisy).map(|(&a, b)| a as f64 * b).sum();
                // Ê = 0 is possible on the grid: every cosine is then 0.
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

/// See [`EmbeddingSpaceAggregation::sensitivity`].
fn sensitivity(subsets: usize, dim: usize, granularity: f64) -> Result<f64, MechanismError> {
    if subsets == 0 {
        return Err(MechanismError::EmptyEnsemble);
    }
    if dim == 0 {
        return Err(MechanismError::EmptyVocabulary);
    }
    crate::noise::check_granularity(granularity)?;
    let u = 2f64.powi(-53);
    let gamma = |k: f64| {
        let ku = (k * u).next_up();
        if ku >= 0.5 {
            f64::INFINITY
        } else {
            (ku / (1.0 - ku).next_down()).next_up()
        }
    };
    let d = dim as f64;
    let below = ((1.0 - gamma(d)).next_down().sqrt().next_down() * (1.0 - u)).next_down();
    let clip = ((1.0 + u).next_up() * (1.0 + u).next_up()).next_up() / below;
    let clip = clip.next_up();
    let root_d = d.sqrt().next_up();
    let exact = ((2.0 * clip) / subsets as f64).next_up();
    let float = ((gamma(subsets as f64) * clip).next_up() + (root_d * 2f64.powi(-1074)).next_up())
        .next_up();
    let total = (exact + (2.0 * float).next_up()).next_up();
    if !total.is_finite() {
        return Err(MechanismError::InvalidParameter {
            name: "dim",
            value: d,
            reason: "too many coordinates for the f64 error bound",
        });
    }
    Ok(crate::noise::rounded_l2_sensitivity(
        total,
        dim,
        granularity,
    ))
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
        // Dividing by a norm > 1 leaves a norm of 1 up to rounding; `sensitivity`
        // bounds that rounding (and the mean's).
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
mod tests;
