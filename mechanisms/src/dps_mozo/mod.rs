//! DPS-MOZO (Flemings et al., "Differentially Private In-context Learning via Sampling
//! Few-shot Mixed with Zero-shot Outputs", arXiv 2501.19287, §4, Alg. 1–3, App. B), with
//! the per-token bound privmix can prove.
//!
//! Per generated token (Alg. 1): draw a uniformly random `n_shots`-subset S of the private
//! demonstrations D; take the top-k indices K of the zero-shot logits `l₀` (public); for
//! each drawn demonstration i, truncate its one-shot logits `lᵢ` and `l₀` to K and mix in
//! logit space, `mᵢ = softmax(λᵢlᵢ + (1−λᵢ)l₀)`, with the largest `λᵢ ∈ [0, λ_max]`
//! satisfying the constraint; sample from the normalised product `∏ᵢ mᵢ`.
//!
//! # The constraint and the per-token guarantee (why privmix departs from the paper)
//!
//! The paper constrains `Dsym_α(mᵢ, z) ≤ βα` at one finite α (z = softmax(l₀)) and claims
//! each token is (α, 4βα)-RDP (Thm B.3). Its proof applies a triangle-like inequality at a
//! single order (Steinke 2022, Lemma 33.7, which needs the hypothesis at all orders) and
//! additivity for product measures (van Erven & Harremoës 2014, Thm 28) to the normalised
//! pointwise product of distributions over one vocabulary, which is not a product measure.
//! The claim is false: `tests/dps_mozo_paper_bound.rs` keeps counterexamples.
//!
//! privmix constrains the **max divergence** both ways, `Dsym_∞(mᵢ, z) ≤ b`, i.e.
//! `rᵢ(x) = log mᵢ(x) − log z(x) ∈ [−b, b]` on K. The output is
//! `out(x) ∝ z(x)^n · exp(Σᵢ rᵢ(x))`. Replacing one drawn demonstration i by i' changes
//! one term: `log out(x) − log out'(x) = d(x) − log E_{out'}[e^d]` with
//! `d = rᵢ − rᵢ' ∈ [−2b, 2b]`, so `|log out(x)/out'(x)| ≤ 4b` for every x: for a fixed
//! subset the token is (4b)-DP under replace-one adjacency, hence
//! (α, min(4b, α(4b)²/2))-RDP at every order (Bun & Steinke, "Concentrated Differential
//! Privacy: Simplifications, Extensions, and Lower Bounds", arXiv 1605.02065, Prop. 3.3,
//! and `D_α ≤ D_∞`). Drawing S without replacement at rate q = n_shots/|D| amplifies it
//! (Wang, Balle & Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical
//! Moments Accountant", arXiv 1808.00087, Thm 9, which is for replace-one adjacency;
//! [`RdpCurve::sampled_without_replacement`]). A fresh subset is drawn for every token,
//! and the tokens compose adaptively (the logits asked for depend on the tokens released
//! before). The premise `|rᵢ| ≤ b` is re-checked in f64 on the very vectors summed; the
//! f64 rounding of the product, of its normalisation and of the token sampler's weights
//! is covered by a proven slack on 4b ([`dps_mozo_charge`]).
//!
//! # Privacy unit, adjacency, and what is published
//!
//! - The privacy unit is **one private demonstration**. Neighbouring sets D, D' have the
//!   same size |D| and differ in one demonstration, replaced by any other
//!   (**replace-one**): its one-shot logits may change arbitrarily at every context, the
//!   zero-shot logits and every other demonstration's one-shot logits do not (a source
//!   must compute demonstration i's row from demonstration i and the public context
//!   alone). |D| is public: it sets q and hence the ε reported.
//! - Add/remove adjacency is **not** claimed: the amplification theorem above is for
//!   replace-one, and the reported ε (through q) would itself reveal |D|.
//! - Covered: the sampled tokens and the ε charged. Not covered, never to be published:
//!   the draw, the λs and the output distribution (the step's diagnostics), all functions
//!   of the private set.
//! - The guarantee covers the law the step **realises**, not only the real-arithmetic
//!   output distribution: the output is computed in f64, and the token is drawn by
//!   [`crate::sample_log_index`] exactly in proportion to f64 weights that floor every
//!   finite log-weight at `max − 708` (nothing underflows to 0, so no token is drawable on
//!   one side only). [`dps_mozo_charge`] proves that this law is
//!   `4b + 4·(ē + η_s)`-DP per token for a fixed subset, `ē ≈ (n + 2)²·900·2⁻⁵³` for
//!   the rounding of the product and the normalisation, `η_s = 4·2⁻⁵³` for the
//!   sampler's weights, and charges that.
//!
//! `tests/verify_dps_mozo.rs` checks the charge exactly: every transcript of +On and +Off
//! (vocabularies ≤ 4, ≤ 3 tokens, the subset draws summed out, adaptive logit tables),
//! `D_α ≤ ε charged` both ways at orders 1.5–32 for every replace-one neighbour.

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
/// # The realised per-token ε
///
/// With `u = 2⁻⁵³`, `n = n_shots` and b the radius,
///
/// `ε = 4b + 4·(ē + η_s)`, `ē = u·(n + 2)²·(900 + 6b)`, `η_s = 4u`,
///
/// rounded up (`ε − 4b ≈ 1.4e-11` for n = 4, b ≤ 1); `ε = 0` when b = 0; `ε = +∞` when
/// `ē > 1/4` (b beyond about 10¹⁴/n²).
///
/// Why more than 4b. The module's 4b argument is for `Q(x) ∝ exp v(x)`,
/// `v = n·log z + Σᵢ rᵢ` in real arithmetic on the f64 vectors (`|rᵢ| ≤ b` is checked on
/// them; `log z` is public). The step computes, per support index x, in f64:
/// `a₀ = n·log z`, `aₖ = aₖ₋₁ + rₖ`, `W = max a_n`, `s = a_n − W`, the log-probabilities
/// `l = s − ln Σ exp s` ([`IclOutput::log_probs`]), and draws the token with
/// [`crate::sample_log_index`], whose law is exactly `∝ ŵ` with
/// `|ln ŵ(x) − max(l(x) − L, −708)| ≤ η_s` (`L = max l`; its documentation proves this
/// assuming a faithful `exp`, as `privmix_renyi::round` does). Neither step is exact:
///
/// 1. **Upstream rounding.** An f64 sum of terms in [0, 1], one of them exactly 1, lies
///    in [1, 2⁵⁴ + 3] (from 2⁵⁴ on, a term ≤ 1 is below half an ulp), so `ln Σ ∈ [0, 38]`
///    and `L = −ln Σ` exactly (the largest `a_n` has `s = 0`). `privmix_mixing::log_softmax`
///    is the same computation, so every `log z ≤ 0` and `max log z ≥ −38`. Each rounding
///    moves its result by at most `u·|result|` (`2⁻¹⁰⁷⁵` if subnormal), so
///    `δ(x) := l(x) − L = v(x) − W + e(x)` with `|e(x)| ≤ u·(Σₖ|aₖ(x)| + |s(x)| + |l(x)|)`.
///    `|W| ≤ n(38 + b) + 1` (`W ≤ nb(1 + 2nu)` as `log z ≤ 0`; `W ≥ a_n` at the argmax of
///    `log z`). For an index with `δ ≥ −709 − 4b` on D or on its neighbour — the only ones
///    whose error matters below; the errors are relative and below 2⁻¹⁰, so these ranges
///    are consistent — `|l| ≤ 748 + 4b`, `|s| ≤ 787 + 4b`, `|aₖ| ≤ n(38 + 2b) + 789 + 4b`,
///    and the sum `(n + 1)(n(38 + 2b) + 789 + 4b) + 1535 + 8b ≤ (n + 2)²(850 + 6b)`: so
///    `|e(x)| ≤ ē`. The same holds at the argmax of `a_n` on either side, so
///    `|W − W'| ≤ 2b + 2ē` for neighbours (a replaced demonstration moves each v by
///    `d(x) = rᵢ(x) − rᵢ'(x) ∈ [−2b, 2b]`).
/// 2. **The floor as a threshold.** For every index with finite `l`,
///    `ln ŵ(x) = η(x) − W + max(v(x) + ẽ(x), W − 708)` with `|η| ≤ η_s` and `|ẽ| ≤ ē`: where
///    `δ ≥ −708` this is `δ + η` with `ẽ = e`; where the floor applies it is `−708 + η`
///    with `ẽ` = e clipped to `[−ē, ē]` (clipping can only lift `v + e` past `W − 708` if
///    `v ≥ W − 708 − ē`, where `|e| ≤ ē` already). Indices with `l = −∞` are those with
///    `n·log z` = −∞ in f64 (for finite ε nothing else overflows): public, the same on
///    both sides.
/// 3. **The ratio.** As `max(A, B)/max(A', B') ≤ max(A/A', B/B')`,
///    `ŵ(x)e^W / ŵ'(x)e^{W'} ≤ e^{2η_s}·max(e^{d(x) + 2ē}, e^{W − W'}) ≤ e^{2b + 2ē + 2η_s}`
///    for every x, and the normalisers `Σŵe^W` obey the same bound, so
///    `P(x)/P'(x) ≤ e^{4b + 4ē + 4η_s} = e^ε` both ways: the realised token is ε-DP for a
///    fixed subset, hence `(α, min(ε, αε²/2))`-RDP.
///
/// At b = 0 every `rᵢ` is exactly 0 (the f64 check `|r| ≤ 0`), so both sides compute the
/// same bits and the same law: ε = 0.
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
    let b = largest_feasible("radius", 0.0, start, |b| {
        let total = token_curve(orders, realised(b, n_shots))?
            .sampled_without_replacement(q)?
            .self_compose(tokens);
        Ok(total.epsilon(delta)?.epsilon <= epsilon)
    })?;
    Ok(b)
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
mod tests {
    use super::*;
    use dashu_int::ops::BitTest;
    use dashu_int::{IBig, UBig};

    /// `x ≥ 0` as an integer multiple of 2⁻¹⁰⁷⁴.
    fn units(x: f64) -> UBig {
        let (m, e) = crate::noise::dyadic(x);
        UBig::from(m) << (e + 1074) as usize
    }

    /// The realised token law of `log_probs`: the sampler's weights and their exact sum.
    fn sampler_law(log_probs: &[f64]) -> (Vec<f64>, UBig) {
        let max = log_probs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w = crate::sample::log_weights(log_probs, max);
        let total = w.iter().fold(UBig::ZERO, |acc, &x| acc + units(x));
        (w, total)
    }

    /// `ln(a/b)` for positive big integers less than 2⁹⁰⁰ apart in ratio: within a
    /// relative 2⁻⁵⁰ plus 2⁻¹¹⁵ (120 leading bits kept, the difference taken exactly).
    fn ln_ratio(a: &UBig, b: &UBig) -> f64 {
        let shift = a.bit_len().min(b.bit_len()).saturating_sub(120);
        let (a, b) = (a.clone() >> shift, b.clone() >> shift);
        let f = |x: &UBig| -> f64 { x.to_f64().value() };
        // ln(1 + (a − b)/b) from the exact difference.
        if a >= b {
            (f(&(a.clone() - &b)) / f(&b)).ln_1p()
        } else {
            -(f(&(b.clone() - &a)) / f(&a)).ln_1p()
        }
    }

    /// `max_x |ln P(x) − ln P'(x)|` of the realised laws (both supports equal).
    fn realised_max_divergence(lp: &[f64], lq: &[f64]) -> f64 {
        let ((w, sw), (v, sv)) = (sampler_law(lp), sampler_law(lq));
        let mut worst = 0.0f64;
        for (&a, &b) in w.iter().zip(&v) {
            assert_eq!(a == 0.0, b == 0.0, "the supports differ");
            if a == 0.0 {
                continue;
            }
            // ln(a/b) + ln(Σv/Σw) in one exact ratio.
            let d = ln_ratio(&(units(a) * &sv), &(units(b) * &sw));
            worst = worst.max(d.abs());
        }
        worst
    }

    #[test]
    fn realised_epsilon_is_4b_plus_the_proven_slack() {
        let u = f64::EPSILON / 2.0;
        assert_eq!(realised_epsilon(0.0, 3).unwrap(), 0.0);
        let e = realised_epsilon(0.5, 1).unwrap();
        let slack = 4.0 * u * (9.0 * 903.0 + 4.0);
        assert!(
            e >= 2.0 + slack && e <= (2.0 + slack) * (1.0 + 1e-15),
            "{e}"
        );
        // n = 4, b ≤ 1: about 1.45e-11 above 4b.
        let e = realised_epsilon(1.0, 4).unwrap() - 4.0;
        assert!((1.4e-11..1.5e-11).contains(&e), "{e}");
        // Monotone in b and n; +∞ once ē > 1/4.
        let mut last = 0.0;
        for b in [1e-300, 1e-12, 1e-3, 0.1, 1.0, 10.0, 1e6, 1e12] {
            let e = realised_epsilon(b, 2).unwrap();
            assert!(e > last && e > 4.0 * b);
            last = e;
        }
        assert!(realised_epsilon(0.1, 3).unwrap() < realised_epsilon(0.1, 4).unwrap());
        assert_eq!(realised_epsilon(1e15, 1).unwrap(), f64::INFINITY);
        assert_eq!(realised_epsilon(0.1, usize::MAX).unwrap(), f64::INFINITY);
        assert!(realised_epsilon(-1.0, 1).is_err());
        assert!(realised_epsilon(f64::NAN, 1).is_err());
        // The charge is the token curve at the realised ε (q = 1: no amplification).
        let orders = Orders::new(vec![1.5, 2.0, 100.0]).unwrap();
        assert_eq!(
            dps_mozo_charge(&orders, 0.05, 5, 5).unwrap(),
            token_curve(&orders, realised_epsilon(0.05, 5).unwrap()).unwrap()
        );
        let ideal = dps_mozo_token_curve(&orders, 0.05).unwrap();
        for (c, i) in dps_mozo_charge(&orders, 0.05, 5, 5)
            .unwrap()
            .epsilons()
            .iter()
            .zip(ideal.epsilons())
        {
            assert!(c > i && *c <= i * (1.0 + 1e-9));
        }
        // b = 0 charges nothing (both sides compute the same bits).
        assert!(
            dps_mozo_charge(&orders, 0.0, 2, 7)
                .unwrap()
                .epsilons()
                .iter()
                .all(|&x| x == 0.0)
        );
    }

    /// `x` (finite) as an exact signed multiple of 2⁻¹⁰⁷⁴.
    fn exact(x: f64) -> IBig {
        let m = IBig::from(units(x.abs()));
        if x < 0.0 { -m } else { m }
    }

    /// A signed multiple of 2⁻¹⁰⁷⁴ as an f64 (to a relative 2⁻⁵²).
    fn to_f64(x: &IBig) -> f64 {
        let shift = x.bit_len().saturating_sub(64);
        let top: IBig = x.clone() >> shift;
        top.to_f64().value() * 2f64.powi(shift as i32 - 1074)
    }

    /// A deterministic stream of uniforms in [0, 1).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
        fn pick<T: Copy>(&mut self, v: &[T]) -> T {
            v[(self.next() * v.len() as f64) as usize]
        }
    }

    /// A random DPS-MOZO input: zero-shot logits (flat, spread to 700/n, a few far
    /// below), and n + 1 one-shot rows around them (the last one replaces the first).
    fn random_input(g: &mut Lcg) -> (DpsMozoConfig, Vec<f64>, Vec<Vec<f64>>) {
        let k = g.pick(&[2usize, 3, 5, 16, 64]);
        let n = g.pick(&[1usize, 2, 3, 5, 8]);
        let b = g.pick(&[1e-6, 1e-3, 0.1, 2.0, 50.0]);
        let spread = g.pick(&[0.0, 5.0, 300.0, 700.0, 720.0]) / n as f64;
        let zero: Vec<f64> = (0..k)
            .map(|i| match i {
                0 => 3.0,
                _ if g.next() < 0.1 => -1e5 * g.next(),
                _ => 3.0 - spread * g.next(),
            })
            .collect();
        let c = g.pick(&[0.01, 1.0, 30.0]);
        let rows = (0..=n)
            .map(|_| {
                zero.iter()
                    .map(|&z| z + c * (2.0 * g.next() - 1.0))
                    .collect()
            })
            .collect();
        (DpsMozoConfig::new(n, k, b).unwrap(), zero, rows)
    }

    /// Step 1 of [`dps_mozo_charge`]'s proof, exactly: with `v = n·log z + Σᵢ rᵢ` (the
    /// f64 vectors the step sums, recomputed by the same `mix_one`, as exact reals) and
    /// `δ = l − max l` of the step's log-probabilities, `δ(x) − (v(x) − W) = e(x)` with
    /// `|e| ≤ ē` on every index with `δ ≥ −709 − 4b`; checked as
    /// `|(δ(x) − v(x)) − (δ(y) − v(y))| ≤ 2ē` against the index y with δ = 0. Over
    /// 3000 random inputs (flat and 700/n-wide zero-shot rows, n ≤ 8, K ≤ 64).
    #[test]
    fn upstream_rounding_is_within_the_bound() {
        let u = f64::EPSILON / 2.0;
        assert_eq!(to_f64(&exact(-3.5)), -3.5);
        assert_eq!(to_f64(&(exact(-700.25) - exact(1e-300))), -700.25);
        let mut g = Lcg(0xD95);
        let mut worst = 0.0f64;
        let mut moved = 0;
        for _ in 0..3000 {
            let (config, zero, rows) = random_input(&mut g);
            let n = config.n_shots();
            let refs: Vec<&[f64]> = rows[..n].iter().map(Vec::as_slice).collect();
            let out = dps_mozo_output(&config, &zero, &refs).unwrap();
            let k = support(&zero, config.top_k()).unwrap();
            assert_eq!(k, out.support);
            let l0 = gather(&zero, &k).unwrap();
            let log_z = log_softmax(&l0).unwrap();
            let mut v: Vec<Option<IBig>> = log_z
                .iter()
                .map(|&z| z.is_finite().then(|| exact(z) * IBig::from(n)))
                .collect();
            for row in &refs {
                let l1 = gather(row, &k).unwrap();
                let (lambda, r, _) = mix_one(&l1, &l0, &log_z, &config).unwrap();
                moved += usize::from(lambda > 0.0);
                for (vx, &rx) in v.iter_mut().zip(&r) {
                    assert!(rx.abs() <= config.radius());
                    if let Some(vx) = vx {
                        *vx += exact(rx);
                    }
                }
            }
            let b = config.radius();
            let ebar = u * ((n + 2) * (n + 2)) as f64 * (900.0 + 6.0 * b);
            let top = out
                .log_probs
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            let y = out.log_probs.iter().position(|&l| l == top).unwrap();
            let base = exact(0.0) - v[y].clone().unwrap();
            for (x, &l) in out.log_probs.iter().enumerate() {
                if l == f64::NEG_INFINITY {
                    // Only where n·log z overflows to −∞ (public).
                    assert!(!(n as f64 * log_z[x]).is_finite());
                    continue;
                }
                let delta = exact(l) - exact(top);
                if to_f64(&delta) < -709.0 - 4.0 * b {
                    continue;
                }
                let diff = to_f64(&(delta - v[x].clone().unwrap() - &base)).abs();
                assert!(
                    diff <= 2.0 * ebar,
                    "|e(x) − e(y)| = {diff:e} > 2ē = {:e}",
                    2.0 * ebar
                );
                worst = worst.max(diff / (2.0 * ebar));
            }
        }
        assert!(moved > 1000, "only {moved} demonstrations moved the output");
        assert!(
            worst > 0.0 && worst < 0.1,
            "largest |e(x) − e(y)|/2ē = {worst}"
        );
    }

    /// Step 3's conclusion on the realised laws themselves: for every input above and its
    /// replace-one neighbour (the first drawn row replaced), the token laws the sampler
    /// realises (its weights, exact sums) have the same support and
    /// `max_x |ln P(x) − ln P'(x)| ≤` the realised ε (and stay close to 4b's bound).
    #[test]
    fn realised_laws_are_within_the_realised_epsilon() {
        let mut g = Lcg(0x5A1);
        let mut worst = 0.0f64;
        for _ in 0..3000 {
            let (config, zero, rows) = random_input(&mut g);
            let n = config.n_shots();
            let a: Vec<&[f64]> = rows[..n].iter().map(Vec::as_slice).collect();
            let mut b = a.clone();
            b[0] = &rows[n];
            let p = dps_mozo_output(&config, &zero, &a).unwrap();
            let q = dps_mozo_output(&config, &zero, &b).unwrap();
            let d = realised_max_divergence(&p.log_probs, &q.log_probs);
            let e = realised_epsilon(config.radius(), n).unwrap();
            assert!(d <= e, "D∞ = {d} > ε = {e} (b = {})", config.radius());
            worst = worst.max(d / e);
        }
        assert!(
            worst > 0.3,
            "largest D∞/ε {worst}: the cases never approach the bound"
        );
    }
}
