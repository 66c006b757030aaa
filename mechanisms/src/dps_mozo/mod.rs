//! DPS-MOZO (Flemings, Gan, Li, Razaviyayn, Annavaram, "Differentially Private
//! In-context Learning via Sampling Few-shot Mixed with Zero-shot Outputs",
//! arXiv:2501.19287, §4, Alg. 1–3, App. B), with the per-token bound privmix can prove.
//!
//! Per generated token (Alg. 1): draw a uniformly random `n_shots`-subset S of the private
//! demonstrations D; take the top-k indices K of the zero-shot logits `l₀` (public); for
//! each drawn demonstration i, truncate its one-shot logits `lᵢ` and `l₀` to K and mix in
//! logit space, `mᵢ = softmax(λᵢlᵢ + (1−λᵢ)l₀)`, with the largest `λᵢ ∈ [0, λ_max]`
//! satisfying the constraint; sample from the normalised product `∏ᵢ mᵢ`.
//!
//! # Guarantee
//!
//! privmix constrains the **max divergence** both ways, `Dsym_∞(mᵢ, z) ≤ b`
//! (z = softmax(l₀)), not the paper's `Dsym_α ≤ βα` at one finite α: the paper's
//! per-token bound (Thm B.3) does not hold (`tests/integration/dps_mozo_paper_bound.rs` keeps
//! counterexamples). Under **replace-one** adjacency of the private demonstrations
//! (|D| public and fixed; add/remove is not claimed), the token a step realises in f64
//! is ε-DP for a fixed subset with `ε = 4b` plus a proven rounding slack, hence
//! `(α, min(ε, αε²/2))`-RDP, amplified by drawing S without replacement; tokens compose
//! adaptively. [`dps_mozo_charge`] is that curve. Covered: the sampled tokens and the ε
//! charged; never to be published: the draw, the λs and the output distribution.
//!
//! The proof, the rounding analysis and why the paper's bound is not charged are written
//! out in `proof.md` beside this file (`src/dps_mozo/proof.md`).

pub(crate) mod step;

use privmix_accountant::{AccountantError, Orders, RdpCurve, largest_feasible};
use privmix_mixing::{
    DEFAULT_LOGIT_UPPER, LogitMixing, MixingError, gather, log_softmax, top_k_indices,
};
use privmix_renyi::Order;
use privmix_renyi::round::{add_up, div_up, mul_up, usize_down, usize_up};
use rand::Rng;

use crate::MechanismError;

/// DPS-MOZO's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpsMozoConfig {
    n_shots: usize,
    top_k: usize,
    radius: f64,
    lambda_max: f64,
}

impl DpsMozoConfig {
    /// `n_shots` ≥ 1 demonstrations per token, the `top_k` ≥ 1 zero-shot indices kept,
    /// and the max-divergence radius `b = radius` (finite, ≥ 0) of every one-shot mixture;
    /// λ ranges over `[0, 1.5]` (the paper's λ_max).
    pub fn new(n_shots: usize, top_k: usize, radius: f64) -> Result<Self, MechanismError> {
        if n_shots == 0 {
            return Err(invalid(
                "n_shots",
                0.0,
                "at least one demonstration per token",
            ));
        }
        if top_k == 0 {
            return Err(invalid("top_k", 0.0, "at least one index must be kept"));
        }
        check_radius(radius)?;
        Ok(Self {
            n_shots,
            top_k,
            radius,
            lambda_max: DEFAULT_LOGIT_UPPER,
        })
    }

    /// The same with λ ranging over `[0, upper]` (finite, > 0).
    pub fn with_lambda_max(mut self, upper: f64) -> Result<Self, MechanismError> {
        if !(upper.is_finite() && upper > 0.0) {
            return Err(invalid("lambda_max", upper, "must be finite and > 0"));
        }
        self.lambda_max = upper;
        Ok(self)
    }

    /// Demonstrations drawn per token.
    pub fn n_shots(&self) -> usize {
        self.n_shots
    }

    /// Zero-shot indices kept (top-k).
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The max-divergence radius b.
    pub fn radius(&self) -> f64 {
        self.radius
    }

    /// The upper end of the λ range.
    pub fn lambda_max(&self) -> f64 {
        self.lambda_max
    }

    /// The sampling rate `n_shots/|D|`, rounded up (amplification grows with q); errors
    /// for an empty set or `n_shots > |D|`.
    pub fn sampling_rate(&self, dataset_size: usize) -> Result<f64, MechanismError> {
        sampling_rate(self.n_shots, dataset_size)
    }

    /// The RDP curve charged per generated token (see [`dps_mozo_charge`]).
    pub fn token_charge(
        &self,
        orders: &Orders,
        dataset_size: usize,
    ) -> Result<RdpCurve, MechanismError> {
        dps_mozo_charge(orders, self.radius, self.n_shots, dataset_size)
    }
}

fn invalid(name: &'static str, value: f64, reason: &'static str) -> MechanismError {
    MechanismError::InvalidParameter {
        name,
        value,
        reason,
    }
}

fn check_radius(radius: f64) -> Result<(), MechanismError> {
    if radius.is_finite() && radius >= 0.0 {
        Ok(())
    } else {
        Err(invalid(
            "radius",
            radius,
            "the max-divergence radius b must be finite and ≥ 0",
        ))
    }
}

fn sampling_rate(n_shots: usize, dataset_size: usize) -> Result<f64, MechanismError> {
    if dataset_size == 0 {
        return Err(invalid(
            "dataset_size",
            0.0,
            "the private demonstration set is empty",
        ));
    }
    if n_shots == 0 || n_shots > dataset_size {
        return Err(invalid(
            "n_shots",
            n_shots as f64,
            "must be between 1 and the number of private demonstrations",
        ));
    }
    if n_shots == dataset_size {
        return Ok(1.0);
    }
    Ok(div_up(usize_up(n_shots), usize_down(dataset_size)).min(1.0))
}

/// The pure-DP ε of one token for a fixed subset, for a token drawn from the exact
/// output distribution: `4b` (exact in f64 unless it overflows). The running mechanism
/// is charged the slightly larger ε of the law it realises in f64 ([`dps_mozo_charge`]).
pub fn dps_mozo_pure_epsilon(radius: f64) -> Result<f64, MechanismError> {
    check_radius(radius)?;
    Ok(4.0 * radius)
}

/// The RDP of one token for a fixed subset (before amplification), replace-one
/// adjacency, for a token drawn from the exact output distribution:
/// `min(4b, α·(4b)²/2)` at each order (Bun & Steinke 2016, Prop. 3.3: ε-DP implies
/// (ε²/2)-zCDP; and `D_α ≤ D_∞ = 4b`), rounded up. [`dps_mozo_charge`] applies the same
/// conversion to the realised ε.
pub fn dps_mozo_token_curve(orders: &Orders, radius: f64) -> Result<RdpCurve, MechanismError> {
    Ok(token_curve(orders, dps_mozo_pure_epsilon(radius)?)?)
}

/// `α ↦ min(e, α·e²/2)` rounded up, for a pure-DP ε `e`.
fn token_curve(orders: &Orders, e: f64) -> Result<RdpCurve, AccountantError> {
    let e2 = mul_up(e, e);
    RdpCurve::from_fn(orders.clone(), |a| e.min(div_up(mul_up(a, e2), 2.0)))
}

/// The pure ε per token for a fixed subset of `n_shots` demonstrations that covers the
/// law the step realises in f64 (see [`dps_mozo_charge`]), rounded up.
fn realised_epsilon(radius: f64, n_shots: usize) -> Result<f64, MechanismError> {
    check_radius(radius)?;
    Ok(realised(radius, n_shots))
}

/// [`realised_epsilon`] for a radius already checked (finite, ≥ 0).
fn realised(radius: f64, n_shots: usize) -> f64 {
    if radius == 0.0 {
        return 0.0;
    }
    const U: f64 = f64::EPSILON / 2.0;
    let n2 = usize_up(n_shots.saturating_add(2));
    // ē = u·(n + 2)²·(900 + 6b): the upstream rounding; η_s = 4u: the sampler's.
    let upstream = mul_up(
        mul_up(mul_up(n2, n2), add_up(900.0, mul_up(6.0, radius))),
        U,
    );
    if upstream > 0.25 {
        return f64::INFINITY;
    }
    let slack = mul_up(4.0, add_up(upstream, 4.0 * U));
    add_up(4.0 * radius, slack)
}

/// The RDP curve charged per generated token: `α ↦ min(ε, α·ε²/2)` (rounded up; Bun &
/// Steinke 2016, Prop. 3.3, as [`dps_mozo_token_curve`]) at the pure ε of the token law
/// the running step realises, amplified by drawing `n_shots` of `dataset_size`
/// demonstrations without replacement ([`RdpCurve::sampled_without_replacement`], WBK
/// 2019 Thm 9 at integer orders, Cor. 10 between them), q = n_shots/|D| rounded up.
///
/// The realised ε is `4b + 4·(ē + η_s)` with `u = 2⁻⁵³`, `n = n_shots`,
/// `ē = u·(n + 2)²·(900 + 6b)` (the rounding of the product and its normalisation) and
/// `η_s = 4u` (the token sampler's weights), rounded up (`ε − 4b ≈ 1.4e-11` for n = 4,
/// b ≤ 1); `ε = 0` when b = 0; `ε = +∞` when `ē > 1/4` (b beyond about 10¹⁴/n²). Its
/// proof is in `src/dps_mozo/proof.md`, section "The realised per-token ε".
pub fn dps_mozo_charge(
    orders: &Orders,
    radius: f64,
    n_shots: usize,
    dataset_size: usize,
) -> Result<RdpCurve, MechanismError> {
    let q = sampling_rate(n_shots, dataset_size)?;
    let e = realised_epsilon(radius, n_shots)?;
    Ok(token_curve(orders, e)?.sampled_without_replacement(q)?)
}

/// The largest radius b whose `tokens` (= n_test · T_max) per-token charges compose to at
/// most (ε, δ) over `orders`, by bisection ([`largest_feasible`]).
///
/// Guarantee: the b returned was checked feasible with the same rounded-up arithmetic
/// (the lower end of the final bracket); b·(1 + 1e-9) was found infeasible, unless every
/// b is feasible (then a huge b is returned).
pub fn calibrate_radius(
    orders: &Orders,
    epsilon: f64,
    delta: f64,
    tokens: u64,
    n_shots: usize,
    dataset_size: usize,
) -> Result<f64, MechanismError> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(invalid(
            "epsilon",
            epsilon,
            "the budget ε must be finite and > 0",
        ));
    }
    sampling_rate(n_shots, dataset_size)?;
    let q = sampling_rate(n_shots, dataset_size)?;
    let start = epsilon / (4.0 * tokens.max(1) as f64);
    largest_feasible::<MechanismError>("radius", 0.0, start, |b| {
        let total = token_curve(orders, realised(b, n_shots))?
            .sampled_without_replacement(q)?
            .self_compose(tokens);
        Ok(total.epsilon(delta)?.epsilon <= epsilon)
    })
}

/// The drawn demonstrations: a uniformly random `n_shots`-subset of `0..dataset_size`
/// (partial Fisher–Yates), returned in increasing order so that the output depends on
/// the set alone.
pub fn draw_demonstrations(
    dataset_size: usize,
    n_shots: usize,
    rng: &mut impl Rng,
) -> Result<Vec<usize>, MechanismError> {
    sampling_rate(n_shots, dataset_size)?;
    let mut pool: Vec<usize> = (0..dataset_size).collect();
    // A partial Fisher–Yates shuffle with exactly uniform indices (`random_range`
    // keeps a bias of up to n/2⁶⁴; the sampling-without-replacement amplification
    // assumes the exact law).
    let mut bits = crate::noise::RngBits::new(rng);
    for i in 0..n_shots {
        let j = i + crate::noise::uniform_below_u64((dataset_size - i) as u64, &mut bits) as usize;
        pool.swap(i, j);
    }
    pool.truncate(n_shots);
    pool.sort_unstable();
    Ok(pool)
}

/// The output of DPS-MOZO for one token and one fixed set of drawn demonstrations.
#[derive(Debug, Clone, PartialEq)]
pub struct IclOutput {
    /// The vocabulary indices of the support K (top-k of the zero-shot logits with finite
    /// logits), largest zero-shot logit first.
    pub support: Vec<usize>,
    /// Normalised log-probabilities of the output on `support`.
    pub log_probs: Vec<f64>,
    /// λ of each drawn demonstration, in the order given.
    pub lambdas: Vec<f64>,
    /// Divergence evaluations the λ solvers spent.
    pub solver_evaluations: usize,
}

impl IclOutput {
    /// The output as a probability vector over the whole vocabulary (zero off the support).
    pub fn distribution(&self, vocab: usize) -> Vec<f64> {
        let mut p = vec![0.0; vocab];
        for (&i, &l) in self.support.iter().zip(&self.log_probs) {
            p[i] = l.exp();
        }
        p
    }
}

/// Checks a logit row: the vocabulary length, no NaN and no +∞ (−∞ is a zero probability).
pub(crate) fn check_row(row: &[f64], vocab: usize, index: usize) -> Result<(), MechanismError> {
    if row.len() != vocab {
        return Err(MechanismError::LengthMismatch {
            what: if index == 0 {
                "zero-shot logits"
            } else {
                "one-shot logits"
            },
            len: row.len(),
            vocab,
        });
    }
    match row.iter().position(|x| x.is_nan() || *x == f64::INFINITY) {
        Some(i) => Err(MechanismError::NonFinite {
            row: index,
            index: i,
            value: row[i],
        }),
        None => Ok(()),
    }
}

/// The support K: the top-k zero-shot indices, without −∞ logits (zero public mass).
pub(crate) fn support(zero_shot: &[f64], top_k: usize) -> Result<Vec<usize>, MechanismError> {
    if zero_shot.is_empty() {
        return Err(MechanismError::EmptyVocabulary);
    }
    check_row(zero_shot, zero_shot.len(), 0)?;
    if top_k > zero_shot.len() {
        return Err(invalid("top_k", top_k as f64, "larger than the vocabulary"));
    }
    let mut k = top_k_indices(zero_shot, top_k)?;
    k.retain(|&i| zero_shot[i] != f64::NEG_INFINITY);
    if k.is_empty() {
        return Err(invalid(
            "zero_shot",
            f64::NEG_INFINITY,
            "no finite zero-shot logit",
        ));
    }
    Ok(k)
}

/// `rᵢ = log mᵢ − log z` on the support and λᵢ for one demonstration, or λ = 0 (r = 0)
/// when no λ > 0 is feasible or representable: a −∞ one-shot logit on the support (then
/// `D_∞(z ‖ m_λ) = ∞` for every λ > 0) or a logit difference that overflows f64.
fn mix_one(
    one_shot: &[f64],
    zero_shot: &[f64],
    log_z: &[f64],
    config: &DpsMozoConfig,
) -> Result<(f64, Vec<f64>, usize), MechanismError> {
    let zero = || (0.0, vec![0.0; zero_shot.len()], 0);
    if one_shot.iter().any(|x| !x.is_finite()) {
        return Ok(zero());
    }
    let mixing = match LogitMixing::new(one_shot, zero_shot, Order::Infinite, config.radius) {
        Ok(m) => m.with_upper_end(config.lambda_max)?,
        Err(MixingError::NonFiniteLogit { .. }) => return Ok(zero()),
        Err(e) => return Err(e.into()),
    };
    let solution = match mixing.solve() {
        Ok(s) => s,
        Err(MixingError::NonFiniteLogit { .. }) => return Ok(zero()),
        Err(e) => return Err(e.into()),
    };
    let log_m = mixing.mixed_log_probs(solution.lambda)?;
    let r: Vec<f64> = log_m.iter().zip(log_z).map(|(&m, &z)| m - z).collect();
    // The premise of the 4b bound, on the vectors actually summed.
    if r.iter().all(|x| x.abs() <= config.radius) {
        Ok((solution.lambda, r, solution.evaluations as usize))
    } else {
        Ok(zero())
    }
}

/// DPS-MOZO's output for one token given the zero-shot logits and the one-shot logits
/// of the drawn demonstrations (full-vocabulary rows), per the module documentation.
///
/// Errors: empty vocabulary, rows of the wrong length, NaN or +∞ logits, `top_k` larger
/// than the vocabulary, no finite zero-shot logit, no demonstration.
pub fn dps_mozo_output(
    config: &DpsMozoConfig,
    zero_shot: &[f64],
    one_shots: &[&[f64]],
) -> Result<IclOutput, MechanismError> {
    mixed_output(config, zero_shot, one_shots, true)
}

/// The non-private few-shot output for the same inputs: the normalised product of the
/// one-shot distributions on the zero-shot top-k support, every λ = 1 (what
/// [`crate::FewShotProduct`] samples). No privacy.
pub fn few_shot_output(
    config: &DpsMozoConfig,
    zero_shot: &[f64],
    one_shots: &[&[f64]],
) -> Result<IclOutput, MechanismError> {
    mixed_output(config, zero_shot, one_shots, false)
}

/// The shared body of [`dps_mozo_output`] (`private`) and of the non-private few-shot
/// product (every λ = 1, no constraint).
pub(crate) fn mixed_output(
    config: &DpsMozoConfig,
    zero_shot: &[f64],
    one_shots: &[&[f64]],
    private: bool,
) -> Result<IclOutput, MechanismError> {
    let support = support(zero_shot, config.top_k)?;
    if one_shots.is_empty() {
        return Err(MechanismError::EmptyEnsemble);
    }
    let l0 = gather(zero_shot, &support)?;
    let log_z = log_softmax(&l0)?;
    let n = one_shots.len() as f64;
    let mut w: Vec<f64> = log_z.iter().map(|&z| n * z).collect();
    let mut lambdas = Vec::with_capacity(one_shots.len());
    let mut solver_evaluations = 0;
    for (i, row) in one_shots.iter().enumerate() {
        check_row(row, zero_shot.len(), i + 1)?;
        let l1 = gather(row, &support)?;
        let (lambda, r) = if private {
            let (lambda, r, evaluations) = mix_one(&l1, &l0, &log_z, config)?;
            solver_evaluations += evaluations;
            (lambda, r)
        } else {
            // log m = log_softmax(l1); r = log m − log z (−∞ where the demo has no mass).
            let lm = log_softmax_allowing_neg_inf(&l1)?;
            (1.0, lm.iter().zip(&log_z).map(|(&m, &z)| m - z).collect())
        };
        lambdas.push(lambda);
        for (wx, rx) in w.iter_mut().zip(r) {
            *wx += rx;
        }
    }
    let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return Err(invalid(
            "one_shot",
            f64::NEG_INFINITY,
            "the product has no mass on the support",
        ));
    }
    let log_probs = log_normalise(&w, max);
    Ok(IclOutput {
        support,
        log_probs,
        lambdas,
        solver_evaluations,
    })
}

/// `log softmax` where −∞ logits are zero probabilities (at least one must be finite).
fn log_softmax_allowing_neg_inf(l: &[f64]) -> Result<Vec<f64>, MechanismError> {
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return Err(invalid(
            "one_shot",
            max,
            "no finite one-shot logit on the support",
        ));
    }
    Ok(log_normalise(l, max))
}

/// `x − max − ln Σ exp(x − max)`: normalised log-weights. (Subtracting `max + ln Σ` in
/// one go would absorb the logarithm near ±f64::MAX.)
fn log_normalise(w: &[f64], max: f64) -> Vec<f64> {
    let shifted: Vec<f64> = w.iter().map(|&x| x - max).collect();
    let ln_sum = shifted.iter().map(|&x| x.exp()).sum::<f64>().ln();
    shifted.into_iter().map(|x| x - ln_sum).collect()
}

#[cfg(test)]
mod tests;
